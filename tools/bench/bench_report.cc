#include "tools/bench/bench_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <tuple>

#include "core/error.h"
#include "kernels/kda_kernels.h"
#include "tools/bench/bench_bytes.h"

namespace kda::bench {

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::kVerify:
      return "verify";
    case Phase::kCommit:
      return "commit";
    case Phase::kRound:
      return "round";
    case Phase::kStep:
      return "step";
  }
  return "?";
}

namespace {

const char* mode_name(RecordMode m) { return m == RecordMode::kRing ? "ring" : "snapshot"; }

bool same_shape(const Shape& a, const Shape& b) {
  return a.H == b.H && a.HV == b.HV && a.K == b.K && a.V == b.V && a.gate == b.gate &&
         a.lower_bound == b.lower_bound && a.conv_weight_type == b.conv_weight_type &&
         a.conv_bias == b.conv_bias;
}

struct TargetEntry {
  Preset preset;
  int T, B;
  double of_floor;  ///< the target: this multiple of the call's floor
};
// contract §6: the fused+ring verify (one layer's call in a CUDA graph), on the card at hand.
constexpr TargetEntry kTargets[] = {
    {Preset::kKimiLinear, 4, 64, 1.15},
    {Preset::kKimiLinear, 8, 64, 1.2},
};

std::string bv_cell(const Row& r) {
  if (!r.fused) {
    return "-";
  }
  return fmt::format("{}{}", r.bv, r.best_bv ? "*" : "");
}

std::string target_cells(const std::optional<double>& target, double us) {
  if (!target) {
    return fmt::format("{:>7} {:>4}", "", "");
  }
  return fmt::format("{:>7.1f} {:>4}", *target, us <= *target ? "pass" : "MISS");
}

/// The numerics columns of a verify / round / step row: numerics, eq%, ulp, rel L2 (fast rows;
/// "MISS" after a row outside contract §10 (b)).
std::string numerics_cells(const Row& r) {
  if (!r.diff) {
    return fmt::format("  {:<5} {:>8} {:>3} {:>8}", numerics_name(r.numerics), "-", "-", "-");
  }
  const OutputDiff& d = *r.diff;
  std::string cells =
      fmt::format("  {:<5} {:>7.3f}% {:>3} {:>8.1e}{}", numerics_name(r.numerics), d.equal_pct(),
                  d.max_ulp, d.rel_l2(), d.meets_contract() ? "" : " MISS");
  if (r.fp64) {
    cells += fmt::format("  fp64 {:.1e}/{:.1e} = {:.2f}x{}", r.fp64->fast, r.fp64->exact,
                         r.fp64->ratio(), r.fp64->meets_contract() ? "" : " MISS");
  }
  return cells;
}

std::string numerics_header() {
  return fmt::format("  {:<5} {:>8} {:>3} {:>8}", "num", "eq%", "ulp", "rel L2");
}

std::string json_str(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string json_num(double x) { return std::isfinite(x) ? fmt::format("{}", x) : "null"; }

std::string opt_num(const std::optional<double>& x) { return x ? json_num(*x) : "null"; }
/// Whether a row times verifies (it has a numerics): not the commit rows, not the gemm-only step.
bool runs_verify(const Row& r) { return r.phase != Phase::kCommit && r.what != "gemm-only"; }

/// The CSV's equal_pct,max_ulp,rel_l2_vs_exact cells (empty without a comparison).
std::string diff_csv(const std::optional<OutputDiff>& d) {
  if (!d) {
    return ",,";
  }
  return fmt::format("{:.4f},{},{:.4e}", d->equal_pct(), d->max_ulp, d->rel_l2());
}

/// The CSV's rel_l2_fast_vs_fp64,rel_l2_exact_vs_fp64 cells (empty without the oracle).
std::string fp64_csv(const std::optional<Fp64Errors>& e) {
  return e ? fmt::format("{:.4e},{:.4e}", e->fast, e->exact) : ",";
}

std::string opt_int(const std::optional<int>& x) { return x ? fmt::format("{}", *x) : "null"; }

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace

std::optional<double> target_us(Preset preset, const Shape& shape, RecordMode mode, int T, int B,
                                double floor_gbps) {
  if (preset == Preset::kNone || mode != RecordMode::kRing ||
      !same_shape(shape, preset_shape(preset))) {
    return std::nullopt;
  }
  for (const TargetEntry& t : kTargets) {
    if (t.preset == preset && t.T == T && t.B == B) {
      return t.of_floor * floor_us(verify_bytes(shape, B, T, mode).model(), floor_gbps);
    }
  }
  return std::nullopt;
}

void mark_best_bv(std::vector<Row>& rows) {
  std::map<std::tuple<int, int, int, int, int>, Row*> best;
  for (Row& r : rows) {
    if (!r.fused || r.draft_shape != DraftShape::kDense) {
      continue;
    }
    r.best_bv = false;
    const auto key = std::make_tuple(static_cast<int>(r.phase), r.T, r.B, static_cast<int>(r.mode),
                                     static_cast<int>(r.numerics));
    auto it = best.find(key);
    if (it == best.end() || r.timing.median_us < it->second->timing.median_us) {
      best[key] = &r;
    }
  }
  for (auto& kv : best) {
    kv.second->best_bv = true;
  }
}

void print_table_header(Phase phase) {
  switch (phase) {
    case Phase::kVerify:
      fmt::print("\n{:>3} {:>5}  {:<13} {:>4} {:>9} {:>9} {:>9} {:>8} {:>7} {:>8} {:>7} {:>4}{}\n",
                 "T", "B", "variant", "BV", "us/call", "min", "max", "GB/s", "%floor", "floor",
                 "target", "ok", numerics_header());
      break;
    case Phase::kCommit:
      fmt::print("\n{:>3} {:>5}  {:<21} {:>6} {:>9} {:>9} {:>9} {:>8} {:>7}\n", "T", "B", "commit",
                 "layers", "us/call", "min", "max", "GB/s", "%copy");
      break;
    case Phase::kRound:
      fmt::print("\n{:>3} {:>5}  {:<13} {:>4} {:>6} {:>9} {:>9} {:>9} {:>9} {:>8} {:>7}{}\n", "T",
                 "B", "round", "BV", "layers", "us/round", "min", "max", "us/layer", "GB/s",
                 "%floor", numerics_header());
      break;
    case Phase::kStep:
      fmt::print(
          "\n{:>3} {:>5}  {:<21} {:>4} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}{}\n",
          "T", "B", "step", "BV", "layers", "us/step", "min", "max", "gemm-only", "KDA share",
          "us/layer", "floor", "%floor", numerics_header());
      break;
  }
  std::fflush(stdout);
}

void print_row(const Row& r) {
  const Timing& t = r.timing;
  switch (r.phase) {
    case Phase::kVerify:
      fmt::print(
          "{:>3} {:>5}  {:<13} {:>4} {:>9.2f} {:>9.2f} {:>9.2f} {:>8.0f} {:>6.1f}% {:>8.2f} {}{}\n",
          r.T, r.B, r.what, bv_cell(r), t.median_us, t.min_us, t.max_us, r.gbps, r.pct, r.floor_us,
          target_cells(r.target_us, t.median_us), numerics_cells(r));
      break;
    case Phase::kCommit:
      fmt::print("{:>3} {:>5}  {:<21} {:>6} {:>9.2f} {:>9.2f} {:>9.2f} {:>8.0f} {:>6.1f}%\n", r.T,
                 r.B, r.what, r.layers, t.median_us, t.min_us, t.max_us, r.gbps, r.pct);
      break;
    case Phase::kRound:
      fmt::print(
          "{:>3} {:>5}  {:<13} {:>4} {:>6} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.2f} {:>8.0f} "
          "{:>6.1f}%{}\n",
          r.T, r.B, r.what, bv_cell(r), r.layers, t.median_us, t.min_us, t.max_us,
          t.median_us / r.layers, r.gbps, r.pct, numerics_cells(r));
      break;
    case Phase::kStep:
      if (r.what == "gemm-only") {
        fmt::print("{:>3} {:>5}  {:<21} {:>4} {:>6} {:>9.1f} {:>9.1f} {:>9.1f}\n", r.T, r.B, r.what,
                   "-", r.layers, t.median_us, t.min_us, t.max_us);
      } else {
        fmt::print(
            "{:>3} {:>5}  {:<21} {:>4} {:>6} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.2f} "
            "{:>9.1f} {:>6.1f}%{}\n",
            r.T, r.B, r.what, bv_cell(r), r.layers, t.median_us, t.min_us, t.max_us, r.gemm_us,
            r.share_us, r.share_us / r.layers, r.floor_us, r.pct, numerics_cells(r));
      }
      break;
  }
  std::fflush(stdout);
}

StepAdvice step_advice(const std::vector<Row>& rows, const BenchArgs& args) {
  StepAdvice advice;
  // (T, B) -> variant -> step us.
  std::map<std::pair<int, int>, std::map<std::string, const Row*>> steps;
  for (const Row& r : rows) {
    if (r.phase == Phase::kStep && r.numerics == VerifyNumerics::kExact) {
      steps[{r.T, r.B}][r.what] = &r;
    }
  }
  const std::string fused = variant_name(Variant::kFusedRing);
  const std::string unfused = variant_name(Variant::kUnfusedRing);
  for (const auto& [tb, by] : steps) {
    const auto eager = by.find(fused);
    const auto deferred = by.find(fused + "+deferred");
    if (eager == by.end() || deferred == by.end()) {
      continue;
    }
    StepAdviceEntry e;
    e.T = tb.first;
    e.B = tb.second;
    e.eager_us = eager->second->timing.median_us;
    e.deferred_us = deferred->second->timing.median_us;
    e.gemm_us = eager->second->gemm_us;
    e.defer = e.deferred_us < e.eager_us * (1.0 - kStepDeferMinGainPct / 100.0);
    advice.entries.push_back(e);
  }
  // --kda-fused-ring-max-batch on the step: per T, the largest B with fused+ring faster than
  // unfused+ring at every measured B' <= B (each with its better commit).
  const auto best_of = [&](const std::map<std::string, const Row*>& by, const std::string& v) {
    std::optional<double> best;
    for (const std::string& name : {v, v + "+deferred"}) {
      if (const auto it = by.find(name); it != by.end()) {
        best = std::min(best.value_or(it->second->timing.median_us), it->second->timing.median_us);
      }
    }
    return best;
  };
  for (int T : args.draft_tokens) {
    int max_b = 0;
    bool decided = false;
    for (int B : args.batch_sizes) {
      const auto it = steps.find({T, B});
      if (it == steps.end()) {
        break;
      }
      const std::optional<double> f = best_of(it->second, fused);
      const std::optional<double> u = best_of(it->second, unfused);
      if (!f || !u) {
        break;
      }
      decided = true;
      if (*f < *u) {
        max_b = B;
      } else {
        break;
      }
    }
    if (decided) {
      advice.max_batch_per_T.emplace_back(T, max_b);
      advice.fused_ring_max_batch = std::min(advice.fused_ring_max_batch.value_or(max_b), max_b);
    }
  }
  return advice;
}

std::vector<FastStepEntry> fast_step_entries(const std::vector<Row>& rows) {
  std::vector<FastStepEntry> out;
  for (const Row& f : rows) {
    if (f.phase != Phase::kStep || f.numerics != VerifyNumerics::kFast) {
      continue;
    }
    // A lazy step (fast only) against the exact eager step of its variant.
    const std::string lazy = "+lazy";
    const bool is_lazy = f.what.size() > lazy.size() &&
                         f.what.compare(f.what.size() - lazy.size(), lazy.size(), lazy) == 0;
    const std::string exact_what = is_lazy ? f.what.substr(0, f.what.size() - lazy.size()) : f.what;
    for (const Row& e : rows) {
      if (e.phase == Phase::kStep && e.numerics == VerifyNumerics::kExact && e.what == exact_what &&
          e.T == f.T && e.B == f.B) {
        out.push_back({f.T, f.B, f.what, e.share_us, f.share_us});
        break;
      }
    }
  }
  return out;
}

void print_step_advice(const StepAdvice& advice) {
  if (!advice.entries.empty()) {
    fmt::print(
        "\n--kda-deferred-commit auto on the step (fused+ring; deferred where faster by more than "
        "{:g}%):\n{:>3} {:>5}  {:>10} {:>11} {:>9}  {}\n",
        kStepDeferMinGainPct, "T", "B", "eager us", "deferred us", "deferred", "choice");
    for (const StepAdviceEntry& e : advice.entries) {
      fmt::print("{:>3} {:>5}  {:>10.1f} {:>11.1f} {:>+8.1f}%  {}\n", e.T, e.B, e.eager_us,
                 e.deferred_us, 100.0 * (e.deferred_us / e.eager_us - 1.0),
                 e.defer ? "deferred" : "eager");
    }
  }
  if (!advice.max_batch_per_T.empty()) {
    std::vector<std::string> per_t;
    for (const auto& [T, b] : advice.max_batch_per_T) {
      per_t.push_back(fmt::format("T={}: {}", T, b));
    }
    fmt::print(
        "suggested --kda-fused-ring-max-batch={} on the step ({}; largest measured B such that "
        "the fused+ring step beats the unfused+ring step at every measured B' <= B, each with its "
        "better commit, min over T)\n",
        *advice.fused_ring_max_batch, fmt::join(per_t, ", "));
  }
  std::fflush(stdout);
}

Recommendation recommend(const std::vector<Row>& rows, const BenchArgs& args) {
  Recommendation rec;
  rec.bv_swept = args.sweep_bv;
  // (T, B) -> per mode: unfused time, fused time per BV.
  struct Times {
    std::optional<double> unfused;
    std::map<int, double> fused;  // bv -> us
  };
  std::map<std::pair<int, int>, Times> ring, snap;
  for (const Row& r : rows) {
    if (r.phase != Phase::kVerify || r.draft_shape != DraftShape::kDense ||
        r.numerics != VerifyNumerics::kExact) {
      continue;
    }
    Times& t = (r.mode == RecordMode::kRing ? ring : snap)[{r.T, r.B}];
    if (r.fused) {
      t.fused[r.bv] = r.timing.median_us;
    } else {
      t.unfused = r.timing.median_us;
    }
  }
  const auto best_fused = [](const Times& t) {
    return std::min_element(t.fused.begin(), t.fused.end(),
                            [](const auto& a, const auto& b) { return a.second < b.second; });
  };
  // Pick the faster path: (name, bv, us, other us).
  const auto choose = [&](const Times& t, std::string* path, int* bv, double* us, double* alt) {
    const bool has_f = !t.fused.empty();
    if (has_f) {
      const auto f = best_fused(t);
      if (!t.unfused || f->second < *t.unfused) {
        *path = "fused";
        *bv = f->first;
        *us = f->second;
        *alt = t.unfused.value_or(0.0);
        return;
      }
      *alt = f->second;
    }
    if (t.unfused) {
      *path = "unfused";
      *us = *t.unfused;
    }
  };
  std::map<std::pair<int, int>, bool> keys;
  for (const auto& kv : ring) {
    keys[kv.first] = true;
  }
  for (const auto& kv : snap) {
    keys[kv.first] = true;
  }
  for (const auto& kv : keys) {
    DispatchEntry e;
    e.T = kv.first.first;
    e.B = kv.first.second;
    if (auto it = ring.find(kv.first); it != ring.end()) {
      choose(it->second, &e.ring_path, &e.ring_bv, &e.ring_us, &e.ring_alt_us);
    }
    if (auto it = snap.find(kv.first); it != snap.end()) {
      choose(it->second, &e.snap_path, &e.snap_bv, &e.snap_us, &e.snap_alt_us);
    }
    // The targets are ring mode's: a row with no ring path timed has no verdict.
    if (!e.ring_path.empty()) {
      e.target_us =
          target_us(args.preset, args.shape, RecordMode::kRing, e.T, e.B, args.planning_gbps());
    }
    rec.entries.push_back(e);
  }

  // How the dispatcher's per-call auto tile fares against the swept best, in each mode.
  const auto score = [&](const auto& table, RecordMode mode, AutoTileScore* out) {
    for (const auto& [tb, t] : table) {
      const int auto_bv = kernels::default_fused_block_v(mode, tb.second, tb.first, args.shape.HV,
                                                         args.shape.V, args.sms);
      const auto it = t.fused.find(auto_bv);
      if (it == t.fused.end()) {
        continue;
      }
      const auto best = best_fused(t);
      out->rows += 1;
      out->best += best->first == auto_bv ? 1 : 0;
      out->worst = std::max(out->worst, it->second / best->second);
    }
  };
  score(ring, RecordMode::kRing, &rec.auto_ring);
  score(snap, RecordMode::kSnapshot, &rec.auto_snapshot);

  // --kda-fused-ring-max-batch: per T, the largest B with fused fastest at every B' <= B.
  for (int T : args.draft_tokens) {
    int max_b = 0;
    bool decided = false;
    for (int B : args.batch_sizes) {
      auto it = ring.find({T, B});
      if (it == ring.end() || it->second.fused.empty() || !it->second.unfused) {
        break;
      }
      decided = true;
      if (best_fused(it->second)->second < *it->second.unfused) {
        max_b = B;
      } else {
        break;
      }
    }
    if (decided) {
      rec.max_batch_per_T.emplace_back(T, max_b);
      rec.fused_ring_max_batch = std::min(rec.fused_ring_max_batch.value_or(max_b), max_b);
    }
  }

  // Default BV: the smallest geometric-mean slowdown vs each (T, B)'s best BV, over the rows
  // where fused would be dispatched (ring: B <= the suggested max batch; all rows if none).
  // `slowdown` (if given) receives the pick's geometric-mean slowdown.
  const auto pick_bv = [&](const std::map<std::pair<int, int>, Times>& m, int max_b,
                           std::optional<double>* slowdown) -> std::optional<int> {
    std::map<int, std::pair<double, int>> score;  // bv -> (sum log slowdown, groups)
    for (const auto& kv : m) {
      if (kv.first.second > max_b || kv.second.fused.empty()) {
        continue;
      }
      const double best = best_fused(kv.second)->second;
      for (const auto& [bv, us] : kv.second.fused) {
        score[bv].first += std::log(us / best);
        score[bv].second += 1;
      }
    }
    std::optional<int> pick;
    double pick_score = 0.0;
    int groups = 0;
    for (const auto& [bv, s] : score) {
      groups = std::max(groups, s.second);
    }
    for (const auto& [bv, s] : score) {
      if (s.second < groups) {
        continue;  // not timed everywhere
      }
      if (!pick || s.first < pick_score) {
        pick = bv;
        pick_score = s.first;
      }
    }
    if (pick && slowdown != nullptr) {
      *slowdown = std::exp(pick_score / groups);
    }
    return pick;
  };
  const int ring_scope = rec.fused_ring_max_batch && *rec.fused_ring_max_batch > 0
                             ? *rec.fused_ring_max_batch
                             : 1 << 30;
  rec.default_bv = pick_bv(ring, ring_scope, &rec.default_bv_slowdown);
  rec.snapshot_bv = pick_bv(snap, 1 << 30, nullptr);

  // The auto tile over the same rows, when each row timed it.
  double auto_log = 0.0;
  int auto_groups = 0;
  bool auto_everywhere = true;
  for (const auto& [tb, t] : ring) {
    if (tb.second > ring_scope || t.fused.empty()) {
      continue;
    }
    const int auto_bv = kernels::default_fused_block_v(RecordMode::kRing, tb.second, tb.first,
                                                       args.shape.HV, args.shape.V, args.sms);
    const auto it = t.fused.find(auto_bv);
    if (it == t.fused.end()) {
      auto_everywhere = false;
      break;
    }
    auto_log += std::log(it->second / best_fused(t)->second);
    auto_groups += 1;
  }
  if (auto_everywhere && auto_groups > 0) {
    rec.auto_ring_slowdown = std::exp(auto_log / auto_groups);
  }
  return rec;
}

void print_recommendation(const Recommendation& rec) {
  if (rec.entries.empty()) {
    return;
  }
  const auto path_cell = [](const std::string& path, int bv) {
    if (path.empty()) {
      return std::string("-");
    }
    return path == "fused" ? fmt::format("fused BV={}", bv) : path;
  };
  const auto vs_cell = [](double us, double alt) {
    return alt > 0.0 ? fmt::format("{:.2f}x", alt / us) : std::string("-");
  };
  const auto us_cell = [](const std::string& path, double us) {
    return path.empty() ? std::string("-") : fmt::format("{:.2f}", us);
  };
  fmt::print(
      "\nrecommended dispatch (fastest measured path; 'vs other' = other path's time / "
      "chosen time):\n");
  fmt::print("{:>3} {:>5}  {:<13} {:>9} {:>8}  {:<13} {:>9} {:>8}  {:>7} {:>4}\n", "T", "B",
             "ring mode", "us", "vs other", "snapshot mode", "us", "vs other", "target", "ok");
  for (const DispatchEntry& e : rec.entries) {
    fmt::print("{:>3} {:>5}  {:<13} {:>9} {:>8}  {:<13} {:>9} {:>8}  {}\n", e.T, e.B,
               path_cell(e.ring_path, e.ring_bv), us_cell(e.ring_path, e.ring_us),
               vs_cell(e.ring_us, e.ring_alt_us), path_cell(e.snap_path, e.snap_bv),
               us_cell(e.snap_path, e.snap_us), vs_cell(e.snap_us, e.snap_alt_us),
               target_cells(e.target_us, e.ring_us));
  }
  if (!rec.max_batch_per_T.empty()) {
    std::vector<std::string> per_t;
    for (const auto& [T, b] : rec.max_batch_per_T) {
      per_t.push_back(fmt::format("T={}: {}", T, b));
    }
    fmt::print(
        "suggested --kda-fused-ring-max-batch={}  ({}; largest measured B such that fused+ring "
        "beats unfused+ring at every measured B' <= B, min over T; 0 = fused never fastest)\n",
        *rec.fused_ring_max_batch, fmt::join(per_t, ", "));
  } else {
    fmt::print(
        "suggested --kda-fused-ring-max-batch: not measured (needs fused+ring and "
        "unfused+ring)\n");
  }
  if (rec.default_bv && rec.bv_swept) {
    const double fixed_pct = 100.0 * (*rec.default_bv_slowdown - 1.0);
    if (rec.suggest_auto_bv()) {
      fmt::print(
          "suggested --kda-verify-block-v=auto  (ring mode, where fused is dispatched: the auto "
          "tile is {:.1f}% slower than each row's best BV on geometric mean; the best fixed BV, "
          "{}, {:.1f}%)\n",
          100.0 * (*rec.auto_ring_slowdown - 1.0), *rec.default_bv, fixed_pct);
    } else {
      fmt::print(
          "suggested --kda-verify-block-v={}  (ring mode, where fused is dispatched: {:.1f}% "
          "slower than each row's best BV on geometric mean; the auto tile {})\n",
          *rec.default_bv, fixed_pct,
          rec.auto_ring_slowdown ? fmt::format("{:.1f}%", 100.0 * (*rec.auto_ring_slowdown - 1.0))
                                 : std::string("not timed at every row"));
    }
  } else if (rec.default_bv) {
    fmt::print(
        "suggested --kda-verify-block-v: not measured (BV not swept; run with --sweep-bv)\n");
  }
  if (rec.snapshot_bv && rec.bv_swept) {
    fmt::print("best BV for snapshot mode alone: {}\n", *rec.snapshot_bv);
  }
  if (rec.bv_swept && rec.auto_ring.rows > 0) {
    fmt::print(
        "auto tile (--kda-verify-block-v=auto, kernels::default_block_v per call): the best BV "
        "at {} of {} ring rows, at worst {:.1f}% slower than the best\n",
        rec.auto_ring.best, rec.auto_ring.rows, 100.0 * (rec.auto_ring.worst - 1.0));
  }
  if (rec.bv_swept && rec.auto_snapshot.rows > 0) {
    fmt::print(
        "auto tile (kernels::default_snapshot_block_v per call): the best BV at {} of {} "
        "snapshot rows, at worst {:.1f}% slower than the best\n",
        rec.auto_snapshot.best, rec.auto_snapshot.rows, 100.0 * (rec.auto_snapshot.worst - 1.0));
  }
  std::fflush(stdout);
}

void write_rows(const std::string& path, const RunInfo& info, const std::vector<Row>& rows,
                const Recommendation& rec) {
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "w"));
  KDA_CHECK_CODE(f != nullptr, ErrorCode::kIo, "--out: cannot open '{}' for writing", path);
  const bool json = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  if (!json) {
    fmt::print(f.get(),
               "phase,T,B,variant,mode,fused,bv,best_bv,layers,copies,calls_per_graph,median_us,"
               "min_us,max_us,model_bytes,moved_bytes,floor_us,gbps,pct,target_us,target_ok,"
               "draft_shape,gemm_us,share_us,H,HV,K,V,hidden,kernel,numerics,equal_pct,max_ulp,"
               "rel_l2_vs_exact,rel_l2_fast_vs_fp64,rel_l2_exact_vs_fp64\n");
    for (const Row& r : rows) {
      fmt::print(f.get(),
                 "{},{},{},{},{},{},{},{},{},{},{},{:.4f},{:.4f},{:.4f},{},{},{:.4f},{:.2f},"
                 "{:.2f},{},{},{},{:.4f},{:.4f},{},{},{},{},{},{},{},{},{}\n",
                 phase_name(r.phase), r.T, r.B, r.what, mode_name(r.mode), r.fused ? 1 : 0, r.bv,
                 r.best_bv ? 1 : 0, r.layers, r.copies, r.timing.calls_per_graph,
                 r.timing.median_us, r.timing.min_us, r.timing.max_us, r.model_bytes, r.moved_bytes,
                 r.floor_us, r.gbps, r.pct, r.target_us ? fmt::format("{}", *r.target_us) : "",
                 r.target_us ? (r.target_ok() ? "pass" : "miss") : "",
                 draft_shape_name(r.draft_shape), r.gemm_us, r.share_us, info.H, info.HV, info.K,
                 info.V, r.phase == Phase::kStep ? info.hidden : 0, r.kernel,
                 runs_verify(r) ? numerics_name(r.numerics) : "", diff_csv(r.diff),
                 fp64_csv(r.fp64));
    }
  } else {
    fmt::print(f.get(), "{{\n  \"device\": {},\n  \"shape\": {},\n  \"command\": {},\n",
               json_str(info.device), json_str(info.shape), json_str(info.command_line));
    fmt::print(f.get(), "  \"hbm_gbps\": {},\n  \"copy_gbps\": {},\n  \"l2_bytes\": {},\n",
               json_num(info.hbm_gbps), json_num(info.copy_gbps), info.l2_bytes);
    fmt::print(f.get(), "  \"H\": {}, \"HV\": {}, \"K\": {}, \"V\": {}, \"hidden\": {},\n", info.H,
               info.HV, info.K, info.V, info.hidden);
    fmt::print(f.get(), "  \"rows\": [");
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      fmt::print(f.get(),
                 "{}\n    {{\"phase\": \"{}\", \"T\": {}, \"B\": {}, \"variant\": {}, "
                 "\"mode\": \"{}\", \"fused\": {}, \"bv\": {}, \"best_bv\": {}, \"layers\": {}, "
                 "\"copies\": {}, \"calls_per_graph\": {}, \"median_us\": {}, \"min_us\": {}, "
                 "\"max_us\": {}, \"rep_us\": [{}], \"model_bytes\": {}, \"moved_bytes\": {}, "
                 "\"floor_us\": {}, \"gbps\": {}, \"pct\": {}, \"target_us\": {}, "
                 "\"target_ok\": {}, \"draft_shape\": \"{}\", \"gemm_us\": {}, "
                 "\"share_us\": {}, \"kernel\": {}, \"numerics\": {}, \"equal_pct\": {}, "
                 "\"max_ulp\": {}, \"rel_l2_vs_exact\": {}, \"rel_l2_fast_vs_fp64\": {}, "
                 "\"rel_l2_exact_vs_fp64\": {}}}",
                 i == 0 ? "" : ",", phase_name(r.phase), r.T, r.B, json_str(r.what),
                 mode_name(r.mode), r.fused, r.bv, r.best_bv, r.layers, r.copies,
                 r.timing.calls_per_graph, json_num(r.timing.median_us), json_num(r.timing.min_us),
                 json_num(r.timing.max_us), fmt::join(r.timing.rep_us, ", "), r.model_bytes,
                 r.moved_bytes, json_num(r.floor_us), json_num(r.gbps), json_num(r.pct),
                 opt_num(r.target_us), r.target_us ? (r.target_ok() ? "true" : "false") : "null",
                 draft_shape_name(r.draft_shape), json_num(r.gemm_us), json_num(r.share_us),
                 json_str(r.kernel), runs_verify(r) ? json_str(numerics_name(r.numerics)) : "null",
                 r.diff ? json_num(r.diff->equal_pct()) : "null",
                 r.diff ? fmt::format("{}", r.diff->max_ulp) : "null",
                 r.diff ? json_num(r.diff->rel_l2()) : "null",
                 r.fp64 ? json_num(r.fp64->fast) : "null",
                 r.fp64 ? json_num(r.fp64->exact) : "null");
    }
    fmt::print(f.get(), "\n  ],\n  \"recommendation\": {{\n    \"dispatch\": [");
    for (size_t i = 0; i < rec.entries.size(); ++i) {
      const DispatchEntry& e = rec.entries[i];
      fmt::print(f.get(),
                 "{}\n      {{\"T\": {}, \"B\": {}, \"ring_path\": {}, \"ring_bv\": {}, "
                 "\"ring_us\": {}, \"ring_other_us\": {}, \"snapshot_path\": {}, "
                 "\"snapshot_bv\": {}, \"snapshot_us\": {}, \"snapshot_other_us\": {}, "
                 "\"target_us\": {}}}",
                 i == 0 ? "" : ",", e.T, e.B, json_str(e.ring_path), e.ring_bv, json_num(e.ring_us),
                 json_num(e.ring_alt_us), json_str(e.snap_path), e.snap_bv, json_num(e.snap_us),
                 json_num(e.snap_alt_us), opt_num(e.target_us));
    }
    std::vector<std::string> per_t;
    for (const auto& [T, b] : rec.max_batch_per_T) {
      per_t.push_back(fmt::format("\"{}\": {}", T, b));
    }
    fmt::print(f.get(),
               "\n    ],\n    \"fused_ring_max_batch_per_T\": {{{}}},\n"
               "    \"fused_ring_max_batch\": {},\n    \"default_block_v\": {},\n"
               "    \"default_block_v_slowdown\": {},\n    \"auto_block_v_slowdown\": {},\n"
               "    \"suggest_auto_block_v\": {},\n"
               "    \"snapshot_block_v\": {},\n    \"bv_swept\": {}\n  }}\n}}\n",
               fmt::join(per_t, ", "), opt_int(rec.fused_ring_max_batch), opt_int(rec.default_bv),
               opt_num(rec.default_bv_slowdown), opt_num(rec.auto_ring_slowdown),
               rec.suggest_auto_bv(), opt_int(rec.snapshot_bv), rec.bv_swept);
  }
  KDA_CHECK_CODE(std::ferror(f.get()) == 0, ErrorCode::kIo, "--out: write to '{}' failed", path);
}

}  // namespace kda::bench
