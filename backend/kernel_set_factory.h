// kernel_set_factory.h: picks the kernel set for a device, so engines can build a backend
// from a Device alone:
//   KdaAttentionBackend backend(model, flags, make_kernel_set(Device::cuda(0)));
#pragma once

#include <memory>

#include "core/tensor_view.h"
#include "kernels/kernel_set.h"

namespace kda {

/// The host reference for Device::host(), the CUDA kernels for Device::cuda(i) (throws
/// kUnsupported when that device is not usable).
/// The kernel set of `device` (host: the reference; CUDA: the kernels on that device, every launch
/// with `overrides`: tests and benchmarks; engines keep the defaults).
std::unique_ptr<KernelSet> make_kernel_set(const Device& device,
                                           const kernels::LaunchOverrides& overrides = {});

}  // namespace kda
