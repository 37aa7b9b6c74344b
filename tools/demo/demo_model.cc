#include "tools/demo/demo_model.h"

#include <fmt/format.h>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/params/kda_params.h"
#include "tools/demo/demo_random.h"

namespace kda::demo {

namespace {

ModelConfig kda_shape(int layers, int heads, GateKind gate, float lower_bound) {
  ModelConfig m;
  m.num_layers = layers;
  m.H = heads;
  m.HV = heads;
  m.K = 128;
  m.V = 128;
  m.gate = gate;
  m.lower_bound = lower_bound;
  m.conv_weight_type = ConvWeightType::kF32;
  m.has_conv_bias = false;
  return m;
}

constexpr float kConvWeightScale = 0.3f;  // contract §6
constexpr float kConvBiasScale = 0.1f;
constexpr float kALogScale = 0.5f;
constexpr float kDtBiasScale = 0.5f;

// One f32 vector of `n` normal draws, uploaded into a fresh buffer on `device`.
Buffer f32_buffer(const Device& device, int64_t n, uint64_t key, float scale) {
  std::vector<float> host(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    host[static_cast<size_t>(i)] = normal_draw(key, static_cast<uint64_t>(i), scale);
  }
  Buffer b(device, n * static_cast<int64_t>(sizeof(float)));
  b.upload(host.data(), b.bytes());
  return b;
}

// Conv weight or bias in the model's weight dtype.
Buffer conv_buffer(const Device& device, ConvWeightType type, int64_t n, uint64_t key,
                   float scale) {
  if (type == ConvWeightType::kF32) {
    return f32_buffer(device, n, key, scale);
  }
  std::vector<bf16_t> host(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    host[static_cast<size_t>(i)] = normal_bf16(key, static_cast<uint64_t>(i), scale);
  }
  Buffer b(device, n * static_cast<int64_t>(sizeof(bf16_t)));
  b.upload(host.data(), b.bytes());
  return b;
}

}  // namespace

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = {
      {"kimi-linear",
       "Kimi-Linear: 20 KDA layers, H = HV = 32, K = V = 128, standard gate, f32 conv "
       "weights, no conv bias",
       kda_shape(20, 32, GateKind::kStandard, 0.0f)},
      {"k3-tp8",
       "Kimi-K3, one TP8 shard: H = HV = 12, K = V = 128, safe gate (lower bound -5), f32 conv "
       "weights, no conv bias; 20 layers",
       kda_shape(20, 12, GateKind::kSafe, -5.0f)},
  };
  return presets;
}

const ModelPreset* find_preset(const std::string& name) {
  for (const ModelPreset& p : model_presets()) {
    if (name == p.name) {
      return &p;
    }
  }
  return nullptr;
}

std::string preset_names() {
  std::string s;
  for (const ModelPreset& p : model_presets()) {
    s += s.empty() ? p.name : fmt::format("|{}", p.name);
  }
  return s;
}

std::string describe_shape(const ModelConfig& m) {
  const std::string gate = m.gate == GateKind::kStandard
                               ? std::string("standard gate")
                               : fmt::format("safe gate (lower bound {:g})", m.lower_bound);
  return fmt::format("H={} HV={} K={} V={}, {}, {} conv weights, {}", m.H, m.HV, m.K, m.V, gate,
                     m.conv_weight_type == ConvWeightType::kF32 ? "f32" : "bf16",
                     m.has_conv_bias ? "conv bias" : "no conv bias");
}

DemoWeights::DemoWeights(const ModelConfig& model, const Device& device, uint64_t seed) {
  const int64_t D = model.qkv_dim();
  const int64_t HV = model.HV;
  const DType wdtype = model.conv_weight_type == ConvWeightType::kF32 ? DType::kF32 : DType::kBF16;
  layers_.resize(static_cast<size_t>(model.num_layers));
  for (int l = 0; l < model.num_layers; ++l) {
    const auto key = [&](StreamTag tag) { return stream_key(seed, tag, Phase::kWeights, 0, l, 0); };
    Layer& w = layers_[static_cast<size_t>(l)];
    w.A_log = f32_buffer(device, HV, key(StreamTag::kALog), kALogScale);
    w.dt_bias = f32_buffer(device, HV * model.K, key(StreamTag::kDtBias), kDtBiasScale);
    w.conv_weight = conv_buffer(device, model.conv_weight_type, D * kConvWidth,
                                key(StreamTag::kConvWeight), kConvWeightScale);
    w.views.A_log = w.A_log.view(DType::kF32, {HV});
    w.views.dt_bias = w.dt_bias.view(DType::kF32, {HV * model.K});
    w.views.conv_weight = w.conv_weight.view(wdtype, {D, kConvWidth});
    if (model.has_conv_bias) {
      w.conv_bias =
          conv_buffer(device, model.conv_weight_type, D, key(StreamTag::kConvBias), kConvBiasScale);
      w.views.conv_bias = w.conv_bias.view(wdtype, {D});
    }
  }
}

LayerWeights DemoWeights::layer(int layer) const {
  KDA_CHECK(layer >= 0 && layer < num_layers(), "DemoWeights::layer: {} out of range [0, {})",
            layer, num_layers());
  return layers_[static_cast<size_t>(layer)].views;
}

}  // namespace kda::demo
