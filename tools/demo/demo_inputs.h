// demo_inputs.h: the demo's per-layer activations (mixed_qkv, a, b), generated on the host
// from seeded counter-based streams and uploaded into buffers the demo owns.
//
// Request n's rows (n*T .. n*T+T-1) of a (phase, round, layer) come from a stream keyed by
// (seed, tensor, phase, round, layer, n) only, so a check run over fewer requests or layers
// sees exactly the same values for the requests and layers it covers. Scales (contract §6):
// mixed_qkv x0.5, a x0.5, b x1 (standard normal draws, rounded to bf16).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/kda_backend.h"
#include "backend/model_config.h"
#include "core/buffer.h"
#include "core/dtype.h"
#include "tools/demo/demo_random.h"

namespace kda::demo {

/// One layer's activations on the host, packed: [N, D], [N, HV*K], [N, HV] bf16.
struct HostActivations {
  std::vector<bf16_t> qkv, a, b;
};

/// Which slice of the run an activation set belongs to.
struct ActivationKey {
  uint64_t seed = 1;
  Phase phase = Phase::kVerify;
  int round = 0;
};

/// Fills `out[i]` for layers first_layer + i, i < num_layers, with the activations of
/// `requests` requests x T tokens (N = requests*T rows), spreading (layer, request) pieces over
/// up to hardware_concurrency threads.
void generate_activations(const ModelConfig& model, const ActivationKey& key, int first_layer,
                          int num_layers, int requests, int T, std::vector<HostActivations>& out);

/// Device buffers for one layer's activations of up to `max_rows` rows (packed), plus an
/// output buffer [max_rows, HV, V] bf16.
class LayerActivations {
 public:
  LayerActivations(const ModelConfig& model, const Device& device, int64_t max_rows);

  /// Synchronous upload of `host` (rows = host.b.size() / HV). The caller makes sure no
  /// enqueued work still reads these buffers.
  void upload(const HostActivations& host);
  /// Views of the first `rows` rows.
  VerifyInputs inputs(int64_t rows) const;
  TensorView out(int64_t rows) const;

 private:
  int64_t D_, AK_, HV_, V_, max_rows_;
  Buffer qkv_, a_, b_, out_;
};

}  // namespace kda::demo
