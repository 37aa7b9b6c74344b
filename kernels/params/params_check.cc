// params_check.cc: see params_check.h.
#include "kernels/params/params_check.h"

#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "kernels/verify/tile_policy.h"

namespace kda::params {
namespace {

bool is_power_of_two(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

void check_present(const void* ptr, const char* op, const char* name, const char* when) {
  KDA_CHECK(ptr != nullptr, "{}: {} is null, expected a pointer ({})", op, name, when);
}

void check_positive(int64_t value, const char* op, const char* name) {
  KDA_CHECK(value >= 1, "{}: {}={} must be >= 1", op, name, value);
}

// A pitch must cover the packed extent below it: `stride >= what (= min)`.
void check_pitch(int64_t stride, int64_t min, const char* op, const char* name, const char* what) {
  KDA_CHECK(stride >= min, "{}: {}={} is smaller than {} = {}", op, name, stride, what, min);
}

// Layer pitches only matter (and are only checked) with more than one layer.
void check_layer_pitch(int num_layers, int64_t stride, int64_t extent, int64_t pitch,
                       const char* op, const char* name) {
  if (num_layers > 1) {
    KDA_CHECK(stride >= extent * pitch,
              "{}: {}={} is smaller than {} x {} = {}: layers would overlap", op, name, stride,
              extent, pitch, extent * pitch);
  }
}

// An op that reads or writes per-request scratch rows (windows, snapshots).
void check_rows(const char* op, int T, int T_max, const int32_t* rows, int num_rows) {
  KDA_CHECK(T <= T_max, "{}: T={} exceeds T_max={} (the scratch step pitch)", op, T, T_max);
  check_present(rows, op, "rows", "[B] scratch row per request");
  check_positive(num_rows, op, "num_rows");
}

void check_sizes(const char* op, int B, int T, int H, int HV, int K, int V) {
  check_positive(B, op, "B");
  check_positive(T, op, "T");
  check_positive(H, op, "H");
  check_positive(HV, op, "HV");
  check_positive(V, op, "V");
  KDA_CHECK(HV % H == 0, "{}: HV={} is not a multiple of H={}", op, HV, H);
  KDA_CHECK(K == 64 || K == 128, "{}: K={} unsupported, expected 64 or 128", op, K);
}

void check_mode(const char* op, RecordMode mode) {
  KDA_CHECK(mode == RecordMode::kSnapshot || mode == RecordMode::kRing,
            "{}: mode={} unknown, expected kSnapshot (0) or kRing (1)", op, static_cast<int>(mode));
}

void check_ring_length(const char* op, int L) {
  KDA_CHECK(is_power_of_two(L), "{}: L={} must be a power of two (ring mode)", op, L);
}

}  // namespace

void check_verify(const VerifyParams& p, const char* op, uint32_t needs) {
  check_sizes(op, p.B, p.T, p.H, p.HV, p.K, p.V);
  check_positive(p.num_slots, op, "num_slots");
  check_present(p.slots, op, "slots", "[B] slot per request");
  const int64_t D = qkv_dim(p);
  const int64_t state_elems = static_cast<int64_t>(p.HV) * p.V * p.K;

  const bool records = (needs & kRecords) != 0;
  if (records) {
    check_mode(op, p.mode);
  }
  const bool snapshot = records && p.mode == RecordMode::kSnapshot;
  const bool ring = records && p.mode == RecordMode::kRing;
  const bool windows = (needs & kWindows) != 0;
  const bool uses_rows = windows || snapshot;
  if (uses_rows) {
    check_rows(op, p.T, p.T_max, p.rows, p.num_rows);
  }
  if ((needs & kConv) != 0) {
    check_present(p.mixed_qkv, op, "mixed_qkv", "[N, D] bf16");
    check_pitch(p.mixed_qkv_stride, D, op, "mixed_qkv_stride", "D");
    check_present(p.conv_weight, op, "conv_weight", "[D, W]");
    KDA_CHECK(
        p.conv_weight_type == ConvWeightType::kF32 || p.conv_weight_type == ConvWeightType::kBF16,
        "{}: conv_weight_type={} unknown, expected kF32 (0) or kBF16 (1)", op,
        static_cast<int>(p.conv_weight_type));
    check_present(p.conv_state, op, "conv_state", "[S, W-1, D] bf16");
    check_pitch(p.conv_state_slot_stride, kConvHistory * D, op, "conv_state_slot_stride",
                "(W-1) x D");
  }
  if (windows) {
    check_present(p.conv_window, op, "conv_window", "[R, T_max, W-1, D] bf16");
    check_pitch(p.conv_window_row_stride, p.T_max * kConvHistory * D, op, "conv_window_row_stride",
                "T_max x (W-1) x D");
  }
  if ((needs & kAct) != 0) {
    check_present(p.qkv_act, op, "qkv_act", "[N, D] bf16 scratch of the unfused path");
  }
  if ((needs & kRecurrence) != 0) {
    check_present(p.a, op, "a", "[N, HV*K] bf16");
    check_pitch(p.a_stride, static_cast<int64_t>(p.HV) * p.K, op, "a_stride", "HV x K");
    check_present(p.b, op, "b", "[N, HV] bf16");
    check_pitch(p.b_stride, p.HV, op, "b_stride", "HV");
    check_present(p.A_log, op, "A_log", "[HV] f32");
    check_present(p.dt_bias, op, "dt_bias", "[HV*K] f32");
    KDA_CHECK(p.gate == GateKind::kStandard || p.gate == GateKind::kSafe,
              "{}: gate={} unknown, expected kStandard (0) or kSafe (1)", op,
              static_cast<int>(p.gate));
    KDA_CHECK(p.gate != GateKind::kSafe || (std::isfinite(p.lower_bound) && p.lower_bound != 0.0f),
              "{}: lower_bound={} must be finite and non-zero for the safe gate", op,
              p.lower_bound);
    check_present(p.ssm_state, op, "ssm_state", "[S, HV, V, K] f32");
    check_pitch(p.ssm_slot_stride, state_elems, op, "ssm_slot_stride", "HV x V x K");
  }
  if ((needs & kOut) != 0) {
    check_present(p.out, op, "out", "[N, HV, V] bf16");
  }
  if (snapshot) {
    check_present(p.snapshots, op, "snapshots", "snapshot mode");
    check_pitch(p.snapshot_row_stride, p.T_max * state_elems, op, "snapshot_row_stride",
                "T_max x HV x V x K");
  }
  if (ring) {
    check_ring_length(op, p.L);
    const int64_t L = p.L;
    check_present(p.ring_rawv, op, "ring_rawv", "ring mode");
    check_pitch(p.ring_rawv_slot_stride, p.HV * L * p.V, op, "ring_rawv_slot_stride", "HV x L x V");
    check_present(p.ring_rawk, op, "ring_rawk", "ring mode");
    check_pitch(p.ring_rawk_slot_stride, p.H * L * p.K, op, "ring_rawk_slot_stride", "H x L x K");
    check_present(p.ring_g, op, "ring_g", "ring mode");
    check_pitch(p.ring_g_slot_stride, p.HV * L * p.K, op, "ring_g_slot_stride", "HV x L x K");
    check_present(p.ring_beta, op, "ring_beta", "ring mode");
    check_pitch(p.ring_beta_slot_stride, p.HV * L, op, "ring_beta_slot_stride", "HV x L");
  }
  if (records && (p.ring_pending != nullptr || p.ring_cursor != nullptr)) {
    KDA_CHECK(ring, "{}: ring_cursor / ring_pending are ring-mode records (the call has none)", op);
    KDA_CHECK(2 * p.T_max <= p.L,
              "{}: a ring cursor needs L >= 2 * T_max (a round's records off the pending ones), "
              "got L={}, T_max={}",
              op, p.L, p.T_max);
  }
  if (records && p.ring_pending != nullptr) {
    check_present(p.ring_cursor, op, "ring_cursor", "[S] ring base per slot, with ring_pending");
    if (p.lazy != 0) {
      // The lazy verify (contract §11): the pending steps are its fast chunk's history.
      KDA_CHECK(p.numerics == VerifyNumerics::kFast,
                "{}: lazy={} with numerics=exact: the lazy write-back computes fast outputs "
                "(numerics kFast expected)",
                op, p.lazy);
      KDA_CHECK(p.ssm_fold_out == nullptr,
                "{}: ssm_fold_out given to a lazy verify (lazy={}): it folds nothing and writes "
                "no state (expected null)",
                op, p.lazy);
      KDA_CHECK(p.ring_u == nullptr,
                "{}: ring_u given to a lazy verify (lazy={}): fast outputs record no u (expected "
                "null)",
                op, p.lazy);
      KDA_CHECK(p.L <= kFastMaxChunk,
                "{}: L={} for a lazy verify, expected at most {} (the pending history and the "
                "draft share one fast chunk)",
                op, p.L, kFastMaxChunk);
    } else {
      check_present(p.ssm_fold_out, op, "ssm_fold_out",
                    "[S, HV, V, K] f32 (the committed state), with ring_pending");
      check_present(p.ring_u, op, "ring_u", "[S, HV, L, V] f32 u records, with ring_pending");
      check_pitch(p.ring_u_slot_stride, p.HV * static_cast<int64_t>(p.L) * p.V, op,
                  "ring_u_slot_stride", "HV x L x V");
    }
  }
  if (p.parents != nullptr) {
    KDA_CHECK(p.token_offsets == nullptr,
              "{}: parents (a tree) with token_offsets (ragged): a tree batch has T nodes per "
              "request",
              op);
    KDA_CHECK(p.T <= kMaxTreeNodes, "{}: T={} for a tree batch, expected at most {} nodes", op, p.T,
              kMaxTreeNodes);
  }
  KDA_CHECK(p.lazy == 0 || (records && p.ring_pending != nullptr),
            "{}: lazy={} without ring_pending (the lazy verify's pending counts, contract §11)", op,
            p.lazy);
  if (records) {
    KDA_CHECK(p.ring_u == nullptr || p.ring_pending != nullptr,
              "{}: ring_u is given without ring_pending (u records belong to the deferred commit)",
              op);
    KDA_CHECK(p.u_free == 0 || p.ring_pending != nullptr,
              "{}: u_free={} without ring_pending (the u-free deferred commit's calls have pending "
              "counts)",
              op, p.u_free);
  }
}

void check_fused_shape(const VerifyParams& p, const char* op) {
  KDA_CHECK(p.parents == nullptr,
            "{}: parents given (a tree batch): the fused path verifies chains, trees take the "
            "unfused path",
            op);
}

void check_extend(const ExtendParams& e, const char* op) {
  check_verify(verify_view(e), op, kConv | kRecurrence | kOut | kWritesSlots);
  KDA_CHECK(
      e.token_offsets == nullptr && e.parents == nullptr,
      "{}: extend takes no draft shape (token_offsets / parents): T prompt tokens per request", op);
  check_present(e.ssm_state_out, op, "ssm_state_out", "[S, HV, V, K] f32, may alias ssm_state");
  check_present(e.conv_state_out, op, "conv_state_out", "[S, W-1, D] bf16, may alias conv_state");
  KDA_CHECK((e.track_slots == nullptr) == (e.track_steps == nullptr),
            "{}: track_slots and track_steps go together ([B] each, or both null = no track)", op);
}

CommitParams dense_commit_stage(const CommitParams& p) {
  CommitParams dense = p;
  dense.accepted = p.checked_accepted;
  dense.token_offsets = nullptr;
  dense.parents = nullptr;
  if (p.mode == RecordMode::kRing) {
    dense.accepted_paths = nullptr;
  }
  return dense;
}

uint32_t commit_needs(const CommitParams& p) {
  switch (p.kind) {
    case CommitKind::kEager:
      return (p.mode == RecordMode::kRing ? kFold : kSnapshot) | kConvCommit;
    case CommitKind::kDeferred:
      return kConvCommit | (p.track_slots != nullptr ? kFold : 0u);
    case CommitKind::kMaterialize:
      return kFold;
    case CommitKind::kDropPending:
      return 0u;
    case CommitKind::kLazy:
      return kFold | kConvCommit;
  }
  return 0u;
}

void check_commit(const CommitParams& p, const char* op, uint32_t needs) {
  check_sizes(op, p.B, p.T, p.H, p.HV, p.K, p.V);
  check_positive(p.num_layers, op, "num_layers");
  check_positive(p.num_slots, op, "num_slots");
  check_mode(op, p.mode);
  check_present(p.slots, op, "slots", "[B] slot per request");
  KDA_CHECK(p.kind == CommitKind::kEager || p.kind == CommitKind::kDeferred ||
                p.kind == CommitKind::kMaterialize || p.kind == CommitKind::kDropPending ||
                p.kind == CommitKind::kLazy,
            "{}: kind={} unknown, expected kEager (0), kDeferred (1), kMaterialize (2), "
            "kDropPending (3) or kLazy (4)",
            op, static_cast<int>(p.kind));
  const bool reads_accepted = p.kind == CommitKind::kEager || p.kind == CommitKind::kDeferred ||
                              p.kind == CommitKind::kLazy;
  if (reads_accepted) {
    check_present(p.accepted, op, "accepted", "[B] accepted lengths");
  }
  if (p.kind == CommitKind::kEager) {
    KDA_CHECK(p.ring_cursor == nullptr && p.ring_pending == nullptr,
              "{}: an eager commit takes no ring_cursor / ring_pending (deferred state)", op);
  } else {
    KDA_CHECK(p.mode == RecordMode::kRing, "{}: kind={} is ring mode only", op,
              static_cast<int>(p.kind));
    check_present(p.ring_cursor, op, "ring_cursor", "[S] ring base per slot");
    check_present(p.ring_pending, op, "ring_pending", "[layers, S] pending counts");
  }
  if (p.ring_pending != nullptr) {
    check_layer_pitch(p.num_layers, p.ring_pending_layer_stride, p.num_slots, 1, op,
                      "ring_pending_layer_stride");
  }
  if (p.kind == CommitKind::kLazy) {
    KDA_CHECK(p.ring_u == nullptr,
              "{}: ring_u given to a lazy commit: the lazy write-back is u-free (its folds compute "
              "u from the raw records)",
              op);
    KDA_CHECK(2 * p.T_max <= p.L && p.L <= kFastMaxChunk,
              "{}: a lazy commit needs 2 * T_max <= L <= {} (the pending steps and the next draft "
              "in one fast chunk), got L={}, T_max={}",
              op, kFastMaxChunk, p.L, p.T_max);
    KDA_CHECK(p.lazy_fold_interval >= 0,
              "{}: lazy_fold_interval={}, expected >= 0 (0: fold only when the next draft would "
              "not fit)",
              op, p.lazy_fold_interval);
  } else {
    KDA_CHECK(p.lazy_fold_interval == 0,
              "{}: lazy_fold_interval={} with kind={} (the lazy commit's; expected 0)", op,
              p.lazy_fold_interval, static_cast<int>(p.kind));
  }
  // The folds of deferred records (from the cursor) replay their u records; an eager fold
  // computes u (its records have none); the lazy commit's folds are u-free.
  const bool folds_deferred = p.kind == CommitKind::kMaterialize ||
                              (p.kind == CommitKind::kDeferred && p.track_slots != nullptr);
  KDA_CHECK(p.u_free == 0 || p.kind != CommitKind::kEager,
            "{}: u_free={} with an eager commit (the u-free form is the deferred commit's)", op,
            p.u_free);
  if (folds_deferred && p.u_free == 0) {
    check_present(p.ring_u, op, "ring_u", "[layers, S, HV, L, V] f32 u records (deferred folds)");
    check_pitch(p.ring_u_slot_stride, p.HV * static_cast<int64_t>(p.L) * p.V, op,
                "ring_u_slot_stride", "HV x L x V");
    check_layer_pitch(p.num_layers, p.ring_u_layer_stride, p.num_slots, p.ring_u_slot_stride, op,
                      "ring_u_layer_stride");
  } else if (p.kind == CommitKind::kEager) {
    KDA_CHECK(p.ring_u == nullptr,
              "{}: an eager commit takes no ring_u (u records are the deferred commit's)", op);
  }
  const bool shaped = p.token_offsets != nullptr || p.parents != nullptr;
  if (shaped) {
    KDA_CHECK(reads_accepted, "{}: kind={} takes no draft shape (token_offsets / parents)", op,
              static_cast<int>(p.kind));
    check_present(p.checked_accepted, op, "checked_accepted",
                  "[B] int32 scratch, with a draft shape");
  }
  KDA_CHECK(p.parents == nullptr || p.accepted_paths != nullptr,
            "{}: parents without accepted_paths (a tree round commits its accepted paths)", op);
  if (p.parents != nullptr) {
    KDA_CHECK(p.token_offsets == nullptr,
              "{}: parents (a tree) with token_offsets (ragged): a tree batch has T nodes per "
              "request",
              op);
    KDA_CHECK(p.kind == CommitKind::kEager,
              "{}: a tree round commits eagerly (its accepted path is not a contiguous ring "
              "range), got kind={}",
              op, static_cast<int>(p.kind));
  }
  KDA_CHECK((p.track_slots == nullptr) == (p.track_steps == nullptr),
            "{}: track_slots and track_steps go together ([B] each, or both null = no track)", op);
  KDA_CHECK(p.track_slots == nullptr || reads_accepted,
            "{}: kind={} takes no tracks (tracks belong to an eager or deferred commit)", op,
            static_cast<int>(p.kind));
  const int64_t D = qkv_dim(p);
  const int64_t state_elems = static_cast<int64_t>(p.HV) * p.V * p.K;
  const bool fold = (needs & kFold) != 0;
  const bool snapshot = (needs & kSnapshot) != 0;
  const bool conv = (needs & kConvCommit) != 0;
  const bool uses_rows = snapshot || conv;
  if (uses_rows) {
    check_rows(op, p.T, p.T_max, p.rows, p.num_rows);
  }
  if (fold || snapshot) {
    check_present(p.ssm_state, op, "ssm_state", "[layers, S, HV, V, K] f32");
    check_pitch(p.ssm_slot_stride, state_elems, op, "ssm_slot_stride", "HV x V x K");
    check_layer_pitch(p.num_layers, p.ssm_layer_stride, p.num_slots, p.ssm_slot_stride, op,
                      "ssm_layer_stride");
  }
  if (fold) {
    check_ring_length(op, p.L);
    KDA_CHECK(p.L >= p.T, "{}: L={} is smaller than T={}: steps t >= L have no ring records", op,
              p.L, p.T);
    const int64_t L = p.L;
    const int64_t S = p.num_slots;
    check_present(p.ring_rawv, op, "ring_rawv", "ring mode");
    check_pitch(p.ring_rawv_slot_stride, p.HV * L * p.V, op, "ring_rawv_slot_stride", "HV x L x V");
    check_layer_pitch(p.num_layers, p.ring_rawv_layer_stride, S, p.ring_rawv_slot_stride, op,
                      "ring_rawv_layer_stride");
    check_present(p.ring_rawk, op, "ring_rawk", "ring mode");
    check_pitch(p.ring_rawk_slot_stride, p.H * L * p.K, op, "ring_rawk_slot_stride", "H x L x K");
    check_layer_pitch(p.num_layers, p.ring_rawk_layer_stride, S, p.ring_rawk_slot_stride, op,
                      "ring_rawk_layer_stride");
    check_present(p.ring_g, op, "ring_g", "ring mode");
    check_pitch(p.ring_g_slot_stride, p.HV * L * p.K, op, "ring_g_slot_stride", "HV x L x K");
    check_layer_pitch(p.num_layers, p.ring_g_layer_stride, S, p.ring_g_slot_stride, op,
                      "ring_g_layer_stride");
    check_present(p.ring_beta, op, "ring_beta", "ring mode");
    check_pitch(p.ring_beta_slot_stride, p.HV * L, op, "ring_beta_slot_stride", "HV x L");
    check_layer_pitch(p.num_layers, p.ring_beta_layer_stride, S, p.ring_beta_slot_stride, op,
                      "ring_beta_layer_stride");
  }
  if (snapshot) {
    check_present(p.snapshots, op, "snapshots", "snapshot mode");
    check_pitch(p.snapshot_row_stride, p.T_max * state_elems, op, "snapshot_row_stride",
                "T_max x HV x V x K");
    check_layer_pitch(p.num_layers, p.snapshot_layer_stride, p.num_rows, p.snapshot_row_stride, op,
                      "snapshot_layer_stride");
  }
  if (conv) {
    check_present(p.conv_window, op, "conv_window", "[layers, R, T_max, W-1, D] bf16");
    check_pitch(p.conv_window_row_stride, p.T_max * kConvHistory * D, op, "conv_window_row_stride",
                "T_max x (W-1) x D");
    check_layer_pitch(p.num_layers, p.conv_window_layer_stride, p.num_rows,
                      p.conv_window_row_stride, op, "conv_window_layer_stride");
    check_present(p.conv_state, op, "conv_state", "[layers, S, W-1, D] bf16");
    check_pitch(p.conv_state_slot_stride, kConvHistory * D, op, "conv_state_slot_stride",
                "(W-1) x D");
    check_layer_pitch(p.num_layers, p.conv_state_layer_stride, p.num_slots,
                      p.conv_state_slot_stride, op, "conv_state_layer_stride");
  }
}

void check_block_v(int block_v, const char* op) {
  KDA_CHECK(kernels::is_fused_block_v(block_v), "{}: block_v={} unsupported, expected one of {}",
            op, block_v, fmt::join(kernels::kFusedBlockVs, ", "));
}

}  // namespace kda::params
