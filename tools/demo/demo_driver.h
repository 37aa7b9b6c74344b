// demo_driver.h: one run of the demo: weights, a backend, a batch of requests with their
// slots, prompt prefill through extend, then rounds of verify (every layer) -> accepted
// lengths uploaded to the device -> commit, exactly the way an engine drives the backend.
//
// A run is a pure function of its RunSpec: the check runs (demo_check.h) are RunSpecs that
// differ in record mode, device, layer or request count and reproduce the primary run's
// values for every (layer, request) they cover.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/flags.h"
#include "backend/kda_backend.h"
#include "backend/model_config.h"
#include "core/dtype.h"
#include "core/platform.h"
#include "core/tensor_view.h"
#include "tools/demo/demo_accept.h"
#include "tools/demo/demo_device.h"
#include "tools/demo/demo_inputs.h"
#include "tools/demo/demo_model.h"

namespace kda::demo {

struct RunSpec {
  std::string label = "run";  ///< for progress lines ("primary", "check (ring mode)", ...)
  ModelConfig model;
  EngineFlags flags;  ///< max_running_requests >= requests
  Device device = Device::host();
  std::optional<Platform> platform;  ///< dispatcher override (BackendOptions)
  int requests = 1;                  ///< B: every round verifies all of them
  int prompt_len = 0;                ///< tokens prefilled per request (0: start from zero state)
  int rounds = 1;
  uint64_t seed = 1;
  AcceptSpec accept;
};

/// One verify -> commit round. Times: CUDA events on the stream, or steady_clock on the host.
struct RoundRecord {
  int round = 0;                  ///< 0-based
  int64_t accepted_tokens = 0;    ///< sum of the accepted lengths (verified token included)
  int64_t drafted_tokens = 0;     ///< B * T
  std::vector<double> verify_ms;  ///< per layer
  double verify_total_ms = 0;     ///< all layers
  double upload_ms = 0;           ///< accepted lengths: pinned staging -> device
  double commit_ms = 0;           ///< commit of all layers
  double wall_ms = 0;             ///< host wall time of the round (inputs excluded)
};

/// A distinct dispatch decision (DispatchDecision::describe()) and how often verify made it.
struct DecisionCount {
  std::string text;
  bool fused = false;
  int64_t calls = 0;
};

struct RunStats {
  double prefill_ms = 0;  ///< extend of every layer (device time)
  std::vector<RoundRecord> rounds;
  std::vector<DecisionCount> decisions;  ///< first-seen order
  int64_t accepted_tokens = 0, drafted_tokens = 0;
};

/// Called after every round.
using ProgressFn = std::function<void(const RunSpec&, const RoundRecord&)>;

class DemoRun {
 public:
  /// Builds the weights (seeded), the backend (make_kernel_set(spec.device)) and one slot per
  /// request. Throws kda::Error (e.g. kUnsupported when the CUDA device is not usable).
  explicit DemoRun(RunSpec spec);
  ~DemoRun();
  DemoRun(const DemoRun&) = delete;
  DemoRun& operator=(const DemoRun&) = delete;

  /// prefill() then every round; check_device_errors after each round.
  void run(const ProgressFn& progress = nullptr);
  /// Prompt prefill: prepare_extend, then extend per layer.
  void prefill();
  /// Round `round`: inputs, prepare, verify every layer, upload accepted lengths, commit.
  RoundRecord run_round(int round);

  const RunSpec& spec() const { return spec_; }
  const KdaAttentionBackend& backend() const { return *backend_; }
  const RunStats& stats() const { return stats_; }
  int slot_of(int request) const { return slots_.at(static_cast<size_t>(request)); }

  /// The committed state of `request` in `layer`, read from the pool's per-layer views after
  /// the stream has drained: [HV, V, K] f32 and [W-1, D] bf16, packed.
  std::vector<float> ssm_state(int layer, int request) const;
  std::vector<bf16_t> conv_state(int layer, int request) const;

 private:
  void count_decisions();

  RunSpec spec_;
  DemoStream stream_;
  DemoWeights weights_;
  std::unique_ptr<KdaAttentionBackend> backend_;
  std::vector<int32_t> slots_;                   // per request
  std::vector<LayerActivations> verify_inputs_;  // per layer, B*T rows
  std::vector<HostActivations> host_inputs_;     // staging of the generator
  AcceptedLengths accepted_;
  StreamClock clock_;  // marks: start, after each layer's verify, after upload, after commit
  std::vector<DispatchDecision> round_decisions_;  // counted after the round, off the clock
  RunStats stats_;
};

}  // namespace kda::demo
