#include "dispatch/commit_policy.h"

namespace kda {

namespace {

/// kda_bench --phases round, fused+ring, 20 layers, H200 (docs/bench/h200_v51_fold_before_wait.txt,
/// log v51: the per-item kernels fold before their PDL wait; mean of two reps): the deferred
/// round against the eager round of the same build, % (negative: deferred faster). Kimi-Linear
/// (HV = 32, K = V = 128) and K3 TP8 (HV = 12), T = 4 and 8, B = 1..64 (docs/perf.md §5).
struct Measured {
  int HV, T, B;
  double deferred_vs_eager_pct;
};
constexpr Measured kMeasured[] = {
    {32, 4, 1, -1.5},   {32, 4, 2, 10.3},   {32, 4, 4, -6.1},   {32, 4, 8, -4.4},
    {32, 4, 16, -12.1}, {32, 4, 32, -11.4}, {32, 4, 64, -11.6}, {32, 8, 1, 3.7},
    {32, 8, 2, 21.5},   {32, 8, 4, 5.1},    {32, 8, 8, 8.6},    {32, 8, 16, -3.9},
    {32, 8, 32, -3.8},  {32, 8, 64, -6.8},  {12, 4, 1, 8.6},    {12, 4, 2, 13.1},
    {12, 4, 4, 5.3},    {12, 4, 8, -9.3},   {12, 4, 16, -9.6},  {12, 4, 32, -3.3},
    {12, 4, 64, -12.3}, {12, 8, 1, 39.6},   {12, 8, 2, 14.2},   {12, 8, 4, 13.6},
    {12, 8, 8, 1.4},    {12, 8, 16, 0.3},   {12, 8, 32, 9.0},   {12, 8, 64, -3.7}};

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
  // The table: at T = 4 the deferred round gains from B = 4 (Kimi-Linear) and B = 8 (K3 TP8),
  // at T = 8 from B = 16 (Kimi-Linear) and B = 64 (K3 TP8). Where it loses, the fold of the
  // one-CTA-per-SM tiles (which enter only after the previous kernel's CTAs leave their SMs) or
  // of the first layer stays in the verify's serial prologue. Unmeasured shapes (other heads or
  // head dims) keep the eager commit.
  return best != nullptr && shape.K == 128 && shape.V == 128 &&
         best->deferred_vs_eager_pct <= -kMinGainPct;
}

}  // namespace kda
