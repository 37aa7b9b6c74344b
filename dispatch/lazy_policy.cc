#include "dispatch/lazy_policy.h"

#include <algorithm>
#include <iterator>
#include <limits>

#include "dispatch/policy_table.h"

namespace kda {

namespace {

// The tables are data (one X-macro row per measured (H, HV, K, V, L, T, B)), made from bench CSVs
// by tools/bench/make_auto_table.py --table lazy; tools/bench/auto_table_test.sh regenerates and
// compares them. A C++ array cannot be empty, so each ends with a terminator row that `count`
// leaves out: a table without measurements is valid data (auto never goes lazy).
#define KDA_LAZY_ROW(H, HV, K, V, L, T, B, exact_eager_us, exact_deferred_us, fast_eager_us, \
                     fast_deferred_us, lazy_us, gemm_us)                                     \
  {H,                                                                                        \
   HV,                                                                                       \
   K,                                                                                        \
   V,                                                                                        \
   L,                                                                                        \
   T,                                                                                        \
   B,                                                                                        \
   exact_eager_us,                                                                           \
   exact_deferred_us,                                                                        \
   fast_eager_us,                                                                            \
   fast_deferred_us,                                                                         \
   lazy_us,                                                                                  \
   gemm_us},
constexpr LazyPolicyRow kTerminator = {0, 0, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
constexpr LazyPolicyRow kH100[] = {
#include "dispatch/auto_tables/h100_lazy.def"
    kTerminator};
#undef KDA_LAZY_ROW

/// The lazy write-back trades state passes of HBM traffic for the history's tensor-core work, so a
/// card's table serves the devices nearest to it (memory bandwidth, as the commit policy's).
constexpr LazyPolicyCard kCards[] = {
    {"H100 SXM", 3352.0, kH100, std::size(kH100) - 1},
};

}  // namespace

const LazyPolicyCard* lazy_policy_cards(size_t* count) noexcept {
  *count = std::size(kCards);
  return kCards;
}

const LazyPolicyCard& nearest_lazy_policy_card(double memory_gbps) noexcept {
  return detail::nearest_card(kCards, memory_gbps);
}

const LazyPolicyRow* lazy_policy_row(const LazyPolicyCard& card,
                                     const LazyPolicyShape& shape) noexcept {
  return detail::largest_batch_row(card, shape.max_batch, [&shape](const LazyPolicyRow& r) {
    return r.H == shape.H && r.HV == shape.HV && r.K == shape.K && r.V == shape.V &&
           r.L == shape.L && r.T == shape.draft_tokens;
  });
}

double best_other_step_us(const LazyPolicyRow& row, NumericsRequest request) noexcept {
  const double fast = std::min(row.fast_eager_us, row.fast_deferred_us);
  switch (request) {
    case NumericsRequest::kFast:
      return fast;
    case NumericsRequest::kAuto:
      return std::min({fast, row.exact_eager_us, row.exact_deferred_us});
    case NumericsRequest::kExact:
      break;
  }
  return std::numeric_limits<double>::infinity();
}

bool lazy_write_back_pays(const LazyPolicyRow& row, NumericsRequest request) noexcept {
  if (request == NumericsRequest::kExact) {
    return false;
  }
  const double other_share = best_other_step_us(row, request) - row.gemm_us;
  const double lazy_share = row.lazy_us - row.gemm_us;
  return lazy_share < other_share * (1.0 - kLazyMinGainPct / 100.0);
}

bool lazy_write_back_pays(const LazyPolicyCard& card, const LazyPolicyShape& shape) noexcept {
  const LazyPolicyRow* row = lazy_policy_row(card, shape);
  return row != nullptr && lazy_write_back_pays(*row, shape.numerics);
}

bool u_free_deferred_pays(const LazyPolicyRow& row) noexcept {
  const double fast_share = row.fast_deferred_us - row.gemm_us;
  const double exact_share = row.exact_deferred_us - row.gemm_us;
  return fast_share < exact_share * (1.0 - kLazyMinGainPct / 100.0);
}

bool u_free_deferred_pays(const LazyPolicyCard& card, const LazyPolicyShape& shape) noexcept {
  const LazyPolicyRow* row = lazy_policy_row(card, shape);
  return row != nullptr && u_free_deferred_pays(*row);
}

}  // namespace kda
