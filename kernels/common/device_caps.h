// device_caps.h: the device facts the launch rules read (plain C++ declarations; bodies in
// device_caps.cu). Each is asked of the device once and cached.
#pragma once

#include <cstddef>

#include "kernels/common/launch_utils.h"

namespace kda::kernels {

/// The current device's SM count and compute capability major.
DeviceCaps device_caps();
/// Multiprocessors of the current device.
int device_sm_count();
/// Resident CTAs per SM of `kernel` (`threads` per CTA, `smem_bytes` of dynamic shared memory)
/// on the current device. The first call per kernel and device raises the kernel's dynamic
/// shared-memory limit to `smem_bytes`, which a launch of it needs (above 48 KiB), and with
/// `max_shared_carveout` asks for the largest shared-memory carveout (so that the CTAs its launches
/// fit by shared memory are resident at once, not as many as the driver's own carveout holds).
int persistent_ctas_per_sm(const void* kernel, int threads, size_t smem_bytes,
                           bool max_shared_carveout = false);

}  // namespace kda::kernels
