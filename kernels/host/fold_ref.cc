// fold_ref.cc: the ReplaySSM commit on the host: replay the accepted ring steps onto the
// committed state (contract §3 "Fold"): steps 5-6 for k only, no q, no output.
#include <algorithm>
#include <vector>

#include "kernels/host/host_common.h"
#include "kernels/host/kda_host.h"

namespace kda::host {
namespace {

// The ring records of one (layer, slot), per-layer base pointers applied.
struct LayerRings {
  const bf16_t* rawv;
  const bf16_t* rawk;
  const float* g;
  const float* beta;
};

LayerRings layer_rings(const CommitParams& p, int layer) {
  return {p.ring_rawv + layer * p.ring_rawv_layer_stride,
          p.ring_rawk + layer * p.ring_rawk_layer_stride, p.ring_g + layer * p.ring_g_layer_stride,
          p.ring_beta + layer * p.ring_beta_layer_stride};
}

// Folds steps 0..n-1 of (slot, hv) into S, exactly the verify step minus q and the output:
// the recorded values are the bits verify computed, so the result equals verify's state.
void fold_head(const CommitParams& p, const LayerRings& rings, int32_t slot, int hv, int n,
               std::vector<float>& S) {
  const int h = hv / (p.HV / p.H);
  std::vector<float> k(p.K), kn(p.K), v(p.V), decay(p.K);
  for (int t = 0; t < n; ++t) {
    const bf16_t* rawk =
        rings.rawk + detail::ring_record(p.ring_rawk_slot_stride, slot, h, p.L, t, p.K);
    const bf16_t* rawv =
        rings.rawv + detail::ring_record(p.ring_rawv_slot_stride, slot, hv, p.L, t, p.V);
    const float* g = rings.g + detail::ring_record(p.ring_g_slot_stride, slot, hv, p.L, t, p.K);
    const float beta =
        rings.beta[detail::ring_record(p.ring_beta_slot_stride, slot, hv, p.L, t, 1)];
    std::transform(rawk, rawk + p.K, k.begin(), bf16_to_float);
    std::transform(rawv, rawv + p.V, v.begin(), bf16_to_float);
    math::l2_normalize(k.data(), p.K, kn.data());
    math::decay_state(S.data(), g, p.K, p.V, decay.data());
    math::delta_update(S.data(), kn.data(), beta, v.data(), p.K, p.V);
  }
}

}  // namespace

void fold(const CommitParams& p) {
  detail::validate_commit(p, "kda::host::fold", params::kFold);
  std::vector<float> S(static_cast<size_t>(p.V) * p.K);
  detail::for_each_committed(p, [&](int, int32_t slot, int32_t n) {
    for (int layer = 0; layer < p.num_layers; ++layer) {
      const LayerRings rings = layer_rings(p, layer);
      float* state = p.ssm_state + layer * p.ssm_layer_stride;
      for (int hv = 0; hv < p.HV; ++hv) {
        float* head = state + detail::state_offset(p.ssm_slot_stride, slot, hv, p.V, p.K);
        std::copy(head, head + S.size(), S.begin());
        fold_head(p, rings, slot, hv, n, S);
        std::copy(S.begin(), S.end(), head);
      }
    }
  });
}

}  // namespace kda::host
