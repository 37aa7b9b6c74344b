// host_math.h: the per-step functions of docs/contract.md §3, shared by every host path.
//
// Templated on the real type R: float for the reference that mirrors the kernels, double for
// the fp64 oracle. One implementation, two instantiations, so the oracle differs from the
// reference only in precision, never in the formula or the order of operations.
// The conv (step 1) is f32 only: its bf16 output defines the model's q/k/v for both.
//
// Part of kda::host's internals; a public header only so that tests can run the steps in
// isolation (e.g. misorder one of them and prove the tolerances catch it).
//
// State layout of one head, as in memory (contract §2): S[v * K + k], K contiguous; "row k"
// of the math S[k][v] is the strided set {S[v * K + k]}.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/params/kda_params.h"

namespace kda::host::math {

/// Partials of the contract's reduction tree (one per lane of a warp on the GPU).
constexpr int kTreeLanes = 32;

// ---- step 1: causal conv + SiLU (f32) ----

/// One channel's conv weights as f32 (bf16 weights convert exactly).
struct ConvTaps {
  float w[kConvWidth] = {};    ///< tap 0 oldest ... tap 3 current token
  float bias = 0.0f;           ///< 0 without a bias
  bool bf16_products = false;  ///< bf16 weights: each product is rounded to bf16
};

/// acc = bias, then taps oldest -> current. f32 weights: an FMA chain (one rounding per tap).
/// bf16 weights: tap * w is exact in f32 (8-bit x 8-bit significands), rounded to bf16, then
/// added in f32: what the bf16 multiply of the Triton kernels computes.
inline float conv_acc(const ConvTaps& c, const float (&x)[kConvWidth]) {
  float acc = c.bias;
  for (int j = 0; j < kConvWidth; ++j) {
    acc = c.bf16_products ? acc + round_to_bf16(x[j] * c.w[j]) : std::fma(x[j], c.w[j], acc);
  }
  return acc;
}

/// SiLU in the contract's form DIV(acc, 1 + EXP(0 - acc)).
template <typename R>
R silu(R acc) {
  return acc / (R(1) + std::exp(R(0) - acc));
}

/// Step 1 output: SiLU(conv) rounded to bf16, the value q/k/v enter the recurrence with.
inline bf16_t conv_silu_bf16(const ConvTaps& c, const float (&x)[kConvWidth]) {
  return float_to_bf16(silu(conv_acc(c, x)));
}

// ---- steps 2-3: gate and beta ----

/// SIG(z) = DIV(1, 1 + EXP(0 - z)).
template <typename R>
R sigmoid(R z) {
  return R(1) / (R(1) + std::exp(R(0) - z));
}

/// Standard gate: g = -eA * softplus(x), x = a + dt_bias, eA = exp(A_log).
/// log(1 + exp(x)), not log1p: for x below about -17 (f32) softplus is exactly 0, as on the
/// GPU. The fma with +0 fixes the sign of a zero g (-eA * 0 + +0 = +0) as the kernels do,
/// which matters only for bitwise ring comparisons.
template <typename R>
R gate_standard(R x, R eA) {
  const R sp = (x <= R(kSoftplusThreshold)) ? std::log(R(1) + std::exp(x)) : x;
  return std::fma(-eA, sp, R(0));
}

/// Safe gate: g = lb * SIG(eA * x), in (lb, 0) for lb < 0.
template <typename R>
R gate_safe(R x, R eA, R lower_bound) {
  return lower_bound * sigmoid(eA * x);
}

template <typename R>
R gate(GateKind kind, R x, R eA, R lower_bound) {
  switch (kind) {
    case GateKind::kStandard:
      return gate_standard(x, eA);
    case GateKind::kSafe:
      return gate_safe(x, eA, lower_bound);
  }
  return R(0);  // unreachable: kind is validated at the API boundary
}

// ---- the reduction tree ----

/// Σ_k x[k] * y[k] in the contract's order, K in {64, 128}: partial j covers the K/32
/// consecutive k from j * K/32 as p = fma(x0, y0, x1 * y1); p = fma(x2, y2, p); ... (the
/// first pair's product is the addend), then the xor butterfly at distances 16, 8, 4, 2, 1
/// (p_j = p_j + p_{j^d}). Addition commutes, so after the step at distance d lanes j and j^d
/// hold the same bits; keeping lanes 0..d-1 is therefore enough for the next step, and lane 0
/// ends with the value every lane holds on the GPU.
template <typename R>
R tree_dot(const R* x, const R* y, int K) {
  const int m = K / kTreeLanes;
  R p[kTreeLanes];
  for (int j = 0; j < kTreeLanes; ++j) {
    const R* xj = x + j * m;
    const R* yj = y + j * m;
    R acc = std::fma(xj[0], yj[0], xj[1] * yj[1]);
    for (int i = 2; i < m; ++i) {
      acc = std::fma(xj[i], yj[i], acc);
    }
    p[j] = acc;
  }
  for (int d = kTreeLanes / 2; d >= 1; d /= 2) {
    for (int j = 0; j < d; ++j) {
      p[j] = p[j] + p[j + d];
    }
  }
  return p[0];
}

// ---- step 5: L2 norms ----

/// xn[k] = DIV(x[k], SQRT(Σx² + 1e-6)): element-wise division, eps inside the sqrt.
template <typename R>
void l2_normalize(const R* x, int K, R* xn) {
  const R norm = std::sqrt(tree_dot(x, x, K) + R(kNormEps));
  for (int k = 0; k < K; ++k) {
    xn[k] = x[k] / norm;
  }
}

/// K^-0.5 correctly rounded to R (0x3DB504F3 for K = 128 in f32, 0.125 for K = 64).
template <typename R>
R q_scale(int K) {
  return static_cast<R>(1.0 / std::sqrt(static_cast<double>(K)));
}

/// qs = l2_normalize(q) * K^-0.5 (normalise first, then scale).
template <typename R>
void normalize_q(const R* q, int K, R* qs) {
  l2_normalize(q, K, qs);
  const R scale = q_scale<R>(K);
  for (int k = 0; k < K; ++k) {
    qs[k] = qs[k] * scale;
  }
}

// ---- step 6: decay, delta rule, output (one head, S[v * K + k]) ----

/// Step 6.1: S[k][:] *= EXP(g[k]). `decay` is K values of workspace.
template <typename R>
void decay_state(R* S, const R* g, int K, int V, R* decay) {
  for (int k = 0; k < K; ++k) {
    decay[k] = std::exp(g[k]);
  }
  for (int v = 0; v < V; ++v) {
    R* s = S + static_cast<int64_t>(v) * K;
    for (int k = 0; k < K; ++k) {
      s[k] = s[k] * decay[k];
    }
  }
}

/// Step 6.3 given u: S[k][:] = fma(kn[k], u[:], S[k][:]).
template <typename R>
void rank1_update(R* S, const R* kn, const R* u, int K, int V) {
  for (int c = 0; c < V; ++c) {
    R* s = S + static_cast<int64_t>(c) * K;
    for (int k = 0; k < K; ++k) {
      s[k] = std::fma(kn[k], u[c], s[k]);
    }
  }
}

/// Steps 6.2-6.3 on the decayed state: u = (v - Σ_k S[k][:] kn[k]) * beta (subtract, then
/// scale) into `u` ([V]: the deferred commit's u record), then S[k][:] = fma(kn[k], u, S[k][:]).
template <typename R>
void delta_update(R* S, const R* kn, R beta, const R* v, int K, int V, R* u) {
  for (int c = 0; c < V; ++c) {
    u[c] = (v[c] - tree_dot(S + static_cast<int64_t>(c) * K, kn, K)) * beta;
  }
  rank1_update(S, kn, u, K, V);
}

/// Step 6.4 before the bf16 rounding: o[:] = Σ_k S[k][:] qs[k], from the updated state.
template <typename R>
void head_output(const R* S, const R* qs, int K, int V, R* o) {
  for (int c = 0; c < V; ++c) {
    o[c] = tree_dot(S + static_cast<int64_t>(c) * K, qs, K);
  }
}

}  // namespace kda::host::math
