// delta_rule.cuh: the per-step recurrence on one thread's slice of CPT state columns, and the
// warp-level q/k L2 normalisation — shared by verify (fused and unfused), extend and fold.
//
// Column tile: a v-column S[:, v] (K contiguous in memory, contract §2) is split over P lanes
// kLaneStride apart (lanes r + c*kLaneStride, c < P; consecutive lanes when kLaneStride = 1);
// lane c holds the NPT = 32/P tree partials j = c + P*i, each E = K/32 consecutive k, of CPT
// columns: S[j][i][e] = S[k = (c + P*i)*E + e][v_j]. Holding several columns per thread lets one
// shared-memory load of kn / decay / qs serve CPT columns; with kLaneStride > 1, neighbouring
// lanes load the same slice, which halves a warp's 128-bit shared-load requests.
// Per-step vectors (kn, qs, decay) live in shared memory as [K] f32.
#pragma once

#include "kernels/common/device_math.cuh"

namespace kda::kernels {

/// Compile-time shape of a thread's column slice: K (64|128) split over P lanes kLaneStride apart,
/// CPT columns.
template <int K_, int P_, int CPT_, int kLaneStride_ = 1>
struct ColumnSlice {
  static constexpr int K = K_;
  static constexpr int P = P_;
  static constexpr int CPT = CPT_;
  static constexpr int kLaneStride = kLaneStride_;
  static constexpr int E = K / 32;
  static constexpr int NPT = 32 / P;
  static_assert(K == 64 || K == 128, "K must be 64 or 128 (contract §2)");
  static_assert(P >= 1 && P <= 32 && (P & (P - 1)) == 0, "P must be a power of two <= 32");
  static_assert(CPT >= 1 && CPT <= 8, "CPT columns per thread");
  static_assert(kLaneStride >= 1 && P * kLaneStride <= 32 && 32 % (P * kLaneStride) == 0,
                "a column's lanes lie in one warp");

  /// First k of this lane's i-th partial.
  static __device__ __forceinline__ int k_of(int c, int i) { return (c + P * i) * E; }
};

/// One column's slice of K/P values.
template <typename Slice>
using ColRegs = float[Slice::NPT][Slice::E];

/// Loads this lane's slice of a [K] vector in shared memory (the per-step kn / decay / qs, a
/// staged state column).
template <typename Slice>
__device__ __forceinline__ void load_slice(ColRegs<Slice>& dst, const float* vec, int c) {
#pragma unroll
  for (int i = 0; i < Slice::NPT; ++i) {
    load_vec<Slice::E>(dst[i], vec + Slice::k_of(c, i));
  }
}

/// Stores this lane's slice to a [K] vector in shared memory (load_slice's layout).
template <typename Slice>
__device__ __forceinline__ void store_slice(float* vec, const ColRegs<Slice>& src, int c) {
#pragma unroll
  for (int i = 0; i < Slice::NPT; ++i) {
    store_vec<Slice::E>(vec + Slice::k_of(c, i), src[i]);
  }
}

/// Loads this lane's slice of a [K] column from global memory (16/8-byte vector loads). The
/// lane's first k is added once; partial i is then a constant offset P*E*i from it, so the
/// loads take immediate offsets instead of one 64-bit address each.
template <typename Slice>
__device__ __forceinline__ void load_column(ColRegs<Slice>& dst, const float* col, int c) {
  const float* lane = col + Slice::k_of(c, 0);
#pragma unroll
  for (int i = 0; i < Slice::NPT; ++i) {
    load_vec<Slice::E>(dst[i], lane + Slice::k_of(0, i));
  }
}

/// Stores this lane's slice to a [K] column in global memory (16/8-byte vector stores;
/// addressed as in load_column) with cache policy kHint.
template <typename Slice, StoreHint kHint = StoreHint::kDefault>
__device__ __forceinline__ void store_column(float* col, const ColRegs<Slice>& src, int c) {
  float* lane = col + Slice::k_of(c, 0);
#pragma unroll
  for (int i = 0; i < Slice::NPT; ++i) {
    store_vec_global<Slice::E, kHint>(lane + Slice::k_of(0, i), src[i]);
  }
}

/// The same stores as store_column, each with its own address: the persistent verify's
/// snapshots use this form, with which ptxas allocates that kernel without spills at the
/// 128-register cap (the lane-base form spills there).
template <typename Slice, StoreHint kHint = StoreHint::kDefault>
__device__ __forceinline__ void store_column_per_partial(float* col, const ColRegs<Slice>& src,
                                                         int c) {
#pragma unroll
  for (int i = 0; i < Slice::NPT; ++i) {
    store_vec_global<Slice::E, kHint>(col + Slice::k_of(c, i), src[i]);
  }
}

// The step split into pieces, so that a caller can overlap independent trees (the persistent
// verify runs step t's output dot and step t+1's key dot through the cross-lane levels
// together, as reduce-scatters: device_math.cuh tree_reduce_scatter):
//   decay_and_key_partials -> cross-lane levels -> u -> apply_update   is one delta-rule step,
//   query_partials -> cross-lane levels                                is the output dot.
// `part` arrays hold one value per column: this thread's part of the tree (levels d >= P)
// until the cross-lane levels have combined the P lanes. These pieces work on registers
// j = 0..CPT-1 whatever columns they hold, so a caller may hold its columns swizzled.

/// S[k][v] = S[k][v] * exp(g[k]) (`decay_vec` = EXP(g), [K] smem) on CPT columns, and each
/// column's in-thread part of sum_k S[k][v] * kn[k] (`kn_vec`, [K] smem) into part[j].
template <typename Slice>
__device__ __forceinline__ void decay_and_key_partials(ColRegs<Slice> (&S)[Slice::CPT],
                                                       const float* kn_vec, const float* decay_vec,
                                                       int c, float* part) {
  float r[Slice::CPT][Slice::NPT];
#pragma unroll
  for (int i = 0; i < Slice::NPT; ++i) {
    float decay[Slice::E], kn[Slice::E];
    load_vec<Slice::E>(decay, decay_vec + Slice::k_of(c, i));
    load_vec<Slice::E>(kn, kn_vec + Slice::k_of(c, i));
#pragma unroll
    for (int j = 0; j < Slice::CPT; ++j) {
#pragma unroll
      for (int e = 0; e < Slice::E; ++e) {
        S[j][i][e] = __fmul_rn(S[j][i][e], decay[e]);
      }
      r[j][i] = tree_partial<Slice::E>(S[j][i], kn);
    }
  }
#pragma unroll
  for (int j = 0; j < Slice::CPT; ++j) {
    part[j] = tree_in_thread<Slice::NPT>(r[j]);
  }
}

/// Each column's in-thread part of sum_k S[k][v] * qs[k] (`qs_vec`, [K] smem) into part[j].
template <typename Slice>
__device__ __forceinline__ void query_partials(const ColRegs<Slice> (&S)[Slice::CPT],
                                               const float* qs_vec, int c, float* part) {
  float r[Slice::CPT][Slice::NPT];
#pragma unroll
  for (int i = 0; i < Slice::NPT; ++i) {
    float qs[Slice::E];
    load_vec<Slice::E>(qs, qs_vec + Slice::k_of(c, i));
#pragma unroll
    for (int j = 0; j < Slice::CPT; ++j) {
      r[j][i] = tree_partial<Slice::E>(S[j][i], qs);
    }
  }
#pragma unroll
  for (int j = 0; j < Slice::CPT; ++j) {
    part[j] = tree_in_thread<Slice::NPT>(r[j]);
  }
}

/// The rest of the step, given u_j = (v_j - sum_k S[k][v_j] * kn[k]) * beta (whole tree):
///   S[k][v_j] = fma(kn[k], u_j, S[k][v_j])
template <typename Slice>
__device__ __forceinline__ void apply_update(ColRegs<Slice> (&S)[Slice::CPT], const float* kn_vec,
                                             const float (&u)[Slice::CPT], int c) {
#pragma unroll
  for (int i = 0; i < Slice::NPT; ++i) {
    float kn[Slice::E];
    load_vec<Slice::E>(kn, kn_vec + Slice::k_of(c, i));
#pragma unroll
    for (int j = 0; j < Slice::CPT; ++j) {
#pragma unroll
      for (int e = 0; e < Slice::E; ++e) {
        S[j][i][e] = fmaf(kn[e], u[j], S[j][i][e]);
      }
    }
  }
}

/// One gated delta-rule step in one piece (same operations per value as the split form): the
/// kn slice stays in registers from the dot to the update, one shared-memory load fewer per
/// step. The per-item verify tiles (latency-bound, small B) and the fold use it.
///   S[k][v] = S[k][v] * exp(g[k])
///   u_v     = (v - sum_k S[k][v] * kn[k]) * beta
///   S[k][v] = fma(kn[k], u_v, S[k][v])
/// `decay` = EXP(g) per k and `kn` = normalised k, both [K] in shared memory; v[j] is the
/// value of column j.
/// `u` receives each column's u (every lane of the column the same bits: the deferred commit's
/// u record).
template <typename Slice>
__device__ __forceinline__ void delta_rule_step(ColRegs<Slice> (&S)[Slice::CPT],
                                                const float* kn_vec, const float* decay_vec,
                                                const float (&v)[Slice::CPT], float beta, int c,
                                                float (&u)[Slice::CPT]) {
  {
    ColRegs<Slice> decay;
    load_slice<Slice>(decay, decay_vec, c);
#pragma unroll
    for (int j = 0; j < Slice::CPT; ++j) {
#pragma unroll
      for (int i = 0; i < Slice::NPT; ++i) {
#pragma unroll
        for (int e = 0; e < Slice::E; ++e) {
          S[j][i][e] = __fmul_rn(S[j][i][e], decay[i][e]);
        }
      }
    }
  }
  ColRegs<Slice> kn;
  load_slice<Slice>(kn, kn_vec, c);
#pragma unroll
  for (int j = 0; j < Slice::CPT; ++j) {
    const float kv = tree_dot<Slice::P, Slice::NPT, Slice::E, Slice::kLaneStride>(S[j], kn);
    u[j] = __fmul_rn(__fsub_rn(v[j], kv), beta);
  }
#pragma unroll
  for (int j = 0; j < Slice::CPT; ++j) {
#pragma unroll
    for (int i = 0; i < Slice::NPT; ++i) {
#pragma unroll
      for (int e = 0; e < Slice::E; ++e) {
        S[j][i][e] = fmaf(kn[i][e], u[j], S[j][i][e]);
      }
    }
  }
}

template <typename Slice>
__device__ __forceinline__ void delta_rule_step(ColRegs<Slice> (&S)[Slice::CPT],
                                                const float* kn_vec, const float* decay_vec,
                                                const float (&v)[Slice::CPT], float beta, int c) {
  float u[Slice::CPT];
  delta_rule_step<Slice>(S, kn_vec, decay_vec, v, beta, c, u);
}

/// delta_rule_step given each column's u (a u record of the deferred commit: the u that
/// delta_rule_step computes from this state, bitwise), so without the key dot and its tree:
///   S[k][v] = S[k][v] * exp(g[k]);  S[k][v] = fma(kn[k], u_v, S[k][v])
/// The same operations on every state value as delta_rule_step, so the same bits.
template <typename Slice>
__device__ __forceinline__ void delta_rule_step_given_u(ColRegs<Slice> (&S)[Slice::CPT],
                                                        const float* kn_vec, const float* decay_vec,
                                                        const float (&u)[Slice::CPT], int c) {
#pragma unroll
  for (int i = 0; i < Slice::NPT; ++i) {
    float decay[Slice::E], kn[Slice::E];
    load_vec<Slice::E>(decay, decay_vec + Slice::k_of(c, i));
    load_vec<Slice::E>(kn, kn_vec + Slice::k_of(c, i));
#pragma unroll
    for (int j = 0; j < Slice::CPT; ++j) {
#pragma unroll
      for (int e = 0; e < Slice::E; ++e) {
        S[j][i][e] = fmaf(kn[e], u[j], __fmul_rn(S[j][i][e], decay[e]));
      }
    }
  }
}

/// o_j = sum_k S[k][v_j] * qs[k] through the tree (all P lanes get the same bits).
template <typename Slice>
__device__ __forceinline__ void output_dot(const ColRegs<Slice> (&S)[Slice::CPT],
                                           const float* qs_vec, int c, float (&o)[Slice::CPT]) {
  ColRegs<Slice> qs;
  load_slice<Slice>(qs, qs_vec, c);
#pragma unroll
  for (int j = 0; j < Slice::CPT; ++j) {
    o[j] = tree_dot<Slice::P, Slice::NPT, Slice::E, Slice::kLaneStride>(S[j], qs);
  }
}

/// In-place L2 normalisation of a [K] smem vector by one whole warp (lane j owns partial j):
///   x[k] = DIV(x[k], SQRT(sum x^2 + 1e-6)) * scale     (scale = 1 for k, K^-0.5 for q)
template <int K>
__device__ __forceinline__ void l2_normalize_warp(float* vec, float scale, bool apply_scale,
                                                  int lane);

/// The normalisation's second half, on this lane's E elements: x[e] = DIV(x[e], SQRT(sumsq +
/// 1e-6)) * (apply_scale ? scale : 1), with sumsq the vector's sum of squares.
template <int E>
__device__ __forceinline__ void divide_by_norm(float (&x)[E], float sumsq, float scale,
                                               bool apply_scale) {
  const float denom = kda_sqrt(__fadd_rn(sumsq, 1e-6f));
#pragma unroll
  for (int e = 0; e < E; ++e) {
    // x * 1 is x (no flush to zero in these kernels): a multiply by a selected factor, not a
    // branch per element, so the E divisions overlap.
    x[e] = __fmul_rn(kda_div_by_norm(x[e], denom), apply_scale ? scale : 1.0f);
  }
}

/// The same normalisation on a vector already in the warp's registers: lane j holds
/// x[k = j*E .. j*E+E-1], E = K/32 (every lane gets the same denominator bits).
template <int K>
__device__ __forceinline__ void l2_normalize_regs(float (&x)[K / 32], float scale,
                                                  bool apply_scale) {
  constexpr int E = K / 32;
  const float(&row)[1][E] = reinterpret_cast<const float(&)[1][E]>(x);
  const float sumsq = tree_dot<32, 1, E>(row, row);
  divide_by_norm<E>(x, sumsq, scale, apply_scale);
}

template <int K>
__device__ __forceinline__ void l2_normalize_warp(float* vec, float scale, bool apply_scale,
                                                  int lane) {
  constexpr int E = K / 32;
  float x[E];
  load_vec<E>(x, vec + lane * E);
  l2_normalize_regs<K>(x, scale, apply_scale);
  store_vec<E>(vec + lane * E, x);
}

/// l2_normalize_warp on N vectors at once: vector i at `vecs[i]`, skipped where !on[i] (both
/// warp-uniform), scaled where scaled[i]. The N trees go level by level, so their shuffle
/// chains overlap; per vector the operations are l2_normalize_regs's, so the bits are equal.
template <int K, int N>
__device__ __forceinline__ void l2_normalize_warp_n(float* const (&vecs)[N], const bool (&on)[N],
                                                    const bool (&scaled)[N], float scale,
                                                    int lane) {
  constexpr int E = K / 32;
  float x[N][E];
  float sumsq[N];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if (on[i]) {
      load_vec<E>(x[i], vecs[i] + lane * E);
    } else {
#pragma unroll
      for (int e = 0; e < E; ++e) {
        x[i][e] = 0.0f;
      }
    }
    sumsq[i] = tree_partial<E>(x[i], x[i]);
  }
  tree_across_lanes<32, N>(sumsq);
#pragma unroll
  for (int i = 0; i < N; ++i) {
    divide_by_norm<E>(x[i], sumsq[i], scale, scaled[i]);
    if (on[i]) {
      store_vec<E>(vecs[i] + lane * E, x[i]);
    }
  }
}

/// K^-0.5 as f32 (0x3DB504F3 for K = 128).
template <int K>
inline constexpr float kQkScale = K == 64 ? 0.125f : 0.08838834764831845f;

}  // namespace kda::kernels
