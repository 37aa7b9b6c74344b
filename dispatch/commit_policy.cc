#include "dispatch/commit_policy.h"

#include <cmath>
#include <cstddef>

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
constexpr Measured kH200[] = {
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

/// The same on an H100 SXM (docs/bench/h100_v66_auto_table.txt, log v66: the v65 build, mean of
/// two runs of three reps, run spread <= 1.15 points). Its memory is 0.70x the H200's for the same
/// SMs, so the state pass that the deferred commit saves weighs more: of the 112 rows it pays at
/// 10 where it does not on the H200 (by 2.5-12.7%) and loses at none where it pays there.
constexpr Measured kH100[] = {
    {32, 1, 1, -12.4},  {32, 1, 2, -21.7},  {32, 1, 4, -18.7},  {32, 1, 8, -20.8},
    {32, 1, 16, -25.4}, {32, 1, 32, -28.2}, {32, 1, 64, -29.7}, {32, 2, 1, -10.2},
    {32, 2, 2, -19.3},  {32, 2, 4, -19.9},  {32, 2, 8, -20.7},  {32, 2, 16, -22.7},
    {32, 2, 32, -25.4}, {32, 2, 64, -27.2}, {32, 3, 1, -10.5},  {32, 3, 2, -14.6},
    {32, 3, 4, -17.5},  {32, 3, 8, -17.7},  {32, 3, 16, -20.3}, {32, 3, 32, -22.7},
    {32, 3, 64, -25.1}, {32, 4, 1, -8.1},   {32, 4, 2, -12.5},  {32, 4, 4, -17.5},
    {32, 4, 8, -17.7},  {32, 4, 16, -17.8}, {32, 4, 32, -20.0}, {32, 4, 64, -22.6},
    {32, 5, 1, -2.7},   {32, 5, 2, -15.1},  {32, 5, 4, -14.5},  {32, 5, 8, -13.8},
    {32, 5, 16, -14.8}, {32, 5, 32, -14.7}, {32, 5, 64, -15.1}, {32, 6, 1, -2.5},
    {32, 6, 2, -13.6},  {32, 6, 4, -14.0},  {32, 6, 8, -13.4},  {32, 6, 16, -12.6},
    {32, 6, 32, -12.4}, {32, 6, 64, -12.4}, {32, 7, 1, -1.1},   {32, 7, 2, -13.1},
    {32, 7, 4, -13.2},  {32, 7, 8, -12.1},  {32, 7, 16, -11.5}, {32, 7, 32, -12.0},
    {32, 7, 64, -11.9}, {32, 8, 1, 0.5},    {32, 8, 2, -10.8},  {32, 8, 4, -11.6},
    {32, 8, 8, -10.4},  {32, 8, 16, -10.3}, {32, 8, 32, -10.2}, {32, 8, 64, -8.6},
    {12, 1, 1, 2.6},    {12, 1, 2, -7.3},   {12, 1, 4, -24.0},  {12, 1, 8, -23.4},
    {12, 1, 16, -21.7}, {12, 1, 32, -22.2}, {12, 1, 64, -26.8}, {12, 2, 1, 4.1},
    {12, 2, 2, -3.4},   {12, 2, 4, -21.3},  {12, 2, 8, -22.5},  {12, 2, 16, -21.9},
    {12, 2, 32, -20.4}, {12, 2, 64, -24.1}, {12, 3, 1, 3.7},    {12, 3, 2, 0.7},
    {12, 3, 4, -17.4},  {12, 3, 8, -21.3},  {12, 3, 16, -19.0}, {12, 3, 32, -18.1},
    {12, 3, 64, -21.5}, {12, 4, 1, 7.3},    {12, 4, 2, 0.2},    {12, 4, 4, -14.6},
    {12, 4, 8, -20.6},  {12, 4, 16, -12.7}, {12, 4, 32, -16.6}, {12, 4, 64, -19.4},
    {12, 5, 1, 5.0},    {12, 5, 2, 8.7},    {12, 5, 4, -12.1},  {12, 5, 8, -18.2},
    {12, 5, 16, -10.4}, {12, 5, 32, -13.0}, {12, 5, 64, -14.8}, {12, 6, 1, 7.2},
    {12, 6, 2, 8.2},    {12, 6, 4, -10.4},  {12, 6, 8, -17.3},  {12, 6, 16, -11.6},
    {12, 6, 32, -12.7}, {12, 6, 64, -12.7}, {12, 7, 1, 9.1},    {12, 7, 2, 8.9},
    {12, 7, 4, -9.1},   {12, 7, 8, -15.8},  {12, 7, 16, -10.7}, {12, 7, 32, -11.3},
    {12, 7, 64, -11.9}, {12, 8, 1, 12.2},   {12, 8, 2, 10.0},   {12, 8, 4, -6.9},
    {12, 8, 8, -13.9},  {12, 8, 16, -8.6},  {12, 8, 32, -9.5},  {12, 8, 64, -10.6}};

/// One measured card: its peak memory bandwidth (Platform::memory_gbps) and its table.
struct Card {
  double memory_gbps;
  const Measured* rows;
  size_t count;
};
constexpr Card kCards[] = {
    {4800.0, kH200, sizeof(kH200) / sizeof(kH200[0])},
    {3352.0, kH100, sizeof(kH100) / sizeof(kH100[0])},
};

/// The card whose memory bandwidth is nearest (by ratio) to `gbps`; unknown (<= 0): the H200.
/// The deferred commit trades one state pass of HBM traffic for the fold's arithmetic on the SMs,
/// so the ratio of the two rates decides where it pays; both measured cards have 132 SMs at the
/// same clocks.
const Card& nearest_card(double gbps) {
  const Card* best = &kCards[0];
  if (gbps <= 0.0) {
    return *best;
  }
  const auto distance = [gbps](const Card& c) { return std::fabs(std::log(gbps / c.memory_gbps)); };
  for (const Card& c : kCards) {
    if (distance(c) < distance(*best)) {
      best = &c;
    }
  }
  return *best;
}

/// A deferred round pays where it was measured faster by more than run-to-run noise.
constexpr double kMinGainPct = 2.0;

}  // namespace

bool deferred_commit_pays(const CommitPolicyShape& shape) {
  // The measured row nearest to the configured batch (same HV and T, largest B <= max_batch) in
  // the table of the card nearest to the device.
  const Card& card = nearest_card(shape.memory_gbps);
  const Measured* best = nullptr;
  for (size_t i = 0; i < card.count; ++i) {
    const Measured& m = card.rows[i];
    if (m.HV == shape.HV && m.T == shape.draft_tokens && m.B <= shape.max_batch &&
        (best == nullptr || m.B > best->B)) {
      best = &m;
    }
  }
  // The H200 table: Kimi-Linear defers at T <= 4 at every B, at T = 5-6 from B = 2, at T = 7 at
  // B = 2-7 and from B = 16, at T = 8 at B = 2-3 and from B = 16; K3 TP8 at T = 1 from B = 2, at
  // T = 2-5 from B = 4, at T = 6-7 at B = 4-31 and from B = 64, at T = 8 at B = 8-31 and from
  // B = 64. The H100 table: Kimi-Linear at every row but T = 7-8 B = 1; K3 TP8 from B = 4 at
  // every T, and at B = 2-3 for T <= 2. Where it loses, the fold of the first layer, or of tiles
  // whose CTAs share their SMs with the next layer's, stays in the verify's serial prologue.
  // Unmeasured shapes (other heads, head dims or T > 8) keep the eager commit.
  return best != nullptr && shape.K == 128 && shape.V == 128 &&
         best->deferred_vs_eager_pct <= -kMinGainPct;
}

}  // namespace kda
