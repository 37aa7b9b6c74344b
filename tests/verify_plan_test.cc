// verify_plan_test.cc: plan_verify (kernels/verify/verify_plan.h), the one place that decides a
// verify call's schedule, features, grid and entry trigger: its rules on an H100/H200-sized device
// (132 SMs, sm_90) and under forced overrides, without a device. That the planned kernels give
// the same bits whatever the plan is the GPU tests' job (kernels_gpu_test, deferred_gpu_test).
#include <catch2/catch.hpp>

#include <string>

#include "kernels/params/kda_params.h"
#include "kernels/verify/tile_policy.h"
#include "kernels/verify/verify_plan.h"

using namespace kda;
using kernels::DeviceCaps;
using kernels::LaunchOverrides;
using kernels::VerifyPlan;
using kernels::VerifySchedule;

namespace {

constexpr DeviceCaps kSm90{132, 9};
constexpr int kTwoPerSm = 2;  ///< the persistent kernels' occupancy (__launch_bounds__(256, 2))

/// A Kimi-Linear-shaped call (H = HV = 32, K = V = 128), every pointer 16-byte aligned so the
/// persistent layout rule passes.
VerifyParams kimi(int B, int T, RecordMode mode) {
  alignas(16) static float state[4];
  alignas(16) static bf16_t act[8];
  VerifyParams p;
  p.B = B;
  p.T = T;
  p.H = p.HV = 32;
  p.K = p.V = 128;
  p.T_max = 8;
  p.L = 16;
  p.mode = mode;
  p.mixed_qkv = p.a = p.b = p.conv_state = act;
  p.qkv_act = const_cast<bf16_t*>(act);
  p.mixed_qkv_stride = 8 * 1000;
  p.a_stride = 4096;
  p.conv_state_slot_stride = 3 * 8 * 1000;
  p.ssm_state = state;
  p.ssm_slot_stride = 32 * 128 * 128;
  return p;
}

VerifyPlan plan(const VerifyParams& p, VerifyPath path, int bv, const LaunchOverrides& o = {},
                const DeviceCaps& caps = kSm90) {
  return kernels::plan_verify(p, path, bv, caps, o, kTwoPerSm);
}

// A deferred call of the u-free deferred commit.
VerifyParams u_free_fast(VerifyParams p) {
  p.u_free = 1;
  p.numerics = VerifyNumerics::kFast;
  return p;
}

}  // namespace

TEST_CASE("verify plan: small grids run one CTA per SM, large ones persistent", "[kernels][plan]") {
  // B = 1, BV = 32: 128 CTAs <= 132 SMs, ring mode: the wide form.
  VerifyPlan s = plan(kimi(1, 4, RecordMode::kRing), VerifyPath::kFused, 32);
  CHECK(s.schedule == VerifySchedule::kPerItemWide);
  CHECK(s.items == 128);
  CHECK(s.grid == 128);
  CHECK(s.features == kernels::kNoFeatures);
  CHECK_FALSE(s.entry_trigger);
  CHECK(s.kernel() == "verify_tile<f32 K=128 BV=32 fused per-item-wide>");
  // B = 64, BV = 128: 2048 items, beyond three waves: persistent, two CTAs per SM.
  const VerifyPlan l = plan(kimi(64, 4, RecordMode::kRing), VerifyPath::kFused, 128);
  CHECK(l.schedule == VerifySchedule::kPersistentRing);
  CHECK(l.grid == 264);
  CHECK(l.kernel() == "verify_persistent<f32 K=128 BV=128 fused persistent-ring> x264 CTAs");
  // The fused BV = 128 tile stays one per SM up to kWideFusedMaxWaves waves (B = 12: 384 CTAs).
  CHECK(plan(kimi(12, 4, RecordMode::kRing), VerifyPath::kFused, 128).schedule ==
        VerifySchedule::kPerItemWide);
  CHECK(plan(kimi(13, 4, RecordMode::kRing), VerifyPath::kFused, 128).schedule ==
        VerifySchedule::kPersistentRing);
  // Snapshot mode at BV = 128 beyond the wide window: persistent snapshot.
  CHECK(plan(kimi(64, 8, RecordMode::kSnapshot), VerifyPath::kFused, 128).schedule ==
        VerifySchedule::kPersistentSnapshot);
  // Two token chunks cannot go persistent: two per SM.
  CHECK(plan(kimi(64, 12, RecordMode::kRing), VerifyPath::kFused, 128).schedule ==
        VerifySchedule::kPerItem);
  // Before sm_90 (no TMA): no persistent kernel.
  CHECK(plan(kimi(64, 4, RecordMode::kRing), VerifyPath::kFused, 128, {}, DeviceCaps{132, 8})
            .schedule == VerifySchedule::kPerItem);
}

TEST_CASE("verify plan: the unfused recurrence goes persistent beyond one wave",
          "[kernels][plan]") {
  // Unfused, BV = 128: B = 4 fits one wave of one CTA per SM (wide); B = 8, 256 items, fits one
  // wave of the persistent kernel's 264 resident CTAs: per item; B = 16: persistent.
  CHECK(plan(kimi(4, 4, RecordMode::kRing), VerifyPath::kUnfused, 0).schedule ==
        VerifySchedule::kPerItemWide);
  const VerifyPlan b8 = plan(kimi(8, 4, RecordMode::kRing), VerifyPath::kUnfused, 0);
  CHECK(b8.schedule == VerifySchedule::kPerItem);
  CHECK(b8.block_v == kernels::kRecurrentBlockV);
  CHECK(b8.kernel() == "conv_update + verify_tile<f32 K=128 BV=128 unfused per-item>");
  const VerifyPlan b16 = plan(kimi(16, 4, RecordMode::kRing), VerifyPath::kUnfused, 0);
  CHECK(b16.schedule == VerifySchedule::kPersistentRing);
  CHECK(b16.grid == 264);
  // The persistent layout needs a 16-byte-aligned qkv_act on the unfused path.
  VerifyParams odd = kimi(16, 4, RecordMode::kRing);
  odd.qkv_act += 2;
  CHECK(plan(odd, VerifyPath::kUnfused, 0).schedule == VerifySchedule::kPerItem);
}

TEST_CASE("verify plan: features follow the call; ragged and tracked rules", "[kernels][plan]") {
  int32_t pending[1] = {0};
  int32_t offsets[2] = {0, 4};
  float fold_out[4];
  VerifyParams d = kimi(1, 2, RecordMode::kRing);
  d.ring_pending = pending;
  d.ssm_fold_out = fold_out;
  d.fold_before_wait = 1;
  // A deferred one-per-SM BV = 64 tile at T = 2 triggers its dependents at entry; the deferred
  // BV = 32 tile keeps two CTAs per SM and never does; nor does the first layer's verify.
  const VerifyPlan t = plan(d, VerifyPath::kFused, 64);
  CHECK(t.features == kernels::kDeferredFold);
  CHECK(t.schedule == VerifySchedule::kPerItemWide);
  CHECK(t.entry_trigger);
  CHECK_FALSE(plan(d, VerifyPath::kFused, 32).entry_trigger);
  d.fold_before_wait = 0;
  CHECK_FALSE(plan(d, VerifyPath::kFused, 64).entry_trigger);
  // Ragged rows: an unfused ragged call runs two per SM; a fused one takes the dense schedule,
  // persistent only in ring mode.
  VerifyParams r = kimi(64, 4, RecordMode::kRing);
  r.token_offsets = offsets;
  CHECK(plan(r, VerifyPath::kUnfused, 0).schedule == VerifySchedule::kPerItem);
  const VerifyPlan rf = plan(r, VerifyPath::kFused, 128);
  CHECK(rf.schedule == VerifySchedule::kPersistentRing);
  CHECK(rf.features == kernels::kRaggedRows);
  r.mode = RecordMode::kSnapshot;
  CHECK(plan(r, VerifyPath::kFused, 128).schedule == VerifySchedule::kPerItem);
  // Extend runs BV = kExtendBlockV, never persistent; with tracks, the tracked instantiations.
  const VerifyPlan e = kernels::plan_verify(kimi(64, 4, RecordMode::kRing), VerifyPath::kFused, 128,
                                            kSm90, {}, kTwoPerSm, /*extend=*/true);
  CHECK(e.block_v == kernels::kExtendBlockV);
  CHECK(e.schedule == VerifySchedule::kPerItem);
  const VerifyPlan tracked =
      kernels::plan_verify(kimi(1, 4, RecordMode::kRing), VerifyPath::kFused, 32, kSm90, {},
                           kTwoPerSm, /*extend=*/true, /*tracked_extend=*/true);
  CHECK(tracked.features == kernels::kExtendTracks);
  CHECK(tracked.schedule == VerifySchedule::kPerItemWide);
}

TEST_CASE("verify plan: overrides force each schedule; plans compare by value", "[kernels][plan]") {
  LaunchOverrides never;
  never.persistent = kernels::PersistentMode::kNever;
  CHECK(plan(kimi(64, 4, RecordMode::kRing), VerifyPath::kFused, 128, never).schedule ==
        VerifySchedule::kPerItem);
  LaunchOverrides squeezed;
  squeezed.persistent = kernels::PersistentMode::kAlways;
  squeezed.persistent_max_ctas = 3;
  squeezed.occupancy = kernels::TileOccupancy::kTwoPerSm;
  const VerifyPlan s = plan(kimi(1, 4, RecordMode::kRing), VerifyPath::kFused, 128, squeezed);
  CHECK(s.schedule == VerifySchedule::kPersistentRing);
  CHECK(s.grid == 3);
  LaunchOverrides one;
  one.occupancy = kernels::TileOccupancy::kOnePerSm;
  CHECK(plan(kimi(64, 4, RecordMode::kSnapshot), VerifyPath::kFused, 64, one).schedule ==
        VerifySchedule::kPerItemWide);
  LaunchOverrides no_pdl;
  no_pdl.pdl = false;
  const VerifyPlan a = plan(kimi(2, 4, RecordMode::kRing), VerifyPath::kFused, 32);
  const VerifyPlan b = plan(kimi(2, 4, RecordMode::kRing), VerifyPath::kFused, 32, no_pdl);
  CHECK_FALSE(b.pdl);
  CHECK(a != b);
  CHECK(a == plan(kimi(2, 4, RecordMode::kRing), VerifyPath::kFused, 32));
}

TEST_CASE("verify plan: fast outputs plan kFastChunk only where contract §10 applies",
          "[kernels][plan][fast]") {
  VerifyParams p = kimi(64, 4, RecordMode::kRing);
  p.numerics = VerifyNumerics::kFast;
  for (const int bv : kernels::kFastBlockVs) {
    CAPTURE(bv);
    const VerifyPlan f = plan(p, VerifyPath::kFused, bv);
    CHECK(f.schedule == VerifySchedule::kFastChunk);
    CHECK(f.numerics == VerifyNumerics::kFast);
    CHECK(f.features == kernels::kNoFeatures);
    CHECK(f.items == 64 * 32 * (128 / bv));
    // Beyond one wave: a CTA per item, staggered tiles.
    CHECK(f.grid == f.items);
    CHECK(f.stagger_tiles);
    CHECK(f.kernel().find("fast-chunk") != std::string::npos);
    CHECK(f.kernel().find("CTAs") == std::string::npos);
    CHECK(f.kernel().find("(staggered tiles)") != std::string::npos);
    LaunchOverrides no_stagger;
    no_stagger.fast_stagger = false;
    const VerifyPlan early = plan(p, VerifyPath::kFused, bv, no_stagger);
    CHECK_FALSE(early.stagger_tiles);
    CHECK(early != f);
    CHECK(early.kernel().find("staggered") == std::string::npos);
    // Unknown SMs: no wave to be beyond.
    CHECK_FALSE(plan(p, VerifyPath::kFused, bv, {}, DeviceCaps{0, 9}).stagger_tiles);
  }
  // B = 16: 512, 1024 and 2048 items at BV = 128, 64, 32 (264 CTAs per wave here): a CTA per
  // item, staggered; the resident CTAs walk the items only when asked (fast_walk, or persistent
  // always), never staggered.
  VerifyParams p16 = p;
  p16.B = 16;
  for (const int bv : kernels::kFastBlockVs) {
    CAPTURE(bv);
    const VerifyPlan f = plan(p16, VerifyPath::kFused, bv);
    CHECK(f.grid == f.items);
    CHECK(f.stagger_tiles);
    CHECK(f.kernel().find("CTAs") == std::string::npos);
    LaunchOverrides never;
    never.persistent = kernels::PersistentMode::kNever;
    never.fast_walk = true;
    CHECK(plan(p16, VerifyPath::kFused, bv, never).grid == f.items);
    CHECK(plan(p16, VerifyPath::kFused, bv, never).stagger_tiles);
    for (const bool by_flag : {true, false}) {
      CAPTURE(by_flag);
      LaunchOverrides walk;
      walk.fast_walk = by_flag;
      walk.persistent = by_flag ? kernels::PersistentMode::kAuto : kernels::PersistentMode::kAlways;
      const VerifyPlan w = plan(p16, VerifyPath::kFused, bv, walk);
      CHECK(w.grid == kernels::kFastCtasPerSm * kSm90.sms);
      CHECK(w.kernel().find("x264 CTAs") != std::string::npos);
      CHECK_FALSE(w.stagger_tiles);
    }
    LaunchOverrides no_stagger;
    no_stagger.fast_stagger = false;
    CHECK(plan(p16, VerifyPath::kFused, bv, no_stagger).grid == f.items);
    CHECK_FALSE(plan(p16, VerifyPath::kFused, bv, no_stagger).stagger_tiles);
  }
  // Within one wave: a CTA per item (B = 1: 32 heads x 128 / bv tiles <= 264).
  VerifyParams one = p;
  one.B = 1;
  for (const int bv : kernels::kFastBlockVs) {
    const VerifyPlan f = plan(one, VerifyPath::kFused, bv);
    CHECK(f.grid == f.items);
    CHECK(f.kernel().find("CTAs") == std::string::npos);
    CHECK_FALSE(f.stagger_tiles);  // within one wave
  }
  LaunchOverrides squeezed;
  squeezed.persistent = kernels::PersistentMode::kAlways;
  squeezed.persistent_max_ctas = 3;
  CHECK(plan(one, VerifyPath::kFused, 64, squeezed).grid == 3);
  // No walk where the inputs are not staged: beyond one token chunk, a lazy call, inputs not
  // copyable in 16-byte pieces.
  VerifyParams long_chunk = p16;
  long_chunk.T = 12;
  long_chunk.T_max = 12;
  CHECK_FALSE(kernels::fast_walk_possible(long_chunk));
  CHECK(plan(long_chunk, VerifyPath::kFused, 128).grid ==
        plan(long_chunk, VerifyPath::kFused, 128).items);
  VerifyParams odd = p16;
  odd.a_stride = 4100;
  CHECK_FALSE(kernels::fast_walk_possible(odd));
  CHECK(plan(odd, VerifyPath::kFused, 128).grid == plan(odd, VerifyPath::kFused, 128).items);
  static const int32_t lazy_pending[64] = {};
  VerifyParams lazy = p16;
  lazy.lazy = 1;
  lazy.ring_pending = lazy_pending;
  CHECK_FALSE(kernels::fast_walk_possible(lazy));
  CHECK(plan(lazy, VerifyPath::kFused, 128).grid == plan(lazy, VerifyPath::kFused, 128).items);
  // A lazy call beyond one wave: a CTA per item, its tiles never staggered.
  VerifyParams lazy64 = lazy;
  lazy64.B = 64;
  CHECK(plan(lazy64, VerifyPath::kFused, 128).items > 2 * kSm90.sms);
  CHECK_FALSE(plan(lazy64, VerifyPath::kFused, 128).stagger_tiles);
  CHECK(kernels::fast_walk_possible(p));
  // The same call asking for exact outputs plans as before.
  VerifyParams e = p;
  e.numerics = VerifyNumerics::kExact;
  CHECK(plan(e, VerifyPath::kFused, 128).schedule == VerifySchedule::kPersistentRing);
  CHECK(plan(e, VerifyPath::kFused, 128).numerics == VerifyNumerics::kExact);
  CHECK_FALSE(plan(e, VerifyPath::kFused, 128).stagger_tiles);
  CHECK_FALSE(plan(e, VerifyPath::kFused, 64).stagger_tiles);

  // Ragged rows: the fast kernel's ragged instantiation.
  static const int32_t offsets[3] = {0, 3, 7};
  VerifyParams r = kimi(2, 4, RecordMode::kRing);
  r.numerics = VerifyNumerics::kFast;
  r.token_offsets = offsets;
  CHECK(plan(r, VerifyPath::kFused, 64).schedule == VerifySchedule::kFastChunk);
  CHECK(plan(r, VerifyPath::kFused, 64).features == kernels::kRaggedRows);

  // Where §10 does not apply the plan is exact (kda::VerifyNumerics::kExact), whatever was asked.
  auto exact = [](const VerifyPlan& x) {
    return x.numerics == VerifyNumerics::kExact && x.schedule != VerifySchedule::kFastChunk;
  };
  CHECK(exact(plan(p, VerifyPath::kFused, 16)));   // not a fast tile
  CHECK(exact(plan(p, VerifyPath::kUnfused, 0)));  // the unfused path
  VerifyParams snap = kimi(4, 4, RecordMode::kSnapshot);
  snap.numerics = VerifyNumerics::kFast;
  CHECK(exact(plan(snap, VerifyPath::kFused, 64)));  // snapshot mode
  static const int32_t parents[8] = {-1, 0, 0, 1, -1, 0, 0, 1};
  VerifyParams tree = kimi(2, 4, RecordMode::kRing);
  tree.numerics = VerifyNumerics::kFast;
  tree.parents = parents;
  CHECK(exact(plan(tree, VerifyPath::kFused, 64)));  // a tree
  static const int32_t pending[4] = {1, 2, 0, 3};
  static float u_records[1];  // never read: a plan touches no memory
  VerifyParams deferred = p;
  deferred.ring_pending = pending;
  deferred.ring_u = u_records;
  CHECK(exact(plan(deferred, VerifyPath::kFused, 128)));  // a fold from exact u records
  CHECK_FALSE(plan(deferred, VerifyPath::kFused, 128).pending_fold_first);
  // u-free (no u records): fast, the pending steps folded by the fast kernel itself (a CTA per
  // item, its tiles not staggered: the fold needs the tile first).
  VerifyParams u_free = deferred;
  u_free.u_free = 1;
  const VerifyPlan in_kernel = plan(u_free, VerifyPath::kFused, 128);
  CHECK(in_kernel.schedule == VerifySchedule::kFastChunk);
  CHECK_FALSE(in_kernel.pending_fold_first);
  CHECK((in_kernel.features & kernels::kDeferredFold) != 0);
  CHECK(in_kernel.grid == in_kernel.items);
  CHECK_FALSE(in_kernel.stagger_tiles);  // B = 64: beyond one wave, yet not staggered
  CHECK_THAT(in_kernel.kernel(), Catch::StartsWith("verify_tile<"));
  CHECK(in_kernel.kernel().find("fast-chunk deferred") != std::string::npos);
  // Asked not to, or walking: the fold kernel folds them first (then staggered if not walking).
  LaunchOverrides fold_first;
  fold_first.fast_fold_in_kernel = false;
  const VerifyPlan first = plan(u_free, VerifyPath::kFused, 128, fold_first);
  CHECK(first.schedule == VerifySchedule::kFastChunk);
  CHECK(first.pending_fold_first);
  CHECK(first.stagger_tiles);
  CHECK((first.features & kernels::kDeferredFold) != 0);
  CHECK_THAT(first.kernel(), Catch::StartsWith("pending fold + verify_tile<"));
  CHECK(first != in_kernel);
  LaunchOverrides walk;
  walk.persistent = kernels::PersistentMode::kAlways;
  const VerifyPlan walking = plan(u_free, VerifyPath::kFused, 128, walk);
  CHECK(walking.grid < walking.items);
  CHECK(walking.pending_fold_first);
  CHECK_FALSE(walking.stagger_tiles);
  u_free.numerics = VerifyNumerics::kExact;  // the exact kernels fold first the same way
  CHECK(plan(u_free, VerifyPath::kFused, 128).pending_fold_first);
  CHECK(plan(u_free, VerifyPath::kUnfused, 0).pending_fold_first);
  VerifyParams long_draft = kimi(2, 17, RecordMode::kRing);
  long_draft.numerics = VerifyNumerics::kFast;
  CHECK(exact(plan(long_draft, VerifyPath::kFused, 64)));  // T > kFastMaxTokens
  CHECK(exact(kernels::plan_verify(p, VerifyPath::kFused, 32, kSm90, {}, kTwoPerSm,
                                   /*extend=*/true)));  // extend
  CHECK(kernels::fast_outputs_plannable(p, VerifyPath::kFused, 64));
  CHECK_FALSE(kernels::fast_outputs_plannable(deferred, VerifyPath::kFused, 64));
  CHECK(kernels::fast_outputs_plannable(u_free_fast(deferred), VerifyPath::kFused, 64));
}
