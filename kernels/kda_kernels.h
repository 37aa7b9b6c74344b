// kda_kernels.h: the CUDA entry points of every kernel family (plain C++ header).
//
// Each invoke_* validates the launch-relevant parameters (throws kda::Error before anything
// is enqueued), picks a compile-time configuration and enqueues on `stream`. None of them
// synchronises, allocates or reads device memory on the host: all are graph-capturable.
// The numerics are contract.md §3 exactly; every family shares the device functions of
// kernels/device_math.cuh, so results are bitwise identical across paths.
//
// Programmatic dependent launch (sm_90+, on unless set_pdl_enabled(false)): a kernel may start
// while the kernel before it on the stream is finishing, and waits for it (griddepcontrol.wait)
// before reading activations, state or records. Before that wait the verify kernels read the
// layer weights (conv_weight, conv_bias, dt_bias, A_log) and the index arrays (slots, rows), so
// those must not be written by the kernel launched just before the call on the same stream
// (write them earlier, or with a copy: the backend uploads the indices with a cudaMemcpyAsync in
// prepare(); weights do not change between calls).
#pragma once

#include <cuda_runtime_api.h>

#include <iterator>

#include "kernels/kda_params.h"
#include "kernels/launch_utils.h"

namespace kda::kernels {

/// Fused-kernel V tiles the dispatcher may pick (--kda-verify-block-v).
constexpr int kFusedBlockVs[] = {8, 16, 32, 64, 128};
/// The tile when nothing else is known (the measured best over B = 1..64, docs/perf.md).
constexpr int kDefaultFusedBlockV = 64;
/// The narrowest fused tile that holds a v-head's V columns (128 for V > 128): the widest
/// worth running, since a wider one computes the same item with idle columns (at V = 64 the
/// BV = 128 tile ran 11-37% slower than BV = 64 in ring mode, docs/perf.md v42).
constexpr int head_block_v(int V) {
  for (const int bv : kFusedBlockVs) {
    if (bv >= V) {
      return bv;
    }
  }
  return kFusedBlockVs[std::size(kFusedBlockVs) - 1];
}
/// CTAs of a fused verify grid: B requests x HV v-heads x ceil(V / BV) tiles.
constexpr long long fused_grid_ctas(int B, int HV, int V, int bv) {
  return static_cast<long long>(B) * HV * ((V + bv - 1) / bv);
}
/// Draft tokens up to which a ring-mode BV = 32 tile takes a grid of 48..95 CTAs one per SM: in
/// the 20-layer round it beat BV = 16 by 4-8% at T = 2 and 2-4% at T = 4, and lost 0.5-3% at
/// T = 8 (H200, docs/perf.md v42). Half as many prologues (q/k conv and norms per tile) pay for
/// steps over twice the columns per CTA only while the steps are few.
inline constexpr int kNarrowBv32MaxT = 4;
/// The default fused tile for a call of B requests of T tokens, HV v-heads of V columns.
/// `one_per_sm_ctas`: the largest grid the launcher runs one CTA per SM (ring mode: the device's
/// SM count; 0 in snapshot mode or when the device is unknown; launch_utils.h TileOccupancy).
/// T = 0: unknown (as T > kNarrowBv32MaxT).
/// - The head tile (head_block_v: BV = 128 at V = 128) from 192 CTAs, or with 96..one_per_sm_ctas
///   CTAs (one CTA per SM up to kWideFusedMaxWaves waves, beyond them streamed two per SM). In
///   snapshot mode it is BV = 64 below 192 CTAs: at 96 CTAs, K3 TP8 B = 8, BV = 128 one per SM
///   was 0-3.5% slower than BV = 64 two per SM (docs/perf.md v31).
/// - Else the widest tile up to BV = 64 whose grid has >= 96 CTAs, or >= 48 CTAs that run one per
///   SM for BV = 16 (and BV = 32 with T <= kNarrowBv32MaxT); else BV = 8 where its grid runs one
///   per SM, BV = 16 otherwise.
/// Narrow tiles buy CTAs for small calls; wide tiles avoid recomputing the q/k conv per tile.
/// Fitted to H200 (132 SMs) measurements (docs/perf.md v4, v13, v17, v42). Ring mode, kernel
/// v41, B = 1..8, T = 2, 4, 8, HV = 4..64 at K = V = 128 and HV = 16, 32 at K = V = 64 (v42):
/// v41's rule (no head tile, BV = 32 only from 96 CTAs, never BV = 8) was on average 3.75% (at
/// most 58%) slower than each row's best tile in the warm graph and 2.24% (54%) L2-cold; this
/// one 0.36% (6.8%) and 0.32% (5.7%).
constexpr int default_block_v(int B, int HV, int V, int one_per_sm_ctas = 0, int T = 0) {
  const int head = head_block_v(V);
  const long long head_ctas = fused_grid_ctas(B, HV, V, head);
  if (head_ctas >= 192 || (head_ctas >= 96 && head_ctas <= one_per_sm_ctas)) {
    return head;
  }
  const bool short_chunk = T >= 1 && T <= kNarrowBv32MaxT;
  for (int bv = head < 64 ? head : 64; bv >= 16; bv /= 2) {
    const long long ctas = fused_grid_ctas(B, HV, V, bv);
    const bool narrow_floor = ctas <= one_per_sm_ctas && (bv == 16 || (bv == 32 && short_chunk));
    if (ctas >= (narrow_floor ? 48 : 96)) {
      return bv;
    }
  }
  const int narrow = fused_grid_ctas(B, HV, V, 8) <= one_per_sm_ctas ? 8 : 16;
  return narrow < head ? narrow : head;
}
/// Snapshot mode's default tile on a device of `sms` SMs (0: unknown, default_block_v's rule).
/// default_block_v's BV = 128 becomes BV = 64 where the launcher's BV = 64 grid fills its waves
/// at least 100 per mille better (launch_utils.h wave_fill_permille; BV = 64 one CTA per SM
/// where one_per_sm_fills_waves_better), and beyond kSnapshotWideMaxWaves waves of BV = 128
/// CTAs. H200: K3 TP8 B = 16 (192 BV = 128 CTAs, 1.45 waves) -3.5% / -5.5% at T = 4 / 8,
/// Kimi-Linear B = 32 / 64 -1.4..-6.9%; every other row of both models keeps its tile
/// (docs/perf.md v32).
constexpr int default_snapshot_block_v(int B, int HV, int V, int sms) {
  const int bv = default_block_v(B, HV, V);
  if (sms <= 0 || bv != 128) {
    return bv;
  }
  const long long wide = fused_grid_ctas(B, HV, V, 128);
  const long long narrow = fused_grid_ctas(B, HV, V, 64);
  if (wide > static_cast<long long>(kSnapshotWideMaxWaves) * sms) {
    return 64;
  }
  if (wide <= static_cast<long long>(kWideFusedMaxWaves) * sms) {  // BV = 128 one per SM
    const int per_sm = one_per_sm_fills_waves_better(narrow, sms) ? 1 : 2;
    if (wave_fill_permille(narrow, sms, per_sm) >= wave_fill_permille(wide, sms, 1) + 100) {
      return 64;
    }
  }
  return 128;
}
/// The auto tile of a call of B requests of T tokens in `mode` (--kda-verify-block-v=auto):
/// default_block_v in ring mode, default_snapshot_block_v in snapshot mode; `sms` = the device's
/// SMs (0: unknown).
constexpr int default_fused_block_v(RecordMode mode, int B, int T, int HV, int V, int sms) {
  return mode == RecordMode::kRing ? default_block_v(B, HV, V, sms, T)
                                   : default_snapshot_block_v(B, HV, V, sms);
}
bool is_supported_block_v(int bv);

/// Unfused step 1: conv + SiLU of all T tokens into p.qkv_act, conv windows into
/// p.conv_window. Reads conv_state, never writes it.
void invoke_conv_update(const VerifyParams& p, cudaStream_t stream);

/// Unfused step 2: the gated delta rule over p.qkv_act; writes out + snapshots | rings.
void invoke_verify_recurrent(const VerifyParams& p, cudaStream_t stream);

/// Both unfused steps.
void invoke_verify_unfused(const VerifyParams& p, cudaStream_t stream);

/// Fused conv + gate + recurrence, one kernel, V tile `block_v` (kFusedBlockVs).
void invoke_verify_fused(const VerifyParams& p, int block_v, cudaStream_t stream);

/// Extend: process and commit p.v.T tokens per request in place (any T >= 1).
void invoke_extend(const ExtendParams& p, cudaStream_t stream);

/// Commit of all layers: fold (ring mode) or snapshot copy, and the conv commit. One launch
/// when conv_commit_vec8(p) (the state commit kernel copies the conv windows too), else two.
void invoke_commit(const CommitParams& p, cudaStream_t stream);

/// Whether a verify call's layout lets its BV = 128 tile run as persistent streaming CTAs
/// (verify_stream.cuh): T <= 8, the state tile one 16-byte-aligned bulk copy per item, and
/// every input piece 16 bytes aligned (fused: mixed_qkv, conv_state, a; unfused: qkv_act, a).
/// Streaming also needs sm_90+ and, for the unfused recurrence, more items than one wave of
/// CTAs (state_stream_mode(), StreamFrom); a call that fails any of it runs one CTA per item
/// instead, with the same bits.
bool verify_stream_layout_ok(const VerifyParams& p, bool fused);
/// The same for the fold (commit.cu): T <= 8, state and ring records (rawk, g, rawv rows)
/// copyable as 16-byte-aligned bulk runs.
bool fold_stream_layout_ok(const CommitParams& p);
/// Whether every conv commit offset is 16-byte aligned (8 bf16 per access): then invoke_commit
/// copies the conv windows inside the fold / snapshot launch.
bool conv_commit_vec8(const CommitParams& p);

/// The pieces of invoke_commit, for tests and the benchmark.
void invoke_fold(const CommitParams& p, cudaStream_t stream);
void invoke_commit_snapshot(const CommitParams& p, cudaStream_t stream);
void invoke_commit_conv(const CommitParams& p, cudaStream_t stream);

}  // namespace kda::kernels
