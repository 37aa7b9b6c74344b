// commit.cuh: commit kernels, every layer in one launch each (the fold: fold.cu; the copies and
// the deferred commit's bookkeeping: commit.cu; what they share: commit_copy.cuh).
//
// fold_kernel (ring mode): grid (ceil(V/128), B, layers*HV), 256 threads; the same column
//   slices and step function as the verify tile (delta_rule.cuh), so the folded state is
//   bitwise the snapshot the verify kernel would have stored. Per request: S = state[slot],
//   replay ring steps 0..n-1 (k normalised from rawk, EXP(g), beta, rawv), store S back.
//   Above one wave of CTAs: fold_persistent_kernel, persistent CTAs whose shared-memory stage
//   receives the next item's state tile and ring records (TMA bulk copies; beta by cp.async)
//   while the current item computes; same arithmetic, same bits.
// commit_snapshot_kernel: state[layer][slot] <- snapshots[layer][row][n-1] (float4 copies).
// commit_conv_kernel: conv_state[layer][slot] <- conv_window[layer][row][n-1] (W-1 rows of D).
// invoke_commit is one launch when the conv commit is 16-byte aligned: the fold or snapshot
//   kernel copies the conv windows too (a separate conv launch costs a launch per round).
// Deferred commit (contract §7, CommitKind): kDeferred runs commit_conv_kernel alone, which
//   also records each request's pending count and advances its slot's ring cursor;
//   kMaterialize folds every slot's pending steps (FoldRole::kMaterialize: records at ring
//   positions (c - n + j) mod L) and then zeroes the counts (drop_pending_kernel), which
//   kDropPending runs alone.
// Tracks (prefix caching, contract §9, commit_track.h): the eager fold stores the state after
//   the track step into the track slot as it passes it (FoldRole::kCommitTracked); a deferred
//   commit folds steps 0..k into the track slot (kTrackOnly); commit_track_kernel copies the
//   track's conv window (and snapshot mode's track state) and zeroes its pending counts.
// slot < 0: skipped. n outside [1, T]: skipped, kBadAcceptedLength into *error_flag.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/common/launch_utils.h"
#include "kernels/params/kda_params.h"

namespace kda::kernels {

constexpr int kFoldBlockV = 128;

/// `with_conv`: the same launch also commits the conv windows (requires conv_commit_vec8).
template <int K>
void launch_fold(const CommitParams& p, cudaStream_t stream, bool with_conv,
                 const LaunchOverrides& o);
extern template void launch_fold<64>(const CommitParams&, cudaStream_t, bool,
                                     const LaunchOverrides&);
extern template void launch_fold<128>(const CommitParams&, cudaStream_t, bool,
                                      const LaunchOverrides&);

/// kMaterialize: the pending folds of every layer, then the counts zeroed.
template <int K>
void launch_materialize(const CommitParams& p, cudaStream_t stream, const LaunchOverrides& o);
extern template void launch_materialize<64>(const CommitParams&, cudaStream_t,
                                            const LaunchOverrides&);
extern template void launch_materialize<128>(const CommitParams&, cudaStream_t,
                                             const LaunchOverrides&);

/// The pending fold of a u-free deferred verify call (pending_fold_params: one layer, the pending
/// counts read, not zeroed), one CTA per item.
template <int K>
void launch_verify_pending_fold(const VerifyParams& v, cudaStream_t stream,
                                const LaunchOverrides& o);
extern template void launch_verify_pending_fold<64>(const VerifyParams&, cudaStream_t,
                                                    const LaunchOverrides&);
extern template void launch_verify_pending_fold<128>(const VerifyParams&, cudaStream_t,
                                                     const LaunchOverrides&);

/// kDeferred with tracks: each valid track's steps 0..k folded from the slot's state into the
/// track slot (fold_kernel, FoldRole::kTrackOnly). Before the cursor moves.
template <int K>
void launch_fold_tracks_deferred(const CommitParams& p, cudaStream_t stream,
                                 const LaunchOverrides& o);
extern template void launch_fold_tracks_deferred<64>(const CommitParams&, cudaStream_t,
                                                     const LaunchOverrides&);
extern template void launch_fold_tracks_deferred<128>(const CommitParams&, cudaStream_t,
                                                      const LaunchOverrides&);

/// kLazy (contract §11): each valid track's pending steps and steps 0..k into the track slot
/// (FoldRole::kLazyTrack), then each slot's pending and accepted steps where lazy_commit_folds
/// (FoldRole::kLazy). Before the conv commit moves the counts and cursors.
template <int K>
void launch_fold_lazy(const CommitParams& p, cudaStream_t stream, const LaunchOverrides& o);
extern template void launch_fold_lazy<64>(const CommitParams&, cudaStream_t,
                                          const LaunchOverrides&);
extern template void launch_fold_lazy<128>(const CommitParams&, cudaStream_t,
                                           const LaunchOverrides&);

/// Tracks (commit_track_kernel): the track's conv window, snapshot mode's track state, the
/// track slot's pending counts zeroed; reports invalid tracks.
void launch_commit_track(const CommitParams& p, cudaStream_t stream, const LaunchOverrides& o);

void launch_commit_snapshot(const CommitParams& p, cudaStream_t stream, bool with_conv,
                            const LaunchOverrides& o);
void launch_commit_conv(const CommitParams& p, cudaStream_t stream, const LaunchOverrides& o);
/// ring_pending[layer][slots[n]] <- 0 for layers 0..num_layers-1.
void launch_drop_pending(const CommitParams& p, cudaStream_t stream, const LaunchOverrides& o);
/// Stage 1 of a shaped commit (commit_shape_kernel, commit.cu): checked_accepted, and a tree's
/// accepted windows and ring records moved to steps 0..n-1.
void launch_commit_shape(const CommitParams& p, cudaStream_t stream, const LaunchOverrides& o);

}  // namespace kda::kernels
