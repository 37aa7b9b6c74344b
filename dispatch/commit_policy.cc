#include "dispatch/commit_policy.h"

namespace kda {

namespace {

/// kda_bench --phases round, fused+ring, 20 layers, H200: the deferred round against the eager
/// round of the same build, % (negative: deferred faster). Kimi-Linear (HV = 32, K = V = 128)
/// and K3 TP8 (HV = 12), T = 4 and 8, B = 1..64 (docs/perf.md "Deferred commit").
struct Measured {
  int HV, T, B;
  double deferred_vs_eager_pct;
};
constexpr Measured kMeasured[] = {
    {32, 4, 1, 31.6},  {32, 4, 4, 17.7},  {32, 4, 16, 1.1},  {32, 4, 32, 0.7},
    {32, 4, 64, -0.5}, {32, 8, 1, 43.5},  {32, 8, 16, 11.0}, {32, 8, 64, 10.2},
    {12, 4, 1, 54.9},  {12, 4, 16, 29.5}, {12, 4, 64, -0.4}, {12, 8, 64, 10.8},
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
