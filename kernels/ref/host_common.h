// host_common.h: internals shared by the host reference's operations: validation, element
// offsets into the params' tensors (contract §2, 64-bit), and the per-(request, v-head) token
// step that every verify-like path (unfused, extend, fp64 oracle, fused) runs.
#pragma once

#include <cstdint>
#include <functional>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "kernels/params/kda_params.h"
#include "kernels/params/params_check.h"
#include "kernels/ref/fast_ref_testing.h"
#include "kernels/ref/host_math.h"

namespace kda::host::detail {

// ---- validation (validate.cc): params::check_* (kernels/params_check.h) plus the index
// arrays; each throws kda::Error naming op, field, expected, actual. `needs`: params::VerifyNeeds
// or params::CommitNeeds bits. ----

void validate_verify(const VerifyParams& p, const char* op, uint32_t needs);
void validate_extend(const ExtendParams& p, const char* op);

void validate_commit(const CommitParams& p, const char* op, uint32_t needs);

/// Accepted length of request i if in [1, T]; else 0 after setting *p.error_flag (if any).
int32_t accepted_or_flag(const CommitParams& p, int i);

/// Request i's valid track step (commit_track.h), or -1 (none or invalid; an invalid one or-s
/// kBadTrack into *p.error_flag).
int32_t track_step_or_flag(const CommitParams& p, int i);

/// Calls f(i, slot, n) for every request i that commits: a real slot (>= 0) and an accepted
/// length n in [1, T]; a bad length skips the request and sets *p.error_flag (as the GPU).
template <typename F>
void for_each_committed(const CommitParams& p, F&& f) {
  for (int i = 0; i < p.B; ++i) {
    const int32_t slot = p.slots[i];
    if (slot < 0) {
      continue;
    }
    const int32_t n = accepted_or_flag(p, i);
    if (n != 0) {
      f(i, slot, n);
    }
  }
}

// ---- offsets (elements) ----

/// Token row of step t of request n: n*T + t, or token_offsets[n] + t (ragged, contract §8).
inline int64_t qkv_row(const VerifyParams& p, int n, int t) {
  return (p.token_offsets != nullptr ? int64_t{p.token_offsets[n]}
                                     : static_cast<int64_t>(n) * p.T) +
         t;
}
/// The tokens request n verifies: T_n of a ragged batch, else T.
inline int tokens_of(const VerifyParams& p, int n) {
  return p.token_offsets != nullptr ? p.token_offsets[n + 1] - p.token_offsets[n] : p.T;
}
/// The step that step t of request n follows: its parent node in a tree, else t - 1 (-1: the
/// committed state).
inline int parent_of(const VerifyParams& p, int n, int t) {
  return p.parents != nullptr ? p.parents[static_cast<int64_t>(n) * p.T + t] : t - 1;
}
inline int64_t q_channel(const VerifyParams& p, int h) { return static_cast<int64_t>(h) * p.K; }
inline int64_t k_channel(const VerifyParams& p, int h) {
  return static_cast<int64_t>(p.H + h) * p.K;
}
inline int64_t v_channel(const VerifyParams& p, int hv) {
  return 2 * static_cast<int64_t>(p.H) * p.K + static_cast<int64_t>(hv) * p.V;
}
/// [S, HV, V, K] state of (slot, hv), packed V x K.
inline int64_t state_offset(int64_t slot_stride, int64_t slot, int hv, int V, int K) {
  return slot * slot_stride + static_cast<int64_t>(hv) * V * K;
}
/// [.., T_max, W-1, D] window of step t inside one scratch row.
inline int64_t window_step_offset(int t, int64_t D) {
  return static_cast<int64_t>(t) * kConvHistory * D;
}
/// Rings, inner dims packed (contract §2): rawv [S, HV, L, V], rawk [S, H, L, K],
/// g [S, HV, L, K], beta [S, HV, L]. `head` is hv, or h for rawk.
inline int64_t ring_record(int64_t slot_stride, int64_t slot, int head, int L, int t,
                           int64_t width) {
  return slot * slot_stride + (static_cast<int64_t>(head) * L + t) * width;
}

// ---- step 1 helpers (conv_update_ref.cc) ----

/// Conv weights and bias of channel ch as f32.
math::ConvTaps load_conv_taps(const VerifyParams& p, int64_t ch);

/// Conv + SiLU of all D channels of request n over its T_n tokens, history from conv_state of
/// `slot` (a tree: each node's window from its parent's). Writes act[t * act_stride + ch]; if
/// `windows` is set, the window after token t at windows[t * (W-1) * D + j * D + ch]; if
/// `last_window` is set, the final window [W-1, D].
void conv_request(const VerifyParams& p, int n, int32_t slot, bf16_t* act, int64_t act_stride,
                  bf16_t* windows, bf16_t* last_window);

/// Zeroes the T_n output rows of padding request n (the only write a padding request gets).
void zero_out_rows(const VerifyParams& p, int n);

// ---- steps 2-6 of one token for one (request, v-head) ----

/// Per-(request, v-head) workspace; S persists across the request's tokens.
template <typename R>
struct HeadStep {
  HeadStep(int K, int V)
      : S(static_cast<size_t>(K) * V), q(K), k(K), v(V), g(K), qs(K), kn(K), decay(K), u(V), o(V) {}
  std::vector<R> S;        ///< [V][K], K contiguous (as in memory)
  std::vector<R> q, k, v;  ///< bf16 conv outputs of this token (inputs)
  std::vector<R> g;        ///< per-K log-decay gate
  R beta = R(0);
  std::vector<R> qs, kn, decay;
  std::vector<R> u;  ///< (v - Σ_k S[k][:] kn[k]) * beta: the step's u record
  std::vector<R> o;  ///< output before the bf16 rounding
};

/// One layer's ring records (per-layer base pointers applied) and their slot pitches.
struct RingView {
  const bf16_t* rawv;
  const bf16_t* rawk;
  const float* g;
  const float* beta;
  int64_t rawv_slot_stride, rawk_slot_stride, g_slot_stride, beta_slot_stride;
  int L;
  const float* u = nullptr;  ///< deferred records' u ([S, HV, L, V]), or null
  int64_t u_slot_stride = 0;
};

/// The fold (contract §3 "Fold") of ring positions (first + j) mod L, j < n, of (slot, hv)
/// onto S ([V][K] f32): steps 5-6 for k only, no q, no output (fold_ref.cc). With u records
/// (r.u) each step takes its u from them (the u the key dot gives, bitwise).
void fold_steps(const RingView& r, int32_t slot, int h, int hv, int K, int V, int first, int n,
                float* S);

/// The lazy commit's state part (CommitKind::kLazy, contract §11; fold_ref.cc): per request and
/// layer, the pending count, the folds it triggers and the tracks; advances the cursors. `fault`
/// plants a test's error (kNone in use).
void fold_lazy(const CommitParams& p, testing::LazyFault fault);

/// The ring base c of `slot` (0 without a cursor).
inline int32_t ring_cursor_of(const VerifyParams& p, int32_t slot) {
  return p.ring_cursor != nullptr ? p.ring_cursor[slot] : 0;
}

/// The deferred commit's pending steps of (slot, hv) (contract §7): folds ring positions
/// (c - n + j) mod L, j < n = ring_pending[slot], onto S and writes S to ssm_fold_out. Nothing
/// without pending steps, nor in a lazy verify (contract §11: they are its chunk's history).
void fold_pending(const VerifyParams& p, int32_t slot, int hv, std::vector<float>& S);

/// Loads the f32 state of (slot, hv) into S as R.
template <typename R>
void load_state(const float* base, int64_t slot_stride, int32_t slot, int hv, int V, int K,
                std::vector<R>& S) {
  const float* src = base + state_offset(slot_stride, slot, hv, V, K);
  for (size_t i = 0; i < S.size(); ++i) {
    S[i] = static_cast<R>(src[i]);
  }
}

/// Loads q, k (k-head h) and v (v-head hv) of one token from a bf16 activation row.
template <typename R>
void load_qkv(const VerifyParams& p, const bf16_t* row, int h, int hv, HeadStep<R>& w) {
  const bf16_t* q = row + q_channel(p, h);
  const bf16_t* k = row + k_channel(p, h);
  const bf16_t* v = row + v_channel(p, hv);
  for (int i = 0; i < p.K; ++i) {
    w.q[i] = static_cast<R>(bf16_to_float(q[i]));
    w.k[i] = static_cast<R>(bf16_to_float(k[i]));
  }
  for (int i = 0; i < p.V; ++i) {
    w.v[i] = static_cast<R>(bf16_to_float(v[i]));
  }
}

/// Steps 2-3 for token row r, v-head hv: x = a + dt_bias, eA = EXP(A_log); g per K, beta.
template <typename R>
void load_gate_beta(const VerifyParams& p, int64_t r, int hv, HeadStep<R>& w) {
  const R eA = std::exp(static_cast<R>(p.A_log[hv]));
  const R lb = static_cast<R>(p.lower_bound);
  const bf16_t* a = p.a + r * p.a_stride + static_cast<int64_t>(hv) * p.K;
  const float* dt_bias = p.dt_bias + static_cast<int64_t>(hv) * p.K;
  for (int k = 0; k < p.K; ++k) {
    const R x = static_cast<R>(bf16_to_float(a[k])) + static_cast<R>(dt_bias[k]);
    w.g[k] = math::gate(p.gate, x, eA, lb);
  }
  w.beta = math::sigmoid(static_cast<R>(bf16_to_float(p.b[r * p.b_stride + hv])));
}

/// Steps 2, 3 and 5 for token row r with w.q/k/v loaded: fills w.g, w.beta, w.qs, w.kn. The
/// prologue every verify form shares (the exact recurrence and the chunked fast outputs).
template <typename R>
void token_prologue(const VerifyParams& p, int64_t r, int hv, HeadStep<R>& w) {
  load_gate_beta(p, r, hv, w);
  math::normalize_q(w.q.data(), p.K, w.qs.data());
  math::l2_normalize(w.k.data(), p.K, w.kn.data());
}

/// Step 6 after token_prologue: decays and updates w.S, fills w.u and w.o.
template <typename R>
void token_recurrence(const VerifyParams& p, HeadStep<R>& w) {
  math::decay_state(w.S.data(), w.g.data(), p.K, p.V, w.decay.data());
  math::delta_update(w.S.data(), w.kn.data(), w.beta, w.v.data(), p.K, p.V, w.u.data());
  math::head_output(w.S.data(), w.qs.data(), p.K, p.V, w.o.data());
}

/// Steps 2, 3, 5, 6 for token row r with w.q/k/v loaded: updates w.S, fills w.g, w.beta, w.o.
/// Step 4 (ring write) is left to the caller: it stores w.k, w.v, w.g, w.beta, which this
/// function reads but never modifies, so writing them afterwards stores the same bits.
template <typename R>
void run_token(const VerifyParams& p, int64_t r, int hv, HeadStep<R>& w) {
  token_prologue(p, r, hv, w);
  token_recurrence(p, w);
}

/// Runs every v-head and token of real request n over its bf16 conv outputs
/// act[t * act_stride + ch], starting from ssm_state[slot] (a tree: each node from its
/// parent's state). Calls on_token(hv, t, w) after each token and on_head(hv, w) after a
/// head's last token.
template <typename R, typename OnToken, typename OnHead>
void recur_request(const VerifyParams& p, int n, int32_t slot, const bf16_t* act,
                   int64_t act_stride, OnToken&& on_token, OnHead&& on_head) {
  const int group = p.HV / p.H;
  HeadStep<R> w(p.K, p.V);
  for (int hv = 0; hv < p.HV; ++hv) {
    load_state(p.ssm_state, p.ssm_slot_stride, slot, hv, p.V, p.K, w.S);
    if constexpr (std::is_same_v<R, float>) {
      fold_pending(p, slot, hv, w.S);
    }
    const int T = tokens_of(p, n);
    // A tree: node t starts from its parent's state (kept per node), the root from the
    // committed one; a chain's parent is the previous step, whose state w.S holds.
    const std::vector<R> committed = p.parents != nullptr ? w.S : std::vector<R>{};
    std::vector<std::vector<R>> nodes(p.parents != nullptr ? T : 0);
    for (int t = 0; t < T; ++t) {
      if (p.parents != nullptr) {
        const int parent = parent_of(p, n, t);
        w.S = parent < 0 ? committed : nodes[static_cast<size_t>(parent)];
      }
      load_qkv(p, act + t * act_stride, hv / group, hv, w);
      run_token(p, qkv_row(p, n, t), hv, w);
      on_token(hv, t, w);
      if (p.parents != nullptr) {
        nodes[static_cast<size_t>(t)] = w.S;
      }
    }
    on_head(hv, w);
  }
}

// ---- f32 writers (verify_ref.cc) ----

/// out[r][hv][:] = bf16(o[:]) (round to nearest even), o: V values.
void write_out(const VerifyParams& p, int64_t r, int hv, const float* o);
/// out[r][hv][:] = bf16(w.o).
void write_out(const VerifyParams& p, int64_t r, int hv, const HeadStep<float>& w);
/// snapshots[row][t][hv] = w.S.
void write_snapshot(const VerifyParams& p, int32_t row, int t, int hv, const HeadStep<float>& w);
/// Step 4 for token t < L of (slot, hv): rawv, g, beta (and u with ring_u); rawk only from the
/// first v-head of its group (hv % (HV/H) == 0), so each k-head record has exactly one writer.
void write_ring(const VerifyParams& p, int32_t slot, int t, int hv, const HeadStep<float>& w);
/// The mode's per-token record: snapshot or (t < L) ring.
void write_record(const VerifyParams& p, int32_t slot, int32_t row, int t, int hv,
                  const HeadStep<float>& w);

// ---- the fused path's walk (verify_ref.cc) ----

/// One token of the fused walk: real request n, its slot and scratch row, v-head hv, step t < T_n
/// and its token row r.
struct FusedToken {
  int n;
  int32_t slot, row;
  int hv, t;
  int64_t r;
};
using FusedTokenFn = std::function<void(const FusedToken&, HeadStep<float>&)>;
/// After a head's last token: request n, v-head hv, the head's workspace.
using FusedHeadFn = std::function<void(int n, int hv, HeadStep<float>&)>;

/// The loop of every fused verify form, as the fused kernels run it: zeroes the output rows of
/// padding requests; for each real request and v-head, w.S = the committed state of (slot, hv)
/// with its pending steps folded (fold_pending), then per token t < T_n the conv (w.q, w.k, w.v;
/// the windows after t into the request's scratch row, each element by one writer) and
/// token_prologue, then on_token; after the head's last token on_head (if set). The callbacks
/// write the outputs and the records.
void fused_walk(const VerifyParams& p, const FusedTokenFn& on_token, const FusedHeadFn& on_head);

}  // namespace kda::host::detail
