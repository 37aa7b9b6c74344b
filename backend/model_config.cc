#include "backend/model_config.h"

#include <cmath>

#include "core/error.h"

namespace kda {

namespace {

void expect_positive(int value, const char* field) {
  KDA_CHECK(value >= 1, "ModelConfig.{}: expected >= 1, got {}", field, value);
}

// A packed view of `dtype` on `device` with exactly `shape`, aligned to its element size.
void expect_packed(const TensorView& t, const char* name, DType dtype, const Device& device,
                   std::initializer_list<int64_t> shape) {
  expect_tensor(t, name, dtype, device, shape);
  expect_contiguous(t, name);
  expect_aligned(t, name, dtype_size(dtype));
}

}  // namespace

void ModelConfig::validate() const {
  expect_positive(num_layers, "num_layers");
  expect_positive(H, "H");
  expect_positive(HV, "HV");
  expect_positive(V, "V");
  KDA_CHECK(K == 64 || K == 128, "ModelConfig.K: expected 64 or 128, got {}", K);
  KDA_CHECK(HV % H == 0, "ModelConfig.HV: expected a multiple of H = {}, got {}", H, HV);
  KDA_CHECK(gate == GateKind::kStandard || gate == GateKind::kSafe,
            "ModelConfig.gate: unknown value {}", static_cast<int>(gate));
  KDA_CHECK(gate != GateKind::kSafe || (std::isfinite(lower_bound) && lower_bound < 0.0f),
            "ModelConfig.lower_bound: the safe gate needs a finite value < 0, got {}", lower_bound);
  KDA_CHECK(conv_weight_type == ConvWeightType::kF32 || conv_weight_type == ConvWeightType::kBF16,
            "ModelConfig.conv_weight_type: unknown value {}", static_cast<int>(conv_weight_type));
}

void validate_layer_weights(const LayerWeights& w, const ModelConfig& m, const Device& device) {
  const int64_t D = m.qkv_dim();
  const DType wt = m.conv_weight_type == ConvWeightType::kF32 ? DType::kF32 : DType::kBF16;
  expect_packed(w.A_log, "A_log", DType::kF32, device, {m.HV});
  expect_packed(w.dt_bias, "dt_bias", DType::kF32, device, {static_cast<int64_t>(m.HV) * m.K});
  expect_packed(w.conv_weight, "conv_weight", wt, device, {D, kConvWidth});
  if (m.has_conv_bias) {
    expect_packed(w.conv_bias, "conv_bias", wt, device, {D});
  } else {
    KDA_CHECK(!w.conv_bias.defined(),
              "conv_bias: the model has no conv bias (ModelConfig.has_conv_bias = false), got {}",
              w.conv_bias.describe());
  }
}

}  // namespace kda
