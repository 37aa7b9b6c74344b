// tile_layout.cuh: the thread layout, occupancy and shared memory of a 256-thread state tile
// (TileConfig, TileSmem), shared by the verify items (verify_item.cuh) and the fold
// (fold.cu), and the column loads of a tile's state (load_state_columns).
// Recurrence layout: thread tid = group*P + c owns columns v0 + group*CPT + j (j < CPT) of the
//   state tile; lanes c split K as in delta_rule.cuh (P = 8 lanes per column for BV >= 32,
//   else 256/BV; CPT = BV*P/256 columns per thread; the one-per-SM BV = 16 tile: P = 8 on
//   threads 128-255, tid - 128 in place of tid; the one-per-SM BV = 32 tile: lane = c*4 + the
//   group's index in its warp, TileConfig::kLaneStride).
// Nothing here reads or writes global memory except load_state_columns (reads only).
#pragma once

#include <cstdint>

#include "kernels/common/delta_rule.cuh"
#include "kernels/common/launch_utils.h"

namespace kda::kernels {

/// A tile's thread layout. kWide_: the one-CTA-per-SM form of the per-item kernel (wide
/// registers: see kMinCtasPerSm). kDeferred_: the deferred-commit instantiation (item_fold.cuh),
/// which differs only in kMinCtasPerSm. The state tile is held by the last kStepThreads threads, P
/// lanes per column and CPT columns each (delta_rule.cuh); the threads before kFirstStepThread
/// hold no columns and skip the steps. Every tile uses all 256 threads, except the wide BV = 16
/// tile: P = 8 lanes per column on warps 4-7 (one warp per scheduler, 16 values per thread),
/// which beats all eight warps at P = 16 (one cross-lane tree level more per dot). Warps 4-7 are
/// the warps without a channel pair (and the last conv warp): their tile loads go out during
/// the conv. P = 4 and the BV = 64 tile on four warps proved slower. The wide BV = 32 tile on
/// warps 4-7 (two columns per thread) spills at its 128-register cap and proved slower there.
template <int K_, int BV_, bool kWide_ = false, bool kDeferred_ = false>
struct TileConfig {
  static constexpr int K = K_;
  static constexpr int BV = BV_;
  static constexpr int kThreads = 256;
  static constexpr int kWarps = kThreads / 32;
  /// The kernel's __launch_bounds__ minimum of resident CTAs per SM (launch_utils.h
  /// tile_min_ctas_per_sm). The plan runs a wide tile only on grids of at most one CTA per SM (or
  /// a few waves at BV = 128).
  static constexpr int kMinCtasPerSm = tile_min_ctas_per_sm(BV, kWide_, kDeferred_);
  static constexpr bool kHalfStepThreads = kWide_ && BV == 16;
  static constexpr int kStepThreads = kHalfStepThreads ? kThreads / 2 : kThreads;
  static constexpr int kFirstStepThread = kThreads - kStepThreads;
  static constexpr int P = BV >= 32 || kHalfStepThreads ? 8 : kThreads / BV;  ///< lanes per column
  static constexpr int CPT = BV * P / kStepThreads;  ///< columns per thread
  /// Lane distance of a column's P lanes (ColumnSlice): 1 (thread step_tid = group * P + c),
  /// except in the wide BV = 32 tile: 32 / P, lane = c * (32 / P) + the group's index in its warp.
  /// There lanes n and n ^ 1 read the same K slice of kn / decay / qs, and a warp's 128-bit
  /// shared loads take half the requests (each of its threads holds one column, so every step
  /// loads its 48 values per column from shared memory); it pays there, most at K = 128.
  /// Elsewhere it proved slower or no faster: the one-per-SM BV = 64 / 128 tiles (2 / 4 columns
  /// per thread share each load), the two-per-SM BV = 32 / 64 tiles, the one-per-SM BV = 16 tile.
  static constexpr int kLaneStride = kWide_ && BV == 32 ? 32 / P : 1;
  static constexpr int kChunk = 8;                 ///< tokens per prologue chunk
  static constexpr int kPairs = (2 * K + BV) / 2;  ///< channel pairs per CTA
  using Slice = ColumnSlice<K, P, CPT, kLaneStride>;
  static_assert(BV >= 8 && BV <= 128 && BV % 2 == 0, "BV must be even, in [8, 128]");
  static_assert(kPairs <= kThreads, "one channel pair per thread");
  static_assert(kStepThreads / P * CPT == BV, "the step threads cover the tile");
  static_assert(kStepThreads % 32 == 0, "whole warps hold the tile");
};

/// Shared memory of one CTA (static, < 48 KiB).
template <typename Cfg>
struct TileSmem {
  float qk[Cfg::kChunk][2][Cfg::K];  ///< [t][0] = q -> qs, [t][1] = k -> kn
  float decay[Cfg::kChunk][Cfg::K];  ///< EXP(g)
  float v[Cfg::kChunk][Cfg::BV];     ///< bf16-valued v of this tile
  float beta[Cfg::kChunk];
};
/// Zeros one column slice (columns past V).
template <typename Slice>
__device__ __forceinline__ void zero_column(ColRegs<Slice>& dst) {
#pragma unroll
  for (int i = 0; i < Slice::NPT; ++i) {
#pragma unroll
    for (int e = 0; e < Slice::E; ++e) {
      dst[i][e] = 0.0f;
    }
  }
}

/// State columns col0 + j (j < CPT) of a head's [V][K] f32 state at `head` (global or shared
/// memory), zeros where !ok[j].
template <typename Slice>
__device__ __forceinline__ void load_state_columns(ColRegs<Slice> (&S)[Slice::CPT],
                                                   const bool (&ok)[Slice::CPT], const float* head,
                                                   int col0, int c) {
#pragma unroll
  for (int j = 0; j < Slice::CPT; ++j) {
    if (ok[j]) {
      load_column<Slice>(S[j], head + static_cast<int64_t>(col0 + j) * Slice::K, c);
    } else {
      zero_column<Slice>(S[j]);
    }
  }
}

}  // namespace kda::kernels
