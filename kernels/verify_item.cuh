// verify_item.cuh: one verify / extend work item, the (V tile, v-head hv, request n) triple, as
// one CTA of 256 threads runs it: VerifyItem (the arithmetic of contract §3), its tile
// configuration and shared memory, and the weight reads both input sources share. The kernels
// that run items: verify_tile.cuh (one CTA per item, grid (ceil(V/BV), HV, B)) and
// verify_stream.cuh (persistent CTAs).
//
// Recurrence layout: thread tid = group*P + c owns columns v0 + group*CPT + j (j < CPT) of the
//   state tile; lanes c split K as in delta_rule.cuh (P = 8 lanes per column for BV >= 32,
//   else 256/BV; CPT = BV*P/256 columns per thread; the one-per-SM BV = 16 tile: P = 8 on
//   threads 128-255, tid - 128 in place of tid; the one-per-SM BV = 32 tile: lane = c*4 + the
//   group's index in its warp, TileConfig::kLaneStride).
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
// slot < 0: the CTA zeroes its output rows and reads nothing else of the request (the
// per-item kernel reads its rows[n] entry with the slot and never uses it).
// Before its PDL wait the per-item kernel reads the weights and the slot / row indices and
// computes the request's row addresses (kda_kernels.h states what that asks of callers).
// Alignment (checked by the launchers): V even, every bf16 row/slot stride even and bf16
// base pointers 4-byte aligned (channel pairs), conv weights 16-byte aligned.
// Offsets are 64-bit, except the per-item kernels' output index (32 bits; the launchers check
// that `out` has fewer than 2^31 elements) and a chunk's gate-row offsets (32 bits; token row
// pitches below 2^28 elements, checked).
#pragma once

#include <cstdint>

#include "kernels/conv.cuh"
#include "kernels/delta_rule.cuh"
#include "kernels/fast_divisor.h"
#include "kernels/kda_params.h"

namespace kda::kernels {

/// The launch's divisors (set by launch_verify_tile): item index -> coordinates and v-head ->
/// k-head without a runtime division in the kernels (fast_divisor.h).
struct ItemDivisors {
  FastDivisor tiles;  ///< ceil(V / BV): V tiles per v-head
  FastDivisor heads;  ///< HV
  FastDivisor group;  ///< HV / H: v-heads per k-head
};

/// Kernel argument: the layer's params plus what extend adds.
struct TileArgs {
  VerifyParams p;
  float* ssm_out;    ///< extend only: [S, HV, V, K] final state
  int32_t extend;    ///< 1: extend (no records, final state to ssm_out); 0: verify
  ItemDivisors div;  ///< callers leave it default: launch_verify_tile sets it
};

/// Where a work item sits: request n, v-head hv (of k-head h), V tile.
struct ItemCoords {
  int n, hv, h, tile;
};

/// A tile's thread layout. kWide_: the one-CTA-per-SM form of the per-item kernel (wide
/// registers: see kMinCtasPerSm). The state tile is held by the last kStepThreads threads, P
/// lanes per column and CPT columns each (delta_rule.cuh); the threads before kFirstStepThread
/// hold no columns and skip the steps. Every tile uses all 256 threads, except the wide BV = 16
/// tile: P = 8 lanes per column on warps 4-7 (one warp per scheduler, 16 values per thread).
/// Against all eight warps at P = 16 (one cross-lane tree level more per dot) that was 1-4%
/// faster at B = 1-2 in the H200's graph of calls. Warps 4-7 are the warps without a channel
/// pair (and the last conv warp): their tile loads go out during the conv. P = 4 and the BV = 64
/// tile on four warps were 1-28% slower (docs/perf.md v38). The wide BV = 32 tile on warps 4-7
/// (two columns per thread) spills 80 B at its 128-register cap and was 16% slower there (v39).
template <int K_, int BV_, bool kWide_ = false>
struct TileConfig {
  static constexpr int K = K_;
  static constexpr int BV = BV_;
  static constexpr int kThreads = 256;
  static constexpr int kWarps = kThreads / 32;
  /// The kernel's __launch_bounds__ minimum of resident CTAs per SM: 2 (128 registers per
  /// thread), but 1 (up to 255) for the wide tiles other than BV = 32. The launcher runs a wide
  /// tile only on grids of at most one CTA per SM (or a few waves at BV = 128), so the second
  /// slot of the wide BV = 32 tile is for the next kernel: its CTA becomes resident under PDL and
  /// runs its part before griddepcontrol.wait while this one finishes. On the H200, against the
  /// same tile at up to 255 registers on warps 4-7 (v38), in the graph of calls: Kimi-Linear
  /// T = 4 B = 1 -1.8%, a K = V = 64 shape -1..-3.4% at B = 1-2, K3 TP8 T = 8 B = 2 +1%; despite
  /// 4-16 B of spills. At 128 registers the BV = 16 and 64 tiles were 3-9% slower (docs/perf.md
  /// v39).
  static constexpr int kMinCtasPerSm = !kWide_ || BV == 32 ? 2 : 1;
  static constexpr bool kHalfStepThreads = kWide_ && BV == 16;
  static constexpr int kStepThreads = kHalfStepThreads ? kThreads / 2 : kThreads;
  static constexpr int kFirstStepThread = kThreads - kStepThreads;
  static constexpr int P = BV >= 32 || kHalfStepThreads ? 8 : kThreads / BV;  ///< lanes per column
  static constexpr int CPT = BV * P / kStepThreads;  ///< columns per thread
  /// Lane distance of a column's P lanes (ColumnSlice): 1 (thread step_tid = group * P + c),
  /// except in the wide BV = 32 tile: 32 / P, lane = c * (32 / P) + the group's index in its warp.
  /// There lanes n and n ^ 1 read the same K slice of kn / decay / qs, and a warp's 128-bit
  /// shared loads take half the requests (each of its threads holds one column, so every step
  /// loads its 48 values per column from shared memory). On the H200: that tile -6.9..-8.6% at
  /// B = 1-2 (K = 128), -0.1..-0.7% (K = 64). Elsewhere it lost: the one-per-SM BV = 64 / 128
  /// tiles (2 / 4 columns per thread share each load) +1.6..+11.6%, the two-per-SM BV = 32 / 64
  /// tiles +0.5..+12%; the one-per-SM BV = 16 tile moved -1.7..+1.8% (+1.8% at K3 TP8 T = 4 B = 1)
  /// (docs/perf.md v41).
  static constexpr int kLaneStride = kWide_ && BV == 32 ? 32 / P : 1;
  static constexpr int kChunk = 8;                 ///< tokens per prologue chunk
  static constexpr int kPairs = (2 * K + BV) / 2;  ///< channel pairs per CTA
  using Slice = ColumnSlice<K, P, CPT, kLaneStride>;
  static_assert(BV >= 8 && BV <= 128 && BV % 2 == 0, "BV must be even, in [8, 128]");
  static_assert(kPairs <= kThreads, "one channel pair per thread");
  static_assert(kStepThreads / P * CPT == BV, "the step threads cover the tile");
  static_assert(kStepThreads % 32 == 0, "whole warps hold the tile");
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

/// One work item of the verify / extend kernel: the (V tile, v-head, request) triple.
/// The constructor computes indices only; load_constants() and run() read the item's inputs
/// through a source `Src`: GlobalSource (global memory) or StagedSource (verify_stream.cuh:
/// the state tile from a shared-memory stage filled by a TMA bulk copy, the rest as
/// GlobalSource). Both hand the same values to the same arithmetic, so the bits are equal.
/// Src::kStaged: the state tile is copied to registers after the prologue (it is not live
/// through it) and the kernel runs one token chunk (T <= kChunk).
template <typename WeightT, int K, int BV, bool FUSED, bool kWide = false>
struct VerifyItem {
  using Weight = WeightT;
  static constexpr bool kFused = FUSED;
  using Cfg = TileConfig<K, BV, kWide>;
  using Slice = typename Cfg::Slice;
  static constexpr int P = Cfg::P;
  static constexpr int CPT = Cfg::CPT;
  /// Snapshot mode's per-step states are written once and at most one of a request's T is read
  /// again (by the commit, after every layer's verify): stored evict-first, they leave L2 to the
  /// data that is reused (docs/perf.md v34).
  static constexpr StoreHint kSnapshotStores = StoreHint::kStreaming;

  const TileArgs& args;
  const VerifyParams& p;
  int tile, hv, n, h;
  int tid, lane, warp, v0, group, c, col0;
  int64_t D, HK;
  int ch_local;
  int64_t gch;  // global channel of this thread's pair, or -1
  bool is_qk, is_k;
  ConvTaps taps0, taps1;
  int gk, gt0;
  int64_t ghk;
  float dt_bias;
  float a_log;      ///< A_log[hv] as loaded (load_constants)
  float exp_a_log;  ///< EXP(A_log[hv]): load_constants, or run() with wide registers

  // Gate work: thread owns key channel gk = tid % K for tokens tid/K, +kGateStep, ...
  static constexpr int kGateStep = Cfg::kThreads / K;
  static constexpr int kGateIters = Cfg::kChunk / kGateStep;
  static_assert(Cfg::kThreads % K == 0 && Cfg::kChunk % kGateStep == 0, "gate work split");
  /// Gates computed together: those of 4 consecutive tokens (K = 128: 2, K = 64: 1).
  static constexpr int kGateGroup = kGateStep >= 4 ? 1 : 4 / kGateStep;
  static_assert(kGateIters % kGateGroup == 0, "whole gate groups");

  /// Warps with a conv channel pair, and the spare warps without one (run's kSpareWarpNorms).
  static constexpr int kConvWarps = (Cfg::kPairs + 31) / 32;
  static constexpr int kSpareWarps = Cfg::kWarps - kConvWarps;

  /// The ring streaming kernel's column swizzle (Src::kRingForm): register j of the state and
  /// of the trees holds column col0 + (j ^ swizzle) (run, step 4); elsewhere 0.
  template <typename Src>
  __device__ __forceinline__ int column_swizzle_of() const {
    return Src::kRingForm ? column_swizzle<P, CPT>(c) : 0;
  }

  __device__ __forceinline__ VerifyItem(const TileArgs& a, const ItemCoords& at)
      : args(a), p(a.p), tile(at.tile), hv(at.hv), n(at.n), h(at.h) {
    tid = threadIdx.x;
    lane = tid & 31;
    warp = tid >> 5;
    v0 = tile * BV;
    {
      const int step_tid = tid - Cfg::kFirstStepThread;  // < 0: no state columns (TileConfig)
      if constexpr (Cfg::kLaneStride == 1) {
        group = step_tid / P;
        c = step_tid % P;
      } else {
        constexpr int G = Cfg::kLaneStride;  // column groups per warp
        const int l = step_tid & 31;
        group = (step_tid >> 5) * G + l % G;
        c = l / G;
      }
    }
    col0 = v0 + group * CPT;
    D = qkv_dim(p);
    HK = static_cast<int64_t>(p.H) * K;
    // This thread's channel pair (ch_local, ch_local + 1): [0, K) q of head h, [K, 2K) k of
    // head h, [2K, 2K+BV) the v tile.
    ch_local = 2 * tid;
    gch = -1;
    if (tid < Cfg::kPairs) {
      if (ch_local < 2 * K) {
        gch = (ch_local / K) * HK + static_cast<int64_t>(h) * K + (ch_local % K);
      } else if (v0 + ch_local - 2 * K < p.V) {
        gch = 2 * HK + static_cast<int64_t>(hv) * p.V + v0 + ch_local - 2 * K;
      }
    }
    is_qk = ch_local < 2 * K;
    is_k = is_qk && ch_local >= K;
    gk = tid % K;
    gt0 = tid / K;
    ghk = static_cast<int64_t>(hv) * K + gk;
  }

  /// The gate constants, and the pair's conv taps in the per-item kernel (before the PDL
  /// wait; the streaming kernel loads its taps in the conv step). The wide form (kWide) leaves
  /// EXP(A_log) to run: the one-CTA-per-SM kernel starts only when the previous kernel's CTA has
  /// left its SM, so a wait for the A_log load before griddepcontrol.wait is not hidden behind that
  /// kernel (docs/perf.md v15e). The wide BV = 32 tile, whose CTA can enter early (TileConfig::
  /// kMinCtasPerSm), measured the same with EXP(A_log) on either side of the wait (v39).
  template <typename Src>
  __device__ __forceinline__ void load_constants(const Src& src) {
    if constexpr (!Src::kStaged) {
      if (FUSED && gch >= 0) {
        src.conv_taps(*this, taps0, taps1);
      }
    }
    dt_bias = src.dt_bias(*this);
    a_log = p.A_log[hv];
    if constexpr (!kWide) {
      exp_a_log = kda_exp(a_log);
    }
  }

  /// The global inputs of one token chunk as raw bf16 bits (converted where they are used, so
  /// the loads that follow are not held up by the first ones' data): the pair's x (q/k/v raw
  /// or activation), the gate logits of key gk, the beta logit of token tid.
  struct ChunkInputs {
    uint32_t xs[Cfg::kChunk];  ///< channel pair, low channel in the low half
    uint32_t as[kGateIters];
    uint32_t bs;
  };

  /// Issues every load of the chunk [t0, t0 + tc) (before any dependent arithmetic: the stores
  /// that follow may alias the inputs as far as the compiler knows).
  template <typename Src>
  __device__ __forceinline__ void load_chunk(const Src& src, int t0, int tc,
                                             ChunkInputs& in) const {
#pragma unroll
    for (int tt = 0; tt < Cfg::kChunk; ++tt) {
      in.xs[tt] = 0u;
      if (!(FUSED && Src::kStaged) && gch >= 0 && tt < tc) {
        in.xs[tt] = src.x(*this, t0, tt);
      }
    }
#pragma unroll
    for (int j = 0; j < kGateIters; ++j) {
      const int tt = gt0 + j * kGateStep;
      in.as[j] = tt < tc ? src.a(*this, t0, tt) : 0u;
    }
    in.bs = tid < tc ? src.b(*this, t0) : 0u;
  }

  /// The padding row (slot < 0): zero outputs, touch nothing else.
  __device__ __forceinline__ void zero_outputs() const {
    const int T = p.T;
    for (int t = 0; t < T; ++t) {
      bf16_t* out_row = p.out + ((static_cast<int64_t>(n) * T + t) * p.HV + hv) * p.V;
      for (int j = tid; j < BV && v0 + j < p.V; j += Cfg::kThreads) {
        out_row[v0 + j] = bf16_t{0};
      }
    }
  }

  /// Where this thread's channel pair stores each token's values (run, step 1).
  struct PairStores {
    float* sm_dst;      ///< token 0's pair in shared memory
    int sm_stride;      ///< floats from one token's row of sm_dst's array to the next
    bf16_t* win_base;   ///< the pair's conv window after token 0 (three rows of D per token)
    bf16_t* ring_pair;  ///< ring record of this pair at step 0 (L-strided per step), or null
    int64_t ring_step;  ///< elements per ring step
    bool write_window;  ///< this CTA writes the pair's windows
  };

  /// The pair's destinations that do not depend on the token.
  __device__ __forceinline__ PairStores pair_stores(TileSmem<Cfg>& sm, int slot, int64_t row,
                                                    bool ring, bool qk_owner,
                                                    bool write_window) const {
    float* sm_dst = is_qk ? &sm.qk[0][ch_local / K][ch_local % K] : &sm.v[0][ch_local - 2 * K];
    const int sm_stride = is_qk ? 2 * K : BV;
    bf16_t* win_base = p.conv_window + row * p.conv_window_row_stride + gch;
    bf16_t* ring_pair = nullptr;
    int64_t ring_step = 0;
    if (ring && gch >= 0) {
      if (is_k && qk_owner) {
        ring_pair = p.ring_rawk + slot * p.ring_rawk_slot_stride +
                    static_cast<int64_t>(h) * p.L * K + (ch_local - K);
        ring_step = K;
      } else if (!is_qk) {
        ring_pair = p.ring_rawv + slot * p.ring_rawv_slot_stride +
                    static_cast<int64_t>(hv) * p.L * p.V + v0 + (ch_local - 2 * K);
        ring_step = p.V;
      }
    }
    return PairStores{sm_dst, sm_stride, win_base, ring_pair, ring_step, write_window};
  }

  /// Step 1: q/k/v of the chunk [t0, t0 + tc) for this thread's channel pair (gch >= 0): conv +
  /// SiLU (fused) or the activations (unfused), to shared memory, the ring and the conv windows.
  /// w0 / w1: the pair's conv window, oldest first; advanced past the chunk.
  template <typename Src>
  __device__ __forceinline__ void convolve_chunk(const Src& src, const PairStores& dst,
                                                 float (&w0)[kConvHistory],
                                                 float (&w1)[kConvHistory],
                                                 const uint32_t (&xs)[Cfg::kChunk], int t0,
                                                 int tc) {
    float* const sm_dst = dst.sm_dst;
    const int sm_stride = dst.sm_stride;
    bf16_t* const win_base = dst.win_base;
    bf16_t* const ring_pair = dst.ring_pair;
    const int64_t ring_step = dst.ring_step;
    const bool write_window = dst.write_window;
    // The streaming kernel loads the taps here: held from the item's start they were live
    // across its item loop and spilled (docs/perf.md v6). The per-item kernel loads them
    // with the constants, before the PDL wait (at small B: 2-3% faster at T = 4).
    if constexpr (FUSED && Src::kStaged) {
      src.conv_taps(*this, taps0, taps1);
    }
    // Token t's record offsets from win_base / ring_pair advance by one step per token
    // (no 64-bit multiply per token, docs/perf.md v8f, v9a).
    constexpr bool kTokenLoop = FUSED && Src::kStaged;
    int64_t win_off = static_cast<int64_t>(t0) * 3 * D;
    int64_t ring_off = t0 * ring_step;
    // A token's q/k/v value of one channel: conv + SiLU of (window c0..c2, input x).
    const auto token_y = [&](const ConvTaps& taps, float c0, float c1, float c2, float x) {
      if constexpr (FUSED) {
        return silu_bf16(conv_acc<WeightT>(taps, c0, c1, c2, x));
      } else {
        return x;
      }
    };
    // Token tt's stores: its pair (y0, y1) to shared memory and the ring, and its conv
    // window (s0, s1: three values after the token, oldest first).
    const auto token_stores = [&](int tt, float y0, float y1, const float* s0, const float* s1) {
      const int t = t0 + tt;
      if constexpr (FUSED) {
        if (write_window) {
          bf16_t* w = win_base + win_off;
          st_bf16x2(w, s0[0], s1[0]);
          st_bf16x2(w + D, s0[1], s1[1]);
          st_bf16x2(w + 2 * D, s0[2], s1[2]);
        }
      }
      *reinterpret_cast<float2*>(sm_dst + tt * sm_stride) = make_float2(y0, y1);
      if (ring_pair != nullptr && t < p.L) {
        st_bf16x2(ring_pair + ring_off, y0, y1);
      }
    };
    if constexpr (kTokenLoop) {
      // Streaming kernels (throughput-bound, 128 registers): the rows re-read from the
      // ItemInputs rows in shared memory, kTokenStep tokens at a time. Unrolled over the
      // chunk, the tokens and windows sat in registers and the kernel spilled 70 B
      // (docs/perf.md v6). The ring kernel takes two tokens per step (the window of token
      // tt, its x and token tt + 1's x: token tt + 1's window is rows tt + 1 .. tt + 3), so
      // that their conv + SiLU chains overlap (v35); in the snapshot kernel that form
      // spilled 20 B, and it keeps one token per step.
      constexpr int kTokenStep = Src::kRingForm ? 2 : 1;
#pragma unroll 1
      for (int tt = 0; tt < tc; tt += kTokenStep) {  // t0 = 0: one chunk
        const bool second = kTokenStep == 2 && tt + 1 < tc;
        src.window(*this, tt, w0, w1);
        const float2 xa = bf16x2_bits_to_float2(src.x(*this, 0, tt));
        const float2 xb =
            second ? bf16x2_bits_to_float2(src.x(*this, 0, tt + 1)) : make_float2(0.0f, 0.0f);
        const float ya0 = token_y(taps0, w0[0], w0[1], w0[2], xa.x);
        const float ya1 = token_y(taps1, w1[0], w1[1], w1[2], xa.y);
        const float yb0 = token_y(taps0, w0[1], w0[2], xa.x, xb.x);
        const float yb1 = token_y(taps1, w1[1], w1[2], xa.y, xb.y);
        const float sa0[kConvHistory] = {w0[1], w0[2], xa.x};
        const float sa1[kConvHistory] = {w1[1], w1[2], xa.y};
        token_stores(tt, ya0, ya1, sa0, sa1);
        win_off += 3 * D;
        ring_off += ring_step;
        if (second) {
          const float sb0[kConvHistory] = {w0[2], xa.x, xb.x};
          const float sb1[kConvHistory] = {w1[2], xa.y, xb.y};
          token_stores(tt + 1, yb0, yb1, sb0, sb1);
          win_off += 3 * D;
          ring_off += ring_step;
        }
      }
    } else {
      // Per-item kernels (latency-bound): tokens in groups of kGroup, the window in
      // registers. A group's arithmetic comes first, branch-free (tokens past tc compute
      // on zero inputs and are never stored), then its stores: with each token's stores
      // (behind their branches) between its arithmetic and the next token's, the tokens'
      // conv + SiLU chains ran one after another (docs/perf.md v13).
      // BV = 128 at 128 registers (the fallback when the streaming kernel cannot run) keeps
      // one token per group: with four, the fused tile spilled 144 B instead of 56.
      constexpr int kGroup = BV <= 64 || kWide ? 4 : 1;
      static_assert(Cfg::kChunk % kGroup == 0, "whole groups per chunk");
#pragma unroll
      for (int g = 0; g < Cfg::kChunk; g += kGroup) {
        if (g >= tc) {
          break;
        }
        // The pair's values from the window's oldest row to the group's last token.
        float s0[kConvHistory + kGroup], s1[kConvHistory + kGroup];
#pragma unroll
        for (int j = 0; j < kConvHistory; ++j) {
          s0[j] = w0[j];
          s1[j] = w1[j];
        }
#pragma unroll
        for (int u = 0; u < kGroup; ++u) {
          const float2 x = bf16x2_bits_to_float2(xs[g + u]);
          s0[kConvHistory + u] = x.x;
          s1[kConvHistory + u] = x.y;
        }
        float y0[kGroup], y1[kGroup];
#pragma unroll
        for (int u = 0; u < kGroup; ++u) {
          y0[u] = token_y(taps0, s0[u], s0[u + 1], s0[u + 2], s0[u + 3]);
          y1[u] = token_y(taps1, s1[u], s1[u + 1], s1[u + 2], s1[u + 3]);
        }
#pragma unroll
        for (int u = 0; u < kGroup; ++u) {
          if (g + u < tc) {
            token_stores(g + u, y0[u], y1[u], &s0[u + 1], &s1[u + 1]);
          }
          win_off += 3 * D;
          ring_off += ring_step;
        }
#pragma unroll
        for (int j = 0; j < kConvHistory; ++j) {
          w0[j] = s0[kGroup + j];
          w1[j] = s1[kGroup + j];
        }
      }
    }
  }

  /// Step 2: this thread's gates (key gk) and beta (token tid) of the chunk [t0, t0 + tc): EXP(g)
  /// and beta to shared memory; g and beta to the ring by the gate owner.
  __device__ __forceinline__ void gates_chunk(TileSmem<Cfg>& sm, const ChunkInputs& in, int slot,
                                              bool ring, bool gate_owner, int t0, int tc) const {
    const uint32_t(&as)[kGateIters] = in.as;
    // A group: this thread's gates within 4 consecutive tokens (kGateGroup of them), computed
    // before their stores, as convolve_chunk computes a group of tokens before storing it.
#pragma unroll
    for (int jg = 0; jg < kGateIters; jg += kGateGroup) {
      if (jg * kGateStep >= tc) {
        break;
      }
      float x[kGateGroup], g[kGateGroup], decay[kGateGroup];
#pragma unroll
      for (int u = 0; u < kGateGroup; ++u) {
        x[u] = __fadd_rn(bf16_bits_to_float(as[jg + u]), dt_bias);
      }
      if (p.gate == GateKind::kStandard) {  // the kind's branch outside the group
#pragma unroll
        for (int u = 0; u < kGateGroup; ++u) {
          g[u] = gate_standard(x[u], exp_a_log);
        }
      } else {
#pragma unroll
        for (int u = 0; u < kGateGroup; ++u) {
          g[u] = gate_safe(x[u], exp_a_log, p.lower_bound);
        }
      }
#pragma unroll
      for (int u = 0; u < kGateGroup; ++u) {
        decay[u] = kda_exp(g[u]);
      }
#pragma unroll
      for (int u = 0; u < kGateGroup; ++u) {
        const int tt = gt0 + (jg + u) * kGateStep;
        if (tt < tc) {
          const int t = t0 + tt;
          sm.decay[tt][gk] = decay[u];
          if (ring && gate_owner && t < p.L) {
            p.ring_g[slot * p.ring_g_slot_stride + (static_cast<int64_t>(hv) * p.L + t) * K + gk] =
                g[u];
          }
        }
      }
    }
    if (tid < tc) {
      const int t = t0 + tid;
      const float beta = kda_sigmoid(bf16_bits_to_float(in.bs));
      sm.beta[tid] = beta;
      if (ring && gate_owner && t < p.L) {
        p.ring_beta[slot * p.ring_beta_slot_stride + static_cast<int64_t>(hv) * p.L + t] = beta;
      }
    }
  }

  /// Step 3 on the spare warps (run's kSpareWarpNorms).
  __device__ __forceinline__ void spare_warp_norms(TileSmem<Cfg>& sm, int tc) const {
    // L2 norms of q (scaled by K^-0.5) and k: vector j = 2 t + (0: q, 1: k) at sm.qk[0][0] + j K;
    // kNormJobs per warp at once, one pass at T <= 4.
    constexpr int kNormJobs = (8 + kSpareWarps - 1) / kSpareWarps;
    for (int first = warp - kConvWarps; first < 2 * tc; first += kNormJobs * kSpareWarps) {
      float* vecs[kNormJobs];
      bool on[kNormJobs], scaled[kNormJobs];
#pragma unroll
      for (int u = 0; u < kNormJobs; ++u) {
        const int job = first + u * kSpareWarps;
        on[u] = job < 2 * tc;
        scaled[u] = (job & 1) == 0;
        vecs[u] = &sm.qk[0][0][0] + job * K;
      }
      l2_normalize_warp_n<K, kNormJobs>(vecs, on, scaled, kQkScale<K>, lane);
    }
  }

  /// Step 4's v of the thread's CPT columns at step tt (not the ring streaming kernel's: it loads
  /// one column), columns past V as zeros. The snapshot streaming kernel (issue-bound) takes them
  /// in one shared-memory load (CPT = 2 or 4: 8 * CPT-byte aligned group offsets). The per-item
  /// kernels keep per-column loads: the one-load form changed their allocation (the BV = 128
  /// fallback tile spilled 72 B more, docs/perf.md v27).
  template <typename Src>
  __device__ __forceinline__ void v_of(const TileSmem<Cfg>& sm, const bool (&col_ok)[CPT], int tt,
                                       float (&vv)[CPT]) const {
    if constexpr (Src::kStaged && (CPT == 2 || CPT == 4)) {
      load_vec<CPT>(vv, &sm.v[tt][group * CPT]);
#pragma unroll
      for (int j = 0; j < CPT; ++j) {
        vv[j] = col_ok[j] ? vv[j] : 0.0f;
      }
    } else {
#pragma unroll
      for (int j = 0; j < CPT; ++j) {
        vv[j] = col_ok[j] ? sm.v[tt][group * CPT + j] : 0.0f;
      }
    }
  }

  /// Token t's outputs where every lane holds every column's bits (not the ring streaming
  /// kernel's): lane 0 of the group writes its CPT columns, bf16 pairs, no per-lane column select
  /// (which nvcc lowered to a local-memory array). Pairs are whole: V, v0 and col0 are even when
  /// CPT >= 2. The output is indexed in 32 bits (the launchers check that `out` has fewer than
  /// 2^31 elements). Per-item kernels (latency-bound) add t rows of HV*V (out_token) to the
  /// item's token-0 index (out_item): B = 1..4 1-3% faster (docs/perf.md v8e, v9a). The
  /// streaming kernels compute the row's index per store (they pass neither): the token-0 index
  /// held through the steps cost 32 B of spills (v9a), the 64-bit form ~17 instructions a warp
  /// per store (v27).
  template <typename Src>
  __device__ __forceinline__ void store_outputs(int t, const float* o, const bool (&col_ok)[CPT],
                                                int T, uint32_t out_item,
                                                uint32_t out_token) const {
    if (c == 0) {
      bf16_t* orow =
          p.out + (Src::kStaged ? ((static_cast<uint32_t>(n) * T + t) * p.HV + hv) * p.V + col0
                                : out_item + t * out_token);
      if constexpr (CPT == 1) {
        if (col_ok[0]) {
          orow[0] = to_bf16(o[0]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < CPT; j += 2) {
          if (col_ok[j]) {
            st_bf16x2(orow + j, o[j], o[j + 1]);
          }
        }
      }
    }
  }

  /// Snapshot mode (snap): the state after token t's step, unswizzled (the ring kernel stores
  /// none).
  template <typename Src>
  __device__ __forceinline__ void store_snapshot(int t, const ColRegs<Slice> (&S)[CPT],
                                                 const bool (&col_ok)[CPT], int64_t row,
                                                 bool snap) const {
    if (snap) {
      float* dst = p.snapshots + row * p.snapshot_row_stride +
                   (static_cast<int64_t>(t) * p.HV + hv) * p.V * K;
#pragma unroll
      for (int j = 0; j < CPT; ++j) {
        if (col_ok[j]) {
          // Unswizzled: the ring kernel stores none.
          float* col = dst + static_cast<int64_t>(col0 + j) * K;
          if constexpr (Src::kStaged) {
            store_column_per_partial<Slice, kSnapshotStores>(col, S[j], c);
          } else {
            store_column<Slice, kSnapshotStores>(col, S[j], c);
          }
        }
      }
    }
  }

  /// Step 4 in the ring streaming kernel (issue-bound). Both streaming kernels are
  /// software-pipelined: step tt's output dot and step tt+1's key dot both read the state after
  /// step tt's update, so their cross-lane tree levels run together (the shuffle chains' latency
  /// was the recurrence's main stall). Per value, the operations and their order are those of
  /// delta_rule_step + output_dot. The row's output index is computed per store (v27).
  /// cols_ok: the thread's columns are below V. Here they all are or none is (run), so one value
  /// stands for them; passed as run's array, it made the unfused ring kernel spill 44 B at its
  /// register cap.
  template <typename Src>
  __device__ __forceinline__ void steps_ring_stream(const TileSmem<Cfg>& sm,
                                                    ColRegs<Slice> (&S)[CPT], bool cols_ok, int T,
                                                    int t0, int tc) const {
    static_assert(Slice::kLaneStride == 1, "the streaming kernel's trees pair lanes c ^ d");
    // The cross-lane levels as reduce-scatters on the swizzled columns
    // (device_math.cuh tree_reduce_scatter). A step's key tree leaves each lane the root
    // of column swz, the lane computes that column's u, and CPT - 1 shuffles give it the
    // other columns' u; the output tree leaves the lanes with c % (P / CPT) == 0 one
    // output each to store. Per thread and step: 11 shuffles, 8 adds and one u where the
    // all-reduce form below takes 24 shuffles, 24 adds and CPT u (docs/perf.md v30). The
    // ring kernel stores no snapshots (its record mode is fixed: StagedSource::kFixedMode).
    static_assert(CPT <= P, "one column per lane at the root");
    // Column swz's u at step tt from its key-tree root kv, then every column's u.
    const auto update = [&](int tt, float kv) {
      float u[CPT];
      const float v = cols_ok ? sm.v[tt][group * CPT + column_swizzle_of<Src>()] : 0.0f;
      u[0] = __fmul_rn(__fsub_rn(v, kv), sm.beta[tt]);
      column_all_gather<P, CPT>(u);
      apply_update<Slice>(S, sm.qk[tt][1], u, c);
    };
    {
      float kv[1][CPT];
      decay_and_key_partials<Slice>(S, sm.qk[0][1], sm.decay[0], c, kv[0]);
      tree_reduce_scatter<P, CPT, 1>(kv);
      update(0, kv[0][0]);
    }
    for (int tt = 0; tt < tc; ++tt) {
      const bool next = tt + 1 < tc;
      float part[2][CPT];  // [0]: outputs of step tt; [1]: kv of step tt + 1
      query_partials<Slice>(S, sm.qk[tt][0], c, part[0]);
      if (next) {
        decay_and_key_partials<Slice>(S, sm.qk[tt + 1][1], sm.decay[tt + 1], c, part[1]);
        tree_reduce_scatter<P, CPT, 2>(part);
      } else {
        tree_reduce_scatter<P, CPT, 1>(reinterpret_cast<float(&)[1][CPT]>(part));
      }
      if (c % (P / CPT) == 0 && cols_ok) {
        p.out[((static_cast<uint32_t>(n) * T + t0 + tt) * p.HV + hv) * p.V + col0 +
              column_swizzle_of<Src>()] = to_bf16(part[0][0]);
      }
      if (next) {
        update(tt + 1, part[1][0]);
      }
    }
  }

  /// Step 4 in the snapshot streaming kernel, pipelined as steps_ring_stream (v27's loop): the
  /// cross-lane levels as all-reduces (every lane gets every root), v_of's one shared-memory load,
  /// store_outputs from lane 0. With the ring kernel's form it spilled 40-56 B and ran 18-32%
  /// slower (docs/perf.md v30).
  template <typename Src>
  __device__ __forceinline__ void steps_snapshot_stream(const TileSmem<Cfg>& sm,
                                                        ColRegs<Slice> (&S)[CPT],
                                                        const bool (&col_ok)[CPT], int T,
                                                        int64_t row, bool snap, int t0,
                                                        int tc) const {
    static_assert(Slice::kLaneStride == 1, "the streaming kernel's trees pair lanes c ^ d");
    float vv[CPT];
    const auto update = [&](int tt, const float(&v)[CPT], const float(&kv)[CPT]) {
      float u[CPT];
#pragma unroll
      for (int j = 0; j < CPT; ++j) {
        u[j] = __fmul_rn(__fsub_rn(v[j], kv[j]), sm.beta[tt]);
      }
      apply_update<Slice>(S, sm.qk[tt][1], u, c);
    };
    {
      v_of<Src>(sm, col_ok, 0, vv);
      float kv[CPT];
      decay_and_key_partials<Slice>(S, sm.qk[0][1], sm.decay[0], c, kv);
      tree_across_lanes<P, CPT>(kv);
      update(0, vv, kv);
    }
    for (int tt = 0; tt < tc; ++tt) {
      const bool next = tt + 1 < tc;
      float part[2 * CPT];  // [0, CPT): outputs of step tt; [CPT, 2 CPT): kv of tt + 1
      query_partials<Slice>(S, sm.qk[tt][0], c, part);
      store_snapshot<Src>(t0 + tt, S, col_ok, row,
                          snap);  // the state after step tt, before step tt + 1 decays it
      if (next) {
        decay_and_key_partials<Slice>(S, sm.qk[tt + 1][1], sm.decay[tt + 1], c, part + CPT);
        tree_across_lanes<P, 2 * CPT>(part);
      } else {
        tree_across_lanes<P, CPT>(reinterpret_cast<float(&)[CPT]>(part));
      }
      store_outputs<Src>(t0 + tt, part, col_ok, T, 0u, 0u);
      if (next) {
        v_of<Src>(sm, col_ok, tt + 1, vv);
        update(tt + 1, vv, reinterpret_cast<const float(&)[CPT]>(part[CPT]));
      }
    }
  }

  /// Step 4 in the per-item kernels: one step after the other (latency-bound at small B, where
  /// the split form's extra shared loads cost 1-4%, docs/perf.md v5). The wide form runs the
  /// ring-mode steps in groups of kStepGroup with their outputs stored after the group.
  template <typename Src>
  __device__ __forceinline__ void steps_per_item(const TileSmem<Cfg>& sm, ColRegs<Slice> (&S)[CPT],
                                                 const bool (&col_ok)[CPT], bool holds_tile, int T,
                                                 int64_t row, bool snap, int t0, int tc) const {
    constexpr int kStepGroup = kWide ? 4 : 1;
    const uint32_t out_item = (static_cast<uint32_t>(n) * T * p.HV + hv) * p.V + col0;
    const uint32_t out_token = static_cast<uint32_t>(p.HV) * p.V;
    float vv[CPT];
    const auto step = [&](int tt, float(&o)[CPT]) {
      v_of<Src>(sm, col_ok, tt, vv);
      delta_rule_step<Slice>(S, sm.qk[tt][1], sm.decay[tt], vv, sm.beta[tt], c);
      output_dot<Slice>(S, sm.qk[tt][0], c, o);
    };
    int tt = holds_tile ? 0 : tc;  // warps without state columns: no steps
    if constexpr (kStepGroup > 1) {
      // Whole groups with their outputs stored after the group: no store (behind its
      // branch) then separates step tt's output dot from step tt + 1's decay and key dot,
      // which do not depend on it, and the scheduler overlaps them (docs/perf.md v13).
      // Snapshot mode stores the state after every step, so it keeps the plain loop.
      if (!snap) {
        for (; tt + kStepGroup <= tc; tt += kStepGroup) {
          float o[kStepGroup][CPT];
#pragma unroll
          for (int u = 0; u < kStepGroup; ++u) {
            step(tt + u, o[u]);
          }
#pragma unroll
          for (int u = 0; u < kStepGroup; ++u) {
            store_outputs<Src>(t0 + tt + u, o[u], col_ok, T, out_item, out_token);
          }
        }
      }
    }
    for (; tt < tc; ++tt) {
      float o[CPT];
      step(tt, o);
      store_outputs<Src>(t0 + tt, o, col_ok, T, out_item, out_token);
      store_snapshot<Src>(t0 + tt, S, col_ok, row, snap);
    }
  }

  /// Runs the item: the state tile and the chunk's inputs in flight, then per chunk the steps of
  /// the file's header: 1. convolve_chunk, 2. gates_chunk, 3. the norms (spare_warp_norms or every
  /// warp), 4. steps_ring_stream, steps_snapshot_stream or steps_per_item. This function holds the
  /// schedule (which loads and barriers go where); the phases hold the arithmetic.
  /// kWide: the register budget of the calling kernel (its __launch_bounds__). false: 128
  /// registers per thread. true (the per-item kernel's one-CTA-per-SM form, up to 255): every
  /// tile loads its first chunk early and convolves 4 tokens per group, the ring-mode steps
  /// run in groups of kStepGroup with their outputs stored after the group, a state tile
  /// loaded into registers is loaded after the gates (kLateStateLoads), and EXP(A_log) is
  /// computed here (load_constants leaves it).
  template <typename Src>
  __device__ __forceinline__ void run(TileSmem<Cfg>& sm, Src& src) {
    constexpr bool kWideRegisters = kWide;
    const int T = p.T;
    const int slot = src.slot(*this);
    if (slot < 0) {  // padding row: zero outputs, touch nothing else
      zero_outputs();
      return;
    }
    src.begin(*this);
    // The streaming kernel serves verify only (launcher-checked): extend's code is not in it.
    const bool extend = !Src::kStaged && args.extend != 0;
    const RecordMode mode =
        Src::kFixedMode >= 0 ? static_cast<RecordMode>(Src::kFixedMode) : p.mode;
    const bool ring = !extend && mode == RecordMode::kRing;
    const bool snap = !extend && mode == RecordMode::kSnapshot;
    const int64_t row = extend ? 0 : src.row(*this);
    // The first v-head of k-head h (h * HV/H) writes the head's q/k records.
    const bool qk_owner = tile == 0 && hv == h * static_cast<int>(args.div.group.divisor);
    const bool gate_owner = tile == 0;
    const bool write_window = !extend && FUSED && gch >= 0 && (is_qk ? qk_owner : true);

    // Conv history of the pair (fused only; the streaming kernel reads it per token, below).
    // Issued first: the conv waits for it (docs/perf.md v9b). Raw bits until every load of
    // the item is in flight (converted below, v9c).
    uint32_t hist_bits[kConvHistory];
    if constexpr (FUSED && !Src::kStaged) {
      if (gch >= 0) {
#pragma unroll
        for (int j = 0; j < kConvHistory; ++j) {
          hist_bits[j] = src.hist(*this, slot, j);
        }
      }
    }

    // Narrow tiles (BV <= 64: the small-B path) issue the first chunk's inputs here, with the
    // conv history and the state tile, before any of them is used — one memory round trip
    // after the PDL wait (the per-item kernel has read the slot before it, v9d), not three
    // (the chunk loop would otherwise keep the input loads behind the history's conversion):
    // B = 1..4 6-12% faster (docs/perf.md v4b). So do BV = 128 tiles with wide registers;
    // at 128 registers BV = 128 tiles load them in the loop: there the early loads cost
    // spills (per-item kernel, B = 8: 12.3 -> 13.7 us) or registers (streaming kernel: 1-2%
    // slower at B = 64), and other CTAs hide the latency.
    constexpr bool kEarlyInputs = !Src::kStaged && (BV <= 64 || kWideRegisters);
    ChunkInputs in;
    if constexpr (kEarlyInputs) {
      load_chunk(src, 0, min(Cfg::kChunk, T), in);
    }

    // The state tile, one of three ways:
    //  - staged (Src::kStateStaged): one bulk copy issued here, copied from shared memory to
    //    registers only after the prologue, so it does not hold registers through it;
    //  - kLateStateLoads (wide registers, not staged): register loads issued after the gates.
    //    Issued here, the tile's loads (up to 64 KiB per SM at BV = 128) shared the SM's
    //    memory pipe with the conv history and inputs, and the conv waited for them: the
    //    history landed ~1300-2900 cycles after the slot instead of ~1100. After the gates
    //    the history and inputs are in registers, and the tile lands during the norms
    //    (docs/perf.md v14: BV = 128 one per SM 6-10% faster, L2-cold 11-12%). With the
    //    spare-warp norms (below) the spare warps issue theirs after their gates (during the
    //    conv) and the conv warps right after the conv, before their gates;
    //  - otherwise register loads here, in flight during the prologue (with 128 registers
    //    and two CTAs per SM, loads issued after the history measured slower, v12g/h).
    constexpr bool kLateStateLoads = kWideRegisters && !Src::kStaged && !Src::kStateStaged;
    // Fused narrow tiles (BV <= 32) with wide registers: the warps without a conv pair
    // ("spare" warps) normalise the chunk's q / k while the conv warps compute their gates.
    // The spare warps compute their gates during the conv; all warps meet at a barrier once
    // q / k / v are stored; the conv warps then issue their state-tile loads and compute their
    // gates while the spare warps run the norms; a second barrier ends the prologue. Two CTA
    // barriers as before, and the norms are off the critical path (the conv warps are that
    // path; work added to them made it longer, docs/perf.md v16b). H200 (docs/perf.md v18):
    //  - BV <= 32: -1..-7% in the 10-call graph, L2-cold and in the 20-layer round;
    //  - BV = 64: -2..-4% in the graph but +3..+7% L2-cold and in the round at T = 4: its
    //    32 KiB state tile had landed during the norms, and without them the steps wait for it;
    //  - K = BV = 128 (two spare warps, four norms each at T = 4): +2..+3%;
    //  - the unfused recurrence has no conv to hide the norms behind (T = 8 +2%).
    // So BV >= 64 and the unfused recurrence keep the all-warp norms.
    constexpr bool kSpareWarpNorms = FUSED && kWideRegisters && !Src::kStaged && BV <= 32;
    static_assert(!kSpareWarpNorms || kSpareWarps >= 3, "three warps without a conv pair");
    ColRegs<Slice> S[CPT];
    // The ring streaming kernel holds its columns swizzled (register j: column col0 + (j ^ swz),
    // for its reduce-scatter trees, step 4; swz is recomputed where it is used: held from
    // here, it cost spills). Streaming calls have V % 8 == 0 (launcher-checked)
    // and col0 % CPT == 0, so there a thread's columns are all below V or all past it.
    // Threads before kFirstStepThread hold no state columns and skip the steps.
    const bool holds_tile = Cfg::kFirstStepThread == 0 || tid >= Cfg::kFirstStepThread;
    bool col_ok[CPT];
#pragma unroll
    for (int j = 0; j < CPT; ++j) {
      col_ok[j] = (Src::kRingForm ? col0 : col0 + j) < p.V && holds_tile;
    }
    const float* s_base =
        p.ssm_state + slot * p.ssm_slot_stride + static_cast<int64_t>(hv) * p.V * K;
    if constexpr (!Src::kStaged) {
      if constexpr (Src::kStateStaged) {
        src.issue_state_copy(*this, s_base);  // registers after the norms (below)
      } else if constexpr (!kLateStateLoads) {
        src.load_state(*this, S, col_ok, s_base);
      }
    }
    // The history as f32: the conv window, oldest first.
    float w0[kConvHistory], w1[kConvHistory];
    if constexpr (FUSED && !Src::kStaged) {
      if (gch >= 0) {
#pragma unroll
        for (int j = 0; j < kConvHistory; ++j) {
          const float2 hp = bf16x2_bits_to_float2(hist_bits[j]);
          w0[j] = hp.x;
          w1[j] = hp.y;
        }
      }
    }
    if constexpr (kWideRegisters) {
      // load_constants<true> left it here: the conv history has landed, and A_log (loaded
      // before the PDL wait) with it; the gates use it after the conv.
      exp_a_log = kda_exp(a_log);
    }

    const PairStores pair = pair_stores(sm, slot, row, ring, qk_owner, write_window);

    // The streaming kernel serves T <= kChunk only (launcher-checked): one chunk, so the
    // state is never live through a prologue (no spills).
    const int t_limit = Src::kStaged ? 1 : T;
    for (int t0 = 0; t0 < t_limit; t0 += Cfg::kChunk) {
      const int tc = min(Cfg::kChunk, T - t0);
      if (!kEarlyInputs || t0 > 0) {
        load_chunk(src, t0, tc, in);
      }

      // 1. q/k/v of the chunk's tokens for this thread's channel pair.
      if (gch >= 0) {
        convolve_chunk(src, pair, w0, w1, in.xs, t0, tc);
      }

      // 2. gates and beta, and (kSpareWarpNorms) 3. the q / k norms on the spare warps. In that
      // form each warp runs two phases around a barrier: the spare warps compute their gates
      // first (during the conv) and the norms second, the conv warps their gates second.
      constexpr int kPhases = kSpareWarpNorms ? 2 : 1;
      const bool spare = kSpareWarpNorms && warp >= kConvWarps;
      for (int phase = 0; phase < kPhases; ++phase) {
        if (phase == 1) {
          __syncthreads();  // the chunk's q / k / v in shared memory
        }
        if (kPhases == 1 || (phase == 0) == spare) {
          if constexpr (kLateStateLoads && kSpareWarpNorms) {
            // The conv warps' share of the tile: the conv is done, so the loads go out before
            // the gates (after them, the steps waited: docs/perf.md v18e).
            if (t0 == 0 && phase == 1) {
              src.load_state(*this, S, col_ok, s_base);
            }
          }
          gates_chunk(sm, in, slot, ring, gate_owner, t0, tc);
          if constexpr (kLateStateLoads) {
            // The first chunk's steps are the first to need the tile; the spare warps issue
            // theirs here, after their phase-0 gates (later, in phase 1, was slower: v18d).
            if (t0 == 0 && (!kSpareWarpNorms || phase == 0)) {
              src.load_state(*this, S, col_ok, s_base);
            }
          }
        } else if (phase == 1) {
          spare_warp_norms(sm, tc);
        }
      }
      __syncthreads();
      src.inputs_consumed(*this);  // streaming: the next item's inputs go in flight

      // 3. L2 norms of q (scaled by K^-0.5) and k, one warp per vector (without spare-warp
      // norms).
      if constexpr (!kSpareWarpNorms) {
        for (int job = warp; job < 2 * tc; job += Cfg::kWarps) {
          const int which = job & 1;
          l2_normalize_warp<K>(sm.qk[job >> 1][which], kQkScale<K>, which == 0, lane);
        }
      }
      if constexpr (Src::kStaged) {
        // The state tile to registers; the barrier inside load_state also completes the norms
        // (one barrier where there were two, docs/perf.md v7).
        src.load_state(*this, S, col_ok, s_base);
      } else {
        if constexpr (!kSpareWarpNorms) {
          __syncthreads();
        }
        if constexpr (Src::kStateStaged) {
          if (t0 == 0) {
            src.state_from_stage(*this, S, col_ok);
          }
        }
      }

      // 4. The recurrence.
      if constexpr (Src::kStaged) {
        if constexpr (Src::kRingForm) {
          steps_ring_stream<Src>(sm, S, col_ok[0], T, t0, tc);
        } else {
          steps_snapshot_stream<Src>(sm, S, col_ok, T, row, snap, t0, tc);
        }
      } else {
        steps_per_item<Src>(sm, S, col_ok, holds_tile, T, row, snap, t0, tc);
      }
      // The next chunk overwrites shared memory. The streaming kernel runs one chunk per item,
      // and its next live item passes a barrier before it writes shared memory (after its
      // input copies land), so it ends the item without one: fast warps start the next item's
      // set-up while slow ones finish their steps (docs/perf.md v10b).
      if constexpr (!Src::kStaged) {
        __syncthreads();
      }
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
};

/// Zeros one column slice (columns past V).
template <typename Slice>
__device__ __forceinline__ void zero_column(ColRegs<Slice>& dst) {
#pragma unroll
  for (int i = 0; i < Slice::NPT; ++i) {
#pragma unroll
    for (int e = 0; e < Slice::E; ++e) {
      dst[i][e] = 0.0f;
    }
  }
}

/// State columns col0 + j (j < CPT) of a head's [V][K] f32 state at `head` (global or shared
/// memory), zeros where !ok[j].
template <typename Slice>
__device__ __forceinline__ void load_state_columns(ColRegs<Slice> (&S)[Slice::CPT],
                                                   const bool (&ok)[Slice::CPT], const float* head,
                                                   int col0, int c) {
#pragma unroll
  for (int j = 0; j < Slice::CPT; ++j) {
    if (ok[j]) {
      load_column<Slice>(S[j], head + static_cast<int64_t>(col0 + j) * Slice::K, c);
    } else {
      zero_column<Slice>(S[j]);
    }
  }
}

/// What both sources read from global memory the same way: the layer's weights.
template <typename Item>
struct WeightReads {
  __device__ __forceinline__ void conv_taps(const Item& it, ConvTaps& t0, ConvTaps& t1) const {
    load_conv_pair<typename Item::Weight>(it.p.conv_weight, it.p.conv_bias, it.gch, t0, t1);
  }
  __device__ __forceinline__ float dt_bias(const Item& it) const { return it.p.dt_bias[it.ghk]; }
};

}  // namespace kda::kernels
