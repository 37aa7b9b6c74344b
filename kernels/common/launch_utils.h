// launch_utils.h: small host-side helpers shared by the launchers (plain C++).
#pragma once

#include <cstdint>

#include "core/platform_macros.h"

namespace kda::kernels {

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// `ptr` is a multiple of `bytes` (a power of two): vector and bulk-copy alignment checks.
inline bool is_aligned(const void* ptr, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(bytes) == 0;
}

/// CTAs per work unit for a grid of `units` equal units, each splittable into 1..`most` equal
/// CTAs, on a GPU that holds `wave` such CTAs at once: the count whose grid best fills its
/// last wave (a grid of w waves costs ceil(w) waves when every CTA does the same work), the
/// smallest on a tie. The commit's copy kernels size their grids with it.
constexpr int64_t ctas_per_unit_filling_waves(int64_t units, int64_t most, int64_t wave) {
  int64_t best = 1;
  int64_t best_ctas = 0, best_waves = 1;  // best fill = best_ctas / (best_waves * wave)
  for (int64_t k = 1; k <= most; ++k) {
    const int64_t ctas = k * units;
    const int64_t waves = ceil_div(ctas, wave);
    if (ctas * best_waves > best_ctas * waves) {  // ctas / waves > best_ctas / best_waves
      best = k;
      best_ctas = ctas;
      best_waves = waves;
    }
  }
  return best;
}

/// When a launch may take a persistent kernel (verify BV = 128, the fold): persistent CTAs that
/// stream state tiles through shared memory (common/persistent_stage.cuh) instead of one CTA per
/// work item. kAuto: by each family's rule (PersistentFrom). Both give the same bits; tests force
/// each to prove it.
enum class PersistentMode { kAuto, kAlways, kNever };

/// The per-item verify tiles' two register budgets: two CTAs per SM (128 registers per thread)
/// and one (up to 255, ring-mode steps grouped: faster at small B). kAuto: by the plan's rule
/// (verify_plan.h); tests force each form (both give the same bits).
enum class TileOccupancy { kAuto, kTwoPerSm, kOnePerSm };

/// The test and benchmark knobs of every launch, handed to the entry points (kda_kernels.h) and
/// held by a kernel set: no process-wide state. The defaults are what engines run.
struct LaunchOverrides {
  /// Programmatic dependent launch (a no-op before sm_90). Off: every kernel waits for the
  /// previous one to finish (tests compare schedules with it).
  bool pdl = true;
  PersistentMode persistent = PersistentMode::kAuto;
  /// > 0: caps persistent grids at this many CTAs, so that every CTA walks many items (tests).
  int persistent_max_ctas = 0;
  TileOccupancy occupancy = TileOccupancy::kAuto;
  /// On: a fast-output verify beyond one wave runs the item walk (fast_walk.cuh) where it can,
  /// not a CTA per item (benchmarks compare the two; PersistentMode::kAlways walks too; the other
  /// kernels' persistent forms are unchanged). Off by default: the staggered CTA per item is
  /// faster (VerifyPlan::stagger_tiles).
  bool fast_walk = false;
  /// Off: a fast-output verify with a CTA per item beyond one wave stages every CTA's state tile
  /// early, none staggered (VerifyPlan::stagger_tiles; benchmarks compare the two).
  bool fast_stagger = true;
  /// Off: a fast-output u-free deferred verify with a CTA per item folds its pending steps first
  /// with the fold kernel (VerifyPlan::pending_fold_first), not in the fast kernel (benchmarks
  /// compare the two; the bits are the same).
  bool fast_fold_in_kernel = true;

  bool operator==(const LaunchOverrides& o) const {
    return pdl == o.pdl && persistent == o.persistent &&
           persistent_max_ctas == o.persistent_max_ctas && occupancy == o.occupancy &&
           fast_walk == o.fast_walk && fast_stagger == o.fast_stagger &&
           fast_fold_in_kernel == o.fast_fold_in_kernel;
  }
  bool operator!=(const LaunchOverrides& o) const { return !(*this == o); }
};

/// What the launch rules need to know of a device (common/device_caps.cu: device_caps()).
struct DeviceCaps {
  int sms = 0;       ///< multiprocessors; 0 = unknown
  int sm_major = 0;  ///< compute capability major; persistent kernels need >= 9 (TMA)
};

/// Under PersistentMode::kAuto: from how many items a launch that can take the persistent kernel
/// does, per kernel family: within one wave the per-item kernel is faster for the unfused
/// recurrence, while the fused verify is faster persistent at T = 8 and breaks even at T = 4.
/// The fold goes persistent beyond one wave (an all-layer fold of a 20-layer model exceeds one
/// wave already at B = 1).
enum class PersistentFrom {
  kBeyondOneWave,  ///< more items than one wave of resident CTAs
  kAnyCount,       ///< every launch that can
};

/// CTAs of a persistent launch over `items` work items (its kernel holds `ctas_per_sm` resident
/// CTAs per SM), or 0 when the one-CTA-per-item kernel runs instead: mode kNever, `possible`
/// false (layout or shape), a device before sm_90, or kAuto below `from`. A pure rule.
constexpr int64_t persistent_grid(int64_t items, int ctas_per_sm, const DeviceCaps& caps,
                                  const LaunchOverrides& o, bool possible, PersistentFrom from) {
  if (o.persistent == PersistentMode::kNever || !possible || items <= 0 || caps.sm_major < 9) {
    return 0;
  }
  int64_t resident = int64_t{ctas_per_sm} * caps.sms;
  if (o.persistent == PersistentMode::kAuto && from == PersistentFrom::kBeyondOneWave &&
      items <= resident) {
    return 0;  // one wave: the per-item kernel
  }
  if (o.persistent_max_ctas > 0 && resident > o.persistent_max_ctas) {
    resident = o.persistent_max_ctas;
  }
  return resident <= 0 ? 0 : (items < resident ? items : resident);
}

/// The longest draft at which a deferred verify that folds before its PDL wait
/// (VerifyParams::fold_before_wait) in a one-CTA-per-SM form lets its dependents launch at its
/// entry (TileArgs::trigger_at_entry) rather than after the wait: the next layer's CTAs then
/// take the SMs this launch leaves free and fold there while the kernels before it finish.
/// Grids of at most kEntryTriggerSmallGridCtas CTAs, which leave room for almost two more
/// layers' CTAs, do so up to T = kEntryTriggerSmallGridMaxT. The two-per-SM forms never do: the
/// next layer's CTAs would share this one's SMs.
/// Measured: faster where it applies, slower past these bounds.
inline constexpr int kEntryTriggerMaxT = 2;
inline constexpr int kEntryTriggerSmallGridMaxT = 4;
inline constexpr int64_t kEntryTriggerSmallGridCtas = 48;
constexpr bool deferred_triggers_at_entry(int T, bool one_cta_per_sm, int64_t ctas) {
  const int max_t =
      ctas <= kEntryTriggerSmallGridCtas ? kEntryTriggerSmallGridMaxT : kEntryTriggerMaxT;
  return one_cta_per_sm && T >= 1 && T <= max_t;
}

/// The __launch_bounds__ minimum of resident CTAs per SM of a per-item verify tile: 2 (128
/// registers per thread), but 1 (up to 255) for the one-CTA-per-SM ("wide") tiles, except the
/// deferred wide BV = 32 tile. The deferred BV = 32 tile keeps the second slot for the next
/// kernel: its CTA becomes resident under PDL and folds its pending steps before
/// griddepcontrol.wait while this one finishes, which up to 255 registers lose at 96-128 CTAs
/// (the next layer's folds wait for free SMs); the eager BV = 32 tile gains from 255 registers in
/// the round, its next CTA having little to do before its wait. At 128 registers the BV = 16 and
/// 64 tiles proved slower (measured). TileConfig::kMinCtasPerSm and the plan read it here.
KDA_HD constexpr int tile_min_ctas_per_sm(int BV, bool wide, bool deferred) {
  return !wide || (BV == 32 && deferred) ? 2 : 1;
}

/// The rule behind the per-item tiles' one-CTA-per-SM form on a device of `sms` SMs: under kAuto,
/// where the launch gains from it (`grouped`: ring mode, extend, or the fused BV = 128 tile in
/// any mode) and the grid has at most `max_waves` CTAs per SM (kWideFusedMaxWaves for the fused
/// BV = 128 tile, 1 otherwise), also ahead of the BV = 128 persistent kernel. A pure rule
/// (kernels::default_block_v's BV = 128 window below 192 CTAs relies on it).
constexpr bool one_cta_per_sm_tiles_on(int64_t ctas, bool grouped, int sms, TileOccupancy mode,
                                       int max_waves = 1) {
  return mode == TileOccupancy::kOnePerSm ||
         (mode == TileOccupancy::kAuto && grouped && ctas <= int64_t{max_waves} * sms);
}

}  // namespace kda::kernels
