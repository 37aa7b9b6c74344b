#include "tests/output_compare.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "tests/test_problem.h"

namespace kda::testing {

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
  if (bf16_is_nan(a) || bf16_is_nan(b) || std::max(std::fabs(x), std::fabs(y)) >= floor ||
      floor <= 0.0) {
    return bf16_ulp_distance(a, b);
  }
  const double ulp = std::ldexp(1.0, std::ilogb(floor) - 7);  // 8 significant bits
  return static_cast<int64_t>(std::ceil(std::fabs(x - y) / ulp));
}

void OutCompare::merge(const OutCompare& o) {
  elems += o.elems;
  equal += o.equal;
  max_raw_ulp = std::max(max_raw_ulp, o.max_raw_ulp);
  max_ulp = std::max(max_ulp, o.max_ulp);
  rel_l2 = std::max(rel_l2, o.rel_l2);
}

OutCompare compare_bf16(const std::vector<bf16_t>& got, const std::vector<bf16_t>& want,
                        const std::vector<double>& floors) {
  OutCompare r;
  r.elems = static_cast<int64_t>(want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    r.equal += got[i].bits == want[i].bits ? 1 : 0;
    r.max_raw_ulp = std::max(r.max_raw_ulp, bf16_ulp_distance(got[i], want[i]));
    r.max_ulp = std::max(r.max_ulp, bf16_ulp_distance(got[i], want[i], floors[i]));
  }
  r.rel_l2 = rel_l2(got, want);
  return r;
}

std::vector<double> ulp_floors(const std::vector<bf16_t>& a, const std::vector<bf16_t>& b,
                               const std::vector<int64_t>& first,
                               const std::vector<int32_t>& lengths, int pad, int HV, int V) {
  const int64_t width = static_cast<int64_t>(HV) * V;
  std::vector<double> floors;
  for (size_t n = 0; n < first.size(); ++n) {
    if (static_cast<int>(n) == pad) {
      continue;
    }
    std::vector<double> head_max(static_cast<size_t>(HV), 0.0);
    for (int64_t t = 0; t < lengths[n]; ++t) {
      for (int64_t i = 0; i < width; ++i) {
        const int64_t e = (first[n] + t) * width + i;
        double& m = head_max[static_cast<size_t>(i / V)];
        m = std::max({m, std::fabs(to_double(a[e])), std::fabs(to_double(b[e]))});
      }
    }
    for (int64_t t = 0; t < lengths[n]; ++t) {
      for (int64_t i = 0; i < width; ++i) {
        floors.push_back(kUlpFloor * head_max[static_cast<size_t>(i / V)]);
      }
    }
  }
  return floors;
}

OutCompare compare_requests(const std::vector<bf16_t>& got, const std::vector<bf16_t>& want,
                            const std::vector<int64_t>& first, const std::vector<int32_t>& lengths,
                            int pad, int HV, int V) {
  const int64_t width = static_cast<int64_t>(HV) * V;
  return compare_bf16(gather_request_rows(got, first, lengths, pad, width),
                      gather_request_rows(want, first, lengths, pad, width),
                      ulp_floors(got, want, first, lengths, pad, HV, V));
}

}  // namespace kda::testing
