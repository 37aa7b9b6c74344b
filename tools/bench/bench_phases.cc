#include "tools/bench/bench_phases.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "core/error.h"
#include "kernels/kda_kernels.h"
#include "kernels/verify/tile_policy.h"
#include "tools/bench/bench_bytes.h"
#include "tools/bench/bench_device.h"
#include "tools/bench/bench_fast.h"
#include "tools/bench/bench_guard.h"
#include "tools/bench/bench_ops.h"
#include "tools/bench/bench_plan.h"
#include "tools/bench/bench_problem.h"

namespace kda::bench {

void note(BenchContext& ctx, const std::string& what) {
  if (std::find(ctx.notes.begin(), ctx.notes.end(), what) != ctx.notes.end()) {
    return;
  }
  ctx.notes.push_back(what);
  fmt::print("            fast rows left out: {}\n", what);
  std::fflush(stdout);
}

void fast_failures(const BenchContext& ctx, const std::vector<std::string>& failures,
                   const std::string& what) {
  if (failures.empty()) {
    return;
  }
  fmt::print(stderr, "\nkda_bench: {}: fast outputs check {}\n", what,
             ctx.args.guard ? "FAILED" : "differs (--skip-guard: timing anyway)");
  for (const std::string& f : failures) {
    fmt::print(stderr, "kda_bench: fast check: {}\n", f);
  }
  if (ctx.args.guard) {
    throw GuardFailure{};
  }
}

namespace {

/// --l2-cold copies, fewer if they would not fit in device memory.
int fit_cold_copies(const BenchContext& ctx, ProblemConfig cfg) {
  const int want = l2_cold_copies(ctx.args, cfg.B, ctx.l2_bytes);
  size_t free_b = 0, total_b = 0;
  KDA_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  int copies = want;
  cfg.copies = copies;
  while (copies > 2 &&
         static_cast<double>(Problem::device_bytes(cfg)) > 0.9 * static_cast<double>(free_b)) {
    copies = std::max(2, copies * 3 / 4);
    cfg.copies = copies;
  }
  if (copies < want) {
    fmt::print(stderr,
               "kda_bench: warning: B={}: only {} of {} layer copies fit in device memory; the "
               "L2-cold rotation is shorter than 2x L2\n",
               cfg.B, copies, want);
  }
  return copies;
}

/// Appends rows and rewrites --out, so a run cut short still leaves its results.
void add_rows(BenchContext& ctx, const std::vector<Row>& rows) {
  ctx.rows.insert(ctx.rows.end(), rows.begin(), rows.end());
  if (!ctx.args.out_path.empty()) {
    write_rows(ctx.args.out_path, ctx.info, ctx.rows, recommend(ctx.rows, ctx.args));
  }
}

double gib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0); }

/// `extra`: device bytes the phase allocates besides the Problem (the fast rows' FastCheck).
void check_fits(const ProblemConfig& cfg, const char* what, int64_t extra) {
  size_t free_b = 0, total_b = 0;
  KDA_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const int64_t need = Problem::device_bytes(cfg) + extra;
  KDA_CHECK_CODE(static_cast<double>(need) <= 0.95 * static_cast<double>(free_b),
                 ErrorCode::kOutOfMemory,
                 "{} B={}: needs {:.2f} GiB of device memory ({} layer copies), {:.2f} GiB free; "
                 "lower --batch-sizes, --layers or --max-copies, or drop the snapshot variants",
                 what, cfg.B, gib(need), cfg.copies, gib(static_cast<int64_t>(free_b)));
}

/// The FastCheck bytes of `cfg` when fast rows are timed, else 0.
int64_t fast_check_bytes(const BenchArgs& a, const ProblemConfig& cfg) {
  return a.has_numerics(VerifyNumerics::kFast) ? FastCheck::device_bytes(cfg) : 0;
}

Row verify_row(const BenchContext& ctx, Phase phase, Variant v, int bv, int T, int B) {
  Row r;
  r.phase = phase;
  r.what = variant_name(v);
  r.mode = variant_mode(v);
  r.fused = variant_is_fused(v);
  r.bv = r.fused ? bv : 0;
  r.T = T;
  r.B = B;
  const VerifyBytes vb = verify_bytes(ctx.args.shape, B, T, r.mode);
  r.model_bytes = vb.model();
  r.moved_bytes = vb.moved(!r.fused);
  r.target_us = phase == Phase::kVerify ? target_us(ctx.args.preset, ctx.args.shape, r.mode, T, B,
                                                    ctx.args.planning_gbps())
                                        : std::nullopt;
  return r;
}

void finish_floor_row(Row& r, double hbm_gbps) {
  r.floor_us = floor_us(r.model_bytes, hbm_gbps);
  r.gbps = achieved_gbps(r.moved_bytes, r.timing.median_us);
  r.pct = 100.0 * r.floor_us / r.timing.median_us;
}

/// Times row `r` (variant v, tile bv): `calls` verifies per graph, rotating through `params`
/// (one per layer copy), then its floor columns. The kernel and numerics columns are the plan's.
void time_verify_row(const BenchContext& ctx, Row& r, Variant v, int bv,
                     const std::vector<VerifyParams>& params, int calls) {
  const size_t copies = params.size();
  r.copies = static_cast<int>(copies);
  const kernels::VerifyPlan plan = planned(v, bv, params.front(), ctx.args.launch);
  r.kernel = plan.kernel();
  r.numerics = plan.numerics;
  r.timing = time_in_graph(
      ctx.stream, calls,
      [&](int i) {
        enqueue_verify(v, bv, params[static_cast<size_t>(i) % copies], ctx.stream, ctx.args.launch);
      },
      ctx.timer);
  finish_floor_row(r, ctx.args.hbm_gbps);
}

void print_group(const BenchArgs& args, std::vector<Row>& group) {
  mark_best_bv(group);
  int printed = 0;
  for (const Row& r : group) {
    if (args.brief && args.sweep_bv && r.fused && !r.best_bv) {
      continue;
    }
    print_row(r);
    ++printed;
  }
  if (printed > 4) {
    fmt::print("\n");  // long groups (BV sweeps): a blank line between (T, B) groups
  }
}

/// A draft shape's index arrays (contract §8) on the device: offsets [B + 1] (ragged, mixed)
/// or parents [B * T] (tree).
struct ShapeIndices {
  Buffer buf;
  int64_t tokens = 0;
  const int32_t* offsets = nullptr;
  const int32_t* parents = nullptr;
};

ShapeIndices shape_indices(DraftShape shape, int B, int T, int device) {
  std::vector<int32_t> host;
  ShapeIndices s;
  if (shape == DraftShape::kTree) {
    for (int n = 0; n < B; ++n) {
      for (int j = 0; j < T; ++j) {
        host.push_back(j == 0 ? -1 : (j - 1) / 2);
      }
    }
    s.tokens = int64_t{B} * T;
  } else {
    host.push_back(0);
    for (int n = 0; n < B; ++n) {
      host.push_back(host.back() + (shape == DraftShape::kMixed ? T - n % T : T));
    }
    s.tokens = host.back();
  }
  s.buf = Buffer(Device::cuda(device), static_cast<int64_t>(host.size()) * 4);
  s.buf.upload(host.data(), s.buf.bytes());
  (shape == DraftShape::kTree ? s.parents : s.offsets) = static_cast<const int32_t*>(s.buf.data());
  return s;
}

/// A fast configuration's plan on copy 0 of the verify phase's problem: true when it runs fast;
/// else a note names the kernel that would run and the row is left out (it would repeat exact).
bool fast_plan_runs(BenchContext& ctx, const VerifyConfig& c, const VerifyParams& p, int T,
                    const char* shape) {
  const kernels::VerifyPlan plan = planned(c.variant, c.bv, p, ctx.args.launch);
  if (plan.numerics == VerifyNumerics::kFast) {
    return true;
  }
  note(ctx, fmt::format("{}{} T={} BV={}: the plan runs exact ({})", variant_name(c.variant), shape,
                        T, c.bv, plan.kernel()));
  return false;
}

/// The byte model of a shaped batch of `tokens` rows: the per-token terms scaled from B*T.
void scale_tokens(Row& r, const Shape& shape, int B, int T, int64_t tokens) {
  VerifyBytes vb = verify_bytes(shape, B, T, r.mode);
  const int64_t bt = int64_t{B} * T;
  for (int64_t* term :
       {&vb.mixed_qkv, &vb.a, &vb.b, &vb.windows, &vb.out, &vb.records, &vb.qkv_act_trip}) {
    *term = *term / bt * tokens;
  }
  r.model_bytes = vb.model();
  r.moved_bytes = vb.moved(!r.fused);
}

/// The verify phase's shaped rows of (T, B): every variant (trees: unfused only) on the dense
/// batch's problem through the shape's index arrays. Printed after the dense group and written
/// to --out (column draft_shape), not in the recommendations.
void time_shapes(BenchContext& ctx, const Problem& problem, FastCheck* check, int T, int B,
                 int copies, int calls) {
  const BenchArgs& a = ctx.args;
  std::vector<Row> shaped;
  for (const DraftShape shape : a.draft_shapes) {
    if (shape == DraftShape::kDense) {
      continue;
    }
    const ShapeIndices idx = shape_indices(shape, B, T, problem.config().device);
    for (const VerifyConfig& c : verify_configs(a, B, T, nullptr)) {
      const Variant v = c.variant;
      if (shape == DraftShape::kTree && variant_is_fused(v)) {
        continue;  // the fused kernels verify chains
      }
      std::vector<VerifyParams> params;
      for (int copy = 0; copy < copies; ++copy) {
        VerifyParams p = with_numerics(problem.verify_params(copy, T, variant_mode(v)), c.numerics);
        p.token_offsets = idx.offsets;
        p.parents = idx.parents;
        params.push_back(p);
      }
      Row r = verify_row(ctx, Phase::kVerify, v, c.bv, T, B);
      if (c.numerics == VerifyNumerics::kFast) {
        const std::string where = fmt::format(" {}", draft_shape_name(shape));
        if (!fast_plan_runs(ctx, c, params.front(), T, where.c_str())) {
          continue;
        }
        check->clear();
        check->compare(params.front(), c.bv, 0, idx.tokens, a.launch, ctx.stream);
        fast_failures(ctx, check->failures(), fmt::format("verify{} T={} B={}", where, T, B));
        r.diff = check->diff();
      }
      r.what = fmt::format("{} {} ({} tok)", variant_name(v), draft_shape_name(shape), idx.tokens);
      r.target_us.reset();
      r.draft_shape = shape;
      scale_tokens(r, a.shape, B, T, idx.tokens);
      time_verify_row(ctx, r, v, c.bv, params, calls);
      print_row(r);
      shaped.push_back(r);
    }
  }
  add_rows(ctx, shaped);
}

/// The fused tiles the verify guard holds bitwise to unfused in `mode`: the timed exact ones and
/// in ring mode the fast rows' tiles (their exact twins are the fast rows' reference).
std::vector<int> guarded_block_vs(const BenchArgs& a, int B, int T, RecordMode mode) {
  std::vector<int> bvs = a.fused_block_vs(B, T, mode);
  if (mode == RecordMode::kRing && a.has_numerics(VerifyNumerics::kFast)) {
    for (int bv : a.fast_block_vs(B)) {
      if (std::find(bvs.begin(), bvs.end(), bv) == bvs.end()) {
        bvs.push_back(bv);
      }
    }
  }
  return bvs;
}

/// The fast rows' untimed comparison with exact of one (T, B) (contract §10): per fast tile of
/// `configs` whose plan runs fast, a FastCheck on copy 0 (its statistics into `diffs`, by tile);
/// the fast outputs must be bitwise equal at every fast tile ((a), with more than one). Returns
/// the configurations to time (fast ones whose plan runs exact left out, with a note). The first
/// fast tile's outputs and their exact twin's also go against the fp64 oracle (§10 (c)) into
/// *fp64: the other tiles' are bitwise the same.
std::vector<VerifyConfig> check_fast_rows(BenchContext& ctx, const Problem& problem,
                                          FastCheck& check,
                                          const std::vector<VerifyConfig>& configs, int T, int B,
                                          std::map<int, OutputDiff>* diffs,
                                          std::optional<Fp64Errors>* fp64) {
  const BenchArgs& a = ctx.args;
  std::vector<VerifyConfig> timed;
  std::vector<bf16_t> first_out;
  int first_bv = 0;
  std::vector<std::string> failures;
  for (const VerifyConfig& c : configs) {
    if (c.numerics != VerifyNumerics::kFast) {
      timed.push_back(c);
      continue;
    }
    const VerifyParams p =
        with_numerics(problem.verify_params(0, T, RecordMode::kRing), VerifyNumerics::kFast);
    if (!fast_plan_runs(ctx, c, p, T, "")) {
      continue;
    }
    timed.push_back(c);
    check.clear();
    check.compare(p, c.bv, 0, int64_t{B} * T, a.launch, ctx.stream);
    failures.insert(failures.end(), check.failures().begin(), check.failures().end());
    (*diffs)[c.bv] = check.diff();
    fmt::print(stderr, "fast BV={} vs exact: {}; ", c.bv, check.diff().describe());
    if (first_out.empty()) {
      first_out = check.fast_out();
      first_bv = c.bv;
      try {
        *fp64 = check.fp64_errors(p, ctx.stream);
      } catch (const std::exception& e) {  // a statistic: the timings go on without it
        note(ctx, fmt::format("verify T={} B={}: no fp64 oracle ({})", T, B, e.what()));
      }
      if (*fp64) {
        fmt::print(stderr, "fp64 rel L2 fast {:.2e} / exact {:.2e} = {:.2f}x; ", (*fp64)->fast,
                   (*fp64)->exact, (*fp64)->ratio());
      }
    } else if (a.guard && !std::equal(first_out.begin(), first_out.end(), check.fast_out().begin(),
                                      check.fast_out().end(),
                                      [](bf16_t x, bf16_t y) { return x.bits == y.bits; })) {
      failures.push_back(fmt::format(
          "the fast outputs differ between BV={} and BV={} (contract §10 (a): the same at every "
          "tile)",
          first_bv, c.bv));
    }
  }
  fast_failures(ctx, failures, fmt::format("verify T={} B={}", T, B));
  return timed;
}

}  // namespace

// ---- verify: one layer, every variant and BV ----

void run_verify_phase(BenchContext& ctx) {
  const BenchArgs& a = ctx.args;
  print_table_header(Phase::kVerify);
  const int total = static_cast<int>(a.batch_sizes.size() * a.draft_tokens.size());
  int done = 0;
  for (int B : a.batch_sizes) {
    ProblemConfig cfg = problem_config(a, B);
    cfg.guard_set = a.guard;
    cfg.copies = a.l2_cold ? fit_cold_copies(ctx, cfg) : 1;
    check_fits(cfg, "verify", fast_check_bytes(a, cfg));
    const Problem problem(cfg, ctx.stream);
    std::optional<FastCheck> check;
    if (a.has_numerics(VerifyNumerics::kFast)) {
      check.emplace(problem);
    }
    for (int T : a.draft_tokens) {
      ++done;
      fmt::print(stderr, "kda_bench: [verify {}/{}] T={} B={}{}: ", done, total, T, B,
                 a.l2_cold ? fmt::format(" ({} layer copies)", cfg.copies) : std::string());
      if (a.guard) {
        int runs = 0;
        for (RecordMode mode : {RecordMode::kSnapshot, RecordMode::kRing}) {
          if (!a.any_mode(mode)) {
            continue;
          }
          const GuardResult g = run_bitwise_guard(problem, T, mode, a.launch,
                                                  guarded_block_vs(a, B, T, mode), ctx.stream);
          runs += g.comparisons;
          if (!g.ok) {
            fmt::print(stderr, "bitwise guard FAILED\n");
            for (const std::string& f : g.failures) {
              fmt::print(stderr, "kda_bench: guard: {}\n", f);
            }
            throw GuardFailure{};
          }
        }
        fmt::print(stderr, "bitwise guard ok ({} fused runs == unfused); ", runs);
      }
      std::vector<std::string> left_out;
      std::vector<VerifyConfig> configs = verify_configs(a, B, T, &left_out);
      for (const std::string& n : left_out) {
        note(ctx, n);
      }
      std::map<int, OutputDiff> fast_diffs;  // by fast tile
      std::optional<Fp64Errors> fp64;
      if (check) {
        configs = check_fast_rows(ctx, problem, *check, configs, T, B, &fast_diffs, &fp64);
      }
      fmt::print(stderr, "timing\n");

      std::vector<Row> group;
      const int copies = cfg.copies;
      const int calls = verify_calls_per_graph(a, copies);
      for (const VerifyConfig& c : configs) {
        std::vector<VerifyParams> params;
        for (int copy = 0; copy < copies; ++copy) {
          params.push_back(
              with_numerics(problem.verify_params(copy, T, variant_mode(c.variant)), c.numerics));
        }
        Row r = verify_row(ctx, Phase::kVerify, c.variant, c.bv, T, B);
        if (c.numerics == VerifyNumerics::kFast) {
          r.diff = fast_diffs.at(c.bv);
          r.fp64 = fp64;
        }
        time_verify_row(ctx, r, c.variant, c.bv, params, calls);
        group.push_back(r);
      }
      print_group(a, group);
      for (const Row& r : group) {
        if (!a.sweep_bv || r.best_bv || !r.fused) {
          fmt::print(stderr, "kda_bench: [verify] T={} B={} {} {} BV={}: {}\n", T, B, r.what,
                     numerics_name(r.numerics), r.bv, r.kernel);
        }
      }
      add_rows(ctx, group);
      time_shapes(ctx, problem, check ? &*check : nullptr, T, B, copies, calls);
    }
  }
}

// ---- commit and round: [layers] pools ----

namespace {

/// Real records in every layer (each mode's verify once), so the commit folds real data.
void fill_records(const BenchContext& ctx, const Problem& problem, int T) {
  for (RecordMode mode : {RecordMode::kSnapshot, RecordMode::kRing}) {
    if (!ctx.args.any_mode(mode)) {
      continue;
    }
    for (int l = 0; l < ctx.args.layers; ++l) {
      kernels::invoke_verify_unfused(problem.verify_params(l, T, mode), ctx.stream,
                                     ctx.args.launch);
    }
  }
  KDA_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
}

}  // namespace

void run_commit_phase(BenchContext& ctx) {
  const BenchArgs& a = ctx.args;
  print_table_header(Phase::kCommit);
  TimerConfig timer = ctx.timer;
  timer.iters = a.commit_iters;
  for (int B : a.batch_sizes) {
    const ProblemConfig cfg = commit_problem_config(a, B);
    check_fits(cfg, "commit", 0);
    const Problem problem(cfg, ctx.stream);
    const bool tracks = cfg.track_slots > 0;
    const bool deferred_rows = tracks && cfg.ring;
    std::optional<DeferredState> deferred;
    if (deferred_rows) {
      deferred.emplace(ctx, problem);
    }
    for (int T : a.draft_tokens) {
      fmt::print(stderr, "kda_bench: [commit] T={} B={} layers={}{}\n", T, B, a.layers,
                 tracks ? fmt::format(" ({} tracks)", B) : std::string());
      fill_records(ctx, problem, T);
      const int n = a.accepted > 0 ? a.accepted : T;
      problem.set_accepted(n, ctx.stream);
      const CommitBytes cb = commit_bytes(a.shape, a.layers, B, n);
      struct Op {
        const char* name;
        RecordMode mode;
        int64_t bytes;
        void (*invoke)(const CommitParams&, cudaStream_t, const kernels::LaunchOverrides&);
        CommitParams params;
        bool deferred = false;  ///< the cursors and counts start at zero
      };
      const auto plain = [&](RecordMode mode) { return problem.commit_params(T, mode, a.layers); };
      std::vector<Op> ops;
      if (cfg.ring) {
        ops.push_back(
            {"fold", RecordMode::kRing, cb.fold, kernels::invoke_fold, plain(RecordMode::kRing)});
      }
      if (cfg.snapshot) {
        ops.push_back({"commit_snapshot", RecordMode::kSnapshot, cb.snapshot,
                       kernels::invoke_commit_snapshot, plain(RecordMode::kSnapshot)});
      }
      const RecordMode conv_mode = cfg.ring ? RecordMode::kRing : RecordMode::kSnapshot;
      ops.push_back(
          {"commit_conv", conv_mode, cb.conv, kernels::invoke_commit_conv, plain(conv_mode)});
      if (cfg.ring) {
        ops.push_back({"commit+ring", RecordMode::kRing, cb.fold + cb.conv, kernels::invoke_commit,
                       plain(RecordMode::kRing)});
      }
      if (cfg.snapshot) {
        ops.push_back({"commit", RecordMode::kSnapshot, cb.snapshot + cb.conv,
                       kernels::invoke_commit, plain(RecordMode::kSnapshot)});
      }
      if (tracks) {
        // Request i tracks accepted step k = n - 1 into slot B + i: valid (k < n, outside the
        // batch, distinct), so any kBadTrack is the bench's own error.
        const int k = commit_track_step(n);
        problem.set_tracks(k, ctx.stream);
        const TrackBytes tb = track_bytes(a.shape, a.layers, B, k);
        const auto tracked = [&](RecordMode mode) {
          return problem.tracked_commit_params(T, mode, a.layers);
        };
        if (cfg.ring) {
          ops.push_back({"commit+ring+track", RecordMode::kRing, cb.fold + cb.conv + tb.ring,
                         kernels::invoke_commit, tracked(RecordMode::kRing)});
        }
        if (cfg.snapshot) {
          ops.push_back({"commit+track", RecordMode::kSnapshot, cb.snapshot + cb.conv + tb.snapshot,
                         kernels::invoke_commit, tracked(RecordMode::kSnapshot)});
        }
        if (deferred_rows) {
          ops.push_back({"commit+deferred", RecordMode::kRing, cb.conv, kernels::invoke_commit,
                         deferred->deferred(plain(RecordMode::kRing)), true});
          ops.push_back({"commit+deferred+track", RecordMode::kRing, cb.conv + tb.deferred,
                         kernels::invoke_commit, deferred->deferred(tracked(RecordMode::kRing)),
                         true});
        }
      }
      for (const Op& op : ops) {
        if (op.deferred) {
          // A clean start per row; the replays then move the cursors (mod L), at no cost.
          deferred->reset(ctx.stream);
        }
        Row r;
        r.phase = Phase::kCommit;
        r.what = op.name;
        r.mode = op.mode;
        r.T = T;
        r.B = B;
        r.layers = a.layers;
        r.timing = time_in_graph(
            ctx.stream, a.calls, [&](int) { op.invoke(op.params, ctx.stream, a.launch); }, timer);
        check_error_flag(ctx, problem, op.name);
        r.model_bytes = r.moved_bytes = op.bytes;
        r.floor_us = floor_us(op.bytes, ctx.copy_gbps);
        r.gbps = achieved_gbps(op.bytes, r.timing.median_us);
        r.pct = 100.0 * r.gbps / ctx.copy_gbps;
        print_row(r);
        add_rows(ctx, {r});
      }
    }
  }
}

namespace {

/// Round BV for a fused variant in numerics `n`: the best verify BV of (T, B, mode, n) if
/// measured, else `fallback` (the first of BenchArgs::block_vs: --block-v, or auto: the
/// dispatcher's tile for B).
int round_bv(const BenchContext& ctx, Variant v, VerifyNumerics n, int T, int B, int fallback) {
  int bv = fallback;
  double best = 0.0;
  for (const Row& r : ctx.rows) {
    if (r.phase == Phase::kVerify && r.fused && r.mode == variant_mode(v) && r.numerics == n &&
        r.draft_shape == DraftShape::kDense && r.T == T && r.B == B &&
        (best == 0.0 || r.timing.median_us < best)) {
      best = r.timing.median_us;
      bv = r.bv;
    }
  }
  return bv;
}

}  // namespace

namespace {

/// Times one round (every layer's verify, then the commit) in a CUDA graph into `r`, checks the
/// commit's error flag, finishes, prints and records the row.
void time_round(BenchContext& ctx, const Problem& problem, Variant v, int bv,
                const std::vector<VerifyParams>& params, const CommitParams& cp, const char* what,
                Row& r) {
  const PlannedLayers plan = planned_layers(v, bv, params, ctx.args.launch);
  r.kernel = plan.kernel;
  r.numerics = plan.numerics;
  TimerConfig timer = ctx.timer;
  timer.iters = ctx.args.round_iters;
  r.timing = time_in_graph(
      ctx.stream, 1,
      [&](int) {
        for (const VerifyParams& p : params) {
          enqueue_verify(v, bv, p, ctx.stream, ctx.args.launch);
        }
        kernels::invoke_commit(cp, ctx.stream, ctx.args.launch);
      },
      timer);
  check_error_flag(ctx, problem, what);
  finish_floor_row(r, ctx.args.hbm_gbps);
  print_row(r);
  add_rows(ctx, {r});
}

/// The round guard (before the deferred round is timed, unless --skip-guard): the deferred
/// round against the eager one, bitwise, in graphs of two rounds each (every layer's verify,
/// then the commit, twice), so that the second round's first verify follows the first round's
/// commit through PDL, the order VerifyParams::fold_before_wait relies on. From one saved state:
/// kRoundGuardReplays replays of the eager pair, then (state restored, nothing pending) of the
/// deferred pair. After every replay every layer's outputs and conv windows must be equal, and
/// after the deferred run's materializing fold the SSM and conv states. A fast deferred round
/// (`diff` given) is held to the exact eager one the same way but for its outputs, whose
/// statistics (contract §10 (b): every layer, every replay) go to `diff`. The state is left as
/// the eager run left it. Throws GuardFailure on a difference.
constexpr int kRoundGuardReplays = 4;

/// Adds the first `elems` outputs of every copy of `out` (host images of the pool) to `diff`.
void add_output_rows(OutputDiff& diff, const std::vector<uint8_t>& fast,
                     const std::vector<uint8_t>& exact, const Pool& out, int64_t elems, int V) {
  for (int c = 0; c < out.copies; ++c) {
    const int64_t at = int64_t{c} * out.pitch * 2;
    diff.add(reinterpret_cast<const bf16_t*>(fast.data() + at),
             reinterpret_cast<const bf16_t*>(exact.data() + at), elems, V);
  }
}

std::vector<uint8_t> download(const Pool& pool, cudaStream_t stream) {
  std::vector<uint8_t> host(static_cast<size_t>(pool.buf.bytes()));
  KDA_CUDA_CHECK(
      cudaMemcpyAsync(host.data(), pool.buf.data(), host.size(), cudaMemcpyDeviceToHost, stream));
  KDA_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host;
}

void copy_pool(void* dst, const void* src, const Pool& pool, cudaStream_t stream) {
  KDA_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(pool.buf.bytes()),
                                 cudaMemcpyDeviceToDevice, stream));
}

void run_round_guard(BenchContext& ctx, const Problem& problem, Variant v, int eager_bv,
                     int deferred_bv, const DeferredState& state,
                     const std::vector<VerifyParams>& eager, const CommitParams& eager_commit,
                     const std::vector<VerifyParams>& deferred, const CommitParams& deferred_commit,
                     OutputDiff* diff) {
  const cudaStream_t stream = ctx.stream;
  const Device device = Device::cuda(ctx.args.device);
  const Pool& ssm = problem.ssm_state();
  const Pool& conv = problem.conv_state();
  Buffer ssm0(device, ssm.buf.bytes()), conv0(device, conv.buf.bytes());
  copy_pool(ssm0.data(), ssm.buf.data(), ssm, stream);
  copy_pool(conv0.data(), conv.buf.data(), conv, stream);
  const OutputSet& out = problem.outputs(0);
  const auto two_rounds = [&](int bv, const std::vector<VerifyParams>& params,
                              const CommitParams& cp) {
    return [&, bv] {
      for (int round = 0; round < 2; ++round) {
        for (const VerifyParams& p : params) {
          enqueue_verify(v, bv, p, stream, ctx.args.launch);
        }
        kernels::invoke_commit(cp, stream, ctx.args.launch);
      }
    };
  };
  // Eager: every replay's outputs, then the final state.
  std::vector<std::vector<uint8_t>> outs, windows;
  replay_in_graph(stream, two_rounds(eager_bv, eager, eager_commit), kRoundGuardReplays, [&](int) {
    outs.push_back(download(out.out, stream));
    windows.push_back(download(out.conv_window, stream));
  });
  const std::vector<uint8_t> eager_ssm = download(ssm, stream);
  const std::vector<uint8_t> eager_conv = download(conv, stream);
  // Deferred, from the same state with nothing pending.
  copy_pool(ssm.buf.data(), ssm0.data(), ssm, stream);
  copy_pool(conv.buf.data(), conv0.data(), conv, stream);
  state.reset(stream);
  std::vector<std::string> failures;
  replay_in_graph(stream, two_rounds(deferred_bv, deferred, deferred_commit), kRoundGuardReplays,
                  [&](int r) {
                    const auto at = static_cast<size_t>(r);
                    if (diff != nullptr) {
                      const VerifyParams& p = deferred.front();
                      add_output_rows(*diff, download(out.out, stream), outs[at], out.out,
                                      int64_t{p.B} * p.T * p.HV * p.V, p.V);
                    } else if (download(out.out, stream) != outs[at]) {
                      failures.push_back(fmt::format("replay {}: outputs differ", r));
                    }
                    if (download(out.conv_window, stream) != windows[at]) {
                      failures.push_back(fmt::format("replay {}: conv windows differ", r));
                    }
                  });
  CommitParams materialize = deferred_commit;
  materialize.kind = CommitKind::kMaterialize;
  kernels::invoke_commit(materialize, stream, ctx.args.launch);
  if (download(ssm, stream) != eager_ssm) {
    failures.push_back("materialized SSM state differs");
  }
  if (download(conv, stream) != eager_conv) {
    failures.push_back("conv state differs");
  }
  // Leave the eager run's state (the timed rounds start from there).
  KDA_CUDA_CHECK(cudaMemcpyAsync(ssm.buf.data(), eager_ssm.data(), eager_ssm.size(),
                                 cudaMemcpyHostToDevice, stream));
  state.reset(stream);
  KDA_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (!failures.empty()) {
    fmt::print(stderr,
               "kda_bench: round guard FAILED (deferred vs eager, {} replays of two rounds)\n",
               kRoundGuardReplays);
    for (const std::string& f : failures) {
      fmt::print(stderr, "kda_bench: round guard: {}\n", f);
    }
    throw GuardFailure{};
  }
  if (diff != nullptr) {
    fmt::print(stderr,
               "kda_bench: round guard ok ({} replays of two rounds: fast deferred windows and "
               "materialized state == exact eager's; outputs {})\n",
               kRoundGuardReplays, diff->describe());
    return;
  }
  fmt::print(stderr, "kda_bench: round guard ok ({} replays of two rounds: deferred == eager)\n",
             kRoundGuardReplays);
}

/// run_round_guard against the plain eager ring round of the problem's layers (tile eager_bv).
void run_round_guard_against_eager(BenchContext& ctx, const Problem& problem, Variant v,
                                   int eager_bv, int bv, const DeferredState& state, int T,
                                   const std::vector<VerifyParams>& params, const CommitParams& cp,
                                   OutputDiff* diff) {
  std::vector<VerifyParams> eager;
  for (int l = 0; l < ctx.args.layers; ++l) {
    eager.push_back(problem.verify_params(l, T, RecordMode::kRing));
  }
  run_round_guard(ctx, problem, v, eager_bv, bv, state, eager,
                  problem.commit_params(T, RecordMode::kRing, ctx.args.layers), params, cp, diff);
}

/// The same round with the deferred commit (contract §7): each layer's verify first folds the
/// previous replay's accepted steps (n per request, from device pending counts and ring
/// cursors) and writes the state back; the commit records the counts and commits the conv
/// state, with no state pass. Byte model: the eager round's minus one state pass per layer
/// (the fold's read), plus the u records: each verify writes one per token (HV x V f32), and
/// the fold reads a step's u in place of its rawv and beta. Steady state from the second replay
/// on (the timer's warm-up). In numerics `nm`: a fast deferred round whose plan runs exact is not
/// timed (std::nullopt, a note): it would repeat the exact one.
std::optional<Row> run_deferred_round(BenchContext& ctx, const Problem& problem, Variant v, int bv,
                                      int T, int B, const Row& eager, VerifyNumerics nm) {
  const BenchArgs& a = ctx.args;
  const DeferredState state(ctx, problem);
  const bool fast = nm == VerifyNumerics::kFast;  // then u-free: fast outputs record no u
  std::vector<VerifyParams> params;
  for (int l = 0; l < a.layers; ++l) {
    params.push_back(state.deferred(
        with_numerics(problem.verify_params(l, T, RecordMode::kRing), nm), l, /*u_free=*/fast));
  }
  if (fast) {
    const PlannedLayers plan = planned_layers(v, bv, params, a.launch);
    if (plan.numerics != VerifyNumerics::kFast) {
      note(ctx, fmt::format("{}+deferred (round, step) T={} BV={}: the u-free deferred verify's "
                            "plan runs exact ({})",
                            variant_name(v), T, bv, plan.kernel));
      return std::nullopt;
    }
  }
  const CommitParams cp =
      state.deferred(problem.commit_params(T, RecordMode::kRing, a.layers), /*u_free=*/fast);
  Row r = eager;
  r.what = eager.what + "+deferred";
  r.bv = bv;
  r.diff.reset();
  const int n = a.accepted > 0 ? a.accepted : T;
  const int64_t delta = deferred_round_delta(a.shape, a.layers, B, T, int64_t{B} * n);
  r.model_bytes += delta;
  r.moved_bytes += delta;
  if (a.guard) {
    OutputDiff diff;
    run_round_guard_against_eager(ctx, problem, v, eager.bv, bv, state, T, params, cp,
                                  fast ? &diff : nullptr);
    if (fast) {
      r.diff = diff;
    }
  } else if (fast) {
    note(ctx,
         "fast deferred rounds: no §10 (b) statistics with --skip-guard (the round guard "
         "measures them)");
  }
  time_round(ctx, problem, v, bv, params, cp, "deferred round", r);
  return r;
}

/// The same round with the lazy write-back (contract §11; fast outputs): each layer's verify
/// reads the committed checkpoint and its slots' pending steps as the fast chunk's history, the
/// commit adds the accepted steps to the pending counts and folds a slot's when the next draft
/// would not fit its ring. Successive replays fold every few rounds (the device's counts carry
/// over), so the timing is the average round. Byte model: the eager round's with the fold's state
/// passes where the commit folds and the history's records (lazy_round). Guarded as the fast
/// deferred round (windows, the materialized state, outputs by §10 (b)). Not timed where its
/// plan does not run fast or the ring cannot hold a history (std::nullopt, a note).
std::optional<Row> run_lazy_round(BenchContext& ctx, const Problem& problem, Variant v, int bv,
                                  int T, int B, const Row& eager) {
  const BenchArgs& a = ctx.args;
  const int L = problem.config().L, T_max = problem.config().T_max;
  if (L > kFastMaxChunk || 2 * T_max > L) {
    note(ctx, fmt::format("{}+lazy (round) T={}: a ring of L={} does not hold a lazy history "
                          "(2 T_max <= L <= {})",
                          variant_name(v), T, L, kFastMaxChunk));
    return std::nullopt;
  }
  const DeferredState state(ctx, problem);
  std::vector<VerifyParams> params;
  for (int l = 0; l < a.layers; ++l) {
    params.push_back(state.lazy(
        with_numerics(problem.verify_params(l, T, RecordMode::kRing), VerifyNumerics::kFast), l));
  }
  const PlannedLayers plan = planned_layers(v, bv, params, a.launch);
  if (plan.numerics != VerifyNumerics::kFast) {
    note(ctx, fmt::format("{}+lazy (round) T={} BV={}: the plan runs exact ({})", variant_name(v),
                          T, bv, plan.kernel));
    return std::nullopt;
  }
  const CommitParams cp = state.lazy(problem.commit_params(T, RecordMode::kRing, a.layers));
  Row r = eager;
  r.what = eager.what + "+lazy";
  r.bv = bv;
  r.diff.reset();
  const int n = a.accepted > 0 ? a.accepted : T;
  const LazyRound lr = lazy_round(a.shape, a.layers, B, T_max, L, n);
  r.model_bytes += lr.delta;
  r.moved_bytes += lr.delta;
  fmt::print(stderr,
             "kda_bench: [round] lazy T={} B={}: a fold every {:.2f} rounds, {:.2f} history steps "
             "a verify (L={}, {} accepted)\n",
             T, B, static_cast<double>(lr.rounds) / std::max(lr.folds, 1), lr.history, L, n);
  if (a.guard) {
    OutputDiff diff;
    run_round_guard_against_eager(ctx, problem, v, eager.bv, bv, state, T, params, cp, &diff);
    r.diff = diff;
  } else {
    note(ctx,
         "lazy rounds: no §10 (b) statistics with --skip-guard (the round guard measures "
         "them)");
  }
  time_round(ctx, problem, v, bv, params, cp, "lazy round", r);
  return r;
}

/// Contract §10 (b) for a fast round: every layer's fast verify (`params`, copy = layer) against
/// its exact twin (FastCheck), untimed; the records and windows must be exact's.
OutputDiff fast_round_diff(BenchContext& ctx, FastCheck& check,
                           const std::vector<VerifyParams>& params, int bv, int T, int B) {
  check.clear();
  for (size_t l = 0; l < params.size(); ++l) {
    check.compare(params[l], bv, static_cast<int>(l), int64_t{B} * T, ctx.args.launch, ctx.stream);
  }
  fast_failures(ctx, check.failures(), fmt::format("round T={} B={}", T, B));
  fmt::print(stderr, "kda_bench: [round] fast vs exact, every layer: {}\n",
             check.diff().describe());
  return check.diff();
}

}  // namespace

void run_round_phase(BenchContext& ctx) {
  const BenchArgs& a = ctx.args;
  print_table_header(Phase::kRound);
  for (int B : a.batch_sizes) {
    ProblemConfig cfg = problem_config(a, B);
    cfg.copies = a.layers;
    check_fits(cfg, "round", fast_check_bytes(a, cfg));
    const Problem problem(cfg, ctx.stream);
    std::optional<FastCheck> check;
    if (a.has_numerics(VerifyNumerics::kFast)) {
      check.emplace(problem);
    }
    for (int T : a.draft_tokens) {
      fmt::print(stderr, "kda_bench: [round] T={} B={} layers={}\n", T, B, a.layers);
      const int n = a.accepted > 0 ? a.accepted : T;
      problem.set_accepted(n, ctx.stream);
      const CommitBytes cb = commit_bytes(a.shape, a.layers, B, n);
      for (Variant v : a.variants) {
        const RecordMode mode = variant_mode(v);
        for (const VerifyNumerics nm : a.numerics) {
          const bool fast = nm == VerifyNumerics::kFast;
          const std::vector<int> bvs = a.block_vs(v, nm, B, T);
          if (bvs.empty()) {
            note(ctx, fast_skip_reason(a, v, T, 0, /*deferred=*/false));
            continue;
          }
          const int bv = variant_is_fused(v) ? round_bv(ctx, v, nm, T, B, bvs.front()) : 0;
          std::vector<VerifyParams> params;
          for (int l = 0; l < a.layers; ++l) {
            params.push_back(with_numerics(problem.verify_params(l, T, mode), nm));
          }
          Row r = verify_row(ctx, Phase::kRound, v, bv, T, B);
          if (fast) {
            const PlannedLayers plan = planned_layers(v, bv, params, a.launch);
            if (plan.numerics != VerifyNumerics::kFast) {
              note(ctx, fmt::format("{} (round) T={} BV={}: the plan runs exact ({})",
                                    variant_name(v), T, bv, plan.kernel));
              continue;
            }
            r.diff = fast_round_diff(ctx, *check, params, bv, T, B);
          }
          const CommitParams cp = problem.commit_params(T, mode, a.layers);
          r.layers = a.layers;
          const int64_t commit = (mode == RecordMode::kRing ? cb.fold : cb.snapshot) + cb.conv;
          r.model_bytes = r.model_bytes * a.layers + commit;
          r.moved_bytes = r.moved_bytes * a.layers + commit;
          time_round(ctx, problem, v, bv, params, cp, "round", r);
          if (mode != RecordMode::kRing) {
            continue;
          }
          // A fast deferred verify keeps the fast tile; an exact one takes the deferred rule's.
          const int dbv = fast ? bv : deferred_bv(ctx, v, T, B, bv);
          const std::optional<Row> deferred = run_deferred_round(ctx, problem, v, dbv, T, B, r, nm);
          if (deferred) {
            fmt::print(
                "            auto (--kda-deferred-commit{}): {} at T={} B={} ({:.1f} vs {:.1f} "
                "us)\n",
                fast ? ", fast outputs" : "",
                deferred->timing.median_us < r.timing.median_us ? "deferred" : "eager", T, B,
                deferred->timing.median_us, r.timing.median_us);
          }
          if (fast && variant_is_fused(v)) {
            (void)run_lazy_round(ctx, problem, v, bv, T, B, r);
          }
        }
      }
    }
  }
}

}  // namespace kda::bench
