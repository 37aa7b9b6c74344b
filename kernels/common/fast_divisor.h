// fast_divisor.h: division of non-negative 31-bit integers by a divisor fixed at launch, as a
// multiply-high, an add and a shift (Granlund & Montgomery, "Division by invariant integers
// using multiplication", PLDI 1994, section 4).
//
// Why: a 32-bit `/` or `%` by a runtime value is a ~20-instruction sequence on the GPU (I2F,
// MUFU.RCP, F2I, IMAD.HI and two corrections). The persistent kernels split every
// item index into (request, head, tile) and a v-head into its k-head; with plain division
// that is a large share of the persistent verify's instructions.
// The host builds the divisor (its constructor divides 64-bit values once); kernels take it
// by value in their argument struct.
#pragma once

#include <cstdint>

#include "core/platform_macros.h"

namespace kda::kernels {

/// n / d and n % d for 0 <= n < 2^31 and 1 <= d <= 2^31.
///
/// With l = ceil(log2 d) and m = floor(2^32 (2^l - d) / d) + 1 (< 2^32), the 33-bit multiplier
/// 2^32 + m satisfies floor((2^32 + m) n / 2^(32+l)) = floor(n / d) for every n < 2^32, and
///   floor((2^32 + m) n / 2^(32+l)) = (n + umulhi(m, n)) >> l
/// because n + umulhi(m, n) is the integer part of (2^32 + m) n / 2^32. n < 2^31 keeps that
/// sum below 2^32. tests/fast_divisor_test.cc checks it against `/` and `%` (every divisor up to
/// 4096 and the powers of two at the edges of the range, random pairs over all of it).
struct FastDivisor {
  uint32_t divisor = 1;
  uint32_t mul = 1;    ///< m (1 for d = 1: umulhi(1, n) = 0)
  uint32_t shift = 0;  ///< l

  FastDivisor() = default;

  /// d in [1, 2^31] (callers pass positive tensor extents).
  KDA_HD explicit FastDivisor(uint32_t d) : divisor(d) {
    while (shift < 32 && (uint64_t{1} << shift) < d) {
      ++shift;
    }
    mul = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }

  KDA_HD uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, mul);
#else
    const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(n) * mul) >> 32);
#endif
    return (n + hi) >> shift;
  }

  /// q = n / d and r = n % d.
  KDA_HD void divmod(uint32_t n, uint32_t& q, uint32_t& r) const {
    q = div(n);
    r = n - q * divisor;
  }
};

}  // namespace kda::kernels
