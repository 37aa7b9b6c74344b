// kda_backend.h: the KDA attention backend: per-request recurrent state, the ReplaySSM ring
// pool and the verify -> commit -> verify lifecycle of speculative decoding (contract §1).
//
// Typical step (B requests, T = --speculative-num-draft-tokens):
//   backend.prepare({T, slots}, stream);                    // host: validate + upload indices
//   for (int l = 0; l < layers; ++l) backend.verify(l, inputs[l], out[l], stream);
//   ... sample, compute accepted lengths on the device ...
//   backend.commit(accepted_lengths, stream);               // all layers at once
// Prefill: prepare_extend({prompt_len, slots}, stream) then extend(l, ...) for every layer.
// Prefix caching (contract §9): copy_slot(src, dst) starts a request from a cached state;
// commit(accepted, CommitTrack{slots, steps}) and prepare_extend(batch, ExtendTrack{...})
// also save the state after a chosen accepted step / prompt token into a track slot, in the
// same pass (SGLang's mamba_track_indices / mamba_steps_to_track).
//
// Ownership: the backend owns the state pool (KdaStatePool: conv/SSM state, rings, scratch),
// the device index buffers and the kernel set. Weights (set_layer_weights), inputs, outputs
// and accepted lengths are views the caller owns and keeps alive until the work that uses them
// has run on the stream (for captured graphs: for as long as the graph may be replayed).
// Engine-owned memory (BackendOptions): with an `allocator` (core/allocator.h) every byte the
// backend allocates (pool, index buffers, flags) comes from the engine's allocator and goes back
// to it at destruction; with an `external_pool` the engine hands in the state tensors it owns
// (memory_pool/pool_storage.h: SSM / conv state, rings, scratch; validated, used in place, never
// freed by the backend) and runs the lifecycle on them with its own slot numbers (claim_slot).
// kda::ops (backend/ops.h) is the same verify / commit / materialize without the object.
//
// Streams: every device operation is enqueued on the `stream` argument (host kernel set:
// runs synchronously, the stream is ignored). Use one stream for prepare, verify and commit of
// a round, or order them yourself. verify, extend and commit enqueue only: no allocation, no
// host synchronisation, no device-to-host reads; verify and commit are CUDA-graph capturable
// (their index buffers and pool views have fixed addresses; B and T are baked into a capture,
// so capture one graph per (B, T) bucket and prepare() the matching batch before each replay,
// then call record_graph_verify_round()). prepare/prepare_extend are not capturable (host
// validation + an async upload from pinned memory), like SGLang's init_forward_metadata.
// allocate_slot enqueues a memset; check_device_errors synchronises the stream.
//
// Errors: every call validates all of its arguments and the lifecycle state before doing any
// work; on any kda::Error nothing has changed (no state, no lifecycle, no counter).
// kInvalidArgument: a shape/dtype/stride/device/index/value problem, the message names the
// argument, what was expected and what came. kLifecycle: a call out of order (names the
// call, the layer and the round state). kCuda: a CUDA call failed.
//
// Thread safety: none. One thread drives a backend; distinct backends are independent.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/batch_indices.h"
#include "backend/flags.h"
#include "backend/model_config.h"
#include "backend/round_tracker.h"
#include "core/buffer.h"
#include "core/platform.h"
#include "core/tensor_view.h"
#include "dispatch/lazy_policy.h"
#include "dispatch/verify_dispatch.h"
#include "kernels/kernel_set.h"
#include "memory_pool/kda_state_pool.h"
#include "memory_pool/pool_storage.h"

namespace kda {

struct BackendOptions {
  /// Pretend a platform for the dispatcher (tests, tools); default: detect_platform(device)
  /// for CUDA, "no device" (family other) for the host kernel set.
  std::optional<Platform> platform_override;
  /// --kda-deferred-commit auto's lazy write-back table (dispatch/lazy_policy.h; rows made by
  /// tools/bench/make_auto_table.py --table lazy on the engine's own card), read at construction
  /// only; null (default): the built-in table of the measured card nearest to the device.
  const LazyPolicyCard* lazy_policy_table = nullptr;
  /// Pool memory budget in bytes (0 = none); construction throws kOutOfMemory above it.
  int64_t memory_budget_bytes = 0;
  /// State slots beyond --max-running-requests (S = max_running_requests + extra_slots), for
  /// engines that admit (prefill) a request before a finished one's slot is released.
  int extra_slots = 0;
  /// The engine's allocator (core/allocator.h): every byte of device memory the backend owns
  /// (the pool tensors not in external_pool, the index buffers, the error flag) comes from it,
  /// on allocation_stream, and returns to it when the backend is destroyed. Null: cudaMalloc
  /// (CUDA) or aligned_alloc (host).
  std::shared_ptr<Allocator> allocator;
  /// The stream of the allocator's allocations and frees and of the pool's construction-time
  /// zeroing (synchronised during construction). Null: the legacy default stream.
  cudaStream_t allocation_stream = nullptr;
  /// Engine-owned pool tensors (memory_pool/pool_storage.h: "external_pool.<tensor>" errors from
  /// the constructor, before anything is allocated), used in place of the pool's own; they must
  /// stay valid until the backend is destroyed. Their contents are the engine's: the backend
  /// writes a slot when it hands it out (allocate_slot, claim_slot) and runs on them.
  ExternalPoolTensors external_pool;
};

/// A verify batch's draft shape (contract §8).
enum class DraftShape : uint8_t {
  kDense,   ///< T tokens per request, a chain
  kRagged,  ///< T_n tokens per request (BatchSpec::lengths), a chain
  kTree,    ///< T nodes per request, each with a parent (BatchSpec::parents)
};
const char* draft_shape_name(DraftShape s);

/// One round's batch, described on the host.
struct BatchSpec {
  BatchSpec() = default;
  /// A dense batch (the draft-shape fields stay empty: set them after for a ragged or tree one).
  BatchSpec(int T_, std::vector<int32_t> slots_, std::vector<int32_t> rows_ = {})
      : T(T_), slots(std::move(slots_)), rows(std::move(rows_)) {}

  int T = 0;                   ///< tokens per request (verify: 1..T_max; extend: >= 1)
  std::vector<int32_t> slots;  ///< B entries: the request's state slot, or -1 = padding row
  /// Verify only: scratch row per request, distinct in [0, R) over the real requests; empty
  /// = the batch position (row n for request n). Extend uses no scratch: must be empty.
  std::vector<int32_t> rows;

  // ---- draft shape (contract §8, verify only; all empty: a dense chain of T per request) ----
  /// Ragged chain: B entries, request n verifies lengths[n] tokens in [1, T]; its token t is
  /// row offsets[n] + t of the activations (N = the sum of the lengths rows).
  std::vector<int32_t> lengths;
  /// With lengths, optional: B + 1 start rows (SGLang's query_start_loc), the packed prefix
  /// sums of lengths (offsets[0] = 0, offsets[n+1] - offsets[n] = lengths[n]); empty = those.
  std::vector<int32_t> offsets;
  /// Tree (--speculative-eagle-topk > 1; T nodes per request, lengths empty): B*T entries,
  /// parents[n*T + j] is node j's parent within request n: -1 for node 0 (the root, its
  /// parent the committed state) and only there, else in [0, j); at most topk children per
  /// node. Node j's outputs are row n*T + j. Commit with the accepted paths (commit_tree).
  std::vector<int32_t> parents;
};

/// An extend round's prefix-cache tracks (contract §9), on the host, B entries each: request n
/// with steps[n] = k in [0, T) also writes the state and conv state after its prompt token k
/// to slot slots[n] (allocated, outside the batch, one track per slot), in the same pass;
/// -1 = no track. A verify round's tracks go to commit() (CommitTrack).
struct ExtendTrack {
  std::vector<int32_t> slots;
  std::vector<int32_t> steps;
};

/// A commit's prefix-cache tracks (contract §9): [B] int32 views on the backend's device,
/// contiguous, read on the device. Request i with steps[i] = k >= 0 gets the state and conv
/// state after its accepted step k (0-based: k = 0 is the state after the first accepted
/// token) written to slot slots[i] of every layer; -1 = no track. k must be below the accepted
/// length and slots[i] must be an allocated slot outside the batch, tracked by no other
/// request; otherwise nothing is written for it and check_device_errors reports it. "Allocated"
/// is the host's allocation table when commit() is called (slots allocated or released since
/// prepare() are written to the device table on the commit's stream first); a commit captured in
/// a CUDA graph sees the table as of the prepare() before each replay.
struct CommitTrack {
  TensorView slots;
  TensorView steps;
};

/// One layer's activations for verify/extend; N = B*T rows, token t of request n at n*T + t.
struct VerifyInputs {
  TensorView mixed_qkv;  ///< [N, D] bf16, channels q|k|v, inner dim contiguous, row stride >= D
  TensorView a;          ///< [N, HV*K] bf16 gate logits, inner contiguous, row stride >= HV*K
  TensorView b;          ///< [N, HV] bf16 beta logits, inner contiguous, row stride >= HV
};

/// Dispatch counters since construction (or reset_stats).
struct DispatchStats {
  int64_t fused_calls = 0;
  int64_t unfused_calls = 0;
  /// Per layer: the last verify's decision (nullopt: not verified yet).
  std::vector<std::optional<DispatchDecision>> last_decision;
};

class KdaAttentionBackend {
 public:
  /// Validates `model` and `flags` (kInvalidArgument), builds the pool on kernels->device()
  /// with S = max_running_requests + options.extra_slots slots (padding rows use slot -1, so
  /// no sink slot is reserved), R = max_running_requests scratch rows (one per batch
  /// position), T_max = num_draft_tokens, and the mode and L from the flags.
  KdaAttentionBackend(const ModelConfig& model, const EngineFlags& flags,
                      std::unique_ptr<KernelSet> kernels, const BackendOptions& options = {});
  ~KdaAttentionBackend();
  KdaAttentionBackend(const KdaAttentionBackend&) = delete;
  KdaAttentionBackend& operator=(const KdaAttentionBackend&) = delete;
  KdaAttentionBackend(KdaAttentionBackend&&) = delete;  // graphs capture its addresses
  KdaAttentionBackend& operator=(KdaAttentionBackend&&) = delete;

  // ---- configuration ----
  const ModelConfig& model() const { return model_; }
  const EngineFlags& flags() const { return flags_; }
  const Device& device() const { return device_; }
  /// The platform the dispatcher sees (detected or overridden).
  const Platform& platform() const { return platform_; }
  const KernelSet& kernels() const { return *kernels_; }
  /// The state pool (views for inspection, tests and engine-side state copies).
  const KdaStatePool& pool() const { return pool_; }
  const PoolMemoryReport& memory_report() const { return pool_.memory_report(); }
  /// Device bytes the backend owns beyond the pool: the index buffers, the error flag and the
  /// checked-lengths scratch (from BackendOptions::allocator when one is given).
  int64_t workspace_bytes() const;

  /// Sets layer `layer`'s weights (views; see LayerWeights). Validated against the model and
  /// the device; must be set before the layer is verified or extended.
  void set_layer_weights(int layer, const LayerWeights& weights);

  // ---- slots (one per running request; not on the hot path) ----
  /// A zeroed slot (see KdaStatePool::allocate_slot); kOutOfMemory when none is free.
  int allocate_slot(cudaStream_t stream = nullptr);
  /// The engine's own slot number `slot` (e.g. its MambaPool index) becomes allocated here:
  /// zeroed like allocate_slot (SlotInit::kZero, enqueued on `stream`), or with the conv / SSM
  /// state the engine already wrote in the (external) pool kept (SlotInit::kKeepState: only the
  /// ring cursor and pending counts are zeroed). kInvalidArgument: outside [0, S) or already
  /// allocated; nothing changes on an error. Release it with release_slot as any slot.
  void claim_slot(int slot, SlotInit init, cudaStream_t stream = nullptr);
  /// Frees `slot`. kInvalidArgument: foreign or not allocated; kLifecycle: the slot is in the
  /// batch of a round in progress (commit or abort_round first).
  void release_slot(int slot);

  /// Prefix caching (contract §9): dst's committed conv and SSM state of every layer become
  /// src's, bitwise, so that dst run forward equals src run forward. With the deferred commit,
  /// src's pending steps travel with their ring records, cursor and counts (no fold: dst's
  /// next verify or materialize folds them as src's would; dst's own pending steps are
  /// dropped); materialize(dst) before reading dst's ssm_state views. Enqueue-only on `stream`
  /// (memory copies), capturable. kInvalidArgument: src or dst not an allocated slot, or the
  /// same; kLifecycle: a round is prepared or in progress. Nothing changes on error.
  void copy_slot(int src, int dst, cudaStream_t stream);

  // ---- lifecycle ----
  /// Starts a verify round for `batch` (B = batch.slots.size() <= R, 1 <= T <= T_max, slots
  /// in [-1, S) allocated and distinct, rows distinct in [0, R)) and uploads the indices on
  /// `stream`. Replaces a prepared round in which no layer has run yet. Not capturable.
  void prepare(const BatchSpec& batch, cudaStream_t stream);
  /// Starts an extend (prefill) round: B <= R requests of batch.T >= 1 tokens each (T may
  /// exceed T_max: extend needs no scratch); rows must be empty.
  void prepare_extend(const BatchSpec& batch, cudaStream_t stream);
  /// The same, with prefix-cache tracks (ExtendTrack, validated here: kInvalidArgument names
  /// the entry). With the deferred commit the track slots' pending steps are dropped.
  void prepare_extend(const BatchSpec& batch, const ExtendTrack& track, cudaStream_t stream);

  /// Verifies layer `layer` of the prepared batch: writes out [N, HV, V] bf16 (packed; padding
  /// rows zeroed), the conv windows and the snapshots or rings; never writes the committed
  /// conv/SSM state. Each layer exactly once per round. Returns the dispatch decision: the path,
  /// the outputs' numerics (--kda-verify-numerics; the call's VerifyParams::numerics), their
  /// reasons and the plan that ran. Enqueues on `stream`; graph-capturable.
  DispatchDecision verify(int layer, const VerifyInputs& in, const TensorView& out,
                          cudaStream_t stream);

  /// Commits all layers after every layer was verified: state <- the state after the n-th
  /// token, n = accepted_lengths[i] in 1..T ([B] int32 on the backend's device, contiguous,
  /// read on the device). A length outside [1, T] skips that request and raises the device
  /// error flag (check_device_errors). Enqueues on `stream`; graph-capturable.
  /// Deferred (deferred_commit(), contract §7): records n per (layer, slot) and commits the conv
  /// state; each layer's next verify of the slot folds the n steps first (exactly the eager
  /// fold), and until then the pool's ssm_state of the slot is the state before them
  /// (materialize() folds them without a verify). Lazy (lazy_write_back(), contract §11): adds n
  /// to the slot's pending steps and folds them all (exactly the eager folds) where the next
  /// draft would not fit the ring.
  void commit(const TensorView& accepted_lengths, cudaStream_t stream);
  /// The same, and the prefix-cache tracks (CommitTrack): once the commit's work has run on
  /// `stream`, every valid track slot holds its state in the pool's views (materialized, also
  /// with the deferred commit: there the commit folds steps 0..k of the tracked requests
  /// straight into their track slots, which costs one state read and write per tracked
  /// request; the request's own slot stays deferred). Eager ring mode writes the track from
  /// inside the fold, snapshot mode copies snapshot k. Graph-capturable.
  void commit(const TensorView& accepted_lengths, const CommitTrack& track, cudaStream_t stream);

  /// Commits a tree round (BatchSpec::parents): request i's accepted path is
  /// accepted_paths[i][0..n) ([B, T] int32 on the backend's device, contiguous, read on the
  /// device), node indices root first (node 0, then each node a child of the one before), n =
  /// accepted_lengths[i]. The state becomes the path's last node's; snapshot mode copies its
  /// snapshot and window, ring mode folds the path's ring records in order. A path that is not
  /// a root path of the request's tree, or a length outside [1, T], skips the request and raises
  /// the device error flag (check_device_errors). Trees commit eagerly. Graph-capturable.
  void commit_tree(const TensorView& accepted_lengths, const TensorView& accepted_paths,
                   cudaStream_t stream);
  /// The same, with prefix-cache tracks: track step k is the path's node k.
  void commit_tree(const TensorView& accepted_lengths, const TensorView& accepted_paths,
                   const CommitTrack& track, cudaStream_t stream);

  /// Runs the prepared extend round on layer `layer`: out [N, HV, V] bf16 for N = B*T prompt
  /// tokens, and the state after the last token is committed in place, with exact outputs
  /// whatever --kda-verify-numerics says. Each layer once; the round ends with the last layer.
  /// Enqueues on `stream`.
  void extend(int layer, const VerifyInputs& in, const TensorView& out, cudaStream_t stream);

  /// Records that a CUDA-graph replay verified every layer of the freshly prepared batch
  /// (replays do not repeat the host-side verify calls the lifecycle tracks).
  void record_graph_verify_round();
  /// Drops the current round (e.g. the engine abandons a batch). Safe for verify rounds: the
  /// committed state stays what it was (with the deferred commit, the layers that ran have
  /// folded their pending steps into it, and their pending counts are cleared on `stream`; the
  /// lazy write-back's verifies folded nothing;
  /// verifies captured into a graph have not run and clear nothing, so the capture idiom
  /// "prepare, capture every verify, abort_round" keeps the counts for the replays); layers an
  /// unfinished extend round already ran keep their advanced state.
  void abort_round(cudaStream_t stream = nullptr);

  /// Deferred commit (ring mode, contract §7): folds the pending steps of `slots` (allocated,
  /// distinct) into the state of every layer, as the next verify would, so that the pool's
  /// ssm_state views hold the committed state (to read, copy or export it). Enqueues on
  /// `stream`; kLifecycle during a round (prepared or in progress). Nothing to do when the
  /// backend commits eagerly. prepare_extend materializes its batch itself.
  void materialize(const std::vector<int32_t>& slots, cudaStream_t stream);
  /// Whether commits are deferred (--kda-deferred-commit and ring mode; fixed at construction).
  bool deferred_commit() const { return deferred_; }
  /// Whether the deferred commit is the lazy write-back (--kda-deferred-commit lazy, or auto
  /// where dispatch/lazy_policy.h's table says it pays; contract §11): verifies fold nothing and
  /// write no state (their fast outputs take a slot's pending steps as history); the commit folds a
  /// slot's pending steps when the next draft would not fit its ring (or at
  /// --kda-lazy-fold-interval). materialize() and prepare_extend fold them as with the deferred
  /// commit; abort_round() has nothing to undo.
  bool lazy_write_back() const { return lazy_; }

  RoundKind round_kind() const { return round_.kind(); }
  /// e.g. "verify round, 1 of 2 layers verified (0)".
  std::string round_state() const { return round_.describe(); }
  /// B and T of the prepared batch (0 when idle).
  int batch_size() const { return round_.kind() == RoundKind::kNone ? 0 : batch_B_; }
  int tokens_per_request() const { return round_.kind() == RoundKind::kNone ? 0 : batch_T_; }
  /// The prepared batch's activation rows: B*T, or the sum of a ragged batch's lengths.
  int64_t batch_tokens() const { return round_.kind() == RoundKind::kNone ? 0 : batch_tokens_; }
  /// The prepared verify batch's draft shape.
  DraftShape draft_shape() const { return batch_shape_; }

  // ---- dispatch statistics ----
  DispatchStats stats() const;
  void reset_stats();

  /// Reads the commit error flag (synchronises `stream`; not for the hot path). Throws
  /// kInvalidArgument if a commit since the last check saw an accepted length outside
  /// [1, T] or an invalid track (CommitTrack), and clears the flag.
  void check_device_errors(cudaStream_t stream);

 private:
  void prepare_round(RoundKind kind, const BatchSpec& batch, const ExtendTrack* track,
                     cudaStream_t stream);
  void validate_batch(RoundKind kind, const BatchSpec& batch) const;
  void check_layer_ready(RoundKind kind, int layer) const;
  void validate_activations(const char* call, int layer, const VerifyInputs& in,
                            const TensorView& out) const;
  VerifyParams make_verify_params(int layer, const VerifyInputs& in, const TensorView& out) const;
  DispatchProblem make_dispatch_problem(int layer, const VerifyInputs& in) const;
  void record_decision(int layer, const DispatchDecision& d);
  CommitParams make_commit_params(CommitKind kind) const;
  /// The pool's tensors (all layers) as ops see them.
  ExternalPoolTensors pool_state() const;
  void enqueue_commit(const TensorView& accepted_lengths, const TensorView* accepted_paths,
                      const CommitTrack* track, cudaStream_t stream);
  void validate_shape(const BatchSpec& batch) const;
  void validate_tracks(const BatchSpec& batch, const ExtendTrack& track) const;

  ModelConfig model_;
  EngineFlags flags_;
  std::unique_ptr<KernelSet> kernels_;
  Device device_;
  Platform platform_;
  KdaStatePool pool_;
  std::vector<LayerWeights> weights_;  // per layer; A_log undefined until set
  BatchIndices indices_;
  Buffer error_flag_;  // [1] int32 on the device; CommitParams::error_flag
  RoundTracker round_;
  bool deferred_ = false;  // ring mode with --kda-deferred-commit on or lazy (or auto, measured)
  bool lazy_ = false;      // --kda-deferred-commit lazy (or auto, measured; with deferred_)
  // Per layer of the round: its verify was enqueued for execution (not captured into a graph),
  // so it folds the layer's pending steps; abort_round drops those layers' counts only.
  std::vector<uint8_t> verify_ran_;
  int batch_B_ = 0, batch_T_ = 0;
  int64_t batch_tokens_ = 0;
  DraftShape batch_shape_ = DraftShape::kDense;
  std::vector<int32_t> upload_offsets_;  // prepare's packed offsets of a ragged batch
  Buffer checked_accepted_;              // [R] int32 on the device: CommitParams::checked_accepted
  std::vector<int32_t> batch_slots_;     // host copy of the prepared slots (capacity R)
  std::vector<int32_t> batch_tracks_;    // an extend round's track slots (release_slot checks)
  std::vector<int32_t> upload_rows_;     // prepare's scratch for the resolved rows (capacity R)

  int64_t fused_calls_ = 0, unfused_calls_ = 0;
  std::vector<std::optional<DispatchDecision>> last_decision_;
};

}  // namespace kda
