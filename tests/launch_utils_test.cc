// ctas_per_unit_filling_waves (kernels/launch_utils.h): the commit's copy grids. A wrong pick
// costs a wave of idle SMs, not bits, so the test checks the choice itself against brute force.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>

#include "kernels/common/launch_utils.h"
#include "kernels/verify/tile_policy.h"

using kda::kernels::ceil_div;
using kda::kernels::ctas_per_unit_filling_waves;
using kda::kernels::one_cta_per_sm_tiles_on;
using kda::kernels::TileOccupancy;

namespace {

/// Fill of the last wave as a fraction (the quantity the function maximises).
double fill(int64_t k, int64_t units, int64_t wave) {
  const int64_t ctas = k * units;
  return static_cast<double>(ctas) / static_cast<double>(ceil_div(ctas, wave) * wave);
}

}  // namespace

TEST_CASE("launch_utils: copy grid on an H200 (1056 resident copy CTAs)", "[kernels]") {
  const int64_t wave = 132 * 8;
  // Kimi-Linear snapshot commit, 20 layers: the measured rows of docs/perf_log.md v11b.
  CHECK(ctas_per_unit_filling_waves(20, 64, wave) == 52);    // B = 1: 1040 CTAs, one wave
  CHECK(ctas_per_unit_filling_waves(640, 64, wave) == 33);   // B = 32: exactly 20 waves
  CHECK(ctas_per_unit_filling_waves(1280, 64, wave) == 33);  // B = 64: exactly 40 waves
  for (const int64_t units : {20, 40, 80, 160, 320, 640, 1280}) {
    CAPTURE(units);
    CHECK(fill(ctas_per_unit_filling_waves(units, 64, wave), units, wave) > 0.98);
  }
  // One CTA per unit is all there is to split: 1 whatever the fill.
  CHECK(ctas_per_unit_filling_waves(1280, 1, wave) == 1);
  CHECK(ctas_per_unit_filling_waves(7, 1, wave) == 1);
}

TEST_CASE("launch_utils: the pick is the best fill, the smallest on a tie (brute force)",
          "[kernels]") {
  std::mt19937_64 rng(Catch::rngSeed() + 77);
  std::uniform_int_distribution<int64_t> units_d(1, 5000), most_d(1, 64), wave_d(1, 2048);
  for (int i = 0; i < 2000; ++i) {
    const int64_t units = units_d(rng), most = most_d(rng), wave = wave_d(rng);
    CAPTURE(units, most, wave);
    const int64_t k = ctas_per_unit_filling_waves(units, most, wave);
    REQUIRE(k >= 1);
    REQUIRE(k <= most);
    for (int64_t j = 1; j <= most; ++j) {
      // Exact comparison of the fractions (j*units)/(waves_j*wave) in integers.
      const int64_t cj = j * units, ck = k * units;
      const int64_t wj = ceil_div(cj, wave), wk = ceil_div(ck, wave);
      REQUIRE(cj * wk <= ck * wj);  // no j fills better
      if (j < k) {
        REQUIRE(cj * wk < ck * wj);  // and none smaller fills as well
      }
    }
  }
}

TEST_CASE("launch_utils: the per-item tiles' register budget (one or two CTAs per SM)",
          "[kernels]") {
  // Auto: one per SM only where the launch gains from it (grouped steps) and the grid has at
  // most one CTA per SM.
  CHECK(one_cta_per_sm_tiles_on(128, true, 132, TileOccupancy::kAuto));
  CHECK(one_cta_per_sm_tiles_on(132, true, 132, TileOccupancy::kAuto));
  CHECK_FALSE(one_cta_per_sm_tiles_on(133, true, 132, TileOccupancy::kAuto));
  CHECK_FALSE(one_cta_per_sm_tiles_on(128, false, 132, TileOccupancy::kAuto));  // snapshot
  CHECK_FALSE(one_cta_per_sm_tiles_on(1, true, 0, TileOccupancy::kAuto));       // no device
  // The fused BV = 128 tile: up to kWideFusedMaxWaves waves (3 on the H200: 396 CTAs).
  constexpr int kWaves = kda::kernels::kWideFusedMaxWaves;
  CHECK(one_cta_per_sm_tiles_on(256, true, 132, TileOccupancy::kAuto, kWaves));
  CHECK(one_cta_per_sm_tiles_on(396, true, 132, TileOccupancy::kAuto, kWaves));
  CHECK_FALSE(one_cta_per_sm_tiles_on(397, true, 132, TileOccupancy::kAuto, kWaves));
  CHECK_FALSE(one_cta_per_sm_tiles_on(256, false, 132, TileOccupancy::kAuto, kWaves));
  CHECK_FALSE(one_cta_per_sm_tiles_on(256, true, 132, TileOccupancy::kTwoPerSm, kWaves));
  // Forced (tests): whatever the grid.
  CHECK(one_cta_per_sm_tiles_on(4096, false, 132, TileOccupancy::kOnePerSm));
  CHECK_FALSE(one_cta_per_sm_tiles_on(1, true, 132, TileOccupancy::kTwoPerSm));
}

TEST_CASE("launch_utils: snapshot tiles go one per SM only for fuller waves", "[kernels]") {
  using kda::kernels::one_per_sm_fills_waves_better;
  using kda::kernels::wave_fill_permille;
  // ctas / (waves * slots) in thousandths, rounded down.
  CHECK(wave_fill_permille(384, 132, 1) == 969);  // 3 waves of 132
  CHECK(wave_fill_permille(384, 132, 2) == 727);  // 2 waves of 264
  CHECK(wave_fill_permille(132, 132, 1) == 1000);
  CHECK(wave_fill_permille(133, 132, 1) == 503);
  CHECK(wave_fill_permille(10, 0, 1) == 0);
  CHECK(wave_fill_permille(0, 132, 2) == 0);
  // K3 TP8 B = 16 at BV = 64 (measured 2.4-2.8% faster one per SM, docs/perf_log.md v32).
  CHECK(one_per_sm_fills_waves_better(384, 132));
  CHECK(one_per_sm_fills_waves_better(600, 132));  // 909 against 757
  // Within one wave of two per SM, or equal fills (256, 512, 768 CTAs: two per SM measured
  // 7-17% faster), or no device: two per SM.
  CHECK_FALSE(one_per_sm_fills_waves_better(192, 132));
  CHECK_FALSE(one_per_sm_fills_waves_better(264, 132));
  CHECK_FALSE(one_per_sm_fills_waves_better(512, 132));
  CHECK_FALSE(one_per_sm_fills_waves_better(768, 132));
  CHECK_FALSE(one_per_sm_fills_waves_better(384, 0));
}

TEST_CASE("launch_utils: a deferred verify triggers at its entry only one per SM at short drafts",
          "[kernels]") {
  using kda::kernels::deferred_triggers_at_entry;
  // The measured rows of docs/perf_log.md v56 / v59: T = 1-2 gain in the one-per-SM forms, and
  // up to T = 4 in grids of at most 48 CTAs (K3 TP8 B = 2 / 4); beyond, and in every two-per-SM
  // form (the BV = 32 tile at any occupancy), they lose.
  for (const int64_t ctas : {48, 64, 128, 256}) {
    CAPTURE(ctas);
    CHECK(deferred_triggers_at_entry(1, true, ctas));
    CHECK(deferred_triggers_at_entry(2, true, ctas));
    CHECK(deferred_triggers_at_entry(3, true, ctas) == (ctas <= 48));
    CHECK(deferred_triggers_at_entry(4, true, ctas) == (ctas <= 48));
    CHECK_FALSE(deferred_triggers_at_entry(5, true, ctas));
    CHECK_FALSE(deferred_triggers_at_entry(8, true, ctas));
    CHECK_FALSE(deferred_triggers_at_entry(1, false, ctas));
    CHECK_FALSE(deferred_triggers_at_entry(2, false, ctas));
    CHECK_FALSE(deferred_triggers_at_entry(0, true, ctas));  // no draft
  }
}
