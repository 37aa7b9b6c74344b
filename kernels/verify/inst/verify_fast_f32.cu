// Fast-output verify configurations (verify_fast_launch.cuh): f32 conv weights.
#include "kernels/verify/fast_launch_impl.cuh"

namespace kda::kernels {

KDA_VERIFY_FAST_CONFIGS(KDA_VERIFY_FAST_DEFINE, float)

}  // namespace kda::kernels
