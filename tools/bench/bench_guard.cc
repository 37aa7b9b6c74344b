#include "tools/bench/bench_guard.h"

#include <fmt/format.h>

#include <cstring>

#include "core/buffer.h"
#include "core/cuda_check.h"
#include "kernels/kda_kernels.h"
#include "tools/bench/bench_device.h"

namespace kda::bench {

namespace {

constexpr uint64_t kGarbageSeed = 0x6a09e667f3bcc908ull;

std::string element_str(const void* device_ptr, DType dtype) {
  uint32_t raw = 0;
  KDA_CUDA_CHECK(
      cudaMemcpy(&raw, device_ptr, static_cast<size_t>(dtype_size(dtype)), cudaMemcpyDeviceToHost));
  if (dtype == DType::kBF16) {
    const bf16_t v{static_cast<uint16_t>(raw)};
    return fmt::format("{:g} (0x{:04x})", bf16_to_float(v), v.bits);
  }
  float f;
  std::memcpy(&f, &raw, sizeof(f));
  return fmt::format("{:g} (0x{:08x})", f, raw);
}

/// "ring_g[3, 7, 2, 64]" from a flat element index.
std::string index_str(const Pool& p, int64_t flat, int T) {
  std::vector<int64_t> idx(p.shape.size());
  for (size_t d = p.shape.size(); d-- > 0;) {
    idx[d] = flat % p.shape[d];
    flat /= p.shape[d];
  }
  std::string s = fmt::format("{}[{}]", p.name, fmt::join(idx, ", "));
  if (p.name == "out") {
    s += fmt::format(" (request {}, token {})", idx[0] / T, idx[0] % T);
  }
  return s;
}

}  // namespace

GuardResult run_bitwise_guard(const Problem& problem, int T, RecordMode mode,
                              const kernels::LaunchOverrides& launch,
                              const std::vector<int>& block_vs, cudaStream_t stream) {
  GuardResult r;
  const ProblemConfig& c = problem.config();
  Buffer scratch(Device::cuda(c.device), 8);
  const OutputSet& ref = problem.outputs(0);
  const OutputSet& got = problem.outputs(1);

  problem.prefill_outputs(0, kGarbageSeed, stream);
  kernels::invoke_verify_unfused(problem.verify_params(0, T, mode, 0), stream, launch);
  for (int bv : block_vs) {
    problem.prefill_outputs(1, kGarbageSeed, stream);
    kernels::invoke_verify_fused(problem.verify_params(0, T, mode, 1), bv, stream, launch);
    KDA_CUDA_CHECK(cudaStreamSynchronize(stream));
    ++r.comparisons;
    const std::vector<const Pool*> want = ref.written(mode), have = got.written(mode);
    for (size_t i = 0; i < want.size(); ++i) {
      const Pool& a = *want[i];
      const Pool& b = *have[i];
      const int64_t at = first_mismatch(a.at(0), b.at(0), a.bytes(), scratch.data(), stream);
      if (at < 0) {
        continue;
      }
      const int64_t esize = dtype_size(a.dtype);
      const int64_t elem = at / esize;
      r.ok = false;
      r.failures.push_back(fmt::format(
          "T={} B={} {} mode, fused BV={} vs unfused: first difference at {}: unfused {}, "
          "fused {}",
          T, c.B, mode == RecordMode::kRing ? "ring" : "snapshot", bv, index_str(a, elem, T),
          element_str(static_cast<const char*>(a.at(0)) + elem * esize, a.dtype),
          element_str(static_cast<const char*>(b.at(0)) + elem * esize, b.dtype)));
    }
  }
  return r;
}

}  // namespace kda::bench
