// output_compare.h: contract §10 (b)'s comparison (tools/numerics/output_compare.h) over the
// real requests of a verify's [N, HV, V] outputs, for the host and GPU tests of the fast outputs.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "tools/numerics/output_compare.h"

namespace kda::testing {

using OutCompare = numerics::OutputCompare;
using numerics::kMaxUlp;
/// numerics::kMinEqualPct as a fraction.
constexpr double kMinEqualFraction = numerics::kMinEqualPct / 100.0;

/// `got` against `want` ([N, HV, V] outputs) over the real requests: request n has token rows
/// first[n] .. first[n] + lengths[n] - 1; request `pad` (or -1) is skipped. Each element's ulps
/// count at the floor of its (request, v-head) (OutputCompare::add_request).
OutCompare compare_requests(const std::vector<bf16_t>& got, const std::vector<bf16_t>& want,
                            const std::vector<int64_t>& first, const std::vector<int32_t>& lengths,
                            int pad, int HV, int V);

}  // namespace kda::testing
