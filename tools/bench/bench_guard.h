// bench_guard.h: the bitwise guard kda_bench runs before timing. The kernels are designed to
// be bitwise identical across fused / unfused and every BV (contract §3), so a benchmark of
// paths that disagree would compare different computations: refuse to time them.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "tools/bench/bench_problem.h"

namespace kda::bench {

struct GuardResult {
  bool ok = true;
  int comparisons = 0;                ///< fused runs compared against the unfused one
  std::vector<std::string> failures;  ///< per differing (BV, tensor): first index, both values
};

/// Copy 0 of `problem` (which needs its guard set): unfused into output set 0 and fused at
/// every BV of `block_vs` into output set 1, both sets prefilled with identical garbage before
/// each run; compares out, conv windows and the rings (ring mode) or snapshots (snapshot
/// mode) bytewise; reports every differing tensor of every BV. Synchronises `stream`.
GuardResult run_bitwise_guard(const Problem& problem, int T, RecordMode mode,
                              const kernels::LaunchOverrides& launch,
                              const std::vector<int>& block_vs, cudaStream_t stream);

}  // namespace kda::bench
