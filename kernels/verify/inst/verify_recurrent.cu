// The unfused recurrence's configurations (read qkv_act; conv weights unused): K = 64 and 128,
// BV = kRecurrentBlockV, each with every schedule and feature set verify_kernel_exists allows.
#include "kernels/verify/verify_launch.cuh"

namespace kda::kernels {

KDA_VERIFY_UNFUSED(KDA_VERIFY_CONFIG_DEFINE)

}  // namespace kda::kernels
