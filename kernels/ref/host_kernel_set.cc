// host_kernel_set.cc: the KernelSet of the host reference (kernels/kernel_set.h), so the
// backend runs its whole lifecycle without a GPU. Streams are ignored: every call runs
// synchronously on the calling thread.
#include <memory>

#include "core/error.h"
#include "kernels/kernel_set.h"
#include "kernels/params/params_check.h"
#include "kernels/ref/kda_host.h"

namespace kda {
namespace {

class HostKernelSet final : public KernelSet {
 public:
  const char* name() const override { return "host"; }
  Device device() const override { return Device::host(); }

  kernels::VerifyPlan plan_verify(const VerifyParams& p, VerifyPath path, int block_v) override {
    // The host has no V tiles, but it accepts exactly the tiles the CUDA set accepts, so a
    // bad --kda-verify-block-v fails the same way on both.
    if (path == VerifyPath::kFused) {
      params::check_block_v(block_v, "HostKernelSet::plan_verify");
    }
    kernels::VerifyPlan plan = kernels::plan_verify(p, path, block_v, kernels::DeviceCaps{},
                                                    kernels::LaunchOverrides{}, 0);
    plan.host_reference = true;
    kernels::check_lazy_plan(p, plan, "HostKernelSet::plan_verify");
    return plan;
  }

  void verify(const VerifyParams& p, const kernels::VerifyPlan& plan,
              cudaStream_t /*stream*/) override {
    // plan_verify plans the fast outputs exactly where kernels::fast_outputs_plannable holds
    // (p.numerics == kFast on a fast-capable call); every other call runs exact.
    if (plan.numerics == VerifyNumerics::kFast) {
      host::verify_fused_fast(p);
    } else if (plan.path == VerifyPath::kFused) {
      host::verify_fused(p);
    } else {
      host::verify_unfused(p);
    }
  }

  bool runs_lazy_write_back() const override { return true; }

  void extend(const ExtendParams& p, cudaStream_t /*stream*/) override { host::extend(p); }

  void commit(const CommitParams& p, cudaStream_t /*stream*/) override { host::commit(p); }
};

}  // namespace

std::unique_ptr<KernelSet> make_host_kernel_set() { return std::make_unique<HostKernelSet>(); }

}  // namespace kda
