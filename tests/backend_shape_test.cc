// backend_shape_test.cc: ragged and tree drafts (contract §8) through the backend, bitwise
// against the dense chain:
//  - a ragged batch whose lengths are all T is the dense batch (every pool tensor, every output);
//  - each request of a ragged batch is a dense verify of that request alone with T = T_n, and
//    a ragged round writes nothing of a request at steps >= T_n (scratch and rings start as
//    random garbage and are compared whole);
//  - a tree whose parents form a chain is the chain; every node of a random tree is the last
//    step of a chain verify along its root path (output, window, snapshot, ring records), and a
//    commit along any root path is that chain's commit;
//  - ring-mode tree commits equal snapshot-mode tree commits;
//  - ragged rounds under the deferred commit equal eager ones after materialize;
//  - every bad draft shape throws kda::Error naming it, and bad lengths / paths read on the
//    device are reported by check_device_errors; nothing changes either way.
//
// Runs on the host reference (backend_shape_test, CI) and, linked with :backend_fixture_cuda, on
// the CUDA kernels (backend_shape_cuda_test, GPU host).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <random>
#include <vector>

#include "backend/kda_backend.h"
#include "core/platform.h"
#include "tests/backend_fixture.h"
#ifdef KDA_BACKEND_TEST_CUDA
#include "kernels/common/launch_utils.h"
#endif

using namespace kda;
using namespace kda::testing;

namespace {

constexpr int kTreeT = 8;  // tree tests: --speculative-num-draft-tokens 8, topk 3

EngineFlags shape_flags(bool ring, int T, int topk, bool deferred = false) {
  EngineFlags f = flags_for(ring, deferred);
  f.num_draft_tokens = T;
  f.replayssm_cache_len = 2 * T;
  f.eagle_topk = topk;
  return f;
}

// One layer's token inputs on the host, N rows (qkv rows of pitch D).
struct HostRows {
  std::vector<bf16_t> qkv, a, b;
  int64_t N = 0;
};

HostRows random_rows(const ModelConfig& m, int64_t N, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const auto fill = [&](int64_t n, float scale) {
    std::vector<bf16_t> v(static_cast<size_t>(n));
    for (bf16_t& x : v) {
      x = float_to_bf16(scale * dist(rng));
    }
    return v;
  };
  HostRows r;
  r.N = N;
  r.qkv = fill(N * m.qkv_dim(), 0.5f);
  r.a = fill(N * m.HV * m.K, 0.5f);
  r.b = fill(N * m.HV, 1.0f);
  return r;
}

// Activations whose row i is row pick[i] of `src` (output garbage-filled, never zeros).
struct Acts {
  Buffer qkv, a, b, out;
  VerifyInputs in;
  TensorView out_view;
};

Acts upload_rows(const ModelConfig& m, const HostRows& src, const std::vector<int64_t>& pick,
                 uint64_t seed) {
  const int64_t N = static_cast<int64_t>(pick.size()), D = m.qkv_dim();
  const int64_t HVK = int64_t{m.HV} * m.K, out_row = int64_t{m.HV} * m.V;
  std::vector<bf16_t> qkv, a, b;
  for (const int64_t r : pick) {
    qkv.insert(qkv.end(), src.qkv.begin() + r * D, src.qkv.begin() + (r + 1) * D);
    a.insert(a.end(), src.a.begin() + r * HVK, src.a.begin() + (r + 1) * HVK);
    b.insert(b.end(), src.b.begin() + r * m.HV, src.b.begin() + (r + 1) * m.HV);
  }
  Acts x{Buffer(kTestDevice, N * D * 2),
         Buffer(kTestDevice, N * HVK * 2),
         Buffer(kTestDevice, N * m.HV * 2),
         Buffer(kTestDevice, N * out_row * 2),
         VerifyInputs{},
         TensorView{}};
  x.qkv.upload(qkv.data(), x.qkv.bytes());
  x.a.upload(a.data(), x.a.bytes());
  x.b.upload(b.data(), x.b.bytes());
  std::mt19937_64 rng(seed);
  std::vector<bf16_t> garbage(static_cast<size_t>(N * out_row));
  for (bf16_t& g : garbage) {
    g = float_to_bf16(1.0f + static_cast<float>(rng() % 1000) / 100.0f);
  }
  x.out.upload(garbage.data(), x.out.bytes());
  x.in.mixed_qkv = x.qkv.view(DType::kBF16, {N, D});
  x.in.a = x.a.view(DType::kBF16, {N, HVK});
  x.in.b = x.b.view(DType::kBF16, {N, m.HV});
  x.out_view = x.out.view(DType::kBF16, {N, m.HV, m.V});
  return x;
}

std::vector<int64_t> iota_rows(int64_t first, int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    v[static_cast<size_t>(i)] = first + i;
  }
  return v;
}

// prepare + verify of every layer with rows `pick` of each layer's inputs.
std::vector<Acts> verify_rows(Harness& h, const BatchSpec& batch,
                              const std::vector<HostRows>& inputs,
                              const std::vector<int64_t>& pick) {
  h.backend->prepare(batch, nullptr);
  std::vector<Acts> acts;
  for (int layer = 0; layer < kLayers; ++layer) {
    acts.push_back(upload_rows(h.model, inputs[static_cast<size_t>(layer)], pick, 77 + layer));
    h.backend->verify(layer, acts.back().in, acts.back().out_view, nullptr);
  }
  return acts;
}

std::vector<HostRows> layer_inputs(const ModelConfig& m, int64_t N, uint64_t seed) {
  std::vector<HostRows> v;
  for (int layer = 0; layer < kLayers; ++layer) {
    v.push_back(random_rows(m, N, seed * 31 + layer));
  }
  return v;
}

void commit_tree(Harness& h, const std::vector<int32_t>& accepted,
                 const std::vector<int32_t>& paths) {
  Buffer acc = device_i32(accepted), path = device_i32(paths);
  const int64_t B = static_cast<int64_t>(accepted.size());
  h.backend->commit_tree(acc.view(DType::kI32, {B}),
                         path.view(DType::kI32, {B, static_cast<int64_t>(paths.size()) / B}),
                         nullptr);
}

// Bytes of a [.., steps, ...] scratch row's steps [first, first + n).
std::vector<uint8_t> steps_of(const TensorView& row, int first, int n) {
  return bytes_of(row.narrow(0, first, n));
}

// Ring record `pos` of every head of `slot` (bytes_of reads a contiguous view: one per head).
std::vector<uint8_t> ring_at(const TensorView& ring, int slot, int pos) {
  std::vector<uint8_t> all;
  for (int64_t head = 0; head < ring.size(1); ++head) {
    const auto b = bytes_of(ring.select(0, slot).select(0, head).select(0, pos));
    all.insert(all.end(), b.begin(), b.end());
  }
  return all;
}

std::vector<TensorView> rings_of(const KdaStatePool& p, int layer) {
  return {p.ring_rawv(layer), p.ring_rawk(layer), p.ring_g(layer), p.ring_beta(layer)};
}

// Every node's root path, root first.
std::vector<int32_t> root_path(const std::vector<int32_t>& parents, int base, int node) {
  std::vector<int32_t> path;
  for (int j = node; j >= 0; j = parents[static_cast<size_t>(base + j)]) {
    path.push_back(j);
  }
  std::reverse(path.begin(), path.end());
  return path;
}

}  // namespace

TEST_CASE("ragged: lengths all T is the dense batch, bitwise", "[shape]") {
  for (const bool ring : {false, true}) {
    CAPTURE(ring);
    Harness dense(kGqaCase, ring, fake_platform(9, 0));
    Harness ragged(kGqaCase, ring, fake_platform(9, 0));
    dense.fill_scratch(5);
    ragged.fill_scratch(5);
    BatchSpec batch(kT, {3, -1, 0, 2});
    const auto inputs = layer_inputs(dense.model, 4 * kT, 11);
    const auto pick = iota_rows(0, 4 * kT);
    const auto a = verify_rows(dense, batch, inputs, pick);
    batch.lengths = {kT, kT, kT, kT};
    const auto b = verify_rows(ragged, batch, inputs, pick);
    for (int layer = 0; layer < kLayers; ++layer) {
      CHECK(same_bits(a[static_cast<size_t>(layer)].out_view,
                      bytes_of(b[static_cast<size_t>(layer)].out_view)));
    }
    CHECK(pool_checksum(dense.pool()) == pool_checksum(ragged.pool()));
    commit(dense, {2, 1, 4, 3});
    commit(ragged, {2, 1, 4, 3});
    CHECK(pool_checksum(dense.pool()) == pool_checksum(ragged.pool()));
  }
}

TEST_CASE("ragged: each request is its own dense verify; nothing past T_n is written", "[shape]") {
  for (const bool ring : {false, true}) {
    for (const bool fused : {true, false}) {
      CAPTURE(ring, fused);
      EngineFlags f = shape_flags(ring, kT, 1);
      f.fused_verify = fused;
      f.fused_ring_max_batch = 64;
      Harness ragged(kGqaCase, f, fake_platform(9, 0));
      Harness single(kGqaCase, f, fake_platform(9, 0));
      ragged.fill_scratch(9);
      single.fill_scratch(9);
      // Reversed, non-contiguous slots, explicit rows, a padding request.
      BatchSpec batch(kT, {4, 2, -1, 0}, {3, 0, 2, 1});
      batch.lengths = {1, 3, 2, 4};
      const int64_t N = 1 + 3 + 2 + 4;
      const std::vector<int32_t> first = {0, 1, 4, 6};
      const auto inputs = layer_inputs(ragged.model, N, 21);
      const auto r = verify_rows(ragged, batch, inputs, iota_rows(0, N));
      for (size_t i = 0; i < batch.slots.size(); ++i) {
        const int32_t slot = batch.slots[i], row = batch.rows[i], len = batch.lengths[i];
        CAPTURE(i, slot, len);
        if (slot < 0) {
          for (int layer = 0; layer < kLayers; ++layer) {
            // Padding: its T_n rows are zeroed.
            const auto out = to_host_vector<bf16_t>(
                r[static_cast<size_t>(layer)].out_view.narrow(0, first[i], len));
            CHECK(std::all_of(out.begin(), out.end(), [](bf16_t x) { return x.bits == 0; }));
          }
          continue;
        }
        // The same request alone, dense with T = T_n, in a fresh copy of the pool.
        Harness alone(kGqaCase, f, fake_platform(9, 0));
        alone.fill_scratch(9);
        const auto s =
            verify_rows(alone, BatchSpec(len, {slot}, {row}), inputs, iota_rows(first[i], len));
        for (int layer = 0; layer < kLayers; ++layer) {
          CAPTURE(layer);
          CHECK(same_bits(r[static_cast<size_t>(layer)].out_view.narrow(0, first[i], len),
                          bytes_of(s[static_cast<size_t>(layer)].out_view)));
          // Steps < T_n equal the dense verify's; steps >= T_n keep their garbage.
          const TensorView w = ragged.pool().conv_window(layer).select(0, row);
          const TensorView w1 = alone.pool().conv_window(layer).select(0, row);
          CHECK(same_bits(w, bytes_of(w1)));
          if (ring) {
            const auto x = rings_of(ragged.pool(), layer), y = rings_of(alone.pool(), layer);
            for (size_t k = 0; k < x.size(); ++k) {
              CHECK(same_bits(x[k].select(0, slot), bytes_of(y[k].select(0, slot))));
            }
          } else {
            CHECK(same_bits(ragged.pool().snapshots(layer).select(0, row),
                            bytes_of(alone.pool().snapshots(layer).select(0, row))));
          }
        }
        alone.backend->abort_round();
      }
      // The rows and slots of no request are untouched (the padding request's, the spare slot 1
      // and scratch rows of nobody): the garbage-filled single harness has the same bytes there.
      for (int layer = 0; layer < kLayers; ++layer) {
        CHECK(same_bits(ragged.pool().conv_window(layer).select(0, 2),
                        bytes_of(single.pool().conv_window(layer).select(0, 2))));
        if (ring) {
          const auto x = rings_of(ragged.pool(), layer), y = rings_of(single.pool(), layer);
          for (size_t k = 0; k < x.size(); ++k) {
            CHECK(same_bits(x[k].select(0, 1), bytes_of(y[k].select(0, 1))));
          }
        }
      }
      // Commit n_i <= T_i: each request's state is its dense commit's.
      commit(ragged, {1, 2, 1, 4});
      for (size_t i = 0; i < batch.slots.size(); ++i) {
        const int32_t slot = batch.slots[i], row = batch.rows[i], len = batch.lengths[i];
        if (slot < 0) {
          continue;
        }
        const int32_t acc = std::vector<int32_t>{1, 2, 1, 4}[i];
        Harness alone(kGqaCase, f, fake_platform(9, 0));
        alone.fill_scratch(9);
        verify_rows(alone, BatchSpec(len, {slot}, {row}), inputs, iota_rows(first[i], len));
        commit(alone, {acc});
        for (int layer = 0; layer < kLayers; ++layer) {
          CHECK(same_bits(ragged.pool().ssm_state(layer).select(0, slot),
                          bytes_of(alone.pool().ssm_state(layer).select(0, slot))));
          CHECK(same_bits(ragged.pool().conv_state(layer).select(0, slot),
                          bytes_of(alone.pool().conv_state(layer).select(0, slot))));
        }
      }
    }
  }
}

TEST_CASE("tree: a chain-shaped tree is the chain, bitwise", "[shape]") {
  for (const bool ring : {false, true}) {
    CAPTURE(ring);
    // Both unfused (trees always are): the pools then hold the same qkv_act scratch too.
    EngineFlags f = shape_flags(ring, kTreeT, 3);
    f.fused_verify = false;
    Harness chain(kGqaCase, f, fake_platform(9, 0));
    Harness tree(kGqaCase, f, fake_platform(9, 0));
    chain.fill_scratch(3);
    tree.fill_scratch(3);
    BatchSpec batch(kTreeT, {2, 0, -1});
    const auto inputs = layer_inputs(chain.model, 3 * kTreeT, 41);
    const auto pick = iota_rows(0, 3 * kTreeT);
    const auto a = verify_rows(chain, batch, inputs, pick);
    for (int n = 0; n < 3; ++n) {
      for (int j = 0; j < kTreeT; ++j) {
        batch.parents.push_back(j - 1);
      }
    }
    const auto b = verify_rows(tree, batch, inputs, pick);
    for (int layer = 0; layer < kLayers; ++layer) {
      CHECK(same_bits(a[static_cast<size_t>(layer)].out_view,
                      bytes_of(b[static_cast<size_t>(layer)].out_view)));
    }
    CHECK(pool_checksum(chain.pool()) == pool_checksum(tree.pool()));
    commit(chain, {5, 8, 1});
    std::vector<int32_t> paths;
    for (int n = 0; n < 3; ++n) {
      for (int j = 0; j < kTreeT; ++j) {
        paths.push_back(j);
      }
    }
    commit_tree(tree, {5, 8, 1}, paths);
    // Ring mode: the chain's records are already at their steps (nothing moves).
    CHECK(pool_checksum(chain.pool()) == pool_checksum(tree.pool()));
  }
}

TEST_CASE("tree: every node is the chain along its root path; commits along any root path",
          "[shape]") {
  std::mt19937 rng(1234);
  for (const bool ring : {false, true}) {
    CAPTURE(ring);
    const EngineFlags f = shape_flags(ring, kTreeT, 3);
    Harness tree(kGqaCase, f, fake_platform(9, 0));
    tree.fill_scratch(13);
    // Two requests, reversed slots, rows swapped, a padding request between them.
    BatchSpec batch(kTreeT, {3, -1, 1}, {2, 0, 1});
    std::vector<int32_t> parents;
    for (int n = 0; n < 3; ++n) {
      const auto t = random_tree(rng, kTreeT, 3);
      parents.insert(parents.end(), t.begin(), t.end());
    }
    batch.parents = parents;
    const auto inputs = layer_inputs(tree.model, 3 * kTreeT, 51);
    const auto r = verify_rows(tree, batch, inputs, iota_rows(0, 3 * kTreeT));
    for (const int n : {0, 2}) {
      const int32_t slot = batch.slots[static_cast<size_t>(n)];
      const int32_t row = batch.rows[static_cast<size_t>(n)];
      for (int j = 0; j < kTreeT; ++j) {
        const auto path = root_path(parents, n * kTreeT, j);
        const int d = static_cast<int>(path.size());
        CAPTURE(n, j, d);
        std::vector<int64_t> pick;
        for (const int32_t node : path) {
          pick.push_back(int64_t{n} * kTreeT + node);
        }
        Harness chain(kGqaCase, f, fake_platform(9, 0));
        chain.fill_scratch(13);
        const auto c = verify_rows(chain, BatchSpec(d, {slot}, {row}), inputs, pick);
        for (int layer = 0; layer < kLayers; ++layer) {
          CAPTURE(layer);
          CHECK(same_bits(r[static_cast<size_t>(layer)].out_view.narrow(0, n * kTreeT + j, 1),
                          bytes_of(c[static_cast<size_t>(layer)].out_view.narrow(0, d - 1, 1))));
          CHECK(steps_of(tree.pool().conv_window(layer).select(0, row), j, 1) ==
                steps_of(chain.pool().conv_window(layer).select(0, row), d - 1, 1));
          if (ring) {
            const auto x = rings_of(tree.pool(), layer), y = rings_of(chain.pool(), layer);
            for (size_t k = 0; k < x.size(); ++k) {
              CHECK(ring_at(x[k], slot, j) == ring_at(y[k], slot, d - 1));
            }
          } else {
            CHECK(same_bits(tree.pool().snapshots(layer).select(0, row).narrow(0, j, 1),
                            steps_of(chain.pool().snapshots(layer).select(0, row), d - 1, 1)));
          }
        }
        // Commit along this root path in a copy of the tree round = the chain's commit.
        commit(chain, {d});
        Harness again(kGqaCase, f, fake_platform(9, 0));
        again.fill_scratch(13);
        verify_rows(again, batch, inputs, iota_rows(0, 3 * kTreeT));
        std::vector<int32_t> paths(3 * kTreeT, -7), accepted = {1, 1, 1};
        std::copy(path.begin(), path.end(), paths.begin() + n * kTreeT);
        accepted[static_cast<size_t>(n)] = d;
        paths[static_cast<size_t>((2 - n) * kTreeT)] = 0;  // the other request: its root
        commit_tree(again, accepted, paths);
        again.backend->check_device_errors(nullptr);
        for (int layer = 0; layer < kLayers; ++layer) {
          CHECK(same_bits(again.pool().ssm_state(layer).select(0, slot),
                          bytes_of(chain.pool().ssm_state(layer).select(0, slot))));
          CHECK(same_bits(again.pool().conv_state(layer).select(0, slot),
                          bytes_of(chain.pool().conv_state(layer).select(0, slot))));
        }
      }
    }
    // Nothing of the padding request's scratch row (row 0) was written.
    Harness fresh(kGqaCase, f, fake_platform(9, 0));
    fresh.fill_scratch(13);
    for (int layer = 0; layer < kLayers; ++layer) {
      CHECK(same_bits(tree.pool().conv_window(layer).select(0, 0),
                      bytes_of(fresh.pool().conv_window(layer).select(0, 0))));
    }
    tree.backend->abort_round();
  }
}

TEST_CASE("tree: ring-mode commits equal snapshot-mode commits", "[shape]") {
  std::mt19937 rng(99);
  Harness snap(kGqaCase, shape_flags(false, kTreeT, 3), fake_platform(9, 0));
  Harness ring(kGqaCase, shape_flags(true, kTreeT, 3), fake_platform(9, 0));
  for (int round = 0; round < 4; ++round) {
    CAPTURE(round);
    BatchSpec batch(
        kTreeT, round % 2 == 0 ? std::vector<int32_t>{0, 4, 2} : std::vector<int32_t>{3, -1, 1});
    std::vector<int32_t> accepted, paths;
    for (int n = 0; n < 3; ++n) {
      const auto t = random_tree(rng, kTreeT, 3);
      batch.parents.insert(batch.parents.end(), t.begin(), t.end());
      const auto path = root_path(t, 0, static_cast<int>(rng() % kTreeT));
      accepted.push_back(static_cast<int32_t>(path.size()));
      std::vector<int32_t> row(kTreeT, -3);
      std::copy(path.begin(), path.end(), row.begin());
      paths.insert(paths.end(), row.begin(), row.end());
    }
    const auto inputs = layer_inputs(snap.model, 3 * kTreeT, 60 + round);
    const auto a = verify_rows(snap, batch, inputs, iota_rows(0, 3 * kTreeT));
    const auto b = verify_rows(ring, batch, inputs, iota_rows(0, 3 * kTreeT));
    for (int layer = 0; layer < kLayers; ++layer) {
      CHECK(same_bits(a[static_cast<size_t>(layer)].out_view,
                      bytes_of(b[static_cast<size_t>(layer)].out_view)));
    }
    commit_tree(snap, accepted, paths);
    commit_tree(ring, accepted, paths);
    for (int layer = 0; layer < kLayers; ++layer) {
      CHECK(same_bits(snap.pool().ssm_state(layer), bytes_of(ring.pool().ssm_state(layer))));
      CHECK(same_bits(snap.pool().conv_state(layer), bytes_of(ring.pool().conv_state(layer))));
    }
  }
}

TEST_CASE("ragged: deferred rounds equal eager ones after materialize", "[shape]") {
  std::mt19937 rng(5);
  Harness eager(kGqaCase, shape_flags(true, kT, 1, false), fake_platform(9, 0));
  Harness deferred(kGqaCase, shape_flags(true, kT, 1, true), fake_platform(9, 0));
  REQUIRE(deferred.backend->deferred_commit());
  for (int round = 0; round < 6; ++round) {
    CAPTURE(round);
    const int T = 2 + round % 3;
    std::vector<int32_t> slots =
        round % 2 == 0 ? std::vector<int32_t>{1, 3, 0, -1} : std::vector<int32_t>{4, 0, 2};
    BatchSpec batch(T, slots);
    std::vector<int32_t> accepted;
    int64_t N = 0;
    for (size_t i = 0; i < slots.size(); ++i) {
      const int len = 1 + static_cast<int>(rng() % static_cast<unsigned>(T));
      batch.lengths.push_back(len);
      accepted.push_back(1 + static_cast<int>(rng() % static_cast<unsigned>(len)));
      N += len;
    }
    const auto inputs = layer_inputs(eager.model, N, 70 + round);
    const auto a = verify_rows(eager, batch, inputs, iota_rows(0, N));
    const auto b = verify_rows(deferred, batch, inputs, iota_rows(0, N));
    for (int layer = 0; layer < kLayers; ++layer) {
      CHECK(same_bits(a[static_cast<size_t>(layer)].out_view,
                      bytes_of(b[static_cast<size_t>(layer)].out_view)));
    }
    commit(eager, accepted);
    commit(deferred, accepted);
    // Materialized after rounds 2 and 5 only: the other rounds' verifies fold pending steps of
    // a ragged round (the outputs above compare them), these two the materialize.
    if (round % 3 == 2) {
      deferred.backend->materialize({0, 1, 2, 3, 4}, nullptr);
      for (int layer = 0; layer < kLayers; ++layer) {
        CHECK(same_bits(eager.pool().ssm_state(layer), bytes_of(deferred.pool().ssm_state(layer))));
        CHECK(
            same_bits(eager.pool().conv_state(layer), bytes_of(deferred.pool().conv_state(layer))));
      }
    }
  }
}

#ifdef KDA_BACKEND_TEST_CUDA
namespace {

/// Runs `f` on harness `h` with a kernel schedule forced through its launch overrides
/// (kernels/common/launch_utils.h), then waits for the device.
using Schedule = std::function<void(Harness&, const std::function<void()>&)>;

Schedule persistent(kernels::PersistentMode mode) {
  return [mode](Harness& h, const std::function<void()>& f) {
    h.launch->persistent = mode;
    h.launch->persistent_max_ctas = 3;
    f();
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    *h.launch = {};
  };
}

Schedule per_item(kernels::TileOccupancy occupancy) {
  return [occupancy](Harness& h, const std::function<void()>& f) {
    h.launch->persistent = kernels::PersistentMode::kNever;
    h.launch->occupancy = occupancy;
    f();
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    *h.launch = {};
  };
}

/// One ragged verify path against another: harnesses of flags `f` verify under schedules `one`
/// and `other`, over three rounds of random lengths and accepted counts, reversed and
/// non-contiguous slots, a padding request and a changing batch. Every output (the whole
/// garbage-filled tensor) and every pool tensor after each verify and each commit are equal; the
/// first round (lengths T) is the dense chain under `one`; the outputs are an eager harness's
/// (flags `eager`, schedule `other`), and so is the state after `one` materializes every slot.
void check_ragged_paths(const ModelConfig& m, const EngineFlags& f, const EngineFlags& eager,
                        const Schedule& one, const Schedule& other, unsigned seed) {
  Harness a_h(m, f, fake_platform(9, 0));
  Harness b_h(m, f, fake_platform(9, 0));
  Harness dense(m, f, fake_platform(9, 0));
  Harness eager_h(m, eager, fake_platform(9, 0));
  for (Harness* h : {&a_h, &b_h, &dense, &eager_h}) {
    h->fill_scratch(seed);
  }
  std::mt19937 rng(seed);
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    BatchSpec batch(
        kT, round % 2 == 0 ? std::vector<int32_t>{4, 2, -1, 0} : std::vector<int32_t>{1, 3, 0},
        round % 2 == 0 ? std::vector<int32_t>{3, 0, 2, 1} : std::vector<int32_t>{2, 0, 1});
    std::vector<int32_t> accepted;
    int64_t N = 0;
    for (size_t i = 0; i < batch.slots.size(); ++i) {
      const int len = round == 0 ? kT : 1 + static_cast<int>(rng() % static_cast<unsigned>(kT));
      batch.lengths.push_back(len);
      accepted.push_back(1 + static_cast<int>(rng() % static_cast<unsigned>(len)));
      N += len;
    }
    const auto inputs = layer_inputs(m, N, seed * 7 + round);
    std::vector<Acts> a, b, c, d;
    one(a_h, [&] { a = verify_rows(a_h, batch, inputs, iota_rows(0, N)); });
    other(b_h, [&] { b = verify_rows(b_h, batch, inputs, iota_rows(0, N)); });
    other(eager_h, [&] { d = verify_rows(eager_h, batch, inputs, iota_rows(0, N)); });
    for (int layer = 0; layer < kLayers; ++layer) {
      CHECK(same_bits(a[static_cast<size_t>(layer)].out_view,
                      bytes_of(b[static_cast<size_t>(layer)].out_view)));
      CHECK(same_bits(a[static_cast<size_t>(layer)].out_view,
                      bytes_of(d[static_cast<size_t>(layer)].out_view)));
    }
    CHECK(pool_checksum(a_h.pool()) == pool_checksum(b_h.pool()));
    if (round == 0) {  // lengths T: the dense chain
      BatchSpec chain(kT, batch.slots, batch.rows);
      one(dense, [&] { c = verify_rows(dense, chain, inputs, iota_rows(0, N)); });
      for (int layer = 0; layer < kLayers; ++layer) {
        CHECK(same_bits(a[static_cast<size_t>(layer)].out_view,
                        bytes_of(c[static_cast<size_t>(layer)].out_view)));
      }
      CHECK(pool_checksum(a_h.pool()) == pool_checksum(dense.pool()));
      dense.backend->abort_round();
    }
    commit(a_h, accepted);
    commit(b_h, accepted);
    commit(eager_h, accepted);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(pool_checksum(a_h.pool()) == pool_checksum(b_h.pool()));
  }
  one(a_h, [&] { a_h.backend->materialize({0, 1, 2, 3, 4}, nullptr); });
  for (int layer = 0; layer < kLayers; ++layer) {
    CHECK(same_bits(a_h.pool().ssm_state(layer), bytes_of(eager_h.pool().ssm_state(layer))));
    CHECK(same_bits(a_h.pool().conv_state(layer), bytes_of(eager_h.pool().conv_state(layer))));
  }
}

}  // namespace

TEST_CASE("ragged: the streaming verify equals the per-item ragged kernel and the dense chain",
          "[shape]") {
  // A fused ragged ring-mode call at BV = 128 takes the persistent kernel (the
  // unfused one keeps the per-item kernel: kernels/verify/per_item.cuh); forced here with three
  // CTAs, so that each walks many items and plans the next one's rows, against the per-item
  // ragged kernel (streaming off), eager and deferred, K = 64 and 128 (check_ragged_paths).
  for (const int K : {64, 128}) {
    for (const bool deferred : {false, true}) {
      CAPTURE(K, deferred);
      ModelConfig m = model_for(kGqaCase);
      m.K = K;
      m.V = K;
      EngineFlags f = shape_flags(true, kT, 1, deferred);
      f.fused_ring_max_batch = 64;
      f.fused_verify = true;
      f.verify_block_v = 128;
      check_ragged_paths(
          m, f, shape_flags(true, kT, 1, false), persistent(kernels::PersistentMode::kAlways),
          persistent(kernels::PersistentMode::kNever), static_cast<unsigned>(23 + K + deferred));
    }
  }
}

TEST_CASE("ragged: the one-CTA-per-SM form equals the two-per-SM form and the dense chain",
          "[shape]") {
  // A fused ragged call takes the dense call's schedule (kernels/verify/per_item.cuh): at small B
  // the one-CTA-per-SM per-item form, its steps grouped over each request's T_n tokens. Forced
  // one and two CTAs per SM (streaming off), for every fused tile and both head dims, in
  // snapshot, eager ring and deferred ring mode (check_ragged_paths; the eager harness is the
  // same tile in the same mode with the eager commit).
  enum class Mode { kSnapshot, kRing, kDeferred };
  // KDA_TEST_QUICK=1 (compute-sanitizer runs): the wide tiles' three forms (BV = 16 on warps
  // 4-7, BV = 32 with lanes 4 apart, BV = 128).
  const std::vector<int> bvs = std::getenv("KDA_TEST_QUICK") != nullptr
                                   ? std::vector<int>{16, 32, 128}
                                   : std::vector<int>{8, 16, 32, 64, 128};
  for (const int K : {64, 128}) {
    for (const Mode mode : {Mode::kSnapshot, Mode::kRing, Mode::kDeferred}) {
      for (const int bv : bvs) {
        const bool ring = mode != Mode::kSnapshot, deferred = mode == Mode::kDeferred;
        CAPTURE(K, ring, deferred, bv);
        ModelConfig m = model_for(kGqaCase);
        m.K = K;
        m.V = K;
        EngineFlags f = shape_flags(ring, kT, 1, deferred);
        f.fused_ring_max_batch = 64;
        f.fused_verify = true;
        f.verify_block_v = bv;
        EngineFlags eager = f;
        eager.deferred_commit = static_cast<int>(DeferredCommit::kOff);
        check_ragged_paths(m, f, eager, per_item(kernels::TileOccupancy::kOnePerSm),
                           per_item(kernels::TileOccupancy::kTwoPerSm),
                           static_cast<unsigned>(29 + K + bv + 3 * static_cast<int>(mode)));
      }
    }
  }
}
#endif

TEST_CASE("draft shapes: bad input is a kda::Error naming it, nothing changes",
          "[shape]" KDA_HOST_ONLY) {
  Harness h(kGqaCase, shape_flags(true, kTreeT, 2), fake_platform(9, 0));
  const uint64_t sum = pool_checksum(h.pool());
  const auto bad = [&](BatchSpec b, const char* want) {
    const std::string msg =
        error_of([&] { h.backend->prepare(b, nullptr); }, ErrorCode::kInvalidArgument);
    CAPTURE(msg);
    CHECK(msg.find(want) != std::string::npos);
    CHECK(h.backend->round_kind() == RoundKind::kNone);
  };
  BatchSpec r(4, {0, 1});
  r.lengths = {1, 5};
  bad(r, "lengths[1] = 5 out of range [1, T = 4]");
  r.lengths = {0, 2};
  bad(r, "lengths[0] = 0 out of range");
  r.lengths = {1};
  bad(r, "BatchSpec.lengths has 1 entries for 2 requests");
  r.lengths = {2, 3};
  r.offsets = {0, 2, 4};
  bad(r, "does not match lengths[1] = 3");
  r.offsets = {1, 3, 6};
  bad(r, "offsets[0] = 1, expected 0");
  r.offsets = {0, 2};
  bad(r, "BatchSpec.offsets has 2 entries for 2 requests");
  BatchSpec t(3, {0, 1});
  t.parents = {-1, 0, 2, -1, 0, 0};
  bad(t, "parents[2] = 2 for node 2 of request 0, expected in [0, 2)");
  t.parents = {-1, 0, 1, -1, -1, 0};
  bad(t, "parents[4] = -1 for node 1 of request 1: a second root");
  t.parents = {0, 0, 1, -1, 0, 0};
  bad(t, "parents[0] = 0 for node 0 of request 0, expected -1");
  t.parents = {-1, 0, 1};
  bad(t, "BatchSpec.parents has 3 entries for 2 requests of T = 3 nodes");
  BatchSpec wide(4, {0});
  wide.parents = {-1, 0, 0, 0};
  bad(wide, "node 0 of request 0 has more than --speculative-eagle-topk = 2 children");
  t.parents = {-1, 0, 1, -1, 0, 0};
  t.lengths = {3, 3};
  bad(t, "BatchSpec.parents with lengths");
  CHECK(pool_checksum(h.pool()) == sum);

  // Flags: trees need few nodes and the eager commit.
  EngineFlags f = shape_flags(true, 9, 2);
  f.replayssm_cache_len = 32;
  CHECK(error_of([&] { f.validate(); }, ErrorCode::kInvalidArgument)
            .find("tree drafts: expected at most 8 nodes per request") != std::string::npos);
  f = shape_flags(true, 4, 2, /*deferred=*/true);
  CHECK(error_of([&] { f.validate(); }, ErrorCode::kInvalidArgument)
            .find("tree drafts commit eagerly") != std::string::npos);
  Harness chain_only(kGqaCase, shape_flags(true, 4, 1), fake_platform(9, 0));
  BatchSpec tree4(4, {0});
  tree4.parents = {-1, 0, 0, 1};
  CHECK(error_of([&] { chain_only.backend->prepare(tree4, nullptr); }, ErrorCode::kInvalidArgument)
            .find("trees need topk > 1") != std::string::npos);

  // Commit: a tree round needs its paths, a chain round takes none; shapes are checked.
  const auto inputs = layer_inputs(h.model, 2 * 3, 3);
  t.lengths.clear();
  verify_rows(h, t, inputs, iota_rows(0, 6));
  const uint64_t verified = pool_checksum(h.pool());
  CHECK(error_of(
            [&] {
              commit(h, {1, 1});
            },
            ErrorCode::kLifecycle)
            .find("a tree round commits with its accepted paths") != std::string::npos);
  Buffer acc = device_i32({1, 1}), path = device_i32({0, 0, 0, 0});
  CHECK(error_of(
            [&] {
              h.backend->commit_tree(acc.view(DType::kI32, {2}), path.view(DType::kI32, {2, 2}),
                                     nullptr);
            },
            ErrorCode::kInvalidArgument)
            .find("accepted_paths") != std::string::npos);
  CHECK(pool_checksum(h.pool()) == verified);
  CHECK(h.backend->round_kind() == RoundKind::kVerify);
  // Read on the device: a path that is not a root path (node 2's parent is 1, not 0), and a
  // length past T: those requests are skipped, the error reported, the rest committed.
  const std::vector<uint8_t> state0 = bytes_of(h.pool().ssm_state(0).select(0, 0));
  const std::vector<uint8_t> state1 = bytes_of(h.pool().ssm_state(0).select(0, 1));
  commit_tree(h, {2, 1}, {0, 2, 0, 0, 0, 0});
  CHECK(error_of([&] { h.backend->check_device_errors(nullptr); }, ErrorCode::kInvalidArgument)
            .find("not a root path") != std::string::npos);
  CHECK(same_bits(h.pool().ssm_state(0).select(0, 0), state0));
  CHECK_FALSE(same_bits(h.pool().ssm_state(0).select(0, 1), state1));
  BatchSpec chain(3, {0, 1});
  chain.lengths = {1, 3};
  verify_rows(h, chain, inputs, iota_rows(0, 4));
  const std::vector<uint8_t> s0 = bytes_of(h.pool().ssm_state(0).select(0, 0));
  CHECK(error_of(
            [&] {
              commit_tree(h, {1, 1}, {0, 0, 0, 0, 0, 0});
            },
            ErrorCode::kLifecycle)
            .find("only a tree round commits accepted paths") != std::string::npos);
  commit(h, {2, 3});  // n_0 = 2 > T_0 = 1
  CHECK(error_of([&] { h.backend->check_device_errors(nullptr); }, ErrorCode::kInvalidArgument)
            .find("[1, T_n]") != std::string::npos);
  CHECK(same_bits(h.pool().ssm_state(0).select(0, 0), s0));
}

TEST_CASE("draft shapes: every fused tile and both head dims, against the dense chain", "[shape]") {
  // K = V = 64 and 128 (the Kimi tiles); every fused V tile (the GPU's kShaped instantiations)
  // and the unfused path: a ragged batch of lengths T is the dense batch, a mixed ragged
  // batch's requests are their own dense verifies (outputs), and a chain-shaped tree is the chain
  // (unfused).
  for (const int K : {64, 128}) {
    ModelConfig m = model_for(kGqaCase);
    m.K = K;
    m.V = K;
    for (const bool ring : {false, true}) {
      for (const int bv : {8, 16, 32, 64, 128, 0}) {
        CAPTURE(K, ring, bv);
        EngineFlags f = shape_flags(ring, kT, 2);
        f.fused_ring_max_batch = 64;
        f.fused_verify = bv != 0;  // 0: the unfused pair
        f.verify_block_v = bv;
        Harness dense(m, f, fake_platform(9, 0));
        Harness ragged(m, f, fake_platform(9, 0));
        dense.fill_scratch(17);
        ragged.fill_scratch(17);
        BatchSpec batch(kT, {2, 0, -1, 4});
        const auto inputs = layer_inputs(m, 4 * kT, 91);
        const auto a = verify_rows(dense, batch, inputs, iota_rows(0, 4 * kT));
        batch.lengths = {kT, kT, kT, kT};
        const auto b = verify_rows(ragged, batch, inputs, iota_rows(0, 4 * kT));
        for (int layer = 0; layer < kLayers; ++layer) {
          CHECK(same_bits(a[static_cast<size_t>(layer)].out_view,
                          bytes_of(b[static_cast<size_t>(layer)].out_view)));
        }
        CHECK(pool_checksum(dense.pool()) == pool_checksum(ragged.pool()));
        CHECK(ragged.backend->stats().last_decision[0]->fused() == (bv != 0));
        dense.backend->abort_round();
        ragged.backend->abort_round();

        // Mixed lengths: request i's rows are a dense verify of it alone (T = T_i).
        BatchSpec mixed(kT, {2, 0, -1, 4});
        mixed.lengths = {3, 1, 2, 4};
        const std::vector<int64_t> first = {0, 3, 4, 6};
        const auto r = verify_rows(ragged, mixed, inputs, iota_rows(0, 10));
        for (const size_t i : {size_t{0}, size_t{1}, size_t{3}}) {
          const int len = mixed.lengths[i];
          const auto s =
              verify_rows(dense, BatchSpec(len, {mixed.slots[i]}, {static_cast<int32_t>(i)}),
                          inputs, iota_rows(first[i], len));
          for (int layer = 0; layer < kLayers; ++layer) {
            CHECK(same_bits(r[static_cast<size_t>(layer)].out_view.narrow(0, first[i], len),
                            bytes_of(s[static_cast<size_t>(layer)].out_view)));
          }
          dense.backend->abort_round();
        }
        ragged.backend->abort_round();

        // A chain-shaped tree (unfused) is the dense chain's outputs.
        BatchSpec tree(kT, {2, 0, -1, 4});
        for (int n = 0; n < 4; ++n) {
          for (int j = 0; j < kT; ++j) {
            tree.parents.push_back(j - 1);
          }
        }
        const auto t = verify_rows(ragged, tree, inputs, iota_rows(0, 4 * kT));
        for (int layer = 0; layer < kLayers; ++layer) {
          CHECK(same_bits(a[static_cast<size_t>(layer)].out_view,
                          bytes_of(t[static_cast<size_t>(layer)].out_view)));
        }
        ragged.backend->abort_round();
      }
    }
  }
}
