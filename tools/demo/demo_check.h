// demo_check.h: the demo's correctness check. The final committed states of a run (SSM state
// and conv state of every layer of every request) are compared against an independent run
// of the same inputs: a second backend in the other record mode on the same device (the
// contract says ring-mode commits are BITWISE equal to snapshot-mode commits), and/or the host
// implementation for a CUDA run (relative L2 <= 1e-4 on states after a whole run).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tools/demo/demo_driver.h"

namespace kda::demo {

/// GPU vs host tolerance on f32 states after a whole run. One verify step agrees to 1e-5
/// (contract §3, kernels_gpu_test); end to end, the GPU's approximate SiLU (ex2.approx,
/// div.full) rounds a rare bf16 activation the other way than the host's std::exp, and
/// those 1-ulp input flips accumulate over the prefill and every round (measured on an
/// H200: 1.35e-5 after 64 prompt tokens + 32 rounds). A wrong-step or skipped commit moves
/// states by >= 1e-3, so 1e-4 still separates right from wrong by an order of magnitude.
constexpr double kStateRelL2Tol = 1e-4;

enum class CompareRule : uint8_t {
  kBitwise,  ///< every bit equal (same device, other record mode)
  kRelL2,    ///< per (layer, request) state: ||a - b||_2 / ||b||_2 <= kStateRelL2Tol
};

/// Differences of one kind of state over every compared (layer, request).
struct StateDiff {
  int64_t states = 0;                        ///< (layer, request) pairs compared
  int64_t elements = 0;                      ///< values compared
  int64_t differing = 0;                     ///< values whose bits differ
  int64_t non_finite = 0;                    ///< NaN/Inf values in either run (always a failure)
  double max_abs = 0.0;                      ///< max |a - b|
  double max_rel_l2 = 0.0;                   ///< max over states of ||a - b|| / ||b|| (0 / 0 = 0)
  int worst_layer = -1, worst_request = -1;  ///< state of max_rel_l2 (-1: all equal)

  bool bitwise() const { return differing == 0; }
  bool passes(CompareRule rule) const;
};

struct CheckOutcome {
  std::string name;      ///< e.g. "cuda:0 ring mode vs independent snapshot-mode backend"
  std::string coverage;  ///< which layers / requests were compared, and why
  CompareRule rule = CompareRule::kBitwise;
  StateDiff ssm, conv;
  std::vector<DecisionCount> reference_decisions;  ///< how the reference run dispatched
  std::vector<std::string> details;  ///< per-kind lines (the prefix check: per event kind)
  double run_seconds = 0.0;          ///< the reference run (set-up included), host wall time
  double compare_seconds = 0.0;      ///< reading both runs' states to the host and comparing them
  bool passed() const { return ssm.passes(rule) && conv.passes(rule); }
};

/// The spec of an independent run in the other record mode (same device, everything else
/// equal). Ring mode needs L >= 2T: if the primary's L is too short it becomes the smallest
/// power of two >= 2T (L does not change any value); `note` then says so.
RunSpec other_mode_spec(const RunSpec& primary, std::string* note);

/// The spec of a host run of `primary` over its first `layers` layers and `requests`
/// requests (0 = all), same record mode, eager.
RunSpec host_reference_spec(const RunSpec& primary, int layers, int requests);

/// Compares the committed states of `reference`'s layers x requests (all of them) with the
/// same (layer, request) of `primary` (which must cover at least as many).
CheckOutcome compare_runs(const DemoRun& primary, const DemoRun& reference, CompareRule rule);

/// Folds the comparison of one (layer, request) state `a` with its reference `ref` (same size)
/// into `d`; folded in (layer, request) order, the worst state is the first of the largest.
void compare_state(StateDiff& d, const std::vector<float>& a, const std::vector<float>& ref,
                   int layer, int request);
void compare_state(StateDiff& d, const std::vector<bf16_t>& a, const std::vector<bf16_t>& ref,
                   int layer, int request);

/// "bitwise" or "relative L2 <= 0.0001".
std::string rule_text(CompareRule rule);

}  // namespace kda::demo
