// backend_test.cc: KdaAttentionBackend on the host kernel set: the verify -> commit -> verify
// lifecycle, ring mode checked bitwise against an independent snapshot-mode backend, and
// every bad input / lifecycle misuse rejected with a precise message and no state change.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/kda_backend.h"
#include "backend/kernel_set_factory.h"
#include "core/buffer.h"
#include "core/error.h"
#include "core/logging.h"
#include "core/platform.h"
#include "kernels/kda_kernels.h"
#include "kernels/kernel_set.h"

#include <spdlog/sinks/ostream_sink.h>

using namespace kda;

// The same lifecycle tests run on the host reference (backend_test, CI) and, built with
// KDA_BACKEND_TEST_CUDA, on the CUDA kernels (backend_cuda_test, GPU host). Tests whose
// subject is host-side only (validation messages, configuration, logging) and the stub-kernel
// CUDA test (backend_gpu_test runs it) are hidden there.
#ifdef KDA_BACKEND_TEST_CUDA
#define KDA_HOST_ONLY "[.host_only]"
const Device kTestDevice = Device::cuda(0);
#else
#define KDA_HOST_ONLY ""
const Device kTestDevice = Device::host();
#endif

namespace {

constexpr int kLayers = 2;
constexpr int kT = 4;           // --speculative-num-draft-tokens
constexpr int kMaxRunning = 4;  // R; S = R + 1 (extra slot)
constexpr int kQkvPad = 8;      // mixed_qkv row stride D + 8: the contract allows stride > D
const bf16_t kBf16NaN{0x7fc0};

// ---- counting kernel set (wraps the host reference; the backend owns it) ----

struct KernelCounts {
  int fused = 0, unfused = 0, extend = 0, commit = 0;
  int last_block_v = 0;
  int total() const { return fused + unfused + extend + commit; }
};

class CountingKernelSet final : public KernelSet {
 public:
  explicit CountingKernelSet(std::shared_ptr<KernelCounts> counts)
      : inner_(make_kernel_set(kTestDevice)), counts_(std::move(counts)) {}
  const char* name() const override { return "counting host"; }
  Device device() const override { return inner_->device(); }
  void verify_unfused(const VerifyParams& p, cudaStream_t s) override {
    inner_->verify_unfused(p, s);
    ++counts_->unfused;
  }
  void verify_fused(const VerifyParams& p, int block_v, cudaStream_t s) override {
    inner_->verify_fused(p, block_v, s);
    ++counts_->fused;
    counts_->last_block_v = block_v;
  }
  void extend(const ExtendParams& p, cudaStream_t s) override {
    inner_->extend(p, s);
    ++counts_->extend;
  }
  void commit(const CommitParams& p, cudaStream_t s) override {
    inner_->commit(p, s);
    ++counts_->commit;
  }

 private:
  std::unique_ptr<KernelSet> inner_;
  std::shared_ptr<KernelCounts> counts_;
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

struct ModelCase {
  const char* name;
  int H, HV;
  GateKind gate;
  ConvWeightType wtype;
  bool bias;
};

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

const ModelCase kGqaCase{"GQA HV=2H, standard gate, f32 conv + bias",
                         2,
                         4,
                         GateKind::kStandard,
                         ConvWeightType::kF32,
                         true};

EngineFlags flags_for(bool ring) {
  EngineFlags f;
  f.num_draft_tokens = kT;
  f.replayssm_spec = ring;
  f.replayssm_cache_len = 8;
  f.max_running_requests = kMaxRunning;
  return f;
}

// Per-layer weights owned by the test (the backend only holds views).
struct OwnedWeights {
  Buffer A_log, dt_bias, conv_weight, conv_bias;
  LayerWeights views;
};

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

// One layer's activations and output for N = B*T rows. Padding requests' rows and the qkv
// row padding are NaN: the backend must not read them.
struct Activations {
  Buffer qkv, a, b, out;
  VerifyInputs in;
  TensorView out_view;
  int64_t D = 0;
};

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

// Bitwise equality of two views' bytes (a bool, so a failure does not print megabytes).
bool same_bits(const TensorView& x, const TensorView& y) { return bytes_of(x) == bytes_of(y); }
bool same_bits(const TensorView& x, const std::vector<uint8_t>& y) { return bytes_of(x) == y; }

// FNV-1a over every pool tensor: committed state, rings, scratch.
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

// A backend on the counting host kernel set, with weights and seeded random committed state
// in slots 0..S-1 (all allocated).
struct Harness {
  Harness(const ModelCase& mc, bool ring, const Platform& platform, bool fused = true)
      : model(model_for(mc)), counts(std::make_shared<KernelCounts>()) {
    EngineFlags flags = flags_for(ring);
    flags.fused_verify = fused;
    BackendOptions options;
    options.platform_override = platform;
    options.extra_slots = 1;
    backend = std::make_unique<KdaAttentionBackend>(
        model, flags, std::make_unique<CountingKernelSet>(counts), options);
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

  const KdaStatePool& pool() const { return backend->pool(); }

  ModelConfig model;
  std::shared_ptr<KernelCounts> counts;
  std::unique_ptr<KdaAttentionBackend> backend;
  std::vector<OwnedWeights> weights;
};

// Runs verify on every layer; returns the layers' activations (inputs kept for oracles).
std::vector<Activations> verify_all(Harness& h, const BatchSpec& batch, uint64_t seed) {
  h.backend->prepare(batch, nullptr);
  std::vector<Activations> acts;
  for (int layer = 0; layer < kLayers; ++layer) {
    acts.push_back(make_activations(h.model, batch.slots, batch.T, seed * 10 + layer));
    h.backend->verify(layer, acts.back().in, acts.back().out_view, nullptr);
  }
  return acts;
}

void commit(Harness& h, const std::vector<int32_t>& accepted) {
  Buffer buf(kTestDevice, static_cast<int64_t>(accepted.size()) * 4);
  buf.upload(accepted.data(), buf.bytes());
  h.backend->commit(buf.view(DType::kI32, {static_cast<int64_t>(accepted.size())}), nullptr);
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

// Checks one round's outputs of the ring backend against the snapshot backend (bitwise) and
// that padding requests' rows are zero.
void check_outputs_equal(const std::vector<Activations>& ring, const std::vector<Activations>& snap,
                         const std::vector<int32_t>& slots, int T, const ModelConfig& m) {
  const int64_t row_elems = static_cast<int64_t>(m.HV) * m.V;
  for (int layer = 0; layer < kLayers; ++layer) {
    CAPTURE(layer);
    const auto r = to_host_vector<bf16_t>(ring[static_cast<size_t>(layer)].out_view);
    const auto s = to_host_vector<bf16_t>(snap[static_cast<size_t>(layer)].out_view);
    REQUIRE(r.size() == s.size());
    CHECK(std::memcmp(r.data(), s.data(), r.size() * sizeof(bf16_t)) == 0);
    for (size_t n = 0; n < slots.size(); ++n) {
      if (slots[n] >= 0) {
        continue;
      }
      for (int64_t i = n * T * row_elems; i < static_cast<int64_t>((n + 1) * T) * row_elems; ++i) {
        REQUIRE(r[static_cast<size_t>(i)].bits == 0);
      }
    }
  }
}

}  // namespace

TEST_CASE("backend: ring mode commits bitwise like an independent snapshot-mode backend",
          "[backend]") {
  const ModelCase mc =
      GENERATE(values<ModelCase>({kGqaCase,
                                  {"HV=H, safe gate -5, bf16 conv, no bias", 2, 2, GateKind::kSafe,
                                   ConvWeightType::kBF16, false}}));
  CAPTURE(mc.name);
  // Ring mode on a pretended SM90: B = 1 rounds take the fused kernel, larger ones unfused.
  // Snapshot mode takes the fused kernel at every B; a third backend forces unfused.
  Harness ring(mc, /*ring=*/true, fake_platform(9, 0));
  Harness snap(mc, /*ring=*/false, Platform{});
  Harness unfused(mc, /*ring=*/false, Platform{}, /*fused=*/false);
  REQUIRE(same_bits(ring.pool().ssm_state_all(), snap.pool().ssm_state_all()));
  const std::vector<uint8_t> initial_conv = bytes_of(ring.pool().conv_state_all());
  const ModelConfig& m = ring.model;
  const int64_t D = m.qkv_dim();
  const int64_t S = ring.pool().num_slots();

  struct Round {
    BatchSpec batch;
    std::vector<int32_t> accepted;
  };
  const std::vector<Round> rounds = {
      // Reversed slots (slot != batch position), a padding row, n = 1, T and 2.
      {{kT, {4, 2, -1, 0}, {}}, {1, kT, 1, 2}},
      // The next round reads the committed state: B = 1 (fused ring), partial acceptance.
      {{kT, {2}, {}}, {2}},
      // Explicit scratch rows (not the batch position), full acceptance, shorter T.
      {{3, {0, 3, 4}, {2, 0, 3}}, {3, 3, 1}},
      // And once more after all of it.
      {{kT, {1, 4}, {}}, {kT, 2}},
  };
  int round_index = 0;
  for (const Round& round : rounds) {
    CAPTURE(round_index);
    const std::vector<uint8_t> conv_before = bytes_of(ring.pool().conv_state_all());
    const std::vector<uint8_t> ssm_before = bytes_of(ring.pool().ssm_state_all());
    const uint64_t seed = 1000 + static_cast<uint64_t>(round_index);
    const auto ring_acts = verify_all(ring, round.batch, seed);
    const auto snap_acts = verify_all(snap, round.batch, seed);
    const auto unfused_acts = verify_all(unfused, round.batch, seed);
    // Verify reads the committed state but never writes it.
    CHECK(same_bits(ring.pool().conv_state_all(), conv_before));
    CHECK(same_bits(ring.pool().ssm_state_all(), ssm_before));
    check_outputs_equal(ring_acts, snap_acts, round.batch.slots, round.batch.T, m);
    check_outputs_equal(unfused_acts, snap_acts, round.batch.slots, round.batch.T, m);

    commit(ring, round.accepted);
    commit(snap, round.accepted);
    commit(unfused, round.accepted);
    CHECK(same_bits(ring.pool().ssm_state_all(), snap.pool().ssm_state_all()));
    CHECK(same_bits(ring.pool().conv_state_all(), snap.pool().conv_state_all()));
    CHECK(same_bits(unfused.pool().ssm_state_all(), snap.pool().ssm_state_all()));

    // Independent oracles per request: the ring fold equals the snapshot-mode state after
    // token n-1 (read from the snapshot backend's scratch, not its commit), and the conv state
    // is the last W-1 raw inputs of concat(previous conv state, x[0..n)).
    for (size_t i = 0; i < round.batch.slots.size(); ++i) {
      const int32_t slot = round.batch.slots[i];
      if (slot < 0) {
        continue;
      }
      const int row = round.batch.rows.empty() ? static_cast<int>(i) : round.batch.rows[i];
      const int n = round.accepted[i];
      CAPTURE(i, slot, row, n);
      for (int layer = 0; layer < kLayers; ++layer) {
        CAPTURE(layer);
        const TensorView snapshot = snap.pool().snapshots(layer).select(0, row).select(0, n - 1);
        const TensorView committed = ring.pool().ssm_state(layer).select(0, slot);
        CHECK(same_bits(committed, snapshot));
        // ... and commit did move it.
        const size_t state_bytes = static_cast<size_t>(committed.numel()) * 4;
        const size_t state_at = static_cast<size_t>(layer * S + slot) * state_bytes;
        CHECK_FALSE(same_bits(committed,
                              std::vector<uint8_t>(ssm_before.begin() + state_at,
                                                   ssm_before.begin() + state_at + state_bytes)));
        // Expected conv state: the previous W-1 rows then the n raw inputs; keep the last 3.
        const size_t window_bytes = static_cast<size_t>(3 * D * 2);
        std::vector<uint8_t> history(conv_before.begin() + (layer * S + slot) * window_bytes,
                                     conv_before.begin() + (layer * S + slot + 1) * window_bytes);
        const std::vector<uint8_t> x = bytes_of(
            ring_acts[static_cast<size_t>(layer)].in.mixed_qkv.narrow(0, i * round.batch.T, n));
        const size_t pitch_bytes = static_cast<size_t>(D + kQkvPad) * 2;
        for (int t = 0; t < n; ++t) {  // drop each row's NaN padding
          history.insert(history.end(), x.begin() + t * pitch_bytes,
                         x.begin() + t * pitch_bytes + D * 2);
        }
        CHECK(same_bits(ring.pool().conv_state(layer).select(0, slot),
                        std::vector<uint8_t>(history.end() - window_bytes, history.end())));
      }
    }
    ++round_index;
  }
  // Which kernels ran: the counting kernel set proves the dispatch, not just the stats.
  const DispatchStats ring_stats = ring.backend->stats();
  CHECK(ring.counts->fused == kLayers);  // the B = 1 round only
  CHECK(ring.counts->unfused == 3 * kLayers);
  CHECK(ring_stats.fused_calls == kLayers);
  CHECK(ring_stats.unfused_calls == 3 * kLayers);
  REQUIRE(ring_stats.last_decision[0].has_value());
  CHECK(ring_stats.last_decision[0]->reason == DispatchReason::kRingBatchAboveLimit);
  CHECK(snap.counts->fused == 4 * kLayers);
  CHECK(snap.counts->unfused == 0);
  CHECK(snap.counts->last_block_v ==
        kernels::default_block_v(4, snap.model.HV, snap.model.V));  // last round: B = 4
  CHECK(unfused.counts->fused == 0);
  CHECK(unfused.backend->stats().last_decision[1]->reason == DispatchReason::kFusedDisabled);
  CHECK(ring.counts->commit == 4);
  CHECK_FALSE(same_bits(ring.pool().conv_state_all(), initial_conv));
}

TEST_CASE("backend: extend prefills past T_max and matches verify + full commit", "[backend]") {
  Harness ring(kGqaCase, /*ring=*/true, fake_platform(9, 0));
  Harness snap(kGqaCase, /*ring=*/false, Platform{});
  const ModelConfig& m = ring.model;

  SECTION("6-token prompts, ring and snapshot backends agree bitwise") {
    const BatchSpec batch{6, {3, -1, 1}, {}};
    std::vector<std::vector<uint8_t>> outs[2];
    int k = 0;
    for (Harness* h : {&ring, &snap}) {
      h->backend->prepare_extend(batch, nullptr);
      CHECK(h->backend->round_kind() == RoundKind::kExtend);
      for (int layer = 0; layer < kLayers; ++layer) {
        Activations x = make_activations(m, batch.slots, batch.T, 50 + layer);
        h->backend->extend(layer, x.in, x.out_view, nullptr);
        outs[k].push_back(bytes_of(x.out_view));
      }
      CHECK(h->backend->round_kind() == RoundKind::kNone);  // extend commits in place
      CHECK(h->counts->extend == kLayers);
      ++k;
    }
    const bool same_outputs = outs[0] == outs[1];
    CHECK(same_outputs);
    CHECK(same_bits(ring.pool().ssm_state_all(), snap.pool().ssm_state_all()));
    CHECK(same_bits(ring.pool().conv_state_all(), snap.pool().conv_state_all()));
  }
  SECTION("extend of T tokens == verify of T tokens + commit of n = T") {
    const BatchSpec batch{kT, {2, 0}, {}};
    ring.backend->prepare_extend(batch, nullptr);
    std::vector<std::vector<uint8_t>> extend_out;
    for (int layer = 0; layer < kLayers; ++layer) {
      Activations x = make_activations(m, batch.slots, batch.T, 70 + layer);
      ring.backend->extend(layer, x.in, x.out_view, nullptr);
      extend_out.push_back(bytes_of(x.out_view));
    }
    const auto snap_acts = verify_all(snap, batch, 7);
    for (int layer = 0; layer < kLayers; ++layer) {
      CHECK(same_bits(snap_acts[static_cast<size_t>(layer)].out_view,
                      extend_out[static_cast<size_t>(layer)]));
    }
    commit(snap, {kT, kT});
    CHECK(same_bits(ring.pool().ssm_state_all(), snap.pool().ssm_state_all()));
    CHECK(same_bits(ring.pool().conv_state_all(), snap.pool().conv_state_all()));
  }
}

TEST_CASE("backend: lifecycle misuse is rejected and changes nothing", "[backend]" KDA_HOST_ONLY) {
  Harness h(kGqaCase, /*ring=*/true, fake_platform(9, 0));
  KdaAttentionBackend& b = *h.backend;
  const BatchSpec batch{kT, {1, 0}, {}};
  const auto x0 = make_activations(h.model, batch.slots, kT, 1);
  const auto x1 = make_activations(h.model, batch.slots, kT, 2);
  Buffer accepted_buf(Device::host(), 8);
  const int32_t two[2] = {2, 1};
  accepted_buf.upload(two, 8);
  const TensorView accepted = accepted_buf.view(DType::kI32, {2});

  // Each misuse: exact message, kLifecycle, and pool, round state and kernel calls unchanged.
  auto rejected = [&](const std::function<void()>& f, const std::string& message) {
    const uint64_t before = pool_checksum(h.pool());
    const std::string state = b.round_state();
    const int calls = h.counts->total();
    CHECK(error_of(f, ErrorCode::kLifecycle) == message);
    CHECK(pool_checksum(h.pool()) == before);
    CHECK(b.round_state() == state);
    CHECK(h.counts->total() == calls);
  };

  rejected([&] { b.verify(0, x0.in, x0.out_view, nullptr); },
           "verify(layer 0): no batch prepared (call prepare() first)");
  rejected([&] { b.extend(0, x0.in, x0.out_view, nullptr); },
           "extend(layer 0): no batch prepared (call prepare_extend() first)");
  rejected([&] { b.commit(accepted, nullptr); },
           "commit: no verify round to commit (call prepare() and verify every layer first)");

  b.prepare(batch, nullptr);
  CHECK(b.batch_size() == 2);
  CHECK(b.tokens_per_request() == kT);
  rejected([&] { b.commit(accepted, nullptr); },
           "commit: only 0 of 2 layers verified (missing layers 0, 1); verify every layer first");
  b.verify(0, x0.in, x0.out_view, nullptr);
  CHECK(b.round_state() == "verify round, 1 of 2 layers verified (0)");
  rejected([&] { b.verify(0, x0.in, x0.out_view, nullptr); },
           "verify(layer 0): layer 0 was already verified in this round (verify round, 1 of 2 "
           "layers verified (0)); commit() before verifying it again");
  rejected([&] { b.extend(1, x1.in, x1.out_view, nullptr); },
           "extend(layer 1): the prepared batch is for verify (prepare) (mixing extend and verify "
           "in one round is not allowed; prepare a new batch after this round)");
  rejected([&] { b.commit(accepted, nullptr); },
           "commit: only 1 of 2 layers verified (missing layers 1); verify every layer first");
  rejected([&] { b.prepare(batch, nullptr); },
           "prepare: the verify round in progress is not committed (verify round, 1 of 2 layers "
           "verified (0)); call commit() after every layer is verified, or abort_round() to drop "
           "it");
  rejected([&] { b.release_slot(0); },
           "release_slot: slot 0 belongs to request 1 of the verify round, 1 of 2 layers verified "
           "(0); commit() or abort_round() first");
  rejected([&] { b.record_graph_verify_round(); },
           "record_graph_verify_round: needs a freshly prepared verify batch with no layer "
           "verified yet, state is verify round, 1 of 2 layers verified (0)");
  b.verify(1, x1.in, x1.out_view, nullptr);
  rejected([&] { b.verify(1, x1.in, x1.out_view, nullptr); },
           "verify(layer 1): layer 1 was already verified in this round (verify round, 2 of 2 "
           "layers verified (0, 1)); commit() before verifying it again");
  b.commit(accepted, nullptr);
  CHECK(b.round_kind() == RoundKind::kNone);
  rejected([&] { b.commit(accepted, nullptr); },
           "commit: no verify round to commit (call prepare() and verify every layer first)");
  rejected([&] { b.verify(0, x0.in, x0.out_view, nullptr); },
           "verify(layer 0): no batch prepared (call prepare() first)");

  SECTION("extend rounds") {
    b.prepare_extend(batch, nullptr);
    rejected([&] { b.verify(0, x0.in, x0.out_view, nullptr); },
             "verify(layer 0): the prepared batch is for extend (prepare_extend) (mixing extend "
             "and verify in one round is not allowed; prepare a new batch after this round)");
    rejected([&] { b.commit(accepted, nullptr); },
             "commit: the current round is an extend round (extend commits in place; extend "
             "round, 0 of 2 layers extended (none))");
    b.extend(0, x0.in, x0.out_view, nullptr);
    rejected([&] { b.prepare(batch, nullptr); },
             "prepare: the extend round in progress is unfinished (extend round, 1 of 2 layers "
             "extended (0)); extend layers 1 too, or abort_round()");
    rejected([&] { b.extend(0, x0.in, x0.out_view, nullptr); },
             "extend(layer 0): layer 0 was already extended in this round (extend round, 1 of 2 "
             "layers extended (0))");
    b.extend(1, x1.in, x1.out_view, nullptr);
    CHECK(b.round_kind() == RoundKind::kNone);
  }
  SECTION("a prepared round with no layer run yet may be re-prepared or aborted") {
    b.prepare(batch, nullptr);
    b.prepare(BatchSpec{2, {0}, {}}, nullptr);
    CHECK(b.batch_size() == 1);
    CHECK(b.tokens_per_request() == 2);
    b.abort_round();
    CHECK(b.round_kind() == RoundKind::kNone);
    CHECK(b.batch_size() == 0);
    b.prepare(batch, nullptr);
    b.verify(0, x0.in, x0.out_view, nullptr);
    b.abort_round();  // verify never wrote committed state: dropping the round is safe
    b.prepare(batch, nullptr);
  }
  SECTION("a graph replay stands in for the host verify calls") {
    b.prepare(batch, nullptr);
    const int verifies = h.counts->fused + h.counts->unfused;
    b.record_graph_verify_round();
    CHECK(b.round_state() == "verify round, 2 of 2 layers verified (0, 1)");
    b.commit(accepted, nullptr);
    CHECK(h.counts->fused + h.counts->unfused == verifies);
    CHECK(h.counts->commit == 2);
  }
  SECTION("weights must be set before a layer runs") {
    BackendOptions options;
    options.platform_override = fake_platform(9, 0);
    KdaAttentionBackend fresh(h.model, flags_for(true), make_host_kernel_set(), options);
    fresh.allocate_slot();
    fresh.allocate_slot();
    fresh.prepare(batch, nullptr);
    CHECK(error_of([&] { fresh.verify(0, x0.in, x0.out_view, nullptr); }, ErrorCode::kLifecycle) ==
          "verify(layer 0): no weights set (call set_layer_weights(0, ...) first)");
    CHECK(fresh.round_state() == "verify round, 0 of 2 layers verified (none)");
  }
}

TEST_CASE("backend: every bad input names the argument and changes nothing",
          "[backend]" KDA_HOST_ONLY) {
  Harness h(kGqaCase, /*ring=*/true, fake_platform(9, 0));
  KdaAttentionBackend& b = *h.backend;
  const ModelConfig& m = h.model;
  const int64_t D = m.qkv_dim(), N = 2 * kT;
  const BatchSpec batch{kT, {3, 1}, {}};
  b.prepare(batch, nullptr);
  const Activations x = make_activations(m, batch.slots, kT, 3);
  Buffer spare(Device::host(), N * (D + kQkvPad) * 4);

  auto rejected = [&](const std::function<void()>& f, const std::string& message) {
    const uint64_t before = pool_checksum(h.pool());
    const std::string state = b.round_state();
    const int calls = h.counts->total();
    const DispatchStats stats = b.stats();
    CHECK(error_of(f, ErrorCode::kInvalidArgument) == message);
    CHECK(pool_checksum(h.pool()) == before);
    CHECK(b.round_state() == state);
    CHECK(h.counts->total() == calls);
    CHECK(b.stats().fused_calls + b.stats().unfused_calls ==
          stats.fused_calls + stats.unfused_calls);
  };
  auto verify_with = [&](const std::function<void(VerifyInputs&, TensorView&)>& edit) {
    return [&, edit] {
      VerifyInputs in = x.in;
      TensorView out = x.out_view;
      edit(in, out);
      b.verify(0, in, out, nullptr);
    };
  };

  SECTION("verify inputs") {
    rejected(verify_with([&](VerifyInputs& in, TensorView&) {
               in.mixed_qkv = in.mixed_qkv.narrow(0, 0, N - 1);
             }),
             "verify(layer 0): mixed_qkv: expected shape [8, 512], got [7, 512]");
    rejected(
        verify_with([&](VerifyInputs& in, TensorView&) {
          in.mixed_qkv = TensorView::contiguous(spare.data(), DType::kF32, Device::host(), {N, D});
        }),
        "verify(layer 0): mixed_qkv: expected dtype bf16, got f32");
    rejected(
        verify_with([&](VerifyInputs& in, TensorView&) {
          in.mixed_qkv = TensorView(spare.data(), DType::kBF16, Device::host(), {N, D}, {2 * D, 2});
        }),
        "verify(layer 0): mixed_qkv: expected the innermost dim contiguous (stride 1), got "
        "strides (1024, 2)");
    rejected(
        verify_with([&](VerifyInputs& in, TensorView&) {
          in.mixed_qkv = TensorView(spare.data(), DType::kBF16, Device::host(), {N, D}, {D - 1, 1});
        }),
        "verify(layer 0): mixed_qkv: row stride 511 is smaller than the row width 512 (rows "
        "would overlap)");
    rejected(verify_with([&](VerifyInputs& in, TensorView&) { in.mixed_qkv = TensorView(); }),
             "verify(layer 0): mixed_qkv: expected a tensor, got none (null data)");
    rejected(verify_with([&](VerifyInputs& in, TensorView&) {
               in.a = TensorView::contiguous(spare.data(), DType::kBF16, Device::cuda(0), {N, 256});
             }),
             "verify(layer 0): a: expected memory on host, got cuda:0");
    rejected(verify_with([&](VerifyInputs& in, TensorView&) { in.a = in.a.narrow(1, 0, 255); }),
             "verify(layer 0): a: expected shape [8, 256], got [8, 255]");
    rejected(verify_with([&](VerifyInputs& in, TensorView&) {
               in.b = TensorView::contiguous(spare.data(), DType::kBF16, Device::host(), {N, 4, 1});
             }),
             "verify(layer 0): b: expected shape [8, 4], got [8, 4, 1]");
    rejected(verify_with([&](VerifyInputs& in, TensorView&) {
               in.b = TensorView::contiguous(static_cast<char*>(spare.data()) + 1, DType::kBF16,
                                             Device::host(), {N, 4});
             }),
             fmt::format("verify(layer 0): b: expected data aligned to 2 bytes, got address {}",
                         static_cast<void*>(static_cast<char*>(spare.data()) + 1)));
    rejected(verify_with([&](VerifyInputs&, TensorView& out) {
               out = TensorView::contiguous(spare.data(), DType::kF32, Device::host(), {N, 4, 64});
             }),
             "verify(layer 0): out: expected dtype bf16, got f32");
    rejected(
        verify_with([&](VerifyInputs&, TensorView& out) {
          out = TensorView(spare.data(), DType::kBF16, Device::host(), {N, 4, 64}, {512, 128, 1});
        }),
        "verify(layer 0): out: expected a contiguous (row-major packed) tensor, got [8, 4, 64] "
        "strides (512, 128, 1)");
    rejected([&] { b.verify(2, x.in, x.out_view, nullptr); },
             "verify: layer 2 out of range [0, 2)");
    rejected([&] { b.verify(-1, x.in, x.out_view, nullptr); },
             "verify: layer -1 out of range [0, 2)");
    // The round is still usable after all of that.
    b.verify(0, x.in, x.out_view, nullptr);
    CHECK(b.round_state() == "verify round, 1 of 2 layers verified (0)");
  }
  SECTION("batch specs") {
    b.abort_round();
    rejected(
        [&] {
          b.prepare({0, {0}, {}}, nullptr);
        },
        "prepare: BatchSpec.T = 0 outside [1, 4] (--speculative-num-draft-tokens)");
    rejected(
        [&] {
          b.prepare({5, {0}, {}}, nullptr);
        },
        "prepare: BatchSpec.T = 5 outside [1, 4] (--speculative-num-draft-tokens)");
    rejected(
        [&] {
          b.prepare({kT, {}, {}}, nullptr);
        },
        "prepare: empty batch (BatchSpec.slots has no entries)");
    rejected(
        [&] {
          b.prepare({kT, {0, 1, 2, 3, 4}, {}}, nullptr);
        },
        "prepare: batch of 5 requests exceeds --max-running-requests = 4");
    rejected(
        [&] {
          b.prepare({kT, {0, 5}, {}}, nullptr);
        },
        "prepare: slots[1] = 5 out of range [-1, 5) (-1 = padding row)");
    rejected(
        [&] {
          b.prepare({kT, {-2}, {}}, nullptr);
        },
        "prepare: slots[0] = -2 out of range [-1, 5) (-1 = padding row)");
    rejected(
        [&] {
          b.prepare({kT, {2, -1, 2}, {}}, nullptr);
        },
        "prepare: slots[0] and slots[2] are both 2 (one slot per request)");
    rejected(
        [&] {
          b.prepare({kT, {0, 1}, {0}}, nullptr);
        },
        "prepare: BatchSpec.rows has 1 entries for 2 requests (empty = batch position)");
    rejected(
        [&] {
          b.prepare({kT, {0, 1}, {0, 4}}, nullptr);
        },
        "prepare: rows[1] = 4 out of range [0, 4) (--max-running-requests)");
    rejected(
        [&] {
          b.prepare({kT, {0, 1}, {3, 3}}, nullptr);
        },
        "prepare: rows[0] and rows[1] are both 3 (one scratch row per request)");
    rejected(
        [&] {
          b.prepare_extend({kT, {0, 1}, {0, 1}}, nullptr);
        },
        "prepare_extend: BatchSpec.rows has 2 entries, expected none (extend uses no scratch "
        "rows)");
    rejected(
        [&] {
          b.prepare_extend({0, {0}, {}}, nullptr);
        },
        "prepare_extend: BatchSpec.T = 0 outside [1, 2147483647] for 1 requests");
    b.release_slot(4);
    rejected(
        [&] {
          b.prepare({kT, {4}, {}}, nullptr);
        },
        "prepare: slots[0] = 4 is not allocated (allocate_slot() first)");
    CHECK(b.round_kind() == RoundKind::kNone);
    // A padding row's scratch row is never read: any value passes.
    CHECK_NOTHROW(b.prepare({kT, {0, -1}, {1, 99}}, nullptr));
  }
  SECTION("accepted lengths") {
    b.verify(0, x.in, x.out_view, nullptr);
    b.verify(1, x.in, x.out_view, nullptr);
    Buffer acc(Device::host(), 16);
    const int32_t lens[4] = {1, 2, 3, 4};
    acc.upload(lens, 16);
    rejected([&] { b.commit(acc.view(DType::kI32, {3}), nullptr); },
             "commit: accepted_lengths: expected shape [2], got [3]");
    rejected([&] { b.commit(acc.view(DType::kF32, {2}), nullptr); },
             "commit: accepted_lengths: expected dtype i32, got f32");
    rejected(
        [&] { b.commit(TensorView(acc.data(), DType::kI32, Device::host(), {2}, {2}), nullptr); },
        "commit: accepted_lengths: expected a contiguous (row-major packed) tensor, got [2] "
        "strides (2)");
    rejected(
        [&] {
          b.commit(TensorView::contiguous(acc.data(), DType::kI32, Device::cuda(0), {2}), nullptr);
        },
        "commit: accepted_lengths: expected memory on host, got cuda:0");
    CHECK(b.round_state() == "verify round, 2 of 2 layers verified (0, 1)");
    b.commit(acc.view(DType::kI32, {2}), nullptr);
  }
  SECTION("weights") {
    const LayerWeights good = h.weights[0].views;
    auto weights_with = [&](const std::function<void(LayerWeights&)>& edit) {
      return [&, edit] {
        LayerWeights w = good;
        edit(w);
        b.set_layer_weights(1, w);
      };
    };
    rejected(weights_with([](LayerWeights& w) { w.A_log = w.A_log.narrow(0, 0, 3); }),
             "set_layer_weights(layer 1): A_log: expected shape [4], got [3]");
    rejected(weights_with([&](LayerWeights& w) {
               w.dt_bias =
                   TensorView::contiguous(spare.data(), DType::kBF16, Device::host(), {256});
             }),
             "set_layer_weights(layer 1): dt_bias: expected dtype f32, got bf16");
    rejected(weights_with([&](LayerWeights& w) {
               w.conv_weight =
                   TensorView::contiguous(spare.data(), DType::kBF16, Device::host(), {D, 4});
             }),
             "set_layer_weights(layer 1): conv_weight: expected dtype f32, got bf16");
    rejected(
        weights_with([&](LayerWeights& w) {
          w.conv_weight = TensorView(spare.data(), DType::kF32, Device::host(), {D, 4}, {1, D});
        }),
        "set_layer_weights(layer 1): conv_weight: expected a contiguous (row-major packed) "
        "tensor, got [512, 4] strides (1, 512)");
    rejected(weights_with([](LayerWeights& w) { w.conv_bias = TensorView(); }),
             "set_layer_weights(layer 1): conv_bias: expected a tensor, got none (null data)");
    rejected([&] { b.set_layer_weights(2, good); },
             "set_layer_weights: layer 2 out of range [0, 2)");
    ModelConfig no_bias = m;
    no_bias.has_conv_bias = false;
    KdaAttentionBackend other(no_bias, flags_for(false), make_host_kernel_set());
    CHECK(error_of([&] { other.set_layer_weights(0, good); }, ErrorCode::kInvalidArgument) ==
          fmt::format("set_layer_weights(layer 0): conv_bias: the model has no conv bias "
                      "(ModelConfig.has_conv_bias = false), got {}",
                      good.conv_bias.describe()));
  }
  SECTION("slots") {
    b.abort_round();
    CHECK(error_of([&] { b.release_slot(7); }, ErrorCode::kInvalidArgument) ==
          "release_slot: slot 7 is not a slot of this pool (expected in [0, 5))");
    b.release_slot(2);
    CHECK(error_of([&] { b.release_slot(2); }, ErrorCode::kInvalidArgument) ==
          "release_slot: slot 2 is not allocated (double release?)");
    CHECK(b.allocate_slot() == 2);
    CHECK(error_of([&] { b.allocate_slot(); }, ErrorCode::kOutOfMemory) ==
          "allocate_slot: all 5 state slots are in use (raise --max-running-requests or release "
          "finished requests)");
  }
}

TEST_CASE("backend: a bad accepted length is flagged on the device and skips the request",
          "[backend]") {
  Harness h(kGqaCase, /*ring=*/true, fake_platform(9, 0));
  const BatchSpec batch{kT, {0, 1}, {}};
  verify_all(h, batch, 11);
  const auto slot0_before = bytes_of(h.pool().ssm_state(0).select(0, 0));
  const auto slot1_before = bytes_of(h.pool().ssm_state(0).select(0, 1));
  commit(h, {kT + 1, 2});
  CHECK(same_bits(h.pool().ssm_state(0).select(0, 0), slot0_before));        // skipped
  CHECK_FALSE(same_bits(h.pool().ssm_state(0).select(0, 1), slot1_before));  // committed
  CHECK(error_of([&] { h.backend->check_device_errors(nullptr); }, ErrorCode::kInvalidArgument) ==
        "commit: an accepted length outside [1, T] was passed; the affected requests were "
        "skipped and keep their previous committed state");
  CHECK_NOTHROW(h.backend->check_device_errors(nullptr));  // the flag was cleared
}

TEST_CASE("backend: bad configuration is rejected at construction", "[backend]" KDA_HOST_ONLY) {
  const ModelConfig good = model_for(kGqaCase);
  auto construct = [](ModelConfig m, EngineFlags f, BackendOptions o = {}) {
    return [=] { KdaAttentionBackend backend(m, f, make_host_kernel_set(), o); };
  };
  EngineFlags flags = flags_for(true);
  flags.num_draft_tokens = 0;
  CHECK(error_of(construct(good, flags), ErrorCode::kInvalidArgument) ==
        "--speculative-num-draft-tokens: invalid value '0' (expected an integer in [1, 16])");
  flags = flags_for(true);
  flags.replayssm_cache_len = 4;
  CHECK(error_of(construct(good, flags), ErrorCode::kInvalidArgument) ==
        "--linear-replayssm-cache-len: invalid value '4' for --speculative-num-draft-tokens 4 "
        "with --enable-linear-replayssm-spec (expected a power of two >= 2 * 4 = 8)");
  flags = flags_for(true);
  flags.verify_block_v = 7;
  CHECK(error_of(construct(good, flags), ErrorCode::kInvalidArgument) ==
        "--kda-verify-block-v: invalid value '7' (expected auto (or 0) or one of 8, 16, 32, 64, "
        "128)");
  ModelConfig m = good;
  m.K = 32;
  CHECK(error_of(construct(m, flags_for(true)), ErrorCode::kInvalidArgument) ==
        "ModelConfig.K: expected 64 or 128, got 32");
  m = good;
  m.HV = 3;
  CHECK(error_of(construct(m, flags_for(true)), ErrorCode::kInvalidArgument) ==
        "ModelConfig.HV: expected a multiple of H = 2, got 3");
  m = good;
  m.gate = GateKind::kSafe;
  m.lower_bound = 0.5f;
  CHECK(error_of(construct(m, flags_for(true)), ErrorCode::kInvalidArgument) ==
        "ModelConfig.lower_bound: the safe gate needs a finite value < 0, got 0.5");
  BackendOptions tight;
  tight.memory_budget_bytes = 1024;
  CHECK_THAT(error_of(construct(good, flags_for(true), tight), ErrorCode::kOutOfMemory),
             Catch::StartsWith("KDA state pool: ring mode needs"));
  CHECK(error_of([] { KdaAttentionBackend b(model_for(kGqaCase), flags_for(true), nullptr); },
                 ErrorCode::kInvalidArgument) == "KdaAttentionBackend: no kernel set given");
}

TEST_CASE("backend: an odd head_v_dim is refused on CUDA before anything is allocated",
          "[backend]" KDA_HOST_ONLY) {
  // A kernel set that reports a CUDA device; construction must fail before the pool touches it.
  class CudaDeviceOnly final : public KernelSet {
   public:
    const char* name() const override { return "cuda device only"; }
    Device device() const override { return Device::cuda(0); }
    void verify_unfused(const VerifyParams&, cudaStream_t) override {}
    void verify_fused(const VerifyParams&, int, cudaStream_t) override {}
    void extend(const ExtendParams&, cudaStream_t) override {}
    void commit(const CommitParams&, cudaStream_t) override {}
  };
  ModelConfig m = model_for(kGqaCase);
  m.V = 63;
  CHECK(error_of(
            [&] { KdaAttentionBackend b(m, flags_for(true), std::make_unique<CudaDeviceOnly>()); },
            ErrorCode::kUnsupported) ==
        "ModelConfig.V: the CUDA kernels need an even head_v_dim (bf16 channel pairs), got 63");
  // The host kernels take any V.
  CHECK_NOTHROW(KdaAttentionBackend(m, flags_for(true), make_host_kernel_set()));
}

TEST_CASE("backend: pool sizing, memory report and platform", "[backend]" KDA_HOST_ONLY) {
  BackendOptions options;
  options.extra_slots = 2;
  KdaAttentionBackend b(model_for(kGqaCase), flags_for(true), make_host_kernel_set(), options);
  CHECK(b.pool().num_slots() == kMaxRunning + 2);
  CHECK(b.pool().num_rows() == kMaxRunning);
  CHECK(b.pool().T_max() == kT);
  CHECK(b.pool().ring_mode());
  CHECK(b.pool().ring_len() == 8);
  CHECK(b.memory_report().total_bytes == b.pool().memory_report().total_bytes);
  CHECK(b.memory_report().ring_mode);
  CHECK(b.device() == Device::host());
  CHECK_FALSE(b.platform().has_device);  // host kernel set: ring mode never fused
  CHECK(b.platform().family() == ArchFamily::kOther);
}

TEST_CASE("backend: dispatch decisions are logged at debug when they change",
          "[backend]" KDA_HOST_ONLY) {
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  sink->set_pattern("%l %v");
  logger().sinks().push_back(sink);
  const spdlog::level::level_enum level = logger().level();
  set_log_level("debug");
  Harness h(kGqaCase, /*ring=*/true, fake_platform(9, 0));
  log.str("");
  for (const BatchSpec& batch :
       {BatchSpec{kT, {0}, {}}, BatchSpec{kT, {1}, {}}, BatchSpec{kT, {0, 1}, {}}}) {
    verify_all(h, batch, 5);
    commit(h, std::vector<int32_t>(batch.slots.size(), 1));
  }
  logger().set_level(level);
  logger().sinks().pop_back();
  // Two rounds at B = 1 (fused, logged once per layer), then B = 2 (unfused, logged again).
  CHECK(log.str() ==
        "debug verify layer 0 (B=1, T=4): fused (block_v = 8): ring mode with B = 1 <= "
        "--kda-fused-ring-max-batch = 1 on SM90, ring layout ok\n"
        "debug verify layer 1 (B=1, T=4): fused (block_v = 8): ring mode with B = 1 <= "
        "--kda-fused-ring-max-batch = 1 on SM90, ring layout ok\n"
        "debug verify layer 0 (B=2, T=4): unfused: ring mode with B = 2 > "
        "--kda-fused-ring-max-batch = 1\n"
        "debug verify layer 1 (B=2, T=4): unfused: ring mode with B = 2 > "
        "--kda-fused-ring-max-batch = 1\n");
  const DispatchStats stats = h.backend->stats();
  CHECK(stats.fused_calls == 4);
  CHECK(stats.unfused_calls == 2);
  h.backend->reset_stats();
  CHECK(h.backend->stats().fused_calls == 0);
  CHECK_FALSE(h.backend->stats().last_decision[0].has_value());
}

namespace {

// What the stub CUDA kernel set saw; it runs no math, only the stream operations a real
// kernel set would (out zeroed, optionally the commit error flag raised).
struct StubLog {
  VerifyParams verify;
  CommitParams commit;
  int verifies = 0, commits = 0;
  bool raise_error_flag = false;
};

class StubCudaKernelSet final : public KernelSet {
 public:
  explicit StubCudaKernelSet(std::shared_ptr<StubLog> log) : log_(std::move(log)) {}
  const char* name() const override { return "stub cuda"; }
  Device device() const override { return Device::cuda(0); }
  void verify_unfused(const VerifyParams& p, cudaStream_t s) override { verify(p, s); }
  void verify_fused(const VerifyParams& p, int, cudaStream_t s) override { verify(p, s); }
  void extend(const ExtendParams&, cudaStream_t) override {}
  void commit(const CommitParams& p, cudaStream_t s) override {
    log_->commit = p;
    ++log_->commits;
    if (log_->raise_error_flag) {
      REQUIRE(cudaMemsetAsync(p.error_flag, 1, 1, s) == cudaSuccess);
    }
  }

 private:
  void verify(const VerifyParams& p, cudaStream_t s) {
    log_->verify = p;
    ++log_->verifies;
    const size_t bytes = static_cast<size_t>(p.B) * p.T * p.HV * p.V * 2;
    REQUIRE(cudaMemsetAsync(p.out, 0, bytes, s) == cudaSuccess);
  }
  std::shared_ptr<StubLog> log_;
};

std::vector<int32_t> download_ints(const int32_t* device_ptr, int n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  REQUIRE(cudaMemcpy(v.data(), device_ptr, v.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  return v;
}

}  // namespace

TEST_CASE("backend: CUDA index upload, graph capture and the device error flag",
          "[backend][gpu]" KDA_HOST_ONLY) {
  REQUIRE(detect_platform(0).has_device);  // a [gpu] test without a device fails
  auto log = std::make_shared<StubLog>();
  const ModelConfig m = model_for(kGqaCase);
  BackendOptions options;
  options.platform_override = fake_platform(9, 0);
  options.extra_slots = 1;
  KdaAttentionBackend b(m, flags_for(/*ring=*/true), std::make_unique<StubCudaKernelSet>(log),
                        options);
  CHECK(b.device() == Device::cuda(0));
  std::vector<OwnedWeights> host_weights;
  std::vector<Buffer> device_weights;
  for (int layer = 0; layer < kLayers; ++layer) {
    host_weights.push_back(make_weights(m, 200 + layer));
    LayerWeights w;
    auto to_device = [&](const TensorView& v, TensorView& dst) {
      device_weights.emplace_back(Device::cuda(0), v.span_bytes());
      device_weights.back().upload(v.data(), v.span_bytes());
      dst = TensorView::contiguous(device_weights.back().data(), v.dtype(), Device::cuda(0),
                                   v.ndim() == 1 ? std::initializer_list<int64_t>{v.size(0)}
                                                 : std::initializer_list<int64_t>{v.size(0), 4});
    };
    to_device(host_weights.back().views.A_log, w.A_log);
    to_device(host_weights.back().views.dt_bias, w.dt_bias);
    to_device(host_weights.back().views.conv_weight, w.conv_weight);
    to_device(host_weights.back().views.conv_bias, w.conv_bias);
    CHECK_THROWS_WITH(b.set_layer_weights(layer, host_weights.back().views),
                      Catch::Contains("A_log: expected memory on cuda:0, got host"));
    b.set_layer_weights(layer, w);
  }
  for (int i = 0; i < 5; ++i) {
    b.allocate_slot();
  }
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);

  const int64_t N = 3 * kT, D = m.qkv_dim();
  Buffer qkv(Device::cuda(0), N * D * 2), a(Device::cuda(0), N * 256 * 2),
      bb(Device::cuda(0), N * 4 * 2), out(Device::cuda(0), N * 4 * 64 * 2),
      accepted(Device::cuda(0), 3 * 4);
  const VerifyInputs in{qkv.view(DType::kBF16, {N, D}), a.view(DType::kBF16, {N, 256}),
                        bb.view(DType::kBF16, {N, 4})};
  const std::vector<int32_t> lens = {1, 1, kT};
  accepted.upload(lens.data(), 12);

  SECTION("prepare uploads slots and rows; back-to-back prepares do not race the staging") {
    b.prepare({kT, {3, -1, 1}, {2, 0, 1}}, stream);
    b.prepare({kT, {4, 0, -1}, {}}, stream);  // waits for the first copy before rewriting
    b.verify(0, in, out.view(DType::kBF16, {N, 4, 64}), stream);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    CHECK(download_ints(log->verify.slots, kMaxRunning) == std::vector<int32_t>{4, 0, -1, -1});
    CHECK(download_ints(log->verify.rows, kMaxRunning) == std::vector<int32_t>{0, 1, 2, -1});
    CHECK(log->verify.B == 3);
    CHECK(log->verify.mode == RecordMode::kRing);
    CHECK(log->verify.ring_rawv == b.pool().ring_rawv(0).data());
  }
  SECTION("verify and commit are capturable; replays read the latest prepared indices") {
    b.prepare({kT, {0, 1, 2}, {}}, stream);
    cudaGraph_t graph = nullptr;
    REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
    for (int layer = 0; layer < kLayers; ++layer) {
      b.verify(layer, in, out.view(DType::kBF16, {N, 4, 64}), stream);
    }
    b.commit(accepted.view(DType::kI32, {3}), stream);
    REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
    cudaGraphExec_t exec = nullptr;
    REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    b.prepare({kT, {2, 3, 4}, {}}, stream);
    b.record_graph_verify_round();
    REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
    b.commit(accepted.view(DType::kI32, {3}), stream);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    CHECK(download_ints(log->commit.slots, 3) == std::vector<int32_t>{2, 3, 4});
    CHECK(log->commits == 2);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  SECTION("check_device_errors reads and clears the commit flag") {
    b.prepare({kT, {0, 1, 2}, {}}, stream);
    for (int layer = 0; layer < kLayers; ++layer) {
      b.verify(layer, in, out.view(DType::kBF16, {N, 4, 64}), stream);
    }
    log->raise_error_flag = true;
    b.commit(accepted.view(DType::kI32, {3}), stream);
    CHECK_THROWS_WITH(b.check_device_errors(stream),
                      Catch::Contains("an accepted length outside [1, T] was passed"));
    CHECK_NOTHROW(b.check_device_errors(stream));
  }
  cudaStreamDestroy(stream);
}

#ifdef KDA_BACKEND_TEST_CUDA
TEST_CASE("backend: a CUDA-graph replay of every layer's verify gives the eager bits",
          "[backend][gpu]") {
  // Real CUDA kernels: one backend runs each round eagerly, the other replays one captured
  // graph of all layers' verify (inputs re-uploaded into the captured buffers, indices
  // re-prepared) and commits eagerly. Two rounds with different slots; after each, outputs
  // and the whole pool (committed state, rings / snapshots, scratch) must match bitwise.
  const bool ring = GENERATE(true, false);
  CAPTURE(ring);
  Harness eager(kGqaCase, ring, fake_platform(9, 0));
  Harness graphed(kGqaCase, ring, fake_platform(9, 0));
  REQUIRE(pool_checksum(eager.pool()) == pool_checksum(graphed.pool()));
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);

  const std::vector<std::vector<int32_t>> round_slots = {{2, -1, 0}, {4, 1, 3}};
  const std::vector<std::vector<int32_t>> round_accepted = {{3, 1, kT}, {1, kT, 2}};
  std::vector<Activations> acts_e, acts_g;
  for (int layer = 0; layer < kLayers; ++layer) {
    acts_e.push_back(make_activations(eager.model, round_slots[0], kT, 900 + layer));
    acts_g.push_back(make_activations(graphed.model, round_slots[0], kT, 900 + layer));
  }
  // Capture (nothing runs), then drop the round the capture's verify calls opened.
  graphed.backend->prepare({kT, round_slots[0], {}}, stream);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  for (int layer = 0; layer < kLayers; ++layer) {
    graphed.backend->verify(layer, acts_g[static_cast<size_t>(layer)].in,
                            acts_g[static_cast<size_t>(layer)].out_view, stream);
  }
  REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  graphed.backend->abort_round();

  for (size_t round = 0; round < round_slots.size(); ++round) {
    CAPTURE(round);
    const BatchSpec batch{kT, round_slots[round], {}};
    if (round > 0) {  // fresh inputs for both, into the buffers the graph captured
      for (int layer = 0; layer < kLayers; ++layer) {
        const auto seed = 950 + 10 * round + static_cast<uint64_t>(layer);
        Activations fresh = make_activations(eager.model, batch.slots, kT, seed);
        for (auto* a : {&acts_e[static_cast<size_t>(layer)], &acts_g[static_cast<size_t>(layer)]}) {
          a->qkv.upload(bytes_of(fresh.in.mixed_qkv).data(), a->qkv.bytes());
          a->a.upload(bytes_of(fresh.in.a).data(), a->a.bytes());
          a->b.upload(bytes_of(fresh.in.b).data(), a->b.bytes());
        }
      }
    }
    Buffer accepted(kTestDevice, static_cast<int64_t>(round_accepted[round].size()) * 4);
    accepted.upload(round_accepted[round].data(), accepted.bytes());
    const TensorView acc_view = accepted.view(DType::kI32, {3});

    eager.backend->prepare(batch, stream);
    for (int layer = 0; layer < kLayers; ++layer) {
      eager.backend->verify(layer, acts_e[static_cast<size_t>(layer)].in,
                            acts_e[static_cast<size_t>(layer)].out_view, stream);
    }
    eager.backend->commit(acc_view, stream);

    graphed.backend->prepare(batch, stream);
    graphed.backend->record_graph_verify_round();
    REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
    graphed.backend->commit(acc_view, stream);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);

    for (int layer = 0; layer < kLayers; ++layer) {
      CAPTURE(layer);
      CHECK(same_bits(acts_e[static_cast<size_t>(layer)].out_view,
                      acts_g[static_cast<size_t>(layer)].out_view));
    }
    CHECK(same_bits(eager.pool().ssm_state_all(), graphed.pool().ssm_state_all()));
    CHECK(pool_checksum(eager.pool()) == pool_checksum(graphed.pool()));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}
#endif  // KDA_BACKEND_TEST_CUDA
