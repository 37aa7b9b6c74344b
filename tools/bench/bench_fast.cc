#include "tools/bench/bench_fast.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/cuda_check.h"
#include "core/error.h"
#include "kernels/kda_kernels.h"
#include "kernels/ref/kda_host.h"
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

/// `count` elements of T at device address `src` (null: none), synchronously on `stream`.
template <typename T>
std::vector<T> download(const void* src, int64_t count, cudaStream_t stream) {
  std::vector<T> host(src != nullptr ? static_cast<size_t>(count) : 0);
  if (!host.empty()) {
    KDA_CUDA_CHECK(
        cudaMemcpyAsync(host.data(), src, host.size() * sizeof(T), cudaMemcpyDeviceToHost, stream));
    KDA_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  return host;
}

/// Elements from the first row to the end of the last of `rows` rows of `width` at `stride`.
int64_t strided_extent(int64_t rows, int64_t stride, int64_t width) {
  return rows > 0 ? (rows - 1) * stride + width : 0;
}

/// ||got - want|| / ||want|| over `want`'s elements (0 when want is all zero and got equals it).
double rel_l2(const std::vector<bf16_t>& got, const std::vector<double>& want) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(bf16_to_float(got[i])) - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  return den > 0.0 ? std::sqrt(num / den) : (num > 0.0 ? INFINITY : 0.0);
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

std::optional<Fp64Errors> FastCheck::fp64_errors(const VerifyParams& call,
                                                 cudaStream_t stream) const {
  if (call.token_offsets != nullptr || call.parents != nullptr) {
    return std::nullopt;  // the oracle's rows are a dense chain's
  }
  const int64_t N = int64_t{call.B} * call.T, D = qkv_dim(call);
  const int64_t HVK = int64_t{call.HV} * call.K;
  const size_t out_elems = static_cast<size_t>(N * call.HV * call.V);
  KDA_CHECK(exact_out_.size() >= out_elems && fast_out_.size() >= out_elems,
            "FastCheck::fp64_errors: {} output elements expected from the last compare()",
            out_elems);
  // Everything verify_fp64 reads, from the device: inputs by rows, weights, the slots' state.
  const std::vector<int32_t> slots = download<int32_t>(call.slots, call.B, stream);
  const int32_t last_slot = *std::max_element(slots.begin(), slots.end());
  const int64_t slots_used = int64_t{last_slot} + 1;
  const int64_t wsize = call.conv_weight_type == ConvWeightType::kF32 ? 4 : 2;
  const auto qkv =
      download<bf16_t>(call.mixed_qkv, strided_extent(N, call.mixed_qkv_stride, D), stream);
  const auto a = download<bf16_t>(call.a, strided_extent(N, call.a_stride, HVK), stream);
  const auto b = download<bf16_t>(call.b, strided_extent(N, call.b_stride, call.HV), stream);
  const auto A_log = download<float>(call.A_log, call.HV, stream);
  const auto dt_bias = download<float>(call.dt_bias, HVK, stream);
  const auto conv_w = download<char>(call.conv_weight, D * kConvWidth * wsize, stream);
  const auto conv_b = download<char>(call.conv_bias, D * wsize, stream);
  const auto conv_state = download<bf16_t>(
      call.conv_state,
      strided_extent(slots_used, call.conv_state_slot_stride, int64_t{kConvHistory} * D), stream);
  const auto ssm = download<float>(
      call.ssm_state,
      strided_extent(slots_used, call.ssm_slot_stride, HVK / call.K * call.V * call.K), stream);

  VerifyParams h = call;
  h.mixed_qkv = qkv.data();
  h.a = a.data();
  h.b = b.data();
  h.A_log = A_log.data();
  h.dt_bias = dt_bias.data();
  h.conv_weight = conv_w.data();
  h.conv_bias = conv_b.empty() ? nullptr : conv_b.data();
  h.conv_state = conv_state.data();
  h.ssm_state = ssm.data();
  h.slots = slots.data();
  h.rows = nullptr;  // the oracle records nothing
  const host::Fp64Verify ref = host::verify_fp64(h, /*keep_states=*/false);
  const std::vector<double> want(ref.out.begin(),
                                 ref.out.begin() + static_cast<int64_t>(out_elems));
  const std::vector<bf16_t> fast(fast_out_.begin(),
                                 fast_out_.begin() + static_cast<int64_t>(out_elems));
  const std::vector<bf16_t> exact(exact_out_.begin(),
                                  exact_out_.begin() + static_cast<int64_t>(out_elems));
  return Fp64Errors{rel_l2(fast, want), rel_l2(exact, want)};
}

}  // namespace kda::bench
