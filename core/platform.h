// platform.h: what GPU (if any) the module runs on, as the dispatcher needs to know it.
#pragma once

#include <string>

namespace kda {

/// Architecture families the dispatcher distinguishes (contract §4).
enum class ArchFamily { kSM90, kSM100, kOther };

const char* arch_family_name(ArchFamily f);

struct Platform {
  bool has_device = false;  ///< false: no usable CUDA device; `reason` says why
  int device = -1;          ///< CUDA ordinal
  int sm_major = 0;
  int sm_minor = 0;
  int sm_count = 0;
  /// Peak device-memory bandwidth in GB/s from the CUDA attributes (memory clock x bus width x
  /// 2, double data rate): 3352 on an H100 SXM, 4800 on an H200; 0 = unknown (no device, a fake
  /// platform, or the attributes unavailable).
  double memory_gbps = 0.0;
  std::string name;    ///< e.g. "NVIDIA H200"
  std::string reason;  ///< why there is no device ("no CUDA device", driver error text)

  /// SM90 = Hopper (9.0); SM100 family = Blackwell datacenter (10.x); everything else other.
  ArchFamily family() const;
  /// "NVIDIA H200 (sm_90, 132 SMs)" or "no CUDA device (...)".
  std::string describe() const;
};

/// Queries CUDA device `device` (default: the current one). Never throws: on a machine
/// without a GPU or driver it returns has_device = false with the reason.
Platform detect_platform(int device = -1);

/// A platform for tests and tools that pretend an architecture (dispatcher override).
Platform fake_platform(int sm_major, int sm_minor, int sm_count = 132);

}  // namespace kda
