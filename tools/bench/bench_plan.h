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

/// The step phase's Problem (contract §6 "step"): --layers copies of the state, weights and
/// records, no activations of its own (the verifies read column views of the input projection's
/// output), snapshots when a snapshot variant is timed or the step guard runs (it compares the
/// snapshot-mode step with the ring-mode ones).
ProblemConfig step_problem_config(const BenchArgs& args, int B);

/// The step's buffers besides its Problem, per batch size.
struct StepLayout {
  int64_t P = 0;        ///< input projection width: D + HV*K + HV (mixed_qkv | a | b)
  int64_t ld_proj = 0;  ///< its row pitch: P rounded up to 8 elements (16-byte rows)
  int64_t rows = 0;     ///< B * T_max: the most tokens a step of this batch runs
  int hidden = 0, mlp = 0, layers = 0;
  int stages = 0;  ///< hidden-state hand-offs: layers * (2 with an MLP, else 1)
  /// Device bytes: weights, the hidden-state chain (stages + 1 buffers, so a step is a function
  /// of its input), the projection and MLP activations, the GEMM workspace, and the step guard's
  /// references (with `guard`).
  int64_t device_bytes(const Shape& s, const ProblemConfig& problem, bool guard) const;
};
StepLayout step_layout(const BenchArgs& args, int B);

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
