#include "kernels/verify/verify_plan.h"

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/verify/tile_policy.h"

namespace kda::kernels {

namespace {

/// Tokens of one prologue chunk (TileConfig::kChunk): a persistent item holds one.
constexpr int kChunkTokens = 8;

}  // namespace

const char* verify_schedule_name(VerifySchedule s) noexcept {
  switch (s) {
    case VerifySchedule::kPerItem:
      return "per-item";
    case VerifySchedule::kPerItemWide:
      return "per-item-wide";
    case VerifySchedule::kPersistentRing:
      return "persistent-ring";
    case VerifySchedule::kPersistentSnapshot:
      return "persistent-snapshot";
    case VerifySchedule::kFastChunk:
      return "fast-chunk";
  }
  return "?";
}

VerifyFeatures verify_features(const VerifyParams& p, bool tracked_extend) {
  if (tracked_extend) {
    return kExtendTracks;
  }
  const VerifyFeatures pending = p.ring_pending == nullptr ? kNoFeatures
                                 : is_lazy_verify(p)       ? kLazyHistory
                                                           : kDeferredFold;
  return pending | (p.token_offsets != nullptr || p.parents != nullptr ? kRaggedRows : kNoFeatures);
}

bool fast_outputs_plannable(const VerifyParams& p, VerifyPath path, int block_v) {
  return p.numerics == VerifyNumerics::kFast && path == VerifyPath::kFused &&
         p.mode == RecordMode::kRing && p.parents == nullptr &&
         (p.ring_pending == nullptr || p.u_free != 0 || is_lazy_verify(p)) && p.T >= 1 &&
         p.T <= kFastMaxTokens && is_fast_block_v(block_v);
}

void check_lazy_plan(const VerifyParams& p, const VerifyPlan& plan, const char* who) {
  KDA_CHECK(!is_lazy_verify(p) || plan.numerics == VerifyNumerics::kFast,
            "{}: a lazy verify (VerifyParams::lazy, contract §11) needs the fast "
            "outputs (numerics fast, the fused path, a fast tile {{32, 64, 128}}, a chain of "
            "T <= {}); the call plans {} (path {}, block_v {}, T {}, numerics {})",
            who, kFastMaxTokens, plan.kernel(),
            plan.path == VerifyPath::kFused ? "fused" : "unfused", plan.block_v, p.T,
            p.numerics == VerifyNumerics::kFast ? "fast" : "exact");
}

bool fast_walk_possible(const VerifyParams& p) {
  return !is_lazy_verify(p) && persistent_layout_ok(p, VerifyPath::kFused);
}

bool persistent_layout_ok(const VerifyParams& p, VerifyPath path) {
  const bool fused = path == VerifyPath::kFused;
  const bool inputs_ok =
      p.V % 8 == 0 && is_aligned(p.a, 16) && p.a_stride % 8 == 0 &&
      (fused ? is_aligned(p.mixed_qkv, 16) && p.mixed_qkv_stride % 8 == 0 &&
                   is_aligned(p.conv_state, 16) && p.conv_state_slot_stride % 8 == 0
             : is_aligned(p.qkv_act, 16));
  const bool fold_ok = p.ring_pending == nullptr || is_aligned(p.ssm_fold_out, 16);
  return p.T <= kChunkTokens && is_aligned(p.ssm_state, 16) && p.ssm_slot_stride % 4 == 0 &&
         inputs_ok && fold_ok;
}

VerifyPlan plan_verify(const VerifyParams& p, VerifyPath path, int block_v, const DeviceCaps& caps,
                       const LaunchOverrides& o, int persistent_ctas_per_sm, bool extend,
                       bool tracked_extend) {
  const bool fused = path == VerifyPath::kFused;
  VerifyPlan plan;
  plan.path = path;
  plan.extend = extend;
  plan.weight = fused ? p.conv_weight_type : ConvWeightType::kF32;
  plan.K = p.K;
  plan.block_v = extend ? kExtendBlockV : (fused ? block_v : kRecurrentBlockV);
  plan.features = verify_features(p, extend && tracked_extend);
  plan.pdl = o.pdl;
  const int bv = plan.block_v;
  plan.pending_fold_first =
      !extend && p.ring_pending != nullptr && p.u_free != 0 && !is_lazy_verify(p);
  plan.items = ceil_div(p.V, bv) * p.HV * p.B;
  plan.grid = plan.items;
  if (!extend && fast_outputs_plannable(p, path, block_v)) {
    plan.schedule = VerifySchedule::kFastChunk;
    plan.numerics = VerifyNumerics::kFast;
    // Beyond one wave a CTA per item, its tiles staggered; the resident CTAs walk the items
    // (fast_walk.cuh: each item's inputs and state tile copied under the previous item's work)
    // only when asked (LaunchOverrides::fast_walk, or PersistentMode::kAlways): the staggered CTA
    // per item measured faster beyond one wave (docs/perf.md §7). The bits are the same at every
    // grid.
    const bool walk_asked = o.fast_walk || o.persistent == PersistentMode::kAlways;
    const int64_t grid =
        persistent_grid(plan.items, kFastCtasPerSm, caps, o, walk_asked && fast_walk_possible(p),
                        PersistentFrom::kBeyondOneWave);
    if (grid > 0) {
      plan.grid = grid;
    }
    // A u-free deferred call with a CTA per item: the fast kernel folds the pending steps onto its
    // staged tile (one read and one write of the state, not the fold kernel's pass before the
    // verify's read); the walk folds them first.
    if (plan.pending_fold_first && o.fast_fold_in_kernel && plan.grid == plan.items) {
      plan.pending_fold_first = false;
    }
    const bool folds_in_kernel = (plan.features & kDeferredFold) != 0 && !plan.pending_fold_first;
    plan.stagger_tiles = o.fast_stagger && !is_lazy_verify(p) && !folds_in_kernel &&
                         plan.grid == plan.items && caps.sms > 0 &&
                         plan.items > int64_t{kFastCtasPerSm} * caps.sms;
    return plan;
  }
  const bool shaped = (plan.features & kRaggedRows) != 0;
  const bool deferred = (plan.features & kDeferredFold) != 0;
  const bool ring = p.mode == RecordMode::kRing;
  // An unfused shaped call steps one token at a time (a tree node may restart) and its block
  // scheduler balances unequal T_n, which the persistent CTAs' fixed item order does not
  // (persistent, the unfused ragged recurrence measured slower on mixed lengths): two per SM.
  if (shaped && !fused) {
    return plan;
  }
  // The one-CTA-per-SM form where it gains: its grouped ring-mode steps (and extend's); snapshot
  // mode (one step at a time) proved slower in it at small B. The fused BV = 128 tile in every
  // mode: in snapshot mode too its one-per-SM CTAs beat the persistent kernel up to
  // kWideFusedMaxWaves waves; the unfused recurrence's does not gain beyond one wave. The
  // narrower fused tiles in snapshot mode: one per SM only where that fills the waves better.
  const bool gains = extend || ring || (fused && bv == 128);
  const int max_waves = fused && bv == 128 ? kWideFusedMaxWaves : 1;
  const bool by_wave_fill = fused && bv < 128 && !gains;
  const bool one_per_sm =
      by_wave_fill ? (o.occupancy != TileOccupancy::kAuto
                          ? o.occupancy == TileOccupancy::kOnePerSm
                          : one_per_sm_fills_waves_better(plan.items, caps.sms))
                   : one_cta_per_sm_tiles_on(plan.items, gains, caps.sms, o.occupancy, max_waves);
  if (one_per_sm) {
    plan.schedule = VerifySchedule::kPerItemWide;
    // The tile's register budget decides the CTAs per SM (the deferred BV = 32 tile keeps two).
    const bool alone_on_sm = tile_min_ctas_per_sm(bv, /*wide=*/true, /*deferred=*/true) == 1;
    plan.entry_trigger = deferred && !extend && ring && p.fold_before_wait != 0 &&
                         deferred_triggers_at_entry(p.T, alone_on_sm, plan.items);
    return plan;
  }
  // BV = 128: the persistent kernel where its rule picks it (ring mode, or snapshot mode without
  // ragged rows: snapshot mode's per-item kernel is at its bandwidth floor there).
  if (bv == 128 && !extend && (ring || !shaped)) {
    const int64_t grid =
        persistent_grid(plan.items, persistent_ctas_per_sm, caps, o, persistent_layout_ok(p, path),
                        fused ? PersistentFrom::kAnyCount : PersistentFrom::kBeyondOneWave);
    if (grid > 0) {
      plan.schedule = ring ? VerifySchedule::kPersistentRing : VerifySchedule::kPersistentSnapshot;
      // The snapshot kernel carries no fold: a deferred call is ring mode.
      if (!ring) {
        plan.features = kNoFeatures;
      }
      plan.grid = grid;
      return plan;
    }
  }
  return plan;
}

std::string VerifyPlan::kernel() const {
  if (host_reference) {
    return fmt::format("the host reference ({}{})",
                       path == VerifyPath::kFused ? "fused" : "unfused",
                       numerics == VerifyNumerics::kFast ? ", fast outputs" : "");
  }
  std::string features_text;
  if ((features & kDeferredFold) != 0) {
    features_text += " deferred";
  }
  if ((features & kLazyHistory) != 0) {
    features_text += " lazy";
  }
  if ((features & kRaggedRows) != 0) {
    features_text += " ragged";
  }
  if ((features & kExtendTracks) != 0) {
    features_text += " tracked";
  }
  const bool fused = path == VerifyPath::kFused;
  return fmt::format(
      "{}{}verify_{}<{} K={} BV={} {} {}{}{}>{}{}{}", pending_fold_first ? "pending fold + " : "",
      fused ? "" : "conv_update + ", is_persistent(schedule) ? "persistent" : "tile",
      weight == ConvWeightType::kF32 ? "f32" : "bf16", K, block_v, fused ? "fused" : "unfused",
      verify_schedule_name(schedule), features_text, extend ? " extend" : "",
      is_persistent(schedule) || grid < items ? fmt::format(" x{} CTAs", grid) : std::string(),
      entry_trigger ? " (entry trigger)" : "", stagger_tiles ? " (staggered tiles)" : "");
}

bool VerifyPlan::operator==(const VerifyPlan& o) const {
  return path == o.path && extend == o.extend && weight == o.weight && K == o.K &&
         block_v == o.block_v && schedule == o.schedule && features == o.features &&
         numerics == o.numerics && pending_fold_first == o.pending_fold_first &&
         entry_trigger == o.entry_trigger && stagger_tiles == o.stagger_tiles && pdl == o.pdl &&
         items == o.items && grid == o.grid && host_reference == o.host_reference;
}

}  // namespace kda::kernels
