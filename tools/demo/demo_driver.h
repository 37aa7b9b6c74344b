// demo_driver.h: one run of the demo: weights, a backend, a batch of requests with their
// slots, prompt prefill through extend, then rounds of inputs + verify (every layer) ->
// accepted lengths uploaded to the device -> commit, the way an engine drives the backend:
// eagerly, or (CUDA, RunSpec::cuda_graph) inputs + verify as one CUDA graph replay per round.
// Inputs are generated in place on the run's device (demo_inputs.h). With RunSpec::prefix
// (demo_prefix.h) the prefill shares prompt prefixes through copy_slot and ExtendTrack, and the
// commits track states (CommitTrack; track steps computed on the host from the host-known
// accepted lengths and uploaded with them, so verify and commit stay free of host syncs).
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
#include "tools/demo/demo_prefix.h"

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
  /// CUDA only: capture the first round's inputs + verify of every layer into a CUDA graph and
  /// replay it every round (the batch is the same every round); upload + commit stay eager.
  bool cuda_graph = false;
  /// Prefix caching (demo_prefix.h): needs prompt_len >= shared_len >= 1.
  PrefixSpec prefix;
  /// Each round's draft shape (contract §8): chain, ragged (T_n per request, draft_length) or
  /// tree (draft_tree; needs --speculative-eagle-topk > 1; committed along accepted_path).
  /// Ragged and tree runs take no prefix caching.
  DraftShapeKind draft_shape = DraftShapeKind::kChain;
};

/// One inputs -> verify -> commit round. Times: CUDA events on the stream, or steady_clock on
/// the host.
struct RoundRecord {
  int round = 0;                  ///< 0-based
  bool graphed = false;           ///< inputs + verify ran as one CUDA graph replay
  int64_t accepted_tokens = 0;    ///< sum of the accepted lengths (verified token included)
  int64_t drafted_tokens = 0;     ///< B * T
  double inputs_ms = 0;           ///< every layer's input generation (eager rounds only)
  std::vector<double> verify_ms;  ///< per layer (eager rounds only)
  double verify_total_ms = 0;     ///< all layers; graphed: the replay, inputs included
  double upload_ms = 0;           ///< accepted lengths: pinned staging -> device
  double commit_ms = 0;           ///< commit of all layers
  double device_ms = 0;           ///< the whole round on the stream (first mark to last)
  double wall_ms = 0;             ///< host wall time, round-number upload .. commit done
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
  /// After the last round: folds the deferred commit's pending steps (materialize), so that
  /// ssm_state() reads the committed state. run() calls it.
  void finish();
  /// Round `round`: prepare, inputs + verify every layer (eager or one graph replay), upload
  /// accepted lengths, commit. With cuda_graph the first call captures the graph first.
  RoundRecord run_round(int round);

  const RunSpec& spec() const { return spec_; }
  const KdaAttentionBackend& backend() const { return *backend_; }
  const RunStats& stats() const { return stats_; }
  int slot_of(int request) const { return slots_.at(static_cast<size_t>(request)); }
  /// Prefix caching: every state the cache produced, in the order it did (demo_prefix.h).
  const std::vector<PrefixEvent>& prefix_events() const { return prefix_events_; }

  /// The committed state of `request` in `layer`, read from the pool's per-layer views after
  /// the stream has drained: [HV, V, K] f32 and [W-1, D] bf16, packed.
  std::vector<float> ssm_state(int layer, int request) const;
  std::vector<bf16_t> conv_state(int layer, int request) const;
  /// The same for any allocated pool slot (a cache or track slot).
  std::vector<float> slot_ssm_state(int layer, int slot) const;
  std::vector<bf16_t> slot_conv_state(int layer, int slot) const;

 private:
  void count_decisions();
  void capture_round(const BatchSpec& batch);
  /// Extends prompt rows first_row .. first_row+T-1 of requests request0 + i*stride
  /// (i < count), with `track`; returns the device time of every layer's extend.
  double extend_prompt(int request0, int stride, int count, int first_row, int T,
                       const ExtendTrack& track);
  void prefill_shared();  // prefill() with RunSpec::prefix
  /// Stages round `round`'s decode tracks (request n accepts len[n]) and records their events.
  void stage_decode_tracks(int round);

  RunSpec spec_;
  DemoStream stream_;
  DemoWeights weights_;
  std::unique_ptr<KdaAttentionBackend> backend_;
  std::vector<int32_t> slots_;                   // per request
  std::vector<LayerActivations> verify_inputs_;  // per layer, B*T rows
  StagedInts accepted_;                          // [B] accepted lengths of the round
  StagedInts paths_;                             // [B, T] a tree round's accepted paths
  StagedInts round_index_;  // [1] the round the generator keys on (0 in prefill)
  // Prefix caching: per group its cache slot; the decode track slots, one per track, used in
  // order; per request its committed length (prompt + accepted tokens); the round's tracks.
  std::vector<int32_t> cache_slots_;
  std::vector<int32_t> track_pool_;
  size_t next_track_ = 0;
  std::vector<int64_t> committed_;
  StagedInts track_slots_, track_steps_;  // [B] CommitTrack of the round
  bool fault_planted_ = false;            // PrefixSpec::fault (tests) has been applied once
  std::vector<PrefixEvent> prefix_events_;
  StreamClock clock_;  // marks: see run_round
  CudaGraph graph_;    // cuda_graph: inputs + verify of every layer, captured once
  std::vector<DispatchDecision> graph_decisions_;  // the captured verify calls' decisions
  std::vector<DispatchDecision> round_decisions_;  // counted after the round, off the clock
  RunStats stats_;
};

}  // namespace kda::demo
