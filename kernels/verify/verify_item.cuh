// verify_item.cuh: one verify / extend work item, the (V tile, v-head hv, request n) triple, as
// one CTA of 256 threads runs it: VerifyItem::run, the schedule that orders the phases
// (item_prologue.cuh, item_steps.cuh), their loads and their barriers. The kernels that run
// items: verify/per_item.cuh (one CTA per item, grid (ceil(V/BV), HV, B)) and verify/persistent.cuh
// (persistent CTAs); their source names the item's ItemSource (item_schedule.h).
// Per chunk of up to kChunk tokens:
//   1. q/k (2K channels of k-head h) and v (the BV channels of this tile) for every token,
//      two adjacent channels per thread (bf16x2 loads/stores): FUSED: conv + SiLU from
//      mixed_qkv and the conv history (window kept in registers); unfused: read back from
//      qkv_act, written by the conv-update kernel.
//   2. gates -> EXP(g) and beta into shared memory; 3. q/k L2 norms, one warp per vector;
//   4. the delta rule over the chunk's tokens, output + snapshot per step.
// Verify reads ssm_state and conv_state and never writes them (the conv-state write-back
// race of upstream is impossible by construction). Extend writes the final state of its own
// columns to ssm_out (race-free: each CTA reads and writes only its own columns); the conv
// state of extend is updated by a separate kernel afterwards.
// slot < 0: the CTA zeroes its output rows and reads nothing else of the request (the
// per-item kernel reads its rows[n] entry with the slot and never uses it).
// Before its PDL wait the per-item kernel reads the weights and the slot / row indices and
// computes the request's row addresses (kda_kernels.h states what that asks of callers).
// Offsets are 64-bit, except the per-item kernels' output index (32 bits; the launchers check
// that `out` has fewer than 2^31 elements) and a chunk's gate-row offsets (32 bits; token row
// pitches below 2^28 elements, checked).
#pragma once

#include <cstdint>

#include "kernels/verify/item_fold.cuh"
#include "kernels/verify/item_steps.cuh"

namespace kda::kernels {

/// One work item of the verify / extend kernel. The constructor computes indices only;
/// load_constants() and run() read the item's inputs through a source `Src` whose kSource
/// (item_schedule.h) says where they come from: GlobalSource (verify/per_item.cuh: global memory)
/// or StagedSource (verify/persistent.cuh: the state tile from a shared-memory stage filled by a
/// TMA bulk copy, the rest as GlobalSource). Both hand the same values to the same arithmetic,
/// so the bits are equal. Sources take the item as its ItemPrologue.
template <typename Traits>
struct VerifyItem : ItemSteps<Traits> {
  using Steps = ItemSteps<Traits>;
  KDA_VERIFY_TRAITS_MEMBERS(Traits);
  using Steps::a_log, Steps::args, Steps::c, Steps::col0, Steps::convolve_chunk, Steps::CPT,
      Steps::exp_a_log, Steps::gates_chunk, Steps::h, Steps::hv, Steps::is_qk, Steps::kConvWarps,
      Steps::kSpareWarps, Steps::lane, Steps::load_chunk, Steps::p, Steps::pair_channel,
      Steps::pair_stores, Steps::spare_warp_norms, Steps::tid, Steps::tile, Steps::v0, Steps::warp,
      Steps::zero_outputs;
  using Steps::Steps;
  using typename Steps::Cfg, typename Steps::ChunkInputs, typename Steps::PairStores,
      typename Steps::Prologue, typename Steps::Slice;

  /// Runs the item: the state tile and the chunk's inputs in flight, then per chunk the steps of
  /// the file's header: 1. convolve_chunk, 2. gates_chunk, 3. the norms (spare_warp_norms or every
  /// warp), 4. steps_ring_persistent, steps_snapshot_persistent or steps_per_item. This function
  /// holds the schedule (which loads and barriers go where); the phases hold the arithmetic. kWide:
  /// the register budget of the calling kernel (its __launch_bounds__). false: 128 registers per
  /// thread. true (the per-item kernel's one-CTA-per-SM form, up to 255): every tile loads its
  /// first chunk early and convolves 4 tokens per group, the ring-mode steps run in groups of
  /// kStepGroup with their outputs stored after the group, a state tile loaded into registers is
  /// loaded after the gates (kLateStateLoads), and EXP(A_log) is computed here (load_constants
  /// leaves it).
  template <typename Src>
  __device__ __forceinline__ void run(TileSmem<Cfg>& sm, Src& src) {
    const int T = this->tokens();
    const int slot = src.slot(*this);
    // kDeferred per-item kernels enter the PDL dependency here (verify_tile_kernel leaves it to
    // run()): after the pending fold with p.fold_before_wait, else before it. Every thread
    // enters exactly once.
    constexpr bool kEntersPdl = kDeferred && !is_staged(Src::kSource);
    if (slot < 0) {  // padding row: zero outputs, touch nothing else
      if constexpr (kEntersPdl) {
        pdl_enter();
      }
      zero_outputs();
      return;
    }
    src.begin(*this);
    // The persistent kernel serves verify only (launcher-checked): extend's code is not in it.
    const bool extend = !is_staged(Src::kSource) && args.extend != 0;
    const RecordMode mode = record_mode_of(Src::kSource, p.mode);
    const bool ring = !extend && mode == RecordMode::kRing;
    const bool snap = !extend && mode == RecordMode::kSnapshot;
    const int64_t row = extend ? 0 : src.row(*this);
    // The first v-head of k-head h (h * HV/H) writes the head's q/k records.
    const bool qk_owner = tile == 0 && hv == h * static_cast<int>(args.div.group.divisor);
    const bool gate_owner = tile == 0;
    const bool write_window = !extend && FUSED && pair_channel >= 0 && (is_qk ? qk_owner : true);

    // kDeferred (a call with ring_pending, contract §7): the slot's ring base, and its pending
    // steps folded onto the tile and written back before anything else reads the state
    // (item_fold.cuh); with p.fold_before_wait the per-item kernel folds before its PDL wait,
    // overlapping the previous kernel (the caller guarantees that no unfinished kernel writes
    // what the fold reads and writes). The eager instantiation has none of this code.
    // kKeepsFoldedTile (the per-item kernel's wide forms with up to 255 registers): after a
    // fold, S already holds the folded tile for the steps, so the item loads no state after its
    // wait. The 128-register forms reload it (held through the prologue, it spills).
    constexpr bool kKeepsFoldedTile =
        kDeferred && !is_staged(Src::kSource) && Cfg::kMinCtasPerSm == 1;
    ColRegs<Slice> S[CPT];
    bool tile_in_regs = false;
    int cursor = 0;
    if constexpr (kDeferred && Src::kSource != ItemSource::kPersistentSnapshot) {
      const bool before = kEntersPdl && ring && p.fold_before_wait != 0;
      if (kEntersPdl && !before) {
        pdl_enter();
      }
      if (ring) {
        cursor = ring_cursor(p, slot);
        const int pending = pending_steps(p, slot);
        if (pending > 0) {
          fold_pending(*this, src, sm, S, slot, pending, cursor - pending);
          tile_in_regs = kKeepsFoldedTile;
        }
      }
      if (before) {
        pdl_enter();
      }
    }

    // Conv history of the pair (fused only; the persistent kernel reads it per token, below).
    // Issued first: the conv waits for it. Raw bits until every load of the item is in
    // flight (converted below).
    uint32_t hist_bits[kConvHistory];
    if constexpr (FUSED && !is_staged(Src::kSource)) {
      if (pair_channel >= 0) {
#pragma unroll
        for (int j = 0; j < kConvHistory; ++j) {
          hist_bits[j] = src.hist(*this, slot, j);
        }
      }
    }

    // Narrow tiles (BV <= 64: the small-B path) issue the first chunk's inputs here, with the
    // conv history and the state tile, before any of them is used — one memory round trip
    // after the PDL wait (the per-item kernel has read the slot before it), not three (the
    // chunk loop would otherwise keep the input loads behind the history's conversion). So do
    // BV = 128 tiles with wide registers; at 128 registers BV = 128 tiles load them in the
    // loop: there the early loads cost spills (per-item kernel) or registers (persistent
    // kernel), and other CTAs hide the latency.
    constexpr bool kEarlyInputs = !is_staged(Src::kSource) && (BV <= 64 || kWide);
    ChunkInputs in;
    if constexpr (kEarlyInputs) {
      load_chunk(src, 0, min(Cfg::kChunk, T), in);
    }

    // The state tile, one of three ways (none after a fold in the wide form: kKeepsFoldedTile):
    //  - staged (stages_state(Src::kSource)): one bulk copy issued here, copied from shared
    //    memory to registers only after the prologue, so it does not hold registers through it;
    //  - kLateStateLoads (wide registers, not staged): register loads issued after the gates.
    //    Issued here, the tile's loads (up to 64 KiB per SM at BV = 128) would share the SM's
    //    memory pipe with the conv history and inputs, and the conv would wait for them. After
    //    the gates the history and inputs are in registers, and the tile lands during the
    //    norms. With the spare-warp norms (below) the spare warps issue theirs after their
    //    gates (during the conv) and the conv warps right after the conv, before their gates;
    //  - otherwise register loads here, in flight during the prologue (with 128 registers
    //    and two CTAs per SM, loads issued after the history proved slower).
    constexpr bool kLateStateLoads =
        kWide && !is_staged(Src::kSource) && !stages_state(Src::kSource);
    // Fused narrow tiles (BV <= 32) with wide registers: the warps without a conv pair
    // ("spare" warps) normalise the chunk's q / k while the conv warps compute their gates.
    // The spare warps compute their gates during the conv; all warps meet at a barrier once
    // q / k / v are stored; the conv warps then issue their state-tile loads and compute their
    // gates while the spare warps run the norms; a second barrier ends the prologue. Two CTA
    // barriers, as with the all-warp norms, and the norms are off the critical path (the conv
    // warps are that path; work added to them lengthens it). Elsewhere it proved slower:
    //  - BV = 64: its 32 KiB state tile lands during the all-warp norms, and without them the
    //    steps wait for it;
    //  - K = BV = 128: two spare warps, four norms each at T = 4;
    //  - the unfused recurrence has no conv to hide the norms behind.
    // So BV >= 64 and the unfused recurrence keep the all-warp norms.
    constexpr bool kSpareWarpNorms = FUSED && kWide && !is_staged(Src::kSource) && BV <= 32;
    static_assert(!kSpareWarpNorms || kSpareWarps >= 3, "three warps without a conv pair");
    // The ring persistent kernel holds its columns swizzled (register j: column col0 + (j ^ swz),
    // for its reduce-scatter trees, step 4; swz is recomputed where it is used: held from
    // here, it cost spills). Streaming calls have V % 8 == 0 (launcher-checked)
    // and col0 % CPT == 0, so there a thread's columns are all below V or all past it.
    // Threads before kFirstStepThread hold no state columns and skip the steps.
    const bool holds_tile = Cfg::kFirstStepThread == 0 || tid >= Cfg::kFirstStepThread;
    bool col_ok[CPT];
#pragma unroll
    for (int j = 0; j < CPT; ++j) {
      col_ok[j] = (is_persistent_ring(Src::kSource) ? col0 : col0 + j) < p.V && holds_tile;
    }
    const float* s_base =
        p.ssm_state + slot * p.ssm_slot_stride + static_cast<int64_t>(hv) * p.V * K;
    if constexpr (!is_staged(Src::kSource)) {
      if (!tile_in_regs) {
        if constexpr (stages_state(Src::kSource)) {
          src.issue_state_copy(*this, s_base);  // registers after the norms (below)
        } else if constexpr (!kLateStateLoads) {
          src.load_state(*this, S, col_ok, s_base);
        }
      }
    }
    // The history as f32: the conv window, oldest first.
    float w0[kConvHistory], w1[kConvHistory];
    if constexpr (FUSED && !is_staged(Src::kSource)) {
      if (pair_channel >= 0) {
#pragma unroll
        for (int j = 0; j < kConvHistory; ++j) {
          const float2 hp = bf16x2_bits_to_float2(hist_bits[j]);
          w0[j] = hp.x;
          w1[j] = hp.y;
        }
      }
    }
    if constexpr (kWide) {
      // load_constants<true> left it here: the conv history has landed, and A_log (loaded
      // before the PDL wait) with it; the gates use it after the conv.
      exp_a_log = kda_exp(a_log);
    }

    const PairStores pair = pair_stores(sm, slot, row, ring, cursor, qk_owner, write_window);
    // The persistent kernel serves T <= kChunk only (launcher-checked): one chunk, so the
    // state is never live through a prologue (no spills).
    const int t_limit = is_staged(Src::kSource) ? 1 : T;
    for (int t0 = 0; t0 < t_limit; t0 += Cfg::kChunk) {
      const int tc = min(Cfg::kChunk, T - t0);
      if (!kEarlyInputs || t0 > 0) {
        load_chunk(src, t0, tc, in);
      }

      // 1. q/k/v of the chunk's tokens for this thread's channel pair.
      if (pair_channel >= 0) {
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
            // the gates (issued after them, they make the steps wait).
            if (t0 == 0 && phase == 1 && !tile_in_regs) {
              src.load_state(*this, S, col_ok, s_base);
            }
          }
          gates_chunk(sm, in, slot, ring, cursor, gate_owner, t0, tc);
          if constexpr (kLateStateLoads) {
            // The first chunk's steps are the first to need the tile; the spare warps issue
            // theirs here, after their phase-0 gates (later, in phase 1, proved slower).
            if (t0 == 0 && (!kSpareWarpNorms || phase == 0) && !tile_in_regs) {
              src.load_state(*this, S, col_ok, s_base);
            }
          }
        } else if (phase == 1) {
          spare_warp_norms(sm, tc);
        }
      }
      __syncthreads();
      src.inputs_consumed(*this);  // persistent: the next item's inputs go in flight

      // 3. L2 norms of q (scaled by K^-0.5) and k, one warp per vector (without spare-warp
      // norms).
      if constexpr (!kSpareWarpNorms) {
        for (int job = warp; job < 2 * tc; job += Cfg::kWarps) {
          const int which = job & 1;
          l2_normalize_warp<K>(sm.qk[job >> 1][which], kQkScale<K>, which == 0, lane);
        }
      }
      if constexpr (is_staged(Src::kSource)) {
        // The state tile to registers; the barrier inside load_state also completes the norms
        // (one barrier serves both).
        src.load_state(*this, S, col_ok, s_base);
      } else {
        if constexpr (!kSpareWarpNorms) {
          __syncthreads();
        }
        if constexpr (stages_state(Src::kSource)) {
          if (t0 == 0 && !tile_in_regs) {
            src.state_from_stage(*this, S, col_ok);
          }
        }
      }

      // 4. The recurrence. kDeferred: its u records at the slot's ring (formed here: held from
      // the item's start, the address costs registers through the prologue).
      float* const u_row = kDeferred ? p.ring_u + slot * p.ring_u_slot_stride +
                                           static_cast<int64_t>(hv) * p.L * p.V + col0
                                     : nullptr;
      if constexpr (is_staged(Src::kSource)) {
        if constexpr (is_persistent_ring(Src::kSource)) {
          this->template steps_ring_persistent<Src>(sm, S, col_ok[0], T, t0, tc, u_row, cursor);
        } else {
          this->template steps_snapshot_persistent<Src>(sm, S, col_ok, T, row, snap, t0, tc);
        }
      } else {
        this->template steps_per_item<Src>(sm, S, col_ok, holds_tile, T, row, snap, t0, tc, u_row,
                                           cursor, slot);
      }
      // The next chunk overwrites shared memory. The persistent kernel runs one chunk per item,
      // and its next live item passes a barrier before it writes shared memory (after its
      // input copies land), so it ends the item without one: fast warps start the next item's
      // set-up while slow ones finish their steps.
      if constexpr (!is_staged(Src::kSource)) {
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

}  // namespace kda::kernels
