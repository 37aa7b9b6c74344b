// commit_ref.cc: the copy-only commits on the host (snapshot n-1 -> state, window n-1 ->
// conv state) and the full commit.
#include <algorithm>

#include "core/error.h"
#include "kernels/commit/commit_track.h"
#include "kernels/ref/host_common.h"
#include "kernels/ref/kda_host.h"

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
  // A checked tree commit (accepted_paths without parents): step k is node paths[i*T + k].
  const auto node = [&](int i, int32_t k) {
    return p.accepted_paths != nullptr ? p.accepted_paths[static_cast<int64_t>(i) * p.T + k] : k;
  };
  detail::for_each_committed(p, [&](int i, int32_t slot, int32_t n) {
    const int32_t k = detail::track_step_or_flag(p, i);
    if (k >= 0) {
      copy(i, p.track_slots[i], node(i, k));
    }
    copy(i, slot, node(i, n - 1));
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

// The draft shape's index arrays (host memory here; the backend validates them before upload).
void check_shape(const CommitParams& p, const char* op) {
  for (int i = 0; i < p.B && p.token_offsets != nullptr; ++i) {
    const int32_t len = p.token_offsets[i + 1] - p.token_offsets[i];
    KDA_CHECK(p.token_offsets[0] == 0 && len >= 1 && len <= p.T,
              "{}: token_offsets[{}..{}] give T_{}={}, expected 1..T={} (token_offsets[0] = 0)", op,
              i, i + 1, i, len, p.T);
  }
}

// One record of `width` elements at ring position `from` to position `to`, every head.
template <typename E>
void move_record(E* base, int64_t layer_stride, int64_t slot_stride, int layer, int32_t slot,
                 int heads, int L, int64_t width, int from, int to) {
  for (int h = 0; h < heads; ++h) {
    E* head =
        base + layer * layer_stride + slot * slot_stride + static_cast<int64_t>(h) * L * width;
    std::copy_n(head + from * width, width, head + to * width);
  }
}

// Stage 1 of a shaped commit (CommitParams::checked_accepted): each real request's length if in
// [1, T_i] and, for a tree, its path a root path (else 0, and kBadPath for the path); a valid
// tree path's windows and (ring mode) ring records move from node path[k] to step k, k < n.
// Path nodes increase (each is its predecessor's child), so node path[k] >= k and no move
// overwrites a later one's source.
void commit_shape(const CommitParams& p) {
  const int64_t D = qkv_dim(p);
  const int64_t window_elems = kConvHistory * D;
  for (int i = 0; i < p.B; ++i) {
    const int32_t slot = p.slots[i];
    const int32_t acc = p.accepted[i];
    if (slot < 0) {
      p.checked_accepted[i] = acc;  // padding: skipped by the commit
      continue;
    }
    const int32_t len =
        p.token_offsets != nullptr ? p.token_offsets[i + 1] - p.token_offsets[i] : p.T;
    int32_t n = acc >= 1 && acc <= len ? acc : 0;  // 0: the commit skips and flags it
    if (n > 0 && p.parents != nullptr) {
      const int32_t* path = p.accepted_paths + static_cast<int64_t>(i) * p.T;
      const int32_t* par = p.parents + static_cast<int64_t>(i) * p.T;
      bool ok = path[0] == 0;
      for (int k = 1; k < n && ok; ++k) {
        ok = path[k] > 0 && path[k] < p.T && par[path[k]] == path[k - 1];
      }
      if (!ok) {
        if (p.error_flag != nullptr) {
          *p.error_flag |= kBadPath;
        }
        n = 0;
      }
      for (int k = 1; k < n; ++k) {
        const int from = path[k];
        if (from == k) {
          continue;
        }
        for (int layer = 0; layer < p.num_layers; ++layer) {
          bf16_t* windows = p.conv_window + layer * p.conv_window_layer_stride +
                            p.rows[i] * p.conv_window_row_stride;
          std::copy_n(windows + detail::window_step_offset(from, D), window_elems,
                      windows + detail::window_step_offset(k, D));
          if (p.mode == RecordMode::kRing) {
            move_record(p.ring_rawk, p.ring_rawk_layer_stride, p.ring_rawk_slot_stride, layer, slot,
                        p.H, p.L, p.K, from, k);
            move_record(p.ring_rawv, p.ring_rawv_layer_stride, p.ring_rawv_slot_stride, layer, slot,
                        p.HV, p.L, p.V, from, k);
            move_record(p.ring_g, p.ring_g_layer_stride, p.ring_g_slot_stride, layer, slot, p.HV,
                        p.L, p.K, from, k);
            move_record(p.ring_beta, p.ring_beta_layer_stride, p.ring_beta_slot_stride, layer, slot,
                        p.HV, p.L, 1, from, k);
          }
        }
      }
    }
    p.checked_accepted[i] = n;
  }
}

// kLazy (contract §11): everything validated first, then the tracks, pending counts and folds
// (they read the cursors before they advance), then the conv commit (it flags bad lengths).
void commit_lazy(const CommitParams& p, testing::LazyFault fault) {
  detail::validate_commit(p, "kda::host::commit", params::kFold | params::kConvCommit);
  detail::fold_lazy(p, fault);
  commit_conv(p);
}

}  // namespace

void testing::commit_lazy_with_fault(const CommitParams& p, LazyFault fault) {
  KDA_CHECK(p.kind == CommitKind::kLazy && p.token_offsets == nullptr && p.parents == nullptr,
            "kda::host::testing::commit_lazy_with_fault: a dense kLazy commit expected");
  commit_lazy(p, fault);
}

void commit(const CommitParams& p) {
  if (p.token_offsets != nullptr || p.parents != nullptr) {
    // A shaped round: everything is validated before stage 1 writes (the dense stage 2
    // validates its own view again).
    detail::validate_commit(p, "kda::host::commit", params::commit_needs(p));
    check_shape(p, "kda::host::commit");
    commit_shape(p);
    commit(params::dense_commit_stage(p));
    return;
  }
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
    case CommitKind::kLazy:
      commit_lazy(p, testing::LazyFault::kNone);
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
