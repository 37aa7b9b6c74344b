// verify_tile.cuh: the verify / extend kernel. One CTA = (V tile, v-head hv, request n).
//
// Grid (ceil(V/BV), HV, B), 256 threads.
// Recurrence layout: thread tid = group*P + c owns columns v0 + group*CPT + j (j < CPT) of the
//   state tile; lanes c split K as in delta_rule.cuh (P = 8 lanes per column for BV >= 32,
//   else 256/BV; CPT = BV*P/256 columns per thread).
// Per chunk of up to kChunk tokens:
//   1. q/k (2K channels of k-head h) and v (the BV channels of this tile) for every token,
//      two adjacent channels per thread (bf16x2 loads/stores): FUSED: conv + SiLU from
//      mixed_qkv and the conv history (window kept in registers); unfused: read back from
//      qkv_act, written by the conv-update kernel.
//   2. gates -> EXP(g) and beta into shared memory; 3. q/k L2 norms, one warp per vector;
//   4. the delta rule over the chunk's tokens, output + snapshot per step.
// Record writes (verify only): ring rawk (pre-norm k) by the q/k owner CTA (tile 0 of the
// first v-head of the group: one writer per k-head); ring g/beta by tile 0 of each v-head;
// ring rawv and conv windows of v channels by every CTA for its slice; q/k windows by the
// q/k owner. Ring steps t >= L are never written.
// Verify reads ssm_state and conv_state and never writes them (the conv-state write-back
// race of upstream is impossible by construction). Extend writes the final state of its own
// columns to ssm_out (race-free: each CTA reads and writes only its own columns); the conv
// state of extend is updated by a separate kernel afterwards.
// slot < 0: the CTA zeroes its output rows and reads nothing else of the request.
// Alignment (checked by the launchers): V even, every bf16 row/slot stride even and bf16
// base pointers 4-byte aligned (channel pairs), conv weights 16-byte aligned.
// Offsets are 64-bit.
#pragma once

#include <cstdint>

#include "kernels/conv.cuh"
#include "kernels/delta_rule.cuh"
#include "kernels/kda_params.h"

namespace kda::kernels {

/// Kernel argument: the layer's params plus what extend adds.
struct TileArgs {
  VerifyParams p;
  float* ssm_out;  ///< extend only: [S, HV, V, K] final state
  int32_t extend;  ///< 1: extend (no records, final state to ssm_out); 0: verify
};

template <int K_, int BV_>
struct TileConfig {
  static constexpr int K = K_;
  static constexpr int BV = BV_;
  static constexpr int kThreads = 256;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int P = BV >= 32 ? 8 : kThreads / BV;  ///< lanes per state column
  static constexpr int CPT = BV * P / kThreads;           ///< columns per thread
  static constexpr int kChunk = 8;                        ///< tokens per prologue chunk
  static constexpr int kPairs = (2 * K + BV) / 2;         ///< channel pairs per CTA
  using Slice = ColumnSlice<K, P, CPT>;
  static_assert(BV >= 8 && BV <= 128 && BV % 2 == 0, "BV must be even, in [8, 128]");
  static_assert(kPairs <= kThreads, "one channel pair per thread");
  static_assert(kThreads / P * CPT == BV, "the threads cover the tile");
};

/// Shared memory of one CTA (static, < 48 KiB).
template <typename Cfg>
struct TileSmem {
  float qk[Cfg::kChunk][2][Cfg::K];  ///< [t][0] = q -> qs, [t][1] = k -> kn
  float decay[Cfg::kChunk][Cfg::K];  ///< EXP(g)
  float v[Cfg::kChunk][Cfg::BV];     ///< bf16-valued v of this tile
  float beta[Cfg::kChunk];
};

/// Conv taps of an (even, odd) channel pair: weights [D, 4] and bias [D] of WeightT.
template <typename WeightT>
__device__ __forceinline__ void load_conv_pair(const void* weight, const void* bias, int64_t ch,
                                               ConvTaps& t0, ConvTaps& t1) {
  t0 = load_conv_taps<WeightT>(weight, bias, ch);
  t1 = load_conv_taps<WeightT>(weight, bias, ch + 1);
}

template <typename WeightT, int K, int BV, bool FUSED>
__global__ void __launch_bounds__(256, 2)
    verify_tile_kernel(const __grid_constant__ TileArgs args) {
  using Cfg = TileConfig<K, BV>;
  using Slice = typename Cfg::Slice;
  constexpr int P = Cfg::P;
  constexpr int CPT = Cfg::CPT;
  const VerifyParams& p = args.p;
  __shared__ __align__(16) TileSmem<Cfg> sm;

  const int tile = blockIdx.x;
  const int hv = blockIdx.y;
  const int n = blockIdx.z;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int G = p.HV / p.H;
  const int h = hv / G;
  const int v0 = tile * BV;
  const int group = tid / P;
  const int c = tid % P;
  const int col0 = v0 + group * CPT;  // this thread's first column
  const int T = p.T;
  const int64_t D = qkv_dim(p);
  const int64_t HK = static_cast<int64_t>(p.H) * K;

  // This thread's channel pair (ch_local, ch_local + 1): [0, K) q of head h, [K, 2K) k of
  // head h, [2K, 2K+BV) the v tile. gch = global channel of the pair's first, or -1.
  const int ch_local = 2 * tid;
  int64_t gch = -1;
  if (tid < Cfg::kPairs) {
    if (ch_local < 2 * K) {
      gch = (ch_local / K) * HK + static_cast<int64_t>(h) * K + (ch_local % K);
    } else if (v0 + ch_local - 2 * K < p.V) {
      gch = 2 * HK + static_cast<int64_t>(hv) * p.V + v0 + ch_local - 2 * K;
    }
  }
  const bool is_qk = ch_local < 2 * K;
  const bool is_k = is_qk && ch_local >= K;

  // Weights are static: load them before waiting on the previous kernel (PDL).
  ConvTaps taps0, taps1;
  if (FUSED && gch >= 0) {
    load_conv_pair<WeightT>(p.conv_weight, p.conv_bias, gch, taps0, taps1);
  }
  // Gate work: thread owns key channel gk = tid % K for tokens tid/K, +kGateStep, ...
  constexpr int kGateStep = Cfg::kThreads / K;
  constexpr int kGateIters = Cfg::kChunk / kGateStep;
  static_assert(Cfg::kThreads % K == 0 && Cfg::kChunk % kGateStep == 0, "gate work split");
  const int gk = tid % K;
  const int gt0 = tid / K;
  const int64_t ghk = static_cast<int64_t>(hv) * K + gk;
  const float dt_bias = p.dt_bias[ghk];
  const float exp_a_log = kda_exp(p.A_log[hv]);

  // The committed state and the activations come from earlier kernels: wait for them.
  pdl_wait();
  pdl_launch_dependents();

  const int slot = p.slots[n];
  if (slot < 0) {  // padding row: zero outputs, touch nothing else
    for (int t = 0; t < T; ++t) {
      bf16_t* out_row = p.out + ((static_cast<int64_t>(n) * T + t) * p.HV + hv) * p.V;
      for (int j = tid; j < BV && v0 + j < p.V; j += Cfg::kThreads) {
        out_row[v0 + j] = bf16_t{0};
      }
    }
    return;
  }
  const bool extend = args.extend != 0;
  const bool ring = !extend && p.mode == RecordMode::kRing;
  const bool snap = !extend && p.mode == RecordMode::kSnapshot;
  const int64_t row = extend ? 0 : p.rows[n];
  const bool qk_owner = tile == 0 && hv % G == 0;
  const bool gate_owner = tile == 0;
  const bool write_window = !extend && FUSED && gch >= 0 && (is_qk ? qk_owner : true);

  // Start the state load first: at large B this is the dominant HBM traffic.
  ColRegs<Slice> S[CPT];
  bool col_ok[CPT];
  const float* s_base = p.ssm_state + slot * p.ssm_slot_stride + static_cast<int64_t>(hv) * p.V * K;
#pragma unroll
  for (int j = 0; j < CPT; ++j) {
    col_ok[j] = col0 + j < p.V;
    if (col_ok[j]) {
      load_column<Slice>(S[j], s_base + static_cast<int64_t>(col0 + j) * K, c);
    } else {
#pragma unroll
      for (int i = 0; i < Slice::NPT; ++i) {
#pragma unroll
        for (int e = 0; e < Slice::E; ++e) {
          S[j][i][e] = 0.0f;
        }
      }
    }
  }

  // Conv history (raw bf16 values as f32) of the pair (fused only).
  float w0[3], w1[3];
  if (FUSED && gch >= 0) {
    const bf16_t* cs = p.conv_state + slot * p.conv_state_slot_stride + gch;
#pragma unroll
    for (int j = 0; j < 3; ++j) {
      const float2 hp = ld_bf16x2(cs + j * D);
      w0[j] = hp.x;
      w1[j] = hp.y;
    }
  }

  // Per-pair destinations that do not depend on the token.
  float* sm_dst = is_qk ? &sm.qk[0][ch_local / K][ch_local % K] : &sm.v[0][ch_local - 2 * K];
  const int sm_stride = is_qk ? 2 * K : BV;
  bf16_t* win_base = p.conv_window + row * p.conv_window_row_stride + gch;
  bf16_t* ring_pair = nullptr;  // ring record of this pair at step 0 (L-strided per step)
  int64_t ring_step = 0;
  if (ring && gch >= 0) {
    if (is_k && qk_owner) {
      ring_pair = p.ring_rawk + slot * p.ring_rawk_slot_stride + static_cast<int64_t>(h) * p.L * K +
                  (ch_local - K);
      ring_step = K;
    } else if (!is_qk) {
      ring_pair = p.ring_rawv + slot * p.ring_rawv_slot_stride +
                  static_cast<int64_t>(hv) * p.L * p.V + v0 + (ch_local - 2 * K);
      ring_step = p.V;
    }
  }

  for (int t0 = 0; t0 < T; t0 += Cfg::kChunk) {
    const int tc = min(Cfg::kChunk, T - t0);
    const int64_t r0 = static_cast<int64_t>(n) * T + t0;

    // Issue every global load of the chunk before any dependent arithmetic or store (the
    // stores below may alias the inputs as far as the compiler knows).
    float2 xs[Cfg::kChunk];
#pragma unroll
    for (int tt = 0; tt < Cfg::kChunk; ++tt) {
      xs[tt] = make_float2(0.0f, 0.0f);
      if (gch >= 0 && tt < tc) {
        xs[tt] = FUSED ? ld_bf16x2(p.qkv + (r0 + tt) * p.qkv_stride + gch)
                       : ld_bf16x2(p.qkv_act + (r0 + tt) * D + gch);
      }
    }
    float as[kGateIters];
#pragma unroll
    for (int j = 0; j < kGateIters; ++j) {
      const int tt = gt0 + j * kGateStep;
      as[j] = tt < tc ? ld_bf16(p.a + (r0 + tt) * p.a_stride + ghk) : 0.0f;
    }
    const float bs = tid < tc ? ld_bf16(p.b + (r0 + tid) * p.b_stride + hv) : 0.0f;

    // 1. q/k/v of the chunk's tokens for this thread's channel pair.
    if (gch >= 0) {
#pragma unroll
      for (int tt = 0; tt < Cfg::kChunk; ++tt) {
        if (tt >= tc) {
          break;
        }
        const int t = t0 + tt;
        float y0, y1;
        if constexpr (FUSED) {
          const float a0 = conv_acc<WeightT>(taps0, w0[0], w0[1], w0[2], xs[tt].x);
          const float a1 = conv_acc<WeightT>(taps1, w1[0], w1[1], w1[2], xs[tt].y);
          w0[0] = w0[1];
          w0[1] = w0[2];
          w0[2] = xs[tt].x;
          w1[0] = w1[1];
          w1[1] = w1[2];
          w1[2] = xs[tt].y;
          y0 = silu_bf16(a0);
          y1 = silu_bf16(a1);
          if (write_window) {
            bf16_t* w = win_base + static_cast<int64_t>(t) * 3 * D;
            st_bf16x2(w, w0[0], w1[0]);
            st_bf16x2(w + D, w0[1], w1[1]);
            st_bf16x2(w + 2 * D, w0[2], w1[2]);
          }
        } else {
          y0 = xs[tt].x;
          y1 = xs[tt].y;
        }
        *reinterpret_cast<float2*>(sm_dst + tt * sm_stride) = make_float2(y0, y1);
        if (ring_pair != nullptr && t < p.L) {
          st_bf16x2(ring_pair + t * ring_step, y0, y1);
        }
      }
    }

    // 2. gates and beta.
#pragma unroll
    for (int j = 0; j < kGateIters; ++j) {
      const int tt = gt0 + j * kGateStep;
      if (tt >= tc) {
        break;
      }
      const int t = t0 + tt;
      const float x = __fadd_rn(as[j], dt_bias);
      const float g = p.gate == GateKind::kStandard ? gate_standard(x, exp_a_log)
                                                    : gate_safe(x, exp_a_log, p.lower_bound);
      sm.decay[tt][gk] = kda_exp(g);
      if (ring && gate_owner && t < p.L) {
        p.ring_g[slot * p.ring_g_slot_stride + (static_cast<int64_t>(hv) * p.L + t) * K + gk] = g;
      }
    }
    if (tid < tc) {
      const int t = t0 + tid;
      const float beta = kda_sigmoid(bs);
      sm.beta[tid] = beta;
      if (ring && gate_owner && t < p.L) {
        p.ring_beta[slot * p.ring_beta_slot_stride + static_cast<int64_t>(hv) * p.L + t] = beta;
      }
    }
    __syncthreads();

    // 3. L2 norms of q (scaled by K^-0.5) and k, one warp per vector.
    for (int job = warp; job < 2 * tc; job += Cfg::kWarps) {
      const int which = job & 1;
      l2_normalize_warp<K>(sm.qk[job >> 1][which], kQkScale<K>, which == 0, lane);
    }
    __syncthreads();

    // 4. The recurrence.
    for (int tt = 0; tt < tc; ++tt) {
      const int t = t0 + tt;
      float vv[CPT];
#pragma unroll
      for (int j = 0; j < CPT; ++j) {
        vv[j] = col_ok[j] ? sm.v[tt][group * CPT + j] : 0.0f;
      }
      delta_rule_step<Slice>(S, sm.qk[tt][1], sm.decay[tt], vv, sm.beta[tt], c);
      float o[CPT];
      output_dot<Slice>(S, sm.qk[tt][0], c, o);
      const int64_t r = static_cast<int64_t>(n) * T + t;
      // Lane c < CPT of the group writes column c: one coalesced run per group.
      if (c < CPT) {
        float oc = o[0];
#pragma unroll
        for (int j = 1; j < CPT; ++j) {
          oc = c == j ? o[j] : oc;
        }
        if (col0 + c < p.V) {
          p.out[(r * p.HV + hv) * p.V + col0 + c] = to_bf16(oc);
        }
      }
      if (snap) {
        float* dst = p.snapshots + row * p.snapshot_row_stride +
                     (static_cast<int64_t>(t) * p.HV + hv) * p.V * K;
#pragma unroll
        for (int j = 0; j < CPT; ++j) {
          if (col_ok[j]) {
            store_column<Slice>(dst + static_cast<int64_t>(col0 + j) * K, S[j], c);
          }
        }
      }
    }
    __syncthreads();  // the next chunk overwrites shared memory
  }

  if (extend) {
    float* dst = args.ssm_out + slot * p.ssm_slot_stride + static_cast<int64_t>(hv) * p.V * K;
#pragma unroll
    for (int j = 0; j < CPT; ++j) {
      if (col_ok[j]) {
        store_column<Slice>(dst + static_cast<int64_t>(col0 + j) * K, S[j], c);
      }
    }
  }
}

/// Launches one configuration with PDL (programmatic stream serialisation) on sm_90+.
template <typename WeightT, int K, int BV, bool FUSED>
void launch_verify_tile(const TileArgs& args, cudaStream_t stream);

}  // namespace kda::kernels

// ---- launcher definition (instantiated in kernels/inst/*.cu) ----

#include "core/cuda_check.h"
#include "kernels/launch_utils.h"

namespace kda::kernels {

template <typename WeightT, int K, int BV, bool FUSED>
void launch_verify_tile(const TileArgs& args, cudaStream_t stream) {
  const VerifyParams& p = args.p;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(ceil_div(p.V, BV)), static_cast<unsigned>(p.HV),
                     static_cast<unsigned>(p.B));
  cfg.blockDim = dim3(TileConfig<K, BV>::kThreads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = pdl_enabled() ? 1 : 0;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  KDA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, verify_tile_kernel<WeightT, K, BV, FUSED>, args));
}

// Instantiations live in kernels/inst/ (one weight type x K per file).
#define KDA_VERIFY_TILE_EXTERN(W, K, FUSED)                                                \
  extern template void launch_verify_tile<W, K, 8, FUSED>(const TileArgs&, cudaStream_t);  \
  extern template void launch_verify_tile<W, K, 16, FUSED>(const TileArgs&, cudaStream_t); \
  extern template void launch_verify_tile<W, K, 32, FUSED>(const TileArgs&, cudaStream_t); \
  extern template void launch_verify_tile<W, K, 64, FUSED>(const TileArgs&, cudaStream_t); \
  extern template void launch_verify_tile<W, K, 128, FUSED>(const TileArgs&, cudaStream_t);
KDA_VERIFY_TILE_EXTERN(float, 64, true)
KDA_VERIFY_TILE_EXTERN(float, 128, true)
KDA_VERIFY_TILE_EXTERN(bf16_t, 64, true)
KDA_VERIFY_TILE_EXTERN(bf16_t, 128, true)
#undef KDA_VERIFY_TILE_EXTERN
/// The unfused recurrence reads qkv_act: no conv, so one weight type and one tile serve all.
constexpr int kRecurrentBlockV = 128;
extern template void launch_verify_tile<float, 64, kRecurrentBlockV, false>(const TileArgs&,
                                                                            cudaStream_t);
extern template void launch_verify_tile<float, 128, kRecurrentBlockV, false>(const TileArgs&,
                                                                             cudaStream_t);

}  // namespace kda::kernels
