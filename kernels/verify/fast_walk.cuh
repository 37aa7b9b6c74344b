// fast_walk.cuh: the fast-output verify beyond one wave (contract §10; VerifySchedule::kFastChunk
// with VerifyPlan::grid < items): the resident CTAs, two per SM, walk the items
// b, b + gridDim.x, ... (item = (n * HV + hv) * tiles + tile), and each item's copies run under
// the previous item's work:
//   - its raw inputs (conv history, token channels, gate logits: ItemInputs, verify/persistent.cuh)
//     go to shared memory (cp.async) once the previous item's prologue has read its own, so the
//     prologue reads shared memory instead of waiting on global round trips;
//   - its state tile goes to the stage once the previous item's contraction is done with it.
// FastItem::run does the arithmetic of the per-item kernel on the same values (FastWalkSource
// hands over the same bits from shared memory), so the outputs are bitwise the same at every
// grid. Walkable (fast_walk_possible): not a lazy call, T <= kChunk (one ItemInputs), and the
// inputs copyable in 16-byte pieces (persistent_layout_ok).
// cp.async groups, in commit order: [the item's inputs] [its state tile] for the first item (and
// one after a padding row); then per item i: [the inputs of i + 1, or none] after i's prologue,
// [the state tile of i + 1, or none] after i's contraction. So at an item's top all but the newest
// group have landed once its inputs have, and before its contraction all but the newest once its
// tile has: cp_async_wait_group<1> at both points.
#pragma once

#include "kernels/verify/fast_item.cuh"
#include "kernels/verify/persistent.cuh"

namespace kda::kernels {

/// The walk's shared memory: the per-item kernel's FastSmem for up to kChunk tokens, then one
/// ItemInputs.
template <int K, int BV>
struct FastWalkSmem {
  using Inputs = ItemInputs<K, BV, TileConfig<K, BV>::kChunk>;
  static constexpr size_t kInputsOffset = FastSmem<K, BV>::bytes(TileConfig<K, BV>::kChunk);
  static constexpr size_t kBytes = kInputsOffset + sizeof(Inputs);
};
static_assert(two_ctas_fit_per_sm(FastWalkSmem<128, 128>::kBytes + sizeof(int)),
              "the fast walk: two CTAs per SM (the largest tile, K = BV = 128)");

/// The fast kernel's items: item = (n * HV + hv) * tiles + tile.
__device__ __forceinline__ ItemCoords fast_item_coords(const ItemDivisors& div, int item) {
  uint32_t rest, tile, n, hv;
  div.tiles.divmod(static_cast<uint32_t>(item), rest, tile);
  div.heads.divmod(rest, n, hv);
  return ItemCoords{static_cast<int>(n), static_cast<int>(hv), static_cast<int>(div.group.div(hv)),
                    static_cast<int>(tile)};
}

/// The walk's source: the token channels, conv history and gate logits from the ItemInputs in
/// shared memory (the bits GlobalSource reads from global memory), the rest as GlobalSource; the
/// next item's copies issued at run's two hand-over points.
template <typename Item>
struct FastWalkSource : GlobalSource<Item, false> {
  using Cfg = typename Item::Cfg;
  using Inputs = ItemInputs<Cfg::K, Cfg::BV, Cfg::kChunk>;
  Inputs* in;
  const int* next_slot;  ///< the next item's slot (-1: none or a padding row), in shared memory
  int next_item;

  __device__ __forceinline__ uint32_t hist(const Item& it, int, int j) const {
    return ld_bf16x2_bits(&in->x[j][it.ch_local]);
  }
  __device__ __forceinline__ uint32_t x(const Item& it, int t0, int tt) const {
    return ld_bf16x2_bits(&in->x[kConvHistory + t0 + tt][it.ch_local]);
  }
  __device__ __forceinline__ uint32_t a(const Item& it, int t0, int tt) const {
    return ld_bf16_bits(&in->a[t0 + tt][it.gate_key]);
  }
  /// The inputs are in shared memory already: read where the conv needs them.
  static constexpr bool kEarlyInputs = false;
  __device__ __forceinline__ bool stages_own_tile() const { return false; }
  /// The walk's tiles are staged under the previous item's work: never late.
  __device__ __forceinline__ bool late_tile(const TileArgs&) const { return false; }
  /// Every thread is past the barrier after the item's last read of `in`: the next item's inputs.
  __device__ __forceinline__ void inputs_consumed(const Item& it) const {
    const int slot = *next_slot;
    if (slot >= 0) {
      const ItemCoords at = fast_item_coords(it.args.div, next_item);
      prefetch_item_inputs<true, Cfg::K, Cfg::BV, Cfg::kChunk, Item::kDraftShape>(
          *in, it.p, at, slot, shaped_rows_of<Item::kDraftShape>(it.p, at.n));
    }
    cp_async_commit();
  }
  /// The item's tile has landed (the next item's inputs may still be in flight).
  __device__ __forceinline__ void wait_state() const { cp_async_wait_group<1>(); }
  /// Every thread is past the contraction's last barrier: the next item's state tile.
  template <typename FastItemT>
  __device__ __forceinline__ bool state_consumed(const FastItemT& it, float* stage) const {
    const int slot = *next_slot;
    if (slot >= 0) {
      const ItemCoords at = fast_item_coords(it.args.div, next_item);
      const int v0 = at.tile * Cfg::BV;
      it.stage_tile(stage, FastItemT::tile_head(it.p, slot, at.hv, v0), min(Cfg::BV, it.p.V - v0));
    }
    cp_async_commit();
    return slot >= 0;
  }
};

/// The walk (the header). Before the PDL wait it reads the first item's weights, gate constants
/// and slot / row indices, as the per-item kernel does.
template <typename Traits>
__global__ void __launch_bounds__(256, 2)
    verify_fast_walk_kernel(const __grid_constant__ TileArgs args) {
  static_assert(Traits::kSchedule == VerifySchedule::kFastChunk, "the fast-chunk schedule");
  static_assert(!Traits::kLazy, "a lazy call's chunk does not fit one ItemInputs");
  static_assert(!Traits::kDeferred, "a walking call's pending steps are folded first");
  using Item = FastItem<Traits>;
  using Prologue = typename Item::Prologue;
  using Smem = FastWalkSmem<Traits::K, Traits::BV>;
  using Src = FastWalkSource<Prologue>;
  extern __shared__ __align__(128) unsigned char fast_smem[];
  __shared__ int next_slot;  // thread 0 writes it at an item's top; run reads it after barriers
  const VerifyParams& p = args.p;
  auto* const inputs = reinterpret_cast<typename Smem::Inputs*>(fast_smem + Smem::kInputsOffset);
  float* const stage = reinterpret_cast<float*>(fast_smem);
  const int count = p.B * p.HV * static_cast<int>(args.div.tiles.divisor);
  const int stride = static_cast<int>(gridDim.x);
  bool ready = false;  // this item's inputs and tile are in flight (issued by the previous item)
  for (int i = static_cast<int>(blockIdx.x); i < count; i += stride) {
    const bool first = i == static_cast<int>(blockIdx.x);
    if (!first) {
      __syncthreads();  // the previous item is done with the shared memory and next_slot
    }
    const ItemCoords at = fast_item_coords(args.div, i);
    // The thread index read afresh: none of the previous item's index arithmetic stays live.
    Item it(args, at, thread_index_opaque());
    Src src{Src::for_item(it), inputs, &next_slot, i + stride};
    it.load_constants(src);
    src.load_indices(it);
    if (threadIdx.x == 0) {
      next_slot = i + stride < count ? p.slots[fast_item_coords(args.div, i + stride).n] : -1;
    }
    if (first) {
      pdl_enter();
    }
    const int slot = src.slot(it);
    if (slot >= 0) {
      if (!ready) {  // the first item, or one after a padding row: its own copies
        prefetch_item_inputs<true, Traits::K, Traits::BV, Prologue::Cfg::kChunk, Traits::kShaped>(
            *inputs, p, at, slot, shaped_rows_of<Traits::kShaped>(p, at.n));
        cp_async_commit();
        const int v0 = at.tile * Traits::BV;
        it.stage_tile(stage, Item::tile_head(p, slot, at.hv, v0), min(Traits::BV, p.V - v0));
        cp_async_commit();
      }
      cp_async_wait_group<1>();  // this item's inputs (its tile may still be in flight)
      __syncthreads();
    }
    ready = it.run(fast_smem, src);
  }
}

}  // namespace kda::kernels
