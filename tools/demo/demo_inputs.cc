#include "tools/demo/demo_inputs.h"

#include <algorithm>
#include <thread>

#include "core/error.h"

namespace kda::demo {

namespace {

constexpr float kMixedQkvScale = 0.5f;  // contract §6
constexpr float kGateAScale = 0.5f;
constexpr float kBetaBScale = 1.0f;

bf16_t as_bf16(float x) { return float_to_bf16(x); }

// Which tensor of a layer's activations.
struct TensorSpec {
  std::vector<bf16_t> HostActivations::*field;
  StreamTag tag;
  float scale;
};
constexpr TensorSpec kTensors[] = {
    {&HostActivations::qkv, StreamTag::kMixedQkv, kMixedQkvScale},
    {&HostActivations::a, StreamTag::kGateA, kGateAScale},
    {&HostActivations::b, StreamTag::kBetaB, kBetaBScale},
};

}  // namespace

void generate_activations(const ModelConfig& model, const ActivationKey& key, int first_layer,
                          int num_layers, int requests, int T, std::vector<HostActivations>& out) {
  const int64_t per_row[] = {model.qkv_dim(), static_cast<int64_t>(model.HV) * model.K,
                             static_cast<int64_t>(model.HV)};
  out.resize(static_cast<size_t>(num_layers));
  for (HostActivations& h : out) {
    for (size_t t = 0; t < 3; ++t) {
      (h.*kTensors[t].field).resize(static_cast<size_t>(int64_t{requests} * T * per_row[t]));
    }
  }
  // Piece i = (layer i / requests, request i % requests); request n owns rows n*T .. n*T+T-1.
  const int64_t pieces = int64_t{num_layers} * requests;
  const auto fill_piece = [&](int64_t i) {
    const int l = static_cast<int>(i / requests), n = static_cast<int>(i % requests);
    HostActivations& h = out[static_cast<size_t>(l)];
    for (size_t t = 0; t < 3; ++t) {
      const int64_t count = int64_t{T} * per_row[t];
      const uint64_t k =
          stream_key(key.seed, kTensors[t].tag, key.phase, key.round, first_layer + l, n);
      fill_normal((h.*kTensors[t].field).data() + n * count, count, k, kTensors[t].scale, as_bf16);
    }
  };
  const int threads = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(pieces, std::thread::hardware_concurrency())));
  if (threads == 1) {
    for (int64_t i = 0; i < pieces; ++i) {
      fill_piece(i);
    }
    return;
  }
  // The values do not depend on the split: every piece has its own streams.
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int64_t i = t; i < pieces; i += threads) {
        fill_piece(i);
      }
    });
  }
  for (std::thread& th : pool) {
    th.join();
  }
}

LayerActivations::LayerActivations(const ModelConfig& model, const Device& device, int64_t max_rows)
    : D_(model.qkv_dim()),
      AK_(static_cast<int64_t>(model.HV) * model.K),
      HV_(model.HV),
      V_(model.V),
      max_rows_(max_rows),
      qkv_(device, max_rows * D_ * 2),
      a_(device, max_rows * AK_ * 2),
      b_(device, max_rows * HV_ * 2),
      out_(device, max_rows * HV_ * V_ * 2) {}

void LayerActivations::upload(const HostActivations& host) {
  const int64_t rows = static_cast<int64_t>(host.b.size()) / HV_;
  KDA_CHECK(rows <= max_rows_ && static_cast<int64_t>(host.qkv.size()) == rows * D_ &&
                static_cast<int64_t>(host.a.size()) == rows * AK_,
            "LayerActivations::upload: {} rows (qkv {}, a {} values) for buffers of {} rows", rows,
            host.qkv.size(), host.a.size(), max_rows_);
  qkv_.upload(host.qkv.data(), rows * D_ * 2);
  a_.upload(host.a.data(), rows * AK_ * 2);
  b_.upload(host.b.data(), rows * HV_ * 2);
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
