#include "tools/bench/bench_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "kernels/kda_kernels.h"
#include "tools/bench/bench_bytes.h"
#include "tools/bench/bench_fast.h"

namespace kda::bench {

namespace {

/// No call is faster than this (launch + graph node overhead), whatever its bytes.
constexpr double kMinCallUs = 2.0;

double gib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0); }

/// Seconds of one time_in_graph: eager pass, warm-up and timed replays.
double timing_seconds(const BenchArgs& a, int calls, int iters, double us_per_call) {
  const double replays = 1.0 + a.warmup + static_cast<double>(a.reps) * iters;
  return replays * calls * std::max(us_per_call, kMinCallUs) * 1e-6;
}

std::string numerics_text(const BenchArgs& a) {
  std::vector<const char*> names;
  for (VerifyNumerics n : a.numerics) {
    names.push_back(numerics_name(n));
  }
  return fmt::format("{}", fmt::join(names, ","));
}

/// Rows a round or step times for variant `v` at (B, T): per numerics, the eager row and in ring
/// mode the deferred one, each where its numerics runs (fast: fast_skip_reason).
int round_rows(const BenchArgs& a, Variant v, int B, int T, std::vector<std::string>* notes) {
  const bool ring = variant_mode(v) == RecordMode::kRing;
  int rows = 0;
  for (VerifyNumerics n : a.numerics) {
    if (n == VerifyNumerics::kExact) {
      rows += ring ? 2 : 1;
      continue;
    }
    if (!variant_takes_fast(v)) {
      add_note(notes, fast_skip_reason(a, v, T, 0, /*deferred=*/false));
      continue;
    }
    const std::vector<int> bvs = a.block_vs(v, n, B, T);
    const int bv = bvs.empty() ? 0 : bvs.front();
    for (const bool deferred : {false, true}) {
      if (deferred && !ring) {
        continue;
      }
      const std::string why = fast_skip_reason(a, v, T, bv, deferred);
      if (why.empty()) {
        ++rows;
      } else {
        add_note(notes, std::string(deferred ? "deferred rows: " : "") + why);
      }
    }
  }
  return rows;
}

}  // namespace

ProblemConfig problem_config(const BenchArgs& args, int B) {
  ProblemConfig c;
  c.shape = args.shape;
  c.B = B;
  c.T_max = args.max_T();
  c.L = args.effective_ring_len();
  c.ring = args.any_mode(RecordMode::kRing);
  c.snapshot = args.any_mode(RecordMode::kSnapshot);
  c.seed = args.seed;
  c.device = args.device;
  return c;
}

ProblemConfig commit_problem_config(const BenchArgs& args, int B) {
  ProblemConfig c = problem_config(args, B);
  c.copies = args.layers;
  c.track_slots = args.commit_tracks ? B : 0;
  return c;
}

ProblemConfig step_problem_config(const BenchArgs& args, int B) {
  ProblemConfig c = problem_config(args, B);
  c.copies = args.layers;
  c.inputs = false;
  c.ring = true;  // the deferred rows and the guard's eager / deferred steps
  c.snapshot = c.snapshot || args.guard;
  return c;
}

StepLayout step_layout(const BenchArgs& args, int B) {
  const Shape& s = args.shape;
  StepLayout l;
  l.P = s.D() + int64_t{s.HV} * s.K + s.HV;
  l.ld_proj = (l.P + 7) / 8 * 8;
  l.rows = int64_t{B} * args.max_T();
  l.hidden = args.step_hidden();
  l.mlp = args.mlp;
  l.layers = args.layers;
  l.stages = args.layers * (args.mlp > 0 ? 2 : 1);
  return l;
}

int64_t StepLayout::device_bytes(const Shape& s, const ProblemConfig& problem, bool guard,
                                 bool fast) const {
  const int64_t weights = step_gemm_weight_bytes(s, layers, hidden, mlp);
  const int64_t chain = (stages + 1) * rows * hidden * 2;
  const int64_t acts = rows * (ld_proj + mlp) * 2;
  int64_t total = weights + chain + acts + (int64_t{32} << 20);  // + the GEMM workspace
  if (guard) {
    // Each replay's outputs and hidden chain, the saved and the reference committed states.
    const int64_t out = int64_t{problem.copies} * rows * s.HV * s.V * 2;
    const int64_t state = int64_t{problem.copies} * (problem.B + problem.track_slots) *
                          (int64_t{s.HV} * s.V * s.K * 4 + kConvHistory * s.D() * 2);
    total += 3 * (out + chain) + 2 * state;
    if (fast) {  // the fast step's replays and its final state
      total += 3 * (out + chain) + state;
    }
  }
  return total;
}

int l2_cold_copies(const BenchArgs& args, int B, int64_t l2_bytes) {
  const int T_min = *std::min_element(args.draft_tokens.begin(), args.draft_tokens.end());
  const RecordMode lightest =
      args.any_mode(RecordMode::kRing) ? RecordMode::kRing : RecordMode::kSnapshot;
  const int64_t per_call = verify_bytes(args.shape, B, T_min, lightest).model();
  const int64_t want = (2 * l2_bytes + per_call - 1) / per_call;
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(2, want), args.max_copies));
}

void add_note(std::vector<std::string>* notes, const std::string& note) {
  if (notes != nullptr && std::find(notes->begin(), notes->end(), note) == notes->end()) {
    notes->push_back(note);
  }
}

std::vector<VerifyConfig> verify_configs(const BenchArgs& a, int B, int T,
                                         std::vector<std::string>* notes) {
  std::vector<VerifyConfig> out;
  for (Variant v : a.variants) {
    for (VerifyNumerics n : a.numerics) {
      const std::vector<int> bvs = a.block_vs(v, n, B, T);
      if (n == VerifyNumerics::kFast && bvs.empty()) {
        add_note(notes, fast_skip_reason(a, v, T, 0, /*deferred=*/false));
        continue;
      }
      for (int bv : bvs) {
        if (n == VerifyNumerics::kFast) {
          const std::string why = fast_skip_reason(a, v, T, bv, /*deferred=*/false);
          if (!why.empty()) {
            add_note(notes, why);
            continue;
          }
        }
        out.push_back({v, n, bv});
      }
    }
  }
  return out;
}

std::string fast_kernel_name(const BenchArgs& a, int B, int T, int bv) {
  VerifyParams p;
  p.B = B;
  p.T = T;
  p.H = a.shape.H;
  p.HV = a.shape.HV;
  p.K = a.shape.K;
  p.V = a.shape.V;
  p.mode = RecordMode::kRing;
  p.numerics = VerifyNumerics::kFast;
  p.conv_weight_type = a.shape.conv_weight_type;
  const kernels::DeviceCaps caps{a.sms > 0 ? a.sms : 132, 9};
  return kernels::plan_verify(p, VerifyPath::kFused, bv, caps, a.launch, 0).kernel();
}

void print_plan(const BenchArgs& a, int64_t l2_bytes) {
  fmt::print(
      "dry run: nothing is allocated or timed; device time is a lower bound (every call "
      "at the {:.0f} GB/s floor, >= {} us)\n",
      a.planning_gbps(), kMinCallUs);
  double total = 0.0;
  const double copy_s = timing_seconds(
      a, a.calls, a.iters, floor_us(2 * (int64_t{a.copy_mib} << 20), a.planning_gbps()));
  fmt::print("copy probe: {} MiB x2: >= {:.1f} s\n", 2 * a.copy_mib, copy_s);
  total += copy_s;

  const bool fast = a.has_numerics(VerifyNumerics::kFast);
  std::vector<std::string> notes;  // fast configurations left out, once each
  // "T=4 BV=64 verify_tile<...fast-chunk>, ..." for the fast fused+ring rows of batch size B.
  const auto fast_rows = [&](int B) {
    std::vector<std::string> cells;
    for (int T : a.draft_tokens) {
      for (const VerifyConfig& c : verify_configs(a, B, T, &notes)) {
        if (c.numerics == VerifyNumerics::kFast) {
          cells.push_back(fmt::format("T={} BV={} {}", T, c.bv, fast_kernel_name(a, B, T, c.bv)));
        }
      }
    }
    return cells;
  };
  const auto print_fast_rows = [&](int B) {
    if (!fast) {
      return;
    }
    const std::vector<std::string> cells = fast_rows(B);
    fmt::print("           fast rows: {}\n",
               cells.empty() ? std::string("none") : fmt::format("{}", fmt::join(cells, "; ")));
  };
  if (a.phase_verify) {
    fmt::print("verify ({} variants; fused BVs {}; numerics {}):\n", a.variants.size(),
               a.fused_block_v_text(), numerics_text(a));
    for (int B : a.batch_sizes) {
      ProblemConfig cfg = problem_config(a, B);
      cfg.guard_set = a.guard;
      cfg.copies = a.l2_cold ? l2_cold_copies(a, B, l2_bytes) : 1;
      const int calls = verify_calls_per_graph(a, cfg.copies);
      double s = 0.0;
      int timings = 0;
      for (int T : a.draft_tokens) {
        for (const VerifyConfig& c : verify_configs(a, B, T, &notes)) {
          const VerifyBytes vb = verify_bytes(a.shape, B, T, variant_mode(c.variant));
          const double us = floor_us(vb.moved(!variant_is_fused(c.variant)), a.planning_gbps());
          s += timing_seconds(a, calls, a.iters, us);
          timings += 1;
        }
      }
      fmt::print("  B={:<5} {:>8.2f} GiB ({} layer copies), {:>3} timings, >= {:.1f} s\n", B,
                 gib(Problem::device_bytes(cfg) + (fast ? FastCheck::device_bytes(cfg) : 0)),
                 cfg.copies, timings, s);
      print_fast_rows(B);
      total += s;
    }
  }
  for (bool round : {false, true}) {
    if (!(round ? a.phase_round : a.phase_commit)) {
      continue;
    }
    fmt::print("{} ({} layers):\n", round ? "round" : "commit", a.layers);
    for (int B : a.batch_sizes) {
      ProblemConfig cfg = round ? problem_config(a, B) : commit_problem_config(a, B);
      cfg.copies = a.layers;
      double s = 0.0;
      for (int T : a.draft_tokens) {
        const int n = a.accepted > 0 ? a.accepted : T;
        const CommitBytes cb = commit_bytes(a.shape, a.layers, B, n);
        if (!round) {
          int64_t bytes = cb.conv;  // commit_conv, then fold / snapshot alone and with conv
          bytes += cfg.ring ? 2 * cb.fold + cb.conv : 0;
          bytes += cfg.snapshot ? 2 * cb.snapshot + cb.conv : 0;
          if (a.commit_tracks) {  // the tracked commits, and the deferred pair
            const TrackBytes tb = track_bytes(a.shape, a.layers, B, commit_track_step(n));
            bytes += cfg.ring ? cb.fold + cb.conv + tb.ring + 2 * cb.conv + tb.deferred : 0;
            bytes += cfg.snapshot ? cb.snapshot + cb.conv + tb.snapshot : 0;
          }
          s += timing_seconds(a, a.calls, a.commit_iters, floor_us(bytes, a.planning_gbps()));
          continue;
        }
        for (Variant v : a.variants) {
          const VerifyBytes vb = verify_bytes(a.shape, B, T, variant_mode(v));
          const double verify_us =
              std::max(floor_us(vb.moved(!variant_is_fused(v)), a.planning_gbps()), kMinCallUs);
          const int64_t commit =
              (variant_mode(v) == RecordMode::kRing ? cb.fold : cb.snapshot) + cb.conv;
          s += round_rows(a, v, B, T, &notes) *
               timing_seconds(a, 1, a.round_iters,
                              a.layers * verify_us + floor_us(commit, a.planning_gbps()));
        }
      }
      fmt::print(
          "  B={:<5} {:>8.2f} GiB, >= {:.1f} s\n", B,
          gib(Problem::device_bytes(cfg) + (round && fast ? FastCheck::device_bytes(cfg) : 0)), s);
      if (round) {
        print_fast_rows(B);
      }
      total += s;
    }
  }
  if (a.phase_step) {
    fmt::print(
        "step ({} layers, hidden {}{}; gemm-only, then each variant eager and ring ones "
        "deferred):\n",
        a.layers, a.step_hidden(), a.mlp > 0 ? fmt::format(", MLP {}", a.mlp) : std::string());
    for (int B : a.batch_sizes) {
      const ProblemConfig cfg = step_problem_config(a, B);
      const StepLayout lay = step_layout(a, B);
      double s = 0.0;
      for (int T : a.draft_tokens) {
        const int64_t gemm = step_gemm_weight_bytes(a.shape, a.layers, lay.hidden, lay.mlp);
        const double gemm_us =
            std::max(floor_us(gemm, a.planning_gbps()), a.layers * 2 * kMinCallUs);
        const StepBytes kda = step_kda_bytes(a.shape, a.layers, B, T, step_accepted(a.seed, T, B));
        s += timing_seconds(a, 1, a.step_iters, gemm_us);
        for (Variant v : a.variants) {
          const bool ring = variant_mode(v) == RecordMode::kRing;
          const double us =
              gemm_us + std::max(floor_us(ring ? kda.ring : kda.snapshot, a.planning_gbps()),
                                 a.layers * kMinCallUs);
          s += round_rows(a, v, B, T, &notes) * timing_seconds(a, 1, a.step_iters, us);
        }
      }
      fmt::print("  B={:<5} {:>8.2f} GiB, >= {:.1f} s\n", B,
                 gib(Problem::device_bytes(cfg) + lay.device_bytes(a.shape, cfg, a.guard, fast) +
                     (fast ? FastCheck::device_bytes(cfg) : 0)),
                 s);
      print_fast_rows(B);
      total += s;
    }
  }
  for (const std::string& note : notes) {
    fmt::print("fast rows left out: {}\n", note);
  }
  fmt::print("total device time >= {:.0f} s (expect 1.5-3x: real calls are not at the floor)\n",
             total);
}

}  // namespace kda::bench
