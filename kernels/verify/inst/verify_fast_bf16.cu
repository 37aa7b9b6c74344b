// Fast-output verify configurations (verify_fast_launch.cuh): bf16 conv weights.
#include "kernels/verify/fast_launch_impl.cuh"

namespace kda::kernels {

KDA_VERIFY_FAST_CONFIGS(KDA_VERIFY_FAST_DEFINE, bf16_t)

}  // namespace kda::kernels
