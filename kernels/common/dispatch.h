// dispatch.h: runtime value -> constexpr, once per entry point (FlashInfer's DISPATCH_* style),
// else a precise error naming the knob, the value and the supported set. Host code of nvcc units.
#pragma once

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/params/kda_params.h"

#define KDA_DISPATCH_K(k, K_, ...)                                          \
  switch (k) {                                                              \
    case 64: {                                                              \
      constexpr int K_ = 64;                                                \
      __VA_ARGS__ break;                                                    \
    }                                                                       \
    case 128: {                                                             \
      constexpr int K_ = 128;                                               \
      __VA_ARGS__ break;                                                    \
    }                                                                       \
    default:                                                                \
      KDA_FAIL("KDA_DISPATCH_K: head_k_dim K={} unsupported (64, 128)", k); \
  }

namespace kda::kernels {

/// Runs f(WeightT{}) for the conv weight type `t` (f32: float, bf16: bf16_t).
template <typename F>
void dispatch_weight(ConvWeightType t, F&& f) {
  switch (t) {
    case ConvWeightType::kF32:
      f(float{});
      return;
    case ConvWeightType::kBF16:
      f(bf16_t{});
      return;
  }
  KDA_FAIL("conv weight type {} unsupported (f32, bf16)", static_cast<int>(t));
}

}  // namespace kda::kernels
