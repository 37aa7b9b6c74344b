// fast_item.cuh: the fast-output verify (contract §10; VerifySchedule::kFastChunk): CTAs of 256
// threads, two per SM, a CTA per work item (V tile, v-head hv, request n) here, or, when the plan
// is asked for it, the resident CTAs walking the items beyond one wave (fast_walk.cuh). Per item:
//   1. The state tile [BV][K] f32 goes in flight to shared memory (cp.async), right after the
//      conv history's and the first chunk's loads (a walking CTA's previous item has put it in
//      flight already). A staggered launch (TileArgs::stagger_tiles) holds back the tiles of its
//      odd-parity CTAs until their first chunk's gates are issued, so co-resident CTAs do not all
//      wait on the memory pipe at once; the bits are the same either way.
//   2. The exact prologue, per 8-token chunk (item_prologue.cuh, the code every exact path runs):
//      conv + SiLU, gates, ring records and conv windows, q/k norms. So the records, windows and
//      everything the fold reads are bitwise the exact verify's.
//   2b. A u-free deferred call (kDeferredFold): once the prologue is done (and the tile has landed
//      under it), the slot's pending steps folded onto the staged tile with the eager fold's
//      arithmetic (item_fold.cuh, u computed; their records, sent to L2 once the item's first
//      loads are out, read into the operand rows' space, free until 3a), the folded tile stored
//      to ssm_fold_out and kept in the stage; its tile is never late.
//   3. The chunked (WY) form of the draft's outputs, with prefix decays P_t = d_0 ... d_t
//      (ordered products of per-step factors d = EXP(g) <= 1; never a division by one):
//        xk_t = kn_t * P_t, xq_t = qs_t * P_t                   (rows of the tensor-core operand)
//        A[t][i] = sum_k kn_t kn_i d_{i+1}..d_t, M[t][i] = sum_k qs_t kn_i d_{i+1}..d_t  (i <= t)
//                                                              (fp32, the §3 reduction tree)
//        W_t = S0^T xk_t, QS_t = S0^T xq_t                     (3xTF32 mma, fp32 accumulation)
//        u_t = (v_t - (W_t + sum_{i<t} A[t][i] u_i)) * beta_t
//        o_t = QS_t + sum_{i<=t} M[t][i] u_i
//      Every column's value depends only on its own state column and the shared per-head terms,
//      computed by the same threads in the same order whatever the tile, the batch or the rows:
//      the outputs are bitwise batch-invariant (§10 (a)).
// A lazy verify (kLazyHistory, contract §11) puts the slot's P pending ring steps before the draft:
// the chunk is P + T tokens (history first; their k normalised from the ring's raw k, d = EXP(g),
// v, beta, no query), held in the TileSmem rows after the draft's (ChunkOrder maps the chunk's
// token order to those rows), and only the draft's outputs are stored.
// Writes no state but a deferred call's folded tile (ssm_fold_out, bitwise the eager fold's): the
// committed state never depends on the fast outputs (§10).
// Shared memory (dynamic, FastSmem): the state stage, one TileSmem per 8-token chunk, the split
// operand rows (aliased by the contraction results once the mma is done), the T x T terms.
// The contraction takes one of two forms (fast_layout.h states and tests every operand map):
//   - wide (T > 4): per 8-token row tile, the keys' and queries' split rows are the 16-row A
//     operand (stored in fragment order: one conflict-free 16-byte load is a register quad), an
//     8-column state tile the B operand;
//   - narrow (T <= 4): a 16-row state tile is the A operand, the 4 keys and 4 queries the 8
//     columns of B: half the wide form's mmas, where the wide form's rows would be half zeros.
// The state stage [BV][K] f32 keeps the 16-byte chunk q of row r at chunk q ^ (4 * (r & 1)).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/mma_tf32.cuh"
#include "kernels/common/persistent_stage.cuh"
#include "kernels/verify/fast_layout.h"
#include "kernels/verify/item_fold.cuh"
#include "kernels/verify/item_prologue.cuh"
#include "kernels/verify/per_item.cuh"
#include "kernels/verify/tile_policy.h"

namespace kda::kernels {

/// Puts the 128-byte line of `addr` in flight to L2 (a hint: no value depends on it).
__device__ __forceinline__ void prefetch_l2(const void* addr) {
#if defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];" ::"l"(addr));
#else
  (void)addr;
#endif
}

/// The fast kernel's shared memory for a call of up to T tokens (host and device).
template <int K, int BV>
struct FastSmem {
  using Cfg = TileConfig<K, BV>;
  static constexpr int kRowsPerTile = 16;  ///< mma rows: 8 key rows, then 8 query rows
  KDA_HD static constexpr size_t align(size_t b) { return (b + 127) / 128 * 128; }
  static constexpr size_t kStageBytes = align(size_t{BV} * K * sizeof(float));
  static constexpr size_t kChunkBytes = align(sizeof(TileSmem<Cfg>));
  /// Row tiles of 8 tokens.
  KDA_HD static constexpr int row_tiles(int T) { return (T + 7) / 8; }
  /// Per row tile: the big and small split rows, [2][16][K] f32 (as TF32 bits); aliased after
  /// the mma by W and QS, [8 * tiles][BV] f32 each, which fit (BV <= 2 K).
  KDA_HD static constexpr size_t operand_bytes(int T) {
    return align(size_t{2} * row_tiles(T) * kRowsPerTile * K * sizeof(float));
  }
  static_assert(BV <= 2 * K, "W and QS fit in the operand rows");
  static constexpr size_t kTermBytes = align(2 * kFastMaxTokens * kFastMaxTokens * sizeof(float));
  KDA_HD static constexpr size_t chunks_offset() { return kStageBytes; }
  KDA_HD static constexpr size_t operand_offset(int T) {
    return kStageBytes + row_tiles(T) * kChunkBytes;
  }
  KDA_HD static constexpr size_t term_offset(int T) { return operand_offset(T) + operand_bytes(T); }
  KDA_HD static constexpr size_t bytes(int T) { return term_offset(T) + kTermBytes; }
  /// A deferred call's (kDeferredFold): its pending fold's records take one TileSmem from
  /// operand_offset(T), which the operand rows and the terms then hold (3a onwards).
  KDA_HD static constexpr size_t fold_bytes(int T) {
    return bytes(T) > operand_offset(T) + kChunkBytes ? bytes(T) : operand_offset(T) + kChunkBytes;
  }
  /// 32-bit words of one row tile's operand rows (fast_layout.h, the wide form).
  static constexpr int kTileWords = fast_layout::kWideTileWords<K>;
};

using fast_layout::swz;

/// Faults a test plants in the fast form to see its checks fail (tests/fast_faults_gpu.cu); the
/// library instantiates kNone alone.
enum class FastFault : uint8_t {
  kNone,
  kOneTf32Product,  ///< the state contractions at 1xTF32 (the split operands dropped)
  kDecayOffByOne,   ///< the T x T terms' decay ratios one step late (d_{t-1} for d_t)
  kDropIntraTerm,   ///< token 1 without its intra-chunk terms (i < t)
  kMaskOffByOne,    ///< the outputs without their diagonal term (i < t, not i <= t)
  kLateTileShort,   ///< a staggered CTA's late tile one column short (its last one zero-filled)
  kFoldStepShort,   ///< a deferred call's pending fold without its last step
};

/// One fast-output work item (the prologue's coordinates and phases, ItemPrologue).
template <typename Traits, FastFault kFault = FastFault::kNone>
struct FastItem : ItemPrologue<Traits> {
  using Prologue = ItemPrologue<Traits>;
  KDA_VERIFY_TRAITS_MEMBERS(Traits);
  using Prologue::args, Prologue::convolve_chunk, Prologue::gates_chunk, Prologue::h, Prologue::hv,
      Prologue::is_qk, Prologue::lane, Prologue::load_chunk, Prologue::p, Prologue::pair_channel,
      Prologue::pair_stores, Prologue::tid, Prologue::tile, Prologue::v0, Prologue::warp,
      Prologue::zero_outputs;
  using Prologue::Prologue;
  using typename Prologue::ChunkInputs, typename Prologue::PairStores;
  using Cfg = typename Prologue::Cfg;
  using Smem = FastSmem<K, BV>;
  static constexpr int kWarps = Cfg::kWarps;
  static constexpr int kNTiles = BV / 8;  ///< 8-column mma tiles
  static constexpr int kTilesPerWarp = (kNTiles + kWarps - 1) / kWarps;
  /// The narrow form (contract_narrow): up to 4 tokens, the state as the 16-row A operand.
  static constexpr int kNarrowTokens = 4;
  static constexpr int kNarrowRows = 2 * kNarrowTokens;  ///< the B operand's 8 columns
  static constexpr int kMTiles = BV / 16;                ///< 16-row state tiles, one per warp
  static constexpr int E = K / 32;  ///< key elements per lane in the T x T terms
  static constexpr bool kLazy = Traits::kLazy;
  /// A deferred call's pending fold holds a thread's columns two at a time (item_fold.cuh
  /// fold_pending), one at a time in the ragged BV = 64 form: at 128 registers more spill (all
  /// four of the BV = 128 tile; both of the ragged BV = 64 tile, which holds the row offsets too).
  /// A pass's steps are that many independent trees.
  static constexpr int kFoldPasses =
      Prologue::CPT >= 4 ? Prologue::CPT / 2 : (kShaped && Prologue::CPT == 2 ? 2 : 1);
  static_assert(Cfg::kThreads == 256 && BV % 8 == 0 && BV <= 2 * K, "fast tile shape");

  /// The chunk's token order: token i of the chunk (the P history steps, then the T draft
  /// tokens) sits in TileSmem row phys(i): the draft's rows 0..T-1 are the prologue's, the
  /// history's T..T+P-1 follow. Without a history (P = 0, every call but a lazy one) phys(i) = i.
  struct ChunkOrder {
    int P, T;
    __device__ __forceinline__ int phys(int i) const {
      if constexpr (kLazy) {
        return i < P ? T + i : i - P;
      } else {
        return i;
      }
    }
  };

  /// The T x T terms A[t][i] (t > i) and M[t][i] (t >= i) of the chunk's T tokens (in `order`)
  /// into termA / termM (row t, column i, kFastMaxTokens wide): key token i on the warp
  /// `first` + i of `count` warps ...; lanes over k, the two dots of a (t, i) pair through one §3
  /// tree (level by level, each sum its own).
  __device__ __forceinline__ void chunk_terms(unsigned char* smem, int T, const ChunkOrder& order,
                                              int first, int count, float* termA,
                                              float* termM) const {
    auto chunk = [&](int row) -> const TileSmem<Cfg>& {
      return reinterpret_cast<const TileSmem<Cfg>*>(smem + Smem::chunks_offset())[row >> 3];
    };
    for (int i = first; i < T; i += count) {
      float kni[E], r[E];
      const int ri = order.phys(i);
      load_vec<E>(kni, &chunk(ri).qk[ri & 7][1][lane * E]);
#pragma unroll
      for (int e = 0; e < E; ++e) {
        r[e] = 1.0f;
      }
      for (int t = i; t < T; ++t) {
        const int rt = order.phys(t);
        const TileSmem<Cfg>& sm = chunk(rt);
        float d[E], w[E], kt[E], qt[E];
        load_vec<E>(d, &sm.decay[rt & 7][lane * E]);
        load_vec<E>(kt, &sm.qk[rt & 7][1][lane * E]);
        load_vec<E>(qt, &sm.qk[rt & 7][0][lane * E]);
        if constexpr (kFault == FastFault::kDecayOffByOne) {
          if (t > i + 1) {
            const int rp = order.phys(t - 1);
            load_vec<E>(d, &chunk(rp).decay[rp & 7][lane * E]);
          }
        }
#pragma unroll
        for (int e = 0; e < E; ++e) {
          if (t > i) {
            r[e] = __fmul_rn(r[e], d[e]);
          }
          w[e] = __fmul_rn(kni[e], r[e]);
        }
        float sums[2] = {tree_partial<E>(w, qt), tree_partial<E>(w, kt)};
        tree_across_lanes<32, 2>(sums);
        if (lane == 0) {
          termM[t * kFastMaxTokens + i] = sums[0];
          termA[t * kFastMaxTokens + i] = t > i ? sums[1] : 0.0f;
        }
      }
    }
  }

  /// The narrow form of the contraction (T <= kNarrowTokens): the mma's 8 columns are the
  /// T <= 4 keys and queries (operand rows [part][8][K], swizzled as the stage), its 16 rows a
  /// state tile (warp w: rows 16 w .. 16 w + 15), so a state tile takes half the wide form's
  /// mmas. Accumulation as in contract<>. W[t][c] at word t BV + c, QS 8 BV words after W;
  /// ends with a __syncthreads.
  __device__ __forceinline__ void contract_narrow(uint32_t* operand, const float* stage) {
    const int g = lane >> 2;
    const int tig = lane & 3;
    float hi[4] = {}, lo[2][4] = {};
    const int mt = warp;
    if (mt < kMTiles) {
#pragma unroll 2
      for (int j = 0; j < K / 16; ++j) {
        const int k = 16 * j + 4 * tig;
        const uint4 xb =
            *reinterpret_cast<const uint4*>(operand + fast_layout::narrow_word<K>(0, g, k));
        const uint4 xs =
            *reinterpret_cast<const uint4*>(operand + fast_layout::narrow_word<K>(1, g, k));
        const float4 r0 = *reinterpret_cast<const float4*>(stage + swz<K>(mt * 16 + g, k));
        const float4 r1 = *reinterpret_cast<const float4*>(stage + swz<K>(mt * 16 + g + 8, k));
        const Tf32Split a0 = split_tf32(r0.x), a1 = split_tf32(r0.y), a2 = split_tf32(r0.z),
                        a3 = split_tf32(r0.w), c0 = split_tf32(r1.x), c1 = split_tf32(r1.y),
                        c2 = split_tf32(r1.z), c3 = split_tf32(r1.w);
        // step 0: k slots (tig, tig + 4) = elements (x, y); step 1: (z, w)
        const uint4 a_big[2] = {make_uint4(a0.big, c0.big, a1.big, c1.big),
                                make_uint4(a2.big, c2.big, a3.big, c3.big)};
        const uint4 a_small[2] = {make_uint4(a0.small, c0.small, a1.small, c1.small),
                                  make_uint4(a2.small, c2.small, a3.small, c3.small)};
        const uint2 b_big[2] = {make_uint2(xb.x, xb.y), make_uint2(xb.z, xb.w)};
        const uint2 b_small[2] = {make_uint2(xs.x, xs.y), make_uint2(xs.z, xs.w)};
        float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int step = 0; step < 2; ++step) {
          if constexpr (kFault != FastFault::kOneTf32Product) {
            mma_tf32_16x8x8(lo[0], a_small[step], b_big[step]);
            mma_tf32_16x8x8(lo[1], a_big[step], b_small[step]);
          }
          mma_tf32_16x8x8(part, a_big[step], b_big[step]);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          hi[e] = __fadd_rn(hi[e], part[e]);
        }
      }
    }
    __syncthreads();  // every warp is done with the operand rows: W and QS alias them
    if (mt < kMTiles) {
      // c0, c1: state row g, columns 2 tig, 2 tig + 1; c2, c3: row g + 8. Columns 0..3 are the
      // keys' (W), 4..7 the queries' (QS).
      float* const out = reinterpret_cast<float*>(operand);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        out[fast_layout::narrow_out_word<BV>(e, g, tig, mt)] =
            __fadd_rn(hi[e], __fadd_rn(lo[0][e], lo[1][e]));
      }
    }
    __syncthreads();
  }

  /// W[t][c] = S0^T xk_t and QS[t][c] = S0^T xq_t for the kTiles row tiles of `operand`
  /// (t < 8 kTiles, c < BV), 3xTF32 with fp32 accumulation, stored over the operand rows
  /// (W at word t BV + c, QS after W's 8 kTiles rows). Warp w takes column tiles w, w + 8, ...;
  /// ends with a __syncthreads.
  template <int kTiles>
  __device__ __forceinline__ void contract(uint32_t* operand, const float* stage) {
    constexpr int kTileWords = Smem::kTileWords;
    constexpr bool kWarpsFull = kNTiles % kWarps == 0;  // every warp has every one of its tiles
    const int g = lane >> 2;
    const int tig = lane & 3;
    // The tensor cores' f32 accumulation truncates (round toward zero) at every mma: summed
    // into one accumulator, the 3 K / 8 mmas of a column would bias it by up to that many f32
    // ulps of |W|. So the big x big products of a k-step pair go into a fresh accumulator (two
    // truncations of a 16-term partial) that is added to `hi` in f32 round-to-nearest, and the
    // cross terms (2^-11 of the products) accumulate in `lo` (two chains: a_small b_big and
    // a_big b_small), whose truncations are as small.
    float hi[kTiles][kTilesPerWarp][4] = {}, lo[kTiles][kTilesPerWarp][2][4] = {};
    if (kWarpsFull || warp < kNTiles) {
#pragma unroll(kTiles == 1 ? 2 : 1)
      for (int j = 0; j < K / 16; ++j) {
        uint4 a[kTiles][2][2];  // [row tile][big, small][step]: the mma's register quads
#pragma unroll
        for (int m = 0; m < kTiles; ++m) {
#pragma unroll
          for (int part = 0; part < 2; ++part) {
#pragma unroll
            for (int step = 0; step < 2; ++step) {
              a[m][part][step] = *reinterpret_cast<const uint4*>(
                  operand + m * kTileWords + fast_layout::wide_a_word<K>(part, j, step, lane));
            }
          }
        }
#pragma unroll
        for (int n = 0; n < kTilesPerWarp; ++n) {
          const int nt = warp + n * kWarps;
          if (kWarpsFull || nt < kNTiles) {
            const float4 s =
                *reinterpret_cast<const float4*>(stage + swz<K>(nt * 8 + g, 16 * j + 4 * tig));
            const Tf32Split sx = split_tf32(s.x), sy = split_tf32(s.y), sz = split_tf32(s.z),
                            sw = split_tf32(s.w);
            // step 0: slots (tig, tig + 4) = elements (x, y); step 1: (z, w)
            const uint2 b_big[2] = {make_uint2(sx.big, sy.big), make_uint2(sz.big, sw.big)};
            const uint2 b_small[2] = {make_uint2(sx.small, sy.small),
                                      make_uint2(sz.small, sw.small)};
#pragma unroll
            for (int m = 0; m < kTiles; ++m) {
              float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
              for (int step = 0; step < 2; ++step) {
                if constexpr (kFault != FastFault::kOneTf32Product) {
                  mma_tf32_16x8x8(lo[m][n][0], a[m][1][step], b_big[step]);
                  mma_tf32_16x8x8(lo[m][n][1], a[m][0][step], b_small[step]);
                }
                mma_tf32_16x8x8(part, a[m][0][step], b_big[step]);
              }
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                hi[m][n][e] = __fadd_rn(hi[m][n][e], part[e]);
              }
            }
          }
        }
      }
    }
    __syncthreads();  // every warp is done with the operand rows: W and QS alias them
    float* const Wt = reinterpret_cast<float*>(operand);
    float* const QSt = Wt + kTiles * 8 * BV;
    if (kWarpsFull || warp < kNTiles) {
#pragma unroll
      for (int m = 0; m < kTiles; ++m) {
        const int t = m * 8 + g;  // rows past T hold products of zero rows: stored, never read
#pragma unroll
        for (int n = 0; n < kTilesPerWarp; ++n) {
          const int nt = warp + n * kWarps;
          if (kWarpsFull || nt < kNTiles) {
            const int c = nt * 8 + 2 * tig;
            float r[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              r[e] = __fadd_rn(hi[m][n][e], __fadd_rn(lo[m][n][0][e], lo[m][n][1][e]));
            }
            *reinterpret_cast<float2*>(Wt + t * BV + c) = make_float2(r[0], r[1]);
            *reinterpret_cast<float2*>(QSt + t * BV + c) = make_float2(r[2], r[3]);
          }
        }
      }
    }
    __syncthreads();
  }

  /// A lazy call's history (contract §11) into TileSmem rows T .. T + P - 1 (`chunk`: row ->
  /// its TileSmem): step j from ring position (cursor - P + j) mod L, its k normalised as the
  /// prologue normalises the draft's keys, d = EXP(g), a zero query, v of the tile's columns and
  /// beta. Warp w takes the key and decay rows of steps w, w + 8, ...; the values go by thread.
  template <typename ChunkOf>
  __device__ __forceinline__ void load_history(int slot, int cursor, int P, int T, int cols,
                                               const ChunkOf& chunk) const {
    const int L = p.L;
    for (int j = warp; j < P; j += kWarps) {
      const int row = T + j;
      TileSmem<Cfg>& sm = chunk(row);
      const int pos = (cursor - P + j) & (L - 1);
      const bf16_t* rawk =
          p.ring_rawk + slot * p.ring_rawk_slot_stride + (static_cast<int64_t>(h) * L + pos) * K;
      const float* g =
          p.ring_g + slot * p.ring_g_slot_stride + (static_cast<int64_t>(hv) * L + pos) * K;
      for (int k = lane; k < K; k += 32) {
        sm.qk[row & 7][1][k] = ld_bf16(rawk + k);
        sm.qk[row & 7][0][k] = 0.0f;
        sm.decay[row & 7][k] = kda_exp(g[k]);
      }
      __syncwarp();
      l2_normalize_warp<K>(sm.qk[row & 7][1], 1.0f, false, lane);
    }
    for (int e = tid; e < P * BV; e += Cfg::kThreads) {
      const int j = e / BV;
      const int c = e - j * BV;
      const int row = T + j;
      const int pos = (cursor - P + j) & (L - 1);
      const int64_t step = static_cast<int64_t>(hv) * L + pos;
      TileSmem<Cfg>& sm = chunk(row);
      sm.v[row & 7][c] =
          c < cols ? ld_bf16(p.ring_rawv + slot * p.ring_rawv_slot_stride + step * p.V + v0 + c)
                   : 0.0f;
      if (c == 0) {
        sm.beta[row & 7] = p.ring_beta[slot * p.ring_beta_slot_stride + step];
      }
    }
  }

  /// Puts a deferred call's `n` pending steps' records (ring positions (first + j) mod L) in
  /// flight to L2, so that the fold (2b), which reads them after the prologue, finds them there:
  /// per step the raw key row (h), the gate row (hv), the tile's raw values and beta, one prefetch
  /// per 128-byte line, spread over the CTA's threads. A hint: no value depends on it.
  __device__ __forceinline__ void prefetch_pending(int slot, int first, int n, int cols) const {
    constexpr int kKeyLines = K * 2 / 128;             // bf16 key row
    constexpr int kGateLines = K * 4 / 128;            // f32 gate row
    constexpr int kValueLines = (BV * 2 + 127) / 128;  // bf16 values of the tile (its columns)
    constexpr int kLines = kKeyLines + kGateLines + kValueLines + 1;  // + beta
    const int64_t L = p.L;
    for (int e = tid; e < n * kLines; e += Cfg::kThreads) {
      const int j = e / kLines;
      const int line = e - j * kLines;
      const int64_t pos = (first + j) & (p.L - 1);
      const void* addr;
      if (line < kKeyLines) {
        addr = p.ring_rawk + slot * p.ring_rawk_slot_stride + (h * L + pos) * K + line * 64;
      } else if (line < kKeyLines + kGateLines) {
        addr =
            p.ring_g + slot * p.ring_g_slot_stride + (hv * L + pos) * K + (line - kKeyLines) * 32;
      } else if (line < kLines - 1) {
        if ((line - kKeyLines - kGateLines) * 64 >= cols) {
          continue;  // past V
        }
        addr = p.ring_rawv + slot * p.ring_rawv_slot_stride + (hv * L + pos) * p.V + v0 +
               (line - kKeyLines - kGateLines) * 64;
      } else {
        addr = p.ring_beta + slot * p.ring_beta_slot_stride + hv * L + pos;
      }
      prefetch_l2(addr);
    }
  }

  /// The state tile of (slot, v-head hv, V tile from v0): min(BV, V - v0) rows of K f32.
  static __device__ __forceinline__ const float* tile_head(const VerifyParams& p, int slot, int hv,
                                                           int v0) {
    return p.ssm_state + slot * p.ssm_slot_stride + (static_cast<int64_t>(hv) * p.V + v0) * K;
  }

  /// Puts state tile `head` (`cols` <= BV rows of K f32, contiguous) in flight to the stage
  /// (cp.async, waited for by the source's wait_state): thread tid copies the 16-byte chunk
  /// tid % (K / 4) of rows tid / (K / 4) + kRowsPerPass i (one cp.async each at a fixed offset: a
  /// row keeps its parity, so its swizzle); rows past `cols` are zero-filled (no column reads
  /// garbage) and read nothing. The stage is complete once every thread has waited for its
  /// copies and passed a __syncthreads.
  __device__ __forceinline__ void stage_tile(float* stage, const float* head, int cols) const {
    constexpr int kChunksPerRow = K / 4;
    constexpr int kRowsPerPass = Cfg::kThreads / kChunksPerRow;
    static_assert(BV % kRowsPerPass == 0 && kRowsPerPass % 2 == 0, "whole even passes");
    const int r0 = tid / kChunksPerRow;
    const int k = (tid % kChunksPerRow) * 4;
    const float* src0 = head + r0 * K + k;
    float* const dst0 = stage + swz<K>(r0, k);
#pragma unroll
    for (int i = 0; i < BV / kRowsPerPass; ++i) {
      const bool valid = r0 + i * kRowsPerPass < cols;
      cp_async16_zfill(dst0 + i * kRowsPerPass * K, valid ? src0 + i * kRowsPerPass * K : head,
                       valid);
    }
  }

  /// Runs the item (the header's phases). `smem`: FastSmem<K, BV>::bytes(p.T) bytes (a lazy
  /// call's: bytes(p.L)). The source `src` (FastGlobalSource, or the walk's FastWalkSource in
  /// fast_walk.cuh) hands over the inputs and schedules the state tile's copies: it stages this
  /// item's tile at the start (stages_own_tile), waits for it before the contraction
  /// (wait_state), and is told when this item is done with its inputs (inputs_consumed, after the
  /// prologue's last barrier) and with the stage (state_consumed, after the contraction's); the
  /// latter's result is returned (false for a padding row).
  template <typename Src>
  __device__ __forceinline__ bool run(unsigned char* smem, const Src& src) {
    const int T = this->tokens();
    const int slot = src.slot(*this);
    if (slot < 0) {  // padding row: zero outputs, touch nothing else (nothing is staged for it)
      zero_outputs();
      return false;
    }
    const int64_t row = src.row(*this);
    const bool qk_owner = tile == 0 && hv == h * static_cast<int>(args.div.group.divisor);
    const bool gate_owner = tile == 0;
    const bool write_window = pair_channel >= 0 && (is_qk ? qk_owner : true);
    const int cols = min(BV, p.V - v0);
    // The records at the slot's ring cursor (a deferred or lazy call's; 0 without one).
    const int cursor = ring_cursor(p, slot);
    // A lazy call's chunk: the slot's P pending steps, then the T draft tokens (C in all).
    const int P = kLazy ? pending_steps(p, slot) : 0;
    const int C = P + T;
    const ChunkOrder order{P, T};

    // 1. The state tile in flight (unless the previous item of this CTA put it there already; a
    // late tile after the first chunk's gates). It is waited for before the contraction.
    float* const stage = reinterpret_cast<float*>(smem);
    // A lazy call's tile is never late, nor a deferred call's (the plan never staggers one).
    const bool late = !kLazy && !kDeferred && src.late_tile(args);
    const auto stage_own = [&](bool is_late) {
      const bool short_tile = kFault == FastFault::kLateTileShort && is_late;
      stage_tile(stage, tile_head(p, slot, hv, v0), short_tile ? cols - 1 : cols);
    };

    // A deferred call's pending count, read by the fold (2b); its records go to L2 once the
    // history, the inputs and the tile are in flight (the prefetch waits for the count).
    const int pending = kDeferred ? pending_steps(p, slot) : 0;

    // The pair's conv history and (Src::kEarlyInputs) the first chunk's inputs (raw bits): the
    // conv waits for them, the state tile is needed only after the prologue. Issued before the
    // tile's copies, they reach the memory pipe ahead of them, and the inputs do not wait for the
    // history's conversion: one round trip before the conv, not two behind the tile.
    uint32_t hist_bits[kConvHistory] = {};
    if (pair_channel >= 0) {
#pragma unroll
      for (int j = 0; j < kConvHistory; ++j) {
        hist_bits[j] = src.hist(*this, slot, j);
      }
    }
    ChunkInputs in;
    if constexpr (Src::kEarlyInputs) {
      load_chunk(src, 0, min(Cfg::kChunk, T), in);
    }
    if (src.stages_own_tile() && !late) {
      stage_own(false);
    }
    if constexpr (kDeferred) {
      prefetch_pending(slot, cursor - pending, pending, cols);
    }

    // 2. The exact prologue, chunk by chunk, into one TileSmem per chunk.
    auto chunk = [&](int t) -> TileSmem<Cfg>& {
      return reinterpret_cast<TileSmem<Cfg>*>(smem + Smem::chunks_offset())[t >> 3];
    };
    float w0[kConvHistory], w1[kConvHistory];
    if (pair_channel >= 0) {
#pragma unroll
      for (int j = 0; j < kConvHistory; ++j) {
        const float2 hp = bf16x2_bits_to_float2(hist_bits[j]);
        w0[j] = hp.x;
        w1[j] = hp.y;
      }
    }
    for (int t0 = 0; t0 < T; t0 += Cfg::kChunk) {
      TileSmem<Cfg>& sm = chunk(t0);
      const int tc = min(Cfg::kChunk, T - t0);
      if (!Src::kEarlyInputs || t0 > 0) {
        load_chunk(src, t0, tc, in);
      }
      if (pair_channel >= 0) {
        const PairStores pair =
            pair_stores(sm, slot, row, /*ring=*/true, cursor, qk_owner, write_window);
        convolve_chunk(src, pair, w0, w1, in.xs, t0, tc);
      }
      gates_chunk(sm, in, slot, /*ring=*/true, cursor, gate_owner, t0, tc);
      if (late && t0 == 0) {
        stage_own(true);
      }
      __syncthreads();
      for (int job = warp; job < 2 * tc; job += kWarps) {
        const int which = job & 1;
        l2_normalize_warp<K>(sm.qk[job >> 1][which], kQkScale<K>, which == 0, lane);
      }
    }
    src.inputs_consumed(*this);  // every thread is past the last chunk's barrier
    if constexpr (kLazy) {
      load_history(slot, cursor, P, T, cols, chunk);
    }
    __syncthreads();

    // 2b. A deferred call (kDeferred: u-free, fast outputs record no u): the slot's pending steps
    // folded onto the staged tile (waited for in the fold, after its first records are issued)
    // with the eager fold's arithmetic, u computed (item_fold.cuh, PendingU::kComputed), the
    // folded tile stored to ssm_fold_out and left in the stage for the draft. The fold's records
    // take the operand rows' space (FastSmem::fold_bytes), free until 3a; the fold ends with a
    // barrier.
    if constexpr (kDeferred) {
      const int folded = kFault == FastFault::kFoldStepShort ? pending - 1 : pending;
      if (folded > 0) {
        ColRegs<typename Prologue::Slice> unused[Prologue::CPT];  // the wide forms' (kEarlyTile)
        fold_pending<PendingU::kComputed, kFoldPasses>(
            *this, src, *reinterpret_cast<TileSmem<Cfg>*>(smem + Smem::operand_offset(p.T)), unused,
            slot, folded, cursor - pending);
      }
    }

    // 3a. The operand rows xk_t and xq_t, split: up to kNarrowTokens tokens the narrow form's
    // [part][8][K] rows (keys 0..3, queries 4..7, swizzled as the stage); else, per row tile t / 8,
    // keys in rows 0..7 and queries in rows 8..15, in fragment order (fast_layout::wide_word).
    // The layout is sized for the most tokens the kernel's calls hold (a lazy call's: L).
    uint32_t* const operand =
        reinterpret_cast<uint32_t*>(smem + Smem::operand_offset(kLazy ? p.L : p.T));
    const bool narrow = C <= kNarrowTokens;
    const int tiles = Smem::row_tiles(C);
    constexpr int kTileWords = Smem::kTileWords;
    if (tid < 2 * K) {
      const int which = tid / K;  // 0: keys (kn), 1: queries (qs)
      const int k = tid % K;
      const auto word = [&](int part, int t) {
        return narrow ? fast_layout::narrow_word<K>(part, t + kNarrowTokens * which, k)
                      : (t >> 3) * kTileWords +
                            fast_layout::wide_word<K>(part, (t & 7) + 8 * which, k);
      };
      float prefix = 1.0f;
      for (int t = 0; t < C; ++t) {
        const int rt = order.phys(t);
        const TileSmem<Cfg>& sm = chunk(rt);
        prefix = __fmul_rn(prefix, sm.decay[rt & 7][k]);
        const float x = __fmul_rn(sm.qk[rt & 7][1 - which][k], prefix);
        const Tf32Split s = split_tf32(x);
        operand[word(0, t)] = s.big;
        operand[word(1, t)] = s.small;
      }
      // Rows of tokens past C in the last row tile: zeros (their products are never read, but
      // a NaN there must not exist to be read by a sanitizer or a future change).
      for (int t = C; t < (narrow ? kNarrowTokens : tiles * 8); ++t) {
        operand[word(0, t)] = 0u;
        operand[word(1, t)] = 0u;
      }
    }

    // 3b. The T x T terms: before the state tile is needed where every warp has mma tiles, else
    // on the warps without mma tiles while the others contract.
    float* const termA = reinterpret_cast<float*>(smem + Smem::term_offset(kLazy ? p.L : p.T));
    float* const termM = termA + kFastMaxTokens * kFastMaxTokens;
    const int mma_warps = narrow ? kMTiles : min(kNTiles, kWarps);
    if (mma_warps >= kWarps) {
      chunk_terms(smem, C, order, warp, kWarps, termA, termM);
    }
    src.wait_state();
    __syncthreads();
    if (mma_warps < kWarps && warp >= mma_warps) {
      chunk_terms(smem, C, order, warp - mma_warps, kWarps - mma_warps, termA, termM);
    }

    // 3c. W and QS on tensor cores (the operand rows' space then holds them: Wt, QSt).
    if (narrow) {
      contract_narrow(operand, stage);
    } else if (tiles == 1) {
      contract<1>(operand, stage);
    } else {
      contract<2>(operand, stage);
    }
    // The contraction ended with a __syncthreads: no thread reads the stage any more.
    const bool next_staged = src.state_consumed(*this, stage);
    float* const Wt = reinterpret_cast<float*>(operand);
    float* const QSt = Wt + (narrow ? kNarrowRows : tiles * 8) * BV;

    // 3d. Per column: the triangular solve for u, then the outputs.
    if (tid < cols) {
      const int c = tid;
      const int64_t row0 = this->first_row();
      float u[kFastMaxTokens];
#pragma unroll
      for (int t = 0; t < kFastMaxTokens; ++t) {
        if (t < C) {
          const int rt = order.phys(t);
          const TileSmem<Cfg>& sm = chunk(rt);
          float ks = Wt[t * BV + c];
#pragma unroll
          for (int i = 0; i < t; ++i) {
            if (kFault != FastFault::kDropIntraTerm || t != 1) {
              ks = __fmaf_rn(termA[t * kFastMaxTokens + i], u[i], ks);
            }
          }
          u[t] = __fmul_rn(__fsub_rn(sm.v[rt & 7][c], ks), sm.beta[rt & 7]);
          float o = QSt[t * BV + c];
#pragma unroll
          for (int i = 0; i <= t; ++i) {
            const bool dropped = (kFault == FastFault::kDropIntraTerm && t == 1 && i < t) ||
                                 (kFault == FastFault::kMaskOffByOne && i == t);
            if (!dropped) {
              o = __fmaf_rn(termM[t * kFastMaxTokens + i], u[i], o);
            }
          }
          if (t >= P) {  // the history's outputs are not the call's
            p.out[((row0 + t - P) * p.HV + hv) * p.V + v0 + c] = to_bf16(o);
          }
        }
      }
    }
    return next_staged;
  }
};

/// The per-item form's source: GlobalSource; the item stages its own state tile and waits for
/// all its copies. A deferred call's pending fold (item_fold.cuh) takes its columns from the stage
/// and puts them back there and to the committed state.
template <typename Item>
struct FastGlobalSource : GlobalSource<Item, false> {
  float* stage;  ///< the item's state stage (FastSmem: [BV][K] f32, swizzled as fast_layout::swz)

  static __device__ __forceinline__ FastGlobalSource for_item(const Item& it, float* stage) {
    return {GlobalSource<Item, false>::for_item(it), stage};
  }
  /// The first chunk's inputs come from global memory: issued with the conv history.
  static constexpr bool kEarlyInputs = true;
  __device__ __forceinline__ bool stages_own_tile() const { return true; }
  /// A staggered launch (TileArgs::stagger_tiles): the CTAs of odd blockIdx.x + y + z stage their
  /// tile late. Neighbouring CTAs of the grid's order alternate, so each SM's two resident CTAs
  /// mostly differ.
  __device__ __forceinline__ bool late_tile(const TileArgs& a) const {
    return a.stagger_tiles != 0 && ((blockIdx.x + blockIdx.y + blockIdx.z) & 1u) != 0;
  }
  __device__ __forceinline__ void inputs_consumed(const Item&) const {}
  __device__ __forceinline__ void wait_state() const { cp_async_wait_all(); }
  __device__ __forceinline__ bool state_consumed(const Item&, float*) const { return false; }

  // The pending fold's columns (a deferred call; its tile is never late). Every
  // thread waits for its own copies once the fold's first records are in flight; the fold's
  // barrier that follows makes the whole stage visible before the first fold_column_in.
  __device__ __forceinline__ void fold_records_issued(const Item&) const { cp_async_wait_all(); }
  /// Column `col` (stage row col - v0) of the stage: the lane's partials, each E <= 4 consecutive
  /// keys within one 16-byte chunk, which the swizzle keeps contiguous.
  template <typename Column>
  __device__ __forceinline__ void fold_column_in(const Item& it, ColRegs<Column>& S, int, int col,
                                                 bool) const {
    const int r = col - it.v0;
#pragma unroll
    for (int i = 0; i < Column::NPT; ++i) {
      load_vec<Column::E>(S[i], stage + fast_layout::swz<Column::K>(r, Column::k_of(it.c, i)));
    }
  }
  /// The folded column back to the stage (the draft's contraction reads it) and to the committed
  /// state (ssm_fold_out: one writer per element, the tile's own columns).
  template <typename Column>
  __device__ __forceinline__ void fold_column_out(const Item& it, const ColRegs<Column>& S,
                                                  int slot, int col) const {
    const int r = col - it.v0;
#pragma unroll
    for (int i = 0; i < Column::NPT; ++i) {
      store_vec<Column::E>(stage + fast_layout::swz<Column::K>(r, Column::k_of(it.c, i)), S[i]);
    }
    GlobalSource<Item, false>::template fold_column_out<Column>(it, S, slot, col);
  }
};

/// The fast-output kernel, a CTA per item: the grid (ceil(V / BV), HV, B), two CTAs per SM.
/// Before the PDL wait it reads the weights, the gate constants and the slot / row indices (as
/// verify_tile_kernel does: kda_kernels.h states what that asks of callers).
template <typename Traits, FastFault kFault = FastFault::kNone>
__global__ void __launch_bounds__(256, 2)
    verify_fast_kernel(const __grid_constant__ TileArgs args) {
  static_assert(Traits::kSchedule == VerifySchedule::kFastChunk, "the fast-chunk schedule");
  using Item = FastItem<Traits, kFault>;
  extern __shared__ __align__(128) unsigned char fast_smem[];
  const int hv = static_cast<int>(blockIdx.y);
  Item item(args, {static_cast<int>(blockIdx.z), hv, static_cast<int>(args.div.group.div(hv)),
                   static_cast<int>(blockIdx.x)});
  auto src = FastGlobalSource<typename Item::Prologue>::for_item(
      item, reinterpret_cast<float*>(fast_smem));
  item.load_constants(src);
  src.load_indices(item);
  pdl_enter();
  item.run(fast_smem, src);
}

}  // namespace kda::kernels
