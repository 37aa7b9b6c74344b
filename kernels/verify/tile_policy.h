// tile_policy.h: which fused V tile (BV) a verify call runs, and the wave-fill rules the
// launchers and the tile choice share (plain C++, constexpr: host code, the dispatcher and
// dispatch_test evaluate them without a device).
//
// KDA_FUSED_BLOCK_VS is the one list of fused tiles: it feeds the dispatch switch
// (invoke.cu), the instantiation files (kernels/inst/), kFusedBlockVs (error messages, flag
// help, the bench's sweep) and is_fused_block_v. A tile is added here and nowhere else.
// The rules come from kda_bench measurements on 132-SM cards; docs/perf_log.md records them and
// how they were found.
#pragma once

#include <cstdint>
#include <iterator>
#include <utility>

#include "kernels/common/launch_utils.h"
#include "kernels/params/kda_params.h"

/// X(BV) for every fused V tile, narrowest first.
#define KDA_FUSED_BLOCK_VS(X) X(8) X(16) X(32) X(64) X(128)

namespace kda::kernels {

#define KDA_TILE_POLICY_LIST_ITEM(bv) bv,
/// Fused-kernel V tiles the dispatcher may pick (--kda-verify-block-v), narrowest first.
constexpr int kFusedBlockVs[] = {KDA_FUSED_BLOCK_VS(KDA_TILE_POLICY_LIST_ITEM)};
#undef KDA_TILE_POLICY_LIST_ITEM
#define KDA_TILE_POLICY_SEQ_ITEM(bv) , bv
/// The same list as a type, for compile-time dispatch (invoke.cu).
using FusedBlockVSeq = std::integer_sequence<int KDA_FUSED_BLOCK_VS(KDA_TILE_POLICY_SEQ_ITEM)>;
#undef KDA_TILE_POLICY_SEQ_ITEM

/// True if `block_v` is one of kFusedBlockVs.
constexpr bool is_fused_block_v(int block_v) noexcept {
  for (const int bv : kFusedBlockVs) {
    if (bv == block_v) {
      return true;
    }
  }
  return false;
}

/// The tile when nothing else is known (the best single tile over B = 1..64).
constexpr int kDefaultFusedBlockV = 64;

/// The narrowest fused tile that holds a v-head's V columns (128 for V > 128): the widest worth
/// running, since a wider one computes the same item with idle columns.
constexpr int head_block_v(int V) {
  for (const int bv : kFusedBlockVs) {
    if (bv >= V) {
      return bv;
    }
  }
  return kFusedBlockVs[std::size(kFusedBlockVs) - 1];
}

/// CTAs of a fused verify grid: B requests x HV v-heads x ceil(V / BV) tiles.
constexpr long long fused_grid_ctas(int B, int HV, int V, int bv) {
  return static_cast<long long>(B) * HV * ((V + bv - 1) / bv);
}

/// Waves of CTAs up to which a fused BV = 128 grid runs its per-item tiles one CTA per SM ahead
/// of the persistent kernel's two per SM: a wide CTA finishes its item in about half the time of
/// a persistent pair, so it wins while the persistent grid's items per CTA round up badly.
constexpr int kWideFusedMaxWaves = 3;
/// Waves of CTAs (one per SM) up to which snapshot mode's default tile stays BV = 128: beyond
/// them the BV = 64 per-item tiles two per SM are faster in snapshot mode.
constexpr int kSnapshotWideMaxWaves = 6;

/// Thousandths of the SM slots that a grid of `ctas` equal CTAs, `per_sm` resident per SM,
/// keeps busy over the waves it takes: ctas / (ceil(ctas / slots) * slots).
constexpr int64_t wave_fill_permille(int64_t ctas, int sms, int per_sm) {
  const int64_t slots = int64_t{sms} * per_sm;
  return slots > 0 && ctas > 0 ? ctas * 1000 / (ceil_div(ctas, slots) * slots) : 0;
}

/// Snapshot mode's fused tiles below BV = 128 step one token at a time (no grouped steps to gain
/// from 255 registers): one CTA per SM pays only where it fills the grid's waves better. True
/// for a grid beyond one wave of two CTAs per SM whose one-per-SM waves are at least 100 per
/// mille fuller (at equal fills two per SM is faster).
constexpr bool one_per_sm_fills_waves_better(int64_t ctas, int sms) {
  return sms > 0 && ctas > 2 * int64_t{sms} &&
         wave_fill_permille(ctas, sms, 1) >= wave_fill_permille(ctas, sms, 2) + 100;
}

/// Draft tokens up to which a ring-mode BV = 32 tile takes a grid of 48..95 CTAs one per SM:
/// half as many prologues (q/k conv and norms per tile) pay for steps over twice the columns per
/// CTA only while the steps are few.
inline constexpr int kNarrowBv32MaxT = 4;

/// The default fused tile (ring mode) for a call of B requests of T tokens, HV v-heads of V
/// columns. `one_per_sm_ctas`: the largest grid the launcher runs one CTA per SM (ring mode:
/// the device's SM count; 0 in snapshot mode or when the device is unknown; launch_utils.h
/// TileOccupancy). T = 0: unknown (as T > kNarrowBv32MaxT).
/// - The head tile (head_block_v: BV = 128 at V = 128) from 192 CTAs, or with
///   96..one_per_sm_ctas CTAs (one CTA per SM up to kWideFusedMaxWaves waves, beyond them
///   persistent, two per SM). Without one-per-SM CTAs it is BV = 64 below 192 CTAs.
/// - Else the widest tile up to BV = 64 whose grid has >= 96 CTAs, or >= 48 CTAs that run one
///   per SM for BV = 16 (and BV = 32 with T <= kNarrowBv32MaxT); else BV = 8 where its grid
///   runs one per SM, BV = 16 otherwise.
/// Narrow tiles buy CTAs for small calls; wide tiles avoid recomputing the q/k conv per tile.
constexpr int default_block_v(int B, int HV, int V, int one_per_sm_ctas = 0, int T = 0) {
  const int head = head_block_v(V);
  const long long head_ctas = fused_grid_ctas(B, HV, V, head);
  if (head_ctas >= 192 || (head_ctas >= 96 && head_ctas <= one_per_sm_ctas)) {
    return head;
  }
  const bool short_chunk = T >= 1 && T <= kNarrowBv32MaxT;
  for (int bv = head < 64 ? head : 64; bv >= 16; bv /= 2) {
    const long long ctas = fused_grid_ctas(B, HV, V, bv);
    const bool narrow_floor = ctas <= one_per_sm_ctas && (bv == 16 || (bv == 32 && short_chunk));
    if (ctas >= (narrow_floor ? 48 : 96)) {
      return bv;
    }
  }
  const int narrow = fused_grid_ctas(B, HV, V, 8) <= one_per_sm_ctas ? 8 : 16;
  return narrow < head ? narrow : head;
}

/// The fewest CTAs a deferred-commit verify's auto tile runs with (default_deferred_block_v).
inline constexpr int kDeferredMinCtas = 48;

/// A deferred verify at T <= kDeferredSplitMaxT whose BV = 128 head tile runs
/// kDeferredSplitMinCtas to two waves of one-CTA-per-SM CTAs splits it into BV = 64, two per
/// SM: its folds and short step chains gain from twice the CTAs.
/// Measured: faster at every row it changes, slower at T = 4.
inline constexpr int kDeferredSplitMaxT = 3;
inline constexpr int kDeferredSplitMinCtas = 128;

/// The default fused tile of a ring-mode verify with the deferred commit (contract §7: each item
/// first folds its slot's pending steps). Every CTA repeats the fold's fixed work (the pending
/// records' loads, key norms and EXP(g)) whatever its width, and a grid that leaves SMs free
/// lets the next layer's CTAs fold there before their PDL wait, so small grids go wider than
/// default_block_v: where the head tile's grid is below 96 CTAs, the widest of the head tile,
/// BV = 64 and BV = 32 whose grid has kDeferredMinCtas..one_per_sm_ctas CTAs (one CTA per SM); a
/// BV = 64 below the head tile only up to T = kNarrowBv32MaxT (beyond, or T unknown, its steps
/// over twice the columns cost more than the fold it saves, and default_block_v's BV = 32
/// stands). From 2 * kDeferredMinCtas head-tile CTAs default_block_v, but for the split above.
/// Without a device, default_block_v.
/// Measured: the deferred round faster at every row it changes.
constexpr int default_deferred_block_v(int B, int HV, int V, int one_per_sm_ctas, int T) {
  const int head = head_block_v(V);
  if (one_per_sm_ctas <= 0) {
    return default_block_v(B, HV, V, one_per_sm_ctas, T);
  }
  const long long head_ctas = fused_grid_ctas(B, HV, V, head);
  if (head_ctas >= 2 * kDeferredMinCtas) {
    const bool split = head == 128 && T >= 1 && T <= kDeferredSplitMaxT &&
                       head_ctas >= kDeferredSplitMinCtas && head_ctas <= 2LL * one_per_sm_ctas;
    return split ? 64 : default_block_v(B, HV, V, one_per_sm_ctas, T);
  }
  const bool short_chunk = T >= 1 && T <= kNarrowBv32MaxT;
  for (int bv = head; bv >= 32; bv /= 2) {
    const long long ctas = fused_grid_ctas(B, HV, V, bv);
    if (ctas >= kDeferredMinCtas && ctas <= one_per_sm_ctas &&
        (bv == head || bv < 64 || short_chunk)) {
      return bv;
    }
    if (ctas >= kDeferredMinCtas) {
      break;  // BV = 64 at T > kNarrowBv32MaxT: default_block_v's BV = 32 (>= 96 CTAs)
    }
  }
  return default_block_v(B, HV, V, one_per_sm_ctas, T);
}

/// Snapshot mode's default tile on a device of `sms` SMs (0: unknown, default_block_v's rule).
/// default_block_v's BV = 128 becomes BV = 64 where the launcher's BV = 64 grid fills its waves
/// at least 100 per mille better (wave_fill_permille; BV = 64 one CTA per SM where
/// one_per_sm_fills_waves_better), and beyond kSnapshotWideMaxWaves waves of BV = 128 CTAs.
constexpr int default_snapshot_block_v(int B, int HV, int V, int sms) {
  const int bv = default_block_v(B, HV, V);
  if (sms <= 0 || bv != 128) {
    return bv;
  }
  const long long wide = fused_grid_ctas(B, HV, V, 128);
  const long long narrow = fused_grid_ctas(B, HV, V, 64);
  if (wide > static_cast<long long>(kSnapshotWideMaxWaves) * sms) {
    return 64;
  }
  if (wide <= static_cast<long long>(kWideFusedMaxWaves) * sms) {  // BV = 128 one per SM
    const int per_sm = one_per_sm_fills_waves_better(narrow, sms) ? 1 : 2;
    if (wave_fill_permille(narrow, sms, per_sm) >= wave_fill_permille(wide, sms, 1) + 100) {
      return 64;
    }
  }
  return 128;
}

/// The V tiles of the fast-output kernel (contract §10, VerifySchedule::kFastChunk): whole
/// 8-column mma tiles on up to 8 warps. Its outputs are bitwise the same at each of them.
inline constexpr int kFastBlockVs[] = {32, 64, 128};
/// Resident CTAs per SM of the fast-output kernel (__launch_bounds__(256, 2), FastSmem of a
/// 16-token call within half an SM's shared memory): its grid beyond one wave.
inline constexpr int kFastCtasPerSm = 2;
/// Most tokens of one fast-output chunk (two 8-token mma row tiles).
inline constexpr int kFastMaxTokens = kFastMaxChunk;
constexpr bool is_fast_block_v(int block_v) noexcept {
  return block_v == 32 || block_v == 64 || block_v == 128;
}

/// The default tile of a fast-output verify (two CTAs per SM): the widest of the head tile, 64
/// and 32 whose grid gives every SM a CTA (`sms`; 0: unknown, taken as 132), else BV = 32.
/// Every tile repeats the item's prologue and its T x T system, so a wide tile pays once the SMs
/// are busy; below one CTA per SM the narrower tiles' extra CTAs pay instead.
constexpr int default_fast_block_v(int B, int HV, int V, int sms) {
  const long long want = sms > 0 ? sms : 132;
  int bv = head_block_v(V);
  bv = bv < 32 ? 32 : bv;
  while (bv > 32 && fused_grid_ctas(B, HV, V, bv) < want) {
    bv /= 2;
  }
  return bv;
}

/// The auto tile of a call of B requests of T tokens in `mode` (--kda-verify-block-v=auto):
/// default_block_v in ring mode (default_deferred_block_v when the call folds pending steps,
/// `deferred`), default_snapshot_block_v in snapshot mode; `sms` = the device's SMs (0: unknown).
constexpr int default_fused_block_v(RecordMode mode, int B, int T, int HV, int V, int sms,
                                    bool deferred = false) {
  if (mode != RecordMode::kRing) {
    return default_snapshot_block_v(B, HV, V, sms);
  }
  return deferred ? default_deferred_block_v(B, HV, V, sms, T) : default_block_v(B, HV, V, sms, T);
}

}  // namespace kda::kernels
