// Fused verify tiles: f32 conv weights, K = 128, every BV of kFusedBlockVs.
#include "kernels/verify_tile.cuh"

namespace kda::kernels {

template void launch_verify_tile<float, 128, 8, true>(const TileArgs&, cudaStream_t);
template void launch_verify_tile<float, 128, 16, true>(const TileArgs&, cudaStream_t);
template void launch_verify_tile<float, 128, 32, true>(const TileArgs&, cudaStream_t);
template void launch_verify_tile<float, 128, 64, true>(const TileArgs&, cudaStream_t);
template void launch_verify_tile<float, 128, 128, true>(const TileArgs&, cudaStream_t);

}  // namespace kda::kernels
