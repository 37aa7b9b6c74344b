#include "tools/bench/bench_fast.h"

#include <fmt/format.h>

#include "core/cuda_check.h"
#include "core/error.h"
#include "kernels/kda_kernels.h"
#include "tools/bench/bench_device.h"

namespace kda::bench {

namespace {

constexpr uint64_t kFastGarbageSeed = 0xbb67ae8584caa73bull;

/// The ring-mode tensors a verify writes besides its outputs (output set 0).
std::vector<const Pool*> records(const Problem& problem) {
  std::vector<const Pool*> pools = problem.outputs(0).written(RecordMode::kRing);
  pools.erase(pools.begin());  // out, compared by its statistics
  return pools;
}

/// Bytes of `bytes` rounded up to 256 (each saved tensor starts 256-byte aligned).
int64_t aligned(int64_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

int64_t FastCheck::device_bytes(const ProblemConfig& c) {
  const Shape& s = c.shape;
  const int64_t S = int64_t{c.B} + c.track_slots, L = c.L;
  return aligned(int64_t{c.B} * c.T_max * kConvHistory * s.D() * 2) +
         aligned(S * s.HV * L * s.V * 2) + aligned(S * s.H * L * s.K * 2) +
         aligned(S * s.HV * L * s.K * 4) + aligned(S * s.HV * L * 4) + 256;
}

FastCheck::FastCheck(const Problem& problem)
    : problem_(problem),
      scratch_(Device::cuda(problem.config().device), device_bytes(problem.config())),
      flag_(Device::cuda(problem.config().device), 64) {
  KDA_CHECK(problem.config().ring,
            "FastCheck: the Problem has no rings (fast outputs are ring mode's)");
}

void FastCheck::clear() {
  diff_ = OutputDiff{};
  failures_.clear();
}

void FastCheck::compare(const VerifyParams& fast, int bv, int copy, int64_t rows,
                        const kernels::LaunchOverrides& launch, cudaStream_t stream) {
  KDA_CHECK(fast.numerics == VerifyNumerics::kFast && fast.mode == RecordMode::kRing,
            "FastCheck: a ring-mode verify with numerics fast expected");
  const Pool& out = problem_.outputs(0).out;
  const std::vector<const Pool*> recs = records(problem_);
  const int64_t n = rows * fast.HV * fast.V;
  KDA_CHECK(n <= out.numel, "FastCheck: {} output rows exceed the pool", rows);
  const auto garbage = [&] {
    fill_bits(out.at(copy), out.bytes(), kFastGarbageSeed, stream);
    for (const Pool* p : recs) {
      fill_bits(p->at(copy), p->bytes(), mix_seed(kFastGarbageSeed + p->numel), stream);
    }
  };
  const auto download_out = [&](std::vector<bf16_t>& host) {
    host.resize(static_cast<size_t>(n));
    KDA_CUDA_CHECK(cudaMemcpyAsync(host.data(), out.at(copy), static_cast<size_t>(n) * 2,
                                   cudaMemcpyDeviceToHost, stream));
    KDA_CUDA_CHECK(cudaStreamSynchronize(stream));
  };

  VerifyParams exact = fast;
  exact.numerics = VerifyNumerics::kExact;
  garbage();
  kernels::invoke_verify_fused(exact, bv, stream, launch);
  char* saved = static_cast<char*>(scratch_.data());
  std::vector<const char*> at;
  for (const Pool* p : recs) {
    KDA_CUDA_CHECK(cudaMemcpyAsync(saved, p->at(copy), static_cast<size_t>(p->bytes()),
                                   cudaMemcpyDeviceToDevice, stream));
    at.push_back(saved);
    saved += aligned(p->bytes());
  }
  download_out(exact_out_);

  garbage();
  kernels::invoke_verify_fused(fast, bv, stream, launch);
  download_out(fast_out_);
  diff_.add(fast_out_.data(), exact_out_.data(), n, fast.V);
  for (size_t i = 0; i < recs.size(); ++i) {
    const Pool& p = *recs[i];
    const int64_t byte = first_mismatch(at[i], p.at(copy), p.bytes(), flag_.data(), stream);
    if (byte >= 0) {
      failures_.push_back(fmt::format(
          "copy {} T={} BV={}: the fast verify's {} differs from the exact one's (element {})",
          copy, fast.T, bv, p.name, byte / dtype_size(p.dtype)));
    }
  }
}

}  // namespace kda::bench
