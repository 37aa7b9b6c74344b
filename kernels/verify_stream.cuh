// verify_stream.cuh: the large-B verify kernel. Persistent CTAs (grid = resident CTAs) walk
// the (request, v-head, V tile) items; each item's state tile (BV x K f32, 64 KiB at
// K = BV = 128) arrives in a shared-memory stage through a TMA bulk copy (state_stream.cuh)
// issued while the previous item computes, and is copied to registers after the prologue.
// Everything else is read as in verify_tile_kernel, and the arithmetic is VerifyItem's
// (verify_tile.cuh), so the bits equal verify_tile_kernel's.
// Streamable (checked by the launcher, else verify_tile_kernel runs): sm_90+, verify (not
// extend), T <= kChunk, state 16-byte aligned with a slot stride that is a multiple of 4.
#pragma once

#include "kernels/state_stream.cuh"
#include "kernels/verify_tile.cuh"

namespace kda::kernels {

/// The items in a persistent CTA's order: item = (n*HV + hv)*tiles + tile.
template <int K, int BV>
struct VerifyStreamItems {
  const VerifyParams& p;
  int tiles;
  __device__ int count() const { return p.B * p.HV * tiles; }
  __device__ int n_of(int item) const { return item / tiles / p.HV; }
  __device__ int hv_of(int item) const { return item / tiles % p.HV; }
  __device__ int tile_of(int item) const { return item % tiles; }
  __device__ bool live(int item) const { return p.slots[n_of(item)] >= 0; }
  /// The item's state tile: min(BV, V - v0) columns x K f32, contiguous.
  __device__ BulkRun state_run(int item) const {
    const int v0 = tile_of(item) * BV;
    return {0u,
            p.ssm_state + p.slots[n_of(item)] * p.ssm_slot_stride +
                (static_cast<int64_t>(hv_of(item)) * p.V + v0) * K,
            static_cast<uint32_t>(min(BV, p.V - v0) * K * sizeof(float))};
  }
};

/// The next live item's state run, planned by warp 0 at the start of an item (when no state
/// is live in registers) and issued from here once the stage is free.
struct NextRun {
  BulkRun run;
  int valid;
};

/// A verify item's inputs: the state tile from the stage, the rest as GlobalSource.
/// begin() plans the next live item's run; load_state() waits for this item's tile, copies it
/// to registers and refills the stage.
template <typename Item>
struct StagedSource : GlobalSource<Item> {
  static constexpr bool kStaged = true;
  using Slice = typename Item::Slice;
  using Items = VerifyStreamItems<Item::Cfg::K, Item::Cfg::BV>;

  const float* stage;
  BulkStage& bulk;
  NextRun& next;
  const Items& items;
  int item;   // this item's index
  int slot_;  // this item's slot (< 0: padding)

  __device__ __forceinline__ int slot(const Item&) const { return slot_; }
  __device__ __forceinline__ void begin(const Item&) const {
    if (threadIdx.x == 0) {
      const int nx = next_live_item(items, item + static_cast<int>(gridDim.x));
      next.valid = nx < items.count();
      if (next.valid) {
        next.run = items.state_run(nx);
      }
    }
  }
  __device__ __forceinline__ void load_state(const Item& it, ColRegs<Slice> (&S)[Slice::CPT],
                                             const bool (&ok)[Slice::CPT], const float*) const {
    bulk.wait();
    load_state_columns<Slice>(S, ok, stage, it.col0 - it.v0, it.c);
    __syncthreads();  // every thread is done with the stage (and `next` is written): refill
    bulk.fill_one_if(threadIdx.x == 0 && next.valid != 0, next.run);
  }
};

template <typename WeightT, int K, int BV, bool FUSED>
__global__ void __launch_bounds__(256, 2)
    verify_stream_kernel(const __grid_constant__ TileArgs args) {
  using Item = VerifyItem<WeightT, K, BV, FUSED>;
  using Src = StagedSource<Item>;
  __shared__ __align__(16) TileSmem<typename Item::Cfg> sm;
  __shared__ uint64_t bar;
  __shared__ NextRun next;
  extern __shared__ __align__(128) float stage[];  // BV x K f32

  const VerifyParams& p = args.p;
  const typename Src::Items items{p, (p.V + BV - 1) / BV};
  BulkStage bulk(stage, &bar);
  bulk.init();
  pdl_wait();
  pdl_launch_dependents();
  __syncthreads();  // the barrier is initialised
  if (threadIdx.x < 32) {
    const int first = next_live_item(items, static_cast<int>(blockIdx.x));
    if (first < items.count()) {
      bulk.fill([&](int) { return items.state_run(first); }, 1);
    }
  }
  for (int i = blockIdx.x; i < items.count(); i += gridDim.x) {
    Item item(args, items.tile_of(i), items.hv_of(i), items.n_of(i));
    const Src src{{}, stage, bulk, next, items, i, p.slots[item.n]};
    item.load_constants(src);
    item.run(sm, src);
  }
}

/// Host: whether a verify call can take the streaming kernel (besides sm_90+ and the grid).
inline bool stream_layout_ok(const VerifyParams& p, int chunk) {
  return p.T <= chunk && reinterpret_cast<uintptr_t>(p.ssm_state) % 16 == 0 &&
         p.ssm_slot_stride % 4 == 0;
}

}  // namespace kda::kernels
