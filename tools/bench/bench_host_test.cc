// bench_host_test.cc: kda_bench's host-only parts: flags, byte model, plans, targets, dispatch
// advice, the numerics axis and its statistics (no device: nothing here allocates or launches).
#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "kernels/kda_kernels.h"
#include "tools/bench/bench_args.h"
#include "tools/bench/bench_bytes.h"
#include "tools/bench/bench_plan.h"
#include "tools/bench/bench_report.h"

namespace kda::bench {
namespace {

BenchArgs parse(std::vector<const char*> argv) {
  argv.insert(argv.begin(), "kda_bench");
  auto a = parse_bench_args(static_cast<int>(argv.size()), argv.data());
  REQUIRE(a.has_value());
  return *a;
}

void require_arg_error(std::vector<const char*> argv, const std::string& needle) {
  argv.insert(argv.begin(), "kda_bench");
  try {
    parse_bench_args(static_cast<int>(argv.size()), argv.data());
    FAIL("no ArgError for " << needle);
  } catch (const ArgError& e) {
    INFO(e.what());
    REQUIRE(std::string(e.what()).find(needle) != std::string::npos);
  }
}

/// A timed verify row at T = 4 (the report's input).
Row verify_row_at_t4(Variant v, int B, int bv, double us) {
  Row r;
  r.what = variant_name(v);
  r.mode = variant_mode(v);
  r.fused = variant_is_fused(v);
  r.T = 4;
  r.B = B;
  r.bv = bv;
  r.timing.median_us = us;
  return r;
}

/// The full model's floor is within 0.05 us + 0.5% of contract §6's floor table (whose
/// numbers match this model without the conv weights, 0.05 us per call at the Kimi shape).
bool near_contract(const Shape& s, int B, int T, double contract_us) {
  const double us = floor_us(verify_bytes(s, B, T, RecordMode::kRing).model(), 4150.0);
  INFO("B=" << B << " T=" << T << " model " << us << " us, contract " << contract_us);
  return std::fabs(us - contract_us) <= 0.05 + 0.005 * contract_us;
}

}  // namespace

TEST_CASE("kda_bench args: defaults and presets", "[tools][bench]") {
  const BenchArgs d = parse({});
  CHECK(d.batch_sizes == std::vector<int>{1, 2, 4, 8, 16, 32, 64});
  CHECK(d.draft_tokens == std::vector<int>{4, 8});
  CHECK(d.block_v == 0);  // auto: the dispatcher's tile per B
  // Floors at the measured copy rate (run() fills hbm_gbps); the dry run plans at an H200's.
  CHECK(d.hbm_gbps == 0.0);
  CHECK(d.planning_gbps() == BenchArgs::kPlanningGbps);
  CHECK(parse({"--hbm-gbps", "3010"}).planning_gbps() == 3010.0);
  const RecordMode ring = RecordMode::kRing;
  const RecordMode snap = RecordMode::kSnapshot;
  CHECK(d.fused_block_vs(1, 4, ring) == std::vector<int>{kernels::default_block_v(1, 32, 128)});
  CHECK(d.fused_block_vs(64, 4, ring) == std::vector<int>{kernels::default_block_v(64, 32, 128)});
  CHECK(d.fused_block_vs(1, 4, ring) !=
        d.fused_block_vs(64, 4, ring));  // 32 vs 128 for Kimi-Linear
  // The device's SM count opens the one-CTA-per-SM window in ring mode only (B = 4: 128 CTAs),
  // and the auto tile follows T (K3 TP8 B = 1: BV = 32 at T = 4, 16 at T = 8; docs/perf_log.md
  // v42).
  BenchArgs on_h200 = d;
  on_h200.sms = 132;
  CHECK(on_h200.fused_block_vs(4, 4, ring) == std::vector<int>{128});
  CHECK(on_h200.fused_block_vs(4, 4, snap) == std::vector<int>{64});
  BenchArgs k3_h200 = parse({"--preset", "k3-tp8"});
  k3_h200.sms = 132;
  CHECK(k3_h200.fused_block_vs(1, 4, ring) == std::vector<int>{32});
  CHECK(k3_h200.fused_block_vs(1, 8, ring) == std::vector<int>{16});
  CHECK(d.fused_block_vs(4, 4, ring) == std::vector<int>{64});  // SM count unknown
  CHECK(parse({"--block-v", "16"}).fused_block_vs(64, 4, ring) == std::vector<int>{16});
  CHECK(parse({"--block-v", "16", "--block-v", "auto"}).block_v == 0);
  CHECK(d.variants.size() == 4);
  CHECK(d.effective_ring_len() == 16);
  CHECK(d.shape.D() == 2 * 32 * 128 + 32 * 128);

  const BenchArgs k3 = parse({"--preset", "k3-tp8"});
  CHECK(k3.shape.H == 12);
  CHECK(k3.shape.HV == 12);
  CHECK(k3.shape.gate == GateKind::kSafe);
  CHECK(k3.shape.lower_bound == -5.0f);

  // Flags override the preset whatever their order; --hv-heads follows --heads.
  const BenchArgs o = parse({"--heads=16", "--preset", "k3-tp8", "--lower-bound", "none"});
  CHECK(o.shape.H == 16);
  CHECK(o.shape.HV == 16);
  CHECK(o.shape.gate == GateKind::kStandard);

  const BenchArgs l = parse({"--draft-tokens", "16,4,4", "--variants", "fused+ring,unfused"});
  CHECK(l.draft_tokens == std::vector<int>{4, 16});
  CHECK(l.effective_ring_len() == 32);
  CHECK(l.variants == std::vector<Variant>{Variant::kUnfused, Variant::kFusedRing});
  CHECK(parse({"--sweep-bv"}).fused_block_vs(8, 4, RecordMode::kRing).size() ==
        std::size(kernels::kFusedBlockVs));
  CHECK(parse({}).launch == kernels::LaunchOverrides{});  // what engines run
  CHECK(parse({"--persistent", "always"}).launch.persistent == kernels::PersistentMode::kAlways);
  CHECK(parse({"--persistent=never"}).launch.persistent == kernels::PersistentMode::kNever);
  CHECK_FALSE(parse({}).launch.fast_walk);
  CHECK(parse({"--fast-walk", "on"}).launch.fast_walk);
  CHECK_FALSE(parse({"--fast-walk", "off"}).launch.fast_walk);
  require_arg_error({"--fast-walk", "maybe"}, "on or off");
  CHECK(parse({}).launch.fast_stagger);
  CHECK_FALSE(parse({"--fast-stagger", "off"}).launch.fast_stagger);
  CHECK(parse({"--fast-stagger", "on"}).launch.fast_stagger);
  require_arg_error({"--fast-stagger", "1"}, "on or off");
  CHECK(parse({}).launch.fast_fold_in_kernel);
  CHECK_FALSE(parse({"--fast-fold", "first"}).launch.fast_fold_in_kernel);
  CHECK(parse({"--fast-fold=kernel"}).launch.fast_fold_in_kernel);
  require_arg_error({"--fast-fold", "on"}, "kernel or first");
  CHECK(parse({"--tile-occupancy", "one"}).launch.occupancy == kernels::TileOccupancy::kOnePerSm);
  CHECK(parse({"--tile-occupancy=two"}).launch.occupancy == kernels::TileOccupancy::kTwoPerSm);
  CHECK_FALSE(parse({"--no-pdl"}).launch.pdl);
}

TEST_CASE("kda_bench args: bad values name the flag", "[tools][bench]") {
  require_arg_error({"--frobnicate"}, "unknown flag '--frobnicate'");
  require_arg_error({"--persistent", "sometimes"}, "auto, always or never");
  require_arg_error({"--tile-occupancy", "three"}, "auto, one or two");
  require_arg_error({"--heads", "x"}, "--heads: bad value 'x'");
  require_arg_error({"--heads"}, "--heads: missing value");
  require_arg_error({"--heads", "3", "--hv-heads", "8"}, "multiple of --heads");
  require_arg_error({"--head-k-dim", "96"}, "64 or 128");
  require_arg_error({"--hbm-gbps", "0"}, "a positive bandwidth");
  require_arg_error({"--block-v", "4"}, "--block-v: bad value '4'");
  require_arg_error({"--batch-sizes", "1,,2"}, "--batch-sizes");
  require_arg_error({"--batch-sizes", "0"}, "[1, 65535]");
  require_arg_error({"--lower-bound", "5"}, "negative");
  require_arg_error({"--conv-weight", "f16"}, "f32 or bf16");
  require_arg_error({"--out", "x.txt"}, ".csv or .json");
  require_arg_error({"--accepted", "5"}, "exceeds T=4");
  require_arg_error({"--ring-len", "8"}, "2*T_max=16");
  require_arg_error({"--ring-len", "24"}, "power of two");
  require_arg_error({"--variants", "fast"}, "--variants: bad value 'fast'");
  require_arg_error({"--phases", "verify,all,x"}, "--phases: bad value 'x'");
  require_arg_error({"--sweep-bv=1"}, "takes no value");
  require_arg_error({"extra"}, "unexpected argument");
  require_arg_error({"--commit-tracks"}, "needs the commit phase");
  require_arg_error({"--phases", "commit", "--commit-tracks=1"}, "takes no value");
}

TEST_CASE("kda_bench args: --commit-tracks", "[tools][bench]") {
  CHECK_FALSE(parse({}).commit_tracks);
  CHECK_FALSE(parse({"--phases", "commit"}).commit_tracks);
  CHECK(parse({"--phases", "commit", "--commit-tracks"}).commit_tracks);
  CHECK(parse({"--commit-tracks", "--phases", "all"}).commit_tracks);  // any order
  CHECK(bench_usage().find("--commit-tracks") != std::string::npos);
  // The last accepted step: k < n always (a valid track), k = 0 at n = 1.
  CHECK(commit_track_step(1) == 0);
  CHECK(commit_track_step(4) == 3);
}

TEST_CASE("kda_bench bytes: floors match contract §6", "[tools][bench]") {
  const Shape kimi = preset_shape(Preset::kKimiLinear);
  CHECK(near_contract(kimi, 1, 4, 0.67));
  CHECK(near_contract(kimi, 4, 4, 2.7));
  CHECK(near_contract(kimi, 16, 4, 10.7));
  CHECK(near_contract(kimi, 64, 4, 42.6));
  CHECK(near_contract(kimi, 1, 8, 0.81));
  CHECK(near_contract(kimi, 64, 8, 51.7));
  CHECK(near_contract(preset_shape(Preset::kK3Tp8), 64, 4, 16.0));
  // Without the conv weights the model reproduces the table to its printed digits.
  const VerifyBytes one = verify_bytes(kimi, 1, 4, RecordMode::kRing);
  CHECK(std::round(floor_us(one.model() - kimi.D() * 4 * 4, 4150.0) * 100) == 67);

  const VerifyBytes v = verify_bytes(kimi, 2, 4, RecordMode::kSnapshot);
  CHECK(v.state == 2 * 32 * 128 * 128 * 4);
  CHECK(v.records == 8LL * 32 * 128 * 128 * 4);
  CHECK(v.weights == 32 * 4 + 32 * 128 * 4 + kimi.D() * 4 * 4);
  CHECK(v.moved(true) - v.moved(false) == 2 * 8 * kimi.D() * 2);

  const CommitBytes c = commit_bytes(kimi, 20, 16, 3);
  CHECK(c.fold == 20LL * 16 * (2LL * 32 * 128 * 128 * 4 + 3 * ring_step_bytes(kimi)));
  CHECK(c.conv == 20LL * 16 * 3 * kimi.D() * 4);
}

TEST_CASE("kda_bench bytes: commit tracks", "[tools][bench]") {
  const Shape kimi = preset_shape(Preset::kKimiLinear);
  const int64_t state = 32LL * 128 * 128 * 4;
  const int64_t conv = 3 * kimi.D() * 2 * 2;  // window k read + conv state write
  const TrackBytes t = track_bytes(kimi, 20, 16, 3);
  CHECK(t.ring == 20LL * 16 * (state + conv));
  CHECK(t.snapshot == 20LL * 16 * (2 * state + conv));
  CHECK(t.deferred == 20LL * 16 * (2 * state + 4 * ring_step_bytes(kimi) + conv));
  // Linear in tracks and layers; only the deferred track depends on the step.
  CHECK(track_bytes(kimi, 1, 0, 3).deferred == 0);
  CHECK(track_bytes(kimi, 2, 3, 0).ring == 6 * track_bytes(kimi, 1, 1, 0).ring);
  CHECK(track_bytes(kimi, 1, 1, 0).snapshot == track_bytes(kimi, 1, 1, 7).snapshot);
  CHECK(track_bytes(kimi, 1, 1, 1).deferred - track_bytes(kimi, 1, 1, 0).deferred ==
        ring_step_bytes(kimi));
  // A tracked eager ring commit of every request: the untracked commit + half a fold's state.
  const CommitBytes c = commit_bytes(kimi, 20, 16, 4);
  CHECK(c.fold + c.conv + t.ring == c.fold + 2 * c.conv + 20LL * 16 * state);
  CHECK(describe_track_model(kimi).size() == 5);
}

TEST_CASE("kda_bench report: tracked commit rows in the CSV", "[tools][bench]") {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/kda_bench_tracks.csv";
  std::vector<Row> rows;
  for (const char* what : {"commit+ring", "commit+ring+track", "commit+track", "commit+deferred",
                           "commit+deferred+track"}) {
    Row r;
    r.phase = Phase::kCommit;
    r.what = what;
    r.T = 4;
    r.B = 16;
    r.layers = 20;
    r.timing.median_us = 10.0;
    rows.push_back(r);
  }
  const BenchArgs args = parse({"--phases", "commit", "--commit-tracks"});
  write_rows(path, RunInfo{}, rows, recommend(rows, args));
  std::ifstream in(path);
  std::string line;
  REQUIRE(std::getline(in, line));
  const auto fields = [](const std::string& l) { return std::count(l.begin(), l.end(), ',') + 1; };
  const auto header_fields = fields(line);
  size_t i = 0;
  while (std::getline(in, line)) {
    REQUIRE(i < rows.size());
    CAPTURE(line);
    CHECK(fields(line) == header_fields);
    CHECK(line.rfind("commit,4,16," + rows[i].what + ",", 0) == 0);
    ++i;
  }
  CHECK(i == rows.size());
}

TEST_CASE("kda_bench report: draft-shaped rows in the CSV, not in the advice", "[tools][bench]") {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/kda_bench_shapes.csv";
  const BenchArgs args = parse({"--batch-sizes", "4", "--draft-tokens", "4"});
  std::vector<Row> rows = {verify_row_at_t4(Variant::kFusedRing, 4, 128, 5.0),
                           verify_row_at_t4(Variant::kUnfusedRing, 4, 0, 7.0),
                           verify_row_at_t4(Variant::kFusedRing, 4, 64, 2.0)};
  rows[2].what = "fused+ring mixed (10 tok)";
  rows[2].draft_shape = DraftShape::kMixed;
  mark_best_bv(rows);
  CHECK(rows[0].best_bv);  // the faster mixed row is not the dense group's best
  CHECK(!rows[2].best_bv);
  const Recommendation rec = recommend(rows, args);
  REQUIRE(rec.entries.size() == 1);
  CHECK(rec.entries[0].ring_bv == 128);
  CHECK(rec.entries[0].ring_us == 5.0);
  write_rows(path, RunInfo{}, rows, rec);
  std::ifstream in(path);
  std::string header, dense, unfused, mixed;
  REQUIRE(std::getline(in, header));
  REQUIRE(std::getline(in, dense));
  REQUIRE(std::getline(in, unfused));
  REQUIRE(std::getline(in, mixed));
  // The draft_shape column (the step's columns follow it).
  const auto column = [](const std::string& line, size_t index) {
    size_t start = 0;
    for (size_t i = 0; i < index; ++i) {
      start = line.find(',', start) + 1;
    }
    return line.substr(start, line.find(',', start) - start);
  };
  size_t shape_col = 0;
  while (column(header, shape_col) != "draft_shape" && shape_col < 64) {
    ++shape_col;
  }
  REQUIRE(shape_col < 64);
  CHECK(column(dense, shape_col) == "dense");
  CHECK(mixed.rfind("verify,4,4,fused+ring mixed (10 tok),", 0) == 0);
  CHECK(column(mixed, shape_col) == "mixed");
}

TEST_CASE("kda_bench report: targets and dispatch advice", "[tools][bench]") {
  const Shape kimi = preset_shape(Preset::kKimiLinear);
  const RecordMode ring = RecordMode::kRing;
  // Contract §6: 1.15x (T = 4) and 1.2x (T = 8) the Kimi-Linear B = 64 floor at the card's copy
  // rate (H200 at 4150 GB/s: 49.0 and 62.1 µs; H100 at 3010 GB/s: 67.6 and 85.6 µs).
  const auto rounded = [](std::optional<double> us) { return std::round(us.value() * 10) / 10; };
  CHECK(rounded(target_us(Preset::kKimiLinear, kimi, ring, 4, 64, 4150.0)) == 49.0);
  CHECK(rounded(target_us(Preset::kKimiLinear, kimi, ring, 8, 64, 4150.0)) == 62.1);
  CHECK(rounded(target_us(Preset::kKimiLinear, kimi, ring, 4, 64, 3010.0)) == 67.6);
  CHECK(rounded(target_us(Preset::kKimiLinear, kimi, ring, 8, 64, 3010.0)) == 85.6);
  CHECK(!target_us(Preset::kKimiLinear, kimi, RecordMode::kSnapshot, 4, 64, 4150.0));
  CHECK(!target_us(Preset::kKimiLinear, kimi, ring, 4, 16, 4150.0));
  Shape other = kimi;
  other.conv_bias = true;
  CHECK(!target_us(Preset::kKimiLinear, other, ring, 4, 64, 4150.0));
  CHECK(!target_us(Preset::kK3Tp8, preset_shape(Preset::kK3Tp8), ring, 4, 64, 4150.0));

  BenchArgs args = parse({"--batch-sizes", "1,4,16", "--draft-tokens", "4", "--sweep-bv"});
  std::vector<Row> rows;
  const auto add = [&](Variant v, int B, int bv, double us) {
    rows.push_back(verify_row_at_t4(v, B, bv, us));
  };
  // Ring: fused wins at B=1 and 4 (BV 16 best at B=1, 32 at B=4), loses at 16.
  for (int B : {1, 4, 16}) {
    add(Variant::kUnfusedRing, B, 0, 10.0 * B);
    add(Variant::kFusedRing, B, 16, B == 1 ? 3.0 : 40.0 * B);
    add(Variant::kFusedRing, B, 32, B == 1 ? 3.3 : 8.0 * B + (B == 16 ? 100.0 : 0.0));
    add(Variant::kUnfused, B, 0, 20.0 * B);
    add(Variant::kFused, B, 64, 15.0 * B);
  }
  mark_best_bv(rows);
  CHECK(rows[1].best_bv);  // B=1 BV=16
  CHECK(!rows[2].best_bv);
  const Recommendation rec = recommend(rows, args);
  REQUIRE(rec.fused_ring_max_batch);
  CHECK(*rec.fused_ring_max_batch == 4);
  REQUIRE(rec.default_bv);
  CHECK(*rec.default_bv == 32);  // 3.3/3.0 at B=1 beats 160/32 at B=4
  REQUIRE(rec.entries.size() == 3);
  CHECK(rec.entries[2].ring_path == "unfused");
  CHECK(rec.entries[0].ring_path == "fused");
  CHECK(rec.entries[0].ring_bv == 16);
  CHECK(rec.entries[0].snap_path == "fused");
  // Auto tile for the Kimi-Linear shape: 32 at B = 1 (timed: 3.3 vs the best 3.0), 64 and 128
  // at B = 4 and 16 (not timed here).
  CHECK(rec.auto_ring.rows == 1);
  CHECK(rec.auto_ring.best == 0);
  CHECK(rec.auto_ring.worst == Approx(1.1));
  // BV = 32's slowdowns 1.1 (B = 1) and 1 (B = 4); the auto tile is not timed at B = 4.
  REQUIRE(rec.default_bv_slowdown);
  CHECK(*rec.default_bv_slowdown == Approx(std::sqrt(1.1)));
  CHECK_FALSE(rec.auto_ring_slowdown);
  CHECK_FALSE(rec.suggest_auto_bv());
  // Snapshot mode: only BV = 64 timed; the auto tile without a device (args.sms = 0) is 32 at
  // B = 1 (not timed), 64 at B = 4 (timed, the only one, so the best) and 128 at B = 16.
  CHECK(rec.auto_snapshot.rows == 1);
  CHECK(rec.auto_snapshot.best == 1);
  CHECK(rec.auto_snapshot.worst == Approx(1.0));
}

TEST_CASE("kda_bench report: the auto tile is suggested where it beats every fixed BV",
          "[tools][bench]") {
  // Kimi-Linear on 132 SMs, T = 4: the auto tile is BV = 32 at B = 1 and 128 at B = 4 (one CTA
  // per SM). Each is its row's best; a fixed BV loses at one of the two rows.
  BenchArgs args = parse({"--batch-sizes", "1,4", "--draft-tokens", "4", "--sweep-bv"});
  args.sms = 132;
  std::vector<Row> rows;
  const auto add = [&](Variant v, int B, int bv, double us) {
    rows.push_back(verify_row_at_t4(v, B, bv, us));
  };
  for (int B : {1, 4}) {
    add(Variant::kUnfusedRing, B, 0, 10.0 * B);
    add(Variant::kFusedRing, B, 32, B == 1 ? 3.0 : 9.0);
    add(Variant::kFusedRing, B, 128, B == 1 ? 4.0 : 5.0);
  }
  Recommendation rec = recommend(rows, args);
  REQUIRE(rec.default_bv);
  CHECK(*rec.default_bv == 128);  // sqrt(4/3) beats sqrt(9/5)
  REQUIRE(rec.default_bv_slowdown);
  CHECK(*rec.default_bv_slowdown == Approx(std::sqrt(4.0 / 3.0)));
  REQUIRE(rec.auto_ring_slowdown);
  CHECK(*rec.auto_ring_slowdown == Approx(1.0));
  CHECK(rec.suggest_auto_bv());
  // Slow the auto tile's B = 1 row down past the fixed pick: BV = 128 is suggested again.
  rows[1].timing.median_us = 6.0;  // B = 1, BV = 32: best is now BV = 128 (4.0)
  rec = recommend(rows, args);
  REQUIRE(rec.auto_ring_slowdown);
  CHECK(*rec.auto_ring_slowdown == Approx(std::sqrt(1.5)));
  CHECK(*rec.default_bv == 128);
  CHECK(*rec.default_bv_slowdown == Approx(1.0));
  CHECK_FALSE(rec.suggest_auto_bv());
}

TEST_CASE("kda_bench report: snapshot-only rows get no ring verdict", "[tools][bench]") {
  // The targets are ring mode's: a sweep of snapshot variants alone must not pass (or miss)
  // them on untimed ring rows (an earlier report compared 0.00 us with the target).
  BenchArgs args = parse({"--preset", "kimi-linear", "--batch-sizes", "1,64", "--draft-tokens", "4",
                          "--variants", "fused"});
  std::vector<Row> rows;
  for (int B : {1, 64}) {
    Row r;
    r.what = variant_name(Variant::kFused);
    r.mode = variant_mode(Variant::kFused);
    r.fused = true;
    r.T = 4;
    r.B = B;
    r.bv = 64;
    r.timing.median_us = 5.0 * B;
    rows.push_back(r);
  }
  const Recommendation rec = recommend(rows, args);
  REQUIRE(rec.entries.size() == 2);
  for (const DispatchEntry& e : rec.entries) {
    CAPTURE(e.B);
    CHECK(e.ring_path.empty());
    CHECK(e.snap_path == "fused");
    CHECK_FALSE(e.target_us);
  }
}

TEST_CASE("kda_bench args: the step phase", "[tools][bench]") {
  CHECK_FALSE(parse({}).phase_step);
  const BenchArgs kimi = parse({"--preset", "kimi-linear", "--phases", "step"});
  CHECK(kimi.phase_step);
  CHECK_FALSE(kimi.phase_verify);
  CHECK(kimi.step_hidden() == 2304);
  CHECK(kimi.mlp == 0);
  CHECK(kimi.step_iters == 20);
  CHECK(parse({"--preset", "k3-tp8", "--phases", "step"}).step_hidden() == 7168);
  CHECK(parse({"--phases", "step"}).step_hidden() == 2304);  // no preset: Kimi-Linear's
  const BenchArgs custom =
      parse({"--phases", "step", "--hidden", "4096", "--mlp", "8192", "--step-iters", "7"});
  CHECK(custom.step_hidden() == 4096);
  CHECK(custom.mlp == 8192);
  CHECK(custom.step_iters == 7);
  const BenchArgs all = parse({"--phases", "all"});
  CHECK((all.phase_verify && all.phase_commit && all.phase_round && all.phase_step));
  require_arg_error({"--phases", "step", "--hidden", "2300"}, "multiples of 8");
  require_arg_error({"--phases", "step", "--mlp", "100"}, "multiples of 8");
  require_arg_error({"--phases", "steps"}, "verify, commit, round, step or all");
  require_arg_error({"--hidden", "x"}, "--hidden: bad value 'x'");
  CHECK(bench_usage().find("--hidden") != std::string::npos);
}

TEST_CASE("kda_bench bytes: the lazy write-back's round", "[tools][bench]") {
  const Shape kimi = preset_shape(Preset::kKimiLinear);
  const int64_t state = int64_t{kimi.HV} * kimi.V * kimi.K * 4, step = ring_step_bytes(kimi);
  // T_max = 4, L = 16, 4 accepted a round: pending 0, 4, 8, 12, then the commit of the fourth
  // round folds 16 steps (16 + 4 > 16): a fold every 4 rounds, 6 history steps a verify on average.
  const LazyRound r = lazy_round(kimi, 20, 64, 4, 16, 4, 240);
  CHECK(r.folds == 60);
  CHECK(r.history == 6.0);
  const int64_t per = 20LL * 64;
  CHECK(r.delta == per * (6 * step + (2 * state + 16 * step) / 4) - per * (2 * state + 4 * step));
  // It saves: 1.5 of the eager round's 2 fold passes are gone, less the history's records.
  CHECK(r.delta < -per * state);
  // The smallest ring (L = 2 T_max) holds one round of T_max steps: a fold every second round,
  // one state pass a round saved, less 2 history steps a verify.
  const LazyRound tight = lazy_round(kimi, 20, 64, 4, 8, 4, 10);
  CHECK(tight.folds == 5);
  CHECK(tight.history == 2.0);
  CHECK(tight.delta == per * (2 * step - state));
}

TEST_CASE("kda_bench bytes: the step's KDA share model", "[tools][bench]") {
  const Shape kimi = preset_shape(Preset::kKimiLinear);
  const int64_t state = 32LL * 128 * 128 * 4;
  const int64_t head_u = 32LL * 128 * 4;
  const int64_t raw_v_beta = 32LL * (128 * 2 + 4);
  const std::vector<int> accepted{1, 4, 2};
  const StepBytes b = step_kda_bytes(kimi, 20, 3, 4, accepted);
  const int64_t verify = verify_bytes(kimi, 3, 4, RecordMode::kRing).model();
  const int64_t conv = 20LL * 3 * 3 * kimi.D() * 2 * 2;
  // Eager: 20 verifies, a fold of 2 state passes + 7 ring steps per layer, the conv commit.
  CHECK(b.ring == 20 * verify + 20LL * (3 * 2 * state + 7 * ring_step_bytes(kimi)) + conv);
  // Deferred: one state pass fewer per layer and request, plus u: 12 written, 7 folded from u.
  CHECK(b.deferred == b.ring - 20LL * 3 * state + 20LL * (12 * head_u + 7 * (head_u - raw_v_beta)));
  CHECK(b.deferred < b.ring);
  // Snapshot: verifies with snapshots, one snapshot read + state write per request and layer.
  CHECK(b.snapshot ==
        20 * verify_bytes(kimi, 3, 4, RecordMode::kSnapshot).model() + 20LL * 3 * 2 * state + conv);
  // With every request accepting n, the step's models are the round's (commit_bytes and the
  // deferred round's delta).
  const StepBytes all4 = step_kda_bytes(kimi, 20, 3, 4, {4, 4, 4});
  const CommitBytes c = commit_bytes(kimi, 20, 3, 4);
  CHECK(all4.ring == 20 * verify + c.fold + c.conv);
  CHECK(all4.deferred == all4.ring + deferred_round_delta(kimi, 20, 3, 4, 12));
  CHECK(all4.lazy == 0);  // no ring given
  // The lazy step: each request's lazy round (its own accepted length every step).
  const StepBytes mixed = step_kda_bytes(kimi, 20, 3, 4, {4, 1, 2}, 4, 16);
  CHECK(mixed.lazy == mixed.ring + lazy_round(kimi, 20, 1, 4, 16, 4).delta +
                          lazy_round(kimi, 20, 1, 4, 16, 1).delta +
                          lazy_round(kimi, 20, 1, 4, 16, 2).delta);
  CHECK(mixed.lazy < mixed.deferred);
  // The accepted lengths: in [1, T], reproducible, and they vary with the seed and the batch.
  for (const int T : {1, 4, 8}) {
    const std::vector<int> n = step_accepted(0, T, 64);
    REQUIRE(n.size() == 64);
    CHECK(*std::min_element(n.begin(), n.end()) >= 1);
    CHECK(*std::max_element(n.begin(), n.end()) <= T);
    CHECK(n == step_accepted(0, T, 64));
    if (T > 1) {
      CHECK(*std::min_element(n.begin(), n.end()) < *std::max_element(n.begin(), n.end()));
      CHECK(n != step_accepted(1, T, 64));
    }
  }
  CHECK(step_gemm_weight_bytes(kimi, 20, 2304, 0) == 20LL * (16416 + 4096) * 2304 * 2);
  CHECK(step_gemm_weight_bytes(kimi, 1, 2304, 8192) - step_gemm_weight_bytes(kimi, 1, 2304, 0) ==
        2LL * 8192 * 2304 * 2);
  CHECK(describe_step_model(kimi, 20, 2304, 0).size() == 2);
}

TEST_CASE("kda_bench plan: the step's layout and memory", "[tools][bench]") {
  const BenchArgs kimi = parse({"--preset", "kimi-linear", "--phases", "step"});
  const StepLayout k = step_layout(kimi, 4);
  CHECK(k.P == 12288 + 4096 + 32);
  CHECK(k.ld_proj == k.P);  // already 16-byte rows
  CHECK(k.rows == 4 * 8);   // B * T_max
  CHECK(k.stages == 20);
  // K3 TP8: P = 6156 pads to 6160, so a and b stay 16-byte aligned and rows are 16-byte pitched.
  const StepLayout k3 = step_layout(parse({"--preset", "k3-tp8", "--phases", "step"}), 4);
  CHECK(k3.P == 4608 + 1536 + 12);
  CHECK(k3.ld_proj == 6160);
  CHECK(step_layout(parse({"--phases", "step", "--mlp", "64"}), 1).stages == 40);

  const ProblemConfig cfg = step_problem_config(kimi, 4);
  CHECK(cfg.copies == 20);
  CHECK_FALSE(cfg.inputs);  // the verifies read the projection's columns
  CHECK(cfg.ring);
  CHECK(cfg.snapshot);  // the guard compares the snapshot step
  const BenchArgs unguarded =
      parse({"--phases", "step", "--variants", "fused+ring", "--skip-guard"});
  CHECK_FALSE(step_problem_config(unguarded, 4).snapshot);
  // Without inputs the Problem holds no mixed_qkv / a / b: 20 layers of them at B = 4, T_max = 8.
  ProblemConfig with_inputs = cfg;
  with_inputs.inputs = true;
  CHECK(Problem::device_bytes(with_inputs) - Problem::device_bytes(cfg) ==
        20LL * 32 * (12288 + 4096 + 32) * 2);
  // The guard's references cost memory; the weights dominate at B = 1.
  CHECK(k.device_bytes(kimi.shape, cfg, true) > k.device_bytes(kimi.shape, cfg, false));
  CHECK(step_layout(kimi, 1).device_bytes(kimi.shape, cfg, false) >
        step_gemm_weight_bytes(kimi.shape, 20, 2304, 0));
}

TEST_CASE("kda_bench report: step rows, the KDA share and the advice", "[tools][bench]") {
  const BenchArgs args = parse(
      {"--phases", "step", "--variants", "unfused+ring,fused+ring", "--batch-sizes", "1,2,4"});
  std::vector<Row> rows;
  const auto add = [&](int B, const std::string& what, double us) {
    Row r;
    r.phase = Phase::kStep;
    r.T = 4;
    r.B = B;
    r.what = what;
    r.timing.median_us = us;
    r.gemm_us = 100.0;
    r.share_us = us - 100.0;
    rows.push_back(r);
  };
  // B = 1: deferred loses; B = 2: wins by 0.5% (noise: eager); B = 4: wins by 5%.
  // Fused beats unfused at B = 1, 2 but not at 4.
  add(1, "fused+ring", 200.0);
  add(1, "fused+ring+deferred", 210.0);
  add(1, "unfused+ring", 220.0);
  add(2, "fused+ring", 300.0);
  add(2, "fused+ring+deferred", 298.5);
  add(2, "unfused+ring+deferred", 310.0);
  add(4, "fused+ring", 400.0);
  add(4, "fused+ring+deferred", 380.0);
  add(4, "unfused+ring", 379.0);
  const StepAdvice a = step_advice(rows, args);
  REQUIRE(a.entries.size() == 3);
  CHECK_FALSE(a.entries[0].defer);
  CHECK_FALSE(a.entries[1].defer);
  CHECK(a.entries[2].defer);
  CHECK(a.entries[2].gemm_us == 100.0);
  REQUIRE(a.fused_ring_max_batch.has_value());
  CHECK(*a.fused_ring_max_batch == 2);

  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/kda_bench_step.csv";
  RunInfo info;
  info.H = info.HV = 32;
  info.K = info.V = 128;
  info.hidden = 2304;
  write_rows(path, info, rows, Recommendation{});
  std::ifstream f(path);
  std::string header, first;
  std::getline(f, header);
  std::getline(f, first);
  CHECK(header.find(",gemm_us,share_us,H,HV,K,V,hidden") != std::string::npos);
  CHECK(first.rfind("step,4,1,fused+ring,", 0) == 0);
  CHECK(first.find(",100.0000,100.0000,32,32,128,128,2304") != std::string::npos);
}

TEST_CASE("kda_bench args: --numerics", "[tools][bench]") {
  using N = VerifyNumerics;
  CHECK(parse({}).numerics == std::vector<N>{N::kExact});
  CHECK(parse({"--numerics", "exact,fast"}).numerics == std::vector<N>{N::kExact, N::kFast});
  CHECK(parse({"--numerics=fast,exact,fast"}).numerics == std::vector<N>{N::kExact, N::kFast});
  const BenchArgs fast = parse({"--numerics", "fast", "--phases", "verify,round,step"});
  CHECK(fast.numerics == std::vector<N>{N::kFast});
  CHECK(fast.has_numerics(N::kFast));
  CHECK_FALSE(fast.has_numerics(N::kExact));
  CHECK(std::string(numerics_name(N::kExact)) == "exact");
  CHECK(std::string(numerics_name(N::kFast)) == "fast");
  CHECK(bench_usage().find("--numerics") != std::string::npos);

  require_arg_error({"--numerics", "quick"}, "--numerics: bad value 'quick' (exact or fast)");
  require_arg_error({"--numerics", "exact,"}, "--numerics: bad value ''");
  require_arg_error({"--numerics", "fast", "--variants", "fused,unfused+ring"},
                    "fast outputs are fused+ring's");
  require_arg_error({"--numerics", "fast", "--block-v", "16"}, "not a fast tile (32, 64, 128)");
  // With exact rows beside them the fast rows are only left out (a note).
  CHECK(parse({"--numerics", "exact,fast", "--block-v", "16"}).fast_block_vs(4).empty());
}

TEST_CASE("kda_bench args: the fast tiles and which rows take fast outputs", "[tools][bench]") {
  BenchArgs d = parse({"--numerics", "exact,fast"});
  for (int B : {1, 2, 4, 8, 16, 32, 64}) {
    CHECK(d.fast_block_vs(B) == std::vector<int>{kernels::default_fast_block_v(B, 32, 128, 0)});
  }
  d.sms = 132;  // the dispatcher's rule on the device's SM count
  CHECK(d.fast_block_vs(1) == std::vector<int>{32});
  CHECK(d.fast_block_vs(64) == std::vector<int>{128});
  CHECK(parse({"--numerics", "fast", "--block-v", "64"}).fast_block_vs(1) == std::vector<int>{64});
  CHECK(parse({"--numerics", "fast", "--sweep-bv"}).fast_block_vs(1) ==
        std::vector<int>(std::begin(kernels::kFastBlockVs), std::end(kernels::kFastBlockVs)));

  // block_vs: exact tiles as before; fast tiles for fused+ring only.
  CHECK(d.block_vs(Variant::kUnfused, VerifyNumerics::kExact, 4, 4) == std::vector<int>{0});
  CHECK(d.block_vs(Variant::kFusedRing, VerifyNumerics::kExact, 4, 4) ==
        d.fused_block_vs(4, 4, RecordMode::kRing));
  CHECK(d.block_vs(Variant::kFused, VerifyNumerics::kFast, 4, 4).empty());
  CHECK(d.block_vs(Variant::kUnfusedRing, VerifyNumerics::kFast, 4, 4).empty());
  CHECK(d.block_vs(Variant::kFusedRing, VerifyNumerics::kFast, 4, 4) == d.fast_block_vs(4));

  CHECK(variant_takes_fast(Variant::kFusedRing));
  CHECK_FALSE(variant_takes_fast(Variant::kFused));
  CHECK(fast_skip_reason(d, Variant::kFusedRing, 4, 64, false).empty());
  CHECK(fast_skip_reason(d, Variant::kFusedRing, 16, 32, false).empty());
  CHECK(fast_skip_reason(d, Variant::kFusedRing, 17, 32, false).find("exceeds the fast chunk") !=
        std::string::npos);
  CHECK(fast_skip_reason(d, Variant::kFusedRing, 4, 64, true).empty());  // u-free
  CHECK(fast_skip_reason(d, Variant::kFusedRing, 17, 64, true).find("exceeds the fast chunk") !=
        std::string::npos);
  CHECK(fast_skip_reason(d, Variant::kFused, 4, 64, false).find("exact only") != std::string::npos);
  const BenchArgs narrow = parse({"--numerics", "exact,fast", "--block-v", "16"});
  CHECK(fast_skip_reason(narrow, Variant::kFusedRing, 4, 0, false).find("--block-v 16") !=
        std::string::npos);
}

TEST_CASE("kda_bench plan: the fast rows and their tile", "[tools][bench]") {
  const BenchArgs a = parse({"--preset", "kimi-linear", "--numerics", "exact,fast",
                             "--draft-tokens", "4,20", "--batch-sizes", "1,64"});
  std::vector<std::string> notes;
  for (int B : {1, 64}) {
    const std::vector<VerifyConfig> c = verify_configs(a, B, 4, &notes);
    // Per variant its exact tile, then fused+ring's fast tile (the dispatcher's rule).
    const int fast_bv = kernels::default_fast_block_v(B, 32, 128, 0);
    REQUIRE(c.size() == 5);
    CHECK(c[0] == VerifyConfig{Variant::kUnfused, VerifyNumerics::kExact, 0});
    CHECK(c[3].variant == Variant::kFusedRing);
    CHECK(c[3].numerics == VerifyNumerics::kExact);
    CHECK(c[4] == VerifyConfig{Variant::kFusedRing, VerifyNumerics::kFast, fast_bv});
    const std::string kernel = fast_kernel_name(a, B, 4, fast_bv);
    CHECK(kernel.find("fast-chunk") != std::string::npos);
    CHECK(kernel.find(fmt::format("BV={} ", fast_bv)) != std::string::npos);
  }
  CHECK(fast_kernel_name(a, 1, 4, 32) != fast_kernel_name(a, 64, 4, 128));
  // The variants without fast outputs leave a note each, once.
  CHECK(notes.size() == 3);
  // T = 20 exceeds the fast chunk: its exact rows only.
  const std::vector<VerifyConfig> t20 = verify_configs(a, 1, 20, &notes);
  CHECK(t20.size() == 4);
  CHECK(std::none_of(t20.begin(), t20.end(),
                     [](const VerifyConfig& c) { return c.numerics == VerifyNumerics::kFast; }));
  CHECK(notes.back().find("T=20 exceeds the fast chunk") != std::string::npos);
  // --block-v outside the fast tiles: no fast rows, a note; --sweep-bv: every fast tile.
  std::vector<std::string> narrow_notes;
  CHECK(verify_configs(parse({"--numerics", "exact,fast", "--block-v", "16"}), 4, 4, &narrow_notes)
            .size() == 4);
  CHECK(std::any_of(narrow_notes.begin(), narrow_notes.end(), [](const std::string& n) {
    return n.find("not a fast tile") == 0 || n.find("--block-v 16") == 0;
  }));
  const std::vector<VerifyConfig> swept = verify_configs(
      parse({"--numerics", "fast", "--variants", "fused+ring", "--sweep-bv"}), 4, 4, nullptr);
  REQUIRE(swept.size() == std::size(kernels::kFastBlockVs));
  CHECK(swept[0] == VerifyConfig{Variant::kFusedRing, VerifyNumerics::kFast, 32});
  CHECK(swept[2] == VerifyConfig{Variant::kFusedRing, VerifyNumerics::kFast, 128});
  // The step guard keeps the fast step's replays and state.
  const BenchArgs step = parse({"--phases", "step", "--numerics", "exact,fast"});
  const ProblemConfig cfg = step_problem_config(step, 4);
  const StepLayout lay = step_layout(step, 4);
  CHECK(lay.device_bytes(step.shape, cfg, true, true) >
        lay.device_bytes(step.shape, cfg, true, false));
  CHECK(lay.device_bytes(step.shape, cfg, false, true) ==
        lay.device_bytes(step.shape, cfg, false, false));
}

TEST_CASE("kda_bench diff: bf16 ulps and the fast-vs-exact statistics", "[tools][bench]") {
  using numerics::bf16_ulp_distance;
  const bf16_t one{0x3f80}, next{0x3f81}, two{0x4000}, pos0{0x0000}, neg0{0x8000};
  const bf16_t tiny{0x0001}, neg_tiny{0x8001};
  CHECK(bf16_ulp_distance(one, one) == 0);
  CHECK(bf16_ulp_distance(one, next) == 1);
  CHECK(bf16_ulp_distance(next, one) == 1);
  CHECK(bf16_ulp_distance(one, two) == 0x80);
  CHECK(bf16_ulp_distance(pos0, neg0) == 0);
  CHECK(bf16_ulp_distance(tiny, neg_tiny) == 2);  // through zero

  OutputDiff d;
  CHECK(d.equal_pct() == 100.0);
  CHECK(d.rel_l2() == 0.0);
  std::vector<bf16_t> exact(1000, one), fast(1000, one);
  fast[10] = next;  // 1 of 1000 one ulp off: 99.9% equal, within contract §10 (b)
  d.add(fast.data(), exact.data(), 1000, 100);
  CHECK(d.elems == 1000);
  CHECK(d.equal == 999);
  CHECK(d.max_ulp == 1);
  CHECK(d.equal_pct() == Approx(99.9));
  const double step = bf16_to_float(next) - 1.0;
  CHECK(d.rel_l2() == Approx(std::sqrt(step * step / 1000.0)));
  CHECK(d.meets_contract());
  OutputDiff more;
  fast[11] = next;
  more.add(fast.data(), exact.data(), 1000, 100);
  CHECK_FALSE(more.meets_contract());  // 99.8% equal
  d.merge(more);
  CHECK(d.elems == 2000);
  CHECK(d.equal == 999 + 998);
  OutputDiff far;
  fast[11] = two;
  far.add(fast.data() + 11, exact.data() + 11, 1, 1);
  CHECK(far.max_ulp == 0x80);
  CHECK_FALSE(far.meets_contract());
  CHECK(far.describe().find("max 128 ulp") != std::string::npos);

  // An output cancelled far below its vector's largest one is counted at the floor (2^-12 of
  // that maximum): 100 bf16 ulps of a value 2^-20 of the maximum are under one ulp there.
  std::vector<bf16_t> w(8, one), g(8, one);
  w[3] = float_to_bf16(std::ldexp(1.0f, -20));
  g[3] = float_to_bf16(std::ldexp(1.0f, -20) * (1.0f + 100.0f / 128.0f));
  OutputDiff cancelled;
  cancelled.add(g.data(), w.data(), 8, 8);
  CHECK(cancelled.max_raw_ulp == 100);
  CHECK(cancelled.max_ulp == 1);
  // Above the floor the count is strict.
  g[3] = w[3] = float_to_bf16(0.5f);
  g[3] = next;
  OutputDiff strict;
  strict.add(g.data(), w.data(), 8, 8);
  CHECK(strict.max_ulp == strict.max_raw_ulp);
}

TEST_CASE("kda_bench report: the numerics column and the fast statistics", "[tools][bench]") {
  const BenchArgs args =
      parse({"--batch-sizes", "4", "--draft-tokens", "4", "--numerics", "exact,fast"});
  std::vector<Row> rows = {verify_row_at_t4(Variant::kFusedRing, 4, 64, 5.0),
                           verify_row_at_t4(Variant::kUnfusedRing, 4, 0, 7.0),
                           verify_row_at_t4(Variant::kFusedRing, 4, 64, 3.0)};
  rows[2].numerics = VerifyNumerics::kFast;
  rows[2].kernel = "verify_tile<f32 K=128 BV=64 fused fast-chunk>";
  OutputDiff d;
  const std::vector<bf16_t> e(1000, bf16_t{0x3f80});
  std::vector<bf16_t> f = e;
  f[0] = bf16_t{0x3f81};
  d.add(f.data(), e.data(), 1000, 100);
  rows[2].diff = d;
  rows[2].fp64 = Fp64Errors{3.0e-3, 2.5e-3};
  CHECK(rows[2].fp64->ratio() == Approx(1.2));
  CHECK(rows[2].fp64->meets_contract());
  CHECK_FALSE((Fp64Errors{3.2e-3, 2.5e-3}.meets_contract()));  // 1.28x: outside §10 (c)
  CHECK(Fp64Errors{}.ratio() == 1.0);
  mark_best_bv(rows);
  CHECK(rows[0].best_bv);  // the exact group's best: the fast row is another group
  CHECK(rows[2].best_bv);
  // The dispatch advice stays on exact rows.
  const Recommendation rec = recommend(rows, args);
  REQUIRE(rec.entries.size() == 1);
  CHECK(rec.entries[0].ring_us == 5.0);

  Row commit;
  commit.phase = Phase::kCommit;
  commit.what = "fold";
  rows.push_back(commit);
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/kda_bench_numerics.csv";
  write_rows(path, RunInfo{}, rows, rec);
  std::ifstream in(path);
  std::string header, exact_row, unfused_row, fast_row, commit_row;
  REQUIRE(std::getline(in, header));
  REQUIRE(std::getline(in, exact_row));
  REQUIRE(std::getline(in, unfused_row));
  REQUIRE(std::getline(in, fast_row));
  REQUIRE(std::getline(in, commit_row));
  // The new columns come after every existing one.
  const std::string tail =
      ",kernel,numerics,equal_pct,max_ulp,rel_l2_vs_exact,rel_l2_fast_vs_fp64,rel_l2_exact_vs_fp64";
  REQUIRE(header.size() > tail.size());
  CHECK(header.compare(header.size() - tail.size(), tail.size(), tail) == 0);
  CHECK(header.rfind("phase,T,B,variant,mode,fused,bv,best_bv,", 0) == 0);
  const auto fields = [](const std::string& l) { return std::count(l.begin(), l.end(), ',') + 1; };
  for (const std::string* l : {&exact_row, &unfused_row, &fast_row, &commit_row}) {
    CAPTURE(*l);
    CHECK(fields(*l) == fields(header));
  }
  const auto ends = [](const std::string& l, const std::string& s) {
    return l.size() >= s.size() && l.compare(l.size() - s.size(), s.size(), s) == 0;
  };
  CHECK(ends(exact_row, ",exact,,,,,"));
  // 2^-7 / sqrt(1000)
  CHECK(ends(fast_row, "fused fast-chunk>,fast,99.9000,1,2.4705e-04,3.0000e-03,2.5000e-03"));
  CHECK(ends(commit_row, ",,,,,,"));

  const std::string json = std::string(dir != nullptr ? dir : "/tmp") + "/kda_bench_numerics.json";
  write_rows(json, RunInfo{}, rows, rec);
  std::ifstream j(json);
  const std::string text((std::istreambuf_iterator<char>(j)), std::istreambuf_iterator<char>());
  CHECK(text.find("\"numerics\": \"fast\", \"equal_pct\": 99.9, \"max_ulp\": 1, "
                  "\"rel_l2_vs_exact\": ") != std::string::npos);
  CHECK(text.find("\"rel_l2_fast_vs_fp64\": 0.003, \"rel_l2_exact_vs_fp64\": 0.0025}") !=
        std::string::npos);
  CHECK(text.find("\"numerics\": \"exact\", \"equal_pct\": null") != std::string::npos);
}

TEST_CASE("kda_bench report: fast step rows stay out of the step advice", "[tools][bench]") {
  const BenchArgs args = parse({"--phases", "step", "--variants", "fused+ring", "--numerics",
                                "exact,fast", "--batch-sizes", "4"});
  std::vector<Row> rows;
  const auto add = [&](const std::string& what, VerifyNumerics n, double us) {
    Row r;
    r.phase = Phase::kStep;
    r.T = 4;
    r.B = 4;
    r.what = what;
    r.numerics = n;
    r.timing.median_us = us;
    r.gemm_us = 100.0;
    r.share_us = us - 100.0;
    rows.push_back(r);
  };
  add("fused+ring", VerifyNumerics::kExact, 400.0);
  add("fused+ring+deferred", VerifyNumerics::kExact, 380.0);
  add("fused+ring", VerifyNumerics::kFast, 300.0);       // faster, but another numerics
  add("fused+ring+lazy", VerifyNumerics::kFast, 250.0);  // fast only: against exact eager
  const StepAdvice a = step_advice(rows, args);
  REQUIRE(a.entries.size() == 1);
  CHECK(a.entries[0].eager_us == 400.0);
  CHECK(a.entries[0].defer);
  const std::vector<FastStepEntry> f = fast_step_entries(rows);
  REQUIRE(f.size() == 2);
  CHECK(f[0].what == "fused+ring");
  CHECK(f[0].exact_share_us == 300.0);
  CHECK(f[0].fast_share_us == 200.0);
  CHECK(f[1].what == "fused+ring+lazy");
  CHECK(f[1].exact_share_us == 300.0);
  CHECK(f[1].fast_share_us == 150.0);
}

}  // namespace kda::bench
