// conv_update_ref.cc: contract §3 step 1 (causal conv + SiLU + bf16) on the host, and the
// unfused conv-update op built from it.
#include <algorithm>
#include <vector>

#include "kernels/ref/host_common.h"
#include "kernels/ref/kda_host.h"

namespace kda::host {
namespace detail {

math::ConvTaps load_conv_taps(const VerifyParams& p, int64_t ch) {
  math::ConvTaps c;
  if (p.conv_weight_type == ConvWeightType::kBF16) {
    const auto* w = static_cast<const bf16_t*>(p.conv_weight) + ch * kConvWidth;
    for (int j = 0; j < kConvWidth; ++j) {
      c.w[j] = bf16_to_float(w[j]);
    }
    if (p.conv_bias != nullptr) {
      c.bias = bf16_to_float(static_cast<const bf16_t*>(p.conv_bias)[ch]);
    }
    c.bf16_products = true;
  } else {
    const auto* w = static_cast<const float*>(p.conv_weight) + ch * kConvWidth;
    std::copy(w, w + kConvWidth, c.w);
    if (p.conv_bias != nullptr) {
      c.bias = static_cast<const float*>(p.conv_bias)[ch];
    }
  }
  return c;
}

void conv_request(const VerifyParams& p, int n, int32_t slot, bf16_t* act, int64_t act_stride,
                  bf16_t* windows, bf16_t* last_window) {
  const int64_t D = qkv_dim(p);
  const bf16_t* history = p.conv_state + slot * p.conv_state_slot_stride;
  for (int64_t ch = 0; ch < D; ++ch) {
    const math::ConvTaps taps = load_conv_taps(p, ch);
    // Raw (pre-conv) inputs, oldest first: the window slides by copying, no arithmetic.
    bf16_t win[kConvHistory];
    for (int j = 0; j < kConvHistory; ++j) {
      win[j] = history[j * D + ch];
    }
    // A tree keeps every node's window: node t's starts from its parent's (the history for
    // the root). A chain's parent is the previous token, whose window `win` holds.
    const int T = tokens_of(p, n);
    std::vector<bf16_t> node_windows(p.parents != nullptr ? static_cast<size_t>(T) * 3 : 0);
    for (int t = 0; t < T; ++t) {
      if (p.parents != nullptr) {
        const int parent = parent_of(p, n, t);
        for (int j = 0; j < kConvHistory; ++j) {
          win[j] = parent < 0 ? history[j * D + ch]
                              : node_windows[static_cast<size_t>(parent) * kConvHistory + j];
        }
      }
      const bf16_t x = p.mixed_qkv[qkv_row(p, n, t) * p.mixed_qkv_stride + ch];
      const float taps_in[kConvWidth] = {bf16_to_float(win[0]), bf16_to_float(win[1]),
                                         bf16_to_float(win[2]), bf16_to_float(x)};
      act[t * act_stride + ch] = math::conv_silu_bf16(taps, taps_in);
      win[0] = win[1];
      win[1] = win[2];
      win[2] = x;
      if (p.parents != nullptr) {
        std::copy(win, win + kConvHistory, &node_windows[static_cast<size_t>(t) * kConvHistory]);
      }
      if (windows != nullptr) {
        bf16_t* dst = windows + window_step_offset(t, D) + ch;
        for (int j = 0; j < kConvHistory; ++j) {
          dst[j * D] = win[j];
        }
      }
    }
    if (last_window != nullptr) {
      for (int j = 0; j < kConvHistory; ++j) {
        last_window[j * D + ch] = win[j];
      }
    }
  }
}

void zero_out_rows(const VerifyParams& p, int n) {
  const int64_t row_elems = static_cast<int64_t>(p.HV) * p.V;
  bf16_t* out = p.out + qkv_row(p, n, 0) * row_elems;
  std::fill(out, out + tokens_of(p, n) * row_elems, bf16_t{0});
}

}  // namespace detail

void conv_update(const VerifyParams& p) {
  detail::validate_verify(p, "kda::host::conv_update",
                          params::kConv | params::kWindows | params::kAct);
  const int64_t D = qkv_dim(p);
  for (int n = 0; n < p.B; ++n) {
    const int32_t slot = p.slots[n];
    if (slot < 0) {
      continue;  // padding: its qkv_act rows and scratch row are not ours to touch
    }
    bf16_t* act = p.qkv_act + detail::qkv_row(p, n, 0) * D;
    bf16_t* windows = p.conv_window + p.rows[n] * p.conv_window_row_stride;
    detail::conv_request(p, n, slot, act, D, windows, /*last_window=*/nullptr);
  }
}

}  // namespace kda::host
