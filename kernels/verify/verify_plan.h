// verify_plan.h: plan once, launch what the plan says. plan_verify is the one place that decides,
// for one verify (or extend) call, which kernel instantiation runs its work items and how: the
// schedule (one CTA per item two per SM, one per SM, or persistent), the feature set, the grid and
// the entry trigger. Its inputs: the call's params, the path and tile the dispatcher chose
// (dispatch/verify_dispatch.h; the tile rules are tile_policy.h's), the device's caps and the
// launch overrides. The launchers (verify_launch.cuh) launch the plan and decide nothing.
// Plain C++ (pure functions): the dispatcher, the bench and host tests evaluate plans without a
// device; kernels::plan_verify_on_device (kda_kernels.h) fills the caps from the current device.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/common/launch_utils.h"
#include "kernels/params/kda_params.h"
#include "kernels/verify/verify_traits.h"

namespace kda::kernels {

/// The fused tile of extend calls, and of every tracked extend (their instantiations).
inline constexpr int kExtendBlockV = 32;
/// The unfused recurrence reads qkv_act: no conv, so one weight type and one tile serve all.
inline constexpr int kRecurrentBlockV = 128;

/// What one verify or extend call launches.
struct VerifyPlan {
  VerifyPath path = VerifyPath::kUnfused;
  bool extend = false;  ///< an extend call (ExtendParams): no records, the state committed
  /// The instantiation: conv weight type (the unfused recurrence reads none: f32), K, V tile.
  ConvWeightType weight = ConvWeightType::kF32;
  int K = 0;
  int block_v = 0;
  VerifySchedule schedule = VerifySchedule::kPerItem;
  VerifyFeatures features = kNoFeatures;
  /// The numerics that run (contract §10): kFast only with schedule kFastChunk.
  VerifyNumerics numerics = VerifyNumerics::kExact;
  /// A u-free deferred call (ring_pending given, VerifyParams::u_free: no u records to replay in
  /// the kernel): the fold kernel folds the pending steps into the committed state first (§3's
  /// eager arithmetic, computing u), then the planned kernel runs as a call without pending steps
  /// (its kDeferredFold instantiation still writes the records at the slot's cursor). The launcher
  /// strips ring_pending and ssm_fold_out. Not on a fast-output plan with a CTA per item, whose
  /// kernel folds them itself with the same arithmetic (fast_item.cuh), unless
  /// LaunchOverrides::fast_fold_in_kernel is off.
  bool pending_fold_first = false;
  /// A deferred one-CTA-per-SM verify that lets its dependents launch at its entry
  /// (deferred_triggers_at_entry).
  bool entry_trigger = false;
  /// A fast-output call with a CTA per item beyond one wave (schedule kFastChunk, grid == items >
  /// kFastCtasPerSm x SMs), not lazy: its odd-parity CTAs stage their state tile after their
  /// first chunk's gates (fast_item.cuh), so the CTAs that share an SM and its memory pipe are out
  /// of step. Never on a walking, lazy or exact plan (invoke_verify refuses one: the lazy kernels
  /// are compiled without the late tile, which would make their BV = 128 form spill); the bits
  /// are the same. Nor on a plan whose fast kernel folds pending steps (compiled without the late
  /// tile: its fold follows the prologue, which the early tile lands under).
  bool stagger_tiles = false;
  bool pdl = true;  ///< programmatic dependent launch (LaunchOverrides::pdl)
  /// The host kernel set runs its reference whatever the plan says (kernel() names it).
  bool host_reference = false;
  int64_t items = 0;  ///< work items: ceil(V / block_v) * HV * B
  int64_t grid = 0;   ///< CTAs launched: `items`, or the persistent grid

  /// The kernel that runs, e.g. "verify_tile<f32 K=128 BV=32 fused per-item-wide deferred>";
  /// the unfused path names its recurrence kernel after "conv_update + "; "host reference (fused)"
  /// on the host kernel set.
  std::string kernel() const;
  bool operator==(const VerifyPlan& o) const;
  bool operator!=(const VerifyPlan& o) const { return !(*this == o); }
};

const char* verify_schedule_name(VerifySchedule s) noexcept;

/// The call's feature set: kDeferredFold with ring_pending (records at the slot's cursor; the
/// pending steps folded in the kernel from u records; without them in the fast kernel, or first
/// by the fold kernel, VerifyPlan::pending_fold_first), kRaggedRows with token_offsets or
/// parents; a tracked extend (ExtendParams::track_steps) runs its own instantiations, which fold
/// nothing and take dense rows: kExtendTracks alone.
VerifyFeatures verify_features(const VerifyParams& p, bool tracked_extend = false);

/// Whether a verify call on `path` with tile `block_v` can take the fast outputs (contract §10:
/// VerifySchedule::kFastChunk): p.numerics == kFast, the fused path, ring mode, a dense or ragged
/// chain (no parents), no deferred call with u records (exact per-step u, which the chunked form
/// does not compute; a u-free one's pending steps are folded computing u), T <= 16 and a fast tile
/// (tile_policy.h kFastBlockVs).
bool fast_outputs_plannable(const VerifyParams& p, VerifyPath path, int block_v);

/// A lazy verify (contract §11, is_lazy_verify) runs the fast outputs or not at all (its pending
/// steps exist only as the fast chunk's history): kda::Error naming `who` unless `plan`, the plan
/// of `p`, runs them (the fused path, a fast tile, a chain of T <= kFastMaxTokens, numerics
/// kFast).
void check_lazy_plan(const VerifyParams& p, const VerifyPlan& plan, const char* who);

/// Whether a verify call's layout lets its BV = 128 tile run persistent: T within one token chunk,
/// the state tile one 16-byte-aligned bulk copy per item, and every input piece 16 bytes aligned
/// (fused: mixed_qkv, conv_state, a; unfused: qkv_act, a), the folded tile of a deferred call a
/// 16-byte-aligned bulk store.
bool persistent_layout_ok(const VerifyParams& p, VerifyPath path);

/// Whether a fast-output call can walk its items (fast_walk.cuh) beyond one wave: not a lazy call
/// (its chunk's history does not fit the walk's staged inputs) and persistent_layout_ok on the
/// fused path (T within one token chunk, the inputs copyable in 16-byte pieces).
bool fast_walk_possible(const VerifyParams& p);

/// The plan of a verify call (`extend`: an extend call; `tracked_extend`: with tracks) on `path`
/// with tile `block_v` (fused; the unfused path runs kRecurrentBlockV), on a device of `caps`.
/// `persistent_ctas_per_sm`: resident CTAs per SM of the persistent kernel this call would take
/// (its occupancy; ignored unless the call can take one). Expects params that pass the entry
/// points' checks. Pure: never throws, touches no device.
VerifyPlan plan_verify(const VerifyParams& p, VerifyPath path, int block_v, const DeviceCaps& caps,
                       const LaunchOverrides& overrides, int persistent_ctas_per_sm,
                       bool extend = false, bool tracked_extend = false);

}  // namespace kda::kernels
