// kernel_set.h: the operations the backend runs, implemented either by the host reference
// (kda::host, any machine) or by the CUDA kernels (kda::kernels). The backend is written
// once against this interface; tests run the same lifecycle on both.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "core/tensor_view.h"
#include "kernels/common/launch_utils.h"
#include "kernels/params/kda_params.h"
#include "kernels/verify/verify_plan.h"

namespace kda {

class KernelSet {
 public:
  virtual ~KernelSet() = default;
  /// "host" or "cuda".
  virtual const char* name() const = 0;
  /// Where the tensors handed to this kernel set must live.
  virtual Device device() const = 0;
  /// The plan of a verify call on `path` with fused tile `block_v` (kernels/verify/verify_plan.h):
  /// the CUDA set plans the kernel it will launch on its device; the host set plans for an unknown
  /// device (it runs the reference whatever the schedule, and checks the tile as CUDA does).
  /// Host-only, never enqueues; throws kda::Error on an unsupported K or tile.
  virtual kernels::VerifyPlan plan_verify(const VerifyParams& p, VerifyPath path, int block_v) = 0;
  /// Runs `plan`, this call's plan_verify: the conv update then the recurrence (unfused), or both
  /// in one kernel (fused).
  virtual void verify(const VerifyParams& p, const kernels::VerifyPlan& plan,
                      cudaStream_t stream) = 0;
  /// Conv-update then recurrence (two kernels on CUDA), as planned.
  void verify_unfused(const VerifyParams& p, cudaStream_t stream) {
    verify(p, plan_verify(p, VerifyPath::kUnfused, 0), stream);
  }
  /// Conv + gate + recurrence in one pass, V tile block_v, as planned.
  void verify_fused(const VerifyParams& p, int block_v, cudaStream_t stream) {
    verify(p, plan_verify(p, VerifyPath::kFused, block_v), stream);
  }
  /// Whether this set runs the lazy write-back (contract §11: lazy verifies, CommitKind::kLazy).
  virtual bool runs_lazy_write_back() const = 0;
  virtual void extend(const ExtendParams& p, cudaStream_t stream) = 0;
  /// Fold or snapshot copy (by p.mode) and the conv commit; all layers.
  virtual void commit(const CommitParams& p, cudaStream_t stream) = 0;
};

/// The host reference (streams are ignored; runs synchronously on the calling thread).
std::unique_ptr<KernelSet> make_host_kernel_set();
/// The CUDA kernels on device `device`.
/// The CUDA kernels on `device`; `overrides` (tests, benchmarks) apply to every launch.
std::unique_ptr<KernelSet> make_cuda_kernel_set(int device,
                                                const kernels::LaunchOverrides& overrides = {});

}  // namespace kda
