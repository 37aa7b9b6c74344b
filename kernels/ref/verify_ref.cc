// verify_ref.cc: host verify, unfused (conv_update + recurrence over qkv_act) and fused (the
// conv inside each (request, v-head)'s token loop, as the fused kernel runs it). The two are
// separately written loops over the same per-step functions, so their bitwise agreement
// tests the structure (indexing, window ownership, record placement), not just the math.
// The fused loop (fused_walk) also carries the fast outputs' prologue (verify_fast_ref.cc), so
// both fused forms write their records and windows from one piece of code.
#include <algorithm>
#include <vector>

#include "kernels/ref/host_common.h"
#include "kernels/ref/kda_host.h"

namespace kda::host {
namespace detail {

void write_out(const VerifyParams& p, int64_t r, int hv, const float* o) {
  bf16_t* out = p.out + (r * p.HV + hv) * p.V;
  for (int v = 0; v < p.V; ++v) {
    out[v] = float_to_bf16(o[v]);
  }
}

void write_out(const VerifyParams& p, int64_t r, int hv, const HeadStep<float>& w) {
  write_out(p, r, hv, w.o.data());
}

void write_snapshot(const VerifyParams& p, int32_t row, int t, int hv, const HeadStep<float>& w) {
  const int64_t head = static_cast<int64_t>(p.V) * p.K;
  float* dst =
      p.snapshots + row * p.snapshot_row_stride + (static_cast<int64_t>(t) * p.HV + hv) * head;
  std::copy(w.S.begin(), w.S.end(), dst);
}

void fold_pending(const VerifyParams& p, int32_t slot, int hv, std::vector<float>& S) {
  const int32_t n = p.ring_pending != nullptr ? p.ring_pending[slot] : 0;
  if (n <= 0 || is_lazy_verify(p)) {
    return;  // a lazy verify folds nothing: its pending steps are the fast chunk's history
  }
  const RingView rings{p.ring_rawv,
                       p.ring_rawk,
                       p.ring_g,
                       p.ring_beta,
                       p.ring_rawv_slot_stride,
                       p.ring_rawk_slot_stride,
                       p.ring_g_slot_stride,
                       p.ring_beta_slot_stride,
                       p.L,
                       p.u_free != 0 ? nullptr : p.ring_u,  // u-free: the fold computes u
                       p.ring_u_slot_stride};
  fold_steps(rings, slot, hv / (p.HV / p.H), hv, p.K, p.V, ring_cursor_of(p, slot) - n, n,
             S.data());
  std::copy(S.begin(), S.end(),
            p.ssm_fold_out + state_offset(p.ssm_slot_stride, slot, hv, p.V, p.K));
}

void write_ring(const VerifyParams& p, int32_t slot, int step, int hv, const HeadStep<float>& w) {
  const int group = p.HV / p.H;
  const int t = (ring_cursor_of(p, slot) + step) & (p.L - 1);  // ring position of the step
  // q/k/v are bf16 values held in f32: converting back is exact.
  bf16_t* rawv = p.ring_rawv + ring_record(p.ring_rawv_slot_stride, slot, hv, p.L, t, p.V);
  for (int v = 0; v < p.V; ++v) {
    rawv[v] = float_to_bf16(w.v[v]);
  }
  if (hv % group == 0) {
    bf16_t* rawk =
        p.ring_rawk + ring_record(p.ring_rawk_slot_stride, slot, hv / group, p.L, t, p.K);
    for (int k = 0; k < p.K; ++k) {
      rawk[k] = float_to_bf16(w.k[k]);
    }
  }
  float* g = p.ring_g + ring_record(p.ring_g_slot_stride, slot, hv, p.L, t, p.K);
  std::copy(w.g.begin(), w.g.end(), g);
  p.ring_beta[ring_record(p.ring_beta_slot_stride, slot, hv, p.L, t, 1)] = w.beta;
  if (p.ring_u != nullptr) {
    std::copy(w.u.begin(), w.u.end(),
              p.ring_u + ring_record(p.ring_u_slot_stride, slot, hv, p.L, t, p.V));
  }
}

void write_record(const VerifyParams& p, int32_t slot, int32_t row, int t, int hv,
                  const HeadStep<float>& w) {
  switch (p.mode) {
    case RecordMode::kSnapshot:
      write_snapshot(p, row, t, hv, w);
      return;
    case RecordMode::kRing:
      if (t < p.L) {  // steps t >= L have no ring position (contract §2)
        write_ring(p, slot, t, hv, w);
      }
      return;
  }
}

namespace {

// The conv of the channels one (request, v-head) needs: the K q- and K k-channels of its
// k-head, then its V v-channels, each with its taps and its sliding raw-input window.
class HeadConv {
 public:
  HeadConv(const VerifyParams& p, int32_t slot, int hv) : p_(p), D_(qkv_dim(p)) {
    const int h = hv / (p.HV / p.H);
    for (int i = 0; i < p.K; ++i) {
      channels_.push_back(q_channel(p, h) + i);
    }
    for (int i = 0; i < p.K; ++i) {
      channels_.push_back(k_channel(p, h) + i);
    }
    for (int i = 0; i < p.V; ++i) {
      channels_.push_back(v_channel(p, hv) + i);
    }
    const bf16_t* history = p.conv_state + slot * p.conv_state_slot_stride;
    for (const int64_t ch : channels_) {
      taps_.push_back(load_conv_taps(p, ch));
      for (int j = 0; j < kConvHistory; ++j) {
        windows_.push_back(history[j * D_ + ch]);
      }
    }
    // q/k windows are shared by the v-heads of a group: only the first one stores them, so
    // every window element has exactly one writer (as in the fused kernel).
    window_owner_ = hv % (p.HV / p.H) == 0;
  }

  // Step 1 for token t of request n: fills w.q, w.k, w.v and stores the windows after t into
  // the request's scratch row `windows`.
  void step(int n, int t, bf16_t* windows, HeadStep<float>& w) {
    const bf16_t* x_row = p_.mixed_qkv + qkv_row(p_, n, t) * p_.mixed_qkv_stride;
    bf16_t* step_windows = windows + window_step_offset(t, D_);
    const size_t qk = 2 * static_cast<size_t>(p_.K);
    for (size_t i = 0; i < channels_.size(); ++i) {
      bf16_t* win = &windows_[i * kConvHistory];
      const bf16_t x = x_row[channels_[i]];
      const float in[kConvWidth] = {bf16_to_float(win[0]), bf16_to_float(win[1]),
                                    bf16_to_float(win[2]), bf16_to_float(x)};
      const float y = bf16_to_float(math::conv_silu_bf16(taps_[i], in));
      win[0] = win[1];
      win[1] = win[2];
      win[2] = x;
      if (i >= qk || window_owner_) {
        for (int j = 0; j < kConvHistory; ++j) {
          step_windows[j * D_ + channels_[i]] = win[j];
        }
      }
      if (i < static_cast<size_t>(p_.K)) {
        w.q[i] = y;
      } else if (i < qk) {
        w.k[i - p_.K] = y;
      } else {
        w.v[i - qk] = y;
      }
    }
  }

 private:
  const VerifyParams& p_;
  int64_t D_;
  bool window_owner_ = false;
  std::vector<int64_t> channels_;
  std::vector<math::ConvTaps> taps_;
  std::vector<bf16_t> windows_;  // [channel][W-1], oldest first
};

}  // namespace

void fused_walk(const VerifyParams& p, const FusedTokenFn& on_token, const FusedHeadFn& on_head) {
  for (int n = 0; n < p.B; ++n) {
    const int32_t slot = p.slots[n];
    if (slot < 0) {
      zero_out_rows(p, n);
      continue;
    }
    const int32_t row = p.rows[n];
    bf16_t* windows = p.conv_window + row * p.conv_window_row_stride;
    for (int hv = 0; hv < p.HV; ++hv) {
      HeadConv conv(p, slot, hv);
      HeadStep<float> w(p.K, p.V);
      load_state(p.ssm_state, p.ssm_slot_stride, slot, hv, p.V, p.K, w.S);
      fold_pending(p, slot, hv, w.S);
      for (int t = 0; t < tokens_of(p, n); ++t) {
        conv.step(n, t, windows, w);
        const int64_t r = qkv_row(p, n, t);
        token_prologue(p, r, hv, w);
        on_token(FusedToken{n, slot, row, hv, t, r}, w);
      }
      if (on_head) {
        on_head(n, hv, w);
      }
    }
  }
}

}  // namespace detail

void verify_recurrent(const VerifyParams& p) {
  detail::validate_verify(p, "kda::host::verify_recurrent",
                          params::kAct | params::kRecurrence | params::kOut | params::kRecords);
  const int64_t D = qkv_dim(p);
  for (int n = 0; n < p.B; ++n) {
    const int32_t slot = p.slots[n];
    if (slot < 0) {
      detail::zero_out_rows(p, n);
      continue;
    }
    // Rows are only read in snapshot mode (ring records are keyed by slot).
    const int32_t row = p.mode == RecordMode::kSnapshot ? p.rows[n] : -1;
    const bf16_t* act = p.qkv_act + detail::qkv_row(p, n, 0) * D;
    detail::recur_request<float>(
        p, n, slot, act, D,
        [&](int hv, int t, const detail::HeadStep<float>& w) {
          detail::write_out(p, detail::qkv_row(p, n, t), hv, w);
          detail::write_record(p, slot, row, t, hv, w);
        },
        [](int, const detail::HeadStep<float>&) {});
  }
}

void verify_unfused(const VerifyParams& p) {
  // Validate everything up front so that a bad record pointer cannot leave a half-done call.
  detail::validate_verify(p, "kda::host::verify_unfused",
                          params::kConv | params::kWindows | params::kAct | params::kRecurrence |
                              params::kOut | params::kRecords);
  conv_update(p);
  verify_recurrent(p);
}

void verify_fused(const VerifyParams& p) {
  detail::validate_verify(
      p, "kda::host::verify_fused",
      params::kConv | params::kWindows | params::kRecurrence | params::kOut | params::kRecords);
  params::check_fused_shape(p, "kda::host::verify_fused");
  detail::fused_walk(
      p,
      [&](const detail::FusedToken& at, detail::HeadStep<float>& w) {
        detail::token_recurrence(p, w);
        detail::write_out(p, at.r, at.hv, w);
        detail::write_record(p, at.slot, at.row, at.t, at.hv, w);
      },
      nullptr);
}

}  // namespace kda::host
