#include "dispatch/commit_policy.h"

namespace kda {

namespace {

/// kda_bench --phases round, fused+ring, 20 layers, H200 (docs/bench/h200_v53_auto_table.txt,
/// log v53: main at 6e7298e; mean of two runs of three reps each): the deferred round against
/// the eager round of the same build, % (negative: deferred faster). Kimi-Linear (HV = 32,
/// K = V = 128) and K3 TP8 (HV = 12), T = 1..8, B = 1..64 (docs/perf.md §5).
struct Measured {
  int HV, T, B;
  double deferred_vs_eager_pct;
};
constexpr Measured kMeasured[] = {
    {32, 1, 1, -7.8},   {32, 1, 2, 3.6},    {32, 1, 4, -9.1},   {32, 1, 8, -10.6},
    {32, 1, 16, -20.9}, {32, 1, 32, -23.6}, {32, 1, 64, -25.6}, {32, 2, 1, -7.3},
    {32, 2, 2, 5.8},    {32, 2, 4, -10.9},  {32, 2, 8, -10.1},  {32, 2, 16, -16.8},
    {32, 2, 32, -18.4}, {32, 2, 64, -19.4}, {32, 3, 1, -4.8},   {32, 3, 2, 8.5},
    {32, 3, 4, -8.7},   {32, 3, 8, -7.5},   {32, 3, 16, -14.2}, {32, 3, 32, -14.0},
    {32, 3, 64, -14.4}, {32, 4, 1, -1.4},   {32, 4, 2, 10.4},   {32, 4, 4, -6.1},
    {32, 4, 8, -4.5},   {32, 4, 16, -12.2}, {32, 4, 32, -11.5}, {32, 4, 64, -11.7},
    {32, 5, 1, -0.1},   {32, 5, 2, 17.8},   {32, 5, 4, 0.0},    {32, 5, 8, 2.7},
    {32, 5, 16, -10.1}, {32, 5, 32, -10.5}, {32, 5, 64, -10.7}, {32, 6, 1, -0.4},
    {32, 6, 2, 19.3},   {32, 6, 4, 1.6},    {32, 6, 8, 4.0},    {32, 6, 16, -8.2},
    {32, 6, 32, -9.4},  {32, 6, 64, -10.0}, {32, 7, 1, 0.9},    {32, 7, 2, 20.7},
    {32, 7, 4, 3.1},    {32, 7, 8, 5.9},    {32, 7, 16, -6.7},  {32, 7, 32, -6.6},
    {32, 7, 64, -7.5},  {32, 8, 1, 3.5},    {32, 8, 2, 21.5},   {32, 8, 4, 5.0},
    {32, 8, 8, 8.4},    {32, 8, 16, -4.0},  {32, 8, 32, -4.0},  {32, 8, 64, -6.8},
    {12, 1, 1, 3.8},    {12, 1, 2, 2.0},    {12, 1, 4, 1.3},    {12, 1, 8, -11.1},
    {12, 1, 16, -9.3},  {12, 1, 32, -10.5}, {12, 1, 64, -22.4}, {12, 2, 1, 4.3},
    {12, 2, 2, 7.8},    {12, 2, 4, 1.5},    {12, 2, 8, -12.1},  {12, 2, 16, -10.3},
    {12, 2, 32, -9.4},  {12, 2, 64, -17.9}, {12, 3, 1, 4.6},    {12, 3, 2, 9.7},
    {12, 3, 4, 3.7},    {12, 3, 8, -11.2},  {12, 3, 16, -11.6}, {12, 3, 32, -6.7},
    {12, 3, 64, -14.3}, {12, 4, 1, 8.8},    {12, 4, 2, 12.8},   {12, 4, 4, 5.3},
    {12, 4, 8, -9.0},   {12, 4, 16, -9.6},  {12, 4, 32, -3.1},  {12, 4, 64, -12.2},
    {12, 5, 1, 36.1},   {12, 5, 2, 14.1},   {12, 5, 4, 11.7},   {12, 5, 8, -3.6},
    {12, 5, 16, -5.8},  {12, 5, 32, 3.0},   {12, 5, 64, -10.6}, {12, 6, 1, 35.5},
    {12, 6, 2, 13.7},   {12, 6, 4, 12.7},   {12, 6, 8, -2.5},   {12, 6, 16, -5.0},
    {12, 6, 32, 4.5},   {12, 6, 64, -9.2},  {12, 7, 1, 35.6},   {12, 7, 2, 13.3},
    {12, 7, 4, 13.2},   {12, 7, 8, -1.3},   {12, 7, 16, -3.0},  {12, 7, 32, 6.2},
    {12, 7, 64, -6.7},  {12, 8, 1, 39.5},   {12, 8, 2, 14.3},   {12, 8, 4, 13.8},
    {12, 8, 8, 1.4},    {12, 8, 16, 0.3},   {12, 8, 32, 9.1},   {12, 8, 64, -3.6},
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
  // The table: Kimi-Linear defers at T <= 3 from B = 1 but not at B = 2-3, at T = 4 from
  // B = 4, at T = 5..8 from B = 16; K3 TP8 at T <= 4 from B = 8, at T = 5..7 at B = 8-31 (T = 7:
  // 16-31) and from B = 64, at T = 8 from B = 64. Where it loses, the fold of the one-CTA-per-SM
  // tiles (which enter only after the previous kernel's CTAs leave their SMs) or of the first
  // layer stays in the verify's serial prologue. Unmeasured shapes (other heads, head dims or
  // T > 8) keep the eager commit.
  return best != nullptr && shape.K == 128 && shape.V == 128 &&
         best->deferred_vs_eager_pct <= -kMinGainPct;
}

}  // namespace kda
