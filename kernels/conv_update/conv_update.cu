// conv_update.cu: conv_update_kernel, conv_state_roll_kernel and their launchers (grids,
// layouts and ownership: conv_update.cuh). conv_update_kernel never writes conv_state; the
// roll writes only conv_state_out of slots >= 0.
#include "kernels/conv_update/conv_update.cuh"

#include "core/cuda_check.h"
#include "kernels/common/conv.cuh"
#include "kernels/common/launch_pdl.cuh"
#include "kernels/common/launch_utils.h"

namespace kda::kernels {

namespace {

/// The taps of channel pair (ch, ch + 1), when ch < D (else left zero).
template <typename WeightT>
__device__ __forceinline__ void load_pair_taps(const VerifyParams& p, int64_t ch, int64_t D,
                                               ConvTaps& taps0, ConvTaps& taps1) {
  if (ch < D) {
    taps0 = load_conv_taps<WeightT>(p.conv_weight, p.conv_bias, ch);
    taps1 = load_conv_taps<WeightT>(p.conv_weight, p.conv_bias, ch + 1);
  }
}

/// Both conv_update kernels' start: the thread's channel pair (ch, ch + 1) of request
/// blockIdx.y (one thread per pair: bf16x2 loads and stores, D is even) and its taps (layer
/// weights: before the PDL wait), then the request's slot; -1 when the thread has nothing to do
/// (a padding row, or ch >= D).
template <typename WeightT>
__device__ __forceinline__ int begin_conv_pair(const VerifyParams& p, int64_t& ch, ConvTaps& taps0,
                                               ConvTaps& taps1) {
  const int64_t D = qkv_dim(p);
  ch = 2 * (static_cast<int64_t>(blockIdx.x) * kConvThreads + threadIdx.x);
  load_pair_taps<WeightT>(p, ch, D, taps0, taps1);
  pdl_enter();
  const int slot = p.slots[blockIdx.y];
  return slot < 0 || ch >= D ? -1 : slot;
}

/// Three conv window rows of a channel pair at `from` (pitch D), oldest first.
__device__ __forceinline__ void load_pair_window(const bf16_t* from, int64_t D, float2& c0,
                                                 float2& c1, float2& c2) {
  c0 = ld_bf16x2(from);
  c1 = ld_bf16x2(from + D);
  c2 = ld_bf16x2(from + 2 * D);
}

/// One token of a channel pair: conv + SiLU of input x on the window (c0, c1, c2) to `act`, the
/// window slid by x, and the slid window to `win` (three rows of pitch D).
template <typename WeightT>
__device__ __forceinline__ void conv_pair_token(const ConvTaps& taps0, const ConvTaps& taps1,
                                                float2& c0, float2& c1, float2& c2, float2 x,
                                                bf16_t* act, bf16_t* win, int64_t D) {
  const float a0 = conv_acc<WeightT>(taps0, c0.x, c1.x, c2.x, x.x);
  const float a1 = conv_acc<WeightT>(taps1, c0.y, c1.y, c2.y, x.y);
  c0 = c1;
  c1 = c2;
  c2 = x;
  st_bf16x2(act, silu_bf16(a0), silu_bf16(a1));
  st_bf16x2(win, c0.x, c0.y);
  st_bf16x2(win + D, c1.x, c1.y);
  st_bf16x2(win + 2 * D, c2.x, c2.y);
}

/// Tokens whose inputs one thread loads before computing any of them (memory parallelism).
constexpr int kConvChunk = 4;

template <typename WeightT>
__global__ void __launch_bounds__(kConvThreads)
    conv_update_kernel(const __grid_constant__ VerifyParams p) {
  const int64_t D = qkv_dim(p);
  int64_t ch = 0;
  ConvTaps taps0{}, taps1{};
  const int slot = begin_conv_pair<WeightT>(p, ch, taps0, taps1);
  if (slot < 0) {
    return;
  }
  const int n = blockIdx.y;
  const int64_t row = p.rows[n];
  float2 c0, c1, c2;
  load_pair_window(p.conv_state + slot * p.conv_state_slot_stride + ch, D, c0, c1, c2);
  for (int t0 = 0; t0 < p.T; t0 += kConvChunk) {
    const int tc = min(kConvChunk, p.T - t0);
    float2 xs[kConvChunk];
#pragma unroll
    for (int tt = 0; tt < kConvChunk; ++tt) {
      const int64_t r = static_cast<int64_t>(n) * p.T + t0 + tt;
      xs[tt] =
          tt < tc ? ld_bf16x2(p.mixed_qkv + r * p.mixed_qkv_stride + ch) : make_float2(0.0f, 0.0f);
    }
#pragma unroll
    for (int tt = 0; tt < kConvChunk; ++tt) {
      if (tt >= tc) {
        break;
      }
      const int t = t0 + tt;
      const int64_t r = static_cast<int64_t>(n) * p.T + t;
      conv_pair_token<WeightT>(
          taps0, taps1, c0, c1, c2, xs[tt], p.qkv_act + r * D + ch,
          p.conv_window + row * p.conv_window_row_stride + static_cast<int64_t>(t) * 3 * D + ch, D);
    }
  }
}

/// conv_update_kernel for a ragged or tree call (contract §8): request n's T_n tokens from row
/// token_offsets[n]; a tree node's window is its parent's (read back from conv_window, which
/// this thread wrote for the parent: same addresses, program order), slid by its own input.
/// The taps and their order are conv_update_kernel's: a chain gives its bits.
template <typename WeightT>
__global__ void __launch_bounds__(kConvThreads)
    conv_update_shaped_kernel(const __grid_constant__ VerifyParams p) {
  const int64_t D = qkv_dim(p);
  int64_t ch = 0;
  ConvTaps taps0{}, taps1{};
  const int slot = begin_conv_pair<WeightT>(p, ch, taps0, taps1);
  if (slot < 0) {
    return;
  }
  const int n = blockIdx.y;
  const int64_t row0 = p.token_offsets != nullptr ? p.token_offsets[n] : int64_t{n} * p.T;
  const int T = p.token_offsets != nullptr ? p.token_offsets[n + 1] - p.token_offsets[n] : p.T;
  const int32_t* parents = p.parents != nullptr ? p.parents + int64_t{n} * p.T : nullptr;
  const bf16_t* cs = p.conv_state + slot * p.conv_state_slot_stride + ch;
  bf16_t* win = p.conv_window + p.rows[n] * p.conv_window_row_stride + ch;
  float2 c0, c1, c2;
  load_pair_window(cs, D, c0, c1, c2);
  for (int t = 0; t < T; ++t) {
    const int parent = parents != nullptr ? parents[t] : t - 1;
    if (parents != nullptr && parent != t - 1) {
      load_pair_window(parent < 0 ? cs : win + static_cast<int64_t>(parent) * 3 * D, D, c0, c1, c2);
    }
    const int64_t r = row0 + t;
    conv_pair_token<WeightT>(taps0, taps1, c0, c1, c2,
                             ld_bf16x2(p.mixed_qkv + r * p.mixed_qkv_stride + ch),
                             p.qkv_act + r * D + ch, win + static_cast<int64_t>(t) * 3 * D, D);
  }
}

__global__ void __launch_bounds__(kConvThreads)
    conv_state_roll_kernel(const __grid_constant__ ExtendParams e) {
  const ExtendParams& p = e;
  const int64_t D = qkv_dim(p);
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * kConvThreads + threadIdx.x;
  const int n = blockIdx.y;
  pdl_enter();
  const int slot = p.slots[n];
  if (slot < 0 || ch >= D) {
    return;
  }
  const bf16_t* old = p.conv_state + slot * p.conv_state_slot_stride;
  bf16_t* dst = e.conv_state_out + slot * p.conv_state_slot_stride;
  // The prefix-cache track (contract §9): the window after prompt token k, to the track slot.
  const int track_k = e.track_steps != nullptr ? e.track_steps[n] : -1;
  if (track_k >= 0) {
    bf16_t* track = e.conv_state_out + e.track_slots[n] * p.conv_state_slot_stride;
#pragma unroll
    for (int j = 0; j < 3; ++j) {
      const int tau = track_k - 2 + j;
      track[j * D + ch] =
          tau >= 0 ? p.mixed_qkv[(static_cast<int64_t>(n) * p.T + tau) * p.mixed_qkv_stride + ch]
                   : old[(3 + tau) * D + ch];
    }
  }
  bf16_t next[3];
#pragma unroll
  for (int j = 0; j < 3; ++j) {
    const int tau = p.T - 3 + j;  // token index of window entry j (negative: old history)
    next[j] = tau >= 0
                  ? p.mixed_qkv[(static_cast<int64_t>(n) * p.T + tau) * p.mixed_qkv_stride + ch]
                  : old[(3 + tau) * D + ch];
  }
#pragma unroll
  for (int j = 0; j < 3; ++j) {
    dst[j * D + ch] = next[j];
  }
}

/// Grid (ceil(threads / kConvThreads), B) for `threads` threads per request.
template <typename Kernel, typename Args>
void launch_per_request(Kernel kernel, const Args& args, int64_t threads, int B,
                        cudaStream_t stream, bool pdl) {
  launch_pdl(kernel,
             dim3(static_cast<unsigned>(ceil_div(threads, kConvThreads)), static_cast<unsigned>(B)),
             dim3(kConvThreads), 0, stream, pdl, args);
}

}  // namespace

template <typename WeightT>
void launch_conv_update(const VerifyParams& p, cudaStream_t stream, bool pdl) {
  if (p.token_offsets != nullptr || p.parents != nullptr) {
    launch_per_request(conv_update_shaped_kernel<WeightT>, p, qkv_dim(p) / 2, p.B, stream, pdl);
    return;
  }
  launch_per_request(conv_update_kernel<WeightT>, p, qkv_dim(p) / 2, p.B, stream, pdl);  // pairs
}
template void launch_conv_update<float>(const VerifyParams&, cudaStream_t, bool);
template void launch_conv_update<bf16_t>(const VerifyParams&, cudaStream_t, bool);

void launch_conv_state_roll(const ExtendParams& p, cudaStream_t stream, bool pdl) {
  launch_per_request(conv_state_roll_kernel, p, qkv_dim(p), p.B, stream, pdl);
}

}  // namespace kda::kernels
