// bench_fast.h: a fast-output verify (contract §10) against its exact twin on the same inputs,
// untimed, before a fast row is timed. The outputs are compared by their statistics
// (bench_diff.h: §10 (b)); the records and conv windows must be bitwise exact's, since the fast
// form changes only the outputs and the committed state is folded from the records.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "kernels/common/launch_utils.h"
#include "kernels/params/kda_params.h"
#include "tools/bench/bench_diff.h"
#include "tools/bench/bench_problem.h"

namespace kda::bench {

class FastCheck {
 public:
  /// Device scratch for one copy of the ring-mode records and conv windows of `problem`.
  explicit FastCheck(const Problem& problem);
  /// The scratch a FastCheck of a Problem of `config` allocates.
  static int64_t device_bytes(const ProblemConfig& config);

  /// `fast` (a ring-mode fused verify with numerics kFast, on copy `copy` of the problem, output
  /// set 0) at tile `bv`, and its exact twin (the same params in kExact, the same tile): the same
  /// garbage into the copy's written tensors before each, the exact verify first (its records and
  /// windows saved), then the fast one. Adds the first `rows` output rows (every token's) to
  /// diff() and a line to failures() per record or window tensor that differs. An eager verify
  /// reads nothing a verify writes, so both see the same state and inputs; the copy is left as
  /// the fast verify wrote it. Synchronises `stream`.
  void compare(const VerifyParams& fast, int bv, int copy, int64_t rows,
               const kernels::LaunchOverrides& launch, cudaStream_t stream);

  const OutputDiff& diff() const { return diff_; }
  const std::vector<std::string>& failures() const { return failures_; }
  /// Contract §10 (c): the relative L2 errors of the last compare()'s fast and exact outputs
  /// against the host fp64 oracle (host::verify_fp64) on the same inputs, downloaded from the
  /// device. `call` is that compare()'s params (a dense chain: std::nullopt for a ragged one).
  /// Host work of B*T*HV*V*K doubles; synchronises `stream`.
  std::optional<Fp64Errors> fp64_errors(const VerifyParams& call, cudaStream_t stream) const;

  /// The last compare()'s fast outputs ([rows, HV, V] bf16).
  const std::vector<bf16_t>& fast_out() const { return fast_out_; }
  /// Forgets diff() and failures().
  void clear();

 private:
  const Problem& problem_;
  Buffer scratch_, flag_;
  OutputDiff diff_;
  std::vector<std::string> failures_;
  std::vector<bf16_t> exact_out_, fast_out_;
};

}  // namespace kda::bench
