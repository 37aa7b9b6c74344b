// bench_plan.h: what a kda_bench run allocates and times (shared by the phases and by
// --dry-run, which prints the plan and a device-time lower bound without touching a GPU).
#pragma once

#include <cstdint>

#include "tools/bench/bench_args.h"
#include "tools/bench/bench_problem.h"

namespace kda::bench {

/// L2 size --dry-run assumes (H200: 50 MiB).
constexpr int64_t kAssumedL2Bytes = int64_t{50} << 20;

/// The Problem of batch size `B`: one copy, T_max = max T, the modes the variants need.
ProblemConfig problem_config(const BenchArgs& args, int B);
/// The commit phase's Problem: --layers copies, and with --commit-tracks one track slot per
/// request (S = 2B).
ProblemConfig commit_problem_config(const BenchArgs& args, int B);

/// --l2-cold: layer copies so that the bytes touched between two uses of one copy exceed
/// 2x `l2_bytes` (at least 2, at most --max-copies).
int l2_cold_copies(const BenchArgs& args, int B, int64_t l2_bytes);

/// Verify calls captured per graph: --calls rounded up to a multiple of `copies`.
inline int verify_calls_per_graph(const BenchArgs& args, int copies) {
  return copies * ((args.calls + copies - 1) / copies);
}

/// --dry-run: per phase and batch size the device memory and the timed configurations, and
/// a lower bound of the device time (every call at the floor, at least kMinCallUs).
void print_plan(const BenchArgs& args, int64_t l2_bytes);

}  // namespace kda::bench
