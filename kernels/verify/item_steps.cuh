// item_steps.cuh: a verify / extend work item's recurrence (contract §3 steps 5-6 over a
// chunk's tokens, the norms done) in the loop of its schedule: steps_ring_persistent
// (ItemSource::kPersistentRing), steps_snapshot_persistent (kPersistentSnapshot), steps_per_item
// (the per-item kernels), and their stores: outputs and snapshots. Every loop performs the
// operations of delta_rule_step + output_dot in the same order, so their bits are equal.
// Never writes ssm_state; writes out and (snapshot mode) snapshots only.
#pragma once

#include <cstdint>

#include "kernels/verify/item_prologue.cuh"

namespace kda::kernels {

/// The recurrence phases of a work item (ItemPrologue's coordinates and shared memory).
/// kTrackedExtend: the extend instantiation with prefix-cache tracks (TileArgs::track_steps);
/// every other instantiation carries none of the track code.
template <typename Traits>
struct ItemSteps : ItemPrologue<Traits> {
  using Prologue = ItemPrologue<Traits>;
  KDA_VERIFY_TRAITS_MEMBERS(Traits);
  using Prologue::args, Prologue::c, Prologue::col0, Prologue::CPT, Prologue::first_row,
      Prologue::group, Prologue::hv, Prologue::kSnapshotStores, Prologue::n, Prologue::P,
      Prologue::p;
  using Prologue::Prologue;
  using typename Prologue::Cfg, typename Prologue::Slice;

  /// Step 4's v of the thread's CPT columns at step tt (not the ring persistent kernel's: it loads
  /// one column), columns past V as zeros. The snapshot persistent kernel (issue-bound) takes them
  /// in one shared-memory load (CPT = 2 or 4: 8 * CPT-byte aligned group offsets). The per-item
  /// kernels keep per-column loads: the one-load form changes their allocation and makes the
  /// BV = 128 fallback tile spill more.
  template <typename Src>
  __device__ __forceinline__ void v_of(const TileSmem<Cfg>& sm, const bool (&col_ok)[CPT], int tt,
                                       float (&vv)[CPT]) const {
    if constexpr (is_staged(Src::kSource) && (CPT == 2 || CPT == 4)) {
      load_vec<CPT>(vv, &sm.v[tt][group * CPT]);
#pragma unroll
      for (int j = 0; j < CPT; ++j) {
        vv[j] = col_ok[j] ? vv[j] : 0.0f;
      }
    } else {
#pragma unroll
      for (int j = 0; j < CPT; ++j) {
        vv[j] = col_ok[j] ? sm.v[tt][group * CPT + j] : 0.0f;
      }
    }
  }

  /// Token t's outputs where every lane holds every column's bits (not the ring persistent
  /// kernel's): lane 0 of the group writes its CPT columns, bf16 pairs, no per-lane column select
  /// (which nvcc lowered to a local-memory array). Pairs are whole: V, v0 and col0 are even when
  /// CPT >= 2. The output is indexed in 32 bits (the launchers check that `out` has fewer than
  /// 2^31 elements). Per-item kernels (latency-bound) add t rows of HV*V (out_token) to the
  /// item's token-0 index (out_item), the least index arithmetic per store. The persistent
  /// kernels compute the row's 32-bit index per store (they pass neither): a token-0 index held
  /// through the steps makes them spill, and a 64-bit index costs more instructions per store.
  template <typename Src>
  __device__ __forceinline__ void store_outputs(int t, const float* o, const bool (&col_ok)[CPT],
                                                int T, uint32_t out_item,
                                                uint32_t out_token) const {
    if (c == 0) {
      bf16_t* orow = p.out + (is_staged(Src::kSource)
                                  ? ((static_cast<uint32_t>(n) * T + t) * p.HV + hv) * p.V + col0
                                  : out_item + t * out_token);
      if constexpr (CPT == 1) {
        if (col_ok[0]) {
          orow[0] = to_bf16(o[0]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < CPT; j += 2) {
          if (col_ok[j]) {
            st_bf16x2(orow + j, o[j], o[j + 1]);
          }
        }
      }
    }
  }

  /// Snapshot mode (snap): the state after token t's step, unswizzled (the ring kernel stores
  /// none).
  template <typename Src>
  __device__ __forceinline__ void store_snapshot(int t, const ColRegs<Slice> (&S)[CPT],
                                                 const bool (&col_ok)[CPT], int64_t row,
                                                 bool snap) const {
    if (snap) {
      float* dst = p.snapshots + row * p.snapshot_row_stride +
                   (static_cast<int64_t>(t) * p.HV + hv) * p.V * K;
#pragma unroll
      for (int j = 0; j < CPT; ++j) {
        if (col_ok[j]) {
          // Unswizzled: the ring kernel stores none.
          float* col = dst + static_cast<int64_t>(col0 + j) * K;
          if constexpr (is_staged(Src::kSource)) {
            store_column_per_partial<Slice, kSnapshotStores>(col, S[j], c);
          } else {
            store_column<Slice, kSnapshotStores>(col, S[j], c);
          }
        }
      }
    }
  }

  /// Step 4 in the ring persistent kernel (issue-bound). Both persistent kernels are
  /// software-pipelined: step tt's output dot and step tt+1's key dot both read the state after
  /// step tt's update, so their cross-lane tree levels run together (the shuffle chains' latency
  /// was the recurrence's main stall). Per value, the operations and their order are those of
  /// delta_rule_step + output_dot. The row's output index is computed per store, in 32 bits.
  /// cols_ok: the thread's columns are below V. Here they all are or none is (run), so one value
  /// stands for them; passed as run's array, it makes the unfused ring kernel spill at its
  /// register cap.
  /// kDeferred: the u of each step goes to its ring position (cursor + t) mod L of `u_row` (the
  /// u records of the item's (slot, v-head), column col0), stored by the lanes that store the
  /// outputs.
  template <typename Src>
  __device__ __forceinline__ void steps_ring_persistent(const TileSmem<Cfg>& sm,
                                                        ColRegs<Slice> (&S)[CPT], bool cols_ok,
                                                        int T, int t0, int tc, float* u_row,
                                                        int cursor) const {
    static_assert(Slice::kLaneStride == 1, "the persistent kernel's trees pair lanes c ^ d");
    // The cross-lane levels as reduce-scatters on the swizzled columns
    // (device_math.cuh tree_reduce_scatter). A step's key tree leaves each lane the root
    // of column swz, the lane computes that column's u, and CPT - 1 shuffles give it the
    // other columns' u; the output tree leaves the lanes with c % (P / CPT) == 0 one
    // output each to store. Per thread and step: 11 shuffles, 8 adds and one u where the
    // all-reduce form below takes 24 shuffles, 24 adds and CPT u. The
    // ring kernel stores no snapshots (its record mode is fixed: StagedSource::kFixedMode).
    static_assert(CPT <= P, "one column per lane at the root");
    // Column swz's u at step tt from its key-tree root kv, then every column's u.
    const auto update = [&](int tt, float kv) {
      float u[CPT];
      const float v =
          cols_ok ? sm.v[tt][group * CPT + this->template column_swizzle_of<Src>()] : 0.0f;
      u[0] = __fmul_rn(__fsub_rn(v, kv), sm.beta[tt]);
      if constexpr (kDeferred) {
        // L >= 2 * T_max (launcher-checked with ring_pending): every step has a ring position.
        if (c % (P / CPT) == 0 && cols_ok) {
          u_row[((cursor + t0 + tt) & (p.L - 1)) * p.V + this->template column_swizzle_of<Src>()] =
              u[0];
        }
      }
      column_all_gather<P, CPT>(u);
      apply_update<Slice>(S, sm.qk[tt][1], u, c);
    };
    {
      float kv[1][CPT];
      decay_and_key_partials<Slice>(S, sm.qk[0][1], sm.decay[0], c, kv[0]);
      tree_reduce_scatter<P, CPT, 1>(kv);
      update(0, kv[0][0]);
    }
    for (int tt = 0; tt < tc; ++tt) {
      const bool next = tt + 1 < tc;
      float part[2][CPT];  // [0]: outputs of step tt; [1]: kv of step tt + 1
      query_partials<Slice>(S, sm.qk[tt][0], c, part[0]);
      if (next) {
        decay_and_key_partials<Slice>(S, sm.qk[tt + 1][1], sm.decay[tt + 1], c, part[1]);
        tree_reduce_scatter<P, CPT, 2>(part);
      } else {
        tree_reduce_scatter<P, CPT, 1>(reinterpret_cast<float(&)[1][CPT]>(part));
      }
      if (c % (P / CPT) == 0 && cols_ok) {
        // The token's row: n * T + t, or (a ragged call) token_offsets[n] + t.
        const uint32_t out_row = kShaped ? static_cast<uint32_t>(first_row()) + t0 + tt
                                         : static_cast<uint32_t>(n) * T + t0 + tt;
        p.out[(out_row * p.HV + hv) * p.V + col0 + this->template column_swizzle_of<Src>()] =
            to_bf16(part[0][0]);
      }
      if (next) {
        update(tt + 1, part[1][0]);
      }
    }
  }

  /// Step 4 in the snapshot persistent kernel, pipelined as steps_ring_persistent: the cross-lane
  /// levels as all-reduces (every lane gets every root), v_of's one shared-memory load,
  /// store_outputs from lane 0. The ring kernel's reduce-scatter form spills here and proved
  /// slower.
  template <typename Src>
  __device__ __forceinline__ void steps_snapshot_persistent(const TileSmem<Cfg>& sm,
                                                            ColRegs<Slice> (&S)[CPT],
                                                            const bool (&col_ok)[CPT], int T,
                                                            int64_t row, bool snap, int t0,
                                                            int tc) const {
    static_assert(Slice::kLaneStride == 1, "the persistent kernel's trees pair lanes c ^ d");
    float vv[CPT];
    const auto update = [&](int tt, const float(&v)[CPT], const float(&kv)[CPT]) {
      float u[CPT];
#pragma unroll
      for (int j = 0; j < CPT; ++j) {
        u[j] = __fmul_rn(__fsub_rn(v[j], kv[j]), sm.beta[tt]);
      }
      apply_update<Slice>(S, sm.qk[tt][1], u, c);
    };
    {
      v_of<Src>(sm, col_ok, 0, vv);
      float kv[CPT];
      decay_and_key_partials<Slice>(S, sm.qk[0][1], sm.decay[0], c, kv);
      tree_across_lanes<P, CPT>(kv);
      update(0, vv, kv);
    }
    for (int tt = 0; tt < tc; ++tt) {
      const bool next = tt + 1 < tc;
      float part[2 * CPT];  // [0, CPT): outputs of step tt; [CPT, 2 CPT): kv of tt + 1
      query_partials<Slice>(S, sm.qk[tt][0], c, part);
      store_snapshot<Src>(t0 + tt, S, col_ok, row,
                          snap);  // the state after step tt, before step tt + 1 decays it
      if (next) {
        decay_and_key_partials<Slice>(S, sm.qk[tt + 1][1], sm.decay[tt + 1], c, part + CPT);
        tree_across_lanes<P, 2 * CPT>(part);
      } else {
        tree_across_lanes<P, CPT>(reinterpret_cast<float(&)[CPT]>(part));
      }
      store_outputs<Src>(t0 + tt, part, col_ok, T, 0u, 0u);
      if (next) {
        v_of<Src>(sm, col_ok, tt + 1, vv);
        update(tt + 1, vv, reinterpret_cast<const float(&)[CPT]>(part[CPT]));
      }
    }
  }

  /// Step 4 in the per-item kernels: one step after the other (latency-bound at small B, where
  /// the split form's extra shared loads proved slower). The wide form runs the
  /// ring-mode steps in groups of kStepGroup with their outputs stored after the group.
  /// kTrackedExtend (contract §9): the state after the request's track step goes to the track
  /// slot as the loop passes it (the verify kernels have no such code: in them it made the
  /// 128-register forms spill).
  /// kDeferred: u records as in steps_ring_persistent (`u_row`: column col0), stored by lane c = 0.
  template <typename Src>
  __device__ __forceinline__ void steps_per_item(const TileSmem<Cfg>& sm, ColRegs<Slice> (&S)[CPT],
                                                 const bool (&col_ok)[CPT], bool holds_tile, int T,
                                                 int64_t row, bool snap, int t0, int tc,
                                                 float* u_row, int cursor, int slot = 0) const {
    constexpr int kStepGroup = kWide ? 4 : 1;
    static_assert(!(kShaped && kWide && !FUSED),
                  "a wide draft-shaped item is a fused ragged chain: a tree (unfused) runs the "
                  "128-register form, steps one at a time (a node may restart)");
    uint32_t out_item = 0;
    if constexpr (kShaped) {
      out_item = (static_cast<uint32_t>(first_row()) * p.HV + hv) * p.V + col0;
    } else {
      out_item = (static_cast<uint32_t>(n) * T * p.HV + hv) * p.V + col0;
    }
    const uint32_t out_token = static_cast<uint32_t>(p.HV) * p.V;
    float vv[CPT];
    const auto step = [&](int tt, float(&o)[CPT]) {
      v_of<Src>(sm, col_ok, tt, vv);
      float u[CPT];
      delta_rule_step<Slice>(S, sm.qk[tt][1], sm.decay[tt], vv, sm.beta[tt], c, u);
      if constexpr (kDeferred) {
        if (c == 0) {
          float* dst = u_row + ((cursor + t0 + tt) & (p.L - 1)) * p.V;
#pragma unroll
          for (int j = 0; j < CPT; ++j) {
            if (col_ok[j]) {
              dst[j] = u[j];
            }
          }
        }
      }
      output_dot<Slice>(S, sm.qk[tt][0], c, o);
    };
    int tt = holds_tile ? 0 : tc;  // warps without state columns: no steps
    if constexpr (kStepGroup > 1) {
      // Whole groups with their outputs stored after the group: no store (behind its
      // branch) then separates step tt's output dot from step tt + 1's decay and key dot,
      // which do not depend on it, and the scheduler overlaps them.
      // Snapshot mode stores the state after every step, and a tracked extend one, so they
      // keep the plain loop.
      if (!snap && !tracks_extend()) {
        for (; tt + kStepGroup <= tc; tt += kStepGroup) {
          float o[kStepGroup][CPT];
#pragma unroll
          for (int u = 0; u < kStepGroup; ++u) {
            step(tt + u, o[u]);
          }
#pragma unroll
          for (int u = 0; u < kStepGroup; ++u) {
            store_outputs<Src>(t0 + tt + u, o[u], col_ok, T, out_item, out_token);
          }
        }
      }
    }
    for (; tt < tc; ++tt) {
      float o[CPT];
      if constexpr (kShaped && !FUSED) {
        if (p.parents != nullptr) {
          tree_parent_state<Src>(sm, S, col_ok, t0 + tt, slot);
        }
      }
      step(tt, o);
      store_outputs<Src>(t0 + tt, o, col_ok, T, out_item, out_token);
      store_snapshot<Src>(t0 + tt, S, col_ok, row, snap);
      if (tracks_extend() && t0 + tt == args.track_steps[n]) {
        float* dst = args.ssm_out + args.track_slots[n] * p.ssm_slot_stride +
                     static_cast<int64_t>(hv) * p.V * K;
#pragma unroll
        for (int j = 0; j < CPT; ++j) {
          if (col_ok[j]) {
            store_column<Slice>(dst + static_cast<int64_t>(col0 + j) * K, S[j], c);
          }
        }
      }
    }
  }

  /// A tree node t (kShaped, unfused; T <= kMaxTreeNodes <= kChunk, so t is the chunk's step and
  /// its ancestors' inputs are in shared memory): S holds step t - 1's state; a node whose parent
  /// is another one restarts from the committed state and replays its ancestors, root first,
  /// with the step's own arithmetic (no output, no record), so S becomes its parent's state
  /// bitwise. A chain-shaped tree never restarts. (The committed state: ssm_state, which a tree
  /// call never folds into: trees commit eagerly.)
  template <typename Src>
  __device__ __forceinline__ void tree_parent_state(const TileSmem<Cfg>& sm,
                                                    ColRegs<Slice> (&S)[CPT],
                                                    const bool (&col_ok)[CPT], int t,
                                                    int slot) const {
    const int32_t* parents = p.parents + static_cast<int64_t>(n) * p.T;
    const int parent = parents[t];
    if (t == 0 || parent == t - 1) {
      return;
    }
    load_state_columns<Slice>(
        S, col_ok, p.ssm_state + slot * p.ssm_slot_stride + static_cast<int64_t>(hv) * p.V * K,
        col0, c);
    int path[kMaxTreeNodes];
    int depth = 0;
    for (int a = parent; a >= 0; a = parents[a]) {
      path[depth++] = a;
    }
    float vv[CPT], u[CPT];
    for (int i = depth - 1; i >= 0; --i) {
      const int a = path[i];
      this->template v_of<Src>(sm, col_ok, a, vv);
      delta_rule_step<Slice>(S, sm.qk[a][1], sm.decay[a], vv, sm.beta[a], c, u);
    }
  }

  /// An extend call with prefix-cache tracks.
  __device__ __forceinline__ bool tracks_extend() const {
    return kTrackedExtend && args.extend != 0 && args.track_steps != nullptr;
  }
};

}  // namespace kda::kernels
