// Fused verify tiles: bf16 conv weights, K = 64, every BV of kFusedBlockVs.
#include "kernels/verify_tile.cuh"

namespace kda::kernels {

template void launch_verify_tile<bf16_t, 64, 8, true>(const TileArgs&, cudaStream_t);
template void launch_verify_tile<bf16_t, 64, 16, true>(const TileArgs&, cudaStream_t);
template void launch_verify_tile<bf16_t, 64, 32, true>(const TileArgs&, cudaStream_t);
template void launch_verify_tile<bf16_t, 64, 64, true>(const TileArgs&, cudaStream_t);
template void launch_verify_tile<bf16_t, 64, 128, true>(const TileArgs&, cudaStream_t);

}  // namespace kda::kernels
