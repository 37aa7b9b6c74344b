// lazy_commit_gpu_test.cc: the lazy commit (contract §11, CommitKind::kLazy) on the CUDA kernels
// against the host reference, bitwise: one problem (reversed slots, a padding row, K = 64 and
// 128, L = 8 and 16) whose slots hold random pending counts 0..L - T_max of valid ring records
// before random cursors; random accepted lengths (one bad), with and without a prefix-cache track
// and a fold interval. After the commit the committed SSM and conv state (every slot: the folded
// ones, the track slot, and those that must stay as they were), the pending counts, the cursors
// and the error flag equal the host's.
#include <cuda_runtime_api.h>
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/common/launch_utils.h"
#include "kernels/kda_kernels.h"
#include "kernels/ref/kda_host.h"
#include "tests/test_problem.h"

using namespace kda;
using namespace kda::testing;

namespace {

template <typename T>
bool same(const std::vector<T>& x, const std::vector<T>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0;
}

// Valid ring records (k, v ~ N(0, 0.25) as bf16, g in [-1.5, -0.01], beta in (0.05, 0.95)) at
// every ring position of every slot: whatever a fold reads is a step a verify could have written.
void fill_rings(VerifyProblem& p, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::uniform_real_distribution<float> gate(-1.5f, -0.01f), beta(0.05f, 0.95f);
  std::vector<bf16_t> rawk = p.rawk(), rawv = p.rawv();
  std::vector<float> g = p.ring_g(), b = p.ring_beta();
  for (bf16_t& x : rawk) {
    x = float_to_bf16(normal(rng));
  }
  for (bf16_t& x : rawv) {
    x = float_to_bf16(normal(rng));
  }
  for (float& x : g) {
    x = gate(rng);
  }
  for (float& x : b) {
    x = beta(rng);
  }
  p.set(Tensor::kRingRawk, rawk);
  p.set(Tensor::kRingRawv, rawv);
  p.set(Tensor::kRingG, g);
  p.set(Tensor::kRingBeta, b);
}

}  // namespace

TEST_CASE("lazy commit: the CUDA kernels equal the host reference bitwise", "[gpu][lazy]") {
  const int K = GENERATE(64, 128);
  const int L = GENERATE(8, 16);
  const bool track = GENERATE(false, true);
  const int interval = GENERATE(0, 5);
  const int T = 4;
  CAPTURE(K, L, track, interval);
  VerifyCase c = make_case(5, T, 2, 4, K, 96, RecordMode::kRing, 31 + K + L);
  c.L = L;
  c.neg_slot = true;
  c.reversed = true;
  c.extra_slots = 2;
  VerifyProblem base(c);
  fill_rings(base, 7 + static_cast<uint64_t>(L));
  const int S = base.num_slots(), B = c.B;
  std::mt19937 rng(static_cast<uint32_t>(K * 100 + L * 10 + (track ? 1 : 0) + interval));
  std::vector<int32_t> cursor(static_cast<size_t>(S)), pending(static_cast<size_t>(S)),
      accepted(static_cast<size_t>(B));
  for (int s = 0; s < S; ++s) {
    cursor[s] = static_cast<int32_t>(rng() % static_cast<unsigned>(L));
    pending[s] = static_cast<int32_t>(rng() % static_cast<unsigned>(L - T + 1));
  }
  for (int n = 0; n < B; ++n) {
    accepted[n] = 1 + static_cast<int32_t>(rng() % T);
  }
  accepted[B - 1] = T + 1;  // a bad length: the request is skipped, its pending steps stay
  const std::vector<int32_t> slots = base.slots();
  const int32_t track_slot = B;  // a spare slot outside the batch
  std::vector<int32_t> track_slots(static_cast<size_t>(B), -1),
      track_steps(static_cast<size_t>(B), -1);
  if (track) {
    const int n = slots[0] >= 0 ? 0 : 2;
    track_slots[n] = track_slot;
    track_steps[n] = accepted[n] - 1;
  }

  // Host.
  VerifyProblem host = base.clone_to(Device::host());
  std::vector<int32_t> h_cursor = cursor, h_pending = pending;
  int32_t h_flag = 0;
  const Buffer h_acc = make_buffer(accepted, Device::host());
  CommitParams hp = host.commit_params(h_acc, RecordMode::kRing);
  hp.kind = CommitKind::kLazy;
  hp.ring_cursor = h_cursor.data();
  hp.ring_pending = h_pending.data();
  hp.ring_pending_layer_stride = S;
  hp.u_free = 1;
  hp.lazy_fold_interval = interval;
  hp.error_flag = &h_flag;
  if (track) {
    hp.track_slots = track_slots.data();
    hp.track_steps = track_steps.data();
  }
  host::commit(hp);

  // CUDA.
  const Device dev = Device::cuda(0);
  VerifyProblem cuda = base.clone_to(dev);
  Buffer d_cursor = make_buffer(cursor, dev), d_pending = make_buffer(pending, dev),
         d_acc = make_buffer(accepted, dev), d_flag = make_buffer({0}, dev),
         d_tslots = make_buffer(track_slots, dev), d_tsteps = make_buffer(track_steps, dev);
  CommitParams dp = cuda.commit_params(d_acc, RecordMode::kRing);
  dp.kind = CommitKind::kLazy;
  dp.ring_cursor = static_cast<int32_t*>(d_cursor.data());
  dp.ring_pending = static_cast<int32_t*>(d_pending.data());
  dp.ring_pending_layer_stride = S;
  dp.u_free = 1;
  dp.lazy_fold_interval = interval;
  dp.error_flag = static_cast<int32_t*>(d_flag.data());
  if (track) {
    dp.track_slots = static_cast<const int32_t*>(d_tslots.data());
    dp.track_steps = static_cast<const int32_t*>(d_tsteps.data());
  }
  kernels::invoke_commit(dp, nullptr);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);

  std::vector<int32_t> c_cursor(static_cast<size_t>(S)), c_pending(static_cast<size_t>(S));
  int32_t c_flag = 0;
  d_cursor.download(c_cursor.data(), S * 4);
  d_pending.download(c_pending.data(), S * 4);
  d_flag.download(&c_flag, 4);
  CHECK(c_cursor == h_cursor);
  CHECK(c_pending == h_pending);
  CHECK(c_flag == h_flag);
  CHECK(h_flag == kBadAcceptedLength);
  CHECK(same(cuda.ssm_state(), host.ssm_state()));
  CHECK(same(cuda.conv_state(), host.conv_state()));
  // Every valid request either folded (count 0) or kept its steps (the count grew).
  int folded = 0, kept = 0;
  for (int n = 0; n < B - 1; ++n) {
    const int32_t s = slots[n];
    if (s >= 0) {
      (h_pending[s] == 0 ? folded : kept) += 1;
    }
  }
  CAPTURE(folded, kept, pending, h_pending);
  CHECK(folded + kept == 3);
  if (track) {
    const int64_t n = host.state_elems();
    CHECK_FALSE(same(slice(host.ssm_state(), track_slot * n, n),
                     slice(base.ssm_state(), track_slot * n, n)));  // the track was written
  }
}
