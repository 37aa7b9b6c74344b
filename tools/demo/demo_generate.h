// demo_generate.h: the demo's per-layer activations (mixed_qkv, a, b) as a function of
// (seed, tensor, phase, round, layer, request, element), written in place by the host
// (fill_activations_host, demo_inputs.h) or by a CUDA kernel (fill_activations_cuda, body in
// demo_generate.cu). Plain C++ header; both fills call block_value, so they write the
// same bits (demo_random.h says why that holds).
//
// Batch position n holds request m = request0 + n * request_stride and owns rows n*T .. n*T+T-1
// of each packed tensor; row r of that block is row first_row + r of request m's sequence, and
// element e of the sequence is draw e of the stream keyed by (seed, tensor, phase, round, layer,
// m), so a request's values never depend on the batch's size, order or chunking. Shared prompt
// prefixes (--prefix-cache): the sequence rows below shared_rows come from the stream of the
// group's leader (request m - m % group_size), so the requests of a group see the same prefix.
// Scales (contract §6): mixed_qkv x0.5, a x0.5, b x1 (unit-variance draws, rounded to bf16).
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
  int32_t request0 = 0, request_stride = 1;  ///< batch position n is request request0 + n*stride
  int32_t first_row = 0;                     ///< block row 0 is this row of each request's sequence
  int32_t shared_rows = 0;  ///< sequence rows below it: the group leader's stream (0 = none)
  int32_t group_size = 1;   ///< leader of request m: m - m % group_size
};

/// The request at batch position `n` of `p`.
KDA_HD int32_t activation_request(const ActivationParams& p, int32_t n) {
  return p.request0 + n * p.request_stride;
}

/// The stream of tensor `t` of `request` in round `round` of `p`.
KDA_HD uint64_t activation_key(const ActivationParams& p, int t, int32_t round, int32_t request) {
  return stream_key(p.seed, activation_tensor_spec(t).tag, p.phase, round, p.layer, request);
}

/// Where batch position n's block of tensor `t` reads its draws: block element e is draw
/// first + e of key `shared` (e < split: a shared prefix row) or of key `own`.
struct BlockStreams {
  uint64_t own, shared;
  int64_t first, split;
};
KDA_HD BlockStreams block_streams(const ActivationParams& p, int t, int32_t round, int32_t n) {
  const int32_t m = activation_request(p, n);
  BlockStreams s;
  s.own = activation_key(p, t, round, m);
  s.shared = activation_key(p, t, round, m - m % p.group_size);
  s.first = int64_t{p.first_row} * p.row_elems[t];
  const int64_t split = (int64_t{p.shared_rows} - p.first_row) * p.row_elems[t];
  s.split = split > 0 ? split : 0;
  return s;
}

/// Draw `e` of tensor `t`'s stream `key`.
KDA_HD bf16_t activation_value(int t, uint64_t key, int64_t e) {
  return normal_bf16(key, static_cast<uint64_t>(e), activation_tensor_spec(t).scale);
}

/// Element `e` (< T * row_elems[t]) of the block whose streams are `s`.
KDA_HD bf16_t block_value(int t, const BlockStreams& s, int64_t e) {
  return activation_value(t, e < s.split ? s.shared : s.own, s.first + e);
}

/// Writes every element of the three tensors of `p` on the device. Enqueues on `stream`; no
/// sync, no allocation; graph-capturable (reads *p.round when it runs). Throws kda::Error
/// (kInvalidArgument) on a bad shape, kCuda on a launch error.
void fill_activations_cuda(const ActivationParams& p, cudaStream_t stream);

}  // namespace kda::demo
