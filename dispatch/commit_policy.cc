#include "dispatch/commit_policy.h"

namespace kda {

namespace {

/// kda_bench --phases round, fused+ring, 20 layers, H200 (docs/bench/h200_v56_auto_table.txt,
/// log v56: the deferred verify at kernels::default_deferred_block_v, with the kept fold tile of
/// v55 and the entry trigger of v56; the rows B = 1 and 2 re-measured after v61's eager BV = 32
/// tile, docs/bench/h200_v61_bv32_uncapped.txt; mean of two runs of three reps each): the
/// deferred round against the eager round of the same build, % (negative: deferred faster).
/// Kimi-Linear (HV = 32, K = V = 128) and K3 TP8 (HV = 12), T = 1..8, B = 1..64 (docs/perf.md §5).
struct Measured {
  int HV, T, B;
  double deferred_vs_eager_pct;
};
constexpr Measured kMeasured[] = {
    {32, 1, 1, -11.2},  {32, 1, 2, -18.7},  {32, 1, 4, -11.1},  {32, 1, 8, -12.2},
    {32, 1, 16, -20.9}, {32, 1, 32, -23.4}, {32, 1, 64, -25.7}, {32, 2, 1, -8.8},
    {32, 2, 2, -15.6},  {32, 2, 4, -9.1},   {32, 2, 8, -9.6},   {32, 2, 16, -16.6},
    {32, 2, 32, -18.3}, {32, 2, 64, -19.5}, {32, 3, 1, -6.4},   {32, 3, 2, -11.6},
    {32, 3, 4, -7.5},   {32, 3, 8, -7.6},   {32, 3, 16, -14.0}, {32, 3, 32, -13.9},
    {32, 3, 64, -14.5}, {32, 4, 1, -5.1},   {32, 4, 2, -9.5},   {32, 4, 4, -7.1},
    {32, 4, 8, -6.2},   {32, 4, 16, -11.9}, {32, 4, 32, -11.4}, {32, 4, 64, -11.6},
    {32, 5, 1, 3.4},    {32, 5, 2, -9.1},   {32, 5, 4, -4.3},   {32, 5, 8, -2.8},
    {32, 5, 16, -9.9},  {32, 5, 32, -10.5}, {32, 5, 64, -10.4}, {32, 6, 1, 3.0},
    {32, 6, 2, -7.7},   {32, 6, 4, -3.8},   {32, 6, 8, -2.2},   {32, 6, 16, -8.0},
    {32, 6, 32, -9.3},  {32, 6, 64, -9.7},  {32, 7, 1, 3.9},    {32, 7, 2, -5.6},
    {32, 7, 4, -2.8},   {32, 7, 8, -1.2},   {32, 7, 16, -6.6},  {32, 7, 32, -6.6},
    {32, 7, 64, -7.3},  {32, 8, 1, 4.8},    {32, 8, 2, -4.9},   {32, 8, 4, -1.2},
    {32, 8, 8, 0.7},    {32, 8, 16, -3.9},  {32, 8, 32, -3.7},  {32, 8, 64, -6.7},
    {12, 1, 1, 3.8},    {12, 1, 2, -5.4},   {12, 1, 4, -20.9},  {12, 1, 8, -15.7},
    {12, 1, 16, -12.8}, {12, 1, 32, -12.2}, {12, 1, 64, -22.3}, {12, 2, 1, 4.5},
    {12, 2, 2, -0.5},   {12, 2, 4, -17.5},  {12, 2, 8, -14.4},  {12, 2, 16, -10.6},
    {12, 2, 32, -9.5},  {12, 2, 64, -17.8}, {12, 3, 1, 4.8},    {12, 3, 2, 5.0},
    {12, 3, 4, -7.2},   {12, 3, 8, -12.7},  {12, 3, 16, -7.9},  {12, 3, 32, -7.0},
    {12, 3, 64, -14.3}, {12, 4, 1, 8.8},    {12, 4, 2, 5.2},    {12, 4, 4, -5.6},
    {12, 4, 8, -11.6},  {12, 4, 16, -5.5},  {12, 4, 32, -5.0},  {12, 4, 64, -12.0},
    {12, 5, 1, 6.7},    {12, 5, 2, 16.5},   {12, 5, 4, -6.6},   {12, 5, 8, -9.0},
    {12, 5, 16, -5.6},  {12, 5, 32, -2.5},  {12, 5, 64, -10.5}, {12, 6, 1, 8.5},
    {12, 6, 2, 15.9},   {12, 6, 4, -5.4},   {12, 6, 8, -7.7},   {12, 6, 16, -5.6},
    {12, 6, 32, -1.8},  {12, 6, 64, -9.3},  {12, 7, 1, 9.6},    {12, 7, 2, 15.2},
    {12, 7, 4, -3.2},   {12, 7, 8, -6.6},   {12, 7, 16, -5.6},  {12, 7, 32, -0.3},
    {12, 7, 64, -7.0},  {12, 8, 1, 12.5},   {12, 8, 2, 15.9},   {12, 8, 4, -1.6},
    {12, 8, 8, -4.5},   {12, 8, 16, -3.1},  {12, 8, 32, 1.7},   {12, 8, 64, -3.7},
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
  // The table: Kimi-Linear defers at T <= 4 at every B, at T = 5-6 from B = 2, at T = 7 at
  // B = 2-7 and from B = 16, at T = 8 at B = 2-3 and from B = 16; K3 TP8 at T = 1 from B = 2, at
  // T = 2-5 from B = 4, at T = 6-7 at B = 4-31 and from B = 64, at T = 8 at B = 8-31 and from
  // B = 64. Where it loses, the fold of the first layer, or of tiles whose CTAs share their SMs
  // with the next layer's, stays in the verify's serial prologue. Unmeasured shapes (other heads,
  // head dims or T > 8) keep the eager commit.
  return best != nullptr && shape.K == 128 && shape.V == 128 &&
         best->deferred_vs_eager_pct <= -kMinGainPct;
}

}  // namespace kda
