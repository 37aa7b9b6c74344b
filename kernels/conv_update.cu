#include "kernels/conv_update.cuh"

#include "core/cuda_check.h"
#include "kernels/conv.cuh"
#include "kernels/launch_utils.h"

namespace kda::kernels {

namespace {

template <typename WeightT>
__global__ void __launch_bounds__(kConvThreads)
    conv_update_kernel(const __grid_constant__ VerifyParams p) {
  const int64_t D = qkv_dim(p);
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * kConvThreads + threadIdx.x;
  const int n = blockIdx.y;
  pdl_wait();
  pdl_launch_dependents();
  const int slot = p.slots[n];
  if (slot < 0 || ch >= D) {
    return;
  }
  const int64_t row = p.rows[n];
  const bf16_t* cs = p.conv_state + slot * p.conv_state_slot_stride;
  float c0 = ld_bf16(cs + ch);
  float c1 = ld_bf16(cs + D + ch);
  float c2 = ld_bf16(cs + 2 * D + ch);
  const ConvTaps taps = load_conv_taps<WeightT>(p.conv_weight, p.conv_bias, ch);
  for (int t = 0; t < p.T; ++t) {
    const int64_t r = static_cast<int64_t>(n) * p.T + t;
    const float x = ld_bf16(p.qkv + r * p.qkv_stride + ch);
    const float acc = conv_acc<WeightT>(taps, c0, c1, c2, x);
    c0 = c1;
    c1 = c2;
    c2 = x;
    p.qkv_act[r * D + ch] = to_bf16(silu_bf16(acc));
    bf16_t* w =
        p.conv_window + row * p.conv_window_row_stride + static_cast<int64_t>(t) * 3 * D + ch;
    w[0] = to_bf16(c0);
    w[D] = to_bf16(c1);
    w[2 * D] = to_bf16(c2);
  }
}

__global__ void __launch_bounds__(kConvThreads)
    conv_state_roll_kernel(const __grid_constant__ ExtendParams e) {
  const VerifyParams& p = e.v;
  const int64_t D = qkv_dim(p);
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * kConvThreads + threadIdx.x;
  const int n = blockIdx.y;
  pdl_wait();
  pdl_launch_dependents();
  const int slot = p.slots[n];
  if (slot < 0 || ch >= D) {
    return;
  }
  const bf16_t* old = p.conv_state + slot * p.conv_state_slot_stride;
  bf16_t* dst = e.conv_state_out + slot * p.conv_state_slot_stride;
  bf16_t next[3];
#pragma unroll
  for (int j = 0; j < 3; ++j) {
    const int tau = p.T - 3 + j;  // token index of window entry j (negative: old history)
    next[j] = tau >= 0 ? p.qkv[(static_cast<int64_t>(n) * p.T + tau) * p.qkv_stride + ch]
                       : old[(3 + tau) * D + ch];
  }
#pragma unroll
  for (int j = 0; j < 3; ++j) {
    dst[j * D + ch] = next[j];
  }
}

template <typename Kernel, typename Args>
void launch_per_channel(Kernel kernel, const Args& args, int64_t D, int B, cudaStream_t stream) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(ceil_div(D, kConvThreads)), static_cast<unsigned>(B));
  cfg.blockDim = dim3(kConvThreads);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = pdl_enabled() ? 1 : 0;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  KDA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args));
}

}  // namespace

template <typename WeightT>
void launch_conv_update(const VerifyParams& p, cudaStream_t stream) {
  launch_per_channel(conv_update_kernel<WeightT>, p, qkv_dim(p), p.B, stream);
}
template void launch_conv_update<float>(const VerifyParams&, cudaStream_t);
template void launch_conv_update<bf16_t>(const VerifyParams&, cudaStream_t);

void launch_conv_state_roll(const ExtendParams& p, cudaStream_t stream) {
  launch_per_channel(conv_state_roll_kernel, p, qkv_dim(p.v), p.v.B, stream);
}

}  // namespace kda::kernels
