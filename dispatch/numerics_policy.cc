#include "dispatch/numerics_policy.h"

#include <iterator>

#include "dispatch/policy_table.h"

namespace kda {

namespace {

// The tables are data (one X-macro row per measured (H, HV, K, V, T, B)), made from bench CSVs by
// tools/bench/make_auto_table.py --table numerics; tools/bench/auto_table_test.sh regenerates and
// compares them. A C++ array cannot be empty, so each ends with a terminator row that `count`
// leaves out: a table without measurements is valid data (auto keeps the exact outputs).
#define KDA_NUMERICS_ROW(H, HV, K, V, T, B, exact_us, fast_us, gemm_us, pick) \
  {H, HV, K, V, T, B, exact_us, fast_us, gemm_us, VerifyNumerics::pick},
constexpr NumericsPolicyRow kTerminator = {0, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0, VerifyNumerics::kExact};
constexpr NumericsPolicyRow kH100[] = {
#include "dispatch/auto_tables/h100_numerics.def"
    kTerminator};
#undef KDA_NUMERICS_ROW

/// The fast outputs trade the exact path's FP32 issue rate for tensor-core contractions, so a
/// card's table serves the devices nearest to it (memory bandwidth, as the commit policy's).
constexpr NumericsPolicyCard kCards[] = {
    {"H100 SXM", 3352.0, kH100, std::size(kH100) - 1},
};

}  // namespace

const NumericsPolicyCard* numerics_policy_cards(size_t* count) noexcept {
  *count = std::size(kCards);
  return kCards;
}

const NumericsPolicyCard& nearest_numerics_policy_card(double memory_gbps) noexcept {
  return detail::nearest_card(kCards, memory_gbps);
}

const NumericsPolicyRow* numerics_policy_row(const NumericsPolicyCard& card,
                                             const NumericsPolicyShape& shape) noexcept {
  return detail::largest_batch_row(card, shape.B, [&shape](const NumericsPolicyRow& r) {
    return r.H == shape.H && r.HV == shape.HV && r.K == shape.K && r.V == shape.V && r.T == shape.T;
  });
}

bool fast_outputs_pay(const NumericsPolicyRow& row) noexcept {
  const double exact_share = row.exact_us - row.gemm_us;
  const double fast_share = row.fast_us - row.gemm_us;
  return fast_share < exact_share * (1.0 - kFastMinGainPct / 100.0);
}

}  // namespace kda
