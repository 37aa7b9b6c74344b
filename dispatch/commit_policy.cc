#include "dispatch/commit_policy.h"

#include <iterator>

#include "dispatch/policy_table.h"

namespace kda {

namespace {

// The tables are data (one X-macro row per measured (HV, K, V, T, B)), made from bench CSVs by
// tools/bench/make_auto_table.py; tools/bench/auto_table_test.sh regenerates and compares them.
#define KDA_AUTO_ROW(HV, K, V, T, B, eager_us, deferred_us, gemm_us) \
  {HV, K, V, T, B, eager_us, deferred_us, gemm_us},
constexpr CommitPolicyRow kH100[] = {
#include "dispatch/auto_tables/h100.def"
};
#undef KDA_AUTO_ROW

/// The deferred commit trades one state pass of HBM traffic for the fold's arithmetic on the SMs,
/// so the ratio of the two rates decides where it pays: a card's table serves the devices nearest
/// to it in memory bandwidth.
constexpr CommitPolicyCard kCards[] = {
    {"H100 SXM", 3352.0, kH100, std::size(kH100)},
};

}  // namespace

const CommitPolicyCard* commit_policy_cards(size_t* count) {
  *count = std::size(kCards);
  return kCards;
}

const CommitPolicyCard& nearest_commit_policy_card(double memory_gbps) {
  return detail::nearest_card(kCards, memory_gbps);
}

const CommitPolicyRow* deferred_commit_row(const CommitPolicyShape& shape) {
  return detail::largest_batch_row(nearest_commit_policy_card(shape.memory_gbps), shape.max_batch,
                                   [&shape](const CommitPolicyRow& r) {
                                     return r.HV == shape.HV && r.K == shape.K && r.V == shape.V &&
                                            r.T == shape.draft_tokens;
                                   });
}

bool deferred_commit_pays(const CommitPolicyShape& shape) {
  const CommitPolicyRow* row = deferred_commit_row(shape);
  return row != nullptr && row->deferred_us < row->eager_us * (1.0 - kDeferredMinGainPct / 100.0);
}

}  // namespace kda
