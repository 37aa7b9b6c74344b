// stream_launch.cu: host-side choices of the verify and fold launches: persistent streaming grids
// (sizing, occupancy) and the per-item tiles' register budget.
#include <cuda_runtime_api.h>

#include <atomic>
#include <map>
#include <mutex>
#include <utility>

#include "core/cuda_check.h"
#include "kernels/common/launch_utils.h"
#include "kernels/verify/tile_policy.h"

namespace kda::kernels {

namespace {

// Test / bench knobs, read on every launch (atomics: a change races with no launch).
std::atomic<StateStreamMode> g_stream_mode{StateStreamMode::kAuto};
std::atomic<int> g_stream_max_ctas{0};
std::atomic<TileOccupancy> g_tile_occupancy{TileOccupancy::kAuto};

struct DeviceInfo {
  int sms = 0;
  int major = 0;
};

/// Resident CTAs per SM of a kernel on a device, after raising its dynamic smem limit.
struct KernelInfo {
  int ctas_per_sm = 0;
};

std::mutex g_mu;
std::map<int, DeviceInfo> g_devices;
std::map<std::pair<const void*, int>, KernelInfo> g_kernels;

/// The device's entry in g_devices (queried once); g_mu held.
const DeviceInfo& device_info(int device) {
  auto dev = g_devices.find(device);
  if (dev == g_devices.end()) {
    DeviceInfo info;
    KDA_CUDA_CHECK(cudaDeviceGetAttribute(&info.sms, cudaDevAttrMultiProcessorCount, device));
    KDA_CUDA_CHECK(cudaDeviceGetAttribute(&info.major, cudaDevAttrComputeCapabilityMajor, device));
    dev = g_devices.emplace(device, info).first;
  }
  return dev->second;
}

}  // namespace

int device_sm_count() {
  int device = 0;
  KDA_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(g_mu);
  return device_info(device).sms;
}

TileOccupancy tile_occupancy_mode() { return g_tile_occupancy.load(std::memory_order_relaxed); }
void set_tile_occupancy_mode(TileOccupancy mode) {
  g_tile_occupancy.store(mode, std::memory_order_relaxed);
}
bool one_cta_per_sm_tiles(int64_t ctas, bool grouped, int max_waves) {
  const TileOccupancy mode = tile_occupancy_mode();
  // The device is only asked when the rule needs it (forced modes never do).
  const int sms = mode == TileOccupancy::kAuto && grouped ? device_sm_count() : 0;
  return one_cta_per_sm_tiles_on(ctas, grouped, sms, mode, max_waves);
}

bool one_cta_per_sm_by_wave_fill(int64_t ctas) {
  const TileOccupancy mode = tile_occupancy_mode();
  if (mode != TileOccupancy::kAuto) {
    return mode == TileOccupancy::kOnePerSm;
  }
  return one_per_sm_fills_waves_better(ctas, device_sm_count());
}

StateStreamMode state_stream_mode() { return g_stream_mode.load(std::memory_order_relaxed); }
void set_state_stream_mode(StateStreamMode mode, int max_ctas) {
  g_stream_max_ctas.store(max_ctas > 0 ? max_ctas : 0, std::memory_order_relaxed);
  g_stream_mode.store(mode, std::memory_order_relaxed);
}

int state_stream_grid(const void* kernel, int threads, size_t smem_bytes, int64_t items,
                      bool streamable, StreamFrom from) {
  const StateStreamMode mode = g_stream_mode.load(std::memory_order_relaxed);
  const int max_ctas = g_stream_max_ctas.load(std::memory_order_relaxed);
  if (mode == StateStreamMode::kNever || !streamable || items <= 0) {
    return 0;
  }
  int device = 0;
  KDA_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(g_mu);
  const DeviceInfo& dev = device_info(device);
  if (dev.major < 9) {
    return 0;  // no TMA bulk copies before sm_90
  }
  const auto key = std::make_pair(kernel, device);
  auto k = g_kernels.find(key);
  if (k == g_kernels.end()) {
    KDA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem_bytes)));
    KernelInfo info;
    KDA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&info.ctas_per_sm, kernel, threads,
                                                                 smem_bytes));
    k = g_kernels.emplace(key, info).first;
  }
  int64_t resident = static_cast<int64_t>(k->second.ctas_per_sm) * dev.sms;
  if (mode == StateStreamMode::kAuto && from == StreamFrom::kBeyondOneWave && items <= resident) {
    return 0;  // one wave: the per-item kernel
  }
  if (max_ctas > 0 && resident > max_ctas) {
    resident = max_ctas;
  }
  if (resident <= 0) {
    return 0;
  }
  return static_cast<int>(items < resident ? items : resident);
}

}  // namespace kda::kernels
