// backend_graph_test.cc: KdaAttentionBackend on a CUDA device: slot / row indices uploaded in
// prepare() without racing the staging, verify and commit captured into a CUDA graph whose
// replays read the latest prepared indices, the device error flag read and cleared (on a stub
// CUDA kernel set: backend_graph_gpu_test); and, on the real CUDA kernels
// (backend_graph_cuda_test, KDA_BACKEND_TEST_CUDA), a graph replay of every layer's verify
// against eager rounds, bitwise. Every case is [gpu].
#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <initializer_list>
#include <memory>
#include <vector>

#include "backend/kda_backend.h"
#include "core/buffer.h"
#include "core/platform.h"
#include "kernels/kernel_set.h"
#include "tests/backend_fixture.h"

using namespace kda;
using namespace kda::testing;

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
  kernels::VerifyPlan plan_verify(const VerifyParams& p, VerifyPath path, int block_v) override {
    return kernels::plan_verify(p, path, block_v, {}, {}, 0);
  }
  void verify(const VerifyParams& p, const kernels::VerifyPlan&, cudaStream_t s) override {
    record_verify(p, s);
  }
  bool runs_lazy_write_back() const override { return false; }
  void extend(const ExtendParams&, cudaStream_t) override {}
  void commit(const CommitParams& p, cudaStream_t s) override {
    log_->commit = p;
    ++log_->commits;
    if (log_->raise_error_flag) {
      REQUIRE(cudaMemsetAsync(p.error_flag, 1, 1, s) == cudaSuccess);
    }
  }

 private:
  void record_verify(const VerifyParams& p, cudaStream_t s) {
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
                      Catch::Contains("an accepted length outside [1, T]"));
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
TEST_CASE("backend: one captured graph serves every ragged batch and every tree of its bucket",
          "[backend][gpu]") {
  // Contract §8: the lengths, offsets and parents live in the index buffers prepare() fills,
  // so a graph captured for (B, T) and a draft shape replays any batch of that shape. The
  // capture takes a ragged batch of lengths T (B*T rows); each replay's batch differs. Outputs
  // (whole buffers: nothing written past a round's rows) and the whole pool must equal eager
  // rounds, bitwise.
  const bool ring = GENERATE(true, false);
  const bool tree = GENERATE(false, true);
  CAPTURE(ring, tree);
  EngineFlags f = flags_for(ring);
  f.eagle_topk = tree ? 2 : 1;
  Harness eager(kGqaCase, f, fake_platform(9, 0));
  Harness graphed(kGqaCase, f, fake_platform(9, 0));
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  const std::vector<int32_t> slots = {3, -1, 1};
  const int B = 3;
  std::vector<Activations> acts_e, acts_g;
  for (int layer = 0; layer < kLayers; ++layer) {
    acts_e.push_back(make_activations(eager.model, {0, 1, 2}, kT, 700 + layer));
    acts_g.push_back(make_activations(graphed.model, {0, 1, 2}, kT, 700 + layer));
  }
  const auto shaped = [&](int round) {
    BatchSpec b(kT, slots);
    for (int n = 0; n < B; ++n) {
      if (tree) {
        // Round 0 (the capture): a chain; then trees that branch.
        const std::vector<int32_t> par = round == 0   ? std::vector<int32_t>{-1, 0, 1, 2}
                                         : round == 1 ? std::vector<int32_t>{-1, 0, 0, 1}
                                                      : std::vector<int32_t>{-1, 0, 1, 1};
        b.parents.insert(b.parents.end(), par.begin(), par.end());
      } else {
        b.lengths.push_back(round == 0 ? kT : 1 + (n + round) % kT);
      }
    }
    return b;
  };
  const auto rows_of = [&](const BatchSpec& b) {
    int64_t n = 0;
    for (const int32_t len : b.lengths) {
      n += len;
    }
    return b.lengths.empty() ? int64_t{B} * kT : n;
  };
  graphed.backend->prepare(shaped(0), stream);
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

  for (int round = 1; round <= 3; ++round) {
    CAPTURE(round);
    const BatchSpec batch = shaped(round);
    const int64_t N = rows_of(batch);
    std::vector<int32_t> acc, paths;
    for (int n = 0; n < B; ++n) {
      if (tree) {
        // Node 3's root path (its parent is node 1 in every branching round), or the root.
        const std::vector<int32_t> path = {0, 1, 3};
        const bool deep = (n + round) % 2 == 0;
        acc.push_back(deep ? 3 : 1);
        for (int k = 0; k < kT; ++k) {
          paths.push_back(deep && k < 3 ? path[static_cast<size_t>(k)] : (k == 0 ? 0 : -1));
        }
      } else {
        acc.push_back(1 + (n + 2 * round) % batch.lengths[static_cast<size_t>(n)]);
      }
    }
    Buffer accepted(kTestDevice, B * 4), path_buf(kTestDevice, B * kT * 4);
    accepted.upload(acc.data(), accepted.bytes());
    if (tree) {
      path_buf.upload(paths.data(), path_buf.bytes());
    }
    const TensorView acc_view = accepted.view(DType::kI32, {B});
    const TensorView path_view = path_buf.view(DType::kI32, {B, kT});
    const auto commit_round = [&](Harness& h) {
      if (tree) {
        h.backend->commit_tree(acc_view, path_view, stream);
      } else {
        h.backend->commit(acc_view, stream);
      }
    };

    eager.backend->prepare(batch, stream);
    for (int layer = 0; layer < kLayers; ++layer) {
      Activations& a = acts_e[static_cast<size_t>(layer)];
      VerifyInputs in{a.in.mixed_qkv.narrow(0, 0, N), a.in.a.narrow(0, 0, N),
                      a.in.b.narrow(0, 0, N)};
      eager.backend->verify(layer, in, a.out_view.narrow(0, 0, N), stream);
    }
    commit_round(eager);

    graphed.backend->prepare(batch, stream);
    graphed.backend->record_graph_verify_round();
    REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
    commit_round(graphed);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    CHECK_NOTHROW(eager.backend->check_device_errors(stream));
    CHECK_NOTHROW(graphed.backend->check_device_errors(stream));
    for (int layer = 0; layer < kLayers; ++layer) {
      CAPTURE(layer);
      CHECK(same_bits(acts_e[static_cast<size_t>(layer)].out_view,
                      acts_g[static_cast<size_t>(layer)].out_view));
    }
    CHECK(pool_checksum(eager.pool()) == pool_checksum(graphed.pool()));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}
#endif  // KDA_BACKEND_TEST_CUDA
