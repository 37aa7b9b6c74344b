#include "dispatch/commit_policy.h"

namespace kda {

namespace {

/// kda_bench --phases round, fused+ring, 20 layers, H200 (docs/bench/h200_v49_deferred_u.txt,
/// the final build of log v49: u records, TMA write-back): the deferred round against the eager
/// round of the same build, % (negative: deferred faster). Kimi-Linear (HV = 32, K = V = 128)
/// and K3 TP8 (HV = 12), T = 4 and 8, B = 1..64 (docs/perf.md "Deferred commit").
struct Measured {
  int HV, T, B;
  double deferred_vs_eager_pct;
};
constexpr Measured kMeasured[] = {
    {32, 4, 1, 31.9},   {32, 4, 2, 19.1},   {32, 4, 4, 4.9},    {32, 4, 8, 3.4},
    {32, 4, 16, -12.0}, {32, 4, 32, -11.8}, {32, 4, 64, -12.0}, {32, 8, 1, 36.9},
    {32, 8, 2, 29.4},   {32, 8, 4, 14.9},   {32, 8, 8, 15.0},   {32, 8, 16, -4.0},
    {32, 8, 32, -4.4},  {32, 8, 64, -7.9},  {12, 4, 1, 53.0},   {12, 4, 2, 47.1},
    {12, 4, 4, 26.8},   {12, 4, 8, 13.7},   {12, 4, 16, 13.5},  {12, 4, 32, 3.3},
    {12, 4, 64, -12.3}, {12, 8, 1, 56.2},   {12, 8, 2, 49.4},   {12, 8, 4, 34.7},
    {12, 8, 8, 22.5},   {12, 8, 16, 24.9},  {12, 8, 32, 15.1},  {12, 8, 64, -3.9}};

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
  // The table: the deferred round gains from B = 16 at Kimi-Linear and at B = 64 at K3 TP8; at
  // small B the fold sits in each verify's serial prologue and costs more than its own kernel.
  // Unmeasured shapes (other heads or head dims) keep the eager commit.
  return best != nullptr && shape.K == 128 && shape.V == 128 &&
         best->deferred_vs_eager_pct <= -kMinGainPct;
}

}  // namespace kda
