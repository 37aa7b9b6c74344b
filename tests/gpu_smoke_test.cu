// gpu_smoke_test.cu: the device is there, a kernel launches, and its result comes back.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/cuda_check.h"
#include "core/platform.h"

namespace {
__global__ void saxpy_kernel(int n, float a, const float* x, float* y) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    y[i] = a * x[i] + y[i];
  }
}
}  // namespace

TEST_CASE("gpu_smoke: device present and a kernel runs", "[core][gpu]") {
  const kda::Platform p = kda::detect_platform();
  INFO(p.describe());
  REQUIRE(p.has_device);
  // The peak memory bandwidth the deferred-commit policy picks its card by
  // (dispatch/commit_policy.h): an HBM part reports terabytes per second.
  CHECK(p.memory_gbps > 1000.0);
  CHECK(p.describe().find("GB/s peak memory") != std::string::npos);
  const int n = 1000;
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) {
    x[i] = 0.25f * static_cast<float>(i);
    y[i] = 3.0f - static_cast<float>(i);
  }
  kda::Buffer dx(kda::Device::cuda(), n * 4), dy(kda::Device::cuda(), n * 4);
  dx.upload(x.data(), n * 4);
  dy.upload(y.data(), n * 4);
  saxpy_kernel<<<(n + 255) / 256, 256>>>(n, 2.0f, static_cast<const float*>(dx.data()),
                                         static_cast<float*>(dy.data()));
  KDA_CUDA_CHECK(cudaGetLastError());
  KDA_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> out(n);
  dy.download(out.data(), n * 4);
  for (int i = 0; i < n; ++i) {
    REQUIRE(out[i] == 2.0f * x[i] + y[i]);
  }
}
