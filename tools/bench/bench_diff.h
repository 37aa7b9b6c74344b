// bench_diff.h: how far a verify's fast outputs are from its exact ones on the same inputs
// (contract §10 (b)): bf16 elements bitwise equal, the largest bf16 ulp distance, and the relative
// L2 error. Host-only (no CUDA): the phases download both outputs and accumulate here.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace kda::bench {

/// Contract §10 (b): at least this share of bf16 output elements bitwise equal to exact's ...
inline constexpr double kFastMinEqualPct = 99.9;
/// ... and none more than this many bf16 ulps apart.
inline constexpr int kFastMaxUlp = 1;

/// |a - b| in bf16 ulps: the distance of the two values in the ordered sequence of bf16 numbers
/// (+0 and -0 are 0 apart; adjacent values 1; a sign change counts the steps through zero).
int bf16_ulp_distance(bf16_t a, bf16_t b);

/// Fast against exact outputs, accumulated over calls (a round's or step's layers).
struct OutputDiff {
  int64_t elems = 0;      ///< elements compared
  int64_t equal = 0;      ///< of them bitwise equal
  int max_ulp = 0;        ///< largest bf16_ulp_distance
  double sq_diff = 0.0;   ///< sum of (fast - exact)^2, in fp64
  double sq_exact = 0.0;  ///< sum of exact^2, in fp64
  int64_t nonfinite = 0;  ///< elements where either value is not finite

  /// Adds n elements: fast[i] against exact[i].
  void add(const bf16_t* fast, const bf16_t* exact, int64_t n);
  void merge(const OutputDiff& o);
  /// 100 with nothing compared.
  double equal_pct() const;
  /// ||fast - exact|| / ||exact|| over the finite pairs; 0 when both norms are 0.
  double rel_l2() const;
  /// Contract §10 (b) at this row: >= kFastMinEqualPct equal, <= kFastMaxUlp apart, all finite.
  bool meets_contract() const;
  /// "99.987% equal, max 1 ulp, rel L2 2.1e-04 (n elements)".
  std::string describe() const;
};

}  // namespace kda::bench
