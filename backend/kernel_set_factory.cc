#include "backend/kernel_set_factory.h"

namespace kda {

std::unique_ptr<KernelSet> make_kernel_set(const Device& device,
                                           const kernels::LaunchOverrides& overrides) {
  return device.is_cuda() ? make_cuda_kernel_set(device.index, overrides) : make_host_kernel_set();
}

}  // namespace kda
