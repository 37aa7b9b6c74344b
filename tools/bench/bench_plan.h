// bench_plan.h: what a kda_bench run allocates and times (shared by the phases and by
// --dry-run, which prints the plan and a device-time lower bound without touching a GPU).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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
  /// references (with `guard`; with `fast` also the fast step's).
  int64_t device_bytes(const Shape& s, const ProblemConfig& problem, bool guard,
                       bool fast = false) const;
};
StepLayout step_layout(const BenchArgs& args, int B);

/// --l2-cold: layer copies so that the bytes touched between two uses of one copy exceed
/// 2x `l2_bytes` (at least 2, at most --max-copies).
int l2_cold_copies(const BenchArgs& args, int B, int64_t l2_bytes);

/// Verify calls captured per graph: --calls rounded up to a multiple of `copies`.
inline int verify_calls_per_graph(const BenchArgs& args, int copies) {
  return copies * ((args.calls + copies - 1) / copies);
}

/// One verify configuration a phase times: `variant` in `numerics` at fused tile `bv` (0: unfused).
struct VerifyConfig {
  Variant variant = Variant::kFusedRing;
  VerifyNumerics numerics = VerifyNumerics::kExact;
  int bv = 0;
  bool operator==(const VerifyConfig& o) const {
    return variant == o.variant && numerics == o.numerics && bv == o.bv;
  }
};
/// The dense verify configurations of (B, T) in report order: per variant its exact tiles, then
/// its fast tiles (BenchArgs::block_vs), a fast one only where fast_skip_reason gives none. Each
/// fast configuration left out adds its reason to `notes` (when given; once per reason).
std::vector<VerifyConfig> verify_configs(const BenchArgs& args, int B, int T,
                                         std::vector<std::string>* notes);
/// `note` appended to `notes` unless it is there already.
void add_note(std::vector<std::string>* notes, const std::string& note);

/// The kernel a fused+ring verify of (B, T) in fast numerics at tile `bv` plans
/// (kernels::plan_verify on a device of args.sms SMs, 132 when unknown; sm_90): what --dry-run
/// shows for a fast row.
std::string fast_kernel_name(const BenchArgs& args, int B, int T, int bv);

/// --dry-run: per phase and batch size the device memory and the timed configurations, and
/// a lower bound of the device time (every call at the floor, at least kMinCallUs).
void print_plan(const BenchArgs& args, int64_t l2_bytes);

}  // namespace kda::bench
