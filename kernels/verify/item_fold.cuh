// item_fold.cuh: the deferred commit's pending fold inside a verify item (contract §7): before
// its draft steps, a verify CTA replays its slot's pending ring steps onto its own state tile
// and writes the folded tile back as the committed state. PendingU::kRecords (the exact
// kernels): each pending step's u comes from its u record (VerifyParams::ring_u, written by the
// verify that recorded the step: the u an eager fold computes, bitwise), so a step is the
// key-row normalisation, EXP(g) and delta_rule_step_given_u: an eager fold's operations on every
// state value, without the key dot and its cross-lane tree. PendingU::kComputed (the fast
// kernel's u-free deferred calls: fast outputs record no u): a step is the eager fold's own, u
// from the raw value, beta and the key dot (delta_rule_step), the same bits as the fold kernel.
// One writer per state element: a CTA folds and stores only the columns v0 .. v0 + BV - 1 of
// head hv of its request's slot (distinct slots per call), and no CTA of the launch reads
// another CTA's columns. The pending records (ring positions (c - n + j) mod L, j < n) are
// disjoint from the ones the launch's draft steps write ((c + t) mod L, t < T) because
// L >= 2 * T_max (pool invariant, launcher-checked through params_check).
#pragma once

#include <cstdint>

#include "kernels/common/tile_layout.cuh"
#include "kernels/params/kda_params.h"
#include "kernels/verify/item_source.h"

namespace kda::kernels {

/// The pending count of the item's slot (0: nothing pending, or no deferred commit).
__device__ __forceinline__ int pending_steps(const VerifyParams& p, int slot) {
  return p.ring_pending != nullptr ? p.ring_pending[slot] : 0;
}

/// The ring base c of the item's slot (0 without a cursor).
__device__ __forceinline__ int ring_cursor(const VerifyParams& p, int slot) {
  return p.ring_cursor != nullptr ? p.ring_cursor[slot] : 0;
}

/// ok[j]: the item's column col0 + j is below V.
template <typename Slice, typename Item>
__device__ __forceinline__ void columns_below_v(const Item& it, bool (&ok)[Slice::CPT]) {
#pragma unroll
  for (int j = 0; j < Slice::CPT; ++j) {
    ok[j] = it.col0 + j < it.p.V;
  }
}

/// The fold's columns col0 + j (j < CPT) of the item's tile from `src` (zeros where !ok[j]).
template <typename Slice, typename Item, typename Src>
__device__ __forceinline__ void fold_columns_in(const Item& it, const Src& src,
                                                ColRegs<Slice> (&R)[Slice::CPT],
                                                const bool (&ok)[Slice::CPT], int slot,
                                                bool first_chunk) {
#pragma unroll
  for (int j = 0; j < Slice::CPT; ++j) {
    if (ok[j]) {
      src.template fold_column_in<Slice>(it, R[j], slot, it.col0 + j, first_chunk);
    } else {
      zero_column<Slice>(R[j]);
    }
  }
}

/// Where a pending fold's u comes from (fold_pending).
enum class PendingU : uint8_t {
  kRecords,   ///< the steps' u records (VerifyParams::ring_u), in the value rows of `sm`
  kComputed,  ///< computed from the raw values (value rows) and beta, as an eager fold does
};

/// The chunk's tc pending steps (records in `sm`: u, or the raw value and beta) on the columns
/// in R, R[j] the tile's column `first` + j.
template <PendingU kU, typename Slice, typename Item>
__device__ __forceinline__ void fold_columns_steps(const Item& it,
                                                   const TileSmem<typename Item::Cfg>& sm,
                                                   ColRegs<Slice> (&R)[Slice::CPT],
                                                   const bool (&ok)[Slice::CPT], int tc,
                                                   int first) {
  for (int tt = 0; tt < tc; ++tt) {
    float vv[Slice::CPT];
#pragma unroll
    for (int j = 0; j < Slice::CPT; ++j) {
      vv[j] = ok[j] ? sm.v[tt][first + j] : 0.0f;
    }
    if constexpr (kU == PendingU::kComputed) {
      delta_rule_step<Slice>(R, sm.qk[tt][1], sm.decay[tt], vv, sm.beta[tt], it.c);
    } else {
      delta_rule_step_given_u<Slice>(R, sm.qk[tt][1], sm.decay[tt], vv, it.c);
    }
  }
}

/// The folded columns back to `src` (the ones below V), R[j] the column `col` + j.
template <typename Slice, typename Item, typename Src>
__device__ __forceinline__ void fold_columns_out(const Item& it, const Src& src,
                                                 const ColRegs<Slice> (&R)[Slice::CPT],
                                                 const bool (&ok)[Slice::CPT], int slot, int col) {
#pragma unroll
  for (int j = 0; j < Slice::CPT; ++j) {
    if (ok[j]) {
      src.template fold_column_out<Slice>(it, R[j], slot, col + j);
    }
  }
}

/// Folds `n` pending steps at ring positions (first + j) mod L onto the item's state tile and
/// stores it to p.ssm_fold_out. Every thread of the CTA calls it (CTA-uniform: n is the slot's).
/// The whole tile at once, as FoldItem steps its columns. `src` hands each column over and takes it
/// back (fold_column_in / _out: global memory, the persistent kernel's stage or the fast kernel's);
/// the per-item sources (kEarlyLoads) are told when this item's first records are in flight
/// (fold_records_issued, before the barrier that precedes the first fold_column_in). Shared memory
/// `sm` is free on entry after the leading barrier and on exit. The wide per-item forms
/// (kEarlyTile) leave the folded tile in S (zeros past V) on the threads that hold columns; the
/// others leave S alone. kU: where each step's u comes from (PendingU). kPasses (the other forms):
/// the thread's CPT columns in kPasses passes of CPT / kPasses over the chunk's steps, so that a
/// kernel with more live registers holds fewer state values at once; every column's arithmetic is
/// its own (the same bits in any pass).
template <PendingU kU = PendingU::kRecords, int kPasses = 1, typename Item, typename Src>
__device__ __forceinline__ void fold_pending(const Item& it, const Src& src,
                                             TileSmem<typename Item::Cfg>& sm,
                                             ColRegs<typename Item::Slice> (&S)[Item::Cfg::CPT],
                                             int slot, int n, int first) {
  using Cfg = typename Item::Cfg;
  using Slice = typename Item::Slice;
  constexpr int K = Cfg::K;
  constexpr int BV = Cfg::BV;
  constexpr int CPT = Cfg::CPT;
  constexpr int E = K / 32;  // key-row values per lane
  const VerifyParams& p = it.p;
  const int lane = it.tid & 31;
  const int warp = it.tid >> 5;
  const bool holds_tile = Cfg::kFirstStepThread == 0 || it.tid >= Cfg::kFirstStepThread;
  const int64_t L = p.L;
  const bf16_t* rawk = p.ring_rawk + slot * p.ring_rawk_slot_stride + it.h * L * K;
  const float* g = p.ring_g + slot * p.ring_g_slot_stride + it.hv * L * K;
  constexpr bool kComputesU = kU == PendingU::kComputed;
  // The value rows: u records, or the raw values (then beta too).
  const float* u_rec =
      kComputesU ? nullptr : p.ring_u + slot * p.ring_u_slot_stride + it.hv * L * p.V + it.v0;
  const bf16_t* rawv =
      kComputesU ? p.ring_rawv + slot * p.ring_rawv_slot_stride + it.hv * L * p.V + it.v0 : nullptr;
  const float* beta =
      kComputesU ? p.ring_beta + slot * p.ring_beta_slot_stride + it.hv * L : nullptr;
  // As FoldItem::run, per chunk: job t < tc normalises key row t, job tc + t fills step t's
  // EXP(g) and u row (in the tile's value rows); warp w takes jobs w and w + kWarps. The
  // per-item kernels (kEarlyLoads) load every job's records into registers before the barrier
  // that frees `sm` and store them after it, so their latency overlaps that wait; their wide
  // forms (kEarlyTile: up to 255 registers) also load their state columns there (one memory
  // round trip after the slot's cursor, not two) and hold them across chunks. The persistent
  // kernel, at its register cap, would hold the records through the barrier (measured slower
  // there), so there each job loads after the barrier; it and the 128-register per-item forms
  // (which spill holding the columns through the job loads) load the columns per chunk.
  constexpr int kJobs = (2 * Cfg::kChunk + Cfg::kWarps - 1) / Cfg::kWarps;
  constexpr int kUPerLane = (BV + 31) / 32;
  struct JobRegs {
    float a[E];          // key row (bf16 values) or the step's g, k = lane + 32 i
    float b[kUPerLane];  // the step's u (kComputesU: raw value), column lane + 32 i
    float beta;          // kComputesU: the step's beta
  };
  static_assert(K / 32 == E, "a lane holds E key values and E gate values");
  constexpr bool kEarlyLoads = !is_staged(Src::kSource);
  constexpr bool kEarlyTile = kEarlyLoads && Cfg::kMinCtasPerSm == 1;
  for (int t0 = 0; t0 < n; t0 += Cfg::kChunk) {
    const int tc = min(Cfg::kChunk, n - t0);
    const auto load_job = [&](int q, JobRegs& r) {
      const int job = warp + q * Cfg::kWarps;
      const int tt = job < tc ? job : job - tc;
      const int64_t pos = (first + t0 + tt) & (p.L - 1);
      if (job < tc) {
#pragma unroll
        for (int e = 0; e < E; ++e) {
          r.a[e] = ld_bf16(rawk + pos * K + lane * E + e);
        }
      } else if (job < 2 * tc) {
#pragma unroll
        for (int i = 0; i < E; ++i) {
          r.a[i] = g[pos * K + lane + 32 * i];
        }
#pragma unroll
        for (int i = 0; i < kUPerLane; ++i) {
          const int j = lane + 32 * i;
          const bool in_tile = j < BV && it.v0 + j < p.V;
          if constexpr (kComputesU) {
            r.b[i] = in_tile ? ld_bf16(rawv + pos * p.V + j) : 0.0f;
          } else {
            r.b[i] = in_tile ? u_rec[pos * p.V + j] : 0.0f;
          }
        }
        if constexpr (kComputesU) {
          r.beta = beta[pos];
        }
      }
    };
    const auto store_job = [&](int q, JobRegs& r) {
      const int job = warp + q * Cfg::kWarps;
      if (job < tc) {
        l2_normalize_regs<K>(r.a, 1.0f, false);
        store_vec<E>(&sm.qk[job][1][lane * E], r.a);
      } else if (job < 2 * tc) {
        const int tt = job - tc;
#pragma unroll
        for (int i = 0; i < E; ++i) {
          sm.decay[tt][lane + 32 * i] = kda_exp(r.a[i]);
        }
#pragma unroll
        for (int i = 0; i < kUPerLane; ++i) {
          const int j = lane + 32 * i;
          if (j < BV && it.v0 + j < p.V) {
            sm.v[tt][j] = r.b[i];
          }
        }
        if constexpr (kComputesU) {
          if (lane == 0) {
            sm.beta[tt] = r.beta;
          }
        }
      }
    };
    if constexpr (kEarlyLoads) {
      JobRegs r[kJobs];
#pragma unroll
      for (int q = 0; q < kJobs; ++q) {
        load_job(q, r[q]);
      }
      if (t0 == 0) {
        src.fold_records_issued(it);
        if constexpr (kEarlyTile) {
          if (holds_tile) {
            bool ok[CPT];
            columns_below_v<Slice>(it, ok);
            fold_columns_in<Slice>(it, src, S, ok, slot, true);
          }
        }
        __syncthreads();  // `sm` is free (see above)
      }
#pragma unroll
      for (int q = 0; q < kJobs; ++q) {
        store_job(q, r[q]);
      }
    } else {
      if (t0 == 0) {
        __syncthreads();  // a persistent CTA's previous item may still read `sm`
      }
#pragma unroll
      for (int q = 0; q < kJobs; ++q) {
        JobRegs r;
        load_job(q, r);
        store_job(q, r);
      }
    }
    __syncthreads();
    // Whole warps hold columns (holds_tile is warp-uniform); a column past V steps on zeros and
    // is neither read nor stored.
    if (holds_tile) {
      if constexpr (kEarlyTile) {
        bool ok[CPT];
        columns_below_v<Slice>(it, ok);
        fold_columns_steps<kU, Slice>(it, sm, S, ok, tc, it.col0 - it.v0);
        if (t0 + Cfg::kChunk >= n) {  // after the last chunk
          fold_columns_out<Slice>(it, src, S, ok, slot, it.col0);
        }
      } else {
        static_assert(kPasses >= 1 && CPT % kPasses == 0, "whole column passes");
        constexpr int kPassCols = CPT / kPasses;
        using PassSlice =
            ColumnSlice<Slice::K, Slice::P, kPassCols, Slice::kLaneStride>;  // a pass's columns
#pragma unroll 1
        for (int pass = 0; pass < kPasses; ++pass) {
          const int col = it.col0 + pass * kPassCols;
          bool ok[kPassCols];
          ColRegs<PassSlice> R[kPassCols];
#pragma unroll
          for (int j = 0; j < kPassCols; ++j) {
            ok[j] = col + j < p.V;
            if (ok[j]) {
              src.template fold_column_in<PassSlice>(it, R[j], slot, col + j, t0 == 0);
            } else {
              zero_column<PassSlice>(R[j]);
            }
          }
          fold_columns_steps<kU, PassSlice>(it, sm, R, ok, tc, col - it.v0);
          fold_columns_out<PassSlice>(it, src, R, ok, slot, col);
        }
      }
    }
    __syncthreads();  // the next chunk (or the item's prologue) overwrites `sm`
  }
  src.fold_done(it, slot);
}

}  // namespace kda::kernels
