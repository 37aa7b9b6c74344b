#include "dispatch/commit_policy.h"

namespace kda {

namespace {

/// kda_bench --phases round, fused+ring, 20 layers, H200 (docs/bench/h200_v47_deferred.txt,
/// final build): the deferred round against the eager round of the same build, % (negative:
/// deferred faster). Kimi-Linear (HV = 32, K = V = 128)
/// and K3 TP8 (HV = 12), T = 4 and 8, B = 1..64 (docs/perf.md "Deferred commit").
struct Measured {
  int HV, T, B;
  double deferred_vs_eager_pct;
};
constexpr Measured kMeasured[] = {
    {32, 4, 1, 31.5},  {32, 4, 2, 31.4},  {32, 4, 4, 17.9},  {32, 4, 8, 17.3},  {32, 4, 16, 1.2},
    {32, 4, 32, 0.7},  {32, 4, 64, -0.7}, {32, 8, 1, 43.3},  {32, 8, 2, 45.1},  {32, 8, 4, 29.9},
    {32, 8, 8, 31.1},  {32, 8, 16, 11.3}, {32, 8, 32, 11.0}, {32, 8, 64, 10.1}, {12, 4, 1, 54.8},
    {12, 4, 2, 45.5},  {12, 4, 4, 40.4},  {12, 4, 8, 27.6},  {12, 4, 16, 29.1}, {12, 4, 32, 17.7},
    {12, 4, 64, -0.2}, {12, 8, 1, 58.5},  {12, 8, 2, 56.6},  {12, 8, 4, 51.4},  {12, 8, 8, 38.5},
    {12, 8, 16, 42.7}, {12, 8, 32, 30.7}, {12, 8, 64, 11.3},
};

/// A deferred round pays where it was measured faster by more than run-to-run noise.
constexpr double kMinGainPct = 2.0;

}  // namespace

bool deferred_commit_pays(const CommitPolicyShape& shape) {
  // The measured row nearest to the configured batch (same HV and T, largest B <= max_batch).
  const Measured* best = nullptr;
  for (const Measured& m : kMeasured) {
    if (m.HV == shape.HV && m.T == shape.draft_tokens && m.B <= shape.max_batch &&
        (best == nullptr || m.B > best->B)) {
      best = &m;
    }
  }
  // On the H200 no row gains beyond noise: the round is issue-bound, and the fold's
  // instructions cost the same inside the verify as in their own kernel. Unmeasured shapes
  // keep the eager commit.
  return best != nullptr && best->deferred_vs_eager_pct <= -kMinGainPct;
}

}  // namespace kda
