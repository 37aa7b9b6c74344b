#include "tools/bench/bench_diff.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace kda::bench {

namespace {

/// The bf16 bits as a position on the number line: +x -> its magnitude bits, -x -> minus them.
int ordinal(bf16_t x) {
  const int magnitude = x.bits & 0x7fff;
  return (x.bits & 0x8000) != 0 ? -magnitude : magnitude;
}

}  // namespace

int bf16_ulp_distance(bf16_t a, bf16_t b) { return std::abs(ordinal(a) - ordinal(b)); }

void OutputDiff::add(const bf16_t* fast, const bf16_t* exact, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const bf16_t f = fast[i], e = exact[i];
    equal += f.bits == e.bits ? 1 : 0;
    max_ulp = std::max(max_ulp, bf16_ulp_distance(f, e));
    const double fd = bf16_to_float(f), ed = bf16_to_float(e);
    if (!std::isfinite(fd) || !std::isfinite(ed)) {
      ++nonfinite;
      continue;
    }
    sq_diff += (fd - ed) * (fd - ed);
    sq_exact += ed * ed;
  }
  elems += n;
}

void OutputDiff::merge(const OutputDiff& o) {
  elems += o.elems;
  equal += o.equal;
  max_ulp = std::max(max_ulp, o.max_ulp);
  sq_diff += o.sq_diff;
  sq_exact += o.sq_exact;
  nonfinite += o.nonfinite;
}

double OutputDiff::equal_pct() const {
  return elems > 0 ? 100.0 * static_cast<double>(equal) / static_cast<double>(elems) : 100.0;
}

double OutputDiff::rel_l2() const {
  if (sq_diff == 0.0) {
    return 0.0;
  }
  return sq_exact > 0.0 ? std::sqrt(sq_diff / sq_exact) : INFINITY;
}

bool OutputDiff::meets_contract() const {
  return equal_pct() >= kFastMinEqualPct && max_ulp <= kFastMaxUlp && nonfinite == 0;
}

std::string OutputDiff::describe() const {
  return fmt::format("{:.3f}% equal, max {} ulp, rel L2 {:.2e} ({} elements{})", equal_pct(),
                     max_ulp, rel_l2(), elems,
                     nonfinite > 0 ? fmt::format(", {} non-finite", nonfinite) : std::string());
}

}  // namespace kda::bench
