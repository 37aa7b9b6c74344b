#include "tools/numerics/output_compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

namespace kda::numerics {

int64_t bf16_order(bf16_t x) {
  const int64_t magnitude = x.bits & 0x7fff;
  return (x.bits & 0x8000) != 0 ? -magnitude : magnitude;
}

bool bf16_is_nan(bf16_t x) { return (x.bits & 0x7fff) > 0x7f80; }

int64_t bf16_ulp_distance(bf16_t a, bf16_t b) {
  if (bf16_is_nan(a) || bf16_is_nan(b)) {
    return std::numeric_limits<int64_t>::max();
  }
  return std::llabs(bf16_order(a) - bf16_order(b));
}

int64_t bf16_ulp_distance(bf16_t a, bf16_t b, double floor) {
  const double x = bf16_to_float(a), y = bf16_to_float(b);
  if (bf16_is_nan(a) || bf16_is_nan(b) || floor <= 0.0 ||
      std::max(std::fabs(x), std::fabs(y)) >= floor) {
    return bf16_ulp_distance(a, b);
  }
  const double ulp = std::ldexp(1.0, std::ilogb(floor) - 7);  // 8 significant bits
  return static_cast<int64_t>(std::ceil(std::fabs(x - y) / ulp));
}

void OutputCompare::add_request(const bf16_t* got, const bf16_t* want, int64_t rows, int heads,
                                int V) {
  const int64_t width = static_cast<int64_t>(heads) * V;
  std::vector<double> head_max(static_cast<size_t>(heads), 0.0);
  for (int64_t e = 0; e < rows * width; ++e) {
    const double g = std::fabs(bf16_to_float(got[e])), w = std::fabs(bf16_to_float(want[e]));
    double& m = head_max[static_cast<size_t>((e % width) / V)];
    if (std::isfinite(g) && std::isfinite(w)) {
      m = std::max({m, g, w});
    }
  }
  for (int64_t e = 0; e < rows * width; ++e) {
    const bf16_t g = got[e], w = want[e];
    equal += g.bits == w.bits ? 1 : 0;
    max_raw_ulp = std::max(max_raw_ulp, bf16_ulp_distance(g, w));
    const double floor = kUlpFloor * head_max[static_cast<size_t>((e % width) / V)];
    max_ulp = std::max(max_ulp, bf16_ulp_distance(g, w, floor));
    const double gd = bf16_to_float(g), wd = bf16_to_float(w);
    if (!std::isfinite(gd) || !std::isfinite(wd)) {
      ++nonfinite;
      continue;
    }
    sq_diff += (gd - wd) * (gd - wd);
    sq_want += wd * wd;
  }
  elems += rows * width;
}

void OutputCompare::add(const bf16_t* got, const bf16_t* want, int64_t n, int V) {
  for (int64_t at = 0; at + V <= n; at += V) {
    add_request(got + at, want + at, 1, 1, V);
  }
}

void OutputCompare::merge(const OutputCompare& o) {
  elems += o.elems;
  equal += o.equal;
  max_raw_ulp = std::max(max_raw_ulp, o.max_raw_ulp);
  max_ulp = std::max(max_ulp, o.max_ulp);
  sq_diff += o.sq_diff;
  sq_want += o.sq_want;
  nonfinite += o.nonfinite;
}

double OutputCompare::equal_pct() const {
  return elems > 0 ? 100.0 * static_cast<double>(equal) / static_cast<double>(elems) : 100.0;
}

double OutputCompare::rel_l2() const {
  if (sq_diff == 0.0) {
    return 0.0;
  }
  return sq_want > 0.0 ? std::sqrt(sq_diff / sq_want) : INFINITY;
}

bool OutputCompare::meets_contract() const {
  return equal_pct() >= kMinEqualPct && max_ulp <= kMaxUlp && nonfinite == 0;
}

std::string OutputCompare::describe() const {
  return fmt::format(
      "{:.3f}% equal, max {} ulp ({} without the floor), rel L2 {:.2e} ({} "
      "elements{})",
      equal_pct(), max_ulp, max_raw_ulp, rel_l2(), elems,
      nonfinite > 0 ? fmt::format(", {} non-finite", nonfinite) : std::string());
}

}  // namespace kda::numerics
