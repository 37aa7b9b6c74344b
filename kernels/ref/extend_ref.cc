// extend_ref.cc: host extend: verify's math over T tokens, committed in place.
#include <algorithm>
#include <vector>

#include "kernels/ref/host_common.h"
#include "kernels/ref/kda_host.h"

namespace kda::host {

void extend(const ExtendParams& e) {
  detail::validate_extend(e, "kda::host::extend");
  const VerifyParams p = verify_view(e);
  const int64_t D = qkv_dim(p);
  std::vector<bf16_t> act(static_cast<size_t>(p.T * D));
  std::vector<bf16_t> last_window(static_cast<size_t>(kConvHistory * D));
  for (int n = 0; n < p.B; ++n) {
    const int32_t slot = p.slots[n];
    if (slot < 0) {
      detail::zero_out_rows(p, n);
      continue;
    }
    // The whole request's conv first: it reads conv_state[slot] before conv_state_out[slot]
    // (which may alias it) is written below.
    detail::conv_request(p, n, slot, act.data(), D, /*windows=*/nullptr, last_window.data());
    const int32_t track_k = e.track_steps != nullptr ? e.track_steps[n] : -1;
    const int32_t track = track_k >= 0 ? e.track_slots[n] : -1;
    if (track_k >= 0) {
      // The window after prompt token k: raw inputs k-2..k, the old history before token 0.
      bf16_t* conv_track = e.conv_state_out + track * p.conv_state_slot_stride;
      const bf16_t* old = p.conv_state + slot * p.conv_state_slot_stride;
      for (int j = 0; j < kConvHistory; ++j) {
        const int tau = track_k - (kConvHistory - 1) + j;
        const bf16_t* src = tau >= 0 ? p.mixed_qkv + detail::qkv_row(p, n, tau) * p.mixed_qkv_stride
                                     : old + (kConvHistory + tau) * D;
        std::copy_n(src, D, conv_track + j * D);
      }
    }
    detail::recur_request<float>(
        p, n, slot, act.data(), D,
        [&](int hv, int t, const detail::HeadStep<float>& w) {
          detail::write_out(p, detail::qkv_row(p, n, t), hv, w);
          if (t == track_k) {
            std::copy(
                w.S.begin(), w.S.end(),
                e.ssm_state_out + detail::state_offset(p.ssm_slot_stride, track, hv, p.V, p.K));
          }
        },
        [&](int hv, const detail::HeadStep<float>& w) {
          // Each (slot, hv) state is read once, before this store: aliasing ssm_state is safe.
          float* dst =
              e.ssm_state_out + detail::state_offset(p.ssm_slot_stride, slot, hv, p.V, p.K);
          std::copy(w.S.begin(), w.S.end(), dst);
        });
    bf16_t* conv_dst = e.conv_state_out + slot * p.conv_state_slot_stride;
    for (int j = 0; j < kConvHistory; ++j) {
      std::copy_n(last_window.begin() + j * D, D, conv_dst + j * D);
    }
  }
}

}  // namespace kda::host
