// kda_bench: times the KDA verify backend's kernels on one GPU (issue 6, tool part).
//
// For one model shape, over a batch-size list and a draft-length (T) list:
//   verify  one layer's verify for {unfused, fused} x {snapshot, ring} (fused: the dispatcher's
//           auto tile per B, --block-v, or every BV with --sweep-bv), each checked bitwise
//           fused vs unfused before timing;
//   commit  fold / snapshot commit / conv commit of --layers layers, one launch each, and the
//           whole commit per mode (one launch: the state kernel carries the conv copy); with
//           --commit-tracks also the commits with a prefix-cache track per request and the
//           deferred commit with and without;
//   round   every layer's verify + the commit, one graph per round;
//   step    the round inside a model: per layer the projection GEMMs around the verify, then the
//           commit, one graph per step; the KDA share = the step - its gemm-only twin.
// --numerics exact,fast times verify, round and step rows in both output numerics (contract §10):
// fast rows carry their outputs' statistics against exact ones on the same inputs.
// Methodology (contract §6): --calls calls in one CUDA graph, --warmup replays, then --reps
// repetitions of --iters timed replays; median / min / max of us per call. Byte model and
// floor: tools/bench/bench_bytes.h. See --help for the flags.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <optional>
#include <string>

#include "core/buffer.h"
#include "core/cuda_check.h"
#include "core/error.h"
#include "core/platform.h"
#include "kernels/common/launch_utils.h"
#include "tools/bench/bench_args.h"
#include "tools/bench/bench_bytes.h"
#include "tools/bench/bench_device.h"
#include "tools/bench/bench_phases.h"
#include "tools/bench/bench_plan.h"
#include "tools/bench/bench_report.h"
#include "tools/bench/bench_step.h"
#include "tools/bench/bench_timer.h"

namespace kda::bench {
namespace {

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitGuard = 3;

double gib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0); }

std::string join_argv(int argc, const char* const* argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    s += (i ? " " : "") + std::string(argv[i]);
  }
  return s;
}

/// The run's header: shape, sweep, methodology, byte model.
void print_header(const BenchArgs& args) {
  fmt::print("shape: {}{}\n", args.shape.describe(),
             args.preset != Preset::kNone ? fmt::format(" (preset {})", preset_name(args.preset))
                                          : std::string());
  fmt::print("T: {}  B: {}  L={}  T_max={}  slots = rows = arange(B), S = R = B{}\n",
             fmt::join(args.draft_tokens, ","), fmt::join(args.batch_sizes, ","),
             args.effective_ring_len(), args.max_T(),
             args.commit_tracks
                 ? "; commit tracks: S = 2B, request i tracks accepted step n-1 into slot B + i"
                 : "");
  fmt::print(
      "timing: {} calls per CUDA graph, {} warm-up replays, {} reps x {} timed replays; "
      "us/call = median over reps; PDL {}; persistent kernels {}; fast walk {}; fast stagger {}; "
      "fast pending fold {}; tile occupancy "
      "{}{}\n",
      args.calls, args.warmup, args.reps, args.iters, args.launch.pdl ? "on" : "off",
      args.launch.persistent == kernels::PersistentMode::kAuto
          ? "auto"
          : (args.launch.persistent == kernels::PersistentMode::kAlways ? "always" : "never"),
      args.launch.fast_walk ? "on" : "off", args.launch.fast_stagger ? "on" : "off",
      args.launch.fast_fold_in_kernel ? "in the kernel" : "first",
      args.launch.occupancy == kernels::TileOccupancy::kAuto
          ? "auto"
          : (args.launch.occupancy == kernels::TileOccupancy::kOnePerSm ? "one CTA per SM"
                                                                        : "two CTAs per SM"),
      args.l2_cold ? "; L2-cold: rotating layer copies (one call per copy)" : "");
  if (args.has_numerics(VerifyNumerics::kFast)) {
    fmt::print(
        "numerics: {} (contract §10; fast rows: fused+ring, eager verifies, a fast tile; their "
        "eq% / ulp / rel L2 columns: the outputs against exact ones on the same inputs)\n",
        args.numerics.size() == 2 ? "exact,fast" : "fast");
  }
  for (const std::string& line : describe_byte_model(args.shape, args.planning_gbps())) {
    fmt::print("{}\n", line);
  }
  if (args.commit_tracks) {
    for (const std::string& line : describe_track_model(args.shape)) {
      fmt::print("{}\n", line);
    }
  }
}

int run(const BenchArgs& cli_args, int argc, const char* const* argv) {
  BenchArgs args = cli_args;  // plus the device's SM count (the dispatcher's auto tile uses it)
  if (args.dry_run) {
    print_header(args);
    print_plan(args, kAssumedL2Bytes);
    return 0;
  }
  const Platform platform = detect_platform(args.device);
  if (!platform.has_device) {
    fmt::print(stderr,
               "kda_bench: no CUDA device: {}\nkda_bench: run it on a GPU host (see "
               "tools/gpu_bundle.sh); --help and --dry-run work anywhere\n",
               platform.reason);
    return kExitError;
  }
  KDA_CUDA_CHECK(cudaSetDevice(platform.device));
  args.sms = platform.sm_count;
  cudaDeviceProp prop{};
  KDA_CUDA_CHECK(cudaGetDeviceProperties(&prop, platform.device));

  Stream stream;
  BenchContext ctx{args, stream.get()};
  ctx.timer = TimerConfig{args.warmup, args.iters, args.reps};
  ctx.l2_bytes = prop.l2CacheSize;

  fmt::print("kda_bench: {}; L2 {:.1f} MiB; {:.1f} GiB\n", platform.describe(),
             prop.l2CacheSize / 1048576.0, gib(static_cast<int64_t>(prop.totalGlobalMem)));
  // Every floor is at the card's measured copy rate unless --hbm-gbps names one (contract §6):
  // measured before the header prints the byte model's floors; ctx.args is `args`.
  const int64_t copy_bytes = int64_t{args.copy_mib} << 20;
  ctx.copy_gbps = measure_copy_gbps(ctx.stream, copy_bytes, args.calls, ctx.timer);
  ctx.info.copy_gbps = ctx.copy_gbps;
  const bool floor_measured = !(args.hbm_gbps > 0.0);
  if (floor_measured) {
    args.hbm_gbps = ctx.copy_gbps;
  }
  ctx.info.hbm_gbps = args.hbm_gbps;
  print_header(args);

  ctx.info.device = platform.describe();
  ctx.info.shape = args.shape.describe();
  ctx.info.H = args.shape.H;
  ctx.info.HV = args.shape.HV;
  ctx.info.K = args.shape.K;
  ctx.info.V = args.shape.V;
  ctx.info.hidden = args.phase_step ? args.step_hidden() : 0;
  ctx.info.command_line = join_argv(argc, argv);
  ctx.info.l2_bytes = ctx.l2_bytes;
  if (!args.out_path.empty()) {
    write_rows(args.out_path, ctx.info, {}, Recommendation{});  // fail before timing, not after
  }

  fmt::print(
      "device copy rate: {:.0f} GB/s (cudaMemcpyAsync D2D of {} MiB, in-graph, read + "
      "write counted); floor bandwidth used: {:.0f} GB/s{}\n",
      ctx.copy_gbps, args.copy_mib, args.hbm_gbps,
      floor_measured ? " (the copy rate, contract §6; --hbm-gbps overrides)" : " (--hbm-gbps)");

  {
    // Launch-latency floor of one call in a graph (what B = 1 cannot go below).
    const Buffer probe(Device::cuda(args.device), 64 << 10);
    fill_i32(static_cast<int32_t*>(probe.data()), 16 << 10, 7, ctx.stream);
    const Timing empty = time_in_graph(
        ctx.stream, args.calls, [&](int) { launch_empty_probe(args.launch.pdl, ctx.stream); },
        ctx.timer);
    const Timing chain = time_in_graph(
        ctx.stream, args.calls,
        [&](int) {
          launch_dependent_load_probe(static_cast<int32_t*>(probe.data()), args.launch.pdl,
                                      ctx.stream);
        },
        ctx.timer);
    fmt::print(
        "launch floor: {:.2f} us/call for an empty kernel, {:.2f} us/call for 128 CTAs doing two "
        "dependent global loads (same graph methodology)\n",
        empty.median_us, chain.median_us);
  }

  if (args.phase_verify) {
    run_verify_phase(ctx);
  }
  if (args.phase_commit) {
    run_commit_phase(ctx);
  }
  if (args.phase_round) {
    run_round_phase(ctx);
  }
  if (args.phase_step) {
    run_step_phase(ctx);
  }

  const Recommendation rec = recommend(ctx.rows, args);
  if (args.phase_verify) {
    print_recommendation(rec);
  }
  int row_targets = 0, row_misses = 0, path_targets = 0, path_misses = 0;
  for (const Row& r : ctx.rows) {
    row_targets += r.target_us ? 1 : 0;
    row_misses += r.target_us && !r.target_ok() ? 1 : 0;
  }
  for (const DispatchEntry& e : rec.entries) {
    path_targets += e.target_us ? 1 : 0;
    path_misses += e.target_us && e.ring_us > *e.target_us ? 1 : 0;
  }
  if (path_targets > 0) {
    fmt::print(
        "contract §6 targets (ring mode): recommended paths {} of {} pass; timed ring rows "
        "{} of {} pass\n",
        path_targets - path_misses, path_targets, row_targets - row_misses, row_targets);
  }
  if (!args.out_path.empty()) {
    write_rows(args.out_path, ctx.info, ctx.rows, rec);
    fmt::print(stderr, "kda_bench: wrote {} rows to {}\n", ctx.rows.size(), args.out_path);
  }
  return 0;
}

}  // namespace
}  // namespace kda::bench

int main(int argc, char** argv) {
  using namespace kda::bench;
  std::optional<BenchArgs> args;
  try {
    args = parse_bench_args(argc, argv);
  } catch (const ArgError& e) {
    fmt::print(stderr, "kda_bench: {}\n", e.what());
    return kExitUsage;
  }
  if (!args) {
    return 0;  // --help
  }
  try {
    return run(*args, argc, argv);
  } catch (const GuardFailure&) {
    fmt::print(stderr, "kda_bench: a bitwise guard failed (see above); not timing\n");
    return kExitGuard;
  } catch (const kda::Error& e) {
    fmt::print(stderr, "kda_bench: error: {}\n", e.what());
    return kExitError;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kda_bench: error: {}\n", e.what());
    return kExitError;
  }
}
