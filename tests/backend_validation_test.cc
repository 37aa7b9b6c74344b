// backend_validation_test.cc: every lifecycle misuse and every bad input (verify inputs, batch
// specs, accepted lengths, weights, slots) is rejected with a kda::Error of the right code and
// a message that names the argument, and changes nothing: pool bytes, round state, kernel calls
// and dispatch stats are as before. Host-side only (hidden in a CUDA build).
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <functional>
#include <string>

#include "backend/kda_backend.h"
#include "core/buffer.h"
#include "core/error.h"
#include "core/platform.h"
#include "kernels/kernel_set.h"
#include "tests/backend_fixture.h"

using namespace kda;
using namespace kda::testing;

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
