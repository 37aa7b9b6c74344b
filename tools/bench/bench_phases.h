// bench_phases.h: the three timed phases of kda_bench. Each allocates one Problem per batch
// size, prints its table rows as they come (stdout), a progress line per step (stderr), and
// appends its rows to the context (rewriting --out after each step).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
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
  std::vector<std::string> notes;  ///< what note() printed (each once per run)
};

/// Prints "            fast rows left out: <what>" once per run (stdout, between table rows).
void note(BenchContext& ctx, const std::string& what);
/// The failures of a FastCheck (records or windows that differ from exact's, or fast runs that
/// should be equal and are not), printed under `what`: throws GuardFailure with the guard on, only
/// warns with --skip-guard. Nothing without failures.
void fast_failures(const BenchContext& ctx, const std::vector<std::string>& failures,
                   const std::string& what);

/// One layer's verify, every variant (and BV) in every --numerics, after the bitwise guard and
/// the fast rows' comparison against exact (contract §10); throws GuardFailure.
void run_verify_phase(BenchContext& ctx);
/// fold / snapshot commit / conv commit (and the two full commits) over --layers layers; with
/// --commit-tracks also the full commits with a track per request (into slots past the batch)
/// and the deferred commit without and with tracks.
void run_commit_phase(BenchContext& ctx);
/// Every layer's verify + the commit in one graph per variant and numerics; in ring mode also the
/// deferred round, after its round guard (deferred vs eager: bitwise, a fast deferred round's
/// outputs by their statistics); a fast eager round after every layer's fast verify is compared
/// with its exact twin. Throws GuardFailure.
void run_round_phase(BenchContext& ctx);

}  // namespace kda::bench
