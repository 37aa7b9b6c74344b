// fold.cu: the ring-mode fold kernels (fold_kernel: one CTA per item; fold_persistent_kernel:
// persistent CTAs) and their launchers: the eager commit's fold (with or without
// prefix-cache tracks), materialize, the deferred commit's track fold and the lazy commit's folds
// (FoldRole). Writes only
// ssm_state of slots >= 0 and of valid track slots (and conv_state with the conv commit, and
// *error_flag); never reads ring rows past a request's accepted length.
#include "kernels/commit/commit.cuh"

#include <algorithm>

#include "kernels/kda_kernels.h"

#include "core/cuda_check.h"
#include "kernels/commit/commit_copy.cuh"
#include "kernels/commit/commit_track.h"
#include "kernels/common/device_caps.h"
#include "kernels/common/fast_divisor.h"
#include "kernels/common/launch_pdl.cuh"
#include "kernels/common/launch_utils.h"
#include "kernels/common/persistent_stage.cuh"
#include "kernels/common/tile_layout.cuh"

namespace kda::kernels {

namespace {

/// What a fold item replays and where its state goes (compile-time: the plain commit has no
/// track code).
enum class FoldRole {
  kCommit,         ///< eager: accepted steps from ring position 0, state back to the slot
  kCommitTracked,  ///< the same, and the state after the track step to the track slot
  kMaterialize,    ///< the slot's pending steps from position c - n, state back to the slot
  kTrackOnly,      ///< deferred commit's track: steps 0..k from position c, to the track slot
  /// The lazy commit (contract §11): where lazy_commit_folds(pending + accepted), the pending and
  /// accepted steps from position c - pending (the cursor not yet advanced), back to the slot.
  kLazy,
  /// The lazy commit's track: the pending steps and steps 0..k from position c - pending, to the
  /// track slot.
  kLazyTrack,
};

/// Where a fold item's state tile comes from: global memory (fold_kernel, FoldGlobalSource) or
/// the persistent kernel's stage (fold_persistent_kernel, FoldStagedSource: one chunk, T <=
/// kChunk).
enum class FoldSource { kGlobal, kPersistent };

/// A fold item's ring records in global memory (one CTA per item: FoldGlobalSource).
/// rawk [L][K] bf16 of k-head h, g [L][K] f32 and rawv [L][V] bf16, beta [L] f32 of v-head hv.
struct FoldRing {
  const bf16_t* rawk;
  const float* g;
  const bf16_t* rawv;
  const float* beta;
  const float* u;   ///< [L][V] u records of v-head hv (deferred records), or null
  int64_t v_pitch;  ///< V: rawv row pitch
  int first = 0;    ///< ring position of step 0 (materialize: c - n; eager: 0)
  int mask = 0;     ///< L - 1

  __device__ __forceinline__ FoldRing(const CommitParams& p, int layer, int slot, int h, int hv) {
    const int64_t L = p.L;
    rawk = p.ring_rawk + layer * p.ring_rawk_layer_stride + slot * p.ring_rawk_slot_stride +
           h * L * p.K;
    rawv = p.ring_rawv + layer * p.ring_rawv_layer_stride + slot * p.ring_rawv_slot_stride +
           hv * L * p.V;
    g = p.ring_g + layer * p.ring_g_layer_stride + slot * p.ring_g_slot_stride + hv * L * p.K;
    beta = p.ring_beta + layer * p.ring_beta_layer_stride + slot * p.ring_beta_slot_stride + hv * L;
    u = p.ring_u != nullptr
            ? p.ring_u + layer * p.ring_u_layer_stride + slot * p.ring_u_slot_stride + hv * L * p.V
            : nullptr;
    v_pitch = p.V;
    mask = p.L - 1;
  }
  /// Ring position of step t (kWraps: from `first`, wrapping; eager: t itself).
  template <bool kWraps>
  __device__ __forceinline__ int64_t pos(int t) const {
    return kWraps ? (first + t) & mask : t;
  }
};

/// The fold launch's divisors (fast_divisor.h), set by launch_fold: item index -> coordinates
/// and v-head -> k-head without a runtime division in the kernels.
struct FoldDivisors {
  FastDivisor tiles;     ///< ceil(V / kFoldBlockV)
  FastDivisor requests;  ///< B
  FastDivisor heads;     ///< HV
  FastDivisor group;     ///< HV / H: v-heads per k-head
};

/// Where a fold item sits: V tile, request n, layer, v-head hv of k-head h.
struct FoldCoords {
  int tile, n, layer, hv, h;
};

/// Whether a fold role reads its records from a cursor (wrapping ring positions). Those are the
/// deferred commit's records: with u records (CommitParams::ring_u) such a fold takes each step's
/// u from them (delta_rule_step_given_u, the same bits); without (the u-free deferred commit) it
/// computes u as an eager fold does.
KDA_HD constexpr bool role_wraps(FoldRole r) {
  return r == FoldRole::kMaterialize || r == FoldRole::kTrackOnly || r == FoldRole::kLazy ||
         r == FoldRole::kLazyTrack;
}
/// Whether a fold role's state goes to the request's track slot (not its own).
KDA_HD constexpr bool role_stores_track(FoldRole r) {
  return r == FoldRole::kTrackOnly || r == FoldRole::kLazyTrack;
}

/// One fold work item: (V tile, request n, layer, v-head). run() replays the item's ring
/// steps (FoldRole) onto the state tile and stores it. The source `Src` hands over the ring records
/// and the state tile: FoldGlobalSource (global memory, one CTA per item, the state loaded
/// before the ring records) or FoldStagedSource (persistent CTAs: the state and
/// rawk / g / rawv from a shared-memory stage filled during the previous item, the state copied
/// to registers after the prologue). Both give the same values to the same arithmetic.
/// kGivenU: each step's u from its u record (a wrapping role with CommitParams::ring_u).
template <int K, FoldRole kRole = FoldRole::kCommit, bool kGivenU = false>
struct FoldItem {
  using Cfg = TileConfig<K, kFoldBlockV>;
  using Slice = typename Cfg::Slice;
  static constexpr int P = Cfg::P;
  static constexpr int CPT = Cfg::CPT;
  static_assert(Slice::kLaneStride == 1, "the fold's lanes: c = tid % P");
  static_assert(!kGivenU || role_wraps(kRole), "u records are the deferred commit's");

  const CommitParams& p;
  int tile, n, layer, hv, h;
  int tid, c;

  __device__ __forceinline__ FoldItem(const CommitParams& p_, const FoldCoords& at)
      : p(p_),
        tile(at.tile),
        n(at.n),
        layer(at.layer),
        hv(at.hv),
        h(at.h),
        tid(threadIdx.x),
        c(threadIdx.x % P) {}

  /// Returns whether the item was live (padding requests and bad accepted lengths are not).
  template <typename Src>
  __device__ __forceinline__ bool run(TileSmem<Cfg>& sm, const Src& src) {
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int v0 = tile * kFoldBlockV;
    const int group = tid / P;
    const int col0 = v0 + group * CPT;
    const int slot = p.slots[n];
    if (slot < 0) {
      return false;
    }
    // Eager: the accepted steps, from ring position c = 0. kMaterialize: the slot's pending
    // steps of this layer, from position c - n. kTrackOnly: the track's steps 0..k from c
    // (the deferred commit has not moved the cursor yet). The track's validity is reported by
    // commit_track_kernel.
    int steps = 0;
    int track_k = kNoTrack;
    int pending = 0;  // the lazy roles' pending steps before this commit's
    if constexpr (kRole == FoldRole::kMaterialize) {
      steps = p.ring_pending[layer * p.ring_pending_layer_stride + slot];
    } else if constexpr (kRole == FoldRole::kTrackOnly) {
      steps = track_step_of(p, n) + 1;  // kNoTrack / kInvalidTrack: <= 0
    } else if constexpr (kRole == FoldRole::kLazy) {
      // A bad accepted length folds nothing (the conv commit reports it).
      pending = p.ring_pending[layer * p.ring_pending_layer_stride + slot];
      const int acc = p.accepted[n];
      const int m = pending + acc;
      steps = acc >= 1 && acc <= p.T && lazy_commit_folds(p, m) ? m : 0;
    } else if constexpr (kRole == FoldRole::kLazyTrack) {
      pending = p.ring_pending[layer * p.ring_pending_layer_stride + slot];
      const int k = track_step_of(p, n);
      steps = k >= 0 ? pending + k + 1 : 0;
    } else {
      steps = accepted_or_flag(p, n, tile == 0 && hv == 0 && layer == 0 && tid == 0);
      if constexpr (kRole == FoldRole::kCommitTracked) {
        track_k = steps > 0 ? track_step_of(p, n) : kNoTrack;
      }
    }
    if (steps <= 0) {
      return false;
    }
    FoldRing ring(p, layer, slot, h, hv);
    if constexpr (kRole == FoldRole::kMaterialize) {
      ring.first = p.ring_cursor[slot] - steps;
    } else if constexpr (kRole == FoldRole::kTrackOnly) {
      ring.first = p.ring_cursor[slot];
    } else if constexpr (kRole == FoldRole::kLazy || kRole == FoldRole::kLazyTrack) {
      ring.first = p.ring_cursor[slot] - pending;
    }
    const int64_t head = layer * p.ssm_layer_stride + static_cast<int64_t>(hv) * p.V * K;
    float* s_base = p.ssm_state + head + slot * p.ssm_slot_stride;
    // kTrackOnly stores its result (the state after step k) to the track slot; the tracked
    // eager fold stores the state after step track_k there as it passes it (the address is
    // formed there: held through the steps, it made the persistent fold spill).
    const auto track_base = [&] {
      return p.ssm_state + head + p.track_slots[n] * p.ssm_slot_stride;
    };

    ColRegs<Slice> S[CPT];
    bool col_ok[CPT];
#pragma unroll
    for (int j = 0; j < CPT; ++j) {
      col_ok[j] = col0 + j < p.V;
    }
    if constexpr (Src::kSource != FoldSource::kPersistent) {
      src.load_state(S, col_ok, s_base, col0 - v0);
    }
    src.wait_records();

    // The persistent fold serves T <= kChunk only (launcher-checked): one chunk.
    const int t_limit = Src::kSource == FoldSource::kPersistent ? 1 : steps;
    for (int t0 = 0; t0 < t_limit; t0 += Cfg::kChunk) {
      const int tc = min(Cfg::kChunk, steps - t0);
      // The chunk's step rows, one job per warp and no barrier between loading a key row and
      // normalising it: job t < tc loads key row t into registers (lane j: k = j*E ..) and
      // normalises it there; job tc + t fills step t's decay EXP(g) and value row. At tc = 8
      // each warp takes one row of each kind; at tc <= 4 half the warps take key rows, the
      // other half decay rows. Keep it barrier-free: a shared row pass plus a barrier before
      // the norms proved slower. item_fold.cuh's fold_pending fills the same rows with the same
      // values for a deferred verify (its loads held through a barrier): change both together.
      for (int job = warp; job < 2 * tc; job += Cfg::kWarps) {
        if (job < tc) {
          constexpr int E = K / 32;
          float x[E];
#pragma unroll
          for (int e = 0; e < E; ++e) {
            x[e] = src.rawk(ring, t0 + job, job, lane * E + e);
          }
          l2_normalize_regs<K>(x, 1.0f, false);
          store_vec<E>(&sm.qk[job][1][lane * E], x);
        } else {
          const int tt = job - tc;
#pragma unroll
          for (int k = lane; k < K; k += 32) {
            sm.decay[tt][k] = kda_exp(src.g(ring, t0 + tt, tt, k));
          }
#pragma unroll
          for (int j = lane; j < kFoldBlockV; j += 32) {
            if (v0 + j < p.V) {
              if constexpr (kGivenU) {
                sm.v[tt][j] = src.u(ring, t0 + tt, v0, j);  // the value rows hold u
              } else {
                sm.v[tt][j] = src.rawv(ring, t0 + tt, tt, v0, j);
              }
            }
          }
        }
      }
      // Thread t reads step t's beta (the staged source's cp.async of it was thread t's own).
      if constexpr (!kGivenU) {
        for (int tt = tid; tt < tc; tt += Cfg::kThreads) {
          sm.beta[tt] = src.beta(ring, t0 + tt, tt);
        }
      }
      if constexpr (Src::kSource == FoldSource::kPersistent) {
        // The state tile to registers, then the barrier inside load_state serves both: the
        // rows above are complete for every warp, and the stage is free to refill.
        src.load_state(S, col_ok, s_base, col0 - v0);
      } else {
        __syncthreads();
      }
      for (int tt = 0; tt < tc; ++tt) {
        float vv[CPT];
#pragma unroll
        for (int j = 0; j < CPT; ++j) {
          vv[j] = col_ok[j] ? sm.v[tt][group * CPT + j] : 0.0f;
        }
        if constexpr (kGivenU) {
          delta_rule_step_given_u<Slice>(S, sm.qk[tt][1], sm.decay[tt], vv, c);
        } else {
          delta_rule_step<Slice>(S, sm.qk[tt][1], sm.decay[tt], vv, sm.beta[tt], c);
        }
        if constexpr (kRole == FoldRole::kCommitTracked) {
          if (t0 + tt == track_k) {
            store_columns(track_base(), S, col_ok, col0);
          }
        }
      }
      if constexpr (Src::kSource != FoldSource::kPersistent) {
        __syncthreads();  // the next chunk (or item) overwrites shared memory
      }
      // Staged: no closing barrier. The persistent kernel gives consecutive live items
      // alternate TileSmem buffers, and a warp can reach the next item's rows only after
      // every warp has passed this item's load_state barrier, i.e. finished the previous
      // item's steps (the last reader of that buffer). Fast warps start the next item's
      // prologue while slow ones finish their steps.
    }
    store_columns(role_stores_track(kRole) ? track_base() : s_base, S, col_ok, col0);
    return true;
  }

  /// The thread's state columns to the head's [V][K] tile at `base`.
  __device__ __forceinline__ void store_columns(float* base, const ColRegs<Slice> (&S)[CPT],
                                                const bool (&col_ok)[CPT], int col0) const {
#pragma unroll
    for (int j = 0; j < CPT; ++j) {
      if (col_ok[j]) {
        store_column<Slice>(base + static_cast<int64_t>(col0 + j) * K, S[j], c);
      }
    }
  }
};

/// Ring records and the state tile straight from global memory (`col` counts from the
/// tile's first column).
/// kWraps: step t at ring position (first + t) mod L (FoldRing::pos).
template <typename Slice, bool kWraps = false>
struct FoldGlobalSource {
  static constexpr FoldSource kSource = FoldSource::kGlobal;
  int c;  // lane within the column's P lanes
  int v0;
  __device__ __forceinline__ void wait_records() const {}
  __device__ __forceinline__ float rawk(const FoldRing& r, int t, int, int k) const {
    return ld_bf16(r.rawk + r.pos<kWraps>(t) * Slice::K + k);
  }
  __device__ __forceinline__ float g(const FoldRing& r, int t, int, int k) const {
    return r.g[r.pos<kWraps>(t) * Slice::K + k];
  }
  __device__ __forceinline__ float rawv(const FoldRing& r, int t, int, int v0_, int j) const {
    return ld_bf16(r.rawv + r.pos<kWraps>(t) * r.v_pitch + v0_ + j);
  }
  __device__ __forceinline__ float beta(const FoldRing& r, int t, int) const {
    return r.beta[r.pos<kWraps>(t)];
  }
  __device__ __forceinline__ float u(const FoldRing& r, int t, int v0_, int j) const {
    return r.u[r.pos<kWraps>(t) * r.v_pitch + v0_ + j];
  }
  __device__ __forceinline__ void load_state(ColRegs<Slice> (&S)[Slice::CPT],
                                             const bool (&ok)[Slice::CPT], const float* head,
                                             int col) const {
    load_state_columns<Slice>(S, ok, head + static_cast<int64_t>(v0) * Slice::K, col, c);
  }
};

/// grid (ceil(V/128), B, layers*HV): one CTA per item. With `with_conv` the CTAs of request n
/// in a layer also share its conv commit (one launch for the whole commit).
template <int K, FoldRole kRole = FoldRole::kCommit, bool kGivenU = false>
__global__ void __launch_bounds__(256, 2)
    fold_kernel(const __grid_constant__ CommitParams p, const __grid_constant__ FoldDivisors div,
                bool with_conv) {
  using Item = FoldItem<K, kRole, kGivenU>;
  __shared__ __align__(16) TileSmem<typename Item::Cfg> sm;
  pdl_enter();
  uint32_t layer, hv;
  div.heads.divmod(blockIdx.z, layer, hv);
  if (with_conv) {
    commit_conv_share<8>(p, static_cast<int>(layer), static_cast<int>(blockIdx.y),
                         static_cast<int>(hv * gridDim.x + blockIdx.x),
                         static_cast<int>(div.heads.divisor * gridDim.x));
  }
  Item item(p, {static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y), static_cast<int>(layer),
                static_cast<int>(hv), static_cast<int>(div.group.div(hv))});
  (void)item.run(sm, FoldGlobalSource<typename Item::Slice, role_wraps(kRole)>{
                         item.c, item.tile * kFoldBlockV});
}

/// The fold's stage: the state tile (kFoldBlockV x K f32), then the item's ring records for
/// its accepted steps: rawk [kChunk][K] bf16, g [kChunk][K] f32, rawv [kChunk][kFoldBlockV]
/// bf16 (the tile's columns), beta [kChunk] f32. One fill = 4 bulk runs when the tile spans
/// whole rows (V == kFoldBlockV), else up to 3 + kChunk (rawv one per step), and one 4-byte
/// cp.async per step for beta (a run of n floats is neither a multiple of 16 bytes nor 16-byte
/// aligned in general). Staging beta takes a dependent global load of data written a launch
/// ago off every item's prologue.
template <int K>
struct FoldStage {
  static constexpr int kChunk = TileConfig<K, kFoldBlockV>::kChunk;
  static constexpr uint32_t kRawk = kFoldBlockV * K * 4;
  static constexpr uint32_t kG = kRawk + kChunk * K * 2;
  static constexpr uint32_t kRawv = kG + kChunk * K * 4;
  static constexpr uint32_t kBeta = kRawv + kChunk * kFoldBlockV * 2;
  static constexpr uint32_t kBytes = kBeta + kChunk * 4;
  static_assert(kBeta % 16 == 0 && kBytes % 16 == 0, "16-byte aligned regions");
  static_assert(3 + kChunk <= 32, "one warp issues a fill, one run per lane");
  static_assert(two_ctas_fit_per_sm(kBytes + 2 * sizeof(TileSmem<TileConfig<K, kFoldBlockV>>) +
                                    sizeof(uint64_t)),
                "fold_persistent_kernel (stage + two TileSmem): two CTAs per SM");
};

/// Fold items in a persistent CTA's order: item = ((layer*HV + hv)*B + n)*tiles + tile; live
/// when the request has a slot and a valid accepted length.
template <int K>
struct FoldPersistentItems {
  const CommitParams& p;
  const FoldDivisors& div;
  __device__ int count() const {
    return p.num_layers * p.HV * p.B * static_cast<int>(div.tiles.divisor);
  }
  __device__ int n_of(int item) const {
    uint32_t rest, n;
    div.requests.divmod(div.tiles.div(static_cast<uint32_t>(item)), rest, n);
    return static_cast<int>(n);
  }
  __device__ FoldCoords coords(int item) const {
    uint32_t rest, tile, n, layer, hv;
    div.tiles.divmod(static_cast<uint32_t>(item), rest, tile);
    div.requests.divmod(rest, rest, n);
    div.heads.divmod(rest, layer, hv);
    return {static_cast<int>(tile), static_cast<int>(n), static_cast<int>(layer),
            static_cast<int>(hv), static_cast<int>(div.group.div(hv))};
  }
  __device__ bool live(int item) const {
    const int n = n_of(item);
    const int acc = p.accepted[n];
    return p.slots[n] >= 0 && acc >= 1 && acc <= p.T;
  }
  /// Warp 0, all 32 lanes: the whole fill of live item `item`, one bulk run per lane — 0 the
  /// state tile, 1 rawk, 2 g, then rawv: one run when the tile spans whole rows (V ==
  /// kFoldBlockV: the steps' rows are contiguous and the stage's row pitch), else one per step
  /// — and lane t copies step t's beta (cp.async). Thread t is the one that reads beta[t] in
  /// the item's prologue, so its own cp_async_wait_all() is all the ordering it needs.
  /// Kept short: warp 0 starts its recurrence steps only after the fill.
  __device__ void fill(BulkStage& bulk, unsigned char* stage, int item) const {
    using St = FoldStage<K>;
    const int lane = static_cast<int>(threadIdx.x % 32);
    const FoldCoords at = coords(item);
    const int tile = at.tile;
    const int hv = at.hv;
    const int layer = at.layer;
    const int steps = p.accepted[at.n];
    const int slot = p.slots[at.n];
    const FoldRing ring(p, layer, slot, at.h, hv);
    if (lane < steps) {
      cp_async<4>(stage + St::kBeta + lane * 4, ring.beta + lane);
    }
    const int v0 = tile * kFoldBlockV;
    const int cols = min(kFoldBlockV, p.V - v0);
    const bool whole_rows = p.V == kFoldBlockV;
    BulkRun r{};
    if (lane == 0) {
      r = {0u,
           p.ssm_state + layer * p.ssm_layer_stride + slot * p.ssm_slot_stride +
               (static_cast<int64_t>(hv) * p.V + v0) * K,
           static_cast<uint32_t>(cols * K * sizeof(float))};
    } else if (lane == 1) {
      r = {St::kRawk, ring.rawk, static_cast<uint32_t>(steps * K * 2)};
    } else if (lane == 2) {
      r = {St::kG, ring.g, static_cast<uint32_t>(steps * K * 4)};
    } else if (whole_rows) {
      r = {St::kRawv, ring.rawv, static_cast<uint32_t>(steps * kFoldBlockV * 2)};
    } else {
      const int t = lane - 3;
      r = {St::kRawv + static_cast<uint32_t>(t * kFoldBlockV * 2),
           ring.rawv + static_cast<int64_t>(t) * p.V + v0, static_cast<uint32_t>(cols * 2)};
    }
    if (lane < (whole_rows ? 4 : 3 + steps)) {
      bulk.issue(r);
    }
    __syncwarp();
    if (lane == 0) {
      bulk.arrive();
    }
  }
};

/// The state tile and the ring records (rawk / g / rawv / beta) from the stage. The stage is
/// refilled with the next live item's once the state is in registers.
template <typename Slice, typename Items>
struct FoldStagedSource {
  static constexpr FoldSource kSource = FoldSource::kPersistent;
  using St = FoldStage<Slice::K>;
  BulkStage& bulk;
  unsigned char* stage;
  const Items& items;
  int item;
  int c;  // lane within the column's P lanes
  __device__ __forceinline__ void wait_records() const {
    bulk.wait();
    cp_async_wait_all();  // beta (Items::fill)
  }
  __device__ __forceinline__ float rawk(const FoldRing&, int, int tt, int k) const {
    return ld_bf16(reinterpret_cast<const bf16_t*>(stage + St::kRawk) + tt * Slice::K + k);
  }
  __device__ __forceinline__ float g(const FoldRing&, int, int tt, int k) const {
    return reinterpret_cast<const float*>(stage + St::kG)[tt * Slice::K + k];
  }
  __device__ __forceinline__ float rawv(const FoldRing&, int, int tt, int, int j) const {
    return ld_bf16(reinterpret_cast<const bf16_t*>(stage + St::kRawv) + tt * kFoldBlockV + j);
  }
  __device__ __forceinline__ float beta(const FoldRing&, int, int tt) const {
    return reinterpret_cast<const float*>(stage + St::kBeta)[tt];
  }
  /// Every column is copied (as in the persistent verify's StagedSource::load_state): the stage
  /// holds kFoldBlockV columns, those past V zeros (fold_persistent_kernel clears the state region
  /// first) or an earlier item's, never stored and never mixed with another column.
  __device__ __forceinline__ void load_state(ColRegs<Slice> (&S)[Slice::CPT],
                                             const bool (&)[Slice::CPT], const float*,
                                             int col) const {
    const float* tile = reinterpret_cast<const float*>(stage);
#pragma unroll
    for (int j = 0; j < Slice::CPT; ++j) {
      load_slice<Slice>(S[j], tile + static_cast<int64_t>(col + j) * Slice::K, c);
    }
    // Every thread is done with the stage, and (FoldItem::run relies on this barrier) the
    // item's step rows are complete in shared memory: refill the stage.
    __syncthreads();
    if (threadIdx.x < 32) {
      const int next = next_live_item(items, item + static_cast<int>(gridDim.x));
      if (next < items.count()) {
        items.fill(bulk, stage, next);
      }
    }
  }
};

/// Persistent fold (common/persistent_stage.cuh): grid = resident CTAs. With `conv_shares` > 0
/// every CTA copies its part of the conv commit after its fold items (conv_shares per (layer,
/// request), handed out round-robin; after the items, since before them it proved slower at
/// large B).
template <int K, FoldRole kRole = FoldRole::kCommit>
__global__ void __launch_bounds__(256, 2)
    fold_persistent_kernel(const __grid_constant__ CommitParams p,
                           const __grid_constant__ FoldDivisors div, int conv_shares) {
  static_assert(kRole == FoldRole::kCommit || kRole == FoldRole::kCommitTracked,
                "the persistent fold folds accepted steps from ring position 0");
  using Item = FoldItem<K, kRole>;
  using Items = FoldPersistentItems<K>;
  __shared__ __align__(16) TileSmem<typename Item::Cfg> sm[2];  // alternate per live item
  __shared__ uint64_t bar;
  extern __shared__ __align__(128) unsigned char stage[];  // FoldStage<K>

  const Items items{p, div};
  clear_shared_before_bulk(stage, FoldStage<K>::kRawk);  // the state tile region
  BulkStage bulk(stage, &bar);
  begin_persistent</*kFirstBeforeWait=*/false>(bulk, items,
                                               [&](int item) { items.fill(bulk, stage, item); });
  int live = 0;  // live items done: they alternate between the two TileSmem buffers
  for (int i = blockIdx.x; i < items.count(); i += gridDim.x) {
    Item item(p, items.coords(i));
    const FoldStagedSource<typename Item::Slice, Items> src{bulk, stage, items, i, item.c};
    live += item.run(sm[live & 1], src) ? 1 : 0;
  }
  const int conv_units = conv_shares * p.num_layers * p.B;  // 0 without the conv commit
  for (int u = blockIdx.x; u < conv_units; u += gridDim.x) {
    const int pair = u / conv_shares;  // layer * B + n
    commit_conv_share<8>(p, pair / p.B, pair % p.B, u - pair * conv_shares, conv_shares);
  }
}

}  // namespace

bool fold_persistent_layout_ok(const CommitParams& p) {
  // Every bulk run 16-byte aligned at both ends (common/persistent_stage.cuh): f32 strides multiple
  // of 4 elements, bf16 ones of 8, V % 8 == 0 (the rawv rows).
  return is_aligned(p.ssm_state, 16) && p.ssm_slot_stride % 4 == 0 && p.ssm_layer_stride % 4 == 0 &&
         p.T <= TileConfig<128, kFoldBlockV>::kChunk && p.V % 8 == 0 &&
         is_aligned(p.ring_rawk, 16) && p.ring_rawk_slot_stride % 8 == 0 &&
         p.ring_rawk_layer_stride % 8 == 0 && is_aligned(p.ring_rawv, 16) &&
         p.ring_rawv_slot_stride % 8 == 0 && p.ring_rawv_layer_stride % 8 == 0 &&
         is_aligned(p.ring_g, 16) && p.ring_g_slot_stride % 4 == 0 &&
         p.ring_g_layer_stride % 4 == 0;
}

template <int K, FoldRole kRole>
void launch_fold_as(const CommitParams& p, cudaStream_t stream, bool with_conv,
                    const LaunchOverrides& o) {
  const int64_t tiles = ceil_div(p.V, kFoldBlockV);
  const size_t stage_bytes = FoldStage<K>::kBytes;
  // Persistent beyond one wave of its CTAs (PersistentFrom::kBeyondOneWave).
  const int64_t items = tiles * p.B * p.num_layers * p.HV;
  const bool possible = fold_persistent_layout_ok(p);
  const int ctas_per_sm =
      o.persistent == PersistentMode::kNever || !possible
          ? 0
          : persistent_ctas_per_sm(reinterpret_cast<const void*>(fold_persistent_kernel<K, kRole>),
                                   kCopyThreads, stage_bytes);
  const int64_t grid = persistent_grid(items, ctas_per_sm, device_caps(), o, possible,
                                       PersistentFrom::kBeyondOneWave);
  const FoldDivisors div{
      FastDivisor(static_cast<uint32_t>(tiles)), FastDivisor(static_cast<uint32_t>(p.B)),
      FastDivisor(static_cast<uint32_t>(p.HV)), FastDivisor(static_cast<uint32_t>(p.HV / p.H))};
  if (grid > 0) {
    // The conv commit in shares of at least one vector per thread, enough of them that the
    // (layer, request) pairs' shares cover the grid.
    const int64_t vecs = 3 * static_cast<int64_t>(qkv_dim(p)) / 8;
    const int64_t fill = ceil_div(grid, static_cast<int64_t>(p.num_layers) * p.B);
    const int64_t most = ceil_div(vecs, kCopyThreads);
    const int conv_shares = with_conv ? static_cast<int>(fill < most ? fill : most) : 0;
    launch_pdl(fold_persistent_kernel<K, kRole>, dim3(static_cast<unsigned>(grid)),
               dim3(kCopyThreads), stage_bytes, stream, o.pdl, p, div, conv_shares);
    return;
  }
  const dim3 grid3(static_cast<unsigned>(tiles), static_cast<unsigned>(p.B),
                   static_cast<unsigned>(p.num_layers * p.HV));
  launch_pdl(fold_kernel<K, kRole>, grid3, dim3(kCopyThreads), 0, stream, o.pdl, p, div, with_conv);
}

template <int K>
void launch_fold(const CommitParams& p, cudaStream_t stream, bool with_conv,
                 const LaunchOverrides& o) {
  if (p.track_slots != nullptr) {
    launch_fold_as<K, FoldRole::kCommitTracked>(p, stream, with_conv, o);
  } else {
    launch_fold_as<K, FoldRole::kCommit>(p, stream, with_conv, o);
  }
}
template void launch_fold<64>(const CommitParams&, cudaStream_t, bool, const LaunchOverrides&);
template void launch_fold<128>(const CommitParams&, cudaStream_t, bool, const LaunchOverrides&);

/// fold_kernel<K, kRole> alone, one CTA per item (the wrapping roles: records at any ring
/// position), with u records where the call replays them (not u-free).
template <int K, FoldRole kRole>
void launch_fold_per_item(const CommitParams& p, cudaStream_t stream, const LaunchOverrides& o) {
  static_assert(role_wraps(kRole), "the eager folds launch through launch_fold_as");
  const int64_t tiles = ceil_div(p.V, kFoldBlockV);
  const FoldDivisors div{
      FastDivisor(static_cast<uint32_t>(tiles)), FastDivisor(static_cast<uint32_t>(p.B)),
      FastDivisor(static_cast<uint32_t>(p.HV)), FastDivisor(static_cast<uint32_t>(p.HV / p.H))};
  const dim3 grid3(static_cast<unsigned>(tiles), static_cast<unsigned>(p.B),
                   static_cast<unsigned>(p.num_layers * p.HV));
  if (p.ring_u != nullptr && p.u_free == 0) {
    launch_pdl(fold_kernel<K, kRole, true>, grid3, dim3(kCopyThreads), 0, stream, o.pdl, p, div,
               false);
  } else {
    launch_pdl(fold_kernel<K, kRole, false>, grid3, dim3(kCopyThreads), 0, stream, o.pdl, p, div,
               false);
  }
}

template <int K>
void launch_materialize(const CommitParams& p, cudaStream_t stream, const LaunchOverrides& o) {
  // The pending folds, then the counts zeroed once every CTA has read them.
  launch_fold_per_item<K, FoldRole::kMaterialize>(p, stream, o);
  launch_drop_pending(p, stream, o);
}
template void launch_materialize<64>(const CommitParams&, cudaStream_t, const LaunchOverrides&);
template void launch_materialize<128>(const CommitParams&, cudaStream_t, const LaunchOverrides&);

template <int K>
void launch_verify_pending_fold(const VerifyParams& v, cudaStream_t stream,
                                const LaunchOverrides& o) {
  launch_fold_per_item<K, FoldRole::kMaterialize>(pending_fold_params(v), stream, o);
}
template void launch_verify_pending_fold<64>(const VerifyParams&, cudaStream_t,
                                             const LaunchOverrides&);
template void launch_verify_pending_fold<128>(const VerifyParams&, cudaStream_t,
                                              const LaunchOverrides&);

template <int K>
void launch_fold_tracks_deferred(const CommitParams& p, cudaStream_t stream,
                                 const LaunchOverrides& o) {
  // The items of untracked requests return at once (tracks are few).
  launch_fold_per_item<K, FoldRole::kTrackOnly>(p, stream, o);
}
template void launch_fold_tracks_deferred<64>(const CommitParams&, cudaStream_t,
                                              const LaunchOverrides&);
template void launch_fold_tracks_deferred<128>(const CommitParams&, cudaStream_t,
                                               const LaunchOverrides&);

template <int K>
void launch_fold_lazy(const CommitParams& p, cudaStream_t stream, const LaunchOverrides& o) {
  // Both read the pending counts and cursors before the conv commit's bookkeeping moves them;
  // the items that fold nothing (most, between the ring's fills) return at once.
  if (p.track_slots != nullptr) {
    launch_fold_per_item<K, FoldRole::kLazyTrack>(p, stream, o);
  }
  launch_fold_per_item<K, FoldRole::kLazy>(p, stream, o);
}
template void launch_fold_lazy<64>(const CommitParams&, cudaStream_t, const LaunchOverrides&);
template void launch_fold_lazy<128>(const CommitParams&, cudaStream_t, const LaunchOverrides&);

}  // namespace kda::kernels
