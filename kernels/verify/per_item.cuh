// per_item.cuh: the per-item verify / extend kernel, one CTA per work item (VerifyItem,
// verify_item.cuh) on the grid (ceil(V/BV), HV, B), reading its inputs straight from global
// memory (GlobalSource), in its two register budgets (VerifySchedule kPerItem, kPerItemWide).
// verify_launch.cuh launches it as the plan says.
#pragma once

#include <cstdint>

#include "kernels/common/persistent_stage.cuh"
#include "kernels/verify/verify_item.cuh"

namespace kda::kernels {

/// The per-item kernel's state stage ([BV][K] f32, static shared memory: with TileSmem under
/// 48 KiB up to BV = 64) for the tiles where one bulk copy proved faster than the threads'
/// own loads into registers: BV = 16 and 64. BV = 8 and 32 keep the register loads, where the
/// stage proved slower (at BV = 32 it does not make the conv history land sooner, and its copy
/// after the norms costs more than it saves). BV = 128's large-B path is the persistent kernel.
/// Thread 0 initialises the barrier and issues the copy (lane 0 of the last warp, which has no
/// channel pair, proved slower). With one CTA per SM (kCtasPerSm = 1) only BV = 16 keeps the
/// stage: there BV = 64's register loads issued after the gates (VerifyItem::run,
/// kLateStateLoads) beat the stage, and BV = 16's do not.
template <int K, int BV, int kCtasPerSm>
struct ItemStateStage {
  static constexpr bool kUsed = BV == 16 || (BV == 64 && kCtasPerSm == 2);
  __align__(128) float tile[kUsed ? BV * K : 4];
  uint64_t bar;
};

/// A verify item's inputs straight from global memory. for_item() computes the request's row
/// addresses from the params alone, so the per-item kernel does that arithmetic before its PDL
/// wait and issues the input loads as soon as the slot check passes.
/// Token t0 + tt of a chunk (t0 a multiple of kChunk) is row + (t0 + tt) * step in 64 bits for
/// the channel pairs and beta logits, and row + t0 * step + tt * step with the chunk-relative
/// part in 32 bits for the gate logits (the launchers check that every row pitch is below 2^28
/// elements, so kChunk pitches fit; the mixed form makes ptxas spill in the unfused BV = 128
/// tile).
template <typename Item, bool kStateStaged>
struct GlobalSource : WeightReads<Item> {
  /// kStateStaged: the kernel's ItemStateStage::kUsed (kPerItemStagedState).
  static constexpr ItemSource kSource =
      kStateStaged ? ItemSource::kGlobalStagedState : ItemSource::kGlobal;
  using Slice = typename Item::Slice;

  const bf16_t* x_row;  ///< token 0 of the request at the thread's channel pair: mixed_qkv
                        ///< (fused) or qkv_act (unfused)
  const bf16_t* a_row;  ///< token 0's gate logit of (v-head hv, key gate_key)
  const bf16_t* b_row;  ///< token `tid`'s beta logit of v-head hv
  int32_t x_step, a_step, b_step;  ///< row pitches (elements)
  int32_t slot_, row_;             ///< the request's slot and scratch row (load_indices)
  /// kPerItemStagedState: the state tile arrives as one bulk copy into `stage` ([BV][K] f32 in
  /// shared memory, barrier in `bulk`), issued by thread 0 (ItemStateStage) as soon as the slot is
  /// known, and every thread copies its columns to registers after the norms, so the tile does
  /// not hold registers through the prologue. Otherwise the threads load it into registers
  /// with the other inputs. (The launchers check that ssm_state and its slot pitch are 16-byte
  /// multiples, so the tile — contiguous columns v0 .. v0 + BV - 1 — is always bulk-copyable.)
  BulkStage* bulk;
  const float* stage;

  static __device__ __forceinline__ GlobalSource for_item(const Item& it) {
    const VerifyParams& p = it.p;
    const int64_t row0 = it.first_row();                              // the request's first row
    const int64_t pair = it.pair_channel >= 0 ? it.pair_channel : 0;  // no pair: never read
    GlobalSource s{};
    if constexpr (Item::kFused) {
      s.x_row = p.mixed_qkv + row0 * p.mixed_qkv_stride + pair;
      s.x_step = static_cast<int32_t>(p.mixed_qkv_stride);
    } else {
      s.x_row = p.qkv_act + row0 * it.D + pair;
      s.x_step = static_cast<int32_t>(it.D);
    }
    s.a_row = p.a + row0 * p.a_stride + it.gate_index;
    s.a_step = static_cast<int32_t>(p.a_stride);
    s.b_row = p.b + (row0 + it.tid) * p.b_stride + it.hv;
    s.b_step = static_cast<int32_t>(p.b_stride);
    return s;
  }

  /// The request's slot and scratch row, read before the PDL wait: the index arrays are
  /// inputs of the call that the kernel launched just before on the stream does not write
  /// (kda_kernels.h), so their load latency overlaps that kernel's tail instead of adding a
  /// memory round trip before every other load. rows[n] of a padding row is
  /// read (an in-bounds int) but never used.
  __device__ __forceinline__ void load_indices(const Item& it) {
    slot_ = it.p.slots[it.n];
    row_ = it.args.extend != 0 ? 0 : it.p.rows[it.n];
  }
  __device__ __forceinline__ int slot(const Item&) const { return slot_; }
  __device__ __forceinline__ int row(const Item&) const { return row_; }
  /// Start of a live item's work (after the padding check).
  __device__ __forceinline__ void begin(const Item&) const {}
  /// The item's token inputs have been read by every thread (the persistent kernel's prefetch
  /// point).
  __device__ __forceinline__ void inputs_consumed(const Item&) const {}
  /// Conv history row j (oldest first) of the pair (raw bits).
  __device__ __forceinline__ uint32_t hist(const Item& it, int slot, int j) const {
    return ld_bf16x2_bits(it.p.conv_state + slot * it.p.conv_state_slot_stride + it.pair_channel +
                          j * it.D);
  }
  /// The pair's raw input (fused: mixed_qkv) or activation (unfused: qkv_act) of token
  /// t0 + tt.
  __device__ __forceinline__ uint32_t x(const Item&, int t0, int tt) const {
    return ld_bf16x2_bits(x_row + (t0 + tt) * static_cast<int64_t>(x_step));
  }
  /// Gate logit of token t0 + tt, key channel gate_key.
  __device__ __forceinline__ uint32_t a(const Item&, int t0, int tt) const {
    return ld_bf16_bits(a_row + static_cast<int64_t>(t0) * a_step + tt * a_step);
  }
  /// Beta logit of token t0 + tid (threads tid < the chunk's tokens).
  __device__ __forceinline__ uint32_t b(const Item&, int t0) const {
    return ld_bf16_bits(b_row + static_cast<int64_t>(t0) * b_step);
  }
  __device__ __forceinline__ void load_state(const Item& it, ColRegs<Slice> (&S)[Slice::CPT],
                                             const bool (&ok)[Slice::CPT],
                                             const float* head) const {
    load_state_columns<Slice>(S, ok, head, it.col0, it.c);
  }
  /// Thread 0 (which initialised the barrier): the tile's columns v0 .. v0 + cols - 1 of the
  /// head at `head`, one bulk copy.
  __device__ __forceinline__ void issue_state_copy(const Item& it, const float* head) const {
    if (threadIdx.x == 0) {
      const int cols = min(Item::Cfg::BV, it.p.V - it.v0);
      bulk->issue({0u, head + static_cast<int64_t>(it.v0) * Slice::K,
                   static_cast<uint32_t>(cols * Slice::K * sizeof(float))});
      bulk->arrive();
    }
  }
  /// The pending fold's columns (item_fold.cuh), in global memory: the committed state (the
  /// unfolded column first, then this thread's own stores to ssm_fold_out, the same memory).
  template <typename Column>
  __device__ __forceinline__ void fold_column_in(const Item& it, ColRegs<Column>& S, int slot,
                                                 int col, bool) const {
    load_column<Column>(S, fold_column(it, slot, col), it.c);
  }
  template <typename Column>
  __device__ __forceinline__ void fold_column_out(const Item& it, const ColRegs<Column>& S,
                                                  int slot, int col) const {
    store_column<Column>(const_cast<float*>(fold_column(it, slot, col)), S, it.c);
  }
  /// The fold's first records are in flight (item_fold.cuh): its columns come from global memory,
  /// which needs no wait.
  __device__ __forceinline__ void fold_records_issued(const Item&) const {}
  /// After the fold: a bulk-copied tile (kPerItemStagedState) is read through the async proxy,
  /// so the stores are fenced for it and every thread's are done before thread 0 issues the
  /// copy. Register loads re-read their own thread's stores.
  __device__ __forceinline__ void fold_done(const Item&, int) const {
    if constexpr (stages_state(kSource)) {
      fence_proxy_async_global();
      __syncthreads();
    }
  }
  static __device__ __forceinline__ const float* fold_column(const Item& it, int slot, int col) {
    return it.p.ssm_fold_out + slot * it.p.ssm_slot_stride +
           (static_cast<int64_t>(it.hv) * it.p.V + col) * Slice::K;
  }
  /// Every thread: waits for the copy, then its columns to registers (zeros past V).
  __device__ __forceinline__ void state_from_stage(const Item& it, ColRegs<Slice> (&S)[Slice::CPT],
                                                   const bool (&ok)[Slice::CPT]) const {
    bulk->wait();
#pragma unroll
    for (int j = 0; j < Slice::CPT; ++j) {
      if (ok[j]) {
        load_slice<Slice>(S[j], stage + static_cast<int64_t>(it.col0 - it.v0 + j) * Slice::K, it.c);
      } else {
        zero_column<Slice>(S[j]);
      }
    }
  }
};

/// One CTA per item, grid (ceil(V/BV), HV, B): the inputs come straight from global memory
/// (lowest latency: the small-B path). Schedule kPerItem: 128 registers per thread, so that two
/// CTAs share an SM; kPerItemWide, the one-CTA-per-SM form (planned in ring mode and extend when
/// the grid fits one CTA per SM, or kWideFusedMaxWaves of them for the fused BV = 128 tile, ahead
/// of the persistent kernel): the ring-mode steps grouped and the other wide-register choices of
/// VerifyItem::run, up to 255 registers (the deferred BV = 32 tile: 128,
/// TileConfig::kMinCtasPerSm).
/// kDeferredFold: a call with ring_pending (the deferred commit's fold first, item_fold.cuh, before
/// the PDL wait with VerifyParams::fold_before_wait: run() enters PDL around it); the
/// eager instantiation carries none of that code.
/// kExtendTracks: extend with prefix-cache tracks.
template <typename Traits>
__global__ void __launch_bounds__(
    256, TileConfig<Traits::K, Traits::BV, Traits::kWide, Traits::kDeferred>::kMinCtasPerSm)
    verify_tile_kernel(const __grid_constant__ TileArgs args) {
  static_assert(!is_persistent(Traits::kSchedule), "verify_tile_kernel runs per-item schedules");
  using Item = VerifyItem<Traits>;
  using Stage = ItemStateStage<Traits::K, Traits::BV, Traits::kWide ? 1 : 2>;
  static_assert(sizeof(TileSmem<typename Item::Cfg>) + sizeof(Stage) + 128 <= 48 * 1024,
                "static shared memory (tile + state stage, with alignment) over 48 KiB");
  __shared__ __align__(16) TileSmem<typename Item::Cfg> sm;
  __shared__ __align__(128) Stage state_stage;
  const int hv = static_cast<int>(blockIdx.y);
  Item item(args, {static_cast<int>(blockIdx.z), hv, static_cast<int>(args.div.group.div(hv)),
                   static_cast<int>(blockIdx.x)});
  // TileArgs::trigger_at_entry (only the one-CTA-per-SM forms take it: the others spill with it).
  if constexpr (Traits::kDeferred && Item::Cfg::kMinCtasPerSm == 1) {
    if (args.trigger_at_entry != 0) {
      pdl_launch_dependents();
    }
  }
  // Before the PDL wait (overlapping the previous kernel's tail): the row addresses, the
  // weights and gate constants, the slot and scratch-row indices.
  auto src = GlobalSource<typename Item::Prologue, Stage::kUsed>::for_item(item);
  BulkStage bulk(state_stage.tile, &state_stage.bar);
  if constexpr (Stage::kUsed) {
    bulk.init();  // thread 0, which also issues the copy
    src.bulk = &bulk;
    src.stage = state_stage.tile;
  }
  item.load_constants(src);
  src.load_indices(item);
  if constexpr (Stage::kUsed) {
    // The barrier is initialised. Before the wait, this overlaps the previous kernel in the
    // two-per-SM form; without it racecheck flags the copy's arrive against the init.
    __syncthreads();
  }
  // The committed state and the activations come from earlier kernels: wait for them (a
  // kDeferredFold item waits in run(), around its pending fold).
  if constexpr (!Traits::kDeferred) {
    pdl_enter();
  }
  item.run(sm, src);
}

}  // namespace kda::kernels
