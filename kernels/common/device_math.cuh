// device_math.cuh: the GPU instruction forms and the reduction tree of contract §3.
//
// Every kernel family (conv update, recurrent verify, fused verify, extend, fold) computes
// through these functions and nothing else, which is what makes their results bitwise
// identical. Compiled with --fmad=false: a multiply followed by an add is never contracted
// behind our back; every FMA below is written as fmaf on purpose.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "core/dtype.h"

namespace kda::kernels {

/// log2(e) as SGLang's Triton kernels multiply by it (0x3FB8AA3B).
constexpr float kLog2e = 1.4426950216293335f;

// ---- elementwise forms (contract §3 "GPU instruction forms") ----

/// EXP(x) = ex2.approx.f32(x * log2e), the multiply a separate RN f32 multiply.
__device__ __forceinline__ float kda_exp(float x) {
  float y;
  asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(__fmul_rn(x, kLog2e)));
  return y;
}

/// LOG = accurate logf (libdevice), not lg2.approx.
__device__ __forceinline__ float kda_log(float x) { return logf(x); }

/// DIV = div.full.f32 (approximate full-range division, as Triton's fp32 '/').
__device__ __forceinline__ float kda_div(float a, float b) {
  float r;
  asm("div.full.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

/// SQRT = sqrt.approx.ftz.f32.
__device__ __forceinline__ float kda_sqrt(float x) {
  float r;
  asm("sqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// ---- the same bits in fewer instructions, on the domain where the kernels use them ----
//
// In SASS (sm_90a), EXP's ex2.approx.f32 is a range test and two predicated multiplies around
// MUFU.EX2 (they keep subnormal results), and DIV's div.full.f32 is
//   |b| > 2^126: a, b *= 1/4;   |b| < 2^-126: a, b *= 2^24;   then MUFU.RCP(b), times a.
// Where an operand cannot reach a branch's range, the branch is dead weight: these forms drop
// it. They give the contract form's bits on their domain; tests/forms_gpu_test.cu checks every
// float input of each use (2^32 of them) on the device, and plants a bug to show it can fail.
// PTX promises neither that the .ftz ex2 nor that rcp times a gives these bits elsewhere, so the
// short forms are compiled only for the target they were checked on (sm_90); other
// targets (sm_100) compute the contract forms as written until forms_gpu_test has run there.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
#define KDA_SHORT_FORMS 1
#else
#define KDA_SHORT_FORMS 0
#endif

/// 1 + EXP(x) (inside SiLU, SIG and the softplus), for every x: ex2.approx.ftz.f32, one MUFU.EX2.
/// The .ftz form differs only where the input or the result of ex2 is subnormal, and there
/// 1 + either result rounds to 1. A stored EXP (the decay) keeps kda_exp: there a subnormal is a
/// value.
__device__ __forceinline__ float kda_one_plus_exp(float x) {
#if KDA_SHORT_FORMS
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(__fmul_rn(x, kLog2e)));
  return __fadd_rn(1.0f, y);
#else
  return __fadd_rn(1.0f, kda_exp(x));
#endif
}

/// DIV(a, b) for b >= 1, +inf or NaN (b = 1 + EXP(.) in SiLU and SIG): the small-divisor scaling
/// cannot apply, so it is left out (5 SASS instructions instead of 8).
__device__ __forceinline__ float kda_div_ge1(float a, float b) {
#if KDA_SHORT_FORMS
  float r;
  asm("{\n\t.reg .pred big;\n\t"
      "setp.gt.f32 big, %1, 0f7E800000;\n\t"  // b > 2^126
      "@big mul.rn.f32 %1, %1, 0f3E800000;\n\t"
      "@big mul.rn.f32 %2, %2, 0f3E800000;\n\t"
      "rcp.approx.ftz.f32 %0, %1;\n\t"
      "mul.rn.f32 %0, %0, %2;\n\t}"
      : "=f"(r), "+f"(b), "+f"(a));
  return r;
#else
  return kda_div(a, b);
#endif
}

/// DIV(a, b) for b = SQRT(s), s >= 1e-6, +inf or NaN (the q/k norms' denominator): b is in
/// [1e-3, 2^64], +inf or NaN, so neither scaling changes the result (for b = +inf the reciprocal
/// is 0 either way): DIV is MUFU.RCP(b) times a (2 SASS instructions instead of 8).
__device__ __forceinline__ float kda_div_by_norm(float a, float b) {
#if KDA_SHORT_FORMS
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(b));
  return __fmul_rn(r, a);
#else
  return kda_div(a, b);
#endif
}

/// SIG(z) = DIV(1, 1 + EXP(0 - z)).
__device__ __forceinline__ float kda_sigmoid(float z) {
  return kda_div_ge1(1.0f, kda_one_plus_exp(__fsub_rn(0.0f, z)));
}

/// SiLU then round to bf16 (rounding point #1: q, k, v enter the recurrence as bf16 values):
/// DIV(acc, 1 + EXP(0 - acc)).
__device__ __forceinline__ float silu_before_rounding(float acc) {
  return kda_div_ge1(acc, kda_one_plus_exp(__fsub_rn(0.0f, acc)));
}
__device__ __forceinline__ float silu_bf16(float acc) {
  return __bfloat162float(__float2bfloat16_rn(silu_before_rounding(acc)));
}

// ---- bf16 storage <-> f32 ----

__device__ __forceinline__ float bf16_bits_to_float(uint32_t bits) {
  return __uint_as_float(bits << 16);
}
/// The load alone (raw bits); bf16_bits_to_float converts at the use, so that a warp does not
/// stall on the data right after issuing the load while it still has loads to issue.
__device__ __forceinline__ uint32_t ld_bf16_bits(const bf16_t* p) { return p->bits; }
__device__ __forceinline__ float ld_bf16(const bf16_t* p) {
  return bf16_bits_to_float(ld_bf16_bits(p));
}
__device__ __forceinline__ bf16_t to_bf16(float x) {
  return bf16_t{__bfloat16_as_ushort(__float2bfloat16_rn(x))};
}

// ---- gates (contract §3 steps 2-3) ----

/// Standard gate: g = fma(-exp(A_log), softplus(x), +0); softplus(x) = x above 20.
__device__ __forceinline__ float gate_standard(float x, float exp_a_log) {
  // Computed whichever side is taken (x > 20 gives log(1 + exp(x)) = inf or a finite value,
  // unused): a select, not a branch, so a thread's gates can overlap.
  const float log1p_exp = kda_log(kda_one_plus_exp(x));
  const float sp = (x <= 20.0f) ? log1p_exp : x;
  return fmaf(-exp_a_log, sp, 0.0f);
}

/// Safe gate: g = lb * SIG(exp(A_log) * x), g in (lb, 0) for lb < 0.
__device__ __forceinline__ float gate_safe(float x, float exp_a_log, float lower_bound) {
  return __fmul_rn(lower_bound, kda_sigmoid(__fmul_rn(exp_a_log, x)));
}

// ---- the reduction tree (contract §3) ----
//
// A K-length dot product is 32 partials; partial j covers k = j*E .. j*E+E-1 (E = K/32),
// computed as p = fma(x0,y0, x1*y1); p = fma(x2,y2,p); p = fma(x3,y3,p), then combined by
// the xor-butterfly at distances 16, 8, 4, 2, 1 (p_j = p_j + p_{j^d}).
//
// A thread may own several partials: with P threads per dot product, thread c owns the
// NPT = 32/P partials j = c + P*i. Butterfly levels with d >= P then pair partials inside
// the thread (local index i with i + d/P), levels d < P pair lanes (shfl_xor d). The
// additions, and therefore the bits, are the same for every P: the tree, not the thread
// layout, is the contract. Lanes of one dot product must be P lanes kLaneStride apart (lane c of
// the dot at lane r + c*kLaneStride; consecutive lanes c = lane % P by default), and every lane
// of the warp must call the function (full-mask shuffles).

/// One partial over E consecutive elements (E = 2 or 4).
template <int E>
__device__ __forceinline__ float tree_partial(const float (&x)[E], const float (&y)[E]) {
  static_assert(E == 2 || E == 4, "K/32 must be 2 or 4 (K = 64 or 128)");
  float p = fmaf(x[0], y[0], __fmul_rn(x[1], y[1]));
  if constexpr (E == 4) {
    p = fmaf(x[2], y[2], p);
    p = fmaf(x[3], y[3], p);
  }
  return p;
}

/// The tree levels d = 16 .. P, inside the thread: this thread's NPT partials -> one value.
/// `r` is clobbered.
template <int NPT>
__device__ __forceinline__ float tree_in_thread(float (&r)[NPT]) {
#pragma unroll
  for (int dl = NPT / 2; dl >= 1; dl /= 2) {
#pragma unroll
    for (int i = 0; i < dl; ++i) {
      r[i] = __fadd_rn(r[i], r[i + dl]);
    }
  }
  return r[0];
}

/// The tree levels d = P/2 .. 1, across the P lanes (lane distance d * kLaneStride), for N
/// independent sums at once: level by level, so the N shuffle chains overlap (more independent
/// work per warp than one by one).
template <int P, int N, int kLaneStride = 1>
__device__ __forceinline__ void tree_across_lanes(float (&v)[N]) {
#pragma unroll
  for (int d = P / 2; d >= 1; d /= 2) {
#pragma unroll
    for (int n = 0; n < N; ++n) {
      v[n] = __fadd_rn(v[n], __shfl_xor_sync(0xffffffffu, v[n], d * kLaneStride));
    }
  }
}

/// The tree levels d = P/2 .. 1 for CPT sums per thread whose lanes need only one root each
/// (reduce-scatter): at a level, a lane adds its partner's values of half of its columns and
/// leaves the other half to the partner, until it holds one column; the levels left add as in
/// tree_across_lanes. Per set of CPT sums, tree_across_lanes adds every column in every lane,
/// CPT * log2(P) shuffles and adds per thread; this form (CPT - 1) + log2(P / CPT) of each (4,
/// not 12, at P = 8, CPT = 4). For the partners' halves to line up without a select per value,
/// register j of lane c must hold column j ^ column_swizzle<P, CPT>(c); register 0 then ends as the
/// root of column column_swizzle(c), in the P / CPT lanes that share c / (P / CPT). The pairs added
/// are the tree's (p_j + p_{j^d}; a + b and b + a are the same bits), so are the results. N
/// independent sets go level by level, so their shuffle chains overlap.
template <int P, int CPT>
__device__ __forceinline__ int column_swizzle(int c) {
  static_assert(CPT >= 1 && CPT <= P && (CPT & (CPT - 1)) == 0, "CPT: a power of two <= P");
  return c / (P / CPT);
}
template <int P, int CPT, int N>
__device__ __forceinline__ void tree_reduce_scatter(float (&v)[N][CPT]) {
#pragma unroll
  for (int d = P / 2; d >= 1; d /= 2) {
    // Columns kept at this level: CPT * d / P while that halves them, then one.
    const int keep = CPT * d / P;
#pragma unroll
    for (int x = 0; x < N; ++x) {
      if (keep >= 1) {
#pragma unroll
        for (int i = 0; i < keep; ++i) {
          v[x][i] = __fadd_rn(v[x][i], __shfl_xor_sync(0xffffffffu, v[x][i + keep], d));
        }
      } else {
        v[x][0] = __fadd_rn(v[x][0], __shfl_xor_sync(0xffffffffu, v[x][0], d));
      }
    }
  }
}

/// The inverse of tree_reduce_scatter's halving levels: from register 0 (column
/// column_swizzle(c), as tree_reduce_scatter leaves it) to all CPT registers in the swizzled
/// order (register j: column j ^ column_swizzle(c)); CPT - 1 shuffles.
template <int P, int CPT>
__device__ __forceinline__ void column_all_gather(float (&v)[CPT]) {
#pragma unroll
  for (int n = 1; n < CPT; n *= 2) {
#pragma unroll
    for (int i = 0; i < n; ++i) {
      v[i + n] = __shfl_xor_sync(0xffffffffu, v[i], n * (P / CPT));
    }
  }
}

/// Combines this thread's NPT partials and the P lanes' into the tree's root (all P lanes
/// return the same bits). `r` is clobbered.
template <int P, int NPT, int kLaneStride = 1>
__device__ __forceinline__ float tree_combine(float (&r)[NPT]) {
  static_assert(P * NPT == 32, "32 partials per dot product");
  float v[1] = {tree_in_thread<NPT>(r)};
  tree_across_lanes<P, 1, kLaneStride>(v);
  return v[0];
}

/// Tree dot product of this thread's slice x[NPT][E] with y[NPT][E].
template <int P, int NPT, int E, int kLaneStride = 1>
__device__ __forceinline__ float tree_dot(const float (&x)[NPT][E], const float (&y)[NPT][E]) {
  float r[NPT];
#pragma unroll
  for (int i = 0; i < NPT; ++i) {
    r[i] = tree_partial<E>(x[i], y[i]);
  }
  return tree_combine<P, NPT, kLaneStride>(r);
}

// ---- small vector loads of E floats (E = 2 or 4), 8/16-byte aligned ----

template <int E>
__device__ __forceinline__ void load_vec(float (&dst)[E], const float* src) {
  if constexpr (E == 4) {
    const float4 v = *reinterpret_cast<const float4*>(src);
    dst[0] = v.x;
    dst[1] = v.y;
    dst[2] = v.z;
    dst[3] = v.w;
  } else {
    const float2 v = *reinterpret_cast<const float2*>(src);
    dst[0] = v.x;
    dst[1] = v.y;
  }
}

template <int E>
__device__ __forceinline__ void store_vec(float* dst, const float (&src)[E]) {
  if constexpr (E == 4) {
    *reinterpret_cast<float4*>(dst) = make_float4(src[0], src[1], src[2], src[3]);
  } else {
    *reinterpret_cast<float2*>(dst) = make_float2(src[0], src[1]);
  }
}

/// Cache policy of a global store. kStreaming (st.global.cs, evict first): data written once
/// and mostly never read again (snapshot mode's per-step states), so that it does not push
/// reused data (committed states, inputs, weights) out of L2.
enum class StoreHint { kDefault, kStreaming };

/// Global vector store of E floats (st.global[.cs].v4/v2: nvcc split the plain float4 store of
/// a computed address into four scalar stores).
template <int E, StoreHint kHint = StoreHint::kDefault>
__device__ __forceinline__ void store_vec_global(float* dst, const float (&src)[E]) {
  if constexpr (kHint == StoreHint::kStreaming) {
    if constexpr (E == 4) {
      asm volatile("st.global.cs.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "f"(src[0]),
                   "f"(src[1]), "f"(src[2]), "f"(src[3])
                   : "memory");
    } else {
      asm volatile("st.global.cs.v2.f32 [%0], {%1, %2};" ::"l"(dst), "f"(src[0]), "f"(src[1])
                   : "memory");
    }
  } else if constexpr (E == 4) {
    asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "f"(src[0]), "f"(src[1]),
                 "f"(src[2]), "f"(src[3])
                 : "memory");
  } else {
    asm volatile("st.global.v2.f32 [%0], {%1, %2};" ::"l"(dst), "f"(src[0]), "f"(src[1])
                 : "memory");
  }
}

// ---- bf16 pairs (two adjacent channels, 4-byte aligned) ----

__device__ __forceinline__ float2 bf16x2_bits_to_float2(uint32_t u) {
  return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}
/// The load alone (raw bits of the pair, low channel in the low half); see ld_bf16_bits.
__device__ __forceinline__ uint32_t ld_bf16x2_bits(const bf16_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}
__device__ __forceinline__ float2 ld_bf16x2(const bf16_t* p) {
  return bf16x2_bits_to_float2(ld_bf16x2_bits(p));
}
__device__ __forceinline__ void st_bf16x2(bf16_t* p, float lo, float hi) {
  const uint32_t u = static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
                     (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
  *reinterpret_cast<uint32_t*>(p) = u;
}

/// threadIdx.x, read where it is called: a loop over work items that takes its index arithmetic
/// from here computes it per item rather than holding it in registers across the loop.
__device__ __forceinline__ int thread_index_opaque() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}

// ---- programmatic dependent launch (sm_90+; no-ops when launched without the attribute) ----

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
/// The kernels' PDL entry: wait for the previous kernel, then let the next one launch. Every
/// kernel of this module but a deferred verify with VerifyParams::fold_before_wait (see
/// deferred_triggers_at_entry) triggers only after its wait, so a kernel launched after such a
/// kernel starts after every kernel launched before it has completed (fold_before_wait relies on
/// it).
__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  pdl_launch_dependents();
}

}  // namespace kda::kernels
