// bench_report.h: kda_bench's results: rows, the aligned stdout tables, the recommended
// dispatch table and the CSV / JSON files. Host-only (no CUDA).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tools/bench/bench_args.h"
#include "tools/bench/bench_diff.h"
#include "tools/bench/bench_timing.h"

namespace kda::bench {

enum class Phase : uint8_t { kVerify, kCommit, kRound, kStep };
const char* phase_name(Phase p);

/// One timed configuration.
struct Row {
  Phase phase = Phase::kVerify;
  /// verify / round / step: variant name (round, step: + "+deferred"; step: also "gemm-only",
  /// the step without the verifies and the commit); commit: fold, commit_snapshot,
  /// commit_conv, commit+ring, commit, and with --commit-tracks commit+ring+track, commit+track,
  /// commit+deferred, commit+deferred+track (at most 21 characters: the commit table's column)
  std::string what;
  RecordMode mode = RecordMode::kRing;
  bool fused = false;
  int T = 0, B = 0;
  int bv = 0;      ///< fused V tile; 0 = not applicable
  int layers = 1;  ///< commit / round: layers per launch / round
  int copies = 1;  ///< verify: layer copies rotated through (--l2-cold)
  Timing timing;   ///< us per call (verify, commit), per round (round) or per step (step)
  /// step: the gemm-only step's median us, and the KDA share = timing.median_us - gemm_us (the
  /// byte model, floor and % of a step row are the KDA share's); 0 elsewhere.
  double gemm_us = 0.0, share_us = 0.0;
  int64_t model_bytes = 0;  ///< the byte model (the floor's bytes)
  int64_t moved_bytes = 0;  ///< what this variant moves (unfused: + qkv_act round trip)
  double floor_us = 0.0;    ///< model bytes at the floor rate (verify, round) or copy rate
  double gbps = 0.0;        ///< moved bytes / median time
  double pct = 0.0;  ///< verify, round: 100 * floor / median; step: of the share; commit: % of copy
  std::optional<double> target_us;  ///< contract §6 target (ring mode, preset shapes)
  bool best_bv = false;             ///< fused: the fastest BV of its (phase, T, B, mode)
  /// verify / round / step: the kernel the plan ran (kernels::VerifyPlan::kernel; layer 0's in a
  /// round or step).
  std::string kernel;
  /// verify: the batch's draft shape (--draft-shapes). Rows of another shape than dense are
  /// written and printed but stay out of the best-BV marks and the dispatch advice.
  DraftShape draft_shape = DraftShape::kDense;
  /// verify / round / step: the numerics the plan ran (kernels::VerifyPlan::numerics; every
  /// layer's in a round or step). A fast row whose plan runs exact is not timed.
  VerifyNumerics numerics = VerifyNumerics::kExact;
  /// fast rows: the outputs against exact's on the same inputs (contract §10 (b)); verify: the
  /// call's, round and step: every layer's. Empty on exact rows.
  std::optional<OutputDiff> diff;
  /// verify fast rows of a dense chain: the fast and exact outputs against the fp64 oracle
  /// (contract §10 (c)); empty elsewhere.
  std::optional<Fp64Errors> fp64;

  bool target_ok() const { return target_us && timing.median_us <= *target_us; }
};

/// Contract §6's verify targets, ring mode, for the preset shapes (only while the shape is the
/// preset's): a multiple of the call's floor at `floor_gbps` (the card's copy rate); std::nullopt
/// elsewhere.
std::optional<double> target_us(Preset preset, const Shape& shape, RecordMode mode, int T, int B,
                                double floor_gbps);

/// Sets best_bv on the fastest fused row of every (phase, T, B, mode, numerics) group in `rows`.
void mark_best_bv(std::vector<Row>& rows);

/// Aligned tables on stdout, one header per phase, then rows as they come.
void print_table_header(Phase phase);
void print_row(const Row& row);

/// The recommended dispatch, derived from the exact verify rows (the fast rows are another
/// numerics, not another path: --kda-verify-numerics).
struct DispatchEntry {
  int T = 0, B = 0;
  // ring mode / snapshot mode: the fastest path; bv = 0 for unfused; *_alt_us = the other path
  std::string ring_path, snap_path;
  int ring_bv = 0, snap_bv = 0;
  double ring_us = 0.0, ring_alt_us = 0.0, snap_us = 0.0, snap_alt_us = 0.0;
  std::optional<double> target_us;  ///< ring mode's contract §6 target; none if ring untimed
};
/// How an auto tile fared in a BV sweep: rows where it was timed, rows where it was the best,
/// its worst time / best time.
struct AutoTileScore {
  int rows = 0, best = 0;
  double worst = 1.0;
};
struct Recommendation {
  std::vector<DispatchEntry> entries;
  std::vector<std::pair<int, int>> max_batch_per_T;  ///< (T, largest B with fused fastest)
  std::optional<int> fused_ring_max_batch;           ///< min over T; nullopt: not measurable
  std::optional<int> default_bv;                     ///< ring mode, where fused is dispatched
  /// Over those rows, geometric means of time / each row's best time: default_bv's, and the
  /// auto tile's (kernels::default_fused_block_v per row; nullopt where a row lacks its time).
  std::optional<double> default_bv_slowdown, auto_ring_slowdown;
  std::optional<int> snapshot_bv;  ///< snapshot mode alone
  bool bv_swept = false;
  /// The dispatcher's auto tile against the swept best, per mode (ring: kernels::default_block_v,
  /// snapshot: kernels::default_snapshot_block_v).
  AutoTileScore auto_ring, auto_snapshot;
  /// Whether to suggest --kda-verify-block-v=auto over default_bv: the auto tile's geometric-mean
  /// slowdown is known and no larger.
  bool suggest_auto_bv() const {
    return auto_ring_slowdown && default_bv_slowdown && *auto_ring_slowdown <= *default_bv_slowdown;
  }
};
Recommendation recommend(const std::vector<Row>& rows, const BenchArgs& args);
void print_recommendation(const Recommendation& rec);

/// Run metadata for the files.
struct RunInfo {
  std::string device;
  std::string shape;
  int H = 0, HV = 0, K = 0, V = 0;  ///< the shape's letters, in every CSV row
  int hidden = 0;                   ///< step: the model's hidden size
  std::string command_line;
  double hbm_gbps = 0.0;
  double copy_gbps = 0.0;
  int64_t l2_bytes = 0;
};

/// What the exact step rows say (contract §6): per (T, B) whether the deferred commit beats the
/// eager one on the step's KDA share (fused+ring), and per T the largest batch up to which
/// fused+ring beats unfused+ring on the step.
struct StepAdviceEntry {
  int T = 0, B = 0;
  double eager_us = 0.0, deferred_us = 0.0;  ///< the two steps (fused+ring)
  double gemm_us = 0.0;
  bool defer = false;  ///< the deferred step is faster by more than kStepDeferMinGainPct
};
/// The deferred commit is chosen where it is faster by more than this (run-to-run noise): the
/// choice is then within this of the best mode at every measured row (contract §6 asks 2%).
constexpr double kStepDeferMinGainPct = 1.0;
struct StepAdvice {
  std::vector<StepAdviceEntry> entries;
  std::vector<std::pair<int, int>> max_batch_per_T;  ///< (T, largest B with fused fastest)
  std::optional<int> fused_ring_max_batch;           ///< min over T; nullopt: not measured
};
StepAdvice step_advice(const std::vector<Row>& rows, const BenchArgs& args);
void print_step_advice(const StepAdvice& advice);

/// A fast step row beside the exact step row of the same variant and commit, (T, B).
struct FastStepEntry {
  int T = 0, B = 0;
  std::string what;                                  ///< the variant (+deferred, +lazy)
  double exact_share_us = 0.0, fast_share_us = 0.0;  ///< the KDA shares
};
/// Every fast step row of `rows` with its exact twin (a +lazy row: the exact eager step of its
/// variant), in row order.
std::vector<FastStepEntry> fast_step_entries(const std::vector<Row>& rows);

/// Writes every row to `path` (.csv or .json; JSON adds the run info and recommendation).
/// Throws kda::Error(kIo) when the file cannot be written.
void write_rows(const std::string& path, const RunInfo& info, const std::vector<Row>& rows,
                const Recommendation& rec);

}  // namespace kda::bench
