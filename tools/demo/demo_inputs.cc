#include "tools/demo/demo_inputs.h"

#include "core/error.h"
#include "tools/demo/demo_parallel.h"

namespace kda::demo {

void fill_activations_host(const ActivationParams& p) {
  const int32_t round = *p.round;
  // Piece i = (tensor i / B, request i % B); the values do not depend on the split.
  const int64_t pieces = int64_t{kActivationTensors} * p.B;
  const auto fill_piece = [&](int64_t i) {
    const int t = static_cast<int>(i / p.B);
    const int32_t n = static_cast<int32_t>(i % p.B);
    const int64_t count = int64_t{p.T} * p.row_elems[t];
    bf16_t* dst = p.dst[t] + n * count;
    const BlockStreams s = block_streams(p, t, round, n);
    for (int64_t e = 0; e < count; ++e) {
      dst[e] = block_value(t, s, e);
    }
  };
  parallel_for(pieces, fill_piece);
}

LayerActivations::LayerActivations(const ModelConfig& model, const Device& device, int64_t max_rows)
    : device_(device),
      D_(model.qkv_dim()),
      AK_(static_cast<int64_t>(model.HV) * model.K),
      HV_(model.HV),
      V_(model.V),
      max_rows_(max_rows),
      qkv_(device, max_rows * D_ * 2),
      a_(device, max_rows * AK_ * 2),
      b_(device, max_rows * HV_ * 2),
      out_(device, max_rows * HV_ * V_ * 2) {}

ActivationParams LayerActivations::params(const ActivationKey& key, int layer, int B, int T) const {
  KDA_CHECK(B >= 1 && T >= 1 && int64_t{B} * T <= max_rows_,
            "LayerActivations: {} requests x {} tokens for buffers of {} rows", B, T, max_rows_);
  KDA_CHECK(key.round != nullptr, "LayerActivations: no round pointer");
  KDA_CHECK(key.request0 >= 0 && key.request_stride >= 1 && key.first_row >= 0 &&
                key.shared_rows >= 0 && key.group_size >= 1,
            "LayerActivations: request0 {}, request_stride {}, first_row {}, shared_rows {}, "
            "group_size {}",
            key.request0, key.request_stride, key.first_row, key.shared_rows, key.group_size);
  ActivationParams p;
  p.dst[static_cast<int>(ActivationTensor::kMixedQkv)] = static_cast<bf16_t*>(qkv_.data());
  p.dst[static_cast<int>(ActivationTensor::kGateA)] = static_cast<bf16_t*>(a_.data());
  p.dst[static_cast<int>(ActivationTensor::kBetaB)] = static_cast<bf16_t*>(b_.data());
  p.row_elems[static_cast<int>(ActivationTensor::kMixedQkv)] = D_;
  p.row_elems[static_cast<int>(ActivationTensor::kGateA)] = AK_;
  p.row_elems[static_cast<int>(ActivationTensor::kBetaB)] = HV_;
  p.round = key.round;
  p.seed = key.seed;
  p.phase = key.phase;
  p.layer = layer;
  p.B = B;
  p.T = T;
  p.request0 = key.request0;
  p.request_stride = key.request_stride;
  p.first_row = key.first_row;
  p.shared_rows = key.shared_rows;
  p.group_size = key.group_size;
  return p;
}

void LayerActivations::fill(const ActivationKey& key, int layer, int B, int T,
                            cudaStream_t stream) const {
  const ActivationParams p = params(key, layer, B, T);
  if (device_.is_cuda()) {
    fill_activations_cuda(p, stream);
  } else {
    fill_activations_host(p);
  }
}

VerifyInputs LayerActivations::inputs(int64_t rows) const {
  VerifyInputs in;
  in.mixed_qkv = qkv_.view(DType::kBF16, {rows, D_});
  in.a = a_.view(DType::kBF16, {rows, AK_});
  in.b = b_.view(DType::kBF16, {rows, HV_});
  return in;
}

TensorView LayerActivations::out(int64_t rows) const {
  return out_.view(DType::kBF16, {rows, HV_, V_});
}

}  // namespace kda::demo
