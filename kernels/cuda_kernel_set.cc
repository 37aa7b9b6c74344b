// cuda_kernel_set.cc: the KernelSet of the CUDA kernels (kernels/kda_kernels.h).
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "kernels/kda_kernels.h"
#include "kernels/kernel_set.h"

namespace kda {

namespace {

class CudaKernelSet final : public KernelSet {
 public:
  CudaKernelSet(int device, const kernels::LaunchOverrides& o) : device_(device), overrides_(o) {}
  const char* name() const override { return "cuda"; }
  Device device() const override { return Device::cuda(device_); }
  kernels::VerifyPlan plan_verify(const VerifyParams& p, VerifyPath path, int block_v) override {
    return kernels::plan_verify_on_device(p, path, block_v, overrides_);
  }
  void verify(const VerifyParams& p, const kernels::VerifyPlan& plan,
              cudaStream_t stream) override {
    kernels::invoke_verify(p, plan, stream);
  }
  /// The fast kernel's kLazyHistory instantiations and the kLazy commit (tests/lazy_gpu_test.cc,
  /// backend_lazy_cuda_test).
  bool runs_lazy_write_back() const override { return true; }
  void extend(const ExtendParams& p, cudaStream_t stream) override {
    kernels::invoke_extend(p, stream, overrides_);
  }
  void commit(const CommitParams& p, cudaStream_t stream) override {
    kernels::invoke_commit(p, stream, overrides_);
  }

 private:
  int device_;
  kernels::LaunchOverrides overrides_;
};

}  // namespace

std::unique_ptr<KernelSet> make_cuda_kernel_set(int device,
                                                const kernels::LaunchOverrides& overrides) {
  int count = 0;
  const cudaError_t st = cudaGetDeviceCount(&count);
  if (st != cudaSuccess || device < 0 || device >= count) {
    cudaGetLastError();
    KDA_THROW(ErrorCode::kUnsupported, "make_cuda_kernel_set: CUDA device {} not available ({})",
              device, st != cudaSuccess ? cudaGetErrorString(st) : "no such device");
  }
  return std::make_unique<CudaKernelSet>(device, overrides);
}

}  // namespace kda
