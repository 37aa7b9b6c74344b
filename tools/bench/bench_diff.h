// bench_diff.h: how far a verify's fast outputs are from its exact ones on the same inputs
// (contract §10 (b)): the shared comparison of tools/numerics/output_compare.h. The phases download
// both outputs and accumulate here (host only).
#pragma once

#include "tools/numerics/output_compare.h"

namespace kda::bench {

/// Fast against exact outputs, accumulated over calls (a round's or step's layers); each
/// V-length vector (one token of one head) takes its own ulp floor (OutputCompare::add).
using OutputDiff = numerics::OutputCompare;

}  // namespace kda::bench
