// conv.cuh: the causal depthwise conv (W = 4 taps) + SiLU of one channel, shared by the
// unfused conv-update kernel and the fused verify tile (contract §3 step 1).
//
// Layouts: conv_weight [D, 4] packed (tap 0 oldest ... tap 3 current token), conv_bias [D],
// both f32 (fma chain) or bf16 (bf16-rounded products, f32 adds).
#pragma once

#include "kernels/common/device_math.cuh"

namespace kda::kernels {

/// A channel's four taps and bias, held in registers across tokens.
struct ConvTaps {
  float w[4];
  float bias;
};

template <typename WeightT>
__device__ __forceinline__ ConvTaps load_conv_taps(const void* weight, const void* bias,
                                                   int64_t ch) {
  ConvTaps taps;
  if constexpr (std::is_same_v<WeightT, float>) {
    const float4 w = *(reinterpret_cast<const float4*>(weight) + ch);
    taps.w[0] = w.x;
    taps.w[1] = w.y;
    taps.w[2] = w.z;
    taps.w[3] = w.w;
    taps.bias = bias != nullptr ? static_cast<const float*>(bias)[ch] : 0.0f;
  } else {
    const bf16_t* w = static_cast<const bf16_t*>(weight) + ch * 4;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      taps.w[i] = ld_bf16(w + i);
    }
    taps.bias = bias != nullptr ? ld_bf16(static_cast<const bf16_t*>(bias) + ch) : 0.0f;
  }
  return taps;
}

/// acc = bias; four taps oldest -> current. f32 weights: an fma chain (one rounding per
/// tap). bf16 weights: the product is rounded to bf16 first, then added in f32.
template <typename WeightT>
__device__ __forceinline__ float conv_acc(const ConvTaps& taps, float c0, float c1, float c2,
                                          float x) {
  const float tap[4] = {c0, c1, c2, x};
  float acc = taps.bias;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (std::is_same_v<WeightT, float>) {
      acc = fmaf(tap[i], taps.w[i], acc);
    } else {
      const float prod = __bfloat162float(__float2bfloat16_rn(__fmul_rn(tap[i], taps.w[i])));
      acc = __fadd_rn(acc, prod);
    }
  }
  return acc;
}

}  // namespace kda::kernels
