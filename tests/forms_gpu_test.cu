// forms_gpu_test.cu: the kernels' faster elementwise forms (kernels/device_math.cuh: "the same
// bits in fewer instructions") against the contract's GPU forms (§3) they replace, bit for bit,
// on the device, over every float input of each use. Each check also runs once with a planted
// bug (the fast side reads the neighbouring input) to show that it can fail. The short forms are
// compiled for sm_90 only (KDA_SHORT_FORMS); on another target both sides are the contract's
// forms, and this test passes trivially there until the short forms are enabled for it.
#include <catch2/catch.hpp>
#include <cstdint>

#include "core/buffer.h"
#include "core/cuda_check.h"
#include "kernels/common/device_math.cuh"

namespace {

namespace kk = kda::kernels;

/// A bf16 value (as f32) spread over the patterns: the q/k elements the norms divide are bf16.
__device__ float bf16_of(uint32_t u) { return __uint_as_float(((u * 2654435761u) >> 16) << 16); }

/// Every use: fast(u) and contract(u) for input pattern u; `in_domain` false skips u.
struct OnePlusExp {  // 1 + EXP(x) inside SiLU, SIG and the softplus
  __device__ static bool in_domain(uint32_t) { return true; }
  __device__ static float fast(uint32_t u) { return kk::kda_one_plus_exp(__uint_as_float(u)); }
  __device__ static float contract(uint32_t u) {
    return __fadd_rn(1.0f, kk::kda_exp(__uint_as_float(u)));
  }
};
struct Silu {  // SiLU before its bf16 rounding: DIV(acc, 1 + EXP(0 - acc))
  __device__ static bool in_domain(uint32_t) { return true; }
  __device__ static float fast(uint32_t u) { return kk::silu_before_rounding(__uint_as_float(u)); }
  __device__ static float contract(uint32_t u) {
    const float acc = __uint_as_float(u);
    return kk::kda_div(acc, __fadd_rn(1.0f, kk::kda_exp(__fsub_rn(0.0f, acc))));
  }
};
struct Sigmoid {  // SIG(z) = DIV(1, 1 + EXP(0 - z))
  __device__ static bool in_domain(uint32_t) { return true; }
  __device__ static float fast(uint32_t u) { return kk::kda_sigmoid(__uint_as_float(u)); }
  __device__ static float contract(uint32_t u) {
    return kk::kda_div(1.0f, __fadd_rn(1.0f, kk::kda_exp(__fsub_rn(0.0f, __uint_as_float(u)))));
  }
};
struct DivGe1 {  // DIV(a, b), every b >= 1, +inf or NaN; a a bf16 value that varies with b
  __device__ static bool in_domain(uint32_t u) {
    const float b = __uint_as_float(u);
    return b >= 1.0f || isnan(b);
  }
  __device__ static float fast(uint32_t u) {
    return kk::kda_div_ge1(bf16_of(u), __uint_as_float(u));
  }
  __device__ static float contract(uint32_t u) {
    return kk::kda_div(bf16_of(u), __uint_as_float(u));
  }
};
struct DivByNorm {  // x / SQRT(sumsq + 1e-6), every sumsq >= +0 (incl. +inf, NaN); x bf16
  __device__ static bool in_domain(uint32_t u) { return (u >> 31) == 0; }
  __device__ static float denom(uint32_t u) {
    return kk::kda_sqrt(__fadd_rn(__uint_as_float(u), 1e-6f));
  }
  __device__ static float fast(uint32_t u) { return kk::kda_div_by_norm(bf16_of(u), denom(u)); }
  __device__ static float contract(uint32_t u) { return kk::kda_div(bf16_of(u), denom(u)); }
};

/// Counts the patterns u (of all 2^32) in the domain where fast(u + plant) and contract(u)
/// differ in bits (two NaNs count as equal); *first: one such u.
template <typename Use>
__global__ void compare_kernel(uint32_t plant, unsigned long long* mismatches, uint32_t* first) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  unsigned long long local = 0;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < (uint64_t{1} << 32); i += stride) {
    const uint32_t u = static_cast<uint32_t>(i);
    if (!Use::in_domain(u) || !Use::in_domain(u + plant)) {
      continue;
    }
    const float fast = Use::fast(u + plant);
    const float contract = Use::contract(u);
    if (!(isnan(fast) && isnan(contract)) && __float_as_uint(fast) != __float_as_uint(contract)) {
      ++local;
      atomicCAS(first, 0u, u);
    }
  }
  if (local != 0) {
    atomicAdd(mismatches, local);
  }
}

struct Count {
  unsigned long long mismatches = 0;
  uint32_t first = 0;
};

template <typename Use>
Count count_mismatches(uint32_t plant) {
  kda::Buffer n(kda::Device::cuda(), sizeof(unsigned long long));
  kda::Buffer first(kda::Device::cuda(), sizeof(uint32_t));
  KDA_CUDA_CHECK(cudaMemset(n.data(), 0, sizeof(unsigned long long)));
  KDA_CUDA_CHECK(cudaMemset(first.data(), 0, sizeof(uint32_t)));
  compare_kernel<Use><<<2048, 256>>>(plant, static_cast<unsigned long long*>(n.data()),
                                     static_cast<uint32_t*>(first.data()));
  KDA_CUDA_CHECK(cudaGetLastError());
  Count c;
  n.download(&c.mismatches, sizeof(c.mismatches));
  first.download(&c.first, sizeof(c.first));
  return c;
}

template <typename Use>
void check_use() {
  const Count c = count_mismatches<Use>(/*plant=*/0);
  CAPTURE(c.first);
  REQUIRE(c.mismatches == 0);
  REQUIRE(count_mismatches<Use>(/*plant=*/1).mismatches > 100000);  // the check can fail
}

}  // namespace

TEST_CASE("forms: the fast forms give the contract forms' bits for every input of each use",
          "[kernels][gpu][slow]") {
  SECTION("1 + EXP(x)") { check_use<OnePlusExp>(); }
  SECTION("SiLU's division") { check_use<Silu>(); }
  SECTION("SIG") { check_use<Sigmoid>(); }
  SECTION("DIV by b >= 1") { check_use<DivGe1>(); }
  SECTION("DIV by the norm's denominator") { check_use<DivByNorm>(); }
}
