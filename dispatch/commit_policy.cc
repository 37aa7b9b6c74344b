#include "dispatch/commit_policy.h"

namespace kda {

namespace {

/// kda_bench --phases round, fused+ring, 20 layers, H200 (docs/bench/h200_v54_auto_table.txt,
/// log v54: the deferred verify at kernels::default_deferred_block_v; mean of two runs of three
/// reps each): the deferred round against the eager round of the same build, % (negative:
/// deferred faster). Kimi-Linear (HV = 32, K = V = 128) and K3 TP8 (HV = 12), T = 1..8,
/// B = 1..64 (docs/perf.md §5).
struct Measured {
  int HV, T, B;
  double deferred_vs_eager_pct;
};
constexpr Measured kMeasured[] = {
    {32, 1, 1, -8.5},   {32, 1, 2, -9.3},   {32, 1, 4, -9.7},   {32, 1, 8, -11.1},
    {32, 1, 16, -21.2}, {32, 1, 32, -23.8}, {32, 1, 64, -25.9}, {32, 2, 1, -11.7},
    {32, 2, 2, -12.1},  {32, 2, 4, -11.6},  {32, 2, 8, -10.2},  {32, 2, 16, -17.2},
    {32, 2, 32, -18.4}, {32, 2, 64, -19.8}, {32, 3, 1, -7.7},   {32, 3, 2, -14.3},
    {32, 3, 4, -9.4},   {32, 3, 8, -7.8},   {32, 3, 16, -14.4}, {32, 3, 32, -14.2},
    {32, 3, 64, -14.8}, {32, 4, 1, -6.0},   {32, 4, 2, -10.4},  {32, 4, 4, -6.6},
    {32, 4, 8, -4.5},   {32, 4, 16, -12.2}, {32, 4, 32, -11.8}, {32, 4, 64, -11.9},
    {32, 5, 1, 0.2},    {32, 5, 2, -3.5},   {32, 5, 4, -0.3},   {32, 5, 8, 2.6},
    {32, 5, 16, -10.1}, {32, 5, 32, -10.8}, {32, 5, 64, -11.0}, {32, 6, 1, 0.3},
    {32, 6, 2, -1.2},   {32, 6, 4, 1.2},    {32, 6, 8, 3.9},    {32, 6, 16, -8.2},
    {32, 6, 32, -9.6},  {32, 6, 64, -10.0}, {32, 7, 1, 0.9},    {32, 7, 2, 1.2},
    {32, 7, 4, 2.8},    {32, 7, 8, 5.9},    {32, 7, 16, -6.6},  {32, 7, 32, -6.8},
    {32, 7, 64, -7.8},  {32, 8, 1, 3.5},    {32, 8, 2, 3.7},    {32, 8, 4, 5.0},
    {32, 8, 8, 8.5},    {32, 8, 16, -4.3},  {32, 8, 32, -4.2},  {32, 8, 64, -6.9},
    {12, 1, 1, 3.7},    {12, 1, 2, -3.5},   {12, 1, 4, -2.8},   {12, 1, 8, -11.9},
    {12, 1, 16, -9.9},  {12, 1, 32, -10.6}, {12, 1, 64, -22.7}, {12, 2, 1, 4.2},
    {12, 2, 2, 0.9},    {12, 2, 4, -7.0},   {12, 2, 8, -12.6},  {12, 2, 16, -10.6},
    {12, 2, 32, -9.4},  {12, 2, 64, -18.1}, {12, 3, 1, 4.3},    {12, 3, 2, 5.8},
    {12, 3, 4, -9.8},   {12, 3, 8, -11.5},  {12, 3, 16, -12.1}, {12, 3, 32, -7.1},
    {12, 3, 64, -14.6}, {12, 4, 1, 8.5},    {12, 4, 2, 6.9},    {12, 4, 4, -5.3},
    {12, 4, 8, -9.4},   {12, 4, 16, -10.1}, {12, 4, 32, -3.6},  {12, 4, 64, -12.5},
    {12, 5, 1, 6.6},    {12, 5, 2, 14.7},   {12, 5, 4, -0.8},   {12, 5, 8, -3.9},
    {12, 5, 16, -6.1},  {12, 5, 32, 2.5},   {12, 5, 64, -10.9}, {12, 6, 1, 8.5},
    {12, 6, 2, 13.8},   {12, 6, 4, 1.9},    {12, 6, 8, -2.7},   {12, 6, 16, -5.0},
    {12, 6, 32, 4.1},   {12, 6, 64, -9.4},  {12, 7, 1, 9.6},    {12, 7, 2, 13.6},
    {12, 7, 4, 4.2},    {12, 7, 8, -1.2},   {12, 7, 16, -2.9},  {12, 7, 32, 5.8},
    {12, 7, 64, -6.9},  {12, 8, 1, 12.5},   {12, 8, 2, 14.5},   {12, 8, 4, 7.3},
    {12, 8, 8, 1.2},    {12, 8, 16, 0.1},   {12, 8, 32, 8.9},   {12, 8, 64, -3.9},
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
  // The table: Kimi-Linear defers at T <= 4 at every B, at T = 5 at B = 2-3 and from B = 16, at
  // T = 6..8 from B = 16; K3 TP8 at T = 1 from B = 2, at T = 2..4 from B = 4, at T = 5-6 at
  // B = 8-31 and from B = 64, at T = 7 at B = 16-31 and from B = 64, at T = 8 from B = 64. Where it
  // loses, the fold of the one-CTA-per-SM tiles (which enter only after the previous kernel's CTAs
  // leave their SMs) or of the first layer stays in the verify's serial prologue. Unmeasured shapes
  // (other heads, head dims or T > 8) keep the eager commit.
  return best != nullptr && shape.K == 128 && shape.V == 128 &&
         best->deferred_vs_eager_pct <= -kMinGainPct;
}

}  // namespace kda
