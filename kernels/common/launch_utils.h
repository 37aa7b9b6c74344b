// launch_utils.h: small host-side helpers shared by the launchers (plain C++).
#pragma once

#include <cstdint>

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

/// Programmatic dependent launch on/off for every launcher (default on; it is a no-op
/// before sm_90). Tests switch it off to compare schedules; a launch on another thread sees
/// the old or the new setting.
bool pdl_enabled();
void set_pdl_enabled(bool on);

}  // namespace kda::kernels

namespace kda::kernels {

/// When the large-tile kernels (verify BV = 128, fold) run as persistent CTAs that stream
/// state tiles through shared memory (state_stream.cuh) instead of one CTA per work item.
/// kAuto: as the launch's StreamFrom says (below). Both schedules give the same bits; tests force
/// each to prove it, and cap the persistent grid at `max_ctas` (> 0) so that every CTA walks many
/// items. A launch on another thread sees the old or the new setting.
enum class StateStreamMode { kAuto, kAlways, kNever };
StateStreamMode state_stream_mode();
void set_state_stream_mode(StateStreamMode mode, int max_ctas = 0);

/// Under StateStreamMode::kAuto: from how many items a streamable launch takes the persistent
/// kernel, chosen per kernel family: within one wave the per-item kernel is faster for the
/// unfused recurrence, while the fused verify streams faster at T = 8 and breaks even at
/// T = 4. The fold streams beyond one wave (an all-layer fold of a 20-layer model exceeds one
/// wave already at B = 1).
enum class StreamFrom {
  kBeyondOneWave,  ///< more items than one wave of resident CTAs
  kAnyCount,       ///< every streamable launch
};

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

/// Multiprocessors of the current device (cached per device; a host-only call, legal during
/// stream capture).
int device_sm_count();

/// The per-item verify tiles come in two register budgets: two CTAs per SM (128 registers per
/// thread) and one (up to 255, ring-mode steps grouped: faster at small B). kAuto: one per SM
/// when the launch gains from it (`grouped`: ring mode, extend, or the fused BV = 128 tile in
/// any mode)
/// and the grid has at most `max_waves` CTAs per SM (the launcher passes kWideFusedMaxWaves
/// for the fused BV = 128 tile, 1 otherwise), also ahead of the BV = 128 streaming kernel;
/// tests force each form (both give the same bits). A launch on another thread sees the old
/// or the new setting.
enum class TileOccupancy { kAuto, kTwoPerSm, kOnePerSm };
TileOccupancy tile_occupancy_mode();
void set_tile_occupancy_mode(TileOccupancy mode);
/// The rule behind one_cta_per_sm_tiles on a device of `sms` SMs (a host-side pure function;
/// kernels::default_block_v's BV = 128 window below 192 CTAs relies on it).
constexpr bool one_cta_per_sm_tiles_on(int64_t ctas, bool grouped, int sms, TileOccupancy mode,
                                       int max_waves = 1) {
  return mode == TileOccupancy::kOnePerSm ||
         (mode == TileOccupancy::kAuto && grouped && ctas <= int64_t{max_waves} * sms);
}
/// Whether a per-item verify grid of `ctas` CTAs takes the one-CTA-per-SM form on the current
/// device, under tile_occupancy_mode().
bool one_cta_per_sm_tiles(int64_t ctas, bool grouped, int max_waves = 1);
/// The same for a snapshot-mode fused grid below BV = 128: under kAuto where
/// one_per_sm_fills_waves_better on the current device; the forced modes as above.
bool one_cta_per_sm_by_wave_fill(int64_t ctas);

/// Grid size for a persistent streaming launch of `kernel` (`threads` per CTA, `smem_bytes`
/// dynamic shared memory) over `items` work items on the current device, or 0 when the
/// one-CTA-per-item kernel should run instead (mode kNever, pre-sm_90 device, `streamable`
/// false, or kAuto below `from`). The first call per kernel and device raises the kernel's
/// dynamic shared-memory limit and caches its occupancy (host-only calls, legal during
/// stream capture).
int state_stream_grid(const void* kernel, int threads, size_t smem_bytes, int64_t items,
                      bool streamable, StreamFrom from);

}  // namespace kda::kernels
