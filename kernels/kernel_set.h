// kernel_set.h: the operations the backend runs, implemented either by the host reference
// (kda::host, any machine) or by the CUDA kernels (kda::kernels). The backend is written
// once against this interface; tests run the same lifecycle on both.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "core/tensor_view.h"
#include "kernels/params/kda_params.h"

namespace kda {

class KernelSet {
 public:
  virtual ~KernelSet() = default;
  /// "host" or "cuda".
  virtual const char* name() const = 0;
  /// Where the tensors handed to this kernel set must live.
  virtual Device device() const = 0;
  /// Conv-update then recurrence (two kernels on CUDA).
  virtual void verify_unfused(const VerifyParams& p, cudaStream_t stream) = 0;
  /// Conv + gate + recurrence in one pass, V tile block_v.
  virtual void verify_fused(const VerifyParams& p, int block_v, cudaStream_t stream) = 0;
  virtual void extend(const ExtendParams& p, cudaStream_t stream) = 0;
  /// Fold or snapshot copy (by p.mode) and the conv commit; all layers.
  virtual void commit(const CommitParams& p, cudaStream_t stream) = 0;
};

/// The host reference (streams are ignored; runs synchronously on the calling thread).
std::unique_ptr<KernelSet> make_host_kernel_set();
/// The CUDA kernels on device `device`.
std::unique_ptr<KernelSet> make_cuda_kernel_set(int device);

}  // namespace kda
