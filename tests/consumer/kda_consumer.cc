// kda_consumer.cc: an engine's use of the installed package (tests/consumer/CMakeLists.txt,
// run by .ci/run). Three backends on the host kernel set (make_kernel_set(Device::host())) share
// weights, initial state and activations: one records per-step snapshots, the other two the
// ReplaySSM ring with the deferred commit (EngineFlags::replayssm_spec, deferred_commit), the
// third on engine-owned memory: its conv and SSM state in the engine's own tensors
// (BackendOptions::external_pool, slots claimed by number), the rest from the engine's allocator
// (a kda::Allocator subclass defined here). Three rounds of verify -> commit (the later ones
// verify from the committed state) must give bitwise equal outputs; the ring backends'
// committed state, materialized (the engine one through kda::ops::materialize on its own
// tensors), must equal the snapshot backend's bitwise, and every allocator block must be
// returned. Also checks that a kda::Error thrown inside libkda.so is caught here by its type and
// code. Headers come as <kda/...> (the include dir is PREFIX/include). Exit status 0 and
// "kda_consumer: OK" on success.
//
// Usage: kda_consumer [host|cuda]. CI runs the host kernel set (the default); `cuda` puts every
// buffer and both kernel sets on cuda:0 (make_kernel_set), for a GPU host.
#include <kda/backend/kda_backend.h>
#include <kda/backend/kernel_set_factory.h>
#include <kda/backend/ops.h>
#include <kda/core/allocator.h>
#include <kda/core/buffer.h>
#include <kda/core/error.h>
#include <kda/kernels/kernel_set.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

using kda::Buffer;
using kda::DType;
using kda::TensorView;

constexpr int kLayers = 2;
constexpr int kMaxT = 4;
constexpr int kSlots = 4;
kda::Device g_device = kda::Device::host();  // of every buffer and both kernel sets

int g_failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "kda_consumer: FAILED: %s\n", what.c_str());
    ++g_failures;
  }
}

// Deterministic data (a 64-bit LCG; the values only need to be the same for both backends).
class Lcg {
 public:
  explicit Lcg(uint64_t seed) : state_(seed) {}
  float uniform(float scale) {  // in [-scale, scale)
    state_ = state_ * 6364136223846793005ull + 1442695040888963407ull;
    const float unit = static_cast<float>(state_ >> 40) / static_cast<float>(1ull << 24);
    return scale * (2.0f * unit - 1.0f);
  }
  std::vector<float> floats(int64_t n, float scale) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) {
      x = uniform(scale);
    }
    return v;
  }
  std::vector<kda::bf16_t> bf16s(int64_t n, float scale) {
    std::vector<kda::bf16_t> v(static_cast<size_t>(n));
    for (kda::bf16_t& x : v) {
      x = kda::float_to_bf16(uniform(scale));
    }
    return v;
  }

 private:
  uint64_t state_;
};

kda::ModelConfig model_config() {
  kda::ModelConfig m;
  m.num_layers = kLayers;
  m.H = 2;
  m.HV = 4;
  m.K = 64;
  m.V = 64;
  m.gate = kda::GateKind::kStandard;
  m.conv_weight_type = kda::ConvWeightType::kF32;
  m.has_conv_bias = true;
  return m;
}

kda::EngineFlags engine_flags(bool ring) {
  kda::EngineFlags f;
  f.num_draft_tokens = kMaxT;
  f.max_running_requests = kSlots;
  f.replayssm_spec = ring;
  f.replayssm_cache_len = 8;
  f.deferred_commit = static_cast<int>(ring ? kda::DeferredCommit::kOn : kda::DeferredCommit::kOff);
  return f;
}

// One layer's weights, owned here (the backends hold views).
struct Weights {
  Buffer A_log, dt_bias, conv_weight, conv_bias;
  kda::LayerWeights views;
};

Weights make_weights(const kda::ModelConfig& m, uint64_t seed) {
  Lcg rng(seed);
  const int64_t D = m.qkv_dim(), HVK = static_cast<int64_t>(m.HV) * m.K;
  Weights w{Buffer(g_device, m.HV * 4), Buffer(g_device, HVK * 4), Buffer(g_device, D * 4 * 4),
            Buffer(g_device, D * 4), kda::LayerWeights{}};
  w.views.A_log = w.A_log.view(DType::kF32, {m.HV});
  w.views.dt_bias = w.dt_bias.view(DType::kF32, {HVK});
  w.views.conv_weight = w.conv_weight.view(DType::kF32, {D, 4});
  w.views.conv_bias = w.conv_bias.view(DType::kF32, {D});
  kda::from_host_vector(rng.floats(m.HV, 1.0f), w.views.A_log);
  kda::from_host_vector(rng.floats(HVK, 1.0f), w.views.dt_bias);
  kda::from_host_vector(rng.floats(D * 4, 0.5f), w.views.conv_weight);
  kda::from_host_vector(rng.floats(D, 0.2f), w.views.conv_bias);
  return w;
}

// The engine's allocator: host or CUDA memory, counted.
class EngineAllocator final : public kda::Allocator {
 public:
  void* allocate(int64_t bytes, const kda::Device& device, cudaStream_t /*stream*/) override {
    void* p = nullptr;
    if (device.is_cuda()) {
      if (cudaMalloc(&p, static_cast<size_t>(bytes)) != cudaSuccess) {
        return nullptr;
      }
    } else {
      p = std::aligned_alloc(256, static_cast<size_t>((bytes + 255) / 256 * 256));
    }
    live[p] = bytes;
    return p;
  }
  void deallocate(void* p, int64_t bytes, const kda::Device& device,
                  cudaStream_t /*stream*/) noexcept override {
    bad_frees += live.erase(p) == 1 && bytes > 0 ? 0 : 1;
    if (device.is_cuda()) {
      cudaFree(p);
    } else {
      std::free(p);
    }
  }
  std::map<void*, int64_t> live;
  int bad_frees = 0;
};

// The engine's own state tensors: [layers, kSlots + 1, ...] (a spare slot), packed.
struct EngineState {
  Buffer conv, ssm;
  kda::ExternalPoolTensors tensors;
};

EngineState make_engine_state(const kda::ModelConfig& m) {
  const int64_t S1 = kSlots + 1, D = m.qkv_dim();
  EngineState e{Buffer(g_device, kLayers * S1 * 3 * D * 2),
                Buffer(g_device, kLayers * S1 * m.HV * m.V * m.K * 4),
                {}};
  e.tensors.conv_state = e.conv.view(DType::kBF16, {kLayers, S1, 3, D});
  e.tensors.ssm_state = e.ssm.view(DType::kF32, {kLayers, S1, m.HV, m.V, m.K});
  return e;
}

// A backend on the host kernel set with every slot allocated and the given initial state;
// `options`: engine-owned memory (then the slots are claimed by number, last first).
std::unique_ptr<kda::KdaAttentionBackend> make_backend(const kda::ModelConfig& m, bool ring,
                                                       const std::vector<Weights>& weights,
                                                       const kda::BackendOptions& options = {}) {
  auto backend = std::make_unique<kda::KdaAttentionBackend>(
      m, engine_flags(ring), kda::make_kernel_set(g_device), options);
  for (int layer = 0; layer < kLayers; ++layer) {
    backend->set_layer_weights(layer, weights[static_cast<size_t>(layer)].views);
  }
  Lcg rng(7);
  const kda::KdaStatePool& pool = backend->pool();
  kda::from_host_vector(rng.bf16s(pool.conv_state_all().numel(), 0.5f), pool.conv_state_all());
  kda::from_host_vector(rng.floats(pool.ssm_state_all().numel(), 0.2f), pool.ssm_state_all());
  for (int s = kSlots - 1; s >= 0; --s) {
    if (options.external_pool.any()) {
      backend->claim_slot(s, kda::SlotInit::kKeepState, nullptr);  // the engine's numbers
    } else {
      backend->allocate_slot();
    }
  }
  if (!options.external_pool.any()) {
    // allocate_slot zeroed them: the same initial state again.
    Lcg again(7);
    kda::from_host_vector(again.bf16s(pool.conv_state_all().numel(), 0.5f), pool.conv_state_all());
    kda::from_host_vector(again.floats(pool.ssm_state_all().numel(), 0.2f), pool.ssm_state_all());
  }
  return backend;
}

template <typename T>
bool same_bits(const TensorView& x, const TensorView& y) {
  const std::vector<T> a = kda::to_host_vector<T>(x), b = kda::to_host_vector<T>(y);
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

struct Round {
  kda::BatchSpec batch;
  std::vector<int32_t> accepted;
};

// Verifies every layer of `round` on both backends with the same activations, compares the
// outputs bitwise, then commits `round.accepted` on both.
void run_round(const kda::ModelConfig& m, const Round& round, int index,
               kda::KdaAttentionBackend& snap, kda::KdaAttentionBackend& ring,
               kda::KdaAttentionBackend& engine) {
  const int64_t B = static_cast<int64_t>(round.batch.slots.size());
  const int64_t N = B * round.batch.T, D = m.qkv_dim(), HVK = static_cast<int64_t>(m.HV) * m.K;
  snap.prepare(round.batch, nullptr);
  ring.prepare(round.batch, nullptr);
  engine.prepare(round.batch, nullptr);
  for (int layer = 0; layer < kLayers; ++layer) {
    Lcg rng(1000 * static_cast<uint64_t>(index) + static_cast<uint64_t>(layer));
    Buffer qkv(g_device, N * D * 2), a(g_device, N * HVK * 2), b(g_device, N * m.HV * 2);
    Buffer out_snap(g_device, N * m.HV * m.V * 2), out_ring(g_device, N * m.HV * m.V * 2);
    Buffer out_engine(g_device, N * m.HV * m.V * 2);
    kda::VerifyInputs in;
    in.mixed_qkv = qkv.view(DType::kBF16, {N, D});
    in.a = a.view(DType::kBF16, {N, HVK});
    in.b = b.view(DType::kBF16, {N, m.HV});
    kda::from_host_vector(rng.bf16s(N * D, 0.5f), in.mixed_qkv);
    kda::from_host_vector(rng.bf16s(N * HVK, 0.5f), in.a);
    kda::from_host_vector(rng.bf16s(N * m.HV, 1.0f), in.b);
    const TensorView os = out_snap.view(DType::kBF16, {N, m.HV, m.V});
    const TensorView orr = out_ring.view(DType::kBF16, {N, m.HV, m.V});
    const TensorView oe = out_engine.view(DType::kBF16, {N, m.HV, m.V});
    snap.verify(layer, in, os, nullptr);
    ring.verify(layer, in, orr, nullptr);
    engine.verify(layer, in, oe, nullptr);
    const std::string where =
        "round " + std::to_string(index) + " layer " + std::to_string(layer) + ": ";
    expect(same_bits<kda::bf16_t>(os, orr), where + "ring output != snapshot output");
    expect(same_bits<kda::bf16_t>(os, oe), where + "engine-memory output != snapshot output");
    bool nonzero = false;
    for (kda::bf16_t x : kda::to_host_vector<kda::bf16_t>(os)) {
      nonzero = nonzero || (x.bits & 0x7fff) != 0;
    }
    expect(nonzero, where + "output is all zeros");
  }
  Buffer accepted(g_device, B * 4);
  accepted.upload(round.accepted.data(), accepted.bytes());
  const TensorView lengths = accepted.view(DType::kI32, {B});
  snap.commit(lengths, nullptr);
  ring.commit(lengths, nullptr);
  engine.commit(lengths, nullptr);
  snap.check_device_errors(nullptr);
  ring.check_device_errors(nullptr);
  engine.check_device_errors(nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string device = argc > 1 ? argv[1] : "host";
  if (argc > 2 || (device != "host" && device != "cuda")) {
    std::fprintf(stderr, "usage: kda_consumer [host|cuda]\n");
    return 2;
  }
  try {
    if (device == "cuda") {
      g_device = kda::Device::cuda(0);
    }
    const kda::ModelConfig m = model_config();
    std::vector<Weights> weights;
    for (int layer = 0; layer < kLayers; ++layer) {
      weights.push_back(make_weights(m, 100 + static_cast<uint64_t>(layer)));
    }
    auto snap = make_backend(m, /*ring=*/false, weights);
    auto ring = make_backend(m, /*ring=*/true, weights);
    auto allocator = std::make_shared<EngineAllocator>();
    EngineState state = make_engine_state(m);
    kda::BackendOptions options;
    options.allocator = allocator;
    options.external_pool = state.tensors;
    auto engine = make_backend(m, /*ring=*/true, weights, options);
    expect(engine->memory_report().external_bytes > 0 && engine->memory_report().from_allocator &&
               !allocator->live.empty(),
           "the engine backend's memory is not the engine's");
    expect(snap->kernels().name() == device, "kernel set is not the " + device + " one");
    expect(ring->deferred_commit() && !snap->deferred_commit(), "record modes not as configured");
    const std::vector<float> initial_ssm = kda::to_host_vector<float>(ring->pool().ssm_state_all());

    // An error thrown inside libkda.so, caught by type (typeinfo exported by the version script).
    try {
      snap->prepare(kda::BatchSpec{kMaxT + 1, {0}, {}}, nullptr);
      expect(false, "prepare(T > T_max) did not throw");
    } catch (const kda::Error& e) {
      expect(e.code() == kda::ErrorCode::kInvalidArgument && !e.message().empty(),
             std::string("prepare(T > T_max): unexpected error ") + e.what());
    }

    const std::vector<Round> rounds = {
        // Slots out of order, a padding request (-1), acceptance 1 .. T.
        {{kMaxT, {3, 1, -1, 0}, {}}, {2, 4, 1, 1}},
        // From the committed state, a shorter T.
        {{3, {0, 2}, {}}, {3, 1}},
        // And again.
        {{kMaxT, {1, 3, 0}, {}}, {1, 4, 2}},
    };
    for (size_t i = 0; i < rounds.size(); ++i) {
      run_round(m, rounds[i], static_cast<int>(i), *snap, *ring, *engine);
    }

    ring->materialize({0, 1, 2, 3}, nullptr);
    // The engine backend's pending steps, folded by kda::ops on its tensors.
    {
      const kda::KdaStatePool& p = engine->pool();
      kda::ops::StateTensors st;
      st.conv_state = p.conv_state_all();
      st.ssm_state = p.ssm_state_all();
      st.conv_window = p.conv_window_all();
      st.ring_rawv = p.ring_rawv_all();
      st.ring_rawk = p.ring_rawk_all();
      st.ring_g = p.ring_g_all();
      st.ring_beta = p.ring_beta_all();
      st.ring_cursor = p.ring_cursor();
      st.ring_pending = p.ring_pending_all();
      st.ring_u = p.ring_u_all();
      const std::vector<int32_t> every = {0, 1, 2, 3};
      Buffer slots(g_device, 16);
      slots.upload(every.data(), 16);
      auto kernels = kda::make_kernel_set(g_device);
      kda::ops::materialize(*kernels, {st, slots.view(DType::kI32, {4})}, nullptr);
      expect(same_bits<float>(state.tensors.ssm_state.narrow(1, 0, kSlots),
                              snap->pool().ssm_state_all()),
             "committed SSM state: engine tensors (kda::ops::materialize) != snapshot");
      expect(same_bits<kda::bf16_t>(state.tensors.conv_state.narrow(1, 0, kSlots),
                                    snap->pool().conv_state_all()),
             "committed conv state: engine tensors != snapshot");
    }
    engine.reset();
    expect(allocator->live.empty() && allocator->bad_frees == 0,
           "the engine allocator's blocks were not all returned");
    expect(same_bits<float>(ring->pool().ssm_state_all(), snap->pool().ssm_state_all()),
           "committed SSM state: ring (materialized) != snapshot");
    expect(same_bits<kda::bf16_t>(ring->pool().conv_state_all(), snap->pool().conv_state_all()),
           "committed conv state: ring != snapshot");
    expect(kda::to_host_vector<float>(ring->pool().ssm_state_all()) != initial_ssm,
           "committed SSM state did not change");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kda_consumer: FAILED: exception: %s\n", e.what());
    return 1;
  }
  if (g_failures) {
    std::fprintf(stderr, "kda_consumer: %d check(s) failed\n", g_failures);
    return 1;
  }
  std::printf(
      "kda_consumer: OK (%s kernel set, snapshot vs ring + deferred commit vs engine-owned "
      "memory, bitwise)\n",
      device.c_str());
  return 0;
}
