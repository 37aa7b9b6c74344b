// deferred_gpu_test.cc: the deferred commit on the CUDA kernels (contract §7), bitwise against
// the eager fold, for every verify path: every fused tile in both register budgets, the
// persistent kernels (forced, with few CTAs so that each walks many items), the
// per-item forms of the BV = 128 tile, and the unfused pair; the per-item kernels with their fold
// before and after the PDL wait (VerifyParams::fold_before_wait); and the u-free form of the fast
// outputs (contract §10: no u records), whose fast kernel folds the pending steps onto its staged
// tile at every fast tile (or the fold kernel first, when asked), on dense and ragged rows. Each
// case runs two rounds on two copies of one problem (garbage-filled records and outputs, reversed
// slots, a padding row):
//   eager:    verify (cursor 0) -> fold of n accepted steps -> verify of new inputs;
//   deferred: verify at random per-slot cursors (records wrap around the ring) -> deferred
//             commit (pending n, cursor + n) -> verify of the same new inputs, which folds first.
// The second verify (T tokens, or T / 2: fewer tokens than the most pending steps; at T = 12 the
// 6-token verify streams on the streamed paths, and its fold runs two chunks of pending steps)
// has bitwise equal outputs and windows, ring records (at the shifted positions) and committed
// state after it (a planted fast fold a step short, fast_faults_gpu.h, fails that check); the
// deferred commit moved no SSM state; the materializing fold (kMaterialize) of the same pending
// steps gives the same state; and a padding row and the slots outside the batch are untouched.
#include <cuda_runtime_api.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/common/launch_utils.h"
#include "kernels/kda_kernels.h"
#include "tests/fast_faults_gpu.h"
#include "tests/test_problem.h"

using namespace kda;
using namespace kda::testing;

namespace {

struct Path {
  const char* name;
  int block_v;  ///< 0: unfused
  kernels::PersistentMode persistent;
  kernels::TileOccupancy occupancy;
  /// The fast outputs, u-free (both copies verify fast; the deferred one records no u).
  bool fast = false;
  /// With `fast`: the fast kernel folds the pending steps (or the fold kernel first).
  bool fold_in_kernel = true;
};

void verify(const VerifyParams& p, const Path& path) {
  kernels::LaunchOverrides o;
  o.persistent = path.persistent;
  o.persistent_max_ctas = path.persistent == kernels::PersistentMode::kAlways ? 3 : 0;
  o.occupancy = path.occupancy;
  o.fast_fold_in_kernel = path.fold_in_kernel;
  if (path.block_v == 0) {
    kernels::invoke_verify_unfused(p, nullptr, o);
  } else {
    kernels::invoke_verify_fused(p, path.block_v, nullptr, o);
  }
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
}

// New round-2 inputs, the same on both copies.
void new_inputs(VerifyProblem& x, VerifyProblem& y, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> n(0.0f, 0.5f);
  for (const Tensor t : {Tensor::kQkv, Tensor::kA, Tensor::kB}) {
    std::vector<bf16_t> v = x.get<bf16_t>(t);
    for (bf16_t& e : v) {
      e = float_to_bf16(n(rng));
    }
    x.set(t, v);
    y.set(t, v);
  }
}

// Bitwise equality (bf16_t has no ==; floats compare bits, NaN-safe).
template <typename T>
bool same(const std::vector<T>& x, const std::vector<T>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0;
}

template <typename T>
std::vector<T> record(const std::vector<T>& ring, int slot, int head, int heads, int L, int pos,
                      int width) {
  return slice(ring, ((static_cast<int64_t>(slot) * heads + head) * L + pos) * width, width);
}

}  // namespace

TEST_CASE("deferred: every verify path folds pending steps bitwise like the eager fold",
          "[kernels][deferred][gpu]") {
  VerifyCase c = GENERATE(values<VerifyCase>({
      make_case(/*B=*/5, /*T=*/4, /*H=*/2, /*HV=*/4, /*K=*/128, /*V=*/128, RecordMode::kRing, 3),
      make_case(/*B=*/4, /*T=*/8, /*H=*/1, /*HV=*/2, /*K=*/64, /*V=*/64, RecordMode::kRing, 4),
      make_case(/*B=*/3, /*T=*/3, /*H=*/2, /*HV=*/2, /*K=*/128, /*V=*/96, RecordMode::kRing, 5),
      // Eight pending steps at K = 128 (a whole chunk of fold jobs).
      make_case(/*B=*/3, /*T=*/8, /*H=*/1, /*HV=*/2, /*K=*/128, /*V=*/128, RecordMode::kRing, 6),
      // More pending steps than one chunk (the fold runs two chunks) beside fewer.
      [] {
        VerifyCase x = make_case(/*B=*/3, /*T=*/12, /*H=*/1, /*HV=*/2, /*K=*/64, /*V=*/64,
                                 RecordMode::kRing, 7);
        x.L = 32;
        return x;
      }(),
  }));
  c.neg_slot = true;
  c.reversed = true;
  const Path path = GENERATE(values<Path>({
      {"BV=8 two per SM", 8, kernels::PersistentMode::kNever, kernels::TileOccupancy::kTwoPerSm},
      {"BV=8 one per SM", 8, kernels::PersistentMode::kNever, kernels::TileOccupancy::kOnePerSm},
      {"BV=16 two per SM", 16, kernels::PersistentMode::kNever, kernels::TileOccupancy::kTwoPerSm},
      {"BV=16 one per SM", 16, kernels::PersistentMode::kNever, kernels::TileOccupancy::kOnePerSm},
      {"BV=32 two per SM", 32, kernels::PersistentMode::kNever, kernels::TileOccupancy::kTwoPerSm},
      {"BV=32 one per SM", 32, kernels::PersistentMode::kNever, kernels::TileOccupancy::kOnePerSm},
      {"BV=64 two per SM", 64, kernels::PersistentMode::kNever, kernels::TileOccupancy::kTwoPerSm},
      {"BV=64 one per SM", 64, kernels::PersistentMode::kNever, kernels::TileOccupancy::kOnePerSm},
      {"BV=128 per item", 128, kernels::PersistentMode::kNever, kernels::TileOccupancy::kTwoPerSm},
      {"BV=128 one per SM", 128, kernels::PersistentMode::kNever,
       kernels::TileOccupancy::kOnePerSm},
      {"BV=128 persistent", 128, kernels::PersistentMode::kAlways,
       kernels::TileOccupancy::kTwoPerSm},
      {"unfused per item", 0, kernels::PersistentMode::kNever, kernels::TileOccupancy::kTwoPerSm},
      {"unfused persistent", 0, kernels::PersistentMode::kAlways,
       kernels::TileOccupancy::kTwoPerSm},
      {"fast BV=32", 32, kernels::PersistentMode::kNever, kernels::TileOccupancy::kAuto, true},
      {"fast BV=64", 64, kernels::PersistentMode::kNever, kernels::TileOccupancy::kAuto, true},
      {"fast BV=128", 128, kernels::PersistentMode::kNever, kernels::TileOccupancy::kAuto, true},
      {"fast BV=128 folded first", 128, kernels::PersistentMode::kNever,
       kernels::TileOccupancy::kAuto, true, false},
  }));
  CAPTURE(c, path.name);
  const Device gpu = Device::cuda(0);
  VerifyProblem eager(c, gpu);
  VerifyProblem deferred = eager.clone_to(gpu);
  const int S = eager.num_slots(), L = c.L, B = c.B, T = c.T;
  const std::vector<int32_t> slots = eager.slots();

  // Per-slot cursors (some wrap a round's records past L - 1), nothing pending yet.
  std::mt19937 rng(static_cast<uint32_t>(c.seed));
  std::vector<int32_t> c0(static_cast<size_t>(S));
  for (int32_t& x : c0) {
    x = static_cast<int32_t>(rng() % static_cast<uint32_t>(L));
  }
  c0[static_cast<size_t>(slots[0])] = L - 1;  // request 0's records wrap
  Buffer cursor = make_buffer(c0, gpu);
  Buffer pending = make_buffer(std::vector<int32_t>(static_cast<size_t>(S), 0), gpu);
  std::vector<int32_t> accepted(static_cast<size_t>(B));
  for (int32_t& n : accepted) {
    n = 1 + static_cast<int32_t>(rng() % static_cast<uint32_t>(T));
  }
  if (T >= 8) {
    accepted.front() = T;  // the most pending steps a verify can see
    accepted.back() = 3;
  }
  const Buffer acc = make_buffer(accepted, gpu);
  // The u records, garbage-filled (never zero): the verify writes exactly its steps' records.
  const int64_t u_slot = static_cast<int64_t>(c.HV) * L * c.V;
  std::vector<float> u0(static_cast<size_t>(S * u_slot));
  std::uniform_real_distribution<float> garbage(-3.0f, 3.0f);
  for (float& x : u0) {
    x = garbage(rng);
  }
  Buffer u_rec(gpu, static_cast<int64_t>(u0.size() * sizeof(float)));
  u_rec.upload(u0.data(), u_rec.bytes());

  // The fast paths: both copies verify fast, the deferred one u-free.
  const VerifyNumerics numerics = path.fast ? VerifyNumerics::kFast : VerifyNumerics::kExact;
  VerifyParams pe1 = eager.params();
  pe1.numerics = numerics;
  VerifyParams pd = deferred.params();
  pd.numerics = numerics;
  pd.u_free = path.fast ? 1 : 0;
  pd.ring_cursor = static_cast<const int32_t*>(cursor.data());
  pd.ring_pending = static_cast<const int32_t*>(pending.data());
  pd.ssm_fold_out = static_cast<float*>(deferred.view(Tensor::kSsmState).data());
  pd.ring_u = static_cast<float*>(u_rec.data());
  pd.ring_u_slot_stride = u_slot;
  // The per-item kernels fold before their PDL wait or after it (the persistent kernels ignore it).
  pd.fold_before_wait = GENERATE(0, 1);
  CAPTURE(pd.fold_before_wait);

  // Round 1 and the commits.
  verify(pe1, path);
  verify(pd, path);
  {
    // u records: written at the batch's ring positions (c + t) mod L, t < T, every column, and
    // nowhere else (their bits are checked by the folds below: a wrong u changes the state);
    // a fast verify writes none.
    const std::vector<float> u1 =
        to_host_vector<float>(u_rec.view(DType::kF32, {static_cast<int64_t>(u0.size())}));
    std::vector<char> written(u0.size(), 0);
    for (int i = 0; i < B; ++i) {
      const int32_t s = slots[static_cast<size_t>(i)];
      for (int t = 0; s >= 0 && !path.fast && t < T; ++t) {
        const int pos = (c0[static_cast<size_t>(s)] + t) & (L - 1);
        for (int hv = 0; hv < c.HV; ++hv) {
          const int64_t at = s * u_slot + (static_cast<int64_t>(hv) * L + pos) * c.V;
          std::fill(written.begin() + at, written.begin() + at + c.V, 1);
        }
      }
    }
    int64_t changed_elsewhere = 0, unwritten = 0;
    for (size_t e = 0; e < u0.size(); ++e) {
      const bool same_bits = std::memcmp(&u0[e], &u1[e], sizeof(float)) == 0;
      changed_elsewhere += !written[e] && !same_bits ? 1 : 0;
      unwritten += written[e] && same_bits ? 1 : 0;
    }
    CHECK(changed_elsewhere == 0);
    CHECK(unwritten == 0);
  }
  kernels::invoke_commit(eager.commit_params(acc), nullptr);
  const std::vector<float> state_before = deferred.ssm_state();
  CommitParams cd = deferred.commit_params(acc);
  cd.kind = CommitKind::kDeferred;
  cd.ring_cursor = static_cast<int32_t*>(cursor.data());
  cd.ring_pending = static_cast<int32_t*>(pending.data());
  cd.ring_pending_layer_stride = S;
  if (path.fast) {
    cd.u_free = 1;  // no u records: materialize computes u
  } else {
    cd.ring_u = static_cast<const float*>(u_rec.data());
    cd.ring_u_layer_stride = S * u_slot;
    cd.ring_u_slot_stride = u_slot;
  }
  kernels::invoke_commit(cd, nullptr);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(same(deferred.ssm_state(), state_before));  // no state pass
  CHECK(same(deferred.conv_state(), eager.conv_state()));
  const std::vector<int32_t> c1 = to_host_vector<int32_t>(cursor.view(DType::kI32, {S}));
  const std::vector<int32_t> n1 = to_host_vector<int32_t>(pending.view(DType::kI32, {S}));
  for (int i = 0; i < B; ++i) {
    const int32_t s = slots[static_cast<size_t>(i)];
    if (s >= 0) {
      CHECK(n1[static_cast<size_t>(s)] == accepted[static_cast<size_t>(i)]);
      CHECK(c1[static_cast<size_t>(s)] ==
            ((c0[static_cast<size_t>(s)] + accepted[static_cast<size_t>(i)]) & (L - 1)));
    }
  }

  // The next round's verify on both copies, with Tn tokens per request (ragged, fast paths only:
  // request i takes lengths[i] <= Tn tokens from row offsets[i]), against each other.
  const auto next_verify = [&](int Tn, bool ragged, bool planted = false) {
    new_inputs(eager, deferred, c.seed + 100);
    VerifyParams pe = pe1, pn = pd;
    pe.T = Tn;
    pn.T = Tn;
    std::vector<int32_t> lengths(static_cast<size_t>(B), Tn), offsets(1, 0);
    Buffer offsets_buf;
    if (ragged) {
      for (int32_t& n : lengths) {
        n = 1 + static_cast<int32_t>(rng() % static_cast<uint32_t>(Tn));
      }
      lengths.back() = Tn;
      for (const int32_t n : lengths) {
        offsets.push_back(offsets.back() + n);
      }
      offsets_buf = make_buffer(offsets, gpu);
      pe.token_offsets = pn.token_offsets = static_cast<const int32_t*>(offsets_buf.data());
    }
    verify(pe, path);
    if (planted) {  // the deferred copy's fast fold a step short: the state must differ
      verify_fast_with_fault(pn, PlantedFastFault::kFoldStepShort);
      const std::vector<float> s_bad = deferred.ssm_state(), s_good = eager.ssm_state();
      size_t differ = 0;
      for (size_t e = 0; e < s_bad.size(); ++e) {
        differ += std::memcmp(&s_bad[e], &s_good[e], sizeof(float)) != 0 ? 1 : 0;
      }
      WARN("planted fold a step short: " << differ << " of " << s_bad.size()
                                         << " state values differ");
      CHECK_FALSE(same(s_bad, s_good));
      CHECK_FALSE(same(deferred.out(), eager.out()));
      return;
    }
    verify(pn, path);
    CHECK(same(deferred.out(), eager.out()));
    CHECK(same(deferred.conv_window(), eager.conv_window()));
    CHECK(same(deferred.ssm_state(), eager.ssm_state()));  // the folded state, written back
    const auto ev = eager.rawv(), dv = deferred.rawv(), ek = eager.rawk(), dk = deferred.rawk();
    const auto eg = eager.ring_g(), dg = deferred.ring_g();
    const auto eb = eager.ring_beta(), db = deferred.ring_beta();
    for (int i = 0; i < B; ++i) {
      const int32_t s = slots[static_cast<size_t>(i)];
      if (s < 0) {
        continue;
      }
      for (int t = 0; t < lengths[static_cast<size_t>(i)]; ++t) {
        const int pos = (c1[static_cast<size_t>(s)] + t) & (L - 1);
        CAPTURE(i, s, t, pos);
        for (int hv = 0; hv < c.HV; ++hv) {
          CHECK(same(record(dv, s, hv, c.HV, L, pos, c.V), record(ev, s, hv, c.HV, L, t, c.V)));
          CHECK(same(record(dg, s, hv, c.HV, L, pos, c.K), record(eg, s, hv, c.HV, L, t, c.K)));
          CHECK(same(record(db, s, hv, c.HV, L, pos, 1), record(eb, s, hv, c.HV, L, t, 1)));
        }
        for (int h = 0; h < c.H; ++h) {
          CHECK(same(record(dk, s, h, c.H, L, pos, c.K), record(ek, s, h, c.H, L, t, c.K)));
        }
      }
    }
  };
  SECTION("the next verify folds first") { next_verify(T, false); }
  // Fewer tokens than the pending steps (at T = 12: 6 tokens, 12 pending for request 0).
  SECTION("a shorter next verify folds first") { next_verify(std::max(1, T / 2), false); }
  if (path.fast) {
    SECTION("a ragged next verify folds first") { next_verify(T, true); }
  }
  if (path.fast && path.fold_in_kernel && path.block_v == 64 && c.K == 128 && T >= 8 &&
      c.wtype == ConvWeightType::kF32 && pd.fold_before_wait == 0) {
    SECTION("a planted fold a step short fails the check") { next_verify(T, false, true); }
  }
  SECTION("materialize folds the same steps") {
    CommitParams cm = cd;
    cm.kind = CommitKind::kMaterialize;
    cm.T = T;
    kernels::invoke_commit(cm, nullptr);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(same(deferred.ssm_state(), eager.ssm_state()));
    for (const int32_t n : to_host_vector<int32_t>(pending.view(DType::kI32, {S}))) {
      CHECK(n == 0);
    }
  }
}
