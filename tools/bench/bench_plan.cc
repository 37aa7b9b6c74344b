#include "tools/bench/bench_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "tools/bench/bench_bytes.h"

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

int64_t StepLayout::device_bytes(const Shape& s, const ProblemConfig& problem, bool guard) const {
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

void print_plan(const BenchArgs& a, int64_t l2_bytes) {
  fmt::print(
      "dry run: nothing is allocated or timed; device time is a lower bound (every call "
      "at the {:.0f} GB/s floor, >= {} us)\n",
      a.hbm_gbps, kMinCallUs);
  double total = 0.0;
  const double copy_s =
      timing_seconds(a, a.calls, a.iters, floor_us(2 * (int64_t{a.copy_mib} << 20), a.hbm_gbps));
  fmt::print("copy probe: {} MiB x2: >= {:.1f} s\n", 2 * a.copy_mib, copy_s);
  total += copy_s;

  if (a.phase_verify) {
    fmt::print("verify ({} variants; fused BVs {}):\n", a.variants.size(), a.fused_block_v_text());
    for (int B : a.batch_sizes) {
      ProblemConfig cfg = problem_config(a, B);
      cfg.guard_set = a.guard;
      cfg.copies = a.l2_cold ? l2_cold_copies(a, B, l2_bytes) : 1;
      const int calls = verify_calls_per_graph(a, cfg.copies);
      double s = 0.0;
      int timings = 0;
      for (int T : a.draft_tokens) {
        for (Variant v : a.variants) {
          const VerifyBytes vb = verify_bytes(a.shape, B, T, variant_mode(v));
          const double us = floor_us(vb.moved(!variant_is_fused(v)), a.hbm_gbps);
          const int n = variant_is_fused(v)
                            ? static_cast<int>(a.fused_block_vs(B, T, variant_mode(v)).size())
                            : 1;
          s += n * timing_seconds(a, calls, a.iters, us);
          timings += n;
        }
      }
      fmt::print("  B={:<5} {:>8.2f} GiB ({} layer copies), {:>3} timings, >= {:.1f} s\n", B,
                 gib(Problem::device_bytes(cfg)), cfg.copies, timings, s);
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
          s += timing_seconds(a, a.calls, a.commit_iters, floor_us(bytes, a.hbm_gbps));
          continue;
        }
        for (Variant v : a.variants) {
          const VerifyBytes vb = verify_bytes(a.shape, B, T, variant_mode(v));
          const double verify_us =
              std::max(floor_us(vb.moved(!variant_is_fused(v)), a.hbm_gbps), kMinCallUs);
          const int64_t commit =
              (variant_mode(v) == RecordMode::kRing ? cb.fold : cb.snapshot) + cb.conv;
          s += timing_seconds(a, 1, a.round_iters,
                              a.layers * verify_us + floor_us(commit, a.hbm_gbps));
        }
      }
      fmt::print("  B={:<5} {:>8.2f} GiB, >= {:.1f} s\n", B, gib(Problem::device_bytes(cfg)), s);
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
        const double gemm_us = std::max(floor_us(gemm, a.hbm_gbps), a.layers * 2 * kMinCallUs);
        const StepBytes kda = step_kda_bytes(a.shape, a.layers, B, T, step_accepted(a.seed, T, B));
        s += timing_seconds(a, 1, a.step_iters, gemm_us);
        for (Variant v : a.variants) {
          const bool ring = variant_mode(v) == RecordMode::kRing;
          const double us = gemm_us + std::max(floor_us(ring ? kda.ring : kda.snapshot, a.hbm_gbps),
                                               a.layers * kMinCallUs);
          s += (ring ? 2 : 1) * timing_seconds(a, 1, a.step_iters, us);
        }
      }
      fmt::print("  B={:<5} {:>8.2f} GiB, >= {:.1f} s\n", B,
                 gib(Problem::device_bytes(cfg) + lay.device_bytes(a.shape, cfg, a.guard)), s);
      total += s;
    }
  }
  fmt::print("total device time >= {:.0f} s (expect 1.5-3x: real calls are not at the floor)\n",
             total);
}

}  // namespace kda::bench
