#include "core/platform.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

namespace kda {

const char* arch_family_name(ArchFamily f) {
  switch (f) {
    case ArchFamily::kSM90:
      return "SM90";
    case ArchFamily::kSM100:
      return "SM100";
    case ArchFamily::kOther:
      return "other";
  }
  return "?";
}

ArchFamily Platform::family() const {
  if (!has_device) {
    return ArchFamily::kOther;
  }
  if (sm_major == 9 && sm_minor == 0) {
    return ArchFamily::kSM90;
  }
  if (sm_major == 10) {
    return ArchFamily::kSM100;
  }
  return ArchFamily::kOther;
}

std::string Platform::describe() const {
  if (!has_device) {
    return fmt::format("no CUDA device ({})", reason);
  }
  if (memory_gbps <= 0.0) {
    return fmt::format("{} (sm_{}{}, {} SMs)", name, sm_major, sm_minor, sm_count);
  }
  return fmt::format("{} (sm_{}{}, {} SMs, {:.0f} GB/s peak memory)", name, sm_major, sm_minor,
                     sm_count, memory_gbps);
}

Platform detect_platform(int device) {
  Platform p;
  int count = 0;
  cudaError_t st = cudaGetDeviceCount(&count);
  if (st != cudaSuccess || count == 0) {
    p.reason = st != cudaSuccess
                   ? fmt::format("{}: {}", cudaGetErrorName(st), cudaGetErrorString(st))
                   : std::string("the driver reports 0 devices");
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return p;
  }
  if (device < 0) {
    st = cudaGetDevice(&device);
    if (st != cudaSuccess) {
      p.reason = fmt::format("cudaGetDevice: {}", cudaGetErrorString(st));
      return p;
    }
  }
  if (device >= count) {
    p.reason = fmt::format("device {} requested, {} present", device, count);
    return p;
  }
  cudaDeviceProp prop{};
  st = cudaGetDeviceProperties(&prop, device);
  if (st != cudaSuccess) {
    p.reason = fmt::format("cudaGetDeviceProperties: {}", cudaGetErrorString(st));
    return p;
  }
  p.has_device = true;
  p.device = device;
  p.sm_major = prop.major;
  p.sm_minor = prop.minor;
  p.sm_count = prop.multiProcessorCount;
  p.name = prop.name;
  // Peak memory bandwidth: the memory clock (kHz) and bus width (bits) attributes; left 0 where
  // the driver does not report them.
  int clock_khz = 0, bus_bits = 0;
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) == cudaSuccess) {
    p.memory_gbps = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;
  } else {
    cudaGetLastError();
  }
  return p;
}

Platform fake_platform(int sm_major, int sm_minor, int sm_count) {
  Platform p;
  p.has_device = true;
  p.device = 0;
  p.sm_major = sm_major;
  p.sm_minor = sm_minor;
  p.sm_count = sm_count;
  p.name = fmt::format("fake sm_{}{}", sm_major, sm_minor);
  return p;
}

}  // namespace kda
