// delta_rule.cuh: the per-step recurrence on one thread's slice of a state column, and the
// warp-level q/k L2 normalisation — shared by verify (fused and unfused), extend and fold.
//
// State slice: a v-column S[:, v] (K contiguous in memory, contract §2) is split over P
// consecutive lanes; lane c holds the NPT = 32/P tree partials j = c + P*i, each E = K/32
// consecutive k: S[i][e] = S[k = (c + P*i)*E + e][v]. Per-step vectors (kn, qs, decay) live
// in shared memory as [K] f32 and are read at the same k.
#pragma once

#include "kernels/device_math.cuh"

namespace kda::kernels {

/// Compile-time shape of a column slice: K (64|128) split over P lanes.
template <int K_, int P_>
struct ColumnSlice {
  static constexpr int K = K_;
  static constexpr int P = P_;
  static constexpr int E = K / 32;
  static constexpr int NPT = 32 / P;
  static_assert(K == 64 || K == 128, "K must be 64 or 128 (contract §2)");
  static_assert(P >= 1 && P <= 32 && (P & (P - 1)) == 0, "P must be a power of two <= 32");

  /// First k of this lane's i-th partial.
  static __device__ __forceinline__ int k_of(int c, int i) { return (c + P * i) * E; }
};

template <typename Slice>
using SliceRegs = float[Slice::NPT][Slice::E];

/// Loads a [K] smem vector at this lane's k positions.
template <typename Slice>
__device__ __forceinline__ void load_slice(SliceRegs<Slice>& dst, const float* vec, int c) {
#pragma unroll
  for (int i = 0; i < Slice::NPT; ++i) {
    load_vec<Slice::E>(dst[i], vec + Slice::k_of(c, i));
  }
}

/// Stores this lane's slice to a [K] column in global memory.
template <typename Slice>
__device__ __forceinline__ void store_slice(float* col, const SliceRegs<Slice>& src, int c) {
#pragma unroll
  for (int i = 0; i < Slice::NPT; ++i) {
    store_vec<Slice::E>(col + Slice::k_of(c, i), src[i]);
  }
}

/// One gated delta-rule step (contract §3 step 6, without the output):
///   S[k][v] = S[k][v] * exp(g[k])
///   u       = (v - sum_k S[k][v] * kn[k]) * beta
///   S[k][v] = fma(kn[k], u, S[k][v])
/// `decay` = EXP(g) per k, `kn` = normalised k, both [K] in shared memory.
template <typename Slice>
__device__ __forceinline__ void delta_rule_step(SliceRegs<Slice>& S, const float* kn_vec,
                                                const float* decay_vec, float v, float beta,
                                                int c) {
  SliceRegs<Slice> kn, decay;
  load_slice<Slice>(kn, kn_vec, c);
  load_slice<Slice>(decay, decay_vec, c);
#pragma unroll
  for (int i = 0; i < Slice::NPT; ++i) {
#pragma unroll
    for (int e = 0; e < Slice::E; ++e) {
      S[i][e] = __fmul_rn(S[i][e], decay[i][e]);
    }
  }
  const float kv = tree_dot<Slice::P, Slice::NPT, Slice::E>(S, kn);
  const float u = __fmul_rn(__fsub_rn(v, kv), beta);
#pragma unroll
  for (int i = 0; i < Slice::NPT; ++i) {
#pragma unroll
    for (int e = 0; e < Slice::E; ++e) {
      S[i][e] = fmaf(kn[i][e], u, S[i][e]);
    }
  }
}

/// o = sum_k S[k][v] * qs[k] through the tree (all P lanes get the same bits).
template <typename Slice>
__device__ __forceinline__ float output_dot(const SliceRegs<Slice>& S, const float* qs_vec,
                                            int c) {
  SliceRegs<Slice> qs;
  load_slice<Slice>(qs, qs_vec, c);
  return tree_dot<Slice::P, Slice::NPT, Slice::E>(S, qs);
}

/// In-place L2 normalisation of a [K] smem vector by one whole warp (lane j owns partial j):
///   x[k] = DIV(x[k], SQRT(sum x^2 + 1e-6)) * scale     (scale = 1 for k, K^-0.5 for q)
template <int K>
__device__ __forceinline__ void l2_normalize_warp(float* vec, float scale, bool apply_scale,
                                                  int lane) {
  constexpr int E = K / 32;
  float x[1][E];
  load_vec<E>(x[0], vec + lane * E);
  const float sumsq = tree_dot<32, 1, E>(x, x);
  const float denom = kda_sqrt(__fadd_rn(sumsq, 1e-6f));
#pragma unroll
  for (int e = 0; e < E; ++e) {
    x[0][e] = kda_div(x[0][e], denom);
    if (apply_scale) {
      x[0][e] = __fmul_rn(x[0][e], scale);
    }
  }
  store_vec<E>(vec + lane * E, x[0]);
}

/// K^-0.5 as f32 (0x3DB504F3 for K = 128).
template <int K>
inline constexpr float kQkScale = K == 64 ? 0.125f : 0.08838834764831845f;

}  // namespace kda::kernels
