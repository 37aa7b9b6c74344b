// commit_track.h: which requests of a commit write a prefix-cache track (contract §9), one
// predicate for the host reference and the CUDA commit kernels (plain C++, KDA_HD).
#pragma once

#include <cstdint>

#include "core/platform_macros.h"
#include "kernels/params/kda_params.h"

namespace kda {

constexpr int32_t kNoTrack = -1;       ///< the request tracks nothing (or commits nothing)
constexpr int32_t kInvalidTrack = -2;  ///< a track was asked for and is invalid (kBadTrack)

/// Request i's track step k (>= 0), kNoTrack, or kInvalidTrack. A request tracks when it
/// commits (a real slot, accepted length n in [1, T]) and track_steps[i] >= 0; the track is
/// valid when k < n and track_slots[i] is in [0, S), allocated (p.slot_allocated, when given),
/// not a slot of the batch and not the track slot of another request j that asks for a track
/// (j's validity aside, so that two claims on one slot both fail, whatever the order). O(B)
/// reads: B is at most a few hundred.
KDA_HD int32_t track_step_of(const CommitParams& p, int i) {
  if (p.track_steps == nullptr || p.slots[i] < 0) {
    return kNoTrack;
  }
  const int32_t k = p.track_steps[i];
  const int32_t n = p.accepted[i];
  if (k < 0 || n < 1 || n > p.T) {
    return kNoTrack;  // a bad accepted length is kBadAcceptedLength's
  }
  const int32_t slot = p.track_slots[i];
  if (k >= n || slot < 0 || slot >= p.num_slots ||
      (p.slot_allocated != nullptr && p.slot_allocated[slot] == 0)) {
    return kInvalidTrack;
  }
  for (int j = 0; j < p.B; ++j) {
    if (p.slots[j] == slot ||
        (j != i && p.slots[j] >= 0 && p.track_steps[j] >= 0 && p.track_slots[j] == slot)) {
      return kInvalidTrack;
    }
  }
  return k;
}

/// The lazy commit's fold decision (CommitKind::kLazy, contract §11): a slot whose pending steps
/// become `m` (its earlier pending steps plus this commit's accepted ones) folds them all when
/// the next draft would not fit its ring beside them (m + T_max > L), or at the engine's
/// interval (lazy_fold_interval > 0 and m >= it). One predicate for the host reference and the
/// CUDA commit.
KDA_HD bool lazy_commit_folds(const CommitParams& p, int32_t m) {
  return m + p.T_max > p.L || (p.lazy_fold_interval > 0 && m >= p.lazy_fold_interval);
}

}  // namespace kda
