// demo_model.h: the demo's model: named shape presets and seeded random KDA weights.
//
// The weights are owned here (kda::Buffer on the run's device) and handed to the backend as
// views (LayerWeights); a DemoWeights must outlive every backend call that uses them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/model_config.h"
#include "core/buffer.h"
#include "core/tensor_view.h"

namespace kda::demo {

/// A named model shape.
struct ModelPreset {
  const char* name;
  const char* summary;  ///< one line for --help
  ModelConfig config;
};

/// kimi-linear: 20 KDA layers, H = HV = 32, K = V = 128, standard gate, f32 conv weights, no
/// conv bias. k3-tp8: one TP8 shard of Kimi-K3: H = HV = 12, K = V = 128, safe gate with
/// lower bound -5 (20 layers: the demo's choice, the shard's layer count is not ours to know).
const std::vector<ModelPreset>& model_presets();
/// The preset named `name`, or nullptr.
const ModelPreset* find_preset(const std::string& name);
/// "kimi-linear|k3-tp8".
std::string preset_names();

/// "H=32 HV=32 K=128 V=128, standard gate, f32 conv weights, no conv bias".
std::string describe_shape(const ModelConfig& m);

/// Seeded random weights of every layer (contract §6 scales: conv_w x0.3, conv bias x0.1,
/// A_log x0.5, dt_bias x0.5; unit-variance normal_draw, demo_random.h). Layer l's values depend on
/// (seed, l) only, so a run over fewer layers sees the same first layers.
class DemoWeights {
 public:
  /// Generates on the host and uploads to `device` (synchronous).
  DemoWeights(const ModelConfig& model, const Device& device, uint64_t seed);

  /// Views of layer `layer` (valid while this object lives).
  LayerWeights layer(int layer) const;
  int num_layers() const { return static_cast<int>(layers_.size()); }

 private:
  struct Layer {
    Buffer A_log, dt_bias, conv_weight, conv_bias;
    LayerWeights views;
  };
  std::vector<Layer> layers_;
};

}  // namespace kda::demo
