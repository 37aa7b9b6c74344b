// model_config.h: what the backend needs to know about the model's KDA layers, and the
// per-layer weight views the engine hands over.
#pragma once

#include <cstdint>

#include "core/tensor_view.h"
#include "kernels/params/kda_params.h"

namespace kda {

/// The KDA layers' shape (letters as in docs/contract.md §2). A plain value.
struct ModelConfig {
  int num_layers = 0;  ///< KDA layers driven by this backend (>= 1)
  int H = 0;           ///< q/k heads
  int HV = 0;          ///< v heads; HV % H == 0
  int K = 0;           ///< head_k_dim = head_q_dim: 64 or 128
  int V = 0;           ///< head_v_dim
  GateKind gate = GateKind::kStandard;
  float lower_bound = 0.0f;  ///< safe gate only: finite and < 0 (Kimi-K3: -5)
  ConvWeightType conv_weight_type = ConvWeightType::kF32;  ///< Kimi-Linear: f32
  bool has_conv_bias = false;

  /// D = 2*H*K + HV*V.
  int64_t qkv_dim() const { return 2 * static_cast<int64_t>(H) * K + static_cast<int64_t>(HV) * V; }
  /// Throws kda::Error(kInvalidArgument) naming the field, its value and the rule.
  void validate() const;
};

/// One layer's weights as views; the caller owns the memory and keeps it alive (and
/// unchanged, unless it means to change the weights) for as long as the backend may run
/// that layer, including replays of captured CUDA graphs.
struct LayerWeights {
  TensorView A_log;        ///< [HV] f32
  TensorView dt_bias;      ///< [HV*K] f32
  TensorView conv_weight;  ///< [D, W=4] packed; f32 or bf16 per ModelConfig::conv_weight_type
  TensorView conv_bias;    ///< [D] same dtype as conv_weight; undefined iff !has_conv_bias
};

/// Checks `w` against `model` on `device` (dtype, shape, packing, device, element alignment);
/// throws kda::Error(kInvalidArgument) naming the tensor.
void validate_layer_weights(const LayerWeights& w, const ModelConfig& model, const Device& device);

}  // namespace kda
