// backend_engine_memory_test.cc: engine-owned memory (issue 58). Backends whose memory is the
// engine's run the same random rounds as an owning backend and stay bitwise equal to it:
//   - an external pool: every pool tensor handed in (padded slot / row / layer pitches, more
//     slots, rows and steps than configured), used in place; what lies outside the configured
//     extents and in the padding is never written;
//   - an allocator-hooked backend: every byte it owns from a counting Allocator, all of it
//     returned at destruction;
//   - both: the committed state external, the rest from the allocator;
// over dense, ragged and tree rounds in snapshot mode, eager ring mode and (chains) deferred ring
// mode, with padding rows, explicit scratch rows and random accepted lengths / paths. Bad
// external tensors (wrong shape, dtype, stride, pitch, alignment, device, too small, overlapping,
// the wrong mode) each get a kda::Error naming external_pool.<tensor>, allocate nothing and write
// nothing; claim_slot takes the engine's slot numbers (kZero / kKeepState) and refuses taken or
// foreign ones without changing anything.
//
// Runs on the host reference (backend_engine_memory_test, CI) and, linked with
// :backend_fixture_cuda, on the CUDA kernels (backend_engine_memory_cuda_test, GPU host).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/kda_backend.h"
#include "backend/kernel_set_factory.h"
#include "core/allocator.h"
#include "core/cuda_check.h"
#include "core/platform.h"
#include "tests/backend_fixture.h"

using namespace kda;
using namespace kda::testing;

namespace {

// ---- a counting allocator of the test device's memory ----

class CountingAllocator final : public Allocator {
 public:
  void* allocate(int64_t bytes, const Device& device, cudaStream_t /*stream*/) override {
    CHECK(device == kTestDevice);
    if (fail_next) {
      fail_next = false;
      return nullptr;
    }
    void* p = nullptr;
    if (device.is_cuda()) {
      KDA_CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(bytes + misalign)));
    } else {
      p = std::aligned_alloc(256, static_cast<size_t>((bytes + misalign + 255) / 256 * 256));
    }
    p = static_cast<char*>(p) + misalign;
    live[p] = bytes;
    ++allocations;
    return p;
  }
  void deallocate(void* p, int64_t bytes, const Device& device,
                  cudaStream_t /*stream*/) noexcept override {
    const auto it = live.find(p);
    if (it == live.end() || it->second != bytes) {
      ++bad_frees;
    } else {
      live.erase(it);
    }
    void* base = static_cast<char*>(p) - misalign;
    if (device.is_cuda()) {
      cudaFree(base);
    } else {
      std::free(base);
    }
  }
  const char* name() const override { return "test allocator"; }

  int64_t live_bytes() const {
    int64_t n = 0;
    for (const auto& [p, b] : live) {
      n += b;
    }
    return n;
  }

  std::map<void*, int64_t> live;
  int allocations = 0;
  int bad_frees = 0;
  int64_t misalign = 0;  // > 0: hand out misaligned blocks
  bool fail_next = false;
};

// ---- engine-owned pool tensors with padded pitches ----

struct Owned {
  Buffer buf;
  TensorView view;
};

// A tensor of `shape` whose dim `pitch_dim` (the slot / row dim; -1: none) has a padded pitch
// (one 16-byte pad) and whose dim pitch_dim - 1 (layers) one more pad; the dims after pitch_dim
// packed. Every byte of the buffer is `fill` first.
Owned padded(DType dt, std::vector<int64_t> shape, int pitch_dim, uint8_t fill = 0xA5) {
  const int nd = static_cast<int>(shape.size());
  const int64_t pad = 16 / dtype_size(dt);
  std::vector<int64_t> strides(static_cast<size_t>(nd), 1);
  int64_t s = 1;
  for (int d = nd - 1; d >= 0; --d) {
    strides[static_cast<size_t>(d)] = s;
    s *= shape[static_cast<size_t>(d)];
    if (d == pitch_dim || d == pitch_dim - 1) {
      strides[static_cast<size_t>(d)] += d == pitch_dim ? pad : 2 * pad;
      s = strides[static_cast<size_t>(d)] * shape[static_cast<size_t>(d)];
    }
  }
  Owned o{Buffer(kTestDevice, (s + 4 * pad) * dtype_size(dt)), TensorView()};
  const std::vector<uint8_t> bytes(static_cast<size_t>(o.buf.bytes()), fill);
  o.buf.upload(bytes.data(), o.buf.bytes());
  o.view = TensorView::strided(o.buf.data(), dt, kTestDevice, shape.data(), strides.data(), nd);
  return o;
}

struct ExternalPool {
  std::vector<Owned> owned;
  ExternalPoolTensors tensors;
  /// Every byte of every buffer (to check what was and was not written).
  std::vector<std::vector<uint8_t>> snapshot() const {
    std::vector<std::vector<uint8_t>> all;
    for (const Owned& o : owned) {
      std::vector<uint8_t> b(static_cast<size_t>(o.buf.bytes()));
      o.buf.download(b.data(), o.buf.bytes());
      all.push_back(std::move(b));
    }
    return all;
  }
};

// The pool tensors of a backend with `m`, `f` (S = R + 1) as an engine would own them: S + 2 slots,
// R + 1 rows, T_max + 1 steps, padded pitches. `state_only`: conv_state and ssm_state alone.
ExternalPool make_external_pool(const ModelConfig& m, const EngineFlags& f, bool state_only) {
  const int64_t layers = m.num_layers, S = f.max_running_requests + 1 + 2,
                R = f.max_running_requests + 1, T = f.num_draft_tokens + 1;
  const int64_t H = m.H, HV = m.HV, K = m.K, V = m.V, L = f.replayssm_cache_len, D = m.qkv_dim();
  const bool ring = f.replayssm_spec;
  const bool deferred = ring && f.deferred_commit == static_cast<int>(DeferredCommit::kOn);
  ExternalPool e;
  auto add = [&](TensorView ExternalPoolTensors::*field, DType dt, std::vector<int64_t> shape,
                 int pitch_dim) {
    e.owned.push_back(padded(dt, std::move(shape), pitch_dim));
    e.tensors.*field = e.owned.back().view;
  };
  add(&ExternalPoolTensors::conv_state, DType::kBF16, {layers, S, 3, D}, 1);
  add(&ExternalPoolTensors::ssm_state, DType::kF32, {layers, S, HV, V, K}, 1);
  if (state_only) {
    return e;
  }
  add(&ExternalPoolTensors::conv_window, DType::kBF16, {layers, R, T, 3, D}, 1);
  add(&ExternalPoolTensors::qkv_act, DType::kBF16, {R * T + 3, D}, -1);
  if (ring) {
    add(&ExternalPoolTensors::ring_rawv, DType::kBF16, {layers, S, HV, L, V}, 1);
    add(&ExternalPoolTensors::ring_rawk, DType::kBF16, {layers, S, H, L, K}, 1);
    add(&ExternalPoolTensors::ring_g, DType::kF32, {layers, S, HV, L, K}, 1);
    add(&ExternalPoolTensors::ring_beta, DType::kF32, {layers, S, HV, L}, 1);
    add(&ExternalPoolTensors::ring_cursor, DType::kI32, {S}, -1);
    add(&ExternalPoolTensors::ring_pending, DType::kI32, {layers, S}, -1);
    if (deferred) {
      add(&ExternalPoolTensors::ring_u, DType::kF32, {layers, S, HV, L, V}, 1);
    }
  } else {
    add(&ExternalPoolTensors::snapshots, DType::kF32, {layers, R, T, HV, V, K}, 1);
  }
  return e;
}

// ---- random rounds on several backends at once ----

// The pool tensors the rounds compare (qkv_act, the unfused path's hand-over, is covered by the
// outputs).
std::vector<std::pair<const char*, TensorView>> compared(const KdaStatePool& p) {
  return {{"conv_state", p.conv_state_all()},
          {"ssm_state", p.ssm_state_all()},
          {"conv_window", p.conv_window_all()},
          {"snapshots", p.snapshots_all()},
          {"ring_rawv", p.ring_rawv_all()},
          {"ring_rawk", p.ring_rawk_all()},
          {"ring_g", p.ring_g_all()},
          {"ring_beta", p.ring_beta_all()},
          {"ring_cursor", p.ring_cursor()},
          {"ring_pending", p.ring_pending_all()},
          {"ring_u", p.ring_u_all()}};
}

// The engine's own tensors, read through its own views (its strides, its first S slots / R rows /
// T_max steps), against the reference backend's pool: the state lands where the engine keeps it.
void check_engine_views(const Harness& ref, const ExternalPool& e, const char* who) {
  const KdaStatePool& p = ref.pool();
  const PoolConfig& c = p.config();
  const std::pair<const char*, const TensorView*> views[] = {
      {"conv_state", &e.tensors.conv_state},
      {"ssm_state", &e.tensors.ssm_state},
      {"conv_window", &e.tensors.conv_window},
      {"snapshots", &e.tensors.snapshots},
      {"ring_rawv", &e.tensors.ring_rawv},
      {"ring_rawk", &e.tensors.ring_rawk},
      {"ring_g", &e.tensors.ring_g},
      {"ring_beta", &e.tensors.ring_beta},
      {"ring_cursor", &e.tensors.ring_cursor},
      {"ring_pending", &e.tensors.ring_pending},
      {"ring_u", &e.tensors.ring_u}};
  const auto want = compared(p);
  for (size_t i = 0; i < std::size(views); ++i) {
    const TensorView& t = *views[i].second;
    if (!t.defined()) {
      continue;
    }
    CAPTURE(who, views[i].first);
    TensorView mine = t;
    if (t.ndim() == 1) {
      mine = t.narrow(0, 0, c.num_slots);
    } else if (std::strcmp(views[i].first, "conv_window") == 0 ||
               std::strcmp(views[i].first, "snapshots") == 0) {
      mine = t.narrow(1, 0, c.num_rows).narrow(2, 0, c.T_max);
    } else {
      mine = t.narrow(1, 0, c.num_slots);
    }
    CHECK(packed_bytes(mine) == packed_bytes(want[i].second));
  }
}

void check_same_pool(const Harness& ref, const Harness& other, const char* who) {
  const auto a = compared(ref.pool()), b = compared(other.pool());
  for (size_t i = 0; i < a.size(); ++i) {
    CAPTURE(who, a[i].first);
    CHECK(a[i].second.defined() == b[i].second.defined());
    CHECK(packed_bytes(a[i].second) == packed_bytes(b[i].second));
  }
}

struct Round {
  BatchSpec batch;
  std::vector<int32_t> accepted;
  std::vector<int32_t> paths;  // tree: [B, T]
  int64_t N = 0;
};

// A random round: 1..R requests on random slots of [0, S) (sometimes a padding row, sometimes
// explicit scratch rows), T in 1..T_max, dense or ragged chains (trees with topk > 1), random
// accepted lengths or root paths.
Round random_round(std::mt19937& rng, const EngineFlags& f, int S) {
  const int R = f.max_running_requests;
  const bool tree = f.tree_drafts();
  Round r;
  const int B = 1 + static_cast<int>(rng() % static_cast<unsigned>(R));
  std::vector<int32_t> slots(static_cast<size_t>(S));
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(static_cast<size_t>(B));
  if (B > 1 && rng() % 4 == 0) {
    slots[rng() % static_cast<unsigned>(B)] = -1;
  }
  std::vector<int32_t> rows;
  if (rng() % 2 == 0) {
    rows.resize(static_cast<size_t>(R));
    std::iota(rows.begin(), rows.end(), 0);
    std::shuffle(rows.begin(), rows.end(), rng);
    rows.resize(static_cast<size_t>(B));
  }
  const int T_max = f.num_draft_tokens;
  const int T = tree ? 2 + static_cast<int>(rng() % static_cast<unsigned>(T_max - 1))
                     : 1 + static_cast<int>(rng() % static_cast<unsigned>(T_max));
  r.batch = BatchSpec(T, slots, rows);
  r.N = int64_t{B} * T;
  if (tree) {
    for (int n = 0; n < B; ++n) {
      const std::vector<int32_t> par = random_tree(rng, T, f.eagle_topk);
      r.batch.parents.insert(r.batch.parents.end(), par.begin(), par.end());
      // A root path: a random node and its ancestors, root first.
      std::vector<int32_t> path;
      for (int j = static_cast<int>(rng() % static_cast<unsigned>(T)); j >= 0;
           j = par[static_cast<size_t>(j)]) {
        path.insert(path.begin(), j);
      }
      r.accepted.push_back(static_cast<int32_t>(path.size()));
      path.resize(static_cast<size_t>(T), 0);
      r.paths.insert(r.paths.end(), path.begin(), path.end());
    }
    return r;
  }
  const bool ragged = rng() % 2 == 0;
  r.N = 0;
  for (int n = 0; n < B; ++n) {
    const int len = ragged ? 1 + static_cast<int>(rng() % static_cast<unsigned>(T)) : T;
    if (ragged) {
      r.batch.lengths.push_back(len);
    }
    r.N += len;
    r.accepted.push_back(1 + static_cast<int32_t>(rng() % static_cast<unsigned>(len)));
  }
  return r;
}

// Runs `r` on every harness (same inputs), checks the outputs against harness 0's, commits.
void run_round(std::vector<Harness*>& hs, const Round& r, uint64_t seed) {
  const BatchSpec& batch = r.batch;
  // Ragged rows are packed: no padding-request rows to fill with NaN by position.
  const std::vector<int32_t> nan_slots =
      batch.lengths.empty() ? batch.slots : std::vector<int32_t>(batch.slots.size(), 0);
  std::vector<Activations> x;
  for (int layer = 0; layer < kLayers; ++layer) {
    x.push_back(make_activations(hs[0]->model, nan_slots, batch.T, seed * 10 + layer));
  }
  const std::vector<uint8_t> garbage = bytes_of(x[0].out_view);
  std::vector<std::vector<std::vector<uint8_t>>> outs(hs.size());
  for (size_t i = 0; i < hs.size(); ++i) {
    hs[i]->backend->prepare(batch, nullptr);
    for (int layer = 0; layer < kLayers; ++layer) {
      const Activations& a = x[static_cast<size_t>(layer)];
      Buffer out(kTestDevice, a.out.bytes());
      out.upload(garbage.data(), out.bytes());
      const TensorView o = out.view(DType::kBF16, {r.N, a.out_view.size(1), a.out_view.size(2)});
      VerifyInputs in{a.in.mixed_qkv.narrow(0, 0, r.N), a.in.a.narrow(0, 0, r.N),
                      a.in.b.narrow(0, 0, r.N)};
      hs[i]->backend->verify(layer, in, o, nullptr);
      outs[i].push_back(bytes_of(o));
    }
    const Buffer acc = device_i32(r.accepted);
    const TensorView acc_view = acc.view(DType::kI32, {static_cast<int64_t>(r.accepted.size())});
    if (!batch.parents.empty()) {
      const Buffer paths = device_i32(r.paths);
      hs[i]->backend->commit_tree(
          acc_view,
          paths.view(DType::kI32, {static_cast<int64_t>(batch.slots.size()), int64_t{batch.T}}),
          nullptr);
    } else {
      hs[i]->backend->commit(acc_view, nullptr);
    }
    hs[i]->backend->check_device_errors(nullptr);
  }
  for (size_t i = 1; i < hs.size(); ++i) {
    CAPTURE(i);
    CHECK(outs[i] == outs[0]);
  }
}

// Which bytes of `buf` the view covers (its elements).
std::vector<uint8_t> coverage(const Buffer& buf, const TensorView& v) {
  std::vector<uint8_t> mask(static_cast<size_t>(buf.bytes()), 0);
  const int64_t esize = dtype_size(v.dtype());
  const int64_t base = static_cast<const char*>(v.data()) - static_cast<const char*>(buf.data());
  std::vector<int64_t> idx(static_cast<size_t>(v.ndim()), 0);
  for (int64_t i = 0; i < v.numel(); ++i) {
    int64_t off = 0;
    for (int d = 0; d < v.ndim(); ++d) {
      off += idx[static_cast<size_t>(d)] * v.stride(d);
    }
    std::fill_n(mask.begin() + base + off * esize, esize, uint8_t{1});
    for (int d = v.ndim() - 1; d >= 0; --d) {
      if (++idx[static_cast<size_t>(d)] < v.size(d)) {
        break;
      }
      idx[static_cast<size_t>(d)] = 0;
    }
  }
  return mask;
}

// The external buffers' bytes outside the pool's views (padding, spare slots, rows and steps)
// still hold the engine's fill.
void check_untouched(const ExternalPool& e, const KdaStatePool& pool) {
  std::vector<std::pair<const char*, TensorView>> views = compared(pool);
  views.emplace_back("qkv_act", pool.qkv_act());
  const auto bytes = e.snapshot();
  for (size_t b = 0; b < e.owned.size(); ++b) {
    const Buffer& buf = e.owned[b].buf;
    std::vector<uint8_t> covered(static_cast<size_t>(buf.bytes()), 0);
    const char* lo = static_cast<const char*>(buf.data());
    for (const auto& [name, v] : views) {
      const char* p = static_cast<const char*>(v.data());
      if (v.defined() && p >= lo && p < lo + buf.bytes()) {
        const auto m = coverage(buf, v);
        for (size_t i = 0; i < m.size(); ++i) {
          covered[i] |= m[i];
        }
      }
    }
    int64_t written = 0;
    for (size_t i = 0; i < covered.size(); ++i) {
      written += covered[i] == 0 && bytes[b][i] != 0xA5 ? 1 : 0;
    }
    CAPTURE(b);
    CHECK(written == 0);
  }
}

struct ModeCase {
  const char* name;
  bool ring, deferred;
  int topk;
};

EngineFlags flags_of(const ModeCase& c) {
  EngineFlags f = flags_for(c.ring, c.deferred);
  f.eagle_topk = c.topk;
  f.fused_ring_max_batch = 2;  // both paths in ring mode (B = 1..4)
  return f;
}

}  // namespace

TEST_CASE("engine memory: external-pool and allocator-hooked backends equal the owning one",
          "[backend][engine_memory]") {
  const ModeCase c = GENERATE(values<ModeCase>({{"snapshot, chains", false, false, 1},
                                                {"ring eager, chains", true, false, 1},
                                                {"ring deferred, chains", true, true, 1},
                                                {"snapshot, trees", false, false, 2},
                                                {"ring eager, trees", true, false, 2}}));
  CAPTURE(c.name);
  const ModelConfig m = model_for(kGqaCase);
  const EngineFlags f = flags_of(c);
  const Platform platform = fake_platform(9, 0);
  auto allocator = std::make_shared<CountingAllocator>();
  {
    ExternalPool all = make_external_pool(m, f, /*state_only=*/false);
    ExternalPool state = make_external_pool(m, f, /*state_only=*/true);
    BackendOptions external, hooked, both;
    external.external_pool = all.tensors;
    hooked.allocator = allocator;
    both.allocator = allocator;
    both.external_pool = state.tensors;
    Harness owning(m, f, platform);
    Harness ext(m, f, platform, external);
    Harness alloc(m, f, platform, hooked);
    Harness mixed(m, f, platform, both);
    REQUIRE(ext.backend->memory_report().allocated_bytes == 0);
    REQUIRE(ext.backend->memory_report().external_bytes ==
            ext.backend->memory_report().total_bytes);
    REQUIRE(alloc.backend->memory_report().from_allocator);
    REQUIRE(alloc.backend->memory_report().allocated_bytes ==
            alloc.backend->memory_report().total_bytes);
    REQUIRE(mixed.backend->memory_report().external_bytes +
                mixed.backend->memory_report().allocated_bytes ==
            mixed.backend->memory_report().total_bytes);
    // Every byte the two hooked backends own is live in the allocator.
    REQUIRE(allocator->live_bytes() ==
            alloc.backend->memory_report().allocated_bytes + alloc.backend->workspace_bytes() +
                mixed.backend->memory_report().allocated_bytes + mixed.backend->workspace_bytes());
    std::vector<Harness*> hs = {&owning, &ext, &alloc, &mixed};
    for (Harness* h : hs) {
      h->fill_scratch(3);
    }
    std::mt19937 rng(58);
    const int S = owning.pool().num_slots();
    for (int round = 0; round < 12; ++round) {
      CAPTURE(round);
      const Round r = random_round(rng, f, S);
      CAPTURE(r.batch.T, r.batch.slots, r.batch.rows, r.batch.lengths, r.accepted);
      run_round(hs, r, 100 + static_cast<uint64_t>(round));
      check_same_pool(owning, ext, "external");
      check_same_pool(owning, alloc, "allocator");
      check_same_pool(owning, mixed, "external state + allocator");
      check_engine_views(owning, all, "external");
      check_engine_views(owning, state, "external state + allocator");
    }
    if (c.deferred) {
      std::vector<int32_t> every(static_cast<size_t>(S));
      std::iota(every.begin(), every.end(), 0);
      for (Harness* h : hs) {
        h->backend->materialize(every, nullptr);
      }
      check_same_pool(owning, ext, "external, materialized");
      check_same_pool(owning, mixed, "external state + allocator, materialized");
      check_engine_views(owning, all, "external, materialized");
      check_engine_views(owning, state, "external state + allocator, materialized");
    }
    check_untouched(all, ext.pool());
    check_untouched(state, mixed.pool());
  }
  // Destroyed: every block went back, each with its own size.
  CHECK(allocator->live.empty());
  CHECK(allocator->bad_frees == 0);
  CHECK(allocator->allocations > 0);
}

TEST_CASE("engine memory: bad external tensors are named, allocate and write nothing",
          "[backend][engine_memory]" KDA_HOST_ONLY) {
  const ModelConfig m = model_for(kGqaCase);
  struct Bad {
    const char* what;
    bool ring;
    std::function<void(ExternalPool&)> spoil;
    const char* needle;
  };
  const std::vector<Bad> cases = {
      {"wrong shape (heads)", false,
       [](ExternalPool& e) {
         const TensorView& t = e.tensors.ssm_state;
         e.tensors.ssm_state = TensorView(t.data(), DType::kF32, kTestDevice,
                                          {t.size(0), t.size(1), t.size(2) - 1, 64, 64},
                                          {t.stride(0), t.stride(1), 64 * 64, 64, 1});
       },
       "external_pool.ssm_state: expected shape [2, >= 5, 4, 64, 64], got [2, 7, 3, 64, 64]"},
      {"too small (slots)", false,
       [](ExternalPool& e) { e.tensors.conv_state = e.tensors.conv_state.narrow(1, 0, 4); },
       "external_pool.conv_state: expected shape [2, >= 5, 3, 512], got [2, 4, 3, 512]"},
      {"too small (ring length)", true,
       [](ExternalPool& e) { e.tensors.ring_g = e.tensors.ring_g.narrow(3, 0, 4); },
       "external_pool.ring_g: expected shape [2, >= 5, 4, 8, 64], got [2, 7, 4, 4, 64]"},
      {"wrong dtype", false,
       [](ExternalPool& e) {
         const TensorView& t = e.tensors.conv_window;
         e.tensors.conv_window = TensorView(t.data(), DType::kF32, kTestDevice,
                                            {t.size(0), t.size(1), t.size(2), 3, 512},
                                            {t.stride(0), t.stride(1), t.stride(2), 512, 1});
       },
       "external_pool.conv_window: expected dtype bf16, got f32"},
      {"inner stride", true,
       [](ExternalPool& e) {
         const TensorView& t = e.tensors.ring_rawv;
         e.tensors.ring_rawv = TensorView(t.data(), DType::kBF16, kTestDevice, {2, 5, 4, 8, 32},
                                          {t.stride(0), t.stride(1), 8 * 64, 64, 2});
       },
       "external_pool.ring_rawv: expected shape [2, >= 5, 4, 8, 64], got [2, 5, 4, 8, 32]"},
      {"not packed", true,
       [](ExternalPool& e) {
         const TensorView& t = e.tensors.ring_beta;
         e.tensors.ring_beta = TensorView(t.data(), DType::kF32, kTestDevice, {2, 5, 4, 8},
                                          {t.stride(0), t.stride(1), 16, 2});
       },
       "external_pool.ring_beta: dim 3 has stride 2, expected 1"},
      {"slot pitch", false,
       [](ExternalPool& e) {
         const TensorView& t = e.tensors.ssm_state;
         e.tensors.ssm_state = TensorView(t.data(), DType::kF32, kTestDevice, {2, 5, 4, 64, 64},
                                          {t.stride(0), 4 * 64 * 64 - 4, 64 * 64, 64, 1});
       },
       "external_pool.ssm_state: slot pitch stride(1) = 16380 is smaller than one packed slot"},
      {"layer pitch", true,
       [](ExternalPool& e) {
         const TensorView& t = e.tensors.ring_rawk;
         e.tensors.ring_rawk = TensorView(t.data(), DType::kBF16, kTestDevice, {2, 5, 2, 8, 64},
                                          {4 * t.stride(1), t.stride(1), 8 * 64, 64, 1});
       },
       "external_pool.ring_rawk: layer pitch stride(0)"},
      {"pitch alignment", false,
       [](ExternalPool& e) {
         const TensorView& t = e.tensors.ssm_state;
         e.tensors.ssm_state = TensorView(t.data(), DType::kF32, kTestDevice, {2, 5, 4, 64, 64},
                                          {5 * (4 * 64 * 64 + 2), 4 * 64 * 64 + 2, 64 * 64, 64, 1});
       },
       "external_pool.ssm_state: stride(0) = 81930 elements is not a multiple of 16 bytes"},
      {"data alignment", false,
       [](ExternalPool& e) {
         const TensorView& t = e.tensors.ssm_state;
         e.tensors.ssm_state =
             TensorView(static_cast<char*>(t.data()) + 4, DType::kF32, kTestDevice,
                        {2, 5, 4, 64, 64}, {t.stride(0), t.stride(1), 64 * 64, 64, 1});
       },
       "external_pool.ssm_state: expected data aligned to 16 bytes"},
      {"device", false,
       [](ExternalPool& e) {
         const TensorView& t = e.tensors.conv_state;
         const Device other = kTestDevice.is_cuda() ? Device::host() : Device::cuda(0);
         e.tensors.conv_state = TensorView(t.data(), DType::kBF16, other, {2, 5, 3, 512},
                                           {t.stride(0), t.stride(1), 512, 1});
       },
       kTestDevice.is_cuda() ? "external_pool.conv_state: expected memory on cuda:0"
                             : "external_pool.conv_state: expected memory on host (the pool's "
                               "device), got cuda:0"},
      {"overlapping", false,
       [](ExternalPool& e) {
         // conv_window over conv_state's bytes.
         const TensorView& t = e.tensors.conv_window;
         e.tensors.conv_window = TensorView(e.tensors.conv_state.data(), DType::kBF16, kTestDevice,
                                            {t.size(0), t.size(1), t.size(2), 3, 512},
                                            {t.stride(0), t.stride(1), t.stride(2), 512, 1});
       },
       "external_pool.conv_window: its bytes"},
      {"the other mode's tensor", true,
       [](ExternalPool& e) {
         e.tensors.snapshots = e.tensors.ring_g;  // ring mode has no snapshots
       },
       "external_pool.snapshots: given, but it is snapshot mode only"},
      {"deferred tensor on an eager pool", true,
       [](ExternalPool& e) { e.tensors.ring_u = e.tensors.ring_g; },
       "external_pool.ring_u: given, but it is ring mode with the deferred commit only"},
  };
  for (const Bad& bad : cases) {
    CAPTURE(bad.what);
    const EngineFlags f = flags_for(bad.ring, false);
    ExternalPool e = make_external_pool(m, f, /*state_only=*/false);
    bad.spoil(e);
    const auto before = e.snapshot();
    auto allocator = std::make_shared<CountingAllocator>();
    BackendOptions o;
    o.allocator = allocator;
    o.external_pool = e.tensors;
    o.extra_slots = 1;
    const std::string msg =
        error_of([&] { KdaAttentionBackend(m, f, make_kernel_set(kTestDevice), o); },
                 ErrorCode::kInvalidArgument);
    CHECK_THAT(msg, Catch::Contains(bad.needle));
    CHECK(allocator->allocations == 0);  // validated before anything was allocated
    CHECK(e.snapshot() == before);       // and nothing written
  }
}

TEST_CASE("engine memory: the allocator's failures are reported and leak nothing",
          "[backend][engine_memory]") {
  const ModelConfig m = model_for(kGqaCase);
  const EngineFlags f = flags_for(true, true);
  for (const bool misaligned : {false, true}) {
    CAPTURE(misaligned);
    auto allocator = std::make_shared<CountingAllocator>();
    allocator->misalign = misaligned ? 64 : 0;
    allocator->fail_next = !misaligned;
    BackendOptions o;
    o.allocator = allocator;
    const std::string msg =
        error_of([&] { KdaAttentionBackend(m, f, make_kernel_set(kTestDevice), o); },
                 misaligned ? ErrorCode::kInvalidArgument : ErrorCode::kOutOfMemory);
    CHECK_THAT(msg, Catch::Contains(misaligned ? "the test allocator returned address"
                                               : "the test allocator returned no memory"));
    CHECK(allocator->live.empty());
    CHECK(allocator->bad_frees == 0);
  }
}

TEST_CASE("engine memory: claim_slot takes the engine's slot numbers", "[backend][engine_memory]") {
  const ModelConfig m = model_for(kGqaCase);
  const EngineFlags f = flags_for(true, true);
  ExternalPool e = make_external_pool(m, f, /*state_only=*/false);
  BackendOptions o;
  o.external_pool = e.tensors;
  o.extra_slots = 1;
  KdaAttentionBackend be(m, f, make_kernel_set(kTestDevice), o);
  const KdaStatePool& pool = be.pool();
  // The engine prefilled slot 3 itself (its own kernel): distinct values in its state.
  std::vector<float> state(static_cast<size_t>(pool.ssm_state(0).select(0, 3).numel()), 0.25f);
  from_host_vector(state, pool.ssm_state(0).select(0, 3));
  be.claim_slot(3, SlotInit::kKeepState, nullptr);
  be.claim_slot(1, SlotInit::kZero, nullptr);
  CHECK(pool.is_slot_allocated(3));
  CHECK(pool.is_slot_allocated(1));
  CHECK(pool.num_free_slots() == pool.num_slots() - 2);
  CHECK(to_host_vector<float>(pool.ssm_state(0).select(0, 3)) == state);
  const auto zero = to_host_vector<float>(pool.ssm_state(1).select(0, 1));
  CHECK(std::all_of(zero.begin(), zero.end(), [](float x) { return x == 0.0f; }));
  CHECK(to_host_vector<int32_t>(pool.ring_pending(0))[3] == 0);
  CHECK(to_host_vector<int32_t>(pool.ring_cursor())[3] == 0);
  // allocate_slot hands out the others, lowest first.
  CHECK(be.allocate_slot() == 0);
  CHECK(be.allocate_slot() == 2);
  // Taken, foreign: named, nothing changes.
  const uint64_t before = pool_checksum(pool);
  const int free_before = pool.num_free_slots();
  CHECK_THAT(
      error_of([&] { be.claim_slot(3, SlotInit::kZero, nullptr); }, ErrorCode::kInvalidArgument),
      Catch::Contains("claim_slot: slot 3 is already allocated"));
  CHECK_THAT(
      error_of([&] { be.claim_slot(7, SlotInit::kZero, nullptr); }, ErrorCode::kInvalidArgument),
      Catch::Contains("claim_slot: slot 7 is not a slot of this pool (expected in [0, 5))"));
  CHECK_THAT(error_of([&] { be.claim_slot(4, static_cast<SlotInit>(9), nullptr); },
                      ErrorCode::kInvalidArgument),
             Catch::Contains("claim_slot: init = 9 unknown"));
  CHECK(pool_checksum(pool) == before);
  CHECK(pool.num_free_slots() == free_before);
  CHECK_FALSE(pool.is_slot_allocated(4));
  // Released, it can be claimed again.
  be.release_slot(3);
  be.claim_slot(3, SlotInit::kZero, nullptr);
  const auto zeroed = to_host_vector<float>(pool.ssm_state(0).select(0, 3));
  CHECK(std::all_of(zeroed.begin(), zeroed.end(), [](float x) { return x == 0.0f; }));
}
