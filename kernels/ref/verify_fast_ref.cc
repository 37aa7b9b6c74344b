// verify_fast_ref.cc: the fast outputs of the host reference (contract §10): verify_fused_fast,
// its fp64 oracle verify_fp64_chunked and the test-only faulted form. The chunk solve is one
// template for f32 and double, so the oracle differs from the f32 form only in precision. The
// prologue, records and windows come from the exact fused loop (detail::fused_walk): this file
// computes outputs only and never writes the committed state.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/ref/fast_ref_testing.h"
#include "kernels/ref/host_common.h"
#include "kernels/ref/kda_host.h"
#include "kernels/verify/tile_policy.h"

namespace kda::host {
namespace {

using testing::ChunkFault;

/// Σ_k x[k] s[k] summed in double (products of f32 values are exact there), rounded once to R:
/// the state contractions, whose tensor-core order the reference cannot reproduce.
template <typename R>
R contract(const R* x, const R* s, int K) {
  double acc = 0.0;
  for (int k = 0; k < K; ++k) {
    acc += static_cast<double>(x[k]) * static_cast<double>(s[k]);
  }
  return static_cast<R>(acc);
}

// The chunked (WY) form of one (request, v-head) over its T tokens. With d_t = EXP(g_t) the
// sequential recurrence S_t = diag(d_t) S_{t-1} + kn_t u_t^T unrolls to
//   S_t[k][:] = P_t[k] S0[k][:] + Σ_{i<=t} (d_{i+1} ... d_t)[k] kn_i[k] u_i,  P_t = d_0 ... d_t,
// so u_t = (v_t - W_t - Σ_{i<t} A[t][i] u_i) beta_t and o_t = QS_t + Σ_{i<=t} M[t][i] u_i, with
// W_t = (kn_t P_t)·S0, QS_t = (qs_t P_t)·S0, A[t][i] = Σ_k kn_i (d_{i+1}..d_t) kn_t and
// M[t][i] = Σ_k kn_i (d_{i+1}..d_t) qs_t. Every decay is a product of factors <= 1: no division
// by a cumulative decay, no exp of a positive sum, so both gates stay finite.
template <typename R>
class Chunk {
 public:
  Chunk(int K, int V, int max_tokens)
      : K_(K),
        V_(V),
        cap_(max_tokens),
        d_(tk()),
        kn_(tk()),
        qs_(tk()),
        xk_(tk()),
        xq_(tk()),
        v_(tv()),
        W_(tv()),
        QS_(tv()),
        beta_(static_cast<size_t>(cap_)),
        u_(static_cast<size_t>(cap_)),
        A_(static_cast<size_t>(cap_) * cap_),
        M_(static_cast<size_t>(cap_) * cap_),
        ratio_(static_cast<size_t>(K)),
        wk_(static_cast<size_t>(K)) {}

  /// Token t's inputs from the prologue: d_t = EXP(g_t) (the exact path's form), kn_t, qs_t,
  /// v_t, beta_t.
  void add(int t, const detail::HeadStep<R>& w) {
    for (int k = 0; k < K_; ++k) {
      d_[at_k(t) + k] = std::exp(w.g[k]);
    }
    std::copy(w.kn.begin(), w.kn.end(), kn_.begin() + at_k(t));
    std::copy(w.qs.begin(), w.qs.end(), qs_.begin() + at_k(t));
    std::copy(w.v.begin(), w.v.end(), v_.begin() + at_v(t));
    beta_[static_cast<size_t>(t)] = w.beta;
  }

  /// The outputs of tokens t < T (added before) from the state S0 ([V][K], K contiguous):
  /// o[t * V + v], before the bf16 rounding. `fault` plants a test's error (kNone in use).
  void solve(int T, const std::vector<R>& S0, ChunkFault fault, std::vector<R>& o) {
    const int K = K_, V = V_;
    // 1. Prefix decays, per k in token order: xk_t = kn_t P_t, xq_t = qs_t P_t.
    for (int k = 0; k < K; ++k) {
      R P = R(1);
      for (int t = 0; t < T; ++t) {
        P = P * d_[at_k(t) + k];
        xk_[at_k(t) + k] = kn_[at_k(t) + k] * P;
        xq_[at_k(t) + k] = qs_[at_k(t) + k] * P;
      }
    }
    // 2. The T x T system: the ratio d_{i+1} ... d_t grows by one factor per step t, and the
    // ratio-decayed key kn_i (kn_i itself at t = i) meets kn_t and qs_t in the reduction tree.
    for (int i = 0; i < T; ++i) {
      std::fill(ratio_.begin(), ratio_.end(), R(1));
      for (int t = i; t < T; ++t) {
        if (t > i) {
          const int step = fault == ChunkFault::kDecayOffByOneStep ? t - 1 : t;
          for (int k = 0; k < K; ++k) {
            ratio_[k] = ratio_[k] * d_[at_k(step) + k];
          }
        }
        for (int k = 0; k < K; ++k) {
          wk_[k] = kn_[at_k(i) + k] * ratio_[k];
        }
        if (t > i) {
          A_[at_tt(t, i)] = math::tree_dot(wk_.data(), &kn_[at_k(t)], K);
        }
        M_[at_tt(t, i)] = math::tree_dot(wk_.data(), &qs_[at_k(t)], K);
      }
    }
    // 3. The state contractions.
    for (int t = 0; t < T; ++t) {
      for (int v = 0; v < V; ++v) {
        const R* s = &S0[static_cast<size_t>(v) * K];
        W_[at_v(t) + v] = contract(&xk_[at_k(t)], s, K);
        QS_[at_v(t) + v] = contract(&xq_[at_k(t)], s, K);
      }
    }
    // 4. Per column: u by forward substitution (subtract, then scale, as step 6), then o_t.
    o.resize(static_cast<size_t>(T) * V);
    for (int v = 0; v < V; ++v) {
      for (int t = 0; t < T; ++t) {
        const bool drop = fault == ChunkFault::kDropIntraTerm && t == 1;
        R ks = W_[at_v(t) + v];
        for (int i = 0; i < t && !drop; ++i) {
          ks = std::fma(A_[at_tt(t, i)], u_[i], ks);
        }
        u_[t] = (v_[at_v(t) + v] - ks) * beta_[t];
        const int last = fault == ChunkFault::kMaskOffByOne ? t - 1 : t;
        R out = QS_[at_v(t) + v];
        for (int i = drop ? t : 0; i <= last; ++i) {
          out = std::fma(M_[at_tt(t, i)], u_[i], out);
        }
        o[static_cast<size_t>(t) * V + v] = out;
      }
    }
  }

 private:
  size_t tk() const { return static_cast<size_t>(cap_) * K_; }
  size_t tv() const { return static_cast<size_t>(cap_) * V_; }
  size_t at_k(int t) const { return static_cast<size_t>(t) * K_; }
  size_t at_v(int t) const { return static_cast<size_t>(t) * V_; }
  size_t at_tt(int t, int i) const { return static_cast<size_t>(t) * cap_ + i; }

  int K_, V_, cap_;
  std::vector<R> d_, kn_, qs_, xk_, xq_;  // [T][K]
  std::vector<R> v_, W_, QS_;             // [T][V]
  std::vector<R> beta_, u_;               // [T]; u_ one column's
  std::vector<R> A_, M_;                  // [T][T], row t, column i <= t
  std::vector<R> ratio_, wk_;             // [K] workspace of step 2
};

// The domain of the chunked outputs (VerifyNumerics::kFast): ring-mode chains, one chunk of
// tokens; with a deferred commit only its u-free form (the folds compute u from the raw records:
// the chunked form has no exact per-step u to record).
void check_fast_domain(const VerifyParams& p, const char* op) {
  KDA_CHECK(p.mode == RecordMode::kRing,
            "{}: mode=kSnapshot: fast outputs are ring mode only (contract §10)", op);
  KDA_CHECK(p.parents == nullptr,
            "{}: parents given (a tree batch): fast outputs verify chains (dense or ragged)", op);
  KDA_CHECK(p.ring_pending == nullptr || p.u_free != 0 || is_lazy_verify(p),
            "{}: ring_pending given with u records (u_free=0): fast outputs record no u (a "
            "deferred commit with fast outputs is u-free)",
            op);
  KDA_CHECK(p.T >= 1 && p.T <= kernels::kFastMaxTokens,
            "{}: T={} unsupported, expected 1..{} (one fast chunk)", op, p.T,
            kernels::kFastMaxTokens);
}

// A lazy verify's pending counts (contract §11): each real request's history and its draft must
// fit the ring (and so one chunk, L <= kFastMaxChunk), or its draft's records would overwrite
// the history. The lazy commit keeps pending <= L - T_max; anything else is a caller's bug.
void check_lazy_history(const VerifyParams& p, const char* op) {
  for (int n = 0; n < p.B; ++n) {
    const int32_t slot = p.slots[n];
    if (slot < 0) {
      continue;
    }
    const int32_t P = p.ring_pending[slot];
    KDA_CHECK(P >= 0 && P + detail::tokens_of(p, n) <= p.L,
              "{}: ring_pending[{}]={} for request {} of {} tokens, expected 0..L - T_n = {} (the "
              "lazy commit folds before the history and the next draft overflow the ring)",
              op, slot, P, n, detail::tokens_of(p, n), p.L - detail::tokens_of(p, n));
  }
}

// Pending step j of P of (slot, hv) as a chunk token (contract §11): ring position
// (c - P + j) mod L, k normalised as the fold normalises it, d = EXP(g), no query (qs = 0: the
// history's outputs are not computed).
void load_history_step(const VerifyParams& p, int32_t slot, int hv, int position,
                       detail::HeadStep<float>& w) {
  const int t = position & (p.L - 1);
  const int h = hv / (p.HV / p.H);
  const bf16_t* rawk =
      p.ring_rawk + detail::ring_record(p.ring_rawk_slot_stride, slot, h, p.L, t, p.K);
  const bf16_t* rawv =
      p.ring_rawv + detail::ring_record(p.ring_rawv_slot_stride, slot, hv, p.L, t, p.V);
  const float* g = p.ring_g + detail::ring_record(p.ring_g_slot_stride, slot, hv, p.L, t, p.K);
  std::transform(rawk, rawk + p.K, w.k.begin(), bf16_to_float);
  math::l2_normalize(w.k.data(), p.K, w.kn.data());
  std::copy(g, g + p.K, w.g.begin());
  std::transform(rawv, rawv + p.V, w.v.begin(), bf16_to_float);
  w.beta = p.ring_beta[detail::ring_record(p.ring_beta_slot_stride, slot, hv, p.L, t, 1)];
  std::fill(w.qs.begin(), w.qs.end(), 0.0f);
}

void run_fused_fast(const VerifyParams& p, ChunkFault fault, const char* op) {
  check_fast_domain(p, op);
  detail::validate_verify(
      p, op,
      params::kConv | params::kWindows | params::kRecurrence | params::kOut | params::kRecords);
  // A lazy verify's chunk: the slot's pending steps (the history), then its draft.
  const bool lazy = is_lazy_verify(p);
  if (lazy) {
    check_lazy_history(p, op);
  }
  const auto history = [&](int32_t slot) { return lazy ? p.ring_pending[slot] : 0; };
  Chunk<float> chunk(p.K, p.V, lazy ? p.L : p.T);
  detail::HeadStep<float> past(p.K, p.V);
  std::vector<float> o;
  VerifyParams records = p;  // the chunked form computes no per-step u: it stores none
  records.ring_u = nullptr;
  detail::fused_walk(
      p,
      [&](const detail::FusedToken& at, detail::HeadStep<float>& w) {
        detail::write_record(records, at.slot, at.row, at.t, at.hv, w);
        chunk.add(history(at.slot) + at.t, w);
      },
      [&](int n, int hv, detail::HeadStep<float>& w) {
        // w.S: the committed checkpoint (a lazy verify folds nothing, detail::fold_pending).
        const int32_t slot = p.slots[n];
        const int P = history(slot);
        const int first = detail::ring_cursor_of(p, slot) - P;
        const int skip = fault == ChunkFault::kHistorySkipsFirstStep && P > 0 ? 1 : 0;
        for (int j = 0; j < P; ++j) {
          load_history_step(p, slot, hv, first + j + skip, past);
          chunk.add(j, past);
        }
        const int T = detail::tokens_of(p, n);
        chunk.solve(P + T, w.S, fault, o);
        for (int t = 0; t < T; ++t) {
          detail::write_out(p, detail::qkv_row(p, n, t), hv, &o[static_cast<size_t>(P + t) * p.V]);
        }
      });
}

}  // namespace

void verify_fused_fast(const VerifyParams& p) {
  run_fused_fast(p, ChunkFault::kNone, "kda::host::verify_fused_fast");
}

void testing::verify_fused_fast_with_fault(const VerifyParams& p, ChunkFault fault) {
  run_fused_fast(p, fault, "kda::host::testing::verify_fused_fast_with_fault");
}

Fp64Verify verify_fp64_chunked(const VerifyParams& p) {
  const char* op = "kda::host::verify_fp64_chunked";
  detail::validate_verify(p, op, params::kConv | params::kRecurrence);
  KDA_CHECK(p.parents == nullptr,
            "{}: parents given (a tree batch): the chunked form verifies chains", op);
  KDA_CHECK(p.ring_pending == nullptr,
            "{}: ring_pending given: the oracle starts from the committed state (materialize "
            "first)",
            op);
  const int64_t D = qkv_dim(p);
  const int group = p.HV / p.H;
  Fp64Verify r;
  r.out.assign(static_cast<size_t>(p.B) * p.T * p.HV * p.V, 0.0);
  std::vector<bf16_t> act(static_cast<size_t>(p.T * D));
  detail::HeadStep<double> w(p.K, p.V);
  Chunk<double> chunk(p.K, p.V, p.T);
  std::vector<double> o;
  for (int n = 0; n < p.B; ++n) {
    const int32_t slot = p.slots[n];
    if (slot < 0) {
      continue;  // padding: zeros, like the zeroed output rows of the kernels
    }
    // The same f32 conv as the reference: q/k/v are the model's bf16 values.
    detail::conv_request(p, n, slot, act.data(), D, /*windows=*/nullptr,
                         /*last_window=*/nullptr);
    const int T = detail::tokens_of(p, n);
    for (int hv = 0; hv < p.HV; ++hv) {
      detail::load_state(p.ssm_state, p.ssm_slot_stride, slot, hv, p.V, p.K, w.S);
      for (int t = 0; t < T; ++t) {
        detail::load_qkv(p, act.data() + t * D, hv / group, hv, w);
        detail::token_prologue(p, detail::qkv_row(p, n, t), hv, w);
        chunk.add(t, w);
      }
      chunk.solve(T, w.S, ChunkFault::kNone, o);
      for (int t = 0; t < T; ++t) {
        std::copy_n(o.begin() + static_cast<int64_t>(t) * p.V, p.V,
                    r.out.begin() + (detail::qkv_row(p, n, t) * p.HV + hv) * p.V);
      }
    }
  }
  return r;
}

}  // namespace kda::host
