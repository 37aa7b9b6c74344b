#include "core/cuda_check.h"
#include "tests/gpu_test_util.h"

namespace kda::testing {

namespace {
__global__ void sm_hog_kernel(long long cycles) {
  extern __shared__ char smem[];
  const long long start = clock64();
  while (clock64() - start < cycles) {
    if (threadIdx.x == 0) {
      smem[0] = 1;  // keep the shared allocation alive
    }
  }
}
}  // namespace

int launch_sm_hog(int free_sms, double milliseconds, cudaStream_t stream) {
  int device = 0;
  KDA_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  KDA_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  const int hog_blocks = prop.multiProcessorCount - free_sms;
  if (hog_blocks <= 0) {
    return 0;
  }
  // One CTA per SM: it takes (nearly) all of the SM's shared memory.
  const int smem = static_cast<int>(prop.sharedMemPerBlockOptin);
  KDA_CUDA_CHECK(
      cudaFuncSetAttribute(sm_hog_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int clock_khz = 0;
  KDA_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device));
  const long long cycles = static_cast<long long>(milliseconds * clock_khz);
  sm_hog_kernel<<<hog_blocks, 32, smem, stream>>>(cycles);
  KDA_CUDA_CHECK(cudaGetLastError());
  return free_sms;
}

}  // namespace kda::testing
