// demo_report.h: the demo's progress lines and final summary (plain text).
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "tools/demo/demo_check.h"
#include "tools/demo/demo_driver.h"

namespace kda::demo {

/// What the summary says beyond the primary run's own stats.
struct SummaryContext {
  std::string device_text;         ///< "host (CPU reference kernels)", "cuda:0 NVIDIA H200 ..."
  std::string model_text;          ///< preset name, layer note and shape
  std::vector<std::string> notes;  ///< defaults taken, reduced check runs, adjusted flags
  double primary_seconds = 0.0;    ///< primary run, host wall time (set-up included)
  double total_seconds = 0.0;      ///< whole demo
};

/// One progress line for round `rec` of `spec` ("[primary] round 3/8: ...").
std::string progress_line(const RunSpec& spec, const RoundRecord& rec);

/// "T=4, snapshot mode (L=16 unused), max-running-requests 2, fused verify on, ...".
std::string describe_engine_flags(const EngineFlags& f);

/// The final summary: run, tokens, latency, dispatch, memory, checks and the verdict line
/// ("RESULT: PASS ..." or "RESULT: FAIL ...").
void print_summary(std::ostream& os, const SummaryContext& ctx, const DemoRun& primary,
                   const std::vector<CheckOutcome>& checks);

}  // namespace kda::demo
