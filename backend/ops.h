// ops.h: the functional KDA ops (kda::ops): verify, commit and materialize on tensors the
// caller owns, FlashInfer-style. No object, no lifecycle and no memory of their own: an engine
// that keeps its own recurrent-state pool (SGLang's MambaPool: [layers, size + 1, ...] tensors
// in contract §2's layouts; the ring layout of §2 is SGLang's) calls them on its buffers with
// its own slot numbers. KdaAttentionBackend is built on the same functions (its commit and
// materialize build their kernel params here, its verify dispatches and launches here), so an
// ops call sequence is bitwise the backend's (tests/ops_test.cc, python kda.ops).
//
// Every op validates all of its arguments before it enqueues anything and throws kda::Error
// (kInvalidArgument) naming the argument ("ops.verify: state.ring_g: expected dtype float32, got
// bfloat16"), what was expected and what came; nothing changes on an error. What cannot be
// checked without reading device memory (CUDA): the values of the index tensors (slots in [-1, S),
// rows in [0, R), query_start_loc, parents, accepted lengths: a bad one is undefined, as in the
// engine's own kernels; the commit flags bad accepted lengths, paths and tracks on the device
// through error_flag). The host kernel set reads them and throws.
//
// Shapes are taken from the tensors (letters: contract §2): S = ssm_state's slot dim, R and
// T_max = conv_window's row and step dims, L = the rings' length dim, HV, V, K = ssm_state's
// inner dims, D = conv_state's last dim, H = rawk's head dim (ring mode) or (D - HV*V) / (2K).
// The record mode is what the state holds: the four rings (ring mode) or snapshots (snapshot
// mode); the deferred commit (contract §7) is on when ring_pending is given (then ring_cursor and
// ring_u too; the ops' deferred folds replay the u records, so its verifies' outputs are exact;
// the backend's u-free form, for fast outputs, is Dims::u_records false). The lazy write-back
// (contract §11) is asked for per call (VerifyOptions::lazy, CommitArgs::lazy,
// MaterializeArgs::lazy: every op on such a state says so): ring_pending and ring_cursor given,
// no ring_u, L <= 16; its verifies' outputs are fast. State tensors obey
// pool_storage.h's rules (padded slot / row / layer pitches, 16-byte aligned f32 state, no overlap)
// with S' = S, R' = R: verify takes one layer's views (no [layers] dim; ring_pending [S]), commit
// and materialize all layers' ([layers, ...]; ring_cursor [S] has no layer dim). Index tensors:
// int32, contiguous, on the state's device.
//
// Streams: every op enqueues on `stream` (host kernel set: runs synchronously); no allocation,
// no host synchronisation, graph-capturable on CUDA. Thread safety: as the kernel set's (one
// thread per KernelSet).
#pragma once

#include <cuda_runtime_api.h>

#include <optional>

#include "backend/model_config.h"
#include "core/platform.h"
#include "core/tensor_view.h"
#include "dispatch/verify_dispatch.h"
#include "kernels/kernel_set.h"
#include "kernels/params/kda_params.h"
#include "memory_pool/pool_storage.h"

namespace kda::ops {

/// The state and scratch tensors of the ops (pool_storage.h's names and rules): one layer's for
/// verify, all layers' for commit and materialize. Undefined = absent.
using StateTensors = ExternalPoolTensors;

/// A batch's index tensors ([B] int32, contiguous, on the state's device).
struct BatchTensors {
  int T = 0;                   ///< tokens (tree: nodes) per request, 1..T_max
  TensorView slots;            ///< [B] slot per request; -1 = padding row
  TensorView rows;             ///< [B] scratch row per request (windows, snapshots), in [0, R)
  TensorView query_start_loc;  ///< ragged chain: [B + 1] packed start rows (SGLang's); else none
  TensorView parents;          ///< tree: [B, T] or [B * T] parent of each node (-1: node 0)
};

/// A verify's knobs (the engine flags' dispatcher part, contract §4-5) and the model's gate.
struct VerifyOptions {
  GateKind gate = GateKind::kStandard;
  float lower_bound = 0.0f;  ///< safe gate only: finite, < 0
  DispatchFlags dispatch;    ///< fused allowed, fused ring batch limit, V tile (0 = auto), numerics
  /// The dispatcher's platform; default: detect_platform of the state's CUDA device (cached per
  /// device), "no device" on the host.
  std::optional<Platform> platform;
  /// The state's pending steps are the lazy write-back's (contract §11): the verify folds
  /// nothing and writes no state; its fast outputs take them as history (dispatch.numerics fast
  /// or auto; the kernel set must run it: KernelSet::runs_lazy_write_back).
  bool lazy = false;
};

struct VerifyArgs {
  TensorView mixed_qkv;  ///< [N, D] bf16, inner contiguous, row stride >= D
  TensorView a;          ///< [N, HV*K] bf16, inner contiguous
  TensorView b;          ///< [N, HV] bf16, inner contiguous
  TensorView out;        ///< [N, HV, V] bf16, contiguous
  LayerWeights weights;  ///< A_log, dt_bias, conv_weight (f32 or bf16), conv_bias (or none)
  /// One layer: conv_state, ssm_state, conv_window, the snapshots or the four rings; deferred:
  /// ring_cursor, ring_pending [S] (this layer's), ring_u; qkv_act [>= N, D] bf16
  /// contiguous when the unfused path runs (a tree, fused off, ring mode above the fused batch
  /// limit).
  StateTensors state;
  BatchTensors batch;  ///< N = B*T rows, or (ragged) query_start_loc[B] <= B*T
  VerifyOptions options;
};

/// Verifies one layer (contract §1): outputs, windows and the snapshots or ring records; never
/// writes the committed state (deferred: folds the pending steps first and writes them back).
/// Returns the dispatcher's decision, its reason and the kernel plan.
DispatchDecision verify(KernelSet& kernels, const VerifyArgs& args, cudaStream_t stream);

struct CommitArgs {
  /// All layers: conv_state, ssm_state, conv_window, the snapshots or the four rings; deferred:
  /// ring_cursor [S], ring_pending [layers, S], ring_u (then the commit only records the
  /// accepted counts and commits the conv state, contract §7).
  StateTensors state;
  BatchTensors batch;           ///< the verified batch (rows required)
  TensorView accepted_lengths;  ///< [B] int32: n in [1, T] (ragged: [1, T_n])
  TensorView accepted_paths;    ///< tree: [B, T] int32, node indices root first
  TensorView track_slots;       ///< optional [B] int32 prefix-cache tracks (contract §9)
  TensorView track_steps;       ///< with track_slots: [B] int32, -1 = none
  TensorView checked_accepted;  ///< ragged / tree: [B] int32 scratch
  TensorView error_flag;        ///< optional [1] int32: CommitError bits or-ed in (kda_params.h)
  /// The lazy write-back (contract §11; the state as VerifyOptions::lazy's): the accepted steps
  /// join each slot's pending ones, folded exactly where the next draft would not fit the ring
  /// (or at lazy_fold_interval > 0 pending steps, at most 16).
  bool lazy = false;
  int lazy_fold_interval = 0;
};

/// What a commit ran (contract §1, §7): the kind, the mode and a stable name for logs and tests:
/// "ring_fold", "snapshot_copy", "deferred_record", "lazy_record" or "materialize" (each with the
/// conv commit but materialize).
struct CommitDecision {
  CommitKind kind = CommitKind::kEager;
  RecordMode mode = RecordMode::kRing;
  const char* reason = "";
};

/// Commits every layer after a verify round: the state after the n-th accepted token becomes
/// the committed state (snapshot copy, or the ring fold; conv state <- window n-1), or, deferred,
/// records n per (layer, slot) and advances the cursors.
CommitDecision commit(KernelSet& kernels, const CommitArgs& args, cudaStream_t stream);

struct MaterializeArgs {
  StateTensors state;  ///< all layers, deferred (ring_cursor, ring_pending, ring_u given)
  TensorView slots;    ///< [n] int32: distinct slots in [0, S)
  bool lazy = false;   ///< the lazy write-back's state (no ring_u; VerifyOptions::lazy)
};

/// Deferred commit: folds the pending steps of `slots` into every layer's state (contract §7).
void materialize(KernelSet& kernels, const MaterializeArgs& args, cudaStream_t stream);

namespace detail {

/// The shapes of a state (all from the tensors, or the backend's pool config).
struct Dims {
  int layers = 1, S = 0, R = 0, T_max = 0, L = 0;
  int H = 0, HV = 0, K = 0, V = 0;
  RecordMode mode = RecordMode::kSnapshot;
  bool deferred = false;
  /// Deferred: the folds replay the u records; false: u-free (VerifyParams::u_free: every fold
  /// computes u; ring_u is still given and written, never read).
  bool u_records = false;
  /// Deferred, the lazy write-back (contract §11; no u records, ring_u absent): a verify folds
  /// nothing (VerifyParams::ssm_fold_out null: its pending steps are its fast chunk's history);
  /// the commit is CommitKind::kLazy.
  bool lazy = false;
};

/// What a commit-family launch needs beyond the state: device index pointers of B requests.
struct CommitCall {
  CommitKind kind = CommitKind::kEager;
  int B = 0, T = 0;
  const int32_t* slots = nullptr;
  const int32_t* rows = nullptr;
  const int32_t* accepted = nullptr;
  const int32_t* token_offsets = nullptr;
  const int32_t* parents = nullptr;
  const int32_t* accepted_paths = nullptr;
  const int32_t* track_slots = nullptr;
  const int32_t* track_steps = nullptr;
  int32_t* checked_accepted = nullptr;
  int32_t* error_flag = nullptr;
  const uint8_t* slot_allocated = nullptr;
};

/// The commit params over all layers of `state` (stacked views; strides from the views). The
/// one place commit-family params are built: ops::commit / materialize and the backend's
/// commit, materialize and abort_round.
CommitParams commit_params(const Dims& dims, const StateTensors& state, const CommitCall& call);

/// What a verify launch needs beyond one layer's state: its sizes, the call's tensors and the
/// batch's device index pointers.
struct VerifyCall {
  int B = 0, T = 0;
  GateKind gate = GateKind::kStandard;
  float lower_bound = 0.0f;
  ConvWeightType conv_weight_type = ConvWeightType::kF32;
  TensorView mixed_qkv, a, b;  ///< [tokens, ...] row pitches from the views
  TensorView out;              ///< [tokens, HV, V] packed
  const LayerWeights* weights = nullptr;
  const int32_t* slots = nullptr;
  const int32_t* rows = nullptr;
  const int32_t* token_offsets = nullptr;  ///< ragged chains
  const int32_t* parents = nullptr;        ///< trees
  int32_t fold_before_wait = 0;            ///< VerifyParams::fold_before_wait (deferred)
};

/// The verify params of one layer (`state`: that layer's views, no [layers] dim; strides from the
/// views; qkv_act only when the state gives one). The one place verify params are built from
/// views: ops::verify and KdaAttentionBackend's verify and extend.
VerifyParams verify_params(const Dims& dims, const StateTensors& state, const VerifyCall& call);

/// The dispatcher's view of a verify (rules: dispatch/verify_dispatch.h).
DispatchProblem dispatch_problem(const Dims& dims, int B, int T, bool plain_chain, int64_t tokens,
                                 const TensorView& mixed_qkv, const TensorView& a,
                                 const TensorView& b, const LayerWeights& weights,
                                 const TensorView& slots, const TensorView& rows,
                                 const RingViews& rings);

/// Chooses the path (choose_verify_path), plans it on the kernel set and launches the plan: the
/// one verify dispatch of ops::verify and KdaAttentionBackend::verify. Returns the decision with
/// its plan.
DispatchDecision run_verify(KernelSet& kernels, const VerifyParams& params,
                            const DispatchProblem& problem, const Platform& platform,
                            const DispatchFlags& flags, cudaStream_t stream);

/// The "ring_fold" / "snapshot_copy" / "deferred_record" / "materialize" / "drop_pending" /
/// "lazy_record" of a commit kind.
const char* commit_reason(CommitKind kind, RecordMode mode);

}  // namespace detail
}  // namespace kda::ops
