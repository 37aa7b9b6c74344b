// bench_phases.h: the three timed phases of kda_bench. Each allocates one Problem per batch
// size, prints its table rows as they come (stdout), a progress line per step (stderr), and
// appends its rows to the context (rewriting --out after each step).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "tools/bench/bench_args.h"
#include "tools/bench/bench_report.h"
#include "tools/bench/bench_timer.h"

namespace kda::bench {

/// Thrown when the bitwise guard fails (the failures are already printed).
struct GuardFailure {};

struct BenchContext {
  BenchContext(const BenchArgs& a, cudaStream_t s) : args(a), stream(s) {}
  const BenchArgs& args;
  cudaStream_t stream;  ///< non-default stream all work is enqueued (and captured) on
  TimerConfig timer;
  double copy_gbps = 0.0;  ///< measured D2D copy rate (commit %)
  int64_t l2_bytes = 0;
  RunInfo info;  ///< --out metadata
  std::vector<Row> rows;
};

/// One layer's verify, every variant (and BV), after the bitwise guard; throws GuardFailure.
void run_verify_phase(BenchContext& ctx);
/// fold / snapshot commit / conv commit (and the two full commits) over --layers layers; with
/// --commit-tracks also the full commits with a track per request (into slots past the batch)
/// and the deferred commit without and with tracks.
void run_commit_phase(BenchContext& ctx);
/// Every layer's verify + the commit in one graph per variant; in ring mode also the deferred
/// round, after its round guard (deferred vs eager, bitwise); throws GuardFailure.
void run_round_phase(BenchContext& ctx);

}  // namespace kda::bench
