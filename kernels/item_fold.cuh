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

#include "kernels/item_schedule.h"
#include "kernels/kda_params.h"
#include "kernels/tile_layout.cuh"

namespace kda::kernels {

/// The pending count of the item's slot (0: nothing pending, or no deferred commit).
__device__ __forceinline__ int pending_steps(const VerifyParams& p, int slot) {
  return p.ring_pending != nullptr ? p.ring_pending[slot] : 0;
}

/// The ring base c of the item's slot (0 without a cursor).
__device__ __forceinline__ int ring_cursor(const VerifyParams& p, int slot) {
  return p.ring_cursor != nullptr ? p.ring_cursor[slot] : 0;
}

/// Folds `n` pending steps at ring positions (first + j) mod L onto the item's state tile and
/// stores it to p.ssm_fold_out. Every thread of the CTA calls it (CTA-uniform: n is the slot's).
/// The whole tile at once, as FoldItem steps its columns. `src` hands each column over and takes it
/// back (fold_column_in / _out: global memory, or the streaming kernel's stage). Shared memory `sm`
/// is free on entry after the leading barrier and on exit.
template <typename Item, typename Src>
__device__ __forceinline__ void fold_pending(const Item& it, const Src& src,
                                             TileSmem<typename Item::Cfg>& sm, int slot, int n,
                                             int first) {
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
  // that frees `sm` and store them after it, so their latency overlaps that wait. The streaming
  // kernel, at its register cap, would hold them through the barrier (slower there: log v49c),
  // so there each job loads after the barrier.
  constexpr int kJobs = (2 * Cfg::kChunk + Cfg::kWarps - 1) / Cfg::kWarps;
  constexpr int kUPerLane = (BV + 31) / 32;
  struct JobRegs {
    float a[E];          // key row (bf16 values) or the step's g, k = lane + 32 i
    float b[kUPerLane];  // the step's u, column lane + 32 i
  };
  static_assert(K / 32 == E, "a lane holds E key values and E gate values");
  constexpr bool kEarlyLoads = !is_streamed(Src::kSchedule);
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
        __syncthreads();  // `sm` is free (see above)
      }
#pragma unroll
      for (int q = 0; q < kJobs; ++q) {
        store_job(q, r[q]);
      }
    } else {
      if (t0 == 0) {
        __syncthreads();  // a streaming CTA's previous item may still read `sm`
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
      bool ok[CPT];
      ColRegs<Slice> S[CPT];
#pragma unroll
      for (int j = 0; j < CPT; ++j) {
        ok[j] = it.col0 + j < p.V;
        if (ok[j]) {
          src.template fold_column_in<Slice>(it, S[j], slot, it.col0 + j, t0 == 0);
        } else {
          zero_column<Slice>(S[j]);
        }
      }
      for (int tt = 0; tt < tc; ++tt) {
        float uu[CPT];
#pragma unroll
        for (int j = 0; j < CPT; ++j) {
          uu[j] = ok[j] ? sm.v[tt][it.group * CPT + j] : 0.0f;
        }
        delta_rule_step_given_u<Slice>(S, sm.qk[tt][1], sm.decay[tt], uu, it.c);
      }
#pragma unroll
      for (int j = 0; j < CPT; ++j) {
        if (ok[j]) {
          src.template fold_column_out<Slice>(it, S[j], slot, it.col0 + j);
        }
      }
    }
    __syncthreads();  // the next chunk (or the item's prologue) overwrites `sm`
  }
  src.fold_done(it, slot);
}

}  // namespace kda::kernels
