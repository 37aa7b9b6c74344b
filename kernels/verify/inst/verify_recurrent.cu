// Unfused recurrence tiles (read qkv_act; conv weights unused), K = 64 and 128.
#include "kernels/verify/per_item.cuh"

namespace kda::kernels {

template void launch_verify_tile<float, 64, kRecurrentBlockV, false>(const TileArgs&, cudaStream_t);
template void launch_verify_tile<float, 128, kRecurrentBlockV, false>(const TileArgs&,
                                                                      cudaStream_t);

}  // namespace kda::kernels
