// verify/persistent.cuh: the large-B verify kernel. Persistent CTAs (grid = resident CTAs) walk
// the (request, v-head, V tile) items; each item's state tile (BV x K f32, 64 KiB at
// K = BV = 128) arrives in a shared-memory stage through a TMA bulk copy
// (common/persistent_stage.cuh) issued while the previous item computes, and is copied to registers
// after the prologue. The item's raw inputs (token channels, conv history, gate logits: ItemInputs)
// arrive the same way one item ahead, through per-thread cp.async into a double buffer, so the
// prologue reads shared memory instead of waiting on three global round trips. Weights, gate
// constants and beta logits are read as in verify_tile_kernel, and the arithmetic is VerifyItem's
// (verify_item.cuh), so the bits equal verify_tile_kernel's. Streamable (checked by the launcher,
// else verify_tile_kernel runs): sm_90+, verify (not extend), T <= kChunk, state 16-byte aligned
// with a slot stride that is a multiple of 4, and the inputs copyable in 16-byte pieces
// (stream_layout_ok).
#pragma once

#include "kernels/common/persistent_stage.cuh"
#include "kernels/verify/verify_item.cuh"

namespace kda::kernels {

/// Bytes of the state stage: one BV x K f32 tile.
template <int K, int BV>
inline constexpr size_t kStateStageBytes = static_cast<size_t>(BV) * K * sizeof(float);

/// The items in a persistent CTA's order: item = (n*HV + hv)*tiles + tile.
template <int K, int BV>
struct VerifyPersistentItems {
  const VerifyParams& p;
  const ItemDivisors& div;
  __device__ int count() const { return p.B * p.HV * static_cast<int>(div.tiles.divisor); }
  __device__ int n_of(int item) const {
    return static_cast<int>(div.heads.div(div.tiles.div(static_cast<uint32_t>(item))));
  }
  __device__ ItemCoords coords(int item) const {
    uint32_t rest, tile, n, hv;
    div.tiles.divmod(static_cast<uint32_t>(item), rest, tile);
    div.heads.divmod(rest, n, hv);
    return {static_cast<int>(n), static_cast<int>(hv), static_cast<int>(div.group.div(hv)),
            static_cast<int>(tile)};
  }
  __device__ bool live(int item) const { return p.slots[n_of(item)] >= 0; }
  /// The item's state tile: min(BV, V - v0) columns x K f32, contiguous.
  __device__ BulkRun state_run(const ItemCoords& at, int slot) const {
    const int v0 = at.tile * BV;
    return {0u,
            p.ssm_state + slot * p.ssm_slot_stride + (static_cast<int64_t>(at.hv) * p.V + v0) * K,
            static_cast<uint32_t>(min(BV, p.V - v0) * K * sizeof(float))};
  }
};

/// The next live item, planned by the planner thread (kPlanner) at the start of an item (when
/// no state is live in registers): its state run is issued once the stage is free, its inputs
/// once this item has read its own (VerifyItem::run calls src.inputs_consumed()), and every
/// thread takes its coordinates and slot from here when it gets to it (no division and no
/// dependent slot load at the item's top). Written after an item's first barrier, read until
/// the next live item's first barrier.
struct NextRun {
  BulkRun run;
  int valid;
  int item;  ///< its index (valid != 0)
  ItemCoords at;
  int slot;
  ShapedRows<true> rows;  ///< its request's token rows (the ragged kernel only)
};

/// The thread that plans the next item: lane 0 of the last warp, which has no conv channel pair
/// at K = 128 (192 pairs) or K = 64 (kPairs <= 224), so the planning's dependent slot loads do
/// not delay a conv warp (the gate barrier waits for the slowest conv warp).
inline constexpr int kPlanner = 224;

/// The raw inputs of one live verify item in shared memory. Row j < 3: conv history row j
/// (fused only); row 3 + t: token t. A row holds the item's channels in VerifyItem's local
/// order — q of k-head h (K) | k of k-head h (K) | the V tile (BV) — so a thread's channel pair
/// sits at its ch_local. a[t][k]: gate logit of (token t, v-head hv, key k).
template <int K, int BV, int kChunk>
struct ItemInputs {
  static constexpr int kRow = 2 * K + BV;
  static constexpr int kPieces = kRow / 8;  ///< 16-byte pieces per row
  bf16_t x[kConvHistory + kChunk][kRow];
  bf16_t a[kChunk][K];
};

/// Every thread: puts the copies of item `at`'s inputs into `dst` in flight (pieces past V
/// are skipped; they are never read). A thread copies one 16-byte piece of the row (so one
/// channel offset) in every kRowsPerPass-th row, so its channel is decoded once per item, not
/// once per piece. kShaped (a ragged call): the request's T_n tokens from row `rows.shaped_row0`;
/// else T tokens from row n * T.
template <bool FUSED, int K, int BV, int kChunk, bool kShaped>
__device__ __forceinline__ void prefetch_item_inputs(ItemInputs<K, BV, kChunk>& dst,
                                                     const VerifyParams& p, const ItemCoords& at,
                                                     int slot, const ShapedRows<kShaped>& rows) {
  using In = ItemInputs<K, BV, kChunk>;
  constexpr int kThreads = TileConfig<K, BV>::kThreads;  // the kernel's blockDim.x
  constexpr int kRowsPerPass = kThreads / In::kPieces;
  static_assert(kRowsPerPass >= 1, "a row's pieces fit one pass");
  const int tid = static_cast<int>(threadIdx.x);
  const int off = tid % In::kPieces * 8;
  const int v0 = at.tile * BV;
  const int64_t D = qkv_dim(p);
  const int64_t HK = static_cast<int64_t>(p.H) * K;
  // The request's first token row and token count, evaluated where used (the dense kernels'
  // p.T from the parameter bank: held in registers, it made the K = 64 kernels spill).
  const auto row0 = [&]() -> int64_t {
    if constexpr (kShaped) {
      return rows.shaped_row0;
    } else {
      return static_cast<int64_t>(at.n) * p.T;
    }
  };
  const auto tokens = [&]() -> int {
    if constexpr (kShaped) {
      return rows.shaped_tokens;
    } else {
      return p.T;
    }
  };
  // The piece's channel: q or k of k-head h, or the V tile's (none past V).
  int64_t pair_channel = -1;
  if (off < 2 * K) {
    pair_channel = (off / K) * HK + static_cast<int64_t>(at.h) * K + off % K;
  } else if (v0 + off - 2 * K < p.V) {
    pair_channel = 2 * HK + static_cast<int64_t>(at.hv) * p.V + v0 + off - 2 * K;
  }
  if (pair_channel >= 0 && tid < kRowsPerPass * In::kPieces) {
    const bf16_t* hist =
        p.conv_state + slot * p.conv_state_slot_stride + pair_channel;  // + row * D
    const int64_t tok_pitch = FUSED ? p.mixed_qkv_stride : D;
    const bf16_t* tok =
        (FUSED ? p.mixed_qkv : p.qkv_act) + row0() * tok_pitch + pair_channel;  // + t * tok_pitch
    const int first_row = FUSED ? 0 : kConvHistory;
    for (int row = first_row + tid / In::kPieces; row < kConvHistory + tokens();
         row += kRowsPerPass) {
      const bf16_t* src =
          row < kConvHistory ? hist + row * D : tok + (row - kConvHistory) * tok_pitch;
      cp_async<16>(&dst.x[row][off], src);
    }
  }
  for (int idx = tid; idx < tokens() * (K / 8); idx += kThreads) {
    const int t = idx / (K / 8);
    const int a_off = idx % (K / 8) * 8;
    cp_async<16>(&dst.a[t][a_off],
                 p.a + (row0() + t) * p.a_stride + static_cast<int64_t>(at.hv) * K + a_off);
  }
}

/// A verify item's inputs: the state tile from the stage, the token channels, conv history
/// and gate logits from `cur` (ItemInputs), the weights through WeightReads, the slot and the beta
/// logits from global memory.
/// begin() plans the next live item; inputs_consumed() prefetches its inputs into `nxt`;
/// load_state() waits for this item's tile, copies it to registers and refills the stage.
template <typename Item, RecordMode kMode>
struct StagedSource : WeightReads<Item> {
  /// One schedule per record mode: the ring kernel carries no snapshot code and the snapshot
  /// kernel no ring code (fewer registers held). The ring kernel's forms, which make the
  /// snapshot kernel spill: the stage refilled by warp 0 alone (load_state) and the trees'
  /// cross-lane levels as reduce-scatters on swizzled columns (item_steps.cuh).
  static constexpr ItemSource kSource =
      kMode == RecordMode::kRing ? ItemSource::kPersistentRing : ItemSource::kPersistentSnapshot;
  using Slice = typename Item::Slice;
  using Cfg = typename Item::Cfg;
  using Items = VerifyPersistentItems<Cfg::K, Cfg::BV>;
  using Inputs = ItemInputs<Cfg::K, Cfg::BV, Cfg::kChunk>;
  static_assert(kPlanner >= Cfg::kPairs && kPlanner < Cfg::kThreads,
                "the planner thread has no channel pair");

  const float* stage;
  BulkStage& bulk;
  NextRun& next;
  const Items& items;
  int item;   // this item's index
  int slot_;  // this item's slot (< 0: padding)
  const Inputs* cur;
  Inputs* nxt;

  __device__ __forceinline__ int slot(const Item&) const { return slot_; }
  __device__ __forceinline__ int row(const Item& it) const { return it.p.rows[it.n]; }
  /// Start of a live item's work: plans the next live item (kPlanner).
  __device__ __forceinline__ void begin(const Item&) const {
    if (threadIdx.x == kPlanner) {
      const int nx = next_live_item(items, item + static_cast<int>(gridDim.x));
      next.valid = nx < items.count();
      if (next.valid) {
        next.item = nx;
        next.at = items.coords(nx);
        next.slot = items.p.slots[next.at.n];
        next.run = items.state_run(next.at, next.slot);
        if constexpr (Item::kDraftShape) {
          next.rows = shaped_rows_of<true>(items.p, next.at.n);
        }
      }
    }
  }
  /// The conv window of token tt (rows tt .. tt+2: history rows, then earlier tokens).
  __device__ __forceinline__ void window(const Item& it, int tt, float (&w0)[3],
                                         float (&w1)[3]) const {
#pragma unroll
    for (int j = 0; j < kConvHistory; ++j) {
      const float2 h = ld_bf16x2(&cur->x[tt + j][it.ch_local]);
      w0[j] = h.x;
      w1[j] = h.y;
    }
  }
  /// Token tt's channels and gate logits from `cur` (t0 = 0: one chunk); the beta logit of
  /// token t0 + tid from global memory (one scalar per token).
  __device__ __forceinline__ uint32_t x(const Item& it, int, int tt) const {
    return ld_bf16x2_bits(&cur->x[kConvHistory + tt][it.ch_local]);
  }
  __device__ __forceinline__ uint32_t a(const Item& it, int, int tt) const {
    return ld_bf16_bits(&cur->a[tt][it.gate_key]);
  }
  __device__ __forceinline__ uint32_t b(const Item& it, int t0) const {
    if constexpr (Item::kDraftShape) {
      return ld_bf16_bits(it.p.b + (it.first_row() + t0 + it.tid) * it.p.b_stride + it.hv);
    } else {
      return ld_bf16_bits(
          it.p.b + (static_cast<int64_t>(it.n) * it.p.T + t0 + it.tid) * it.p.b_stride + it.hv);
    }
  }
  /// After the barrier that follows the last read of `cur` (every thread; `next` is visible).
  __device__ __forceinline__ void inputs_consumed(const Item& it) const {
    if (next.valid != 0) {
      prefetch_item_inputs<Item::kFused, Cfg::K, Cfg::BV, Cfg::kChunk, Item::kDraftShape>(
          *nxt, it.p, next.at, next.slot, planned_rows());
    }
  }
  /// The next item's request rows (NextRun::rows; empty for the dense kernels).
  __device__ __forceinline__ ShapedRows<Item::kDraftShape> planned_rows() const {
    if constexpr (Item::kDraftShape) {
      return next.rows;
    } else {
      return {};
    }
  }
  /// The pending fold's columns (item_fold.cuh), in the stage, which holds the item's tile once
  /// its fill has landed (unswizzled: the fold's own layout); fold_done sends the folded tile to
  /// the committed state.
  template <typename Column>
  __device__ __forceinline__ void fold_column_in(const Item& it, ColRegs<Column>& S, int, int col,
                                                 bool first_chunk) const {
    if (first_chunk) {
      bulk.wait_landed();
    }
    load_slice<Column>(S, stage + static_cast<int64_t>(col - it.v0) * Slice::K, it.c);
  }
  template <typename Column>
  __device__ __forceinline__ void fold_column_out(const Item& it, const ColRegs<Column>& S,
                                                  int slot, int col) const {
    store_slice<Column>(const_cast<float*>(stage) + static_cast<int64_t>(col - it.v0) * Slice::K, S,
                        it.c);
  }
  /// The stage's generic-proxy stores are fenced for the async proxy and complete for every
  /// thread (load_state's swizzled columns read other threads' stores); then thread 0 writes the
  /// folded tile to the committed state with one bulk store (the vector stores it replaced were
  /// the largest part of the deferred verify's fold at large B). Thread 0 waits
  /// for it to have read the stage before the stage's refill (load_state) and for its completion
  /// before the CTA exits (verify_persistent_kernel).
  __device__ __forceinline__ void fold_done(const Item& it, int slot) const {
    fence_proxy_async_shared();
    __syncthreads();
    if (threadIdx.x == 0) {
      bulk_store(it.p.ssm_fold_out + slot * it.p.ssm_slot_stride +
                     (static_cast<int64_t>(it.hv) * it.p.V + it.v0) * Slice::K,
                 stage, static_cast<uint32_t>(min(Cfg::BV, it.p.V - it.v0) * Slice::K * 4));
    }
  }
  /// The stage always holds BV columns, so every column is copied: the ones past V hold zeros
  /// (verify_persistent_kernel clears the stage first) or an earlier item's state, and they are
  /// never stored (columns do not mix in the recurrence), so they need no zeroing in registers.
  __device__ __forceinline__ void load_state(const Item& it, ColRegs<Slice> (&S)[Slice::CPT],
                                             const bool (&)[Slice::CPT], const float*) const {
    bulk.wait();
    const int swz = it.template column_swizzle_of<StagedSource>();
#pragma unroll
    for (int j = 0; j < Slice::CPT; ++j) {
      load_slice<Slice>(S[j], stage + static_cast<int64_t>(it.col0 - it.v0 + (j ^ swz)) * Slice::K,
                        it.c);
    }
    // Every thread is done with the stage, `next` is written, and (VerifyItem::run relies on
    // this barrier) the item's q/k norms are complete: refill.
    __syncthreads();
    // Ring kernel: warp 0 alone reads `next` and runs the fill's predicated asm, so the other
    // warps skip its instructions. The snapshot kernel keeps every thread on it
    // (is_persistent_ring(kSource)).
    if (!is_persistent_ring(kSource) || threadIdx.x < 32) {
      if constexpr (Item::kDeferredCommit) {
        if (threadIdx.x == 0) {
          bulk_store_wait_read();  // the folded tile's bulk store (fold_done) has read the stage
        }
      }
      bulk.fill_one_if(threadIdx.x == 0 && next.valid != 0, next.run);
    }
  }
};

/// The persistent verify (schedules kPersistentRing / kPersistentSnapshot fix the record mode).
/// kDeferredFold (ring mode only): a call with ring_pending (the deferred commit's fold first).
/// kRaggedRows (fused, ring mode only): a ragged chain (VerifyParams::token_offsets; not a tree):
/// request n's T_n tokens from row token_offsets[n], read with the slot (the planner's
/// NextRun::rows).
template <typename Traits>
__global__ void __launch_bounds__(256, 2)
    verify_persistent_kernel(const __grid_constant__ TileArgs args) {
  static_assert(is_persistent(Traits::kSchedule), "verify_persistent_kernel: a persistent plan");
  constexpr RecordMode kMode = Traits::kSchedule == VerifySchedule::kPersistentRing
                                   ? RecordMode::kRing
                                   : RecordMode::kSnapshot;
  constexpr bool FUSED = Traits::kFused;
  constexpr bool kDeferred = Traits::kDeferred;
  constexpr bool kShaped = Traits::kShaped;
  constexpr int K = Traits::K;
  constexpr int BV = Traits::BV;
  using Item = VerifyItem<Traits>;
  using Src = StagedSource<typename Item::Prologue, kMode>;
  __shared__ __align__(16) TileSmem<typename Item::Cfg> sm;
  __shared__ uint64_t bar;
  __shared__ NextRun next;
  extern __shared__ __align__(128) unsigned char dyn_smem[];  // state stage, then 2 ItemInputs

  const VerifyParams& p = args.p;
  using Inputs = typename Src::Inputs;
  float* stage = reinterpret_cast<float*>(dyn_smem);                               // BV x K f32
  Inputs* inputs = reinterpret_cast<Inputs*>(dyn_smem + kStateStageBytes<K, BV>);  // [2]
  const typename Src::Items items{p, args.div};
  clear_shared_before_bulk(stage, kStateStageBytes<K, BV>);  // see StagedSource::load_state
  BulkStage bulk(stage, &bar);
  // The first item's inputs go out before its state tile: its prologue needs only the inputs,
  // and with the tile's 64 KiB ahead of them in the memory queue (every CTA fills at once) the
  // first prologue would wait behind it. The tile lands during the prologue.
  const int first = begin_persistent</*kFirstBeforeWait=*/true>(bulk, items, [](int) {});
  if (first < items.count()) {
    const ItemCoords at = items.coords(first);
    const int slot = p.slots[at.n];
    prefetch_item_inputs<FUSED, K, BV, Item::Cfg::kChunk, kShaped>(
        inputs[0], p, at, slot, shaped_rows_of<kShaped>(p, at.n));
    __syncthreads();  // every thread's input copies are issued
    if (threadIdx.x < 32) {
      bulk.fill([&](int) { return items.state_run(at, slot); }, 1);
    }
  }
  int live = 0;  // live items done: their inputs alternate between the two buffers
  for (int i = blockIdx.x; i < items.count(); i += gridDim.x) {
    // A live item after the first was planned during the previous live item (NextRun); the
    // others (the first, padding) are decoded here.
    const bool planned = live > 0 && next.valid != 0 && next.item == i;
    const ItemCoords at = planned ? next.at : items.coords(i);
    ShapedRows<kShaped> rows;
    if constexpr (kShaped) {
      rows = planned ? next.rows : shaped_rows_of<true>(p, at.n);
    }
    Item item(args, at, rows);
    const int slot = planned ? next.slot : p.slots[item.n];
    const Src src{
        {}, stage, bulk, next, items, i, slot, &inputs[live & 1], &inputs[(live + 1) & 1]};
    // The gate constants before the barrier: their loads overlap the wait for the slowest warp
    // instead of stalling every warp after it. The conv taps and the scratch row stay after
    // it: read here, they make ptxas spill in the fused and unfused kernels.
    item.load_constants(src);
    if (slot >= 0) {
      cp_async_wait_all();
      __syncthreads();  // every thread's copies of this item's inputs have landed
    }
    item.run(sm, src);
    live += slot >= 0 ? 1 : 0;
  }
  if constexpr (kDeferred) {
    if (threadIdx.x == 0) {
      bulk_store_wait();  // the folded tiles are in the committed state before the CTA exits
    }
  }
}

/// Dynamic shared memory of verify_persistent_kernel: the state stage and two ItemInputs.
template <int K, int BV>
inline constexpr size_t kVerifyPersistentSmemBytes =
    kStateStageBytes<K, BV> + 2 * sizeof(ItemInputs<K, BV, TileConfig<K, BV>::kChunk>);
static_assert(two_ctas_fit_per_sm(kVerifyPersistentSmemBytes<128, 128> +
                                  sizeof(TileSmem<TileConfig<128, 128>>) + sizeof(uint64_t) +
                                  sizeof(NextRun)),
              "verify_persistent_kernel: two CTAs per SM (the largest tile, K = BV = 128)");

}  // namespace kda::kernels
