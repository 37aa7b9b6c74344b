#include "tools/bench/bench_phases.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "core/error.h"
#include "kernels/kda_kernels.h"
#include "kernels/verify/tile_policy.h"
#include "tools/bench/bench_bytes.h"
#include "tools/bench/bench_guard.h"
#include "tools/bench/bench_ops.h"
#include "tools/bench/bench_plan.h"
#include "tools/bench/bench_problem.h"

namespace kda::bench {

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

void check_fits(const ProblemConfig& cfg, const char* what) {
  size_t free_b = 0, total_b = 0;
  KDA_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const int64_t need = Problem::device_bytes(cfg);
  KDA_CHECK_CODE(static_cast<double>(need) <= 0.95 * static_cast<double>(free_b),
                 ErrorCode::kOutOfMemory,
                 "{} B={}: needs {:.2f} GiB of device memory ({} layer copies), {:.2f} GiB free; "
                 "lower --batch-sizes, --layers or --max-copies, or drop the snapshot variants",
                 what, cfg.B, gib(need), cfg.copies, gib(static_cast<int64_t>(free_b)));
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
  r.target_us = phase == Phase::kVerify ? target_us(ctx.args.preset, ctx.args.shape, r.mode, T, B)
                                        : std::nullopt;
  return r;
}

void finish_floor_row(Row& r, double hbm_gbps) {
  r.floor_us = floor_us(r.model_bytes, hbm_gbps);
  r.gbps = achieved_gbps(r.moved_bytes, r.timing.median_us);
  r.pct = 100.0 * r.floor_us / r.timing.median_us;
}

/// Times row `r` (variant v, tile bv): `calls` verifies per graph, rotating through `params`
/// (one per layer copy), then its floor columns.
void time_verify_row(const BenchContext& ctx, Row& r, Variant v, int bv,
                     const std::vector<VerifyParams>& params, int calls) {
  const size_t copies = params.size();
  r.copies = static_cast<int>(copies);
  r.kernel = planned_kernel(v, bv, params.front(), ctx.args.launch);
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
void time_shapes(BenchContext& ctx, const Problem& problem, int T, int B, int copies, int calls) {
  const BenchArgs& a = ctx.args;
  std::vector<Row> shaped;
  for (const DraftShape shape : a.draft_shapes) {
    if (shape == DraftShape::kDense) {
      continue;
    }
    const ShapeIndices idx = shape_indices(shape, B, T, problem.config().device);
    for (Variant v : a.variants) {
      if (shape == DraftShape::kTree && variant_is_fused(v)) {
        continue;  // the fused kernels verify chains
      }
      std::vector<VerifyParams> params;
      for (int c = 0; c < copies; ++c) {
        VerifyParams p = problem.verify_params(c, T, variant_mode(v));
        p.token_offsets = idx.offsets;
        p.parents = idx.parents;
        params.push_back(p);
      }
      const std::vector<int> bvs =
          variant_is_fused(v) ? a.fused_block_vs(B, T, variant_mode(v)) : std::vector<int>{0};
      for (int bv : bvs) {
        Row r = verify_row(ctx, Phase::kVerify, v, bv, T, B);
        r.what =
            fmt::format("{} {} ({} tok)", variant_name(v), draft_shape_name(shape), idx.tokens);
        r.target_us.reset();
        r.draft_shape = shape;
        scale_tokens(r, a.shape, B, T, idx.tokens);
        time_verify_row(ctx, r, v, bv, params, calls);
        print_row(r);
        shaped.push_back(r);
      }
    }
  }
  add_rows(ctx, shaped);
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
    check_fits(cfg, "verify");
    const Problem problem(cfg, ctx.stream);
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
                                                  a.fused_block_vs(B, T, mode), ctx.stream);
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
      fmt::print(stderr, "timing\n");

      std::vector<Row> group;
      const int copies = cfg.copies;
      const int calls = verify_calls_per_graph(a, copies);
      for (Variant v : a.variants) {
        std::vector<VerifyParams> params;
        for (int c = 0; c < copies; ++c) {
          params.push_back(problem.verify_params(c, T, variant_mode(v)));
        }
        const std::vector<int> bvs =
            variant_is_fused(v) ? a.fused_block_vs(B, T, variant_mode(v)) : std::vector<int>{0};
        for (int bv : bvs) {
          Row r = verify_row(ctx, Phase::kVerify, v, bv, T, B);
          time_verify_row(ctx, r, v, bv, params, calls);
          group.push_back(r);
        }
      }
      print_group(a, group);
      for (const Row& r : group) {
        if (!a.sweep_bv || r.best_bv || !r.fused) {
          fmt::print(stderr, "kda_bench: [verify] T={} B={} {} BV={}: {}\n", T, B, r.what, r.bv,
                     r.kernel);
        }
      }
      add_rows(ctx, group);
      time_shapes(ctx, problem, T, B, copies, calls);
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
    check_fits(cfg, "commit");
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

/// Round BV for a fused variant: the best verify BV of (T, B, mode) if measured, else the
/// --block-v choice (auto: the dispatcher's tile for B).
int round_bv(const BenchContext& ctx, Variant v, int T, int B) {
  int bv = ctx.args.fused_block_vs(B, T, variant_mode(v)).front();
  double best = 0.0;
  for (const Row& r : ctx.rows) {
    if (r.phase == Phase::kVerify && r.fused && r.mode == variant_mode(v) && r.T == T && r.B == B &&
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
  r.kernel = planned_kernel(v, bv, params.front(), ctx.args.launch);
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
/// after the deferred run's materializing fold the SSM and conv states. The state is left as
/// the eager run left it. Throws GuardFailure on a difference.
constexpr int kRoundGuardReplays = 4;

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
                     const std::vector<VerifyParams>& deferred,
                     const CommitParams& deferred_commit) {
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
                    if (download(out.out, stream) != outs[at]) {
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
  fmt::print(stderr, "kda_bench: round guard ok ({} replays of two rounds: deferred == eager)\n",
             kRoundGuardReplays);
}

/// The same round with the deferred commit (contract §7): each layer's verify first folds the
/// previous replay's accepted steps (n per request, from device pending counts and ring
/// cursors) and writes the state back; the commit records the counts and commits the conv
/// state, with no state pass. Byte model: the eager round's minus one state pass per layer
/// (the fold's read), plus the u records: each verify writes one per token (HV x V f32), and
/// the fold reads a step's u in place of its rawv and beta. Steady state from the second replay
/// on (the timer's warm-up).
Row run_deferred_round(BenchContext& ctx, const Problem& problem, Variant v, int bv, int T, int B,
                       const Row& eager) {
  const BenchArgs& a = ctx.args;
  const DeferredState state(ctx, problem);
  std::vector<VerifyParams> params;
  for (int l = 0; l < a.layers; ++l) {
    params.push_back(state.deferred(problem.verify_params(l, T, RecordMode::kRing), l));
  }
  const CommitParams cp = state.deferred(problem.commit_params(T, RecordMode::kRing, a.layers));
  Row r = eager;
  r.what = eager.what + "+deferred";
  r.bv = bv;
  const int n = a.accepted > 0 ? a.accepted : T;
  const int64_t delta = deferred_round_delta(a.shape, a.layers, B, T, int64_t{B} * n);
  r.model_bytes += delta;
  r.moved_bytes += delta;
  if (a.guard) {
    std::vector<VerifyParams> eager_params;
    for (int l = 0; l < a.layers; ++l) {
      eager_params.push_back(problem.verify_params(l, T, RecordMode::kRing));
    }
    run_round_guard(ctx, problem, v, eager.bv, bv, state, eager_params,
                    problem.commit_params(T, RecordMode::kRing, a.layers), params, cp);
  }
  time_round(ctx, problem, v, bv, params, cp, "deferred round", r);
  return r;
}

}  // namespace

void run_round_phase(BenchContext& ctx) {
  const BenchArgs& a = ctx.args;
  print_table_header(Phase::kRound);
  for (int B : a.batch_sizes) {
    ProblemConfig cfg = problem_config(a, B);
    cfg.copies = a.layers;
    check_fits(cfg, "round");
    const Problem problem(cfg, ctx.stream);
    for (int T : a.draft_tokens) {
      fmt::print(stderr, "kda_bench: [round] T={} B={} layers={}\n", T, B, a.layers);
      const int n = a.accepted > 0 ? a.accepted : T;
      problem.set_accepted(n, ctx.stream);
      const CommitBytes cb = commit_bytes(a.shape, a.layers, B, n);
      for (Variant v : a.variants) {
        const RecordMode mode = variant_mode(v);
        const int bv = variant_is_fused(v) ? round_bv(ctx, v, T, B) : 0;
        std::vector<VerifyParams> params;
        for (int l = 0; l < a.layers; ++l) {
          params.push_back(problem.verify_params(l, T, mode));
        }
        const CommitParams cp = problem.commit_params(T, mode, a.layers);
        Row r = verify_row(ctx, Phase::kRound, v, bv, T, B);
        r.layers = a.layers;
        const int64_t commit = (mode == RecordMode::kRing ? cb.fold : cb.snapshot) + cb.conv;
        r.model_bytes = r.model_bytes * a.layers + commit;
        r.moved_bytes = r.moved_bytes * a.layers + commit;
        time_round(ctx, problem, v, bv, params, cp, "round", r);
        if (mode == RecordMode::kRing) {
          const Row deferred =
              run_deferred_round(ctx, problem, v, deferred_bv(ctx, v, T, B, bv), T, B, r);
          fmt::print(
              "            auto (--kda-deferred-commit): {} at T={} B={} ({:.1f} vs {:.1f} us)\n",
              deferred.timing.median_us < r.timing.median_us ? "deferred" : "eager", T, B,
              deferred.timing.median_us, r.timing.median_us);
        }
      }
    }
  }
}

}  // namespace kda::bench
