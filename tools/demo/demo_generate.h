// demo_generate.h: the demo's per-layer activations (mixed_qkv, a, b) as a function of
// (seed, tensor, phase, round, layer, request, element), written in place by the host
// (fill_activations_host, demo_inputs.h) or by a CUDA kernel (fill_activations_cuda, body in
// demo_generate.cu). Plain C++ header; both fills call activation_value, so they write the
// same bits (demo_random.h says why that holds).
//
// Request n owns rows n*T .. n*T+T-1 of each packed tensor; element e of that block is draw e
// of the stream keyed by (seed, tensor, phase, round, layer, n), so a request's values never
// depend on the batch's size or order. Scales (contract §6): mixed_qkv x0.5, a x0.5, b x1
// (unit-variance draws, rounded to bf16).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"
#include "core/platform_macros.h"
#include "tools/demo/demo_random.h"

namespace kda::demo {

/// The activation tensors of a layer, in ActivationParams order.
enum class ActivationTensor : int32_t { kMixedQkv = 0, kGateA = 1, kBetaB = 2 };
constexpr int kActivationTensors = 3;

/// The stream tag and scale of tensor `t` (0 .. kActivationTensors-1).
struct ActivationTensorSpec {
  StreamTag tag;
  float scale;
};
KDA_HD ActivationTensorSpec activation_tensor_spec(int t) {
  switch (static_cast<ActivationTensor>(t)) {
    case ActivationTensor::kMixedQkv:
      return {StreamTag::kMixedQkv, 0.5f};
    case ActivationTensor::kGateA:
      return {StreamTag::kGateA, 0.5f};
    case ActivationTensor::kBetaB:
      return {StreamTag::kBetaB, 1.0f};
  }
  return {StreamTag::kMixedQkv, 0.0f};  // unreachable: t is a tensor index
}

/// One layer's activations for requests 0..B-1, T rows each. Pointers on one device (CUDA
/// memory for fill_activations_cuda, host memory for fill_activations_host).
struct ActivationParams {
  bf16_t* dst[kActivationTensors];        ///< [B*T, D], [B*T, HV*K], [B*T, HV]; packed
  int64_t row_elems[kActivationTensors];  ///< D, HV*K, HV
  const int32_t* round;  ///< [1]: the round, read when the fill runs (a graph replay reads the
                         ///< value uploaded before it)
  uint64_t seed = 1;
  Phase phase = Phase::kVerify;
  int32_t layer = 0;
  int32_t B = 0, T = 0;
};

/// The stream of tensor `t` of `request` in round `round` of `p`.
KDA_HD uint64_t activation_key(const ActivationParams& p, int t, int32_t round, int32_t request) {
  return stream_key(p.seed, activation_tensor_spec(t).tag, p.phase, round, p.layer, request);
}

/// Element `e` (< T * row_elems[t]) of the block of tensor `t` whose stream is `key`.
KDA_HD bf16_t activation_value(int t, uint64_t key, int64_t e) {
  return normal_bf16(key, static_cast<uint64_t>(e), activation_tensor_spec(t).scale);
}

/// Writes every element of the three tensors of `p` on the device. Enqueues on `stream`; no
/// sync, no allocation; graph-capturable (reads *p.round when it runs). Throws kda::Error
/// (kInvalidArgument) on a bad shape, kCuda on a launch error.
void fill_activations_cuda(const ActivationParams& p, cudaStream_t stream);

}  // namespace kda::demo
