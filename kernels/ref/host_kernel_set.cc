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

  void verify_unfused(const VerifyParams& p, cudaStream_t /*stream*/) override {
    host::verify_unfused(p);
  }

  void verify_fused(const VerifyParams& p, int block_v, cudaStream_t /*stream*/) override {
    // The host has no V tiles, but it accepts exactly the tiles the CUDA set accepts, so a
    // bad --kda-verify-block-v fails the same way on both.
    params::check_block_v(block_v, "HostKernelSet::verify_fused");
    host::verify_fused(p);
  }

  void extend(const ExtendParams& p, cudaStream_t /*stream*/) override { host::extend(p); }

  void commit(const CommitParams& p, cudaStream_t /*stream*/) override { host::commit(p); }
};

}  // namespace

std::unique_ptr<KernelSet> make_host_kernel_set() { return std::make_unique<HostKernelSet>(); }

}  // namespace kda
