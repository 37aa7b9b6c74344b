// item_source.h: where a verify work item's state tile and inputs come from, named: the per-item
// kernel reads them from global memory (GlobalSource, per_item.cuh), the persistent kernel from
// shared-memory stages the previous item filled (StagedSource, persistent.cuh). VerifyItem::run
// and its phases branch on these predicates only; a source names itself as `kSource`.
// Plain C++ (constexpr).
#pragma once

#include "core/platform_macros.h"
#include "kernels/params/kda_params.h"

namespace kda::kernels {

enum class ItemSource {
  /// verify_tile_kernel: state tile and inputs from global memory into registers; the call's
  /// record mode; any T (chunks of TileConfig::kChunk tokens).
  kGlobal,
  /// verify_tile_kernel: as kGlobal, but the state tile arrives by one bulk copy into shared
  /// memory and reaches registers after the prologue (ItemStateStage::kUsed tiles).
  kGlobalStagedState,
  /// verify_persistent_kernel in ring mode: state tile and inputs staged in shared memory by the
  /// previous item, one chunk (T <= kChunk), swizzled columns and reduce-scatter trees; no
  /// snapshot code.
  kPersistentRing,
  /// verify_persistent_kernel in snapshot mode: as kPersistentRing with all-reduce trees and no
  /// ring code.
  kPersistentSnapshot,
};

/// The item's inputs and state tile are staged by the persistent kernel.
KDA_HD constexpr bool is_staged(ItemSource s) {
  return s == ItemSource::kPersistentRing || s == ItemSource::kPersistentSnapshot;
}
/// The per-item kernel's bulk-copied state tile.
KDA_HD constexpr bool stages_state(ItemSource s) { return s == ItemSource::kGlobalStagedState; }
/// The persistent ring kernel's forms: swizzled columns, reduce-scatter trees, warp-0 refill.
KDA_HD constexpr bool is_persistent_ring(ItemSource s) { return s == ItemSource::kPersistentRing; }
/// The record mode an item of source `s` runs: fixed by the persistent sources, else the call's.
KDA_HD constexpr RecordMode record_mode_of(ItemSource s, RecordMode call) {
  return s == ItemSource::kPersistentRing       ? RecordMode::kRing
         : s == ItemSource::kPersistentSnapshot ? RecordMode::kSnapshot
                                                : call;
}

}  // namespace kda::kernels
