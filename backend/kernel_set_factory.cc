#include "backend/kernel_set_factory.h"

namespace kda {

std::unique_ptr<KernelSet> make_kernel_set(const Device& device) {
  return device.is_cuda() ? make_cuda_kernel_set(device.index) : make_host_kernel_set();
}

}  // namespace kda
