// item_args.h: the verify / extend tile kernels' launch argument and a work item's coordinates
// (plain C++: host launchers fill them, kernels read them).
#pragma once

#include <cstdint>

#include "kernels/common/fast_divisor.h"
#include "kernels/params/kda_params.h"

namespace kda::kernels {

/// The launch's divisors (set by launch_verify_tile): item index -> coordinates and v-head ->
/// k-head without a runtime division in the kernels (fast_divisor.h).
struct ItemDivisors {
  FastDivisor tiles;  ///< ceil(V / BV): V tiles per v-head
  FastDivisor heads;  ///< HV
  FastDivisor group;  ///< HV / H: v-heads per k-head
};

/// The divisors of a launch of `p` with V tile `block_v` (host).
inline ItemDivisors item_divisors(const VerifyParams& p, int block_v) {
  return {FastDivisor(static_cast<uint32_t>((p.V + block_v - 1) / block_v)),
          FastDivisor(static_cast<uint32_t>(p.HV)), FastDivisor(static_cast<uint32_t>(p.HV / p.H))};
}

/// Kernel argument: the layer's params (an extend's verify_view) plus what extend adds. The
/// fields keep the parameter layout the kernels were tuned with: the small-B tiles read `extend`
/// and `div` before their PDL wait, on their critical path.
struct TileArgs {
  VerifyParams p;
  float* ssm_out;    ///< extend only: ExtendOutputs::ssm_state_out, [S, HV, V, K] final state
  int32_t extend;    ///< 1: extend (no records, final state to ssm_out); 0: verify
  ItemDivisors div;  ///< callers leave it default: launch_verify sets it
  /// Set by launch_verify from the plan (a caller's value is ignored): a deferred verify with
  /// VerifyParams::fold_before_wait where deferred_triggers_at_entry lets its dependents launch
  /// at its entry, before its pending fold and PDL wait.
  int32_t trigger_at_entry = 0;
  /// Extend only: ExtendOutputs' prefix-cache tracks (null: none): request n with
  /// track_steps[n] = k >= 0 stores its state after token k to ssm_out[track_slots[n]].
  const int32_t* track_slots = nullptr;
  const int32_t* track_steps = nullptr;
  /// Set by launch_verify_fast from the plan (VerifyPlan::stagger_tiles; a caller's value is
  /// ignored): 1 = the fast per-item CTAs of odd parity stage their state tile late (a lazy
  /// call's kernels ignore it).
  int32_t stagger_tiles = 0;
};

/// Where a work item sits: request n, v-head hv (of k-head h), V tile.
struct ItemCoords {
  int n, hv, h, tile;
};

}  // namespace kda::kernels
