// fast_item.cuh: the fast-output verify (contract §10; VerifySchedule::kFastChunk): one CTA of
// 256 threads per work item (V tile, v-head hv, request n), two CTAs per SM.
//   1. The state tile [BV][K] f32 goes in flight to shared memory (cp.async), right after the
//      conv history's loads.
//   2. The exact prologue, per 8-token chunk (item_prologue.cuh, the code every exact path runs):
//      conv + SiLU, gates, ring records and conv windows, q/k norms. So the records, windows and
//      everything the fold reads are bitwise the exact verify's.
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
// Reads ssm_state, never writes it (the committed state stays the exact fold's, §10).
// Shared memory (dynamic, FastSmem): the state stage, one TileSmem per 8-token chunk, the split
// operand rows (aliased by the contraction results once the mma is done), the T x T terms.
// Layout invariant of every [rows][K] f32 array read by the mma: the 16-byte chunk q of row r sits
// at chunk q ^ (4 * (r & 1)), so a warp's 16-byte fragment loads (rows r, r + 1 per phase) hit 32
// distinct banks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/mma_tf32.cuh"
#include "kernels/common/persistent_stage.cuh"
#include "kernels/verify/item_prologue.cuh"
#include "kernels/verify/per_item.cuh"
#include "kernels/verify/tile_policy.h"

namespace kda::kernels {

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
};

/// Index of element (r, k) in a swizzled [rows][K] f32 array (the header's layout invariant).
template <int K>
__device__ __forceinline__ int swz(int r, int k) {
  return r * K + (k ^ ((r & 1) << 4));
}

/// Faults a test plants in the fast form to see its checks fail (tests/fast_faults_gpu.cu); the
/// library instantiates kNone alone.
enum class FastFault : uint8_t {
  kNone,
  kOneTf32Product,  ///< the state contractions at 1xTF32 (the split operands dropped)
  kDecayOffByOne,   ///< the T x T terms' decay ratios one step late (d_{t-1} for d_t)
  kDropIntraTerm,   ///< token 1 without its intra-chunk terms (i < t)
  kMaskOffByOne,    ///< the outputs without their diagonal term (i < t, not i <= t)
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
  static constexpr int E = K / 32;  ///< key elements per lane in the T x T terms
  static_assert(Cfg::kThreads == 256 && BV % 8 == 0 && BV <= 2 * K, "fast tile shape");

  /// Runs the item (the header's phases). `smem`: FastSmem<K, BV>::bytes(p.T) bytes.
  template <typename Src>
  __device__ __forceinline__ void run(unsigned char* smem, const Src& src) {
    const int T = this->tokens();
    const int slot = src.slot(*this);
    if (slot < 0) {  // padding row: zero outputs, touch nothing else
      zero_outputs();
      return;
    }
    const int64_t row = src.row(*this);
    const bool qk_owner = tile == 0 && hv == h * static_cast<int>(args.div.group.divisor);
    const bool gate_owner = tile == 0;
    const bool write_window = pair_channel >= 0 && (is_qk ? qk_owner : true);
    const int cols = min(BV, p.V - v0);
    // The records at the slot's ring cursor (a deferred call's; 0 without one).
    const int cursor = ring_cursor(p, slot);

    // The pair's conv history first (raw bits): the conv waits for it, the state tile is needed
    // only after the prologue.
    uint32_t hist_bits[kConvHistory] = {};
    if (pair_channel >= 0) {
#pragma unroll
      for (int j = 0; j < kConvHistory; ++j) {
        hist_bits[j] = src.hist(*this, slot, j);
      }
    }

    // 1. The state tile in flight (zeros past V, so no column reads garbage).
    float* const stage = reinterpret_cast<float*>(smem);
    {
      const float* head =
          p.ssm_state + slot * p.ssm_slot_stride + (static_cast<int64_t>(hv) * p.V + v0) * K;
      constexpr int kChunksPerRow = K / 4;
      for (int i = tid; i < BV * kChunksPerRow; i += Cfg::kThreads) {
        const int r = i / kChunksPerRow;
        const int k = (i % kChunksPerRow) * 4;
        float* dst = stage + swz<K>(r, k);
        if (r < cols) {
          cp_async<16>(dst, head + static_cast<int64_t>(r) * K + k);
        } else {
          *reinterpret_cast<float4*>(dst) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
      }
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
      ChunkInputs in;
      load_chunk(src, t0, tc, in);
      if (pair_channel >= 0) {
        const PairStores pair =
            pair_stores(sm, slot, row, /*ring=*/true, cursor, qk_owner, write_window);
        convolve_chunk(src, pair, w0, w1, in.xs, t0, tc);
      }
      gates_chunk(sm, in, slot, /*ring=*/true, cursor, gate_owner, t0, tc);
      __syncthreads();
      for (int job = warp; job < 2 * tc; job += kWarps) {
        const int which = job & 1;
        l2_normalize_warp<K>(sm.qk[job >> 1][which], kQkScale<K>, which == 0, lane);
      }
    }
    __syncthreads();

    // 3a. The operand rows: xk_t (rows 0..7 of row tile t / 8) and xq_t (rows 8..15), split.
    uint32_t* const operand = reinterpret_cast<uint32_t*>(smem + Smem::operand_offset(p.T));
    const int tiles = Smem::row_tiles(T);
    constexpr int kTileWords = 2 * Smem::kRowsPerTile * K;  // big rows, then small rows
    if (tid < 2 * K) {
      const int which = tid / K;  // 0: keys (kn), 1: queries (qs)
      const int k = tid % K;
      float P = 1.0f;
      for (int t = 0; t < T; ++t) {
        const TileSmem<Cfg>& sm = chunk(t);
        P = __fmul_rn(P, sm.decay[t & 7][k]);
        const float x = __fmul_rn(sm.qk[t & 7][1 - which][k], P);
        const Tf32Split s = split_tf32(x);
        uint32_t* rows = operand + (t >> 3) * kTileWords;
        const int r = (t & 7) + 8 * which;
        rows[swz<K>(r, k)] = s.big;
        rows[Smem::kRowsPerTile * K + swz<K>(r, k)] = s.small;
      }
      // Rows of tokens past T in the last row tile: zeros (their products are never read, but
      // a NaN there must not exist to be read by a sanitizer or a future change).
      for (int t = T; t < tiles * 8; ++t) {
        uint32_t* rows = operand + (t >> 3) * kTileWords;
        const int r = (t & 7) + 8 * which;
        rows[swz<K>(r, k)] = 0u;
        rows[Smem::kRowsPerTile * K + swz<K>(r, k)] = 0u;
      }
    }

    // 3b. The T x T terms, warp i % kWarps for key token i, lanes over k as the §3 tree.
    float* const termA = reinterpret_cast<float*>(smem + Smem::term_offset(p.T));
    float* const termM = termA + kFastMaxTokens * kFastMaxTokens;
    for (int i = warp; i < T; i += kWarps) {
      float kni[1][E], r[E];
      const TileSmem<Cfg>& smi = chunk(i);
      load_vec<E>(kni[0], &smi.qk[i & 7][1][lane * E]);
#pragma unroll
      for (int e = 0; e < E; ++e) {
        r[e] = 1.0f;
      }
      for (int t = i; t < T; ++t) {
        const TileSmem<Cfg>& sm = chunk(t);
        float d[E], w[1][E], kt[1][E], qt[1][E];
        load_vec<E>(d, &sm.decay[t & 7][lane * E]);
        load_vec<E>(kt[0], &sm.qk[t & 7][1][lane * E]);
        load_vec<E>(qt[0], &sm.qk[t & 7][0][lane * E]);
        if constexpr (kFault == FastFault::kDecayOffByOne) {
          if (t > i + 1) {
            load_vec<E>(d, &chunk(t - 1).decay[(t - 1) & 7][lane * E]);
          }
        }
#pragma unroll
        for (int e = 0; e < E; ++e) {
          if (t > i) {
            r[e] = __fmul_rn(r[e], d[e]);
          }
          w[0][e] = __fmul_rn(kni[0][e], r[e]);
        }
        const float m = tree_dot<32, 1, E>(w, qt);
        const float a = t > i ? tree_dot<32, 1, E>(w, kt) : 0.0f;
        if (lane == 0) {
          termM[t * kFastMaxTokens + i] = m;
          termA[t * kFastMaxTokens + i] = a;
        }
      }
    }
    cp_async_wait_all();
    __syncthreads();

    // 3c. W and QS on tensor cores: warp w takes column tiles w, w + 8, ...; k-step pair j
    // covers k = 16 j .. 16 j + 15, k slot tig of step s standing for 16 j + 4 tig + 2 s and slot
    // tig + 4 for the one after it (A and B agree: one 16-byte load per fragment row).
    const int g = lane >> 2;
    const int tig = lane & 3;
    float acc[2][kTilesPerWarp][4];
#pragma unroll
    for (int m = 0; m < 2; ++m) {
#pragma unroll
      for (int n = 0; n < kTilesPerWarp; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          acc[m][n][e] = 0.0f;
        }
      }
    }
    if (warp < kNTiles) {
#pragma unroll 2
      for (int j = 0; j < K / 16; ++j) {
        const int k = 16 * j + 4 * tig;
        uint4 a_lo[2][2] = {}, a_hi[2][2] = {};  // [row tile][big, small]: rows g and g + 8
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          if (m < tiles) {
            const uint32_t* rows = operand + m * kTileWords;
#pragma unroll
            for (int part = 0; part < 2; ++part) {
              const uint32_t* base = rows + part * Smem::kRowsPerTile * K;
              a_lo[m][part] = *reinterpret_cast<const uint4*>(base + swz<K>(g, k));
              a_hi[m][part] = *reinterpret_cast<const uint4*>(base + swz<K>(g + 8, k));
            }
          }
        }
#pragma unroll
        for (int n = 0; n < kTilesPerWarp; ++n) {
          const int nt = warp + n * kWarps;
          if (nt < kNTiles) {
            const float4 s = *reinterpret_cast<const float4*>(stage + swz<K>(nt * 8 + g, k));
            const Tf32Split sx = split_tf32(s.x), sy = split_tf32(s.y), sz = split_tf32(s.z),
                            sw = split_tf32(s.w);
            const uint32_t b_big[2][2] = {{sx.big, sy.big}, {sz.big, sw.big}};
            const uint32_t b_small[2][2] = {{sx.small, sy.small}, {sz.small, sw.small}};
#pragma unroll
            for (int m = 0; m < 2; ++m) {
              if (m < tiles) {
                const uint4 lb = a_lo[m][0], hb = a_hi[m][0], ls = a_lo[m][1], hs = a_hi[m][1];
                // step 0: slots (tig, tig + 4) = elements (0, 1); step 1: elements (2, 3)
                const uint32_t big0[4] = {lb.x, hb.x, lb.y, hb.y};
                const uint32_t small0[4] = {ls.x, hs.x, ls.y, hs.y};
                const uint32_t big1[4] = {lb.z, hb.z, lb.w, hb.w};
                const uint32_t small1[4] = {ls.z, hs.z, ls.w, hs.w};
                if constexpr (kFault == FastFault::kOneTf32Product) {
                  mma_tf32_16x8x8(acc[m][n], big0, b_big[0]);
                  mma_tf32_16x8x8(acc[m][n], big1, b_big[1]);
                } else {
                  mma_3xtf32_16x8x8(acc[m][n], big0, small0, b_big[0], b_small[0]);
                  mma_3xtf32_16x8x8(acc[m][n], big1, small1, b_big[1], b_small[1]);
                }
              }
            }
          }
        }
      }
    }
    __syncthreads();  // every warp is done with the operand rows: W and QS alias them

    // W[t][c] and QS[t][c] (t < T, c < BV) over the operand rows.
    float* const Wt = reinterpret_cast<float*>(operand);
    float* const QSt = Wt + tiles * 8 * BV;
    if (warp < kNTiles) {
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        const int t = m * 8 + g;
        if (m < tiles && t < T) {
#pragma unroll
          for (int n = 0; n < kTilesPerWarp; ++n) {
            const int nt = warp + n * kWarps;
            if (nt < kNTiles) {
              const int c = nt * 8 + 2 * tig;
              *reinterpret_cast<float2*>(Wt + t * BV + c) = make_float2(acc[m][n][0], acc[m][n][1]);
              *reinterpret_cast<float2*>(QSt + t * BV + c) =
                  make_float2(acc[m][n][2], acc[m][n][3]);
            }
          }
        }
      }
    }
    __syncthreads();

    // 3d. Per column: the triangular solve for u, then the outputs.
    if (tid < cols) {
      const int c = tid;
      const int64_t row0 = this->first_row();
      float u[kFastMaxTokens];
#pragma unroll
      for (int t = 0; t < kFastMaxTokens; ++t) {
        if (t < T) {
          const TileSmem<Cfg>& sm = chunk(t);
          float ks = Wt[t * BV + c];
#pragma unroll
          for (int i = 0; i < t; ++i) {
            if (kFault != FastFault::kDropIntraTerm || t != 1) {
              ks = __fmaf_rn(termA[t * kFastMaxTokens + i], u[i], ks);
            }
          }
          u[t] = __fmul_rn(__fsub_rn(sm.v[t & 7][c], ks), sm.beta[t & 7]);
          float o = QSt[t * BV + c];
#pragma unroll
          for (int i = 0; i <= t; ++i) {
            const bool dropped = (kFault == FastFault::kDropIntraTerm && t == 1 && i < t) ||
                                 (kFault == FastFault::kMaskOffByOne && i == t);
            if (!dropped) {
              o = __fmaf_rn(termM[t * kFastMaxTokens + i], u[i], o);
            }
          }
          p.out[((row0 + t) * p.HV + hv) * p.V + v0 + c] = to_bf16(o);
        }
      }
    }
  }
};

/// The fast-output kernel: one CTA per item on the grid (ceil(V / BV), HV, B), two per SM.
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
  auto src = GlobalSource<typename Item::Prologue, false>::for_item(item);
  item.load_constants(src);
  src.load_indices(item);
  pdl_enter();
  item.run(fast_smem, src);
}

}  // namespace kda::kernels
