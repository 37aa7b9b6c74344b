// backend_fixture.cc: the Harness, its counting kernel set, seeded weights / activations and
// the bitwise and error helpers of backend_fixture.h.
#include "tests/backend_fixture.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>
#include <random>

#include "backend/kernel_set_factory.h"
#include "kernels/kernel_set.h"

namespace kda::testing {

#ifdef KDA_BACKEND_TEST_CUDA
const Device kTestDevice = Device::cuda(0);
#else
const Device kTestDevice = Device::host();
#endif

const ModelCase kGqaCase{"GQA HV=2H, standard gate, f32 conv + bias",
                         2,
                         4,
                         GateKind::kStandard,
                         ConvWeightType::kF32,
                         true};

namespace {

const bf16_t kBf16NaN{0x7fc0};

// ---- counting kernel set (wraps the test device's kernels; the backend owns it) ----

class CountingKernelSet final : public KernelSet {
 public:
  CountingKernelSet(std::shared_ptr<KernelCounts> counts,
                    std::shared_ptr<kernels::LaunchOverrides> launch)
      : inner_(make_kernel_set(kTestDevice, *launch)),
        counts_(std::move(counts)),
        launch_(std::move(launch)),
        made_with_(*launch_) {}
  const char* name() const override { return "counting host"; }
  Device device() const override { return inner_->device(); }
  kernels::VerifyPlan plan_verify(const VerifyParams& p, VerifyPath path, int block_v) override {
    return inner().plan_verify(p, path, block_v);
  }
  void verify(const VerifyParams& p, const kernels::VerifyPlan& plan, cudaStream_t s) override {
    inner().verify(p, plan, s);
    ++(plan.path == VerifyPath::kFused ? counts_->fused : counts_->unfused);
    counts_->fold_before_wait.push_back(p.fold_before_wait);
    counts_->verify_numerics.push_back(p.numerics);
    if (plan.path == VerifyPath::kFused) {
      counts_->last_block_v = plan.block_v;
    }
  }
  bool runs_lazy_write_back() const override { return inner_->runs_lazy_write_back(); }
  void extend(const ExtendParams& p, cudaStream_t s) override {
    inner().extend(p, s);
    ++counts_->extend;
    counts_->extend_numerics.push_back(p.numerics);
  }
  void commit(const CommitParams& p, cudaStream_t s) override {
    inner().commit(p, s);
    ++counts_->commit;
  }

 private:
  /// The wrapped kernel set, made anew when the harness's launch overrides changed.
  KernelSet& inner() {
    if (*launch_ != made_with_) {
      made_with_ = *launch_;
      inner_ = make_kernel_set(kTestDevice, made_with_);
    }
    return *inner_;
  }
  std::unique_ptr<KernelSet> inner_;
  std::shared_ptr<KernelCounts> counts_;
  std::shared_ptr<kernels::LaunchOverrides> launch_;
  kernels::LaunchOverrides made_with_;
};

// ---- seeded random data ----

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  float normal(float scale) { return scale * dist_(engine_); }
  std::vector<float> floats(int64_t n, float scale) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) {
      x = normal(scale);
    }
    return v;
  }
  std::vector<bf16_t> bf16s(int64_t n, float scale) {
    std::vector<bf16_t> v(static_cast<size_t>(n));
    for (bf16_t& x : v) {
      x = float_to_bf16(normal(scale));
    }
    return v;
  }

 private:
  std::mt19937_64 engine_;
  std::normal_distribution<float> dist_{0.0f, 1.0f};
};

}  // namespace

ModelConfig model_for(const ModelCase& c) {
  ModelConfig m;
  m.num_layers = kLayers;
  m.H = c.H;
  m.HV = c.HV;
  m.K = 64;
  m.V = 64;
  m.gate = c.gate;
  m.lower_bound = c.gate == GateKind::kSafe ? -5.0f : 0.0f;
  m.conv_weight_type = c.wtype;
  m.has_conv_bias = c.bias;
  return m;
}

EngineFlags flags_for(bool ring, bool deferred) {
  EngineFlags f;
  f.num_draft_tokens = kT;
  f.replayssm_spec = ring;
  f.deferred_commit = static_cast<int>(deferred ? DeferredCommit::kOn : DeferredCommit::kOff);
  f.replayssm_cache_len = 8;
  f.max_running_requests = kMaxRunning;
  return f;
}

OwnedWeights make_weights(const ModelConfig& m, uint64_t seed) {
  Rng rng(seed);
  const int64_t D = m.qkv_dim(), HVK = static_cast<int64_t>(m.HV) * m.K;
  const bool f32 = m.conv_weight_type == ConvWeightType::kF32;
  const DType wt = f32 ? DType::kF32 : DType::kBF16;
  OwnedWeights w{Buffer(kTestDevice, m.HV * 4), Buffer(kTestDevice, HVK * 4),
                 Buffer(kTestDevice, D * 4 * dtype_size(wt)),
                 Buffer(kTestDevice, D * dtype_size(wt)), LayerWeights{}};
  w.views.A_log = w.A_log.view(DType::kF32, {m.HV});
  w.views.dt_bias = w.dt_bias.view(DType::kF32, {HVK});
  w.views.conv_weight = w.conv_weight.view(wt, {D, 4});
  from_host_vector(rng.floats(m.HV, 0.5f), w.views.A_log);
  from_host_vector(rng.floats(HVK, 0.5f), w.views.dt_bias);
  if (f32) {
    from_host_vector(rng.floats(D * 4, 0.3f), w.views.conv_weight);
  } else {
    from_host_vector(rng.bf16s(D * 4, 0.3f), w.views.conv_weight);
  }
  if (m.has_conv_bias) {
    w.views.conv_bias = w.conv_bias.view(wt, {D});
    if (f32) {
      from_host_vector(rng.floats(D, 0.1f), w.views.conv_bias);
    } else {
      from_host_vector(rng.bf16s(D, 0.1f), w.views.conv_bias);
    }
  }
  return w;
}

Activations make_activations(const ModelConfig& m, const std::vector<int32_t>& slots, int T,
                             uint64_t seed) {
  Rng rng(seed);
  const int64_t N = static_cast<int64_t>(slots.size()) * T, D = m.qkv_dim();
  const int64_t HVK = static_cast<int64_t>(m.HV) * m.K, pitch = D + kQkvPad;
  Activations x{Buffer(kTestDevice, N * pitch * 2),
                Buffer(kTestDevice, N * HVK * 2),
                Buffer(kTestDevice, N * m.HV * 2),
                Buffer(kTestDevice, N * m.HV * m.V * 2),
                VerifyInputs{},
                TensorView{},
                D};
  std::vector<bf16_t> qkv = rng.bf16s(N * pitch, 0.5f), a = rng.bf16s(N * HVK, 0.5f);
  std::vector<bf16_t> b = rng.bf16s(N * m.HV, 1.0f);
  for (int64_t row = 0; row < N; ++row) {
    const bool padding = slots[static_cast<size_t>(row / T)] < 0;
    for (int64_t c = 0; c < pitch; ++c) {
      if (padding || c >= D) {
        qkv[static_cast<size_t>(row * pitch + c)] = kBf16NaN;
      }
    }
    for (int64_t c = 0; padding && c < HVK; ++c) {
      a[static_cast<size_t>(row * HVK + c)] = kBf16NaN;
    }
    for (int64_t c = 0; padding && c < m.HV; ++c) {
      b[static_cast<size_t>(row * m.HV + c)] = kBf16NaN;
    }
  }
  x.qkv.upload(qkv.data(), x.qkv.bytes());
  x.a.upload(a.data(), x.a.bytes());
  x.b.upload(b.data(), x.b.bytes());
  const std::vector<bf16_t> garbage = rng.bf16s(N * m.HV * m.V, 3.0f);  // never zeros
  x.out.upload(garbage.data(), x.out.bytes());
  x.in.mixed_qkv = TensorView(x.qkv.data(), DType::kBF16, kTestDevice, {N, D}, {pitch, 1});
  x.in.a = x.a.view(DType::kBF16, {N, HVK});
  x.in.b = x.b.view(DType::kBF16, {N, m.HV});
  x.out_view = x.out.view(DType::kBF16, {N, m.HV, m.V});
  return x;
}

std::vector<uint8_t> bytes_of(const TensorView& v) {
  std::vector<uint8_t> out(static_cast<size_t>(v.span_bytes()));
  copy_bytes(out.data(), Device::host(), v.data(), v.device(), v.span_bytes());
  return out;
}

bool same_bits(const TensorView& x, const TensorView& y) { return bytes_of(x) == bytes_of(y); }
bool same_bits(const TensorView& x, const std::vector<uint8_t>& y) { return bytes_of(x) == y; }

std::vector<int32_t> allocated_slots(const Harness& h) {
  std::vector<int32_t> s;
  for (int i = 0; i < h.pool().num_slots(); ++i) {
    if (h.pool().is_slot_allocated(i)) {
      s.push_back(i);
    }
  }
  return s;
}

void abort_after_layers(Harness& h, const BatchSpec& batch, uint64_t seed, int layers) {
  h.backend->prepare(batch, nullptr);
  for (int layer = 0; layer < layers; ++layer) {
    Activations x = make_activations(h.model, batch.slots, batch.T, seed + layer);
    h.backend->verify(layer, x.in, x.out_view, nullptr);
  }
  h.backend->abort_round(nullptr);
}

void check_materialized_states(const Harness& eager, Harness& ring) {
  ring.backend->materialize(allocated_slots(ring), nullptr);
  CHECK(same_bits(eager.pool().ssm_state_all(), bytes_of(ring.pool().ssm_state_all())));
  CHECK(same_bits(eager.pool().conv_state_all(), bytes_of(ring.pool().conv_state_all())));
  for (const int32_t n : to_host_vector<int32_t>(ring.pool().ring_pending_all())) {
    REQUIRE(n == 0);
  }
}

RandomRound random_round(std::mt19937& rng, int num_slots) {
  std::vector<int32_t> slots(static_cast<size_t>(num_slots));
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  const int B = 1 + static_cast<int>(rng() % kMaxRunning);
  slots.resize(static_cast<size_t>(B));
  if (B > 1 && rng() % 3 == 0) {
    slots[rng() % static_cast<size_t>(B)] = -1;
  }
  RandomRound r{BatchSpec{1 + static_cast<int>(rng() % kT), slots, {}}, {}, false};
  if (rng() % 3 == 0) {
    std::vector<int32_t> rows(static_cast<size_t>(kMaxRunning));
    std::iota(rows.begin(), rows.end(), 0);
    std::shuffle(rows.begin(), rows.end(), rng);
    rows.resize(static_cast<size_t>(B));
    r.batch.rows = rows;
  }
  for (int i = 0; i < B; ++i) {
    r.accepted.push_back(1 + static_cast<int>(rng() % static_cast<unsigned>(r.batch.T)));
    if (rng() % 6 == 0 && slots[static_cast<size_t>(i)] >= 0) {
      const int32_t bad_lengths[] = {0, r.batch.T + 1, -1};
      r.accepted.back() = bad_lengths[rng() % 3];
      r.bad = true;
    }
  }
  return r;
}

void check_request_records(const KdaStatePool& want, const KdaStatePool& got, const ModelConfig& m,
                           int layer, int slot, int row, int T, int cursor) {
  const int L = want.ring_len();
  const auto record = [&](const TensorView& ring, int head, int pos) {
    return bytes_of(ring.select(0, slot).select(0, head).select(0, pos));
  };
  CHECK(same_bits(want.conv_window(layer).select(0, row).narrow(0, 0, T),
                  bytes_of(got.conv_window(layer).select(0, row).narrow(0, 0, T))));
  for (int t = 0; t < T; ++t) {
    const int pos = (cursor + t) & (L - 1);
    CAPTURE(t, pos);
    for (int hv = 0; hv < m.HV; ++hv) {
      CHECK(record(want.ring_rawv(layer), hv, t) == record(got.ring_rawv(layer), hv, pos));
      CHECK(record(want.ring_g(layer), hv, t) == record(got.ring_g(layer), hv, pos));
      CHECK(record(want.ring_beta(layer), hv, t) == record(got.ring_beta(layer), hv, pos));
    }
    for (int h = 0; h < m.H; ++h) {
      CHECK(record(want.ring_rawk(layer), h, t) == record(got.ring_rawk(layer), h, pos));
    }
  }
}

void check_batch_records(const KdaStatePool& want, const KdaStatePool& got, const ModelConfig& m,
                         int layer, const BatchSpec& batch, const std::vector<int32_t>& cursors) {
  for (size_t i = 0; i < batch.slots.size(); ++i) {
    const int32_t slot = batch.slots[i];
    if (slot < 0) {
      continue;
    }
    const int row = batch.rows.empty() ? static_cast<int>(i) : batch.rows[i];
    CAPTURE(i, slot, row);
    check_request_records(want, got, m, layer, slot, row, batch.T,
                          cursors[static_cast<size_t>(slot)]);
  }
}

uint64_t pool_checksum(const KdaStatePool& pool) {
  uint64_t h = 1469598103934665603ull;
  for (const TensorView& v : {pool.conv_state_all(), pool.ssm_state_all(), pool.conv_window_all(),
                              pool.snapshots_all(), pool.ring_rawv_all(), pool.ring_rawk_all(),
                              pool.ring_g_all(), pool.ring_beta_all(), pool.qkv_act()}) {
    if (!v.defined()) {
      continue;
    }
    for (uint8_t byte : bytes_of(v)) {
      h = (h ^ byte) * 1099511628211ull;
    }
  }
  return h;
}

namespace {
EngineFlags harness_flags(bool ring, bool fused, bool deferred) {
  EngineFlags flags = flags_for(ring, deferred);
  flags.fused_verify = fused;
  return flags;
}
}  // namespace

Harness::Harness(const ModelCase& mc, bool ring, const Platform& platform, bool fused,
                 bool deferred)
    : Harness(mc, harness_flags(ring, fused, deferred), platform) {}

void Harness::fill_scratch(uint64_t seed) {
  Rng rng(seed);
  const KdaStatePool& p = pool();
  from_host_vector(rng.bf16s(p.conv_window_all().numel(), 2.0f), p.conv_window_all());
  if (p.ring_mode()) {
    from_host_vector(rng.bf16s(p.ring_rawv_all().numel(), 2.0f), p.ring_rawv_all());
    from_host_vector(rng.bf16s(p.ring_rawk_all().numel(), 2.0f), p.ring_rawk_all());
    from_host_vector(rng.floats(p.ring_g_all().numel(), 2.0f), p.ring_g_all());
    from_host_vector(rng.floats(p.ring_beta_all().numel(), 2.0f), p.ring_beta_all());
  } else {
    from_host_vector(rng.floats(p.snapshots_all().numel(), 2.0f), p.snapshots_all());
  }
}

Harness::Harness(const ModelCase& mc, const EngineFlags& flags, const Platform& platform)
    : Harness(model_for(mc), flags, platform) {}

Harness::Harness(const ModelConfig& m, const EngineFlags& flags, const Platform& platform)
    : Harness(m, flags, platform, BackendOptions{}) {}

Harness::Harness(const ModelConfig& m, const EngineFlags& flags, const Platform& platform,
                 BackendOptions options)
    : model(m),
      counts(std::make_shared<KernelCounts>()),
      launch(std::make_shared<kernels::LaunchOverrides>()) {
  options.platform_override = platform;
  options.extra_slots = 1;
  backend = std::make_unique<KdaAttentionBackend>(
      model, flags, std::make_unique<CountingKernelSet>(counts, launch), options);
  for (int layer = 0; layer < kLayers; ++layer) {
    weights.push_back(make_weights(model, 100 + layer));
    backend->set_layer_weights(layer, weights.back().views);
  }
  const KdaStatePool& pool = backend->pool();
  while (pool.num_free_slots() > 0) {
    backend->allocate_slot();
  }
  Rng rng(7);
  from_host_vector(rng.bf16s(pool.conv_state_all().numel(), 0.5f), pool.conv_state_all());
  from_host_vector(rng.floats(pool.ssm_state_all().numel(), 0.2f), pool.ssm_state_all());
}

std::vector<Activations> verify_all(Harness& h, const BatchSpec& batch, uint64_t seed) {
  h.backend->prepare(batch, nullptr);
  std::vector<Activations> acts;
  for (int layer = 0; layer < kLayers; ++layer) {
    acts.push_back(make_activations(h.model, batch.slots, batch.T, seed * 10 + layer));
    h.backend->verify(layer, acts.back().in, acts.back().out_view, nullptr);
  }
  return acts;
}

std::vector<uint8_t> packed_bytes(const TensorView& v) {
  std::vector<uint8_t> out;
  auto take = [&out](const auto& vec) {
    const auto* p = reinterpret_cast<const uint8_t*>(vec.data());
    out.assign(p, p + vec.size() * sizeof(vec[0]));
  };
  if (!v.defined()) {
    return out;
  }
  switch (v.dtype()) {
    case DType::kBF16:
      take(to_host_vector<bf16_t>(v));
      break;
    case DType::kF32:
      take(to_host_vector<float>(v));
      break;
    case DType::kI32:
      take(to_host_vector<int32_t>(v));
      break;
    default:
      KDA_FAIL("packed_bytes: a bf16, f32 or i32 view expected, got {}", dtype_name(v.dtype()));
  }
  return out;
}

Buffer device_i32(const std::vector<int32_t>& v) {
  Buffer b(kTestDevice, static_cast<int64_t>(std::max<size_t>(v.size(), 1)) * 4);
  if (!v.empty()) {
    b.upload(v.data(), static_cast<int64_t>(v.size()) * 4);
  }
  return b;
}

std::vector<int32_t> random_tree(std::mt19937& rng, int T, int topk) {
  std::vector<int32_t> parents(static_cast<size_t>(T), -1);
  std::vector<int> children(static_cast<size_t>(T), 0);
  for (int j = 1; j < T; ++j) {
    int p = 0;
    do {
      p = static_cast<int>(rng() % static_cast<unsigned>(j));
    } while (children[static_cast<size_t>(p)] >= topk);
    ++children[static_cast<size_t>(p)];
    parents[static_cast<size_t>(j)] = p;
  }
  return parents;
}

void commit(Harness& h, const std::vector<int32_t>& accepted) {
  const Buffer buf = device_i32(accepted);
  h.backend->commit(buf.view(DType::kI32, {static_cast<int64_t>(accepted.size())}), nullptr);
}

void twin_round(Harness& a, Harness& b, const RandomRound& rr, uint64_t seed) {
  const std::vector<Activations> xa = verify_all(a, rr.batch, seed);
  const std::vector<Activations> xb = verify_all(b, rr.batch, seed);
  for (size_t layer = 0; layer < xa.size(); ++layer) {
    CAPTURE(layer);
    CHECK(same_bits(xa[layer].out_view, xb[layer].out_view));
  }
  for (Harness* h : {&a, &b}) {
    commit(*h, rr.accepted);
    if (rr.bad) {
      error_of([&] { h->backend->check_device_errors(nullptr); }, ErrorCode::kInvalidArgument);
    } else {
      h->backend->check_device_errors(nullptr);
    }
  }
}

std::string error_of(const std::function<void()>& f, ErrorCode want) {
  try {
    f();
  } catch (const Error& e) {
    CHECK(e.code() == want);
    return e.message();
  }
  return "<no error>";
}

}  // namespace kda::testing
