// output_compare.h: contract §10 (b)'s comparison of two bf16 output sets (fast against exact on
// the same inputs): the share bitwise equal, the largest bf16 ulp distance and the relative L2
// error. One implementation for the benchmark (kda_bench's numerics axis) and the tests.
//
// The ulp floor (contract §10 (b)): both f32 paths carry an absolute error of a few f32 ulps of
// the scale of the terms an output sums (the state contractions and the u_i M[t][i] of its
// (request, v-head), whose magnitude the head's largest output over the request's tokens stands
// for). An output that cancels below kUlpFloor of that keeps no bf16 bits of its own in either
// path, so its ulps are counted on the bf16 grid of the floor (whose ulp, 2^-20 of the head's
// maximum, still spans 16 f32 ulps of the head's scale). Above the floor the count is strict.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace kda::numerics {

/// Contract §10 (b): at least this share of bf16 outputs bitwise equal to exact's ...
inline constexpr double kMinEqualPct = 99.9;
/// ... and none more than this many bf16 ulps apart (counted at the floor below) ...
inline constexpr int64_t kMaxUlp = 1;
/// ... the floor, as a fraction of the largest output of the element's (request, v-head).
inline constexpr double kUlpFloor = 0x1p-12;

/// bf16 bits in an order where adjacent finite values differ by 1 (+0 and -0 both 0).
int64_t bf16_order(bf16_t x);
bool bf16_is_nan(bf16_t x);
/// |a - b| in bf16 ulps: their distance in bf16_order (a sign change counts the steps through
/// zero); a NaN is infinitely far (INT64_MAX).
int64_t bf16_ulp_distance(bf16_t a, bf16_t b);
/// bf16_ulp_distance where max(|a|, |b|) >= floor; below it, |a - b| in ulps of bf16 at `floor`
/// (rounded up: any difference counts at least 1).
int64_t bf16_ulp_distance(bf16_t a, bf16_t b, double floor);

/// Fast (`got`) against exact (`want`) outputs, accumulated over calls.
struct OutputCompare {
  int64_t elems = 0;        ///< elements compared
  int64_t equal = 0;        ///< of them bitwise equal
  int64_t max_raw_ulp = 0;  ///< largest bf16_ulp_distance (no floor)
  int64_t max_ulp = 0;      ///< largest distance counted at each element's floor
  double sq_diff = 0.0;     ///< sum of (got - want)^2 over finite pairs, fp64
  double sq_want = 0.0;     ///< sum of want^2 over finite pairs, fp64
  int64_t nonfinite = 0;    ///< elements where either value is not finite

  /// `rows` token rows of one request, [rows, heads, V] contiguous: each element's floor is
  /// kUlpFloor x the largest magnitude of its head over these rows, in either output.
  void add_request(const bf16_t* got, const bf16_t* want, int64_t rows, int heads, int V);
  /// n elements as n / V independent vectors (one token of one head each; n % V == 0), each
  /// with its own floor: never more lenient than add_request over the vectors' request.
  void add(const bf16_t* got, const bf16_t* want, int64_t n, int V);
  void merge(const OutputCompare& o);

  /// 100 with nothing compared.
  double equal_pct() const;
  double equal_fraction() const { return equal_pct() / 100.0; }
  /// ||got - want|| / ||want|| over the finite pairs; 0 when they are equal.
  double rel_l2() const;
  /// Contract §10 (b): >= kMinEqualPct equal, <= kMaxUlp apart at the floor, all finite. The
  /// equal share is a rate: judge it over enough elements.
  bool meets_contract() const;
  /// "99.987% equal, max 1 ulp (3 without the floor), rel L2 2.1e-04 (n elements)".
  std::string describe() const;
};

}  // namespace kda::numerics
