// bench_diff.h: how far a verify's fast outputs are from its exact ones on the same inputs
// (contract §10 (b)): the shared comparison of tools/numerics/output_compare.h. The phases download
// both outputs and accumulate here (host only).
#pragma once

#include <cmath>

#include "tools/numerics/output_compare.h"

namespace kda::bench {

/// Fast against exact outputs, accumulated over calls (a round's or step's layers); each
/// V-length vector (one token of one head) takes its own ulp floor (OutputCompare::add).
using OutputDiff = numerics::OutputCompare;

/// Contract §10 (c): the fast and the exact outputs' relative L2 errors against the fp64 oracle
/// on the same inputs.
struct Fp64Errors {
  double fast = 0.0, exact = 0.0;
  /// fast / exact (§10 (c): at most kMaxRatio); 1 when both are 0.
  double ratio() const {
    if (exact == 0.0) {
      return fast == 0.0 ? 1.0 : INFINITY;
    }
    return fast / exact;
  }
  static constexpr double kMaxRatio = 1.25;
  bool meets_contract() const { return ratio() <= kMaxRatio; }
};

}  // namespace kda::bench
