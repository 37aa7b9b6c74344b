// item_fold.cuh: the deferred commit's pending fold inside a verify item (contract §7): before
// its draft steps, a verify CTA replays its slot's pending ring steps onto its own state tile
// and writes the folded tile back as the committed state. Each pending step's u comes from its
// u record (VerifyParams::ring_u, written by the verify that recorded the step: the u an eager
// fold computes, bitwise), so a step is the key-row normalisation, EXP(g) and
// delta_rule_step_given_u: an eager fold's operations on every state value, without the key
// dot and its cross-lane tree.
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

/// The chunk's tc pending steps (records in `sm`) on the columns in R.
template <typename Slice, typename Item>
__device__ __forceinline__ void fold_columns_steps(const Item& it,
                                                   const TileSmem<typename Item::Cfg>& sm,
                                                   ColRegs<Slice> (&R)[Slice::CPT],
                                                   const bool (&ok)[Slice::CPT], int tc) {
  for (int tt = 0; tt < tc; ++tt) {
    float uu[Slice::CPT];
#pragma unroll
    for (int j = 0; j < Slice::CPT; ++j) {
      uu[j] = ok[j] ? sm.v[tt][it.group * Slice::CPT + j] : 0.0f;
    }
    delta_rule_step_given_u<Slice>(R, sm.qk[tt][1], sm.decay[tt], uu, it.c);
  }
}

/// The folded columns back to `src` (the ones below V).
template <typename Slice, typename Item, typename Src>
__device__ __forceinline__ void fold_columns_out(const Item& it, const Src& src,
                                                 const ColRegs<Slice> (&R)[Slice::CPT],
                                                 const bool (&ok)[Slice::CPT], int slot) {
#pragma unroll
  for (int j = 0; j < Slice::CPT; ++j) {
    if (ok[j]) {
      src.template fold_column_out<Slice>(it, R[j], slot, it.col0 + j);
    }
  }
}

/// Folds `n` pending steps at ring positions (first + j) mod L onto the item's state tile and
/// stores it to p.ssm_fold_out. Every thread of the CTA calls it (CTA-uniform: n is the slot's).
/// The whole tile at once, as FoldItem steps its columns. `src` hands each column over and takes it
/// back (fold_column_in / _out: global memory, or the persistent kernel's stage). Shared memory
/// `sm` is free on entry after the leading barrier and on exit. The wide per-item forms
/// (kEarlyTile) leave the folded tile in S (zeros past V) on the threads that hold columns; the
/// others leave S alone.
template <typename Item, typename Src>
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
  const float* u_rec = p.ring_u + slot * p.ring_u_slot_stride + it.hv * L * p.V + it.v0;
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
    float b[kUPerLane];  // the step's u, column lane + 32 i
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
          r.b[i] = j < BV && it.v0 + j < p.V ? u_rec[pos * p.V + j] : 0.0f;
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
      }
    };
    if constexpr (kEarlyLoads) {
      JobRegs r[kJobs];
#pragma unroll
      for (int q = 0; q < kJobs; ++q) {
        load_job(q, r[q]);
      }
      if (t0 == 0) {
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
        fold_columns_steps<Slice>(it, sm, S, ok, tc);
        if (t0 + Cfg::kChunk >= n) {  // after the last chunk
          fold_columns_out<Slice>(it, src, S, ok, slot);
        }
      } else {
        bool ok[CPT];
        ColRegs<Slice> R[CPT];
#pragma unroll
        for (int j = 0; j < CPT; ++j) {
          ok[j] = it.col0 + j < p.V;
          if (ok[j]) {
            src.template fold_column_in<Slice>(it, R[j], slot, it.col0 + j, t0 == 0);
          } else {
            zero_column<Slice>(R[j]);
          }
        }
        fold_columns_steps<Slice>(it, sm, R, ok, tc);
        fold_columns_out<Slice>(it, src, R, ok, slot);
      }
    }
    __syncthreads();  // the next chunk (or the item's prologue) overwrites `sm`
  }
  src.fold_done(it, slot);
}

}  // namespace kda::kernels
