// kda_kernels.h: the CUDA entry points of every kernel family (plain C++ header).
//
// Each invoke_* validates the launch-relevant parameters (throws kda::Error before anything
// is enqueued), picks a compile-time configuration and enqueues on `stream`. None of them
// synchronises, allocates or reads device memory on the host: all are graph-capturable.
// The numerics are docs/contract.md §3 exactly; every family shares the device functions of
// kernels/device_math.cuh, so results are bitwise identical across paths.
//
// Every entry point takes the launch overrides (launch_utils.h LaunchOverrides; the defaults are
// what engines run): no process-wide launch state.
//
// Programmatic dependent launch (sm_90+, on unless LaunchOverrides::pdl is off): a kernel may start
// while the kernel before it on the stream is finishing, and waits for it (griddepcontrol.wait)
// before reading activations, state or records. Before that wait the verify kernels read the
// layer weights (conv_weight, conv_bias, dt_bias, A_log) and the index arrays (slots, rows), so
// those must not be written by the kernel launched just before the call on the same stream
// (write them earlier, or with a copy: the backend uploads the indices with a cudaMemcpyAsync in
// prepare(); weights do not change between calls). With VerifyParams::fold_before_wait a
// deferred verify also folds its pending steps before the wait (the caller's guarantee is
// stated there). Every kernel here triggers its dependents only after its own wait, except such
// a deferred verify at a short draft in a one-CTA-per-SM tile
// (kernels::deferred_triggers_at_entry), which triggers at its entry: a kernel launched after it
// may then start while the kernels before it still run, so an engine kernel that follows a verify
// must read nothing before its own PDL wait that an earlier kernel writes.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/common/launch_utils.h"
#include "kernels/params/kda_params.h"
#include "kernels/verify/tile_policy.h"
#include "kernels/verify/verify_plan.h"

namespace kda::kernels {

/// Unfused step 1: conv + SiLU of all T tokens into p.qkv_act, conv windows into
/// p.conv_window. Reads conv_state, never writes it.
void invoke_conv_update(const VerifyParams& p, cudaStream_t stream, const LaunchOverrides& o = {});

/// The plan of a verify call on `path` with fused tile `block_v` (kFusedBlockVs; the unfused
/// path ignores it) on the current device: plan_verify (verify_plan.h) with the device's caps and
/// the occupancy of the persistent kernel the call would take (asked once and cached). Host-only,
/// legal during stream capture. Throws kda::Error on an unsupported K or tile.
VerifyPlan plan_verify_on_device(const VerifyParams& p, VerifyPath path, int block_v,
                                 const LaunchOverrides& o = {});
/// Validates `p` for the plan's path and that `plan` is this call's plan (its instantiation, tile,
/// features and items), then enqueues it: the unfused path the conv update, then the recurrence.
void invoke_verify(const VerifyParams& p, const VerifyPlan& plan, cudaStream_t stream);

/// Both unfused steps, as planned on the current device.
void invoke_verify_unfused(const VerifyParams& p, cudaStream_t stream,
                           const LaunchOverrides& o = {});
/// Fused conv + gate + recurrence, one kernel, V tile `block_v` (kFusedBlockVs), as planned on
/// the current device.
void invoke_verify_fused(const VerifyParams& p, int block_v, cudaStream_t stream,
                         const LaunchOverrides& o = {});

/// Extend: process and commit p.T tokens per request in place (any T >= 1).
void invoke_extend(const ExtendParams& p, cudaStream_t stream, const LaunchOverrides& o = {});

/// Commit of all layers: fold (ring mode) or snapshot copy, and the conv commit. One launch
/// when conv_commit_vec8(p) (the state commit kernel copies the conv windows too), else two.
void invoke_commit(const CommitParams& p, cudaStream_t stream, const LaunchOverrides& o = {});

/// Whether a fold's layout lets it run persistent (fold.cu): T <= 8, state and ring records
/// (rawk, g, rawv rows) copyable as 16-byte-aligned bulk runs.
bool fold_persistent_layout_ok(const CommitParams& p);
/// Whether every conv commit offset is 16-byte aligned (8 bf16 per access): then invoke_commit
/// copies the conv windows inside the fold / snapshot launch.
bool conv_commit_vec8(const CommitParams& p);

/// The pieces of invoke_commit, for tests and the benchmark.
void invoke_fold(const CommitParams& p, cudaStream_t stream, const LaunchOverrides& o = {});
void invoke_commit_snapshot(const CommitParams& p, cudaStream_t stream,
                            const LaunchOverrides& o = {});
void invoke_commit_conv(const CommitParams& p, cudaStream_t stream, const LaunchOverrides& o = {});

}  // namespace kda::kernels
