// output_compare.h: contract §10 (b)'s comparison of two bf16 output sets (fast against exact):
// the fraction bitwise equal, the largest ulp distance, relative L2. Shared by the host and GPU
// tests of the fast outputs.
//
// The ulp floor: both f32 paths carry an absolute error of a few f32 ulps of the scale of the
// terms an output sums (the state contractions and the u_i M[t][i] of its (request, v-head),
// whose magnitude the head's largest output over its tokens stands for). An output that cancels
// to below kUlpFloor of that keeps no bf16 bits of its own (its bf16 ulp is finer than the error,
// in the exact path as in the fast one), so its ulps are counted on the grid of the floor: 2^-12
// of the head's maximum, whose bf16 ulp (2^-20 of it) still spans 16 f32 ulps of the head's scale.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace kda::testing {

/// Contract §10 (b).
constexpr double kMinEqualFraction = 0.999;
constexpr int64_t kMaxUlp = 1;
constexpr double kUlpFloor = 0x1p-12;

/// bf16 bits in an order where adjacent finite values differ by 1 (+0 and -0 both 0).
int64_t bf16_order(bf16_t x);
bool bf16_is_nan(bf16_t x);
/// Distance in bf16 ulps between their ordered representations; a NaN is infinitely far.
int64_t bf16_ulp_distance(bf16_t a, bf16_t b);
/// bf16_ulp_distance where max(|a|, |b|) >= floor; below it, |a - b| in ulps of bf16 at floor
/// (rounded up: any difference counts at least 1).
int64_t bf16_ulp_distance(bf16_t a, bf16_t b, double floor);

/// Two bf16 output sets: the fraction bitwise equal, the largest ulp distance (raw, and with each
/// element's floor), relative L2.
struct OutCompare {
  int64_t elems = 0, equal = 0;
  int64_t max_raw_ulp = 0;  ///< ordered-representation distance
  int64_t max_ulp = 0;      ///< the same, counted at the element's floor below it (kUlpFloor)
  double rel_l2 = 0.0;
  double equal_fraction() const {
    return elems > 0 ? static_cast<double>(equal) / static_cast<double>(elems) : 1.0;
  }
  /// Contract §10 (b) (the equal fraction is a rate: judge it over enough elements).
  bool within_b() const { return equal_fraction() >= kMinEqualFraction && max_ulp <= kMaxUlp; }
  /// Adds another comparison's counts (rel_l2: the larger).
  void merge(const OutCompare& o);
};

OutCompare compare_bf16(const std::vector<bf16_t>& got, const std::vector<bf16_t>& want,
                        const std::vector<double>& floors);

/// The floor of every element of the real requests' rows of [N, HV, V] outputs a and b, in the
/// order request by request, token by token (the order of gather_request_rows): kUlpFloor x the
/// largest magnitude of its (request, v-head) over the request's tokens, in either output.
/// first[n] / lengths[n]: request n's first token row and token count; request `pad` (or -1) is
/// skipped.
std::vector<double> ulp_floors(const std::vector<bf16_t>& a, const std::vector<bf16_t>& b,
                               const std::vector<int64_t>& first,
                               const std::vector<int32_t>& lengths, int pad, int HV, int V);

/// The real requests' rows of [N, HV * V] values, in ulp_floors' order.
template <typename T>
std::vector<T> gather_request_rows(const std::vector<T>& out, const std::vector<int64_t>& first,
                                   const std::vector<int32_t>& lengths, int pad, int64_t width) {
  std::vector<T> r;
  for (size_t n = 0; n < first.size(); ++n) {
    if (static_cast<int>(n) == pad) {
      continue;
    }
    r.insert(r.end(), out.begin() + first[n] * width,
             out.begin() + (first[n] + lengths[n]) * width);
  }
  return r;
}

/// compare_bf16 of the real requests' rows with their floors.
OutCompare compare_requests(const std::vector<bf16_t>& got, const std::vector<bf16_t>& want,
                            const std::vector<int64_t>& first, const std::vector<int32_t>& lengths,
                            int pad, int HV, int V);

}  // namespace kda::testing
