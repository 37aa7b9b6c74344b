// lazy_gpu_test.cc: the lazy write-back (contract §11) on the CUDA kernels.
//  - The lazy verify (the fast kernel's kLazyHistory instantiations): over a pending history of
//    every length P = 0..L - T, its outputs satisfy §10 against the exact CUDA verify on the
//    materialized state (<= 1 ulp, >= 99.9% bitwise over the sweep; rel L2 against the fp64
//    oracle <= 1.25x the exact path's), bitwise the same at every fast tile (§10 (a)); its
//    records and windows equal the exact path's bitwise; the committed state, the conv state and
//    the history's records stay as they were. Both gates, GQA, K = 64 and 128, dense and ragged.
//  - The lazy commit (CommitKind::kLazy) against the host reference's decisions: one problem
//    (reversed slots, a padding row, K = 64 and 128, L = 8 and 16) whose slots hold random
//    pending counts 0..L - T_max of valid ring records before random cursors; random accepted
//    lengths (one bad), with and without a prefix-cache track and a fold interval. After the
//    commit the conv state, the pending counts, the cursors and the error flag equal the host's;
//    every slot's SSM state is bitwise the CUDA materialize of the steps the host folded (a
//    track slot: of the track's steps), and within the host's end-to-end tolerance.
// The kernels directly, under the backend (backend_lazy_cuda_test runs the backend's lazy rounds):
// they plan with kernels::plan_verify on the device's caps and launch with invoke_verify.
#include <cuda_runtime_api.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/common/device_caps.h"
#include "kernels/common/launch_utils.h"
#include "kernels/kda_kernels.h"
#include "kernels/ref/kda_host.h"
#include "kernels/verify/verify_plan.h"
#include "tests/lazy_history.h"
#include "tests/output_compare.h"
#include "tests/test_problem.h"

using namespace kda;
using namespace kda::testing;

namespace {

template <typename T>
bool same(const std::vector<T>& x, const std::vector<T>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0;
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
  const int S = base.num_slots(), B = c.B;
  // Valid records at every ring position of every slot (what a fold reads, a verify wrote).
  write_history(base, std::vector<int32_t>(static_cast<size_t>(S), L), 1.0f,
                7 + static_cast<uint64_t>(L));
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
  CHECK(same(cuda.conv_state(), host.conv_state()));
  // The committed state against the CUDA materialize (the deferred commit's fold, bitwise the
  // eager fold's): where the host's commit folded a slot, its pending and accepted steps from
  // c - pending; a track, the pending steps and steps 0..k into the track slot. Against the host
  // within its end-to-end tolerance (the host's fold forms are not the device's bit for bit).
  const int64_t n_state = base.state_elems();
  const auto materialized = [&](const std::vector<int32_t>& steps, const std::vector<int32_t>& at) {
    VerifyProblem twin = base.clone_to(dev);
    Buffer t_cursor = make_buffer(at, dev), t_pending = make_buffer(steps, dev);
    CommitParams m = twin.commit_params(d_acc, RecordMode::kRing);
    m.kind = CommitKind::kMaterialize;
    m.ring_cursor = static_cast<int32_t*>(t_cursor.data());
    m.ring_pending = static_cast<int32_t*>(t_pending.data());
    m.ring_pending_layer_stride = S;
    m.u_free = 1;
    kernels::invoke_commit(m, nullptr);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    return twin.ssm_state();
  };
  std::vector<int32_t> fold_steps(static_cast<size_t>(S), 0), fold_at = cursor;
  std::vector<int32_t> track_steps_of(static_cast<size_t>(S), 0), track_at = cursor;
  int tracked_slot = -1;
  for (int n = 0; n < B; ++n) {
    const int32_t s = slots[n];
    if (s < 0 || accepted[n] < 1 || accepted[n] > T) {
      continue;
    }
    if (h_pending[s] == 0) {  // the host folded it: pending + accepted steps
      fold_steps[s] = pending[s] + accepted[n];
      fold_at[s] = (cursor[s] + accepted[n]) & (L - 1);
    }
    if (track_slots[n] >= 0) {
      tracked_slot = s;
      track_steps_of[s] = pending[s] + track_steps[n] + 1;
      track_at[s] = (cursor[s] + track_steps[n] + 1) & (L - 1);
    }
  }
  const std::vector<float> want = materialized(fold_steps, fold_at);
  const std::vector<float> got = cuda.ssm_state();
  for (int s = 0; s < S; ++s) {
    CAPTURE(s, fold_steps[s]);
    if (s == track_slot && track) {
      const std::vector<float> t = materialized(track_steps_of, track_at);
      CHECK(same(slice(got, s * n_state, n_state), slice(t, tracked_slot * n_state, n_state)));
    } else {
      CHECK(same(slice(got, s * n_state, n_state), slice(want, s * n_state, n_state)));
    }
  }
  CHECK(rel_l2(got, host.ssm_state()) <= 1e-4);
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

namespace {

constexpr int kLazyL = kFastMaxChunk;

// The fast verify of `p` at tile `bv`, planned on the device's caps.
void fast_verify(const VerifyParams& p, int bv) {
  const kernels::VerifyPlan plan =
      kernels::plan_verify(p, VerifyPath::kFused, bv, kernels::device_caps(), {}, 0);
  REQUIRE(plan.numerics == VerifyNumerics::kFast);
  REQUIRE((plan.features & kernels::kLazyHistory) != 0);
  kernels::invoke_verify(p, plan, nullptr);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
}

}  // namespace

TEST_CASE("lazy verify: the CUDA fast kernel over every pending length within contract §10",
          "[gpu][lazy]") {
  const Device dev = Device::cuda(0);
  OutCompare total;
  double worst_ratio = 0.0;
  int i = 0;
  for (const int K : {64, 128}) {
    for (const int T : {1, 2, 4, 8}) {
      for (int P = 0; P <= kLazyL - T; P += T <= 2 ? 3 : 2) {
        const bool ragged = (i & 1) != 0 && T > 1;
        const bool safe = (i & 2) != 0;
        const int HV = (i & 4) != 0 ? 4 : 2;
        ++i;
        CAPTURE(K, T, P, ragged, safe, HV);
        VerifyCase c = make_case(3, T, 2, HV, K, 128, RecordMode::kRing, 100 + i);
        c.L = kLazyL;
        c.safe_gate = safe;
        c.bias = true;
        c.reversed = true;
        VerifyProblem base(c);
        const int S = base.num_slots();
        std::vector<int32_t> steps(static_cast<size_t>(S), 0);
        for (const int32_t s : base.slots()) {
          steps[static_cast<size_t>(s)] = P;
        }
        const LazyHistory h = write_history(base, steps, 1.0f, 9000 + i);
        std::vector<int32_t> offsets, lengths(3, T);
        std::vector<int64_t> first = {0, T, 2 * T};
        if (ragged) {
          lengths = {T, 1, (T + 1) / 2};
          offsets = {0, lengths[0], lengths[0] + lengths[1], lengths[0] + lengths[1] + lengths[2]};
          first = {0, offsets[1], offsets[2]};
        }
        const Buffer d_cursor = make_buffer(h.cursor, dev), d_pending = make_buffer(h.pending, dev);
        const Buffer d_offsets =
            make_buffer(offsets.empty() ? std::vector<int32_t>{0} : offsets, dev);
        const auto shape = [&](VerifyParams& v) {
          v.token_offsets =
              offsets.empty() ? nullptr : static_cast<const int32_t*>(d_offsets.data());
        };

        // The exact twin: materialize (u-free) a clone, then the exact fused verify at the cursors.
        VerifyProblem exact = base.clone_to(dev);
        Buffer u_scratch;
        {
          Buffer m_pending = make_buffer(h.pending, dev);
          const Buffer acc = make_buffer({1, 1, 1}, dev);
          CommitParams m = exact.commit_params(acc, RecordMode::kRing);
          m.kind = CommitKind::kMaterialize;
          m.ring_cursor = static_cast<int32_t*>(const_cast<void*>(d_cursor.data()));
          m.ring_pending = static_cast<int32_t*>(m_pending.data());
          m.ring_pending_layer_stride = S;
          m.u_free = 1;
          kernels::invoke_commit(m, nullptr);
          VerifyParams v = exact.params(RecordMode::kRing);
          v.ring_cursor = static_cast<const int32_t*>(d_cursor.data());
          // The deferred exact verify (pending zeroed by the materialize): records at the
          // cursors, as the lazy verify's; its u records go to a scratch buffer.
          const int64_t u_slot = static_cast<int64_t>(c.HV) * c.L * c.V;
          u_scratch = Buffer(dev, S * u_slot * static_cast<int64_t>(sizeof(float)));
          v.ring_pending = static_cast<const int32_t*>(m_pending.data());
          v.ssm_fold_out = static_cast<float*>(exact.view(Tensor::kSsmState).data());
          v.ring_u = static_cast<float*>(u_scratch.data());
          v.ring_u_slot_stride = u_slot;
          shape(v);
          kernels::invoke_verify_fused(v, 64, nullptr);
          REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        }
        // The lazy verify of problem `x` (fast outputs, the history's cursors and pending steps).
        const auto lazy_params = [&](VerifyProblem& x) {
          VerifyParams v = x.params(RecordMode::kRing);
          v.numerics = VerifyNumerics::kFast;
          v.ring_cursor = static_cast<const int32_t*>(d_cursor.data());
          v.ring_pending = static_cast<const int32_t*>(d_pending.data());
          v.lazy = 1;
          v.u_free = 1;
          shape(v);
          return v;
        };
        // The lazy verify at every fast tile: bitwise the same outputs (§10 (a)).
        std::vector<bf16_t> first_out;
        VerifyProblem lazy = base.clone_to(dev);
        for (const int bv : {32, 64, 128}) {
          CAPTURE(bv);
          lazy = base.clone_to(dev);
          fast_verify(lazy_params(lazy), bv);
          if (first_out.empty()) {
            first_out = lazy.out();
          } else {
            CHECK(bitwise_equal(lazy.out(), first_out));
          }
        }
        if (i == 1) {
          // A staggered lazy plan is refused before anything runs (the lazy kernels are built
          // without the late tile): outputs untouched.
          VerifyProblem refused = base.clone_to(dev);
          const VerifyParams v = lazy_params(refused);
          kernels::VerifyPlan plan =
              kernels::plan_verify(v, VerifyPath::kFused, 64, kernels::device_caps(), {}, 0);
          REQUIRE_FALSE(plan.stagger_tiles);
          plan.stagger_tiles = true;
          const std::vector<bf16_t> before = refused.out();
          CHECK_THROWS_WITH(kernels::invoke_verify(v, plan, nullptr),
                            Catch::Contains("staggers its tiles"));
          CHECK(bitwise_equal(refused.out(), before));
        }
        // Records and windows: the exact path's; the state and the history: untouched.
        CHECK(bitwise_equal(lazy.rawk(), exact.rawk()));
        CHECK(bitwise_equal(lazy.rawv(), exact.rawv()));
        CHECK(bitwise_equal(lazy.ring_g(), exact.ring_g()));
        CHECK(bitwise_equal(lazy.ring_beta(), exact.ring_beta()));
        CHECK(bitwise_equal(lazy.conv_window(), exact.conv_window()));
        CHECK(lazy.raw(Tensor::kSsmState) == base.raw(Tensor::kSsmState));
        CHECK(lazy.raw(Tensor::kConvState) == base.raw(Tensor::kConvState));
        // §10 (b) against exact, (c) against fp64 (dense).
        const OutCompare cmp =
            compare_requests(lazy.out(), exact.out(), first, lengths, -1, c.HV, c.V);
        CAPTURE(cmp.describe());
        CHECK(cmp.max_ulp <= kMaxUlp);
        CHECK(cmp.nonfinite == 0);
        total.merge(cmp);
        if (!ragged) {
          const VerifyProblem host = exact.clone_to(Device::host());
          const host::Fp64Verify oracle = host::verify_fp64(host.params(RecordMode::kRing), false);
          std::vector<int64_t> rows;
          for (int r = 0; r < 3 * T; ++r) {
            rows.push_back(r);
          }
          const int64_t width = int64_t{c.HV} * c.V;
          const std::vector<double> want = gather_rows(oracle.out, rows, width);
          const double e_fast = rel_l2(gather_rows(lazy.out(), rows, width), want);
          const double e_exact = rel_l2(gather_rows(exact.out(), rows, width), want);
          const double ratio = e_fast / std::max(e_exact, 1e-12);
          CAPTURE(e_fast, e_exact);
          CHECK(ratio <= 1.25);
          worst_ratio = std::max(worst_ratio, ratio);
        }
      }
    }
  }
  CAPTURE(total.describe(), worst_ratio);
  CHECK(total.meets_contract());
}
