// demo_inputs.h: the buffers of one layer's activations (mixed_qkv, a, b) and its output, and
// their in-place generation (demo_generate.h): a CUDA kernel on the demo's stream for a CUDA
// run, the same formula on the host (threads, synchronous) for a host run. Both write the
// same bits, so host check runs of a CUDA run see exactly its inputs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/kda_backend.h"
#include "backend/model_config.h"
#include "core/buffer.h"
#include "tools/demo/demo_generate.h"

namespace kda::demo {

/// Which slice of the run an activation set belongs to.
struct ActivationKey {
  uint64_t seed = 1;
  Phase phase = Phase::kVerify;
  const int32_t* round = nullptr;  ///< [1] on the run's device (StagedInts::device_data)
  // Which rows of which requests (ActivationParams, demo_generate.h): batch position n is
  // request request0 + n * request_stride, its rows start at sequence row first_row, and
  // sequence rows below shared_rows are the group leader's (group_size requests per group).
  int32_t request0 = 0, request_stride = 1, first_row = 0;
  int32_t shared_rows = 0, group_size = 1;
};

/// Writes every element of `p` (host memory) now, spreading (tensor, request) blocks over up to
/// hardware_concurrency threads; reads *p.round once. Bitwise equal to fill_activations_cuda.
void fill_activations_host(const ActivationParams& p);

/// Device buffers for one layer's activations of up to `max_rows` rows (packed), plus an
/// output buffer [max_rows, HV, V] bf16.
class LayerActivations {
 public:
  LayerActivations(const ModelConfig& model, const Device& device, int64_t max_rows);

  /// Fills `layer`'s activations of requests 0..B-1 x T tokens into the first B*T rows. CUDA:
  /// enqueues the generator on `stream` (no sync; graph-capturable); host: computes them now. The
  /// caller orders it after the work that still reads these buffers.
  void fill(const ActivationKey& key, int layer, int B, int T, cudaStream_t stream) const;
  /// Views of the first `rows` rows.
  VerifyInputs inputs(int64_t rows) const;
  TensorView out(int64_t rows) const;

 private:
  ActivationParams params(const ActivationKey& key, int layer, int B, int T) const;

  Device device_;
  int64_t D_, AK_, HV_, V_, max_rows_;
  Buffer qkv_, a_, b_, out_;
};

}  // namespace kda::demo
