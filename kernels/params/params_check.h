// params_check.h: the structural checks of the params structs (kda_params.h), shared by the
// host reference (kernels/host) and the CUDA entry points (kernels/invoke.cu): sizes, modes,
// required pointers for what an op reads or writes, and that every pitch covers the packed
// extent below it. Each failure throws kda::Error (kInvalidArgument) naming the op, the
// field, what was expected and what came, e.g.
//   "invoke_verify_fused: K=96 unsupported, expected 64 or 128".
// Not checked here: the index arrays (host memory on the host, device memory on CUDA: the
// host reference range-checks them itself), and what only a CUDA launch needs (alignment,
// grid limits: invoke.cu).
#pragma once

#include <cstdint>

#include "kernels/params/kda_params.h"

namespace kda::params {

/// What a verify-like op reads or writes, beyond the problem sizes and slots.
enum VerifyNeeds : uint32_t {
  kConv = 1u << 0,         ///< qkv, conv_weight (+ bias), conv_state
  kWindows = 1u << 1,      ///< rows, conv_window (writes; T <= T_max)
  kAct = 1u << 2,          ///< qkv_act
  kRecurrence = 1u << 3,   ///< a, b, A_log, dt_bias, gate kind, ssm_state
  kOut = 1u << 4,          ///< out
  kRecords = 1u << 5,      ///< by mode: rows + snapshots, or the four rings (+ L)
  kWritesSlots = 1u << 6,  ///< writes per-slot data (extend): slots must be distinct (host check)
};

/// What a commit reads or writes.
enum CommitNeeds : uint32_t {
  kFold = 1u << 0,        ///< rings, L >= T
  kSnapshot = 1u << 1,    ///< rows, snapshots
  kConvCommit = 1u << 2,  ///< rows, conv_window, conv_state
};

void check_verify(const VerifyParams& p, const char* op, uint32_t needs);
/// The fused verify's draft shapes: dense or ragged chains (parents null).
void check_fused_shape(const VerifyParams& p, const char* op);
void check_extend(const ExtendParams& e, const char* op);
void check_commit(const CommitParams& p, const char* op, uint32_t needs);
/// What a commit of p.kind reads and writes (CommitNeeds): eager: the fold (ring) or snapshot
/// copy, and the conv commit; deferred: the conv commit (and the fold, with tracks);
/// materialize: the fold; drop-pending: nothing beyond the pending counts.
uint32_t commit_needs(const CommitParams& p);
/// A shaped round's second stage (CommitParams::checked_accepted): the dense commit from the
/// lengths stage 1 checked, without token_offsets and parents; ring mode also without
/// accepted_paths (stage 1 moved the path's records to steps 0..n-1), snapshot mode with them
/// (its copies take node paths[i*T + k] for step k).
CommitParams dense_commit_stage(const CommitParams& p);
/// block_v is one of kernels::kFusedBlockVs (tile_policy.h), e.g.
///   "invoke_verify_fused: block_v=12 unsupported, expected one of 8, 16, 32, 64, 128".
void check_block_v(int block_v, const char* op);

}  // namespace kda::params
