// Fused verify tiles: f32 conv weights, K = 128, every BV of KDA_FUSED_BLOCK_VS (tile_policy.h).
#include "kernels/verify/per_item.cuh"

namespace kda::kernels {

#define KDA_INSTANTIATE_TILE(bv) \
  template void launch_verify_tile<float, 128, bv, true>(const TileArgs&, cudaStream_t);
KDA_FUSED_BLOCK_VS(KDA_INSTANTIATE_TILE)
#undef KDA_INSTANTIATE_TILE

}  // namespace kda::kernels
