// Extend with prefix-cache tracks: the kTrackedExtend tiles, BV = kExtendBlockV, both weight
// types and K.
#include "kernels/verify/per_item.cuh"

namespace kda::kernels {

template <typename WeightT, int K>
void launch_extend_tracked(const TileArgs& args, cudaStream_t stream) {
  launch_verify_tile_as<WeightT, K, kExtendBlockV, true, /*kDeferred=*/false,
                        /*kTrackedExtend=*/true>(args, stream);
}
template void launch_extend_tracked<float, 64>(const TileArgs&, cudaStream_t);
template void launch_extend_tracked<float, 128>(const TileArgs&, cudaStream_t);
template void launch_extend_tracked<bf16_t, 64>(const TileArgs&, cudaStream_t);
template void launch_extend_tracked<bf16_t, 128>(const TileArgs&, cudaStream_t);

}  // namespace kda::kernels
