// item_prologue.cuh: a verify / extend work item's coordinates and indices (ItemPrologue), and
// the phases before its recurrence, per token chunk: 1. convolve_chunk (conv + SiLU, or the
// unfused activations, to shared memory, ring rawk/rawv and conv windows), 2. gates_chunk
// (EXP(g) and beta to shared memory, ring g/beta), 3. spare_warp_norms (q/k L2 norms on the
// warps without a channel pair). The order of every operation is contract §3's; run()
// (verify_item.cuh) orders the phases and their barriers.
// Record writes (verify only): ring rawk (pre-norm k) by the q/k owner CTA (tile 0 of the
// first v-head of the group: one writer per k-head); ring g/beta by tile 0 of each v-head;
// ring rawv and conv windows of v channels by every CTA for its slice; q/k windows by the
// q/k owner. Ring steps t >= L are never written. Never writes ssm_state or conv_state.
// Alignment (checked by the launchers): V even, every bf16 row/slot stride even and bf16
// base pointers 4-byte aligned (channel pairs), conv weights 16-byte aligned.
#pragma once

#include <cstdint>

#include "kernels/common/conv.cuh"
#include "kernels/common/delta_rule.cuh"
#include "kernels/common/tile_layout.cuh"
#include "kernels/verify/item_args.h"
#include "kernels/verify/item_source.h"
#include "kernels/verify/verify_traits.h"

namespace kda::kernels {

/// Conv taps of an (even, odd) channel pair: weights [D, 4] and bias [D] of WeightT.
template <typename WeightT>
__device__ __forceinline__ void load_conv_pair(const void* weight, const void* bias, int64_t ch,
                                               ConvTaps& t0, ConvTaps& t1) {
  t0 = load_conv_taps<WeightT>(weight, bias, ch);
  t1 = load_conv_taps<WeightT>(weight, bias, ch + 1);
}
/// What both sources read from global memory the same way: the layer's weights.
template <typename Item>
struct WeightReads {
  __device__ __forceinline__ void conv_taps(const Item& it, ConvTaps& t0, ConvTaps& t1) const {
    load_conv_pair<typename Item::Weight>(it.p.conv_weight, it.p.conv_bias, it.pair_channel, t0,
                                          t1);
  }
  __device__ __forceinline__ float dt_bias(const Item& it) const {
    return it.p.dt_bias[it.gate_index];
  }
};

/// One work item of the verify / extend kernel: the (V tile, v-head, request) triple.
/// The constructor computes indices only; load_constants() and run() read the item's inputs
/// through a source `Src`: GlobalSource (global memory) or StagedSource (verify/persistent.cuh:
/// the state tile from a shared-memory stage filled by a TMA bulk copy, the rest as
/// GlobalSource). Both hand the same values to the same arithmetic, so the bits are equal.
/// is_staged(Src::kSource): the state tile is copied to registers after the prologue (it is not
/// live through it) and the kernel runs one token chunk (T <= kChunk).
/// A draft-shaped item's first token row and token count (ItemPrologue::first_row, tokens);
/// empty for the dense instantiations, whose items keep their layout.
template <bool kShaped>
struct ShapedRows {
  int32_t shaped_row0, shaped_tokens;
};
template <>
struct ShapedRows<false> {};

/// Request n's rows (kShaped): token_offsets[n] and T_n, or n * T and T without offsets (a tree).
/// Read from index arrays that are complete at enqueue (before the PDL wait).
template <bool kShaped>
__device__ __forceinline__ ShapedRows<kShaped> shaped_rows_of(const VerifyParams& p, int n) {
  if constexpr (kShaped) {
    const int32_t row0 = p.token_offsets != nullptr ? p.token_offsets[n] : n * p.T;
    return {row0, p.token_offsets != nullptr ? p.token_offsets[n + 1] - row0 : p.T};
  } else {
    return {};
  }
}

/// kShaped: a ragged or tree call (VerifyParams::token_offsets / parents, contract §8): the
/// request's first token row and token count come from token_offsets (first_row, tokens), and
/// (unfused only) a tree node starts from its parent's state (ItemSteps::steps_per_item). The
/// dense instantiations carry none of that code.
template <typename Traits>
struct ItemPrologue : ShapedRows<Traits::kShaped> {
  KDA_VERIFY_TRAITS_MEMBERS(Traits);
  using Weight = WeightT;
  static constexpr bool kFused = FUSED;
  static constexpr bool kDraftShape = kShaped;
  static constexpr bool kDeferredCommit = kDeferred;  ///< a call with ring_pending (item_fold.cuh)
  /// Ring records at the slot's cursor (step t at (c + t) mod L): the deferred commit's calls, and
  /// every fast-output call (its cursor is 0 without one); the exact eager instantiations write
  /// step t at position t and carry no cursor code.
  static constexpr bool kCursorRecords =
      kDeferred || Traits::kSchedule == VerifySchedule::kFastChunk;
  using Cfg = TileConfig<K, BV, kWide, kDeferred>;
  using Slice = typename Cfg::Slice;
  static constexpr int P = Cfg::P;
  static constexpr int CPT = Cfg::CPT;
  /// Snapshot mode's per-step states are written once and at most one of a request's T is read
  /// again (by the commit, after every layer's verify): stored evict-first, they leave L2 to the
  /// data that is reused.
  static constexpr StoreHint kSnapshotStores = StoreHint::kStreaming;

  const TileArgs& args;
  const VerifyParams& p;
  int tile, hv, n, h;
  int tid, lane, warp, v0, group, c, col0;
  int64_t D, HK;
  int ch_local;
  int64_t pair_channel;  // global channel of this thread's pair, or -1
  bool is_qk, is_k;
  ConvTaps taps0, taps1;
  int gate_key, gate_token0;
  int64_t gate_index;
  float dt_bias;
  float a_log;      ///< A_log[hv] as loaded (load_constants)
  float exp_a_log;  ///< EXP(A_log[hv]): load_constants, or run() with wide registers

  /// The request's first token row: n * T, or token_offsets[n] (kShaped, ragged).
  __device__ __forceinline__ int64_t first_row() const {
    if constexpr (kShaped) {
      return this->shaped_row0;
    } else {
      return static_cast<int64_t>(n) * p.T;
    }
  }
  /// The request's tokens: T, or T_n (kShaped, ragged).
  __device__ __forceinline__ int tokens() const {
    if constexpr (kShaped) {
      return this->shaped_tokens;
    } else {
      return p.T;
    }
  }

  // Gate work: thread owns key channel gate_key = tid % K for tokens tid/K, +kGateStep, ...
  static constexpr int kGateStep = Cfg::kThreads / K;
  static constexpr int kGateIters = Cfg::kChunk / kGateStep;
  static_assert(Cfg::kThreads % K == 0 && Cfg::kChunk % kGateStep == 0, "gate work split");
  /// Gates computed together: those of 4 consecutive tokens (K = 128: 2, K = 64: 1).
  static constexpr int kGateGroup = kGateStep >= 4 ? 1 : 4 / kGateStep;
  static_assert(kGateIters % kGateGroup == 0, "whole gate groups");

  /// Warps with a conv channel pair, and the spare warps without one (run's kSpareWarpNorms).
  static constexpr int kConvWarps = (Cfg::kPairs + 31) / 32;
  static constexpr int kSpareWarps = Cfg::kWarps - kConvWarps;

  /// The ring persistent kernel's column swizzle (is_persistent_ring(Src::kSource)): register j of
  /// the state and of the trees holds column col0 + (j ^ swizzle) (run, step 4); elsewhere 0.
  template <typename Src>
  __device__ __forceinline__ int column_swizzle_of() const {
    return is_persistent_ring(Src::kSource) ? column_swizzle<P, CPT>(c) : 0;
  }

  __device__ __forceinline__ ItemPrologue(const TileArgs& a, const ItemCoords& at)
      : ItemPrologue(a, at, shaped_rows_of<kShaped>(a.p, at.n)) {}
  /// With the thread index given (a kernel that walks items: thread_index_opaque()).
  __device__ __forceinline__ ItemPrologue(const TileArgs& a, const ItemCoords& at, int thread)
      : ItemPrologue(a, at, shaped_rows_of<kShaped>(a.p, at.n), thread) {}
  /// With the request's rows already read (the persistent kernel's planned items: NextRun).
  __device__ __forceinline__ ItemPrologue(const TileArgs& a, const ItemCoords& at,
                                          const ShapedRows<kShaped>& rows,
                                          int thread = static_cast<int>(threadIdx.x))
      : ShapedRows<kShaped>(rows), args(a), p(a.p), tile(at.tile), hv(at.hv), n(at.n), h(at.h) {
    tid = thread;
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
    pair_channel = -1;
    if (tid < Cfg::kPairs) {
      if (ch_local < 2 * K) {
        pair_channel = (ch_local / K) * HK + static_cast<int64_t>(h) * K + (ch_local % K);
      } else if (v0 + ch_local - 2 * K < p.V) {
        pair_channel = 2 * HK + static_cast<int64_t>(hv) * p.V + v0 + ch_local - 2 * K;
      }
    }
    is_qk = ch_local < 2 * K;
    is_k = is_qk && ch_local >= K;
    gate_key = tid % K;
    gate_token0 = tid / K;
    gate_index = static_cast<int64_t>(hv) * K + gate_key;
  }

  /// The gate constants, and the pair's conv taps in the per-item kernel (before the PDL
  /// wait; the persistent kernel loads its taps in the conv step). The wide form (kWide) leaves
  /// EXP(A_log) to run: the one-CTA-per-SM kernel starts only when the previous kernel's CTA has
  /// left its SM, so a wait for the A_log load before griddepcontrol.wait is not hidden behind that
  /// kernel. The deferred wide BV = 32 tile, whose CTA can enter early (TileConfig::kMinCtasPerSm),
  /// runs the same with EXP(A_log) on either side of the wait and keeps the wide form.
  template <typename Src>
  __device__ __forceinline__ void load_constants(const Src& src) {
    if constexpr (!is_staged(Src::kSource)) {
      if (FUSED && pair_channel >= 0) {
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
  /// or activation), the gate logits of key gate_key, the beta logit of token tid.
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
      if (!(FUSED && is_staged(Src::kSource)) && pair_channel >= 0 && tt < tc) {
        in.xs[tt] = src.x(*this, t0, tt);
      }
    }
#pragma unroll
    for (int j = 0; j < kGateIters; ++j) {
      const int tt = gate_token0 + j * kGateStep;
      in.as[j] = tt < tc ? src.a(*this, t0, tt) : 0u;
    }
    in.bs = tid < tc ? src.b(*this, t0) : 0u;
  }

  /// The padding row (slot < 0): zero outputs, touch nothing else.
  __device__ __forceinline__ void zero_outputs() const {
    const int T = tokens();
    for (int t = 0; t < T; ++t) {
      // (The dense row in its own form: through first_row() it made the unfused K = 64 ring
      // persistent kernel spill.)
      const int64_t r = kShaped ? first_row() + t : static_cast<int64_t>(n) * T + t;
      bf16_t* out_row = p.out + (r * p.HV + hv) * p.V;
      for (int j = tid; j < BV && v0 + j < p.V; j += Cfg::kThreads) {
        out_row[v0 + j] = bf16_t{0};
      }
    }
  }

  /// Where this thread's channel pair stores each token's values (run, step 1).
  struct PairStores {
    float* sm_dst;        ///< token 0's pair in shared memory
    int sm_stride;        ///< floats from one token's row of sm_dst's array to the next
    bf16_t* win_base;     ///< the pair's conv window after token 0 (three rows of D per token)
    bf16_t* ring_pair;    ///< ring record of this pair at position 0 (L-strided), or null
    int64_t ring_step;    ///< elements per ring position
    int32_t ring_cursor;  ///< kCursorRecords: the slot's ring base c (step t at (c + t) mod L)
    bool write_window;    ///< this CTA writes the pair's windows
  };

  /// The pair's destinations that do not depend on the token.
  __device__ __forceinline__ PairStores pair_stores(TileSmem<Cfg>& sm, int slot, int64_t row,
                                                    bool ring, int cursor, bool qk_owner,
                                                    bool write_window) const {
    float* sm_dst = is_qk ? &sm.qk[0][ch_local / K][ch_local % K] : &sm.v[0][ch_local - 2 * K];
    const int sm_stride = is_qk ? 2 * K : BV;
    bf16_t* win_base = p.conv_window + row * p.conv_window_row_stride + pair_channel;
    bf16_t* ring_pair = nullptr;
    int64_t ring_step = 0;
    if (ring && pair_channel >= 0) {
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
    return PairStores{sm_dst, sm_stride, win_base, ring_pair, ring_step, cursor, write_window};
  }

  /// Step 1: q/k/v of the chunk [t0, t0 + tc) for this thread's channel pair (pair_channel >= 0):
  /// conv + SiLU (fused) or the activations (unfused), to shared memory, the ring and the conv
  /// windows. w0 / w1: the pair's conv window, oldest first; advanced past the chunk.
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
    const int32_t ring_cursor = dst.ring_cursor;
    const bool write_window = dst.write_window;
    // The persistent kernel loads the taps here: held from the item's start they are live
    // across its item loop and spill. The per-item kernel loads them with the constants,
    // before the PDL wait, which hides the loads at small B.
    if constexpr (FUSED && is_staged(Src::kSource)) {
      src.conv_taps(*this, taps0, taps1);
    }
    // Token t's record offsets from win_base / ring_pair advance by one step per token (no
    // 64-bit multiply per token); with a ring cursor (kCursorRecords) its ring record is at
    // position (c + t) mod L instead, a 32-bit offset.
    constexpr bool kTokenLoop = FUSED && is_staged(Src::kSource);
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
        if constexpr (kCursorRecords) {
          st_bf16x2(ring_pair + ((ring_cursor + t) & (p.L - 1)) * static_cast<int32_t>(ring_step),
                    y0, y1);
        } else {
          st_bf16x2(ring_pair + ring_off, y0, y1);
        }
      }
    };
    if constexpr (kTokenLoop) {
      // Streaming kernels (throughput-bound, 128 registers): the rows re-read from the
      // ItemInputs rows in shared memory, kTokenStep tokens at a time. Unrolled over the
      // chunk, the tokens and windows sit in registers and the kernel spills. The ring
      // kernel takes two tokens per step (the window of token tt, its x and token tt + 1's
      // x: token tt + 1's window is rows tt + 1 .. tt + 3), so that their conv + SiLU chains
      // overlap; in the snapshot kernel that form spills, and it keeps one token per step.
      constexpr int kTokenStep = is_persistent_ring(Src::kSource) ? 2 : 1;
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
      // conv + SiLU chains run one after another.
      // BV = 128 at 128 registers (the fallback when the persistent kernel cannot run) keeps
      // one token per group: with four, the fused tile spills far more. The fast-output kernel
      // holds no state in registers through its prologue.
      constexpr int kGroup =
          BV <= 64 || kWide || Traits::kSchedule == VerifySchedule::kFastChunk ? 4 : 1;
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

  /// Step 2: this thread's gates (key gate_key) and beta (token tid) of the chunk [t0, t0 + tc):
  /// EXP(g) and beta to shared memory; g and beta to the ring by the gate owner.
  /// `cursor`: the slot's ring base (step t at position (cursor + t) mod L).
  __device__ __forceinline__ void gates_chunk(TileSmem<Cfg>& sm, const ChunkInputs& in, int slot,
                                              bool ring, int cursor, bool gate_owner, int t0,
                                              int tc) const {
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
        const int tt = gate_token0 + (jg + u) * kGateStep;
        if (tt < tc) {
          const int t = t0 + tt;
          sm.decay[tt][gate_key] = decay[u];
          if (ring && gate_owner && t < p.L) {
            p.ring_g[slot * p.ring_g_slot_stride +
                     (static_cast<int64_t>(hv) * p.L +
                      (kCursorRecords ? (cursor + t) & (p.L - 1) : t)) *
                         K +
                     gate_key] = g[u];
          }
        }
      }
    }
    if (tid < tc) {
      const int t = t0 + tid;
      const float beta = kda_sigmoid(bf16_bits_to_float(in.bs));
      sm.beta[tid] = beta;
      if (ring && gate_owner && t < p.L) {
        p.ring_beta[slot * p.ring_beta_slot_stride + static_cast<int64_t>(hv) * p.L +
                    (kCursorRecords ? (cursor + t) & (p.L - 1) : t)] = beta;
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
};

}  // namespace kda::kernels
