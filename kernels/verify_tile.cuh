// verify_tile.cuh: the verify / extend kernel. One CTA = (V tile, v-head hv, request n).
//
// Grid (ceil(V/BV), HV, B), 256 threads. Thread tid owns column v = v0 + tid/P of the state
// tile, lanes c = tid%P split K as in delta_rule.cuh (P = 256/BV threads per column).
// Per chunk of up to kChunk tokens:
//   1. q/k (2K channels of k-head h) and v (the BV channels of this tile) for every token:
//      FUSED: conv + SiLU from mixed_qkv and the conv history (window kept in registers);
//      unfused: read back from qkv_act, written by the conv-update kernel.
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
// slot < 0: the CTA zeroes its output rows and reads nothing else.
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
  static constexpr int P = kThreads / BV;  ///< lanes per state column
  static constexpr int kChunk = 8;         ///< tokens per prologue chunk
  static constexpr int kChannels = 2 * K + BV;
  static constexpr int kChanIters = (kChannels + kThreads - 1) / kThreads;
  using Slice = ColumnSlice<K, P>;
  static_assert(BV >= 8 && BV <= 128, "BV must be in [8, 128]");
};

/// Shared memory of one CTA (static, < 48 KiB).
template <typename Cfg>
struct TileSmem {
  float qk[Cfg::kChunk][2][Cfg::K];   ///< [t][0] = q -> qs, [t][1] = k -> kn
  float decay[Cfg::kChunk][Cfg::K];   ///< EXP(g)
  float v[Cfg::kChunk][Cfg::BV];      ///< bf16-valued v of this tile
  float beta[Cfg::kChunk];
};

template <typename WeightT, int K, int BV, bool FUSED>
__global__ void __launch_bounds__(256) verify_tile_kernel(const __grid_constant__ TileArgs args) {
  using Cfg = TileConfig<K, BV>;
  using Slice = typename Cfg::Slice;
  constexpr int P = Cfg::P;
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
  const int col_local = tid / P;
  const int c = tid % P;
  const int col = v0 + col_local;
  const bool col_ok = col < p.V;
  const int T = p.T;
  const int64_t D = qkv_dim(p);
  const int64_t HK = static_cast<int64_t>(p.H) * K;

  // The committed state may have been written by the previous kernel (commit): wait for it.
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

  // Start the state load first: at large B this is the dominant HBM traffic.
  SliceRegs<Slice> S;
  const float* s_col =
      p.ssm_state + slot * p.ssm_slot_stride + (static_cast<int64_t>(hv) * p.V + col) * K;
#pragma unroll
  for (int i = 0; i < Slice::NPT; ++i) {
    if (col_ok) {
      load_vec<Slice::E>(S[i], s_col + Slice::k_of(c, i));
    } else {
#pragma unroll
      for (int e = 0; e < Slice::E; ++e) {
        S[i][e] = 0.0f;
      }
    }
  }

  // Channels of this CTA: [0, K) q of head h, [K, 2K) k of head h, [2K, 2K+BV) v tile.
  // Global channel index, or -1 when the v channel is past V.
  auto global_channel = [&](int ch_local) -> int64_t {
    if (ch_local < 2 * K) {
      const int which = ch_local / K;
      return which * HK + static_cast<int64_t>(h) * K + (ch_local % K);
    }
    const int j = ch_local - 2 * K;
    return v0 + j < p.V ? 2 * HK + static_cast<int64_t>(hv) * p.V + v0 + j : -1;
  };

  // Conv history (raw bf16 values as f32) and taps, per owned channel (fused only).
  float win[Cfg::kChanIters][3];
  ConvTaps taps[Cfg::kChanIters];
  if constexpr (FUSED) {
    const bf16_t* cs = p.conv_state + slot * p.conv_state_slot_stride;
#pragma unroll
    for (int it = 0; it < Cfg::kChanIters; ++it) {
      const int ch_local = tid + it * Cfg::kThreads;
      const int64_t gch = ch_local < Cfg::kChannels ? global_channel(ch_local) : -1;
      if (gch >= 0) {
#pragma unroll
        for (int j = 0; j < 3; ++j) {
          win[it][j] = ld_bf16(cs + j * D + gch);
        }
        taps[it] = load_conv_taps<WeightT>(p.conv_weight, p.conv_bias, gch);
      }
    }
  }

  const float exp_a_log = kda_exp(p.A_log[hv]);
  for (int t0 = 0; t0 < T; t0 += Cfg::kChunk) {
    const int tc = min(Cfg::kChunk, T - t0);

    // 1. q/k/v of the chunk's tokens.
#pragma unroll
    for (int it = 0; it < Cfg::kChanIters; ++it) {
      const int ch_local = tid + it * Cfg::kThreads;
      const int64_t gch = ch_local < Cfg::kChannels ? global_channel(ch_local) : -1;
      if (gch < 0) {
        continue;
      }
      const bool is_qk = ch_local < 2 * K;
      const bool is_k = is_qk && ch_local >= K;
      const bool write_window = !extend && FUSED && (is_qk ? qk_owner : true);
      float* dst = is_qk ? &sm.qk[0][ch_local / K][ch_local % K] : &sm.v[0][ch_local - 2 * K];
      const int dst_stride = is_qk ? 2 * K : BV;
      for (int tt = 0; tt < tc; ++tt) {
        const int t = t0 + tt;
        const int64_t r = static_cast<int64_t>(n) * T + t;
        float y;
        if constexpr (FUSED) {
          const float x = ld_bf16(p.qkv + r * p.qkv_stride + gch);
          const float acc = conv_acc<WeightT>(taps[it], win[it][0], win[it][1], win[it][2], x);
          win[it][0] = win[it][1];
          win[it][1] = win[it][2];
          win[it][2] = x;
          y = silu_bf16(acc);
          if (write_window) {
            bf16_t* w = p.conv_window + row * p.conv_window_row_stride +
                        static_cast<int64_t>(t) * 3 * D + gch;
            w[0] = to_bf16(win[it][0]);
            w[D] = to_bf16(win[it][1]);
            w[2 * D] = to_bf16(win[it][2]);
          }
        } else {
          y = ld_bf16(p.qkv_act + r * D + gch);
        }
        dst[tt * dst_stride] = y;
        if (ring && t < p.L) {
          if (is_k && qk_owner) {
            p.ring_rawk[slot * p.ring_rawk_slot_stride + (static_cast<int64_t>(h) * p.L + t) * K +
                        ch_local - K] = to_bf16(y);
          } else if (!is_qk) {
            p.ring_rawv[slot * p.ring_rawv_slot_stride +
                        (static_cast<int64_t>(hv) * p.L + t) * p.V + v0 + ch_local - 2 * K] =
                to_bf16(y);
          }
        }
      }
    }

    // 2. gates and beta.
    for (int idx = tid; idx < tc * K; idx += Cfg::kThreads) {
      const int tt = idx / K;
      const int k = idx % K;
      const int t = t0 + tt;
      const int64_t r = static_cast<int64_t>(n) * T + t;
      const int64_t hk = static_cast<int64_t>(hv) * K + k;
      const float x = __fadd_rn(ld_bf16(p.a + r * p.a_stride + hk), p.dt_bias[hk]);
      const float g = p.gate == GateKind::kStandard ? gate_standard(x, exp_a_log)
                                                    : gate_safe(x, exp_a_log, p.lower_bound);
      sm.decay[tt][k] = kda_exp(g);
      if (ring && gate_owner && t < p.L) {
        p.ring_g[slot * p.ring_g_slot_stride + (static_cast<int64_t>(hv) * p.L + t) * K + k] = g;
      }
    }
    for (int tt = tid; tt < tc; tt += Cfg::kThreads) {
      const int t = t0 + tt;
      const int64_t r = static_cast<int64_t>(n) * T + t;
      const float beta = kda_sigmoid(ld_bf16(p.b + r * p.b_stride + hv));
      sm.beta[tt] = beta;
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
      const float v = col_ok ? sm.v[tt][col_local] : 0.0f;
      delta_rule_step<Slice>(S, sm.qk[tt][1], sm.decay[tt], v, sm.beta[tt], c);
      const float o = output_dot<Slice>(S, sm.qk[tt][0], c);
      if (col_ok) {
        const int64_t r = static_cast<int64_t>(n) * T + t;
        if (c == 0) {
          p.out[(r * p.HV + hv) * p.V + col] = to_bf16(o);
        }
        if (snap) {
          float* dst = p.snapshots + row * p.snapshot_row_stride +
                       ((static_cast<int64_t>(t) * p.HV + hv) * p.V + col) * K;
          store_slice<Slice>(dst, S, c);
        }
      }
    }
    __syncthreads();  // the next chunk overwrites shared memory
  }

  if (extend && col_ok) {
    store_slice<Slice>(args.ssm_out + slot * p.ssm_slot_stride +
                           (static_cast<int64_t>(hv) * p.V + col) * K,
                       S, c);
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
#define KDA_VERIFY_TILE_EXTERN(W, K, FUSED)                                            \
  extern template void launch_verify_tile<W, K, 8, FUSED>(const TileArgs&, cudaStream_t);   \
  extern template void launch_verify_tile<W, K, 16, FUSED>(const TileArgs&, cudaStream_t);  \
  extern template void launch_verify_tile<W, K, 32, FUSED>(const TileArgs&, cudaStream_t);  \
  extern template void launch_verify_tile<W, K, 64, FUSED>(const TileArgs&, cudaStream_t);  \
  extern template void launch_verify_tile<W, K, 128, FUSED>(const TileArgs&, cudaStream_t);
KDA_VERIFY_TILE_EXTERN(float, 64, true)
KDA_VERIFY_TILE_EXTERN(float, 128, true)
KDA_VERIFY_TILE_EXTERN(bf16_t, 64, true)
KDA_VERIFY_TILE_EXTERN(bf16_t, 128, true)
#undef KDA_VERIFY_TILE_EXTERN
/// The unfused recurrence reads qkv_act: no conv, so one weight type and one tile serve all.
constexpr int kRecurrentBlockV = 32;
extern template void launch_verify_tile<float, 64, kRecurrentBlockV, false>(const TileArgs&,
                                                                              cudaStream_t);
extern template void launch_verify_tile<float, 128, kRecurrentBlockV, false>(const TileArgs&,
                                                                               cudaStream_t);

}  // namespace kda::kernels
