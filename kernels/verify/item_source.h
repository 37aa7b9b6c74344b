// item_schedule.h: the named schedules of a verify work item (CUTLASS's kernel-schedule style):
// which kernel runs the item, where its state tile and inputs come from, and which step loop
// runs the recurrence. VerifyItem::run and its phases branch on these predicates only; a
// source (GlobalSource, StagedSource) names its schedule as `kSchedule`.
// Plain C++ (constexpr): host code and tests may name schedules too.
#pragma once

#include "core/platform_macros.h"
#include "kernels/params/kda_params.h"

namespace kda::kernels {

enum class ItemSchedule {
  /// verify_tile_kernel: state tile and inputs from global memory into registers; the call's
  /// record mode; any T (chunks of TileConfig::kChunk tokens).
  kPerItem,
  /// verify_tile_kernel: as kPerItem, but the state tile arrives by one bulk copy into shared
  /// memory and reaches registers after the prologue (ItemStateStage::kUsed tiles).
  kPerItemStagedState,
  /// verify_stream_kernel in ring mode: persistent CTAs, state tile and inputs staged in shared
  /// memory by the previous item, one chunk (T <= kChunk), swizzled columns and reduce-scatter
  /// trees; no snapshot code.
  kStreamRing,
  /// verify_stream_kernel in snapshot mode: as kStreamRing with all-reduce trees and no ring
  /// code.
  kStreamSnapshot,
};

/// The item's inputs and state tile are staged by the persistent streaming kernel.
KDA_HD constexpr bool is_streamed(ItemSchedule s) {
  return s == ItemSchedule::kStreamRing || s == ItemSchedule::kStreamSnapshot;
}
/// The per-item kernel's bulk-copied state tile.
KDA_HD constexpr bool stages_state(ItemSchedule s) {
  return s == ItemSchedule::kPerItemStagedState;
}
/// The ring streaming kernel's forms: swizzled columns, reduce-scatter trees, warp-0 refill.
KDA_HD constexpr bool is_ring_stream(ItemSchedule s) { return s == ItemSchedule::kStreamRing; }
/// The record mode an item of schedule `s` runs: fixed by the streaming schedules, else the
/// call's.
KDA_HD constexpr RecordMode record_mode_of(ItemSchedule s, RecordMode call) {
  return s == ItemSchedule::kStreamRing       ? RecordMode::kRing
         : s == ItemSchedule::kStreamSnapshot ? RecordMode::kSnapshot
                                              : call;
}

}  // namespace kda::kernels
