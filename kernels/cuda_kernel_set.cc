// cuda_kernel_set.cc: the KernelSet of the CUDA kernels (kernels/kda_kernels.h).
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "kernels/kda_kernels.h"
#include "kernels/kernel_set.h"

namespace kda {

namespace {

class CudaKernelSet final : public KernelSet {
 public:
  explicit CudaKernelSet(int device) : device_(device) {}
  const char* name() const override { return "cuda"; }
  Device device() const override { return Device::cuda(device_); }
  void verify_unfused(const VerifyParams& p, cudaStream_t stream) override {
    kernels::invoke_verify_unfused(p, stream);
  }
  void verify_fused(const VerifyParams& p, int block_v, cudaStream_t stream) override {
    kernels::invoke_verify_fused(p, block_v, stream);
  }
  void extend(const ExtendParams& p, cudaStream_t stream) override {
    kernels::invoke_extend(p, stream);
  }
  void commit(const CommitParams& p, cudaStream_t stream) override {
    kernels::invoke_commit(p, stream);
  }

 private:
  int device_;
};

}  // namespace

std::unique_ptr<KernelSet> make_cuda_kernel_set(int device) {
  int count = 0;
  const cudaError_t st = cudaGetDeviceCount(&count);
  if (st != cudaSuccess || device < 0 || device >= count) {
    cudaGetLastError();
    KDA_THROW(ErrorCode::kUnsupported, "make_cuda_kernel_set: CUDA device {} not available ({})",
              device, st != cudaSuccess ? cudaGetErrorString(st) : "no such device");
  }
  return std::make_unique<CudaKernelSet>(device);
}

}  // namespace kda
