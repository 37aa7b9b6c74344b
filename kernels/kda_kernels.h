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

#include "kernels/kda_params.h"
#include "kernels/launch_utils.h"

namespace kda::kernels {

/// Fused-kernel V tiles the dispatcher may pick (--kda-verify-block-v).
constexpr int kFusedBlockVs[] = {8, 16, 32, 64, 128};
/// The tile when nothing else is known (the measured best over B = 1..64, docs/perf.md).
constexpr int kDefaultFusedBlockV = 64;
/// The default fused tile for a call of B requests, HV v-heads of V columns: the widest tile
/// whose grid B*HV*ceil(V/BV) still has >= 96 CTAs, never below 16; BV = 128 (the heaviest
/// CTAs) only from 192 CTAs or with 96..`one_per_sm_ctas` CTAs, where the launcher runs the
/// tiles one CTA per SM (launch_utils.h TileOccupancy; up to kWideFusedMaxWaves waves, beyond
/// them streamed two per SM): pass the device's SM count in ring mode, 0 in snapshot mode
/// (there BV = 64 below 192 CTAs: at 96 CTAs, K3 TP8 B = 8, BV = 128 one per SM was 0-3.5%
/// slower than BV = 64 two per SM, docs/perf.md v31). Narrow tiles buy CTAs for small
/// calls; wide tiles avoid recomputing the q/k conv per tile. Fitted to H200 (132 SMs)
/// measurements (docs/perf.md v4, v13, v17); at kernel v17 it is the measured best tile in ring
/// mode at every B in 1..64, T = 4 and 8, for Kimi-Linear (HV = 32) and Kimi-K3 TP8 (HV = 12).
constexpr int default_block_v(int B, int HV, int V, int one_per_sm_ctas = 0) {
  const long long widest = static_cast<long long>(B) * HV * ((V + 127) / 128);
  if (widest >= 192 || (widest >= 96 && widest <= one_per_sm_ctas)) {
    return 128;
  }
  for (int bv = 64; bv > 16; bv /= 2) {
    const long long ctas = static_cast<long long>(B) * HV * ((V + bv - 1) / bv);
    if (ctas >= 96) {
      return bv;
    }
  }
  return 16;
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
  const long long wide = static_cast<long long>(B) * HV * ((V + 127) / 128);
  const long long narrow = static_cast<long long>(B) * HV * ((V + 63) / 64);
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
/// The auto tile of a call in `mode` (--kda-verify-block-v=auto): default_block_v in ring mode,
/// default_snapshot_block_v in snapshot mode; `sms` = the device's SMs (0: unknown).
constexpr int default_fused_block_v(RecordMode mode, int B, int HV, int V, int sms) {
  return mode == RecordMode::kRing ? default_block_v(B, HV, V, sms)
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
