// Fused verify configurations: float conv weights, K = 128, every tile of KDA_FUSED_BLOCK_VS
// (tile_policy.h), each with every schedule and feature set verify_kernel_exists allows.
#include "kernels/verify/verify_launch.cuh"

namespace kda::kernels {

#define KDA_VERIFY_DEFINE_F32_K128(bv) KDA_VERIFY_FUSED_F32_K128(bv, KDA_VERIFY_CONFIG_DEFINE)
KDA_FUSED_BLOCK_VS(KDA_VERIFY_DEFINE_F32_K128)
#undef KDA_VERIFY_DEFINE_F32_K128

}  // namespace kda::kernels
