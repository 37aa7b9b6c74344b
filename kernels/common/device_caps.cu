// device_caps.cu: what the launch rules read from the device, asked once per device (or kernel)
// and cached: the SM count and compute capability (device_caps), and a persistent kernel's
// resident CTAs per SM after its dynamic shared-memory limit is raised (persistent_ctas_per_sm).
// Host-only calls, legal during stream capture.
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <utility>

#include "core/cuda_check.h"
#include "kernels/common/device_caps.h"

namespace kda::kernels {

namespace {

std::mutex g_mu;
std::map<int, DeviceCaps> g_devices;
std::map<std::pair<const void*, int>, int> g_kernels;

int current_device() {
  int device = 0;
  KDA_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

/// g_mu held.
const DeviceCaps& caps_of(int device) {
  auto dev = g_devices.find(device);
  if (dev == g_devices.end()) {
    DeviceCaps caps;
    KDA_CUDA_CHECK(cudaDeviceGetAttribute(&caps.sms, cudaDevAttrMultiProcessorCount, device));
    KDA_CUDA_CHECK(
        cudaDeviceGetAttribute(&caps.sm_major, cudaDevAttrComputeCapabilityMajor, device));
    dev = g_devices.emplace(device, caps).first;
  }
  return dev->second;
}

}  // namespace

DeviceCaps device_caps() {
  const int device = current_device();
  std::lock_guard<std::mutex> lock(g_mu);
  return caps_of(device);
}

int device_sm_count() { return device_caps().sms; }

int persistent_ctas_per_sm(const void* kernel, int threads, size_t smem_bytes,
                           bool max_shared_carveout) {
  const int device = current_device();
  std::lock_guard<std::mutex> lock(g_mu);
  const auto key = std::make_pair(kernel, device);
  auto k = g_kernels.find(key);
  if (k == g_kernels.end()) {
    KDA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem_bytes)));
    if (max_shared_carveout) {
      KDA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                          cudaSharedmemCarveoutMaxShared));
    }
    int ctas = 0;
    KDA_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, threads, smem_bytes));
    k = g_kernels.emplace(key, ctas).first;
  }
  return k->second;
}

}  // namespace kda::kernels
