// kda_params.h: the POD parameter structs every KDA kernel family takes: CUDA kernels (by
// value, __grid_constant__), their launchers and the host reference (kda::host).
//
// Letters as in docs/contract.md §2: B requests, T draft tokens (N = B*T rows), H q/k heads,
// HV v heads (HV % H == 0; v-head hv reads k-head hv / (HV/H)), K = head_k_dim (64 or 128),
// V = head_v_dim, W = 4 conv taps, D = 2*H*K + HV*V, S slots, R scratch rows, L ring length.
// All strides are in *elements* and 64-bit. Pointers are device pointers for the CUDA
// kernels and host pointers for kda::host; the struct never owns anything.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"
#include "core/platform_macros.h"

namespace kda {

constexpr int kConvWidth = 4;                 ///< W: conv taps (tap 0 oldest, tap 3 current)
constexpr int kConvHistory = kConvWidth - 1;  ///< W-1 raw inputs kept per channel
constexpr float kNormEps = 1e-6f;             ///< inside the sqrt of the q/k L2 norms
constexpr float kSoftplusThreshold = 20.0f;   ///< softplus(x) = x above this (x <= 20 uses log)
/// Most nodes a tree draft request may have: the recurrence keeps a tree's inputs in one token
/// chunk (TileConfig::kChunk) to replay a node's ancestors from the committed state.
constexpr int kMaxTreeNodes = 8;
/// Most tokens of one fast-output chunk (contract §10): the lazy verify's pending history plus
/// its draft (§11), so a lazy ring holds at most this many records (L <= kFastMaxChunk).
constexpr int kFastMaxChunk = 16;

/// Conv weight / bias element type (contract §3 step 1 rounds differently for each).
enum class ConvWeightType : uint8_t { kF32, kBF16 };

/// Gate formula (contract §3 step 2).
enum class GateKind : uint8_t {
  kStandard,  ///< g = -exp(A_log) * softplus(a + dt_bias)        (Kimi-Linear)
  kSafe,      ///< g = lower_bound * sigmoid(exp(A_log) * (a + dt_bias))  (Kimi-K3, lb < 0)
};

/// What a verify call records for rollback.
enum class RecordMode : uint8_t {
  kSnapshot,  ///< fp32 state after every step into `snapshots`
  kRing,      ///< ReplaySSM ring records (rawk, rawv, g, beta) keyed by slot
};

/// How a verify computes its outputs (contract §10). The records, windows and every committed
/// state are §3's exact arithmetic in both.
enum class VerifyNumerics : uint8_t {
  kExact,  ///< §3 step 6 per token: the outputs bitwise those of every exact path
  /// The chunked (WY) form: the state contractions on tensor cores (3xTF32), the T x T system in
  /// fp32, decays as ordered products of per-step factors <= 1. Ring-mode chains on the fused
  /// path without pending steps; elsewhere a call runs kExact (the plan says which ran).
  kFast,
};

// ---- the parts of a call that a verify and an extend share, by concern (ExtendParams composes
// them; VerifyParams declares the same fields in the same order, flat: see there) ----

/// The problem's sizes and numerics.
struct VerifySizes {
  int32_t B = 0, T = 0;   ///< requests, tokens per request (1 <= T <= T_max)
  int32_t H = 0, HV = 0;  ///< q/k heads, v heads
  int32_t K = 0, V = 0;   ///< head_k_dim (64|128), head_v_dim
  int32_t T_max = 0;      ///< step pitch of conv_window / snapshots (>= T)
  int32_t L = 0;          ///< ring length (ring mode; power of two); steps t >= L not written
  int32_t num_slots = 0;  ///< S: extent of the slot dim of conv_state/ssm_state/rings
  int32_t num_rows = 0;   ///< R: extent of the row dim of conv_window/snapshots
  GateKind gate = GateKind::kStandard;
  float lower_bound = 0.0f;  ///< safe gate only
  RecordMode mode = RecordMode::kRing;
  VerifyNumerics numerics = VerifyNumerics::kExact;  ///< contract §10
};

/// The per-call token inputs (rows per the draft shape, BatchParams).
struct TokenInputs {
  const bf16_t* mixed_qkv =
      nullptr;  ///< [N, D] channels q|k|v, D contiguous; row stride mixed_qkv_stride >= D
  int64_t mixed_qkv_stride = 0;
  const bf16_t* a = nullptr;  ///< [N, HV*K] gate logits, (hv, k) at hv*K + k; row stride a_stride
  int64_t a_stride = 0;
  const bf16_t* b = nullptr;  ///< [N, HV] beta logits; row stride b_stride
  int64_t b_stride = 0;
};

/// One layer's weights (they do not change between calls).
struct WeightParams {
  const float* A_log = nullptr;       ///< [HV] f32
  const float* dt_bias = nullptr;     ///< [HV*K] f32
  const void* conv_weight = nullptr;  ///< [D, W] packed, f32 or bf16 (conv_weight_type)
  const void* conv_bias = nullptr;    ///< [D] same type as conv_weight, or nullptr
  ConvWeightType conv_weight_type = ConvWeightType::kF32;
};

/// The committed state: read-only in verify (the deferred fold writes ssm_fold_out).
struct CommittedState {
  const bf16_t* conv_state = nullptr;  ///< [S, W-1, D], (W-1, D) packed, slot pitch below
  int64_t conv_state_slot_stride = 0;
  const float* ssm_state = nullptr;  ///< [S, HV, V, K] f32, (HV, V, K) packed, K contiguous
  int64_t ssm_slot_stride = 0;
};

/// The batch: requests' slots and scratch rows, and the draft shape (contract §8; both shape
/// arrays null: a dense chain of T tokens per request). Device memory for CUDA, complete at
/// enqueue: the verify kernels read them before their PDL wait (kda_kernels.h).
struct BatchParams {
  const int32_t* slots = nullptr;  ///< [B] slot per request; -1 = padding row
  const int32_t* rows = nullptr;   ///< [B] scratch row per request (windows, snapshots)
  /// [B+1] ragged chain: request n verifies T_n = token_offsets[n+1] - token_offsets[n] tokens
  /// (1 <= T_n <= T), its step t at row token_offsets[n] + t (token_offsets[0] = 0, packed).
  /// Window, snapshot and ring index: the step t within the request, as for a dense chain;
  /// nothing is written at steps t >= T_n.
  const int32_t* token_offsets = nullptr;
  /// [B*T] tree (token_offsets null: T nodes per request, T <= kMaxTreeNodes): parents[n*T + j]
  /// is node j's parent within request n: -1 for the root (j = 0 only), else in [0, j). Node
  /// j's state is its parent's state stepped on j's inputs, its conv window its ancestors' raw
  /// inputs (the committed conv state beyond the root), taps summed oldest -> node j as for a
  /// chain; its output, window, snapshot and ring records sit at step j. Unfused path only.
  const int32_t* parents = nullptr;
};

/// One layer's verify call.
///
/// Token t of request n is row n*T + t of qkv / a / b / out (a dense chain), or row
/// token_offsets[n] + t of a ragged batch (contract §8). A request with slots[n] < 0 is a
/// padding row: its T (T_n) output rows are written as zeros and nothing else of it is read
/// (inputs may be NaN, rows[n] may be garbage) or written.
///
/// The kernels take it by value (TileArgs::p, __grid_constant__), so it is one flat struct: the
/// fields of the shared parts above in their order, then the verify's own. Composed of the parts
/// as base classes (the same layout), it made nvcc emit different code for most verify kernels
/// (block order before the PDL wait, then ptxas' schedule; slower in the eager one-CTA-per-SM
/// BV = 32 tile, as docs/perf_log.md records). The assertion below keeps it flat;
/// copy_shared_parts copies the shared fields one by one.
struct VerifyParams {
  // ---- sizes and numerics (VerifySizes) ----
  int32_t B = 0, T = 0;   ///< requests, tokens per request (1 <= T <= T_max)
  int32_t H = 0, HV = 0;  ///< q/k heads, v heads
  int32_t K = 0, V = 0;   ///< head_k_dim (64|128), head_v_dim
  int32_t T_max = 0;      ///< step pitch of conv_window / snapshots (>= T)
  int32_t L = 0;          ///< ring length (ring mode; power of two); steps t >= L not written
  int32_t num_slots = 0;  ///< S: extent of the slot dim of conv_state/ssm_state/rings
  int32_t num_rows = 0;   ///< R: extent of the row dim of conv_window/snapshots
  GateKind gate = GateKind::kStandard;
  float lower_bound = 0.0f;  ///< safe gate only
  RecordMode mode = RecordMode::kRing;
  VerifyNumerics numerics = VerifyNumerics::kExact;  ///< contract §10
  /// The verify's own (not VerifySizes'; in the sizes' padding, so every field keeps its offset):
  /// nonzero with ring_pending, the lazy verify (contract §11; see ring_pending).
  uint8_t lazy = 0;

  // ---- token inputs (TokenInputs) ----
  const bf16_t* mixed_qkv =
      nullptr;  ///< [N, D] channels q|k|v, D contiguous; row stride mixed_qkv_stride >= D
  int64_t mixed_qkv_stride = 0;
  const bf16_t* a = nullptr;  ///< [N, HV*K] gate logits, (hv, k) at hv*K + k; row stride a_stride
  int64_t a_stride = 0;
  const bf16_t* b = nullptr;  ///< [N, HV] beta logits; row stride b_stride
  int64_t b_stride = 0;

  // ---- layer weights (WeightParams) ----
  const float* A_log = nullptr;       ///< [HV] f32
  const float* dt_bias = nullptr;     ///< [HV*K] f32
  const void* conv_weight = nullptr;  ///< [D, W] packed, f32 or bf16 (conv_weight_type)
  const void* conv_bias = nullptr;    ///< [D] same type as conv_weight, or nullptr
  ConvWeightType conv_weight_type = ConvWeightType::kF32;

  // ---- committed state, read-only in verify (CommittedState) ----
  const bf16_t* conv_state = nullptr;  ///< [S, W-1, D], (W-1, D) packed, slot pitch below
  int64_t conv_state_slot_stride = 0;
  const float* ssm_state = nullptr;  ///< [S, HV, V, K] f32, (HV, V, K) packed, K contiguous
  int64_t ssm_slot_stride = 0;

  // ---- batch: slots, scratch rows, draft shape (BatchParams) ----
  const int32_t* slots = nullptr;          ///< [B] slot per request; -1 = padding row
  const int32_t* rows = nullptr;           ///< [B] scratch row per request (windows, snapshots)
  const int32_t* token_offsets = nullptr;  ///< [B+1] ragged chain (BatchParams::token_offsets)
  const int32_t* parents = nullptr;        ///< [B*T] tree (BatchParams::parents)

  // ---- what every verify writes: the outputs and the per-step conv windows ----
  bf16_t* out = nullptr;          ///< [N, HV, V] packed
  bf16_t* conv_window = nullptr;  ///< [R, T_max, W-1, D]: window after consuming token t
  int64_t conv_window_row_stride = 0;

  // ---- snapshot mode's records ----
  float* snapshots = nullptr;  ///< snapshot mode: [R, T_max, HV, V, K] state after token t
  int64_t snapshot_row_stride = 0;

  // ---- ring mode's records (ReplaySSM, contract §2: keyed by slot) ----
  bf16_t* ring_rawv = nullptr;  ///< ring mode: [S, HV, L, V] v after conv+SiLU+bf16
  int64_t ring_rawv_slot_stride = 0;
  bf16_t* ring_rawk = nullptr;  ///< ring mode: [S, H, L, K] k after conv+SiLU+bf16, pre-norm
  int64_t ring_rawk_slot_stride = 0;
  float* ring_g = nullptr;  ///< ring mode: [S, HV, L, K] per-K log-decay gate
  int64_t ring_g_slot_stride = 0;
  float* ring_beta = nullptr;  ///< ring mode: [S, HV, L] sigmoid(b)
  int64_t ring_beta_slot_stride = 0;

  // ---- the deferred commit's fold inside the verify (ring mode, contract §7; all null: no
  // cursor, nothing pending) ----
  /// [S] ring base c of each slot: draft step t is recorded at ring position (c + t) mod L.
  /// Null: c = 0.
  const int32_t* ring_cursor = nullptr;
  /// [S] this layer's pending count n of each slot: ring positions (c - n + j) mod L, j < n, hold
  /// steps the committed state does not have yet. Deferred (n <= T_max): before its draft steps
  /// the verify replays them with the fold's arithmetic and writes the folded state to
  /// ssm_fold_out. Lazy (`lazy` set, contract §11; n <= L - T_n, ssm_fold_out and ring_u null,
  /// numerics kFast): the verify folds nothing and writes no state; the pending steps are the
  /// history of its fast chunk, which computes the draft's outputs from the committed checkpoint.
  /// Null: nothing pending.
  const int32_t* ring_pending = nullptr;
  /// Where the deferred fold's state goes: the committed state itself (the same memory as
  /// ssm_state, same strides). Required when ring_pending is set, but for a lazy verify (null).
  float* ssm_fold_out = nullptr;
  /// [S, HV, L, V] f32, with ring_pending (required there, null otherwise): the u record of each
  /// draft step, u = (v - sum_k S[k][v] kn[k]) * beta (contract §3 step 6), at the step's ring
  /// position. It is the u an eager fold of the step computes, bitwise (the same state, the same
  /// tree), so a later fold of the step takes it instead of the key dot: decay and rank-1 update
  /// only. Written by the verify, read by the pending fold (item_fold.cuh), materialize and the
  /// deferred track fold.
  float* ring_u = nullptr;
  int64_t ring_u_slot_stride = 0;
  /// Nonzero: the per-item kernels fold the pending steps before their PDL wait, overlapping the
  /// kernels before them (the persistent kernel folds each item after its wait, as without it), and
  /// at short drafts their one-CTA-per-SM forms let their dependents launch at their entry
  /// (kernels::deferred_triggers_at_entry), so a later kernel may start while this one's
  /// predecessors still run. The caller guarantees that an earlier call without it, which lets its
  /// dependents launch only after its wait, has started after every write of ring_cursor,
  /// ring_pending and this layer's records, u records and state was launched, and that no kernel
  /// launched since writes them or the weights and index arrays read before the wait: true on every
  /// verify of a deferred round but the first (which may follow the commit and folds after its
  /// wait), since a round verifies each layer once and the backend refuses commit, materialize,
  /// copy_slot and extend of a batch slot during a round.
  int32_t fold_before_wait = 0;
  /// Nonzero, with ring_pending: the u-free deferred commit (contract §10: fast outputs record no
  /// exact u). No fold reads ring_u: a fast kernel folds the pending steps itself computing u, or
  /// the plan folds them first with the fold kernel (kernels::VerifyPlan::pending_fold_first) and
  /// runs the verify without pending steps; an exact kernel still stores its u into ring_u (never
  /// read), a fast one stores none.
  /// The kernels never read this field (the launcher and the host reference do).
  /// (It sits in fold_before_wait's padding: the struct keeps its size and every field its
  /// offset.)
  int32_t u_free = 0;

  // ---- unfused path only: conv output handed from the conv kernel to the recurrence ----
  bf16_t* qkv_act = nullptr;  ///< [N, D] bf16 q|k|v after conv + SiLU, packed rows
};
static_assert(std::is_standard_layout_v<VerifyParams> && std::is_trivially_copyable_v<VerifyParams>,
              "VerifyParams is the kernels' flat parameter struct (no base classes with fields)");

KDA_HD int32_t qkv_dim(const VerifySizes& p) { return 2 * p.H * p.K + p.HV * p.V; }
/// A lazy verify (contract §11): VerifyParams::lazy with pending counts.
KDA_HD bool is_lazy_verify(const VerifyParams& p) {
  return p.lazy != 0 && p.ring_pending != nullptr;
}
KDA_HD int32_t qkv_dim(const VerifyParams& p) { return 2 * p.H * p.K + p.HV * p.V; }

/// What extend writes besides its outputs: the committed state in place, and prefix-cache tracks.
struct ExtendOutputs {
  float* ssm_state_out = nullptr;    ///< [S, HV, V, K], same strides as ssm_state (may alias it)
  bf16_t* conv_state_out = nullptr;  ///< [S, W-1, D], same strides as conv_state
  /// Prefix-cache track (contract §9; both null: none). Request n with track_steps[n] = k >= 0
  /// also writes the SSM state and conv state after its prompt token k (0 <= k < T) to slot
  /// track_slots[n] of ssm_state_out / conv_state_out, in the same pass; -1 = no track. The
  /// caller guarantees (the backend validates on the host) that track slots are allocated,
  /// distinct and outside the batch.
  const int32_t* track_slots = nullptr;  ///< [B]
  const int32_t* track_steps = nullptr;  ///< [B]
};

/// Extend (prefill through the recurrence): N = B*T tokens per call are processed and committed
/// in place (T may exceed T_max: extend uses no scratch and records nothing). It takes the parts
/// of a verify it reads (sizes, inputs, weights, state, batch) and writes `out`, the final SSM
/// state to ssm_state_out[slot] and the last W-1 raw inputs to conv_state_out[slot].
struct ExtendParams : VerifySizes,
                      TokenInputs,
                      WeightParams,
                      CommittedState,
                      BatchParams,
                      ExtendOutputs {
  bf16_t* out = nullptr;  ///< [N, HV, V] packed
};

/// Copies the parts a verify and an extend share (sizes, inputs, weights, state, batch, out), field
/// by field: VerifyParams is flat (see there). A field added to a shared part goes here too.
template <typename To, typename From>
KDA_HD void copy_shared_parts(To& to, const From& from) {
  // VerifySizes
  to.B = from.B;
  to.T = from.T;
  to.H = from.H;
  to.HV = from.HV;
  to.K = from.K;
  to.V = from.V;
  to.T_max = from.T_max;
  to.L = from.L;
  to.num_slots = from.num_slots;
  to.num_rows = from.num_rows;
  to.gate = from.gate;
  to.lower_bound = from.lower_bound;
  to.mode = from.mode;
  to.numerics = from.numerics;
  // TokenInputs
  to.mixed_qkv = from.mixed_qkv;
  to.mixed_qkv_stride = from.mixed_qkv_stride;
  to.a = from.a;
  to.a_stride = from.a_stride;
  to.b = from.b;
  to.b_stride = from.b_stride;
  // WeightParams
  to.A_log = from.A_log;
  to.dt_bias = from.dt_bias;
  to.conv_weight = from.conv_weight;
  to.conv_bias = from.conv_bias;
  to.conv_weight_type = from.conv_weight_type;
  // CommittedState
  to.conv_state = from.conv_state;
  to.conv_state_slot_stride = from.conv_state_slot_stride;
  to.ssm_state = from.ssm_state;
  to.ssm_slot_stride = from.ssm_slot_stride;
  // BatchParams
  to.slots = from.slots;
  to.rows = from.rows;
  to.token_offsets = from.token_offsets;
  to.parents = from.parents;
  to.out = from.out;
}

/// An extend's parts of a verify call `v` (its outputs and tracks left null).
inline ExtendParams extend_params_of(const VerifyParams& v) {
  ExtendParams e;
  copy_shared_parts(e, v);
  return e;
}

/// The verify kernels' and the reference's view of an extend call: its parts, nothing recorded,
/// T_max = T (no scratch).
KDA_HD VerifyParams verify_view(const ExtendParams& e) {
  VerifyParams v;
  copy_shared_parts(v, e);
  v.T_max = e.T;
  return v;
}

/// What a commit does with the SSM state (contract §1, §7).
enum class CommitKind : uint8_t {
  /// Ring mode folds the accepted ring steps (positions (c + j) mod L, j < n) into the state;
  /// snapshot mode copies snapshot n-1. The conv commit. No ring cursor, nothing pending
  /// (ring_cursor and ring_pending null).
  kEager,
  /// Ring mode only: records ring_pending[layer][slot] = n and advances ring_cursor[slot] by n
  /// (mod L); reads and writes no SSM state. The conv commit.
  kDeferred,
  /// Ring mode only, no verify round: folds each slot's pending steps (positions
  /// (c - n + j) mod L, j < n = ring_pending[layer][slot]) into the state of every layer and
  /// zeroes ring_pending. No conv commit; accepted is not read.
  kMaterialize,
  /// Ring mode only: zeroes ring_pending[layer][slot] of the batch's slots for layers
  /// 0..num_layers-1 (abort_round: those layers' verifies already folded them). Nothing else.
  kDropPending,
  /// Ring mode only, the lazy write-back (contract §11; u-free, ring_u null): per layer, a
  /// request's pending count becomes m = ring_pending[layer][slot] + n and its cursor advances by
  /// n (mod L); where m + T_max > L (the next draft would not fit beside the pending steps) or
  /// lazy_fold_interval > 0 and m >= lazy_fold_interval, the m steps (positions (c' - m + j) mod L,
  /// j < m, c' the advanced cursor) are folded into the state and the count becomes 0. A bad
  /// accepted length skips the request (its pending steps stay as they were). The conv commit.
  kLazy,
};

/// Bits of CommitParams::error_flag (or-ed in; the backend reads and clears them).
enum CommitError : int32_t {
  kBadAcceptedLength = 1,  ///< an accepted length outside [1, T]: the request was skipped
  kBadTrack = 2,           ///< a track step >= the accepted length, or a bad track slot
  kBadPath = 4,            ///< a tree's accepted path is not a root path: the request was skipped
};

/// Commit of all layers after sampling: make the state after the n-th accepted token the
/// committed state (n = accepted[i] in 1..T, read on the device). Layer strides are the
/// pool's per-layer pitches. Requests with slots[i] < 0 are skipped; an accepted length
/// outside [1, T] skips the request (its pending count becomes 0) and or-s kBadAcceptedLength
/// into *error_flag (if given).
///
/// Tracks (prefix caching, contract §9; kEager, kDeferred and kLazy; both pointers null: none):
/// request i with track_steps[i] = k >= 0 also writes the state and conv state after its
/// accepted step k to slot track_slots[i], every layer: snapshot mode copies snapshot k and
/// window k; ring mode eager writes it from inside the fold at step k; ring mode deferred folds
/// steps 0..k of the ring (from the slot's cursor) straight into the track slot and zeroes its
/// pending counts, so the track slot is complete (materialized) once the commit has run, while
/// the request's own slot stays deferred; lazy folds the slot's pending steps and then steps 0..k
/// (positions (c - p + j) mod L, j <= p + k, p its pending count before this commit) into the
/// track slot, likewise complete. A track is valid when k < accepted[i] and
/// track_slots[i] is in [0, S), allocated (slot_allocated, when given), not a slot of the batch
/// and no other valid request's track slot; an invalid one writes nothing and or-s kBadTrack into
/// *error_flag.
struct CommitParams {
  CommitKind kind = CommitKind::kEager;
  int32_t num_layers = 0;
  int32_t B = 0, T = 0, T_max = 0;
  int32_t H = 0, HV = 0, K = 0, V = 0, L = 0;
  int32_t num_slots = 0, num_rows = 0;
  RecordMode mode = RecordMode::kRing;
  /// Nonzero: the u-free deferred commit (VerifyParams::u_free): the folds of deferred records
  /// compute u as an eager fold does and ignore ring_u. (In the padding before `slots`: the struct
  /// keeps its size and every field its offset.)
  int32_t u_free = 0;

  const int32_t* slots = nullptr;     ///< [B]
  const int32_t* rows = nullptr;      ///< [B]
  const int32_t* accepted = nullptr;  ///< [B] accepted length incl. the verified token

  float* ssm_state = nullptr;  ///< [layers, S, HV, V, K]
  int64_t ssm_layer_stride = 0, ssm_slot_stride = 0;
  bf16_t* conv_state = nullptr;  ///< [layers, S, W-1, D]
  int64_t conv_state_layer_stride = 0, conv_state_slot_stride = 0;
  /// [layers, R, T_max, W-1, D]; ring records and windows are written only by a tree commit's
  /// stage 1 (checked_accepted), which moves the accepted path's to steps 0..n-1.
  bf16_t* conv_window = nullptr;
  int64_t conv_window_layer_stride = 0, conv_window_row_stride = 0;
  const float* snapshots = nullptr;  ///< snapshot mode: [layers, R, T_max, HV, V, K]
  int64_t snapshot_layer_stride = 0, snapshot_row_stride = 0;
  bf16_t* ring_rawv = nullptr;  ///< ring mode: [layers, S, HV, L, V]
  int64_t ring_rawv_layer_stride = 0, ring_rawv_slot_stride = 0;
  bf16_t* ring_rawk = nullptr;  ///< [layers, S, H, L, K]
  int64_t ring_rawk_layer_stride = 0, ring_rawk_slot_stride = 0;
  float* ring_g = nullptr;  ///< [layers, S, HV, L, K]
  int64_t ring_g_layer_stride = 0, ring_g_slot_stride = 0;
  float* ring_beta = nullptr;  ///< [layers, S, HV, L]
  int64_t ring_beta_layer_stride = 0, ring_beta_slot_stride = 0;
  /// [layers, S, HV, L, V] f32 u records (VerifyParams::ring_u): required by the folds of
  /// deferred records (kMaterialize, kDeferred with tracks), which replay them as decay + rank-1
  /// update, unless u_free; an eager commit takes none (its records have no u).
  const float* ring_u = nullptr;
  int64_t ring_u_layer_stride = 0, ring_u_slot_stride = 0;

  /// Ring mode: [S] ring base c per slot (null: c = 0; kDeferred and kMaterialize need it).
  int32_t* ring_cursor = nullptr;
  /// Ring mode: [layers, S] pending counts, layer pitch ring_pending_layer_stride (null: none
  /// pending; kDeferred and kMaterialize need it).
  int32_t* ring_pending = nullptr;
  int64_t ring_pending_layer_stride = 0;

  const int32_t* track_slots = nullptr;  ///< [B] track slot per request (see above)
  const int32_t* track_steps = nullptr;  ///< [B] accepted step to track, -1 = none
  /// Optional [S] per-slot allocation table on the device (nonzero = allocated), read with the
  /// tracks: a track into a slot marked 0 is invalid. Null: every slot in [0, S) counts as
  /// allocated (the caller guarantees it).
  const uint8_t* slot_allocated = nullptr;

  int32_t* error_flag = nullptr;  ///< optional [1]; CommitError bits

  // ---- draft shape of the round (contract §8; all null: a dense chain) ----
  /// [B+1] ragged round (VerifyParams::token_offsets): request i's accepted length must be at
  /// most its T_i, else the request is skipped (kBadAcceptedLength).
  const int32_t* token_offsets = nullptr;
  /// [B*T] tree round (VerifyParams::parents), with accepted_paths.
  const int32_t* parents = nullptr;
  /// [B, T] tree round: request i's accepted path, node indices root first: entries k < n_i
  /// with paths[i*T] = 0 and parents[i*T + paths[i*T + k]] = paths[i*T + k - 1]; else the
  /// request is skipped (kBadPath). Step k of the commit is node paths[i*T + k]: snapshot mode
  /// copies the snapshot and window of the path's node n-1 (of node k for a track), ring mode
  /// folds the ring records of the path's nodes in order (eager commits only).
  const int32_t* accepted_paths = nullptr;
  /// [B] int32 scratch, required with a draft shape. The kernel set's commit runs in two
  /// stages: the shape check (commit_shape) writes each request's length there (0 for a bad
  /// length or path) and moves a tree's accepted windows and (ring mode) ring records from
  /// their nodes to steps 0..n-1 (path nodes increase, so in place); then the commit proper
  /// runs as for a dense chain, with accepted = checked_accepted, token_offsets and parents
  /// null, and (snapshot mode) accepted_paths still set: its snapshot copies take node
  /// paths[i*T + k] for step k (accepted_paths without parents: the checked second stage).
  int32_t* checked_accepted = nullptr;

  /// kLazy: fold a slot once it holds this many pending steps even if the next draft would fit
  /// (an engine's bound on the history a verify recomputes); 0: only when it would not fit.
  int32_t lazy_fold_interval = 0;
};

KDA_HD int32_t qkv_dim(const CommitParams& p) { return 2 * p.H * p.K + p.HV * p.V; }

/// A one-layer commit over what verify call `v` recorded: its sizes, batch (slots, rows, draft
/// shape), windows, snapshots and rings (layer strides 0). The caller sets the kind, the state,
/// the accepted lengths and what else its commit reads.
inline CommitParams one_layer_commit_params(const VerifyParams& v) {
  CommitParams c;
  c.num_layers = 1;
  c.B = v.B;
  c.T = v.T;
  c.T_max = v.T_max;
  c.H = v.H;
  c.HV = v.HV;
  c.K = v.K;
  c.V = v.V;
  c.L = v.L;
  c.num_slots = v.num_slots;
  c.num_rows = v.num_rows;
  c.mode = v.mode;
  c.slots = v.slots;
  c.rows = v.rows;
  c.ssm_slot_stride = v.ssm_slot_stride;
  c.conv_state_slot_stride = v.conv_state_slot_stride;
  c.conv_window = v.conv_window;
  c.conv_window_row_stride = v.conv_window_row_stride;
  c.snapshots = v.snapshots;
  c.snapshot_row_stride = v.snapshot_row_stride;
  c.ring_rawv = v.ring_rawv;
  c.ring_rawv_slot_stride = v.ring_rawv_slot_stride;
  c.ring_rawk = v.ring_rawk;
  c.ring_rawk_slot_stride = v.ring_rawk_slot_stride;
  c.ring_g = v.ring_g;
  c.ring_g_slot_stride = v.ring_g_slot_stride;
  c.ring_beta = v.ring_beta;
  c.ring_beta_slot_stride = v.ring_beta_slot_stride;
  c.token_offsets = v.token_offsets;
  c.parents = v.parents;
  return c;
}

/// The pending fold of a u-free deferred verify call `v` (ring_pending given, u_free set) as a
/// one-layer fold of the kMaterialize kind: the batch's slots, the layer's records, cursors and
/// pending counts, the folded state to v.ssm_fold_out. It reads the pending counts and never
/// writes them (a verify's fold leaves them to the next commit, contract §7).
inline CommitParams pending_fold_params(const VerifyParams& v) {
  CommitParams c = one_layer_commit_params(v);
  c.kind = CommitKind::kMaterialize;
  c.ssm_state = v.ssm_fold_out;
  // The fold kernels read cursors and pending counts through CommitParams' mutable pointers;
  // this fold writes neither.
  c.ring_cursor = const_cast<int32_t*>(v.ring_cursor);
  c.ring_pending = const_cast<int32_t*>(v.ring_pending);
  c.ring_pending_layer_stride = v.num_slots;
  c.u_free = 1;  // computes u; ring_u stays null
  return c;
}

}  // namespace kda
