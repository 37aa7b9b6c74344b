// commit_ref.cc: the copy-only commits on the host (snapshot n-1 -> state, window n-1 ->
// conv state) and the full commit.
#include <algorithm>

#include "kernels/commit_track.h"
#include "kernels/host/host_common.h"
#include "kernels/host/kda_host.h"

namespace kda::host {
namespace detail {

int32_t accepted_or_flag(const CommitParams& p, int i) {
  const int32_t n = p.accepted[i];
  if (n >= 1 && n <= p.T) {
    return n;
  }
  if (p.error_flag != nullptr) {
    *p.error_flag |= kBadAcceptedLength;
  }
  return 0;
}

int32_t track_step_or_flag(const CommitParams& p, int i) {
  const int32_t k = track_step_of(p, i);
  if (k == kInvalidTrack) {
    if (p.error_flag != nullptr) {
      *p.error_flag |= kBadTrack;
    }
    return kNoTrack;
  }
  return k;
}

}  // namespace detail

void commit_snapshot(const CommitParams& p) {
  detail::validate_commit(p, "kda::host::commit_snapshot", params::kSnapshot);
  const int64_t state_elems = static_cast<int64_t>(p.HV) * p.V * p.K;
  const auto copy = [&](int i, int32_t slot, int32_t step) {
    for (int layer = 0; layer < p.num_layers; ++layer) {
      const float* src = p.snapshots + layer * p.snapshot_layer_stride +
                         p.rows[i] * p.snapshot_row_stride + step * state_elems;
      float* dst = p.ssm_state + layer * p.ssm_layer_stride + slot * p.ssm_slot_stride;
      std::copy_n(src, state_elems, dst);
    }
  };
  detail::for_each_committed(p, [&](int i, int32_t slot, int32_t n) {
    const int32_t k = detail::track_step_or_flag(p, i);
    if (k >= 0) {
      copy(i, p.track_slots[i], k);
    }
    copy(i, slot, n - 1);
  });
}

void commit_conv(const CommitParams& p) {
  detail::validate_commit(p, "kda::host::commit_conv", params::kConvCommit);
  const int64_t D = qkv_dim(p);
  const int64_t window_elems = kConvHistory * D;
  const auto copy = [&](int i, int32_t slot, int32_t step) {
    for (int layer = 0; layer < p.num_layers; ++layer) {
      const bf16_t* src = p.conv_window + layer * p.conv_window_layer_stride +
                          p.rows[i] * p.conv_window_row_stride +
                          detail::window_step_offset(step, D);
      bf16_t* dst =
          p.conv_state + layer * p.conv_state_layer_stride + slot * p.conv_state_slot_stride;
      std::copy_n(src, window_elems, dst);
    }
  };
  detail::for_each_committed(p, [&](int i, int32_t slot, int32_t n) {
    // The track's window (its validity is reported by the state part of the commit).
    const int32_t k = track_step_of(p, i);
    if (k >= 0) {
      copy(i, p.track_slots[i], k);
    }
    copy(i, slot, n - 1);
  });
}

namespace {

// A deferred commit's bookkeeping: each live request's pending count becomes its accepted
// length (0 for a bad one) in every layer, and its slot's cursor advances by it (mod L).
void commit_pending(const CommitParams& p) {
  for (int i = 0; i < p.B; ++i) {
    const int32_t slot = p.slots[i];
    if (slot < 0) {
      continue;
    }
    const int32_t acc = p.accepted[i];
    const int32_t n = acc >= 1 && acc <= p.T ? acc : 0;
    for (int layer = 0; layer < p.num_layers; ++layer) {
      p.ring_pending[layer * p.ring_pending_layer_stride + slot] = n;
    }
    p.ring_cursor[slot] = (p.ring_cursor[slot] + n) & (p.L - 1);
  }
}

// kDropPending: the batch's pending counts of layers 0..num_layers-1 become 0.
void drop_pending(const CommitParams& p) {
  for (int i = 0; i < p.B; ++i) {
    if (p.slots[i] >= 0) {
      for (int layer = 0; layer < p.num_layers; ++layer) {
        p.ring_pending[layer * p.ring_pending_layer_stride + p.slots[i]] = 0;
      }
    }
  }
}

}  // namespace

void commit(const CommitParams& p) {
  // Everything this commit touches is validated before the first write.
  switch (p.kind) {
    case CommitKind::kMaterialize:
      fold(p);
      return;
    case CommitKind::kDropPending:
      detail::validate_commit(p, "kda::host::commit", 0u);
      drop_pending(p);
      return;
    case CommitKind::kDeferred:
      detail::validate_commit(p, "kda::host::commit", params::kConvCommit);
      if (p.track_slots != nullptr) {
        detail::validate_commit(p, "kda::host::commit", params::kFold);
        fold_track_deferred(p);  // reads the cursor before commit_pending advances it
      }
      commit_conv(p);  // flags a bad accepted length
      commit_pending(p);
      return;
    case CommitKind::kEager:
      break;
  }
  const uint32_t state_part = p.mode == RecordMode::kRing ? params::kFold : params::kSnapshot;
  detail::validate_commit(p, "kda::host::commit", state_part | params::kConvCommit);
  if (p.mode == RecordMode::kRing) {
    fold(p);
  } else {
    commit_snapshot(p);
  }
  commit_conv(p);
}

}  // namespace kda::host
