// fold_ref.cc: the ReplaySSM commit on the host: replay the accepted ring steps onto the
// committed state (contract §3 "Fold"): steps 5-6 for k only, no q, no output.
#include <algorithm>
#include <vector>

#include "kernels/commit/commit_track.h"
#include "kernels/ref/fast_ref_testing.h"
#include "kernels/ref/host_common.h"
#include "kernels/ref/kda_host.h"

namespace kda::host {
namespace detail {

void fold_steps(const RingView& r, int32_t slot, int h, int hv, int K, int V, int first, int n,
                float* S) {
  std::vector<float> k(K), kn(K), v(V), decay(K), u(V);
  for (int j = 0; j < n; ++j) {
    const int t = (first + j) & (r.L - 1);  // ring position (first may be negative)
    const bf16_t* rawk = r.rawk + ring_record(r.rawk_slot_stride, slot, h, r.L, t, K);
    const float* g = r.g + ring_record(r.g_slot_stride, slot, hv, r.L, t, K);
    std::transform(rawk, rawk + K, k.begin(), bf16_to_float);
    math::l2_normalize(k.data(), K, kn.data());
    math::decay_state(S, g, K, V, decay.data());
    if (r.u != nullptr) {  // the step's u record: no rawv, beta or key dot
      math::rank1_update(S, kn.data(), r.u + ring_record(r.u_slot_stride, slot, hv, r.L, t, V), K,
                         V);
      continue;
    }
    const bf16_t* rawv = r.rawv + ring_record(r.rawv_slot_stride, slot, hv, r.L, t, V);
    const float beta = r.beta[ring_record(r.beta_slot_stride, slot, hv, r.L, t, 1)];
    std::transform(rawv, rawv + V, v.begin(), bf16_to_float);
    math::delta_update(S, kn.data(), beta, v.data(), K, V, u.data());
  }
}

}  // namespace detail

namespace {

// Layer `layer`'s ring records.
detail::RingView layer_rings(const CommitParams& p, int layer) {
  return {p.ring_rawv + layer * p.ring_rawv_layer_stride,
          p.ring_rawk + layer * p.ring_rawk_layer_stride,
          p.ring_g + layer * p.ring_g_layer_stride,
          p.ring_beta + layer * p.ring_beta_layer_stride,
          p.ring_rawv_slot_stride,
          p.ring_rawk_slot_stride,
          p.ring_g_slot_stride,
          p.ring_beta_slot_stride,
          p.L,
          p.ring_u != nullptr && p.u_free == 0 ? p.ring_u + layer * p.ring_u_layer_stride : nullptr,
          p.ring_u_slot_stride};
}

int32_t cursor_of(const CommitParams& p, int32_t slot) {
  return p.ring_cursor != nullptr ? p.ring_cursor[slot] : 0;
}

// Folds ring positions (first + j) mod L, j < n, of every head of (layer, slot) into the state;
// with track_k >= 0 the state after step track_k also goes to slot track_slot (the fold runs
// on: splitting a sequential fold there leaves its bits alone).
void fold_slot(const CommitParams& p, int layer, int32_t slot, int first, int n,
               std::vector<float>& S, int32_t track_k = kNoTrack, int32_t track_slot = -1) {
  const detail::RingView rings = layer_rings(p, layer);
  float* state = p.ssm_state + layer * p.ssm_layer_stride;
  const int h_of = p.HV / p.H;
  for (int hv = 0; hv < p.HV; ++hv) {
    float* head = state + detail::state_offset(p.ssm_slot_stride, slot, hv, p.V, p.K);
    std::copy(head, head + S.size(), S.begin());
    int done = 0;
    if (track_k >= 0) {
      detail::fold_steps(rings, slot, hv / h_of, hv, p.K, p.V, first, track_k + 1, S.data());
      std::copy(S.begin(), S.end(),
                state + detail::state_offset(p.ssm_slot_stride, track_slot, hv, p.V, p.K));
      done = track_k + 1;
    }
    detail::fold_steps(rings, slot, hv / h_of, hv, p.K, p.V, first + done, n - done, S.data());
    std::copy(S.begin(), S.end(), head);
  }
}

}  // namespace

void fold(const CommitParams& p) {
  detail::validate_commit(p, "kda::host::fold", params::kFold);
  std::vector<float> S(static_cast<size_t>(p.V) * p.K);
  if (p.kind == CommitKind::kMaterialize) {
    for (int i = 0; i < p.B; ++i) {
      const int32_t slot = p.slots[i];
      if (slot < 0) {
        continue;
      }
      for (int layer = 0; layer < p.num_layers; ++layer) {
        int32_t& n = p.ring_pending[layer * p.ring_pending_layer_stride + slot];
        if (n > 0) {
          fold_slot(p, layer, slot, cursor_of(p, slot) - n, n, S);
        }
        n = 0;
      }
    }
    return;
  }
  detail::for_each_committed(p, [&](int i, int32_t slot, int32_t n) {
    const int32_t k = p.kind == CommitKind::kEager ? detail::track_step_or_flag(p, i) : kNoTrack;
    for (int layer = 0; layer < p.num_layers; ++layer) {
      fold_slot(p, layer, slot, cursor_of(p, slot), n, S, k, k >= 0 ? p.track_slots[i] : -1);
    }
  });
}

void detail::fold_lazy(const CommitParams& p, testing::LazyFault fault) {
  using testing::LazyFault;
  std::vector<float> S(static_cast<size_t>(p.V) * p.K);
  // kFoldOneStepLate: the decision taken for one step fewer (m - 1) than the slot holds.
  const int32_t late = fault == LazyFault::kFoldOneStepLate ? 1 : 0;
  for (int i = 0; i < p.B; ++i) {
    const int32_t slot = p.slots[i];
    const int32_t acc = p.accepted[i];
    if (slot < 0 || acc < 1 || acc > p.T) {
      continue;  // padding, or a bad length (commit_conv flags it): nothing pending changes
    }
    const int32_t n = fault == LazyFault::kPendingCountedTwice ? 2 * acc : acc;
    const int32_t k = detail::track_step_or_flag(p, i);
    const int32_t c = cursor_of(p, slot);
    for (int layer = 0; layer < p.num_layers; ++layer) {
      int32_t& pending = p.ring_pending[layer * p.ring_pending_layer_stride + slot];
      const int32_t first = c - pending;  // the oldest pending step's ring position
      const int32_t m = pending + n;
      const bool folds = lazy_commit_folds(p, m - late);
      if (k >= 0) {
        // The track: the checkpoint through the pending steps and steps 0..k, in the fold's
        // one sequential pass when the slot folds too (splitting it leaves its bits alone).
        const int32_t track_slot = p.track_slots[i];
        if (folds) {
          fold_slot(p, layer, slot, first, m, S, pending + k, track_slot);
        } else {
          const detail::RingView rings = layer_rings(p, layer);
          float* state = p.ssm_state + layer * p.ssm_layer_stride;
          for (int hv = 0; hv < p.HV; ++hv) {
            const float* head = state + detail::state_offset(p.ssm_slot_stride, slot, hv, p.V, p.K);
            std::copy(head, head + S.size(), S.begin());
            detail::fold_steps(rings, slot, hv / (p.HV / p.H), hv, p.K, p.V, first, pending + k + 1,
                               S.data());
            std::copy(S.begin(), S.end(),
                      state + detail::state_offset(p.ssm_slot_stride, track_slot, hv, p.V, p.K));
          }
        }
        p.ring_pending[layer * p.ring_pending_layer_stride + track_slot] = 0;
      } else if (folds) {
        fold_slot(p, layer, slot, first, m, S);
      }
      pending = folds ? 0 : m;
    }
    p.ring_cursor[slot] = (c + acc) & (p.L - 1);
  }
}

void fold_track_deferred(const CommitParams& p) {
  std::vector<float> S(static_cast<size_t>(p.V) * p.K);
  for (int i = 0; i < p.B; ++i) {
    const int32_t k = detail::track_step_or_flag(p, i);
    if (k < 0) {
      continue;
    }
    const int32_t slot = p.slots[i], track = p.track_slots[i];
    for (int layer = 0; layer < p.num_layers; ++layer) {
      const detail::RingView rings = layer_rings(p, layer);
      float* state = p.ssm_state + layer * p.ssm_layer_stride;
      for (int hv = 0; hv < p.HV; ++hv) {
        const float* head = state + detail::state_offset(p.ssm_slot_stride, slot, hv, p.V, p.K);
        std::copy(head, head + S.size(), S.begin());
        detail::fold_steps(rings, slot, hv / (p.HV / p.H), hv, p.K, p.V, cursor_of(p, slot), k + 1,
                           S.data());
        std::copy(S.begin(), S.end(),
                  state + detail::state_offset(p.ssm_slot_stride, track, hv, p.V, p.K));
      }
      p.ring_pending[layer * p.ring_pending_layer_stride + track] = 0;
    }
  }
}

}  // namespace kda::host
