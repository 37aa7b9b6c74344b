// capi_test.cc: the C ABI (capi/kda_c.h) on the host kernel set against the C++ backend: a
// verify -> commit -> verify round through kda_* gives the C++ backend's outputs and pool bits
// (both record modes, eager and deferred commit; dense, ragged and tree drafts; tracked commits
// and tracked extends; tensors at a non-zero byte_offset), every error path returns its status
// with a message naming the argument, changes nothing and crosses no exception, and destroyed,
// foreign and garbage handles are refused (a double destroy does nothing).
#include "capi/kda_c.h"

#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "backend/kda_backend.h"
#include "core/buffer.h"
#include "core/platform.h"
#include "tests/backend_fixture.h"

using namespace kda;
using namespace kda::testing;

namespace {

// A DLTensor over a host TensorView, with its own shape and strides.
struct Dl {
  DLTensor t{};
  int64_t shape[TensorView::kMaxDims] = {};
  int64_t strides[TensorView::kMaxDims] = {};

  explicit Dl(const TensorView& v) {
    t.data = v.data();
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = v.ndim();
    switch (v.dtype()) {
      case DType::kBF16:
        t.dtype = DLDataType{kDLBfloat, 16, 1};
        break;
      case DType::kF16:
        t.dtype = DLDataType{kDLFloat, 16, 1};
        break;
      case DType::kF32:
        t.dtype = DLDataType{kDLFloat, 32, 1};
        break;
      case DType::kI32:
        t.dtype = DLDataType{kDLInt, 32, 1};
        break;
    }
    for (int d = 0; d < v.ndim(); ++d) {
      shape[d] = v.size(d);
      strides[d] = v.stride(d);
    }
    t.shape = shape;
    t.strides = strides;
  }
  Dl(const Dl& o) : t(o.t) {
    std::memcpy(shape, o.shape, sizeof(shape));
    std::memcpy(strides, o.strides, sizeof(strides));
    t.shape = shape;
    t.strides = strides;
  }
  Dl& operator=(const Dl&) = delete;
  const DLTensor* dl() const { return &t; }
};

kda_model_config c_model(const ModelConfig& m) {
  kda_model_config c{};
  c.num_layers = m.num_layers;
  c.H = m.H;
  c.HV = m.HV;
  c.K = m.K;
  c.V = m.V;
  c.gate = m.gate == GateKind::kSafe ? KDA_GATE_SAFE : KDA_GATE_STANDARD;
  c.lower_bound = m.lower_bound;
  c.conv_weight_dtype = m.conv_weight_type == ConvWeightType::kBF16 ? KDA_CONV_BF16 : KDA_CONV_F32;
  c.has_conv_bias = m.has_conv_bias ? 1 : 0;
  return c;
}

// flags_for(ring, deferred) as engine flag strings.
std::vector<std::string> flag_strings(bool ring, bool deferred) {
  std::vector<std::string> f = {"--speculative-num-draft-tokens", std::to_string(kT),
                                "--max-running-requests",         std::to_string(kMaxRunning),
                                "--linear-replayssm-cache-len",   "8",
                                "--kda-deferred-commit",          deferred ? "on" : "off"};
  if (ring) {
    f.push_back("--enable-linear-replayssm-spec");
  }
  return f;
}

std::vector<const char*> c_strs(const std::vector<std::string>& v) {
  std::vector<const char*> p;
  for (const std::string& s : v) {
    p.push_back(s.c_str());
  }
  return p;
}

TensorView pool_view(kda_backend* b, const char* name, int layer = -1) {
  DLTensor t{};
  REQUIRE(kda_pool_view(b, name, layer, &t) == KDA_OK);
  REQUIRE(t.device.device_type == kDLCPU);
  const DType dtype = t.dtype.code == kDLBfloat                        ? DType::kBF16
                      : t.dtype.code == kDLInt                         ? DType::kI32
                      : t.dtype.code == kDLFloat && t.dtype.bits == 32 ? DType::kF32
                                                                       : DType::kF16;
  return TensorView::strided(t.data, dtype, Device::host(), t.shape, t.strides, t.ndim);
}

const char* const kPoolNames[] = {"conv_state",   "ssm_state", "conv_window", "snapshots",
                                  "ring_rawv",    "ring_rawk", "ring_g",      "ring_beta",
                                  "ring_pending", "ring_u",    "ring_cursor"};

TensorView cpp_pool_view(const KdaStatePool& p, const std::string& name) {
  if (name == "conv_state") return p.conv_state_all();
  if (name == "ssm_state") return p.ssm_state_all();
  if (name == "conv_window") return p.conv_window_all();
  if (name == "snapshots") return p.snapshots_all();
  if (name == "ring_rawv") return p.ring_rawv_all();
  if (name == "ring_rawk") return p.ring_rawk_all();
  if (name == "ring_g") return p.ring_g_all();
  if (name == "ring_beta") return p.ring_beta_all();
  if (name == "ring_pending") return p.ring_pending_all();
  if (name == "ring_u") return p.ring_u_all();
  return p.ring_cursor();
}

// Every pool tensor of the mode, bitwise.
bool same_pool(kda_backend* c, const KdaStatePool& cpp) {
  bool same = true;
  for (const char* name : kPoolNames) {
    const TensorView want = cpp_pool_view(cpp, name);
    if (!want.defined()) {
      continue;
    }
    if (!same_bits(pool_view(c, name), want)) {
      UNSCOPED_INFO("pool tensor " << name << " differs");
      same = false;
    }
  }
  return same;
}

// A C backend mirroring Harness `h` (same flags, weights, allocated slots and committed state);
// `extra`: flags beyond flag_strings(ring, deferred), as in h's EngineFlags.
kda_backend* mirror(const Harness& h, bool ring, bool deferred,
                    const std::vector<std::string>& extra = {}) {
  const kda_model_config m = c_model(h.model);
  std::vector<std::string> flags = flag_strings(ring, deferred);
  flags.insert(flags.end(), extra.begin(), extra.end());
  const std::vector<const char*> argv = c_strs(flags);
  kda_backend_options options{};
  options.extra_slots = 1;
  kda_backend* b = nullptr;
  REQUIRE(kda_backend_create(&m, argv.data(), static_cast<int>(argv.size()), "host", &options,
                             &b) == KDA_OK);
  REQUIRE(b != nullptr);
  for (int layer = 0; layer < kLayers; ++layer) {
    const LayerWeights& w = h.weights[static_cast<size_t>(layer)].views;
    const Dl A_log(w.A_log), dt_bias(w.dt_bias), conv_weight(w.conv_weight), conv_bias(w.conv_bias);
    REQUIRE(kda_set_layer_weights(b, layer, A_log.dl(), dt_bias.dl(), conv_weight.dl(),
                                  conv_bias.dl()) == KDA_OK);
  }
  kda_backend_info info{};
  REQUIRE(kda_backend_info_get(b, &info) == KDA_OK);
  for (int i = 0; i < info.num_slots; ++i) {
    int32_t slot = -1;
    REQUIRE(kda_allocate_slot(b, nullptr, &slot) == KDA_OK);
  }
  for (const char* name : {"conv_state", "ssm_state"}) {
    const TensorView src = cpp_pool_view(h.pool(), name);
    std::memcpy(pool_view(b, name).data(), src.data(), static_cast<size_t>(src.span_bytes()));
  }
  return b;
}

struct Commit {
  Buffer buf;
  TensorView view;
  explicit Commit(const std::vector<int32_t>& a)
      : buf(Device::host(), static_cast<int64_t>(a.size()) * 4) {
    buf.upload(a.data(), buf.bytes());
    view = buf.view(DType::kI32, {static_cast<int64_t>(a.size())});
  }
};

const int32_t* data_or_null(const std::vector<int32_t>& v) {
  return v.empty() ? nullptr : v.data();
}

// The activation rows of `batch`: B*T, or the sum of a ragged batch's lengths.
int64_t batch_rows(const BatchSpec& batch) {
  if (batch.lengths.empty()) {
    return static_cast<int64_t>(batch.slots.size()) * batch.T;
  }
  int64_t n = 0;
  for (const int32_t len : batch.lengths) {
    n += len;
  }
  return n;
}

// verify_all for any draft shape: the first batch_rows(batch) rows of B*T-row activations.
std::vector<Activations> verify_shaped_all(Harness& h, const BatchSpec& batch, uint64_t seed) {
  h.backend->prepare(batch, nullptr);
  const int64_t N = batch_rows(batch);
  std::vector<Activations> acts;
  for (int layer = 0; layer < kLayers; ++layer) {
    acts.push_back(make_activations(h.model, batch.slots, batch.T, seed * 10 + layer));
    Activations& x = acts.back();
    x.in.mixed_qkv = x.in.mixed_qkv.narrow(0, 0, N);
    x.in.a = x.in.a.narrow(0, 0, N);
    x.in.b = x.in.b.narrow(0, 0, N);
    x.out_view = x.out_view.narrow(0, 0, N);
    h.backend->verify(layer, x.in, x.out_view, nullptr);
  }
  return acts;
}

// Commits the prepared round with `accepted` on the C++ backend and through kda_commit, and
// checks the device error flag of the C backend.
void commit_both(Harness& h, kda_backend* c, const std::vector<int32_t>& accepted) {
  commit(h, accepted);
  const Commit acc(accepted);
  const Dl acc_dl(acc.view);
  REQUIRE(kda_commit(c, acc_dl.dl(), nullptr) == KDA_OK);
  REQUIRE(kda_check_device_errors(c, nullptr) == KDA_OK);
}

// Verifies every layer through the C ABI with `acts`' inputs into fresh outputs; true if every
// output equals acts' (the C++ backend's) bitwise. A dense batch goes through kda_prepare, a
// ragged or tree one through kda_prepare_shaped.
bool c_verify_all(kda_backend* b, const BatchSpec& batch, const std::vector<Activations>& acts) {
  const int32_t B = static_cast<int32_t>(batch.slots.size());
  if (batch.lengths.empty() && batch.parents.empty()) {
    REQUIRE(kda_prepare(b, batch.T, batch.slots.data(), B, data_or_null(batch.rows), nullptr) ==
            KDA_OK);
  } else {
    REQUIRE(kda_prepare_shaped(b, batch.T, batch.slots.data(), B, data_or_null(batch.rows),
                               data_or_null(batch.lengths), data_or_null(batch.offsets),
                               data_or_null(batch.parents), nullptr) == KDA_OK);
  }
  kda_backend_info binfo{};
  REQUIRE(kda_backend_info_get(b, &binfo) == KDA_OK);
  CHECK(binfo.batch_tokens == batch_rows(batch));
  CHECK(binfo.draft_shape == (!batch.lengths.empty()   ? KDA_DRAFT_RAGGED
                              : !batch.parents.empty() ? KDA_DRAFT_TREE
                                                       : KDA_DRAFT_DENSE));
  bool same = true;
  for (int layer = 0; layer < kLayers; ++layer) {
    const Activations& x = acts[static_cast<size_t>(layer)];
    Buffer out(Device::host(), x.out_view.span_bytes());
    const TensorView out_view =
        TensorView::contiguous(out.data(), DType::kBF16, Device::host(),
                               {x.out_view.size(0), x.out_view.size(1), x.out_view.size(2)});
    const Dl qkv(x.in.mixed_qkv), a(x.in.a), bb(x.in.b), o(out_view);
    kda_dispatch_info info{};
    REQUIRE(kda_verify(b, layer, qkv.dl(), a.dl(), bb.dl(), o.dl(), nullptr, &info) == KDA_OK);
    CHECK(info.reason != nullptr);
    same = same && same_bits(out_view, x.out_view);
  }
  return same;
}

// A copy of a host view `v` at byte `offset` of a buffer of its own, described by a DLTensor
// whose data is the buffer's start and byte_offset `offset` (DLPack's base + offset form).
struct AtOffset {
  Buffer buf;
  Dl dl;
  int64_t offset;
  AtOffset(const TensorView& v, int64_t offset_bytes)
      : buf(Device::host(), offset_bytes + v.span_bytes()), dl(v), offset(offset_bytes) {
    std::memset(buf.data(), 0x5a, static_cast<size_t>(buf.bytes()));  // not a valid tensor
    std::memcpy(static_cast<char*>(buf.data()) + offset, v.data(),
                static_cast<size_t>(v.span_bytes()));
    dl.t.data = buf.data();
    dl.t.byte_offset = static_cast<uint64_t>(offset);
  }
  // The tensor's bytes as the call left them.
  std::vector<uint8_t> bytes() const {
    const auto* p = static_cast<const uint8_t*>(buf.data()) + offset;
    return std::vector<uint8_t>(p, p + (buf.bytes() - offset));
  }
};

// Runs the prepared round's layers through kda_verify (extend: kda_extend) with every tensor
// at a non-zero byte_offset; true if every output equals acts' bitwise.
bool c_run_all_at_offset(kda_backend* b, const std::vector<Activations>& acts, bool extend) {
  bool same = true;
  for (int layer = 0; layer < kLayers; ++layer) {
    const Activations& x = acts[static_cast<size_t>(layer)];
    const AtOffset qkv(x.in.mixed_qkv, 96), a(x.in.a, 32), bb(x.in.b, 16);
    Buffer garbage(Device::host(), x.out_view.span_bytes());
    std::memset(garbage.data(), 0x33, static_cast<size_t>(garbage.bytes()));
    const AtOffset out(
        garbage.view(DType::kBF16, {x.out_view.size(0), x.out_view.size(1), x.out_view.size(2)}),
        64);
    const int status =
        extend ? kda_extend(b, layer, qkv.dl.dl(), a.dl.dl(), bb.dl.dl(), out.dl.dl(), nullptr)
               : kda_verify(b, layer, qkv.dl.dl(), a.dl.dl(), bb.dl.dl(), out.dl.dl(), nullptr,
                            nullptr);
    REQUIRE(status == KDA_OK);
    same = same && same_bits(x.out_view, out.bytes());
  }
  return same;
}

}  // namespace

TEST_CASE("capi: verify -> commit -> verify equals the C++ backend bitwise", "[capi]") {
  for (const bool ring : {false, true}) {
    for (const bool deferred : {false, true}) {
      if (deferred && !ring) {
        continue;
      }
      CAPTURE(ring, deferred);
      Harness h(kGqaCase, ring, Platform{}, /*fused=*/true, deferred);
      kda_backend* c = mirror(h, ring, deferred);
      kda_backend_info info{};
      REQUIRE(kda_backend_info_get(c, &info) == KDA_OK);
      CHECK(info.record_mode == (ring ? KDA_MODE_RING : KDA_MODE_SNAPSHOT));
      CHECK(info.deferred_commit == (h.backend->deferred_commit() ? 1 : 0));
      CHECK(info.num_slots == h.pool().num_slots());
      CHECK(info.free_slots == 0);
      REQUIRE(same_pool(c, h.pool()));

      // Round 1: rows given, a padding row; round 2: batch positions, another T.
      const BatchSpec first{kT, {3, -1, 1}, {2, 0, 1}};
      const std::vector<Activations> x1 = verify_all(h, first, 1);
      CHECK(c_verify_all(c, first, x1));
      CHECK(same_pool(c, h.pool()));
      const char* state = nullptr;
      REQUIRE(kda_round_state(c, &state) == KDA_OK);
      CHECK(std::string(state) == h.backend->round_state());

      commit_both(h, c, {2, 1, kT});
      CHECK(same_pool(c, h.pool()));

      const BatchSpec second{kT - 1, {1, 4, 3}, {}};
      const std::vector<Activations> x2 = verify_all(h, second, 2);
      CHECK(c_verify_all(c, second, x2));
      commit_both(h, c, {1, 3, 2});
      const std::vector<int32_t> all = {0, 1, 2, 3, 4};
      h.backend->materialize(all, nullptr);
      REQUIRE(kda_materialize(c, all.data(), 5, nullptr) == KDA_OK);
      CHECK(same_pool(c, h.pool()));

      // copy_slot and release/allocate through the ABI match the C++ calls.
      h.backend->copy_slot(3, 0, nullptr);
      REQUIRE(kda_copy_slot(c, 3, 0, nullptr) == KDA_OK);
      CHECK(same_pool(c, h.pool()));
      REQUIRE(kda_release_slot(c, 2) == KDA_OK);
      int32_t slot = -1;
      REQUIRE(kda_allocate_slot(c, nullptr, &slot) == KDA_OK);
      CHECK(slot == 2);
      kda_backend_destroy(c);
    }
  }
}

TEST_CASE("capi: ragged and tree rounds equal the C++ backend bitwise", "[capi]") {
  for (const bool ring : {false, true}) {
    for (const bool deferred : {false, true}) {
      if (deferred && !ring) {
        continue;
      }
      CAPTURE(ring, deferred);
      // Ragged chains (lengths, then explicit offsets), a padding row, committed with kda_commit.
      Harness h(kGqaCase, ring, Platform{}, /*fused=*/true, deferred);
      kda_backend* c = mirror(h, ring, deferred);
      BatchSpec ragged{kT, {3, -1, 1}, {2, 0, 1}};
      ragged.lengths = {2, 1, kT};
      const std::vector<Activations> x1 = verify_shaped_all(h, ragged, 5);
      CHECK(c_verify_all(c, ragged, x1));
      CHECK(same_pool(c, h.pool()));
      commit_both(h, c, {2, 1, 3});
      CHECK(same_pool(c, h.pool()));

      BatchSpec with_offsets{kT, {1, 4, 3}, {}};
      with_offsets.lengths = {kT, 1, 3};
      with_offsets.offsets = {0, kT, kT + 1, kT + 4};
      const std::vector<Activations> x2 = verify_shaped_all(h, with_offsets, 6);
      CHECK(c_verify_all(c, with_offsets, x2));
      commit_both(h, c, {3, 1, 2});
      const std::vector<int32_t> all = {0, 1, 2, 3, 4};
      h.backend->materialize(all, nullptr);
      REQUIRE(kda_materialize(c, all.data(), 5, nullptr) == KDA_OK);
      CHECK(same_pool(c, h.pool()));
      kda_backend_destroy(c);
    }
    // A tree round needs --speculative-eagle-topk > 1 and commits eagerly.
    EngineFlags f = flags_for(ring, /*deferred=*/false);
    f.eagle_topk = 2;
    Harness h(kGqaCase, f, Platform{});
    kda_backend* c = mirror(h, ring, /*deferred=*/false, {"--speculative-eagle-topk", "2"});
    // Trees of kT = 4 nodes, at most two children per node; a padding row; committed along
    // root paths with kda_commit_tree and kda_commit_tree_tracked.
    BatchSpec tree{kT, {2, -1, 0}, {}};
    tree.parents = {-1, 0, 0, 1, -1, 0, 1, 2, -1, 0, 1, 1};
    const std::vector<Activations> x = verify_shaped_all(h, tree, 7);
    CHECK(c_verify_all(c, tree, x));
    CHECK(same_pool(c, h.pool()));
    const std::vector<int32_t> lengths = {3, 1, 2};
    const std::vector<int32_t> paths = {0, 1, 3, 0, 0, 0, 0, 0, 0, 1, 0, 0};
    const Commit acc(lengths), path(paths);
    const TensorView path_view = path.buf.view(DType::kI32, {3, kT});
    h.backend->commit_tree(acc.view, path_view, nullptr);
    const Dl acc_dl(acc.view), path_dl(path_view);
    REQUIRE(kda_commit_tree(c, acc_dl.dl(), path_dl.dl(), nullptr) == KDA_OK);
    REQUIRE(kda_check_device_errors(c, nullptr) == KDA_OK);
    CHECK(same_pool(c, h.pool()));

    // The same tree again, committed with a track of request 0's node 1 into slot 4.
    const std::vector<Activations> y = verify_shaped_all(h, tree, 8);
    CHECK(c_verify_all(c, tree, y));
    const Commit track_slots({4, -1, -1}), track_steps({1, -1, -1});
    CommitTrack track;
    track.slots = track_slots.view;
    track.steps = track_steps.view;
    h.backend->commit_tree(acc.view, path_view, track, nullptr);
    const Dl ts(track_slots.view), tp(track_steps.view);
    REQUIRE(kda_commit_tree_tracked(c, acc_dl.dl(), path_dl.dl(), ts.dl(), tp.dl(), nullptr) ==
            KDA_OK);
    REQUIRE(kda_check_device_errors(c, nullptr) == KDA_OK);
    CHECK(same_pool(c, h.pool()));
    kda_backend_destroy(c);
  }
}

TEST_CASE("capi: tracked commits equal the C++ backend bitwise", "[capi]") {
  // kda_commit_tracked in snapshot, eager ring and deferred ring mode: the track slots, the
  // requests' slots and every other pool tensor as the C++ backend's CommitTrack commit, with
  // every tensor of the round at a non-zero byte_offset.
  for (const bool ring : {false, true}) {
    for (const bool deferred : {false, true}) {
      if (deferred && !ring) {
        continue;
      }
      CAPTURE(ring, deferred);
      Harness h(kGqaCase, ring, Platform{}, /*fused=*/true, deferred);
      kda_backend* c = mirror(h, ring, deferred);
      // Requests on slots 1, 0, 2; tracks of request 0's step 1 into slot 4 and request 2's
      // step 0 into slot 3 (request 1 tracks nothing).
      const BatchSpec batch{kT, {1, 0, 2}, {}};
      const std::vector<Activations> x = verify_all(h, batch, 11);
      REQUIRE(kda_prepare(c, kT, batch.slots.data(), 3, nullptr, nullptr) == KDA_OK);
      CHECK(c_run_all_at_offset(c, x, /*extend=*/false));
      const Commit acc({3, 2, 2}), track_slots({4, -1, 3}), track_steps({1, -1, 0});
      h.backend->commit(acc.view, CommitTrack{track_slots.view, track_steps.view}, nullptr);
      h.backend->check_device_errors(nullptr);
      const AtOffset acc_dl(acc.view, 8), ts(track_slots.view, 4), tp(track_steps.view, 12);
      REQUIRE(kda_commit_tracked(c, acc_dl.dl.dl(), ts.dl.dl(), tp.dl.dl(), nullptr) == KDA_OK);
      REQUIRE(kda_check_device_errors(c, nullptr) == KDA_OK);
      CHECK(same_pool(c, h.pool()));  // the deferred pending counts and cursors too
      // The tracks as slots of their own: a round on them, then everything materialized.
      const BatchSpec next{kT, {4, 3}, {}};
      const std::vector<Activations> y = verify_all(h, next, 12);
      CHECK(c_verify_all(c, next, y));
      commit_both(h, c, {2, kT});
      const std::vector<int32_t> all = {0, 1, 2, 3, 4};
      h.backend->materialize(all, nullptr);
      REQUIRE(kda_materialize(c, all.data(), 5, nullptr) == KDA_OK);
      CHECK(same_pool(c, h.pool()));
      kda_backend_destroy(c);
    }
  }
}

TEST_CASE("capi: a tracked extend equals the C++ backend bitwise", "[capi]") {
  // kda_prepare_extend with track_slots / track_steps, then kda_extend on every layer (tensors
  // at a non-zero byte_offset): outputs, request slots and track slots as the C++ backend's
  // prepare_extend(batch, ExtendTrack) round; each mode.
  constexpr int kPrompt = 6;  // > T_max: extend needs no scratch
  for (const bool ring : {false, true}) {
    for (const bool deferred : {false, true}) {
      if (deferred && !ring) {
        continue;
      }
      CAPTURE(ring, deferred);
      Harness h(kGqaCase, ring, Platform{}, /*fused=*/true, deferred);
      kda_backend* c = mirror(h, ring, deferred);
      const BatchSpec batch{kPrompt, {1, -1, 0}, {}};
      const ExtendTrack track{{3, -1, 4}, {2, -1, kPrompt - 1}};
      std::vector<Activations> x;
      h.backend->prepare_extend(batch, track, nullptr);
      for (int layer = 0; layer < kLayers; ++layer) {
        x.push_back(make_activations(h.model, batch.slots, kPrompt, 40 + layer));
        h.backend->extend(layer, x.back().in, x.back().out_view, nullptr);
      }
      REQUIRE(kda_prepare_extend(c, kPrompt, batch.slots.data(), 3, track.slots.data(),
                                 track.steps.data(), nullptr) == KDA_OK);
      CHECK(c_run_all_at_offset(c, x, /*extend=*/true));
      CHECK(same_pool(c, h.pool()));
      // The track slots differ from the untracked extend's (they hold mid-prompt states).
      Harness plain(kGqaCase, ring, Platform{}, /*fused=*/true, deferred);
      plain.backend->prepare_extend(batch, nullptr);
      for (int layer = 0; layer < kLayers; ++layer) {
        Activations y = make_activations(h.model, batch.slots, kPrompt, 40 + layer);
        plain.backend->extend(layer, y.in, y.out_view, nullptr);
      }
      CHECK_FALSE(same_pool(c, plain.pool()));
      // Tracks without steps (or steps without slots) are refused, naming them.
      CHECK(kda_prepare_extend(c, kPrompt, batch.slots.data(), 3, track.slots.data(), nullptr,
                               nullptr) == KDA_ERROR_INVALID_ARGUMENT);
      CHECK(std::string(kda_last_error()).find("track_slots and track_steps") != std::string::npos);
      const int32_t bad_steps[] = {kPrompt, -1, 0};
      CHECK(kda_prepare_extend(c, kPrompt, batch.slots.data(), 3, track.slots.data(), bad_steps,
                               nullptr) == KDA_ERROR_INVALID_ARGUMENT);
      CHECK(std::string(kda_last_error()).find("track.steps[0] = 6") != std::string::npos);
      CHECK(same_pool(c, h.pool()));
      kda_backend_destroy(c);
    }
  }
}

TEST_CASE("capi: destroyed, foreign and garbage handles are refused, destroy is idempotent",
          "[capi]") {
  const kda_model_config m = c_model(model_for(kGqaCase));
  const std::vector<std::string> flags = flag_strings(/*ring=*/true, /*deferred=*/false);
  const std::vector<const char*> argv = c_strs(flags);
  auto create = [&] {
    kda_backend* b = nullptr;
    REQUIRE(kda_backend_create(&m, argv.data(), static_cast<int>(argv.size()), "host", nullptr,
                               &b) == KDA_OK);
    return b;
  };
  // Every entry point that takes a handle, with otherwise valid arguments.
  auto every_call = [&](kda_backend* b) {
    std::vector<int> status;
    int32_t slot = -1;
    const int32_t slots[] = {0};
    kda_backend_info info{};
    const char* state = nullptr;
    DLTensor view{};
    status.push_back(kda_allocate_slot(b, nullptr, &slot));
    status.push_back(kda_release_slot(b, 0));
    status.push_back(kda_copy_slot(b, 0, 1, nullptr));
    status.push_back(kda_prepare(b, 1, slots, 1, nullptr, nullptr));
    status.push_back(kda_prepare_extend(b, 1, slots, 1, nullptr, nullptr, nullptr));
    status.push_back(kda_materialize(b, slots, 1, nullptr));
    status.push_back(kda_abort_round(b, nullptr));
    status.push_back(kda_record_graph_verify_round(b));
    status.push_back(kda_check_device_errors(b, nullptr));
    status.push_back(kda_backend_info_get(b, &info));
    status.push_back(kda_round_state(b, &state));
    status.push_back(kda_pool_view(b, "ssm_state", 0, &view));
    status.push_back(kda_verify(b, 0, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr));
    status.push_back(kda_extend(b, 0, nullptr, nullptr, nullptr, nullptr, nullptr));
    status.push_back(kda_commit(b, nullptr, nullptr));
    status.push_back(kda_commit_tracked(b, nullptr, nullptr, nullptr, nullptr));
    status.push_back(kda_commit_tree(b, nullptr, nullptr, nullptr));
    status.push_back(kda_commit_tree_tracked(b, nullptr, nullptr, nullptr, nullptr, nullptr));
    status.push_back(kda_set_layer_weights(b, 0, nullptr, nullptr, nullptr, nullptr));
    CHECK(slot == -1);
    CHECK(state == nullptr);
    return status;
  };
  const std::vector<int> refused(19, KDA_ERROR_INVALID_ARGUMENT);

  kda_backend* first = create();
  kda_backend_destroy(first);
  CHECK(kda_last_error_code() == KDA_OK);
  // Another backend may take the first one's memory: the first handle stays unknown.
  kda_backend* second = create();
  CHECK(second != first);
  CHECK(every_call(first) == refused);
  CHECK(std::string(kda_last_error()).find("was destroyed") != std::string::npos);
  kda_backend_destroy(first);  // a double destroy: nothing happens
  CHECK(kda_last_error_code() == KDA_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kda_last_error()) ==
        fmt::format("destroy: backend {:#x} was destroyed (kda_backend_destroy); expected a live "
                    "handle",
                    reinterpret_cast<uintptr_t>(first)));
  kda_backend_info info{};
  REQUIRE(kda_backend_info_get(second, &info) == KDA_OK);  // the live one is untouched
  CHECK(info.free_slots == info.num_slots);

  // Values that never came from kda_backend_create: a small integer, a stack address, the
  // address of a real DLTensor, a handle-shaped value not yet issued, a live handle plus one.
  int local = 0;
  DLTensor not_a_backend{};
  const uintptr_t live = reinterpret_cast<uintptr_t>(second);
  for (const uintptr_t v :
       {uintptr_t{0x1234}, reinterpret_cast<uintptr_t>(&local),
        reinterpret_cast<uintptr_t>(&not_a_backend), live + (uintptr_t{1} << 20), live + 1}) {
    CAPTURE(v);
    auto* garbage = reinterpret_cast<kda_backend*>(v);
    CHECK(every_call(garbage) == refused);
    CHECK(std::string(kda_last_error()) ==
          fmt::format("set_layer_weights: backend {:#x} is not a handle made by "
                      "kda_backend_create",
                      v));
    kda_backend_destroy(garbage);
    CHECK(kda_last_error_code() == KDA_ERROR_INVALID_ARGUMENT);
  }
  CHECK(every_call(nullptr) == refused);
  CHECK(std::string(kda_last_error()) == "set_layer_weights: backend is NULL");
  kda_backend_destroy(nullptr);
  CHECK(kda_last_error_code() == KDA_OK);
  REQUIRE(kda_backend_info_get(second, &info) == KDA_OK);
  CHECK(info.free_slots == info.num_slots);
  kda_backend_destroy(second);
  CHECK(kda_last_error_code() == KDA_OK);
  CHECK(every_call(second) == refused);
}

TEST_CASE("capi: errors return the status, name the argument and change nothing", "[capi]") {
  Harness h(kGqaCase, /*ring=*/true, Platform{});
  kda_backend* c = mirror(h, /*ring=*/true, /*deferred=*/false);
  const BatchSpec batch{kT, {1, 0}, {}};
  const std::vector<Activations> x = verify_all(h, batch, 3);
  h.backend->abort_round(nullptr);
  const Activations& x0 = x[0];
  const Dl qkv(x0.in.mixed_qkv), a(x0.in.a), b(x0.in.b), out(x0.out_view);

  // Each failing call: its status, a message containing `needle`, and the pool and the round
  // state unchanged.
  auto pool_bytes = [&] {
    std::vector<std::vector<uint8_t>> bytes;
    for (const char* name : kPoolNames) {
      DLTensor t{};
      if (kda_pool_view(c, name, -1, &t) == KDA_OK) {
        bytes.push_back(bytes_of(pool_view(c, name)));
      }
    }
    return bytes;
  };
  auto round_state = [&] {
    const char* state = nullptr;
    REQUIRE(kda_round_state(c, &state) == KDA_OK);
    return std::string(state);
  };
  auto rejected = [&](const std::function<int()>& call, int want, const std::string& needle) {
    const auto before = pool_bytes();
    const std::string state = round_state();
    CHECK(call() == want);
    CHECK(kda_last_error_code() == want);
    const std::string msg = kda_last_error();
    CAPTURE(msg);
    CHECK(msg.find(needle) != std::string::npos);
    CHECK(pool_bytes() == before);
    CHECK(round_state() == state);
    CHECK(std::string(kda_last_error()).empty());  // the query succeeded: cleared
  };

  // Lifecycle.
  rejected([&] { return kda_verify(c, 0, qkv.dl(), a.dl(), b.dl(), out.dl(), nullptr, nullptr); },
           KDA_ERROR_LIFECYCLE, "verify(layer 0): no batch prepared (call prepare() first)");
  const Commit acc({2, 1});
  const Dl acc_dl(acc.view);
  rejected([&] { return kda_commit(c, acc_dl.dl(), nullptr); }, KDA_ERROR_LIFECYCLE,
           "commit: no verify round");

  // prepare / slots.
  const int32_t bad_slots[] = {1, 7};
  rejected([&] { return kda_prepare(c, kT, bad_slots, 2, nullptr, nullptr); },
           KDA_ERROR_INVALID_ARGUMENT, "prepare: slots[1] = 7 out of range");
  rejected([&] { return kda_prepare(c, kT, nullptr, 2, nullptr, nullptr); },
           KDA_ERROR_INVALID_ARGUMENT, "prepare: slots is NULL");
  const int32_t lengths[] = {2, 1}, parents[] = {-1, 0, 0, 1, -1, 0, 1, 2};
  const int32_t offsets[] = {0, 2, 3};
  rejected(
      [&] {
        return kda_prepare_shaped(c, kT, batch.slots.data(), 2, nullptr, lengths, nullptr, parents,
                                  nullptr);
      },
      KDA_ERROR_INVALID_ARGUMENT, "prepare: lengths (a ragged chain) and parents (a tree)");
  rejected(
      [&] {
        return kda_prepare_shaped(c, kT, batch.slots.data(), 2, nullptr, nullptr, offsets, nullptr,
                                  nullptr);
      },
      KDA_ERROR_INVALID_ARGUMENT, "prepare: offsets were given without lengths");
  rejected(
      [&] {
        return kda_prepare_shaped(c, 0, batch.slots.data(), 2, nullptr, nullptr, nullptr, parents,
                                  nullptr);
      },
      KDA_ERROR_INVALID_ARGUMENT, "prepare: T = 0 outside [1, 4] (--speculative-num-draft-tokens)");
  rejected(
      [&] {
        return kda_prepare_shaped(c, -3, batch.slots.data(), 2, nullptr, nullptr, nullptr, parents,
                                  nullptr);
      },
      KDA_ERROR_INVALID_ARGUMENT,
      "prepare: T = -3 outside [1, 4] (--speculative-num-draft-tokens)");
  const int32_t bad_lengths[] = {2, kT + 1};
  rejected(
      [&] {
        return kda_prepare_shaped(c, kT, batch.slots.data(), 2, nullptr, bad_lengths, nullptr,
                                  nullptr, nullptr);
      },
      KDA_ERROR_INVALID_ARGUMENT, "lengths");
  // Without --speculative-eagle-topk > 1 a tree is refused by the backend.
  rejected(
      [&] {
        return kda_prepare_shaped(c, kT, batch.slots.data(), 2, nullptr, nullptr, nullptr, parents,
                                  nullptr);
      },
      KDA_ERROR_INVALID_ARGUMENT, "parents");
  rejected([&] { return kda_commit_tree(c, acc_dl.dl(), acc_dl.dl(), nullptr); },
           KDA_ERROR_LIFECYCLE, "commit_tree: no verify round to commit");
  rejected([&] { return kda_release_slot(c, 9); }, KDA_ERROR_INVALID_ARGUMENT, "9");
  int32_t slot = -1;
  rejected([&] { return kda_allocate_slot(c, nullptr, &slot); }, KDA_ERROR_OUT_OF_MEMORY, "");
  CHECK(slot == -1);

  REQUIRE(kda_prepare(c, kT, batch.slots.data(), 2, nullptr, nullptr) == KDA_OK);
  REQUIRE(kda_prepare(c, kT, batch.slots.data(), 2, nullptr, nullptr) == KDA_OK);  // replaces

  // verify: the ABI's DLPack checks, then the backend's own messages.
  Dl f16(x0.in.mixed_qkv);
  f16.t.dtype = DLDataType{kDLFloat, 16, 1};
  rejected([&] { return kda_verify(c, 0, f16.dl(), a.dl(), b.dl(), out.dl(), nullptr, nullptr); },
           KDA_ERROR_INVALID_ARGUMENT,
           "verify(layer 0): mixed_qkv: dtype float16 unsupported, expected bfloat16");
  Dl lanes(x0.in.a);
  lanes.t.dtype.lanes = 2;
  rejected(
      [&] { return kda_verify(c, 0, qkv.dl(), lanes.dl(), b.dl(), out.dl(), nullptr, nullptr); },
      KDA_ERROR_INVALID_ARGUMENT,
      "verify(layer 0): a: dtype bfloat16x2 unsupported, expected bfloat16");
  rejected([&] { return kda_verify(c, 0, qkv.dl(), a.dl(), b.dl(), nullptr, nullptr, nullptr); },
           KDA_ERROR_INVALID_ARGUMENT, "verify(layer 0): out: NULL DLTensor");
  Dl vulkan(x0.in.b);
  vulkan.t.device = DLDevice{kDLVulkan, 0};
  rejected(
      [&] { return kda_verify(c, 0, qkv.dl(), a.dl(), vulkan.dl(), out.dl(), nullptr, nullptr); },
      KDA_ERROR_INVALID_ARGUMENT, "verify(layer 0): b: DLPack device type 7 unsupported");
  Dl on_cuda(x0.in.b);
  on_cuda.t.device = DLDevice{kDLCUDA, 0};
  rejected(
      [&] { return kda_verify(c, 0, qkv.dl(), a.dl(), on_cuda.dl(), out.dl(), nullptr, nullptr); },
      KDA_ERROR_INVALID_ARGUMENT, "b: expected memory on host, got cuda:0");
  Dl short_a(x0.in.a);
  short_a.shape[0] -= 1;
  rejected(
      [&] { return kda_verify(c, 0, qkv.dl(), short_a.dl(), b.dl(), out.dl(), nullptr, nullptr); },
      KDA_ERROR_INVALID_ARGUMENT, "verify(layer 0): a: ");
  Dl offset(x0.in.mixed_qkv);
  offset.t.byte_offset = 1;  // an odd address: misaligned bf16 elements
  CHECK(kda_verify(c, 0, offset.dl(), a.dl(), b.dl(), out.dl(), nullptr, nullptr) != KDA_OK);
  CHECK(std::string(kda_last_error()).find("mixed_qkv") != std::string::npos);
  rejected([&] { return kda_verify(c, 5, qkv.dl(), a.dl(), b.dl(), out.dl(), nullptr, nullptr); },
           KDA_ERROR_INVALID_ARGUMENT, "layer");

  // commit: before every layer is verified; a wrong dtype.
  rejected([&] { return kda_commit(c, acc_dl.dl(), nullptr); }, KDA_ERROR_LIFECYCLE,
           "commit: only 0 of 2 layers");
  Dl i64(acc.view);
  i64.t.dtype = DLDataType{kDLInt, 64, 1};
  rejected([&] { return kda_commit(c, i64.dl(), nullptr); }, KDA_ERROR_INVALID_ARGUMENT,
           "commit: accepted_lengths: dtype int64 unsupported, expected int32");
  rejected([&] { return kda_commit_tracked(c, acc_dl.dl(), nullptr, acc_dl.dl(), nullptr); },
           KDA_ERROR_INVALID_ARGUMENT, "commit: track.slots: NULL DLTensor");

  // Weights.
  const LayerWeights& w = h.weights[0].views;
  const Dl dt_bias(w.dt_bias), conv_weight(w.conv_weight), conv_bias(w.conv_bias);
  Dl A_log_f16(w.A_log);
  A_log_f16.t.dtype = DLDataType{kDLFloat, 16, 1};
  rejected(
      [&] {
        return kda_set_layer_weights(c, 0, A_log_f16.dl(), dt_bias.dl(), conv_weight.dl(),
                                     conv_bias.dl());
      },
      KDA_ERROR_INVALID_ARGUMENT,
      "set_layer_weights(layer 0): A_log: dtype float16 unsupported, expected float32");
  const Dl A_log(w.A_log);
  rejected(
      [&] {
        return kda_set_layer_weights(c, 0, A_log.dl(), A_log.dl(), conv_weight.dl(),
                                     conv_bias.dl());
      },
      KDA_ERROR_INVALID_ARGUMENT, "dt_bias");

  // Pool views and queries.
  DLTensor view{};
  rejected([&] { return kda_pool_view(c, "snapshots", -1, &view); }, KDA_ERROR_INVALID_ARGUMENT,
           "pool_view: snapshots is absent in ring mode");
  rejected([&] { return kda_pool_view(c, "bogus", 0, &view); }, KDA_ERROR_INVALID_ARGUMENT,
           "pool_view: unknown tensor 'bogus'");
  rejected([&] { return kda_pool_view(c, "ring_cursor", 0, &view); }, KDA_ERROR_INVALID_ARGUMENT,
           "ring_cursor has no layer dim");
  rejected([&] { return kda_backend_info_get(nullptr, nullptr); }, KDA_ERROR_INVALID_ARGUMENT,
           "backend_info: backend is NULL");

  // The last error is per thread.
  REQUIRE(kda_release_slot(c, 9) == KDA_ERROR_INVALID_ARGUMENT);
  std::string other = "unset";
  std::thread([&] { other = kda_last_error(); }).join();
  CHECK(other.empty());
  CHECK(std::string(kda_last_error()).find("9") != std::string::npos);
  CHECK(std::string(kda_status_name(KDA_ERROR_LIFECYCLE)) == "lifecycle");
  CHECK(std::string(kda_status_name(KDA_OK)) == "ok");
  CHECK(std::string(kda_status_name(42)) == "unknown");
  CHECK(kda_abi_version() == KDA_C_ABI_VERSION);

  // The round still runs after all of that, bitwise as the C++ backend's.
  REQUIRE(kda_abort_round(c, nullptr) == KDA_OK);
  CHECK(c_verify_all(c, batch, x));
  kda_backend_destroy(c);
}

TEST_CASE("capi: create validates flags, model and device", "[capi]") {
  const kda_model_config m = c_model(model_for(kGqaCase));
  kda_backend* b = reinterpret_cast<kda_backend*>(&b);  // create must reset it on error
  auto create = [&](std::vector<std::string> flags, const char* device,
                    const kda_model_config* model) {
    const std::vector<const char*> argv = c_strs(flags);
    return kda_backend_create(model, argv.data(), static_cast<int>(argv.size()), device, nullptr,
                              &b);
  };
  auto message = [] { return std::string(kda_last_error()); };
  CHECK(create({"--speculative-num-draft-tokens", "99"}, "host", &m) == KDA_ERROR_INVALID_ARGUMENT);
  CHECK(b == nullptr);
  CHECK(message().find("--speculative-num-draft-tokens") != std::string::npos);
  CHECK(create({"--max-running-requests", "2", "--bogus"}, "host", &m) ==
        KDA_ERROR_INVALID_ARGUMENT);
  CHECK(message() == "create: flags: '--bogus' is not a flag of the module (see backend/flags.h)");
  CHECK(create({}, "tpu", &m) == KDA_ERROR_INVALID_ARGUMENT);
  CHECK(message() == "create: device 'tpu' unsupported, expected \"host\", \"cuda\" or \"cuda:N\"");
  CHECK(create({}, "host", nullptr) == KDA_ERROR_INVALID_ARGUMENT);
  CHECK(message() == "create: model is NULL");
  CHECK(kda_backend_create(&m, nullptr, -1, "host", nullptr, &b) == KDA_ERROR_INVALID_ARGUMENT);
  CHECK(message() == "create: num_flags = -1 is negative, expected >= 0");
  CHECK(kda_backend_create(&m, nullptr, 2, "host", nullptr, &b) == KDA_ERROR_INVALID_ARGUMENT);
  CHECK(message() == "create: flags is NULL for 2 entries");
  kda_model_config bad = m;
  bad.HV = 3;
  CHECK(create({}, "host", &bad) == KDA_ERROR_INVALID_ARGUMENT);
  CHECK(message().find("HV") != std::string::npos);
  bad = m;
  bad.gate = 7;
  CHECK(create({}, "host", &bad) == KDA_ERROR_INVALID_ARGUMENT);
  CHECK(message().find("model.gate = 7") != std::string::npos);
  CHECK(b == nullptr);

  REQUIRE(create({"--max-running-requests=2"}, "host", &m) == KDA_OK);
  CHECK(message().empty());
  kda_backend_info info{};
  REQUIRE(kda_backend_info_get(b, &info) == KDA_OK);
  CHECK(info.num_slots == 2);
  CHECK(info.device_type == kDLCPU);
  CHECK(info.record_mode == KDA_MODE_SNAPSHOT);
  kda_backend_destroy(b);
  kda_backend_destroy(nullptr);
}

namespace {

// A kda_allocator over host memory that counts what is live.
struct CAllocatorCounts {
  std::map<void*, int64_t> live;
  int allocations = 0, frees = 0, bad_frees = 0, releases = 0;
  int64_t last_device_type = -1;
};

void* count_alloc(void* ctx, int64_t bytes, int32_t device_type, int32_t /*device_id*/,
                  void* /*stream*/) {
  auto* c = static_cast<CAllocatorCounts*>(ctx);
  void* p = std::aligned_alloc(256, static_cast<size_t>((bytes + 255) / 256 * 256));
  c->live[p] = bytes;
  ++c->allocations;
  c->last_device_type = device_type;
  return p;
}

void count_free(void* ctx, void* ptr, int64_t bytes, int32_t /*device_type*/, int32_t /*device_id*/,
                void* /*stream*/) {
  auto* c = static_cast<CAllocatorCounts*>(ctx);
  const auto it = c->live.find(ptr);
  if (it == c->live.end() || it->second != bytes) {
    ++c->bad_frees;
  } else {
    c->live.erase(it);
  }
  ++c->frees;
  std::free(ptr);
}

void count_release(void* ctx) { ++static_cast<CAllocatorCounts*>(ctx)->releases; }

// Every element of a view, packed (views of padded external tensors compare by elements).
std::vector<uint8_t> packed(const TensorView& v) {
  std::vector<uint8_t> out;
  auto take = [&out](const auto& vec) {
    const auto* p = reinterpret_cast<const uint8_t*>(vec.data());
    out.assign(p, p + vec.size() * sizeof(vec[0]));
  };
  if (v.dtype() == DType::kBF16) {
    take(to_host_vector<bf16_t>(v));
  } else if (v.dtype() == DType::kF32) {
    take(to_host_vector<float>(v));
  } else {
    take(to_host_vector<int32_t>(v));
  }
  return out;
}

bool same_pool_elements(kda_backend* c, const KdaStatePool& cpp) {
  bool same = true;
  for (const char* name : kPoolNames) {
    const TensorView want = cpp_pool_view(cpp, name);
    if (!want.defined()) {
      continue;
    }
    if (packed(pool_view(c, name)) != packed(want)) {
      UNSCOPED_INFO("pool tensor " << name << " differs");
      same = false;
    }
  }
  return same;
}

// An engine-owned [layers, S + 1, ...] tensor with a padded slot pitch (16 bytes), host memory.
struct Padded {
  Buffer buf;
  TensorView view;
  Padded(DType dt, std::vector<int64_t> shape) : buf() {
    const int nd = static_cast<int>(shape.size());
    const int64_t pad = 16 / dtype_size(dt);
    std::vector<int64_t> strides(static_cast<size_t>(nd), 1);
    int64_t s = 1;
    for (int d = nd - 1; d >= 0; --d) {
      strides[static_cast<size_t>(d)] = s;
      s *= shape[static_cast<size_t>(d)];
      if (d == 1 && nd > 2) {
        strides[1] += pad;
        s = strides[1] * shape[1];
      }
    }
    buf = Buffer(Device::host(), s * dtype_size(dt));
    std::memset(buf.data(), 0x77, static_cast<size_t>(buf.bytes()));
    view = TensorView::strided(buf.data(), dt, Device::host(), shape.data(), strides.data(), nd);
  }
};

}  // namespace

TEST_CASE("capi: an engine allocator and an external pool equal the C++ backend bitwise",
          "[capi]") {
  for (const bool deferred : {false, true}) {
    CAPTURE(deferred);
    Harness h(kGqaCase, /*ring=*/true, Platform{}, /*fused=*/true, deferred);
    const ModelConfig& m = h.model;
    const int64_t S = h.pool().num_slots(), D = m.qkv_dim();
    // The engine owns the state and rings (one spare slot, padded pitches); the rest comes from
    // its allocator.
    Padded conv(DType::kBF16, {kLayers, S + 1, 3, D}),
        ssm(DType::kF32, {kLayers, S + 1, 4, 64, 64});
    Padded rawv(DType::kBF16, {kLayers, S + 1, 4, 8, 64}),
        rawk(DType::kBF16, {kLayers, S + 1, 2, 8, 64});
    Padded g(DType::kF32, {kLayers, S + 1, 4, 8, 64}), beta(DType::kF32, {kLayers, S + 1, 4, 8});
    const Dl conv_dl(conv.view), ssm_dl(ssm.view), rawv_dl(rawv.view), rawk_dl(rawk.view),
        g_dl(g.view), beta_dl(beta.view);
    kda_state_tensors external{};
    external.conv_state = conv_dl.dl();
    external.ssm_state = ssm_dl.dl();
    external.ring_rawv = rawv_dl.dl();
    external.ring_rawk = rawk_dl.dl();
    external.ring_g = g_dl.dl();
    external.ring_beta = beta_dl.dl();
    CAllocatorCounts counts;
    const kda_allocator allocator{&counts, count_alloc, count_free, count_release};
    kda_backend_options options{};
    options.extra_slots = 1;
    options.allocator = &allocator;
    options.external_pool = &external;
    const kda_model_config cm = c_model(m);
    const std::vector<std::string> flags = flag_strings(true, deferred);
    const std::vector<const char*> argv = c_strs(flags);
    kda_backend* c = nullptr;
    REQUIRE(kda_backend_create(&cm, argv.data(), static_cast<int>(argv.size()), "host", &options,
                               &c) == KDA_OK);
    CHECK(counts.last_device_type == kDLCPU);
    for (int layer = 0; layer < kLayers; ++layer) {
      const LayerWeights& w = h.weights[static_cast<size_t>(layer)].views;
      const Dl A_log(w.A_log), dt_bias(w.dt_bias), cw(w.conv_weight), cb(w.conv_bias);
      REQUIRE(kda_set_layer_weights(c, layer, A_log.dl(), dt_bias.dl(), cw.dl(), cb.dl()) ==
              KDA_OK);
    }
    // The engine wrote its state itself and claims its slots by number, last first.
    from_host_vector(to_host_vector<bf16_t>(h.pool().conv_state_all()), conv.view.narrow(1, 0, S));
    from_host_vector(to_host_vector<float>(h.pool().ssm_state_all()), ssm.view.narrow(1, 0, S));
    for (int32_t slot = static_cast<int32_t>(S) - 1; slot >= 0; --slot) {
      REQUIRE(kda_claim_slot(c, slot, KDA_SLOT_KEEP_STATE, nullptr) == KDA_OK);
    }
    CHECK(kda_claim_slot(c, 2, KDA_SLOT_ZERO, nullptr) == KDA_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(kda_last_error()) ==
          "claim_slot: slot 2 is already allocated (release it first)");
    CHECK(kda_claim_slot(c, 2, 5, nullptr) == KDA_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(kda_last_error()).find("claim_slot: init = 5 unknown") == 0);
    // The rings are scratch the rounds overwrite; both start from the C++ backend's.
    for (const char* name : {"ring_rawv", "ring_rawk", "ring_g", "ring_beta"}) {
      const TensorView src = cpp_pool_view(h.pool(), name), dst = pool_view(c, name);
      if (src.dtype() == DType::kBF16) {
        from_host_vector(to_host_vector<bf16_t>(src), dst);
      } else {
        from_host_vector(to_host_vector<float>(src), dst);
      }
    }
    REQUIRE(same_pool_elements(c, h.pool()));

    kda_memory_report r{};
    REQUIRE(kda_memory_report_get(c, &r) == KDA_OK);
    int64_t live = 0;
    for (const auto& [p, b] : counts.live) {
      live += b;
    }
    CHECK(r.from_allocator == 1);
    CHECK(r.allocated_bytes == live);  // every byte the backend owns came from the allocator
    CHECK(r.external_bytes ==
          r.conv_state_bytes + r.ssm_state_bytes +
              kLayers * S * (4 * 8 * 64 * 2 + 2 * 8 * 64 * 2 + 4 * 8 * 64 * 4 + 4 * 8 * 4));
    CHECK(r.pool_bytes == r.conv_state_bytes + r.ssm_state_bytes + r.ring_bytes +
                              r.conv_window_bytes + r.snapshot_bytes + r.qkv_act_bytes);
    CHECK(r.total_bytes == r.pool_bytes + r.workspace_bytes);
    CHECK(r.allocated_bytes + r.external_bytes == r.total_bytes);
    CHECK(r.pool_bytes == h.backend->memory_report().total_bytes);
    CHECK(kda_memory_report_get(c, nullptr) == KDA_ERROR_INVALID_ARGUMENT);

    BatchSpec ragged{kT, {3, -1, 1}, {2, 0, 1}};
    ragged.lengths = {2, 1, kT};
    const std::vector<Activations> x1 = verify_shaped_all(h, ragged, 5);
    CHECK(c_verify_all(c, ragged, x1));
    commit_both(h, c, {2, 1, 3});
    CHECK(same_pool_elements(c, h.pool()));
    const BatchSpec dense{kT, {0, 4, 2}, {}};
    const std::vector<Activations> x2 = verify_all(h, dense, 6);
    CHECK(c_verify_all(c, dense, x2));
    commit_both(h, c, {4, 1, 2});
    const std::vector<int32_t> all = {0, 1, 2, 3, 4};
    h.backend->materialize(all, nullptr);
    REQUIRE(kda_materialize(c, all.data(), 5, nullptr) == KDA_OK);
    CHECK(same_pool_elements(c, h.pool()));
    // The spare slot and the padding are the engine's: untouched.
    const auto spare = packed(ssm.view.select(1, S));
    CHECK(std::all_of(spare.begin(), spare.end(), [](uint8_t b) { return b == 0x77; }));
    kda_backend_destroy(c);
    CHECK(counts.live.empty());
    CHECK(counts.bad_frees == 0);
    CHECK(counts.releases == 1);
    CHECK(counts.frees == counts.allocations);
  }
}

TEST_CASE("capi: engine memory errors name the argument and leave nothing behind", "[capi]") {
  const ModelConfig m = model_for(kGqaCase);
  const kda_model_config cm = c_model(m);
  const std::vector<std::string> flags = flag_strings(true, false);
  const std::vector<const char*> argv = c_strs(flags);
  CAllocatorCounts counts;
  kda_allocator allocator{&counts, count_alloc, nullptr, count_release};
  kda_backend_options options{};
  options.allocator = &allocator;
  options.extra_slots = 1;  // S = 5
  kda_backend* c = nullptr;
  auto create = [&] {
    return kda_backend_create(&cm, argv.data(), static_cast<int>(argv.size()), "host", &options,
                              &c);
  };
  CHECK(create() == KDA_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kda_last_error()) ==
        "create: options.allocator: alloc and free must both be given (alloc set, free NULL)");
  allocator.free = count_free;
  // A wrong dtype, a wrong shape: named, nothing allocated, the allocator released.
  Padded ssm(DType::kF32, {kLayers, 5, 4, 64, 64});
  Dl ssm_dl(ssm.view);
  ssm_dl.t.dtype = DLDataType{kDLInt, 64, 1};
  kda_state_tensors external{};
  external.ssm_state = ssm_dl.dl();
  options.external_pool = &external;
  CHECK(create() == KDA_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kda_last_error()) ==
        "create: external_pool.ssm_state: dtype int64 unsupported, expected bfloat16 or float32 "
        "or int32");
  const Dl short_dl(ssm.view.narrow(1, 0, 4));
  external.ssm_state = short_dl.dl();
  CHECK(create() == KDA_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kda_last_error()) ==
        "external_pool.ssm_state: expected shape [2, >= 5, 4, 64, 64], got [2, 4, 4, 64, 64] (too "
        "small, or another layout)");
  CHECK(c == nullptr);
  CHECK(counts.allocations == 0);
  CHECK(counts.releases == 3);  // each failed create let its allocator go

  // The ops: a NULL op, a wrong state dtype, named.
  CHECK(kda_op_verify(nullptr, nullptr, nullptr) == KDA_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kda_last_error()) == "ops.verify: op is NULL");
  kda_verify_op op{};
  CHECK(kda_op_verify(&op, nullptr, nullptr) == KDA_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kda_last_error()).find("ops.verify: mixed_qkv: NULL DLTensor") == 0);
  kda_commit_op cop{};
  CHECK(kda_op_commit(&cop, nullptr, nullptr) == KDA_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kda_last_error()) == "ops.commit: state.ssm_state: NULL DLTensor");
  CHECK(kda_op_materialize(nullptr, nullptr, nullptr) == KDA_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kda_last_error()) == "ops.materialize: state is NULL");
}

TEST_CASE("capi: kda_op_verify / kda_op_commit / kda_op_materialize equal the C++ backend",
          "[capi]") {
  for (const bool deferred : {false, true}) {
    CAPTURE(deferred);
    Harness h(kGqaCase, /*ring=*/true, Platform{}, /*fused=*/true, deferred);
    h.fill_scratch(2);
    const KdaStatePool& p = h.pool();
    // The engine's copy of the pool (its own buffers), packed.
    std::vector<Buffer> owned;
    auto copy = [&](const TensorView& v) {
      if (!v.defined()) {
        return TensorView();
      }
      owned.emplace_back(Device::host(), v.span_bytes());
      std::memcpy(owned.back().data(), v.data(), static_cast<size_t>(v.span_bytes()));
      std::vector<int64_t> shape, strides;
      for (int d = 0; d < v.ndim(); ++d) {
        shape.push_back(v.size(d));
        strides.push_back(v.stride(d));
      }
      return TensorView::strided(owned.back().data(), v.dtype(), Device::host(), shape.data(),
                                 strides.data(), v.ndim());
    };
    owned.reserve(16);
    const TensorView conv = copy(p.conv_state_all()), ssm = copy(p.ssm_state_all());
    const TensorView window = copy(p.conv_window_all()), act = copy(p.qkv_act());
    const TensorView rawv = copy(p.ring_rawv_all()), rawk = copy(p.ring_rawk_all());
    const TensorView g = copy(p.ring_g_all()), beta = copy(p.ring_beta_all());
    const TensorView cursor = deferred ? copy(p.ring_cursor()) : TensorView();
    const TensorView pending = deferred ? copy(p.ring_pending_all()) : TensorView();
    const TensorView u = deferred ? copy(p.ring_u_all()) : TensorView();
    for (int round = 0; round < 2; ++round) {
      CAPTURE(round);
      BatchSpec ragged{kT, {3, -1, 1}, {2, 0, 1}};
      ragged.lengths = {2, 1, kT};
      const std::vector<Activations> x = verify_shaped_all(h, ragged, 9 + round);
      const Commit slots(ragged.slots), rows(ragged.rows), qsl({0, 2, 3, 3 + kT});
      kda_batch_tensors batch{};
      batch.T = kT;
      const Dl slots_dl(slots.view), rows_dl(rows.view), qsl_dl(qsl.view);
      batch.slots = slots_dl.dl();
      batch.rows = rows_dl.dl();
      batch.query_start_loc = qsl_dl.dl();
      for (int layer = 0; layer < kLayers; ++layer) {
        const Activations& xa = x[static_cast<size_t>(layer)];
        const LayerWeights& w = h.weights[static_cast<size_t>(layer)].views;
        Buffer out(Device::host(), xa.out_view.span_bytes());
        const TensorView out_view =
            out.view(DType::kBF16, {xa.out_view.size(0), xa.out_view.size(1), xa.out_view.size(2)});
        const Dl qkv(xa.in.mixed_qkv), a(xa.in.a), b(xa.in.b), o(out_view);
        const Dl A_log(w.A_log), dt_bias(w.dt_bias), cw(w.conv_weight), cb(w.conv_bias);
        const Dl c_dl(conv.select(0, layer)), s_dl(ssm.select(0, layer)),
            w_dl(window.select(0, layer)), act_dl(act), rv(rawv.select(0, layer)),
            rk(rawk.select(0, layer)), gg(g.select(0, layer)), bt(beta.select(0, layer));
        kda_verify_op op{};
        op.mixed_qkv = qkv.dl();
        op.a = a.dl();
        op.b = b.dl();
        op.out = o.dl();
        op.A_log = A_log.dl();
        op.dt_bias = dt_bias.dl();
        op.conv_weight = cw.dl();
        op.conv_bias = cb.dl();
        op.state.conv_state = c_dl.dl();
        op.state.ssm_state = s_dl.dl();
        op.state.conv_window = w_dl.dl();
        op.state.qkv_act = act_dl.dl();
        op.state.ring_rawv = rv.dl();
        op.state.ring_rawk = rk.dl();
        op.state.ring_g = gg.dl();
        op.state.ring_beta = bt.dl();
        std::vector<Dl> deferred_dls;
        if (deferred) {
          deferred_dls.reserve(3);
          deferred_dls.emplace_back(cursor);
          deferred_dls.emplace_back(pending.select(0, layer));
          deferred_dls.emplace_back(u.select(0, layer));
          op.state.ring_cursor = deferred_dls[0].dl();
          op.state.ring_pending = deferred_dls[1].dl();
          op.state.ring_u = deferred_dls[2].dl();
        }
        op.batch = batch;
        op.gate = KDA_GATE_STANDARD;
        op.fused_verify = 1;
        op.fused_ring_max_batch = 1;
        kda_dispatch_info info{};
        // A numerics value outside KDA_NUMERICS_* is named before anything runs.
        op.numerics = 3;
        CHECK(kda_op_verify(&op, nullptr, &info) == KDA_ERROR_INVALID_ARGUMENT);
        CHECK(std::string(kda_last_error()) ==
              "ops.verify: numerics = 3 unsupported, expected KDA_NUMERICS_AUTO (0), "
              "KDA_NUMERICS_EXACT (1) or KDA_NUMERICS_FAST (2)");
        // The eager rounds ask for exact outputs, the deferred ones leave auto (0): the reason
        // says which (the host platform runs ring mode unfused).
        op.numerics = deferred ? KDA_NUMERICS_AUTO : KDA_NUMERICS_EXACT;
        REQUIRE(kda_op_verify(&op, nullptr, &info) == KDA_OK);
        const DispatchDecision d = *h.backend->stats().last_decision[static_cast<size_t>(layer)];
        CHECK(info.fused == (d.fused() ? 1 : 0));
        CHECK(std::string(info.reason) == dispatch_reason_name(d.reason));
        CHECK(info.fast_outputs == 0);
        CHECK(std::string(info.numerics_reason) ==
              (deferred ? "exact_unfused" : "exact_requested"));
        CHECK(same_bits(out_view, xa.out_view));
      }
      const std::vector<int32_t> accepted = {2, 1, 3};
      commit(h, accepted);
      const Commit acc(accepted), checked({0, 0, 0});
      const Dl acc_dl(acc.view), checked_dl(checked.view);
      const Dl c_dl(conv), s_dl(ssm), w_dl(window), rv(rawv), rk(rawk), gg(g), bt(beta);
      kda_commit_op cop{};
      cop.state.conv_state = c_dl.dl();
      cop.state.ssm_state = s_dl.dl();
      cop.state.conv_window = w_dl.dl();
      cop.state.ring_rawv = rv.dl();
      cop.state.ring_rawk = rk.dl();
      cop.state.ring_g = gg.dl();
      cop.state.ring_beta = bt.dl();
      std::vector<Dl> deferred_dls;
      if (deferred) {
        deferred_dls.reserve(3);
        deferred_dls.emplace_back(cursor);
        deferred_dls.emplace_back(pending);
        deferred_dls.emplace_back(u);
        cop.state.ring_cursor = deferred_dls[0].dl();
        cop.state.ring_pending = deferred_dls[1].dl();
        cop.state.ring_u = deferred_dls[2].dl();
      }
      cop.batch = batch;
      cop.accepted_lengths = acc_dl.dl();
      cop.checked_accepted = checked_dl.dl();
      kda_commit_info info{};
      REQUIRE(kda_op_commit(&cop, nullptr, &info) == KDA_OK);
      CHECK(info.deferred == (deferred ? 1 : 0));
      CHECK(std::string(info.reason) == (deferred ? "deferred_record" : "ring_fold"));
      if (round == 1 && deferred) {
        const std::vector<int32_t> every = {0, 1, 2, 3, 4};
        h.backend->materialize(every, nullptr);
        const Commit all(every);
        const Dl all_dl(all.view);
        REQUIRE(kda_op_materialize(&cop.state, all_dl.dl(), nullptr) == KDA_OK);
      }
      CHECK(same_bits(conv, bytes_of(p.conv_state_all())));
      CHECK(same_bits(ssm, bytes_of(p.ssm_state_all())));
      CHECK(same_bits(rawk, bytes_of(p.ring_rawk_all())));
      CHECK(same_bits(window, bytes_of(p.conv_window_all())));
      if (deferred) {
        CHECK(same_bits(pending, bytes_of(p.ring_pending_all())));
        CHECK(same_bits(cursor, bytes_of(p.ring_cursor())));
      }
    }
  }
}

TEST_CASE("capi: --kda-verify-numerics reaches kda_verify's dispatch info", "[capi]") {
  // The flag as an argv string, through kda_backend_create, to each verify's decision: the same
  // numerics and reason as the C++ backend made with the same flags. The host platform runs ring
  // mode unfused, so fast and auto stay exact there, with the unfused path's reason.
  for (const bool ring : {false, true}) {
    for (const NumericsRequest request :
         {NumericsRequest::kAuto, NumericsRequest::kExact, NumericsRequest::kFast}) {
      const std::string name = numerics_request_name(request);
      CAPTURE(ring, name);
      EngineFlags f = flags_for(ring, /*deferred=*/false);
      f.verify_numerics = static_cast<int>(request);
      Harness h(kGqaCase, f, Platform{});
      kda_backend* c = mirror(h, ring, /*deferred=*/false, {"--kda-verify-numerics", name});
      const BatchSpec batch{kT, {3, 1}};
      const std::vector<Activations> x = verify_all(h, batch, 70);
      REQUIRE(kda_prepare(c, batch.T, batch.slots.data(), 2, nullptr, nullptr) == KDA_OK);
      for (int layer = 0; layer < kLayers; ++layer) {
        const Activations& xa = x[static_cast<size_t>(layer)];
        Buffer out(Device::host(), xa.out_view.span_bytes());
        const TensorView out_view =
            out.view(DType::kBF16, {xa.out_view.size(0), xa.out_view.size(1), xa.out_view.size(2)});
        const Dl qkv(xa.in.mixed_qkv), a(xa.in.a), b(xa.in.b), o(out_view);
        kda_dispatch_info info{};
        REQUIRE(kda_verify(c, layer, qkv.dl(), a.dl(), b.dl(), o.dl(), nullptr, &info) == KDA_OK);
        const DispatchDecision d = *h.backend->stats().last_decision[static_cast<size_t>(layer)];
        CHECK(info.fast_outputs == (d.fast_outputs() ? 1 : 0));
        CHECK(std::string(info.numerics_reason) == numerics_reason_name(d.numerics_reason));
        CHECK(std::string(info.numerics_reason) == (request == NumericsRequest::kExact
                                                        ? "exact_requested"
                                                    : ring ? "exact_unfused"
                                                           : "exact_snapshot_mode"));
        CHECK(same_bits(out_view, xa.out_view));
      }
      kda_backend_destroy(c);
    }
  }
  // A bad value is the parser's error, verbatim.
  const kda_model_config m = c_model(model_for(kGqaCase));
  const std::vector<std::string> flags = {"--kda-verify-numerics", "tf32"};
  const std::vector<const char*> argv = c_strs(flags);
  kda_backend* b = nullptr;
  CHECK(kda_backend_create(&m, argv.data(), 2, "host", nullptr, &b) == KDA_ERROR_INVALID_ARGUMENT);
  CHECK(b == nullptr);
  CHECK(std::string(kda_last_error()) ==
        "--kda-verify-numerics: invalid value 'tf32' (expected auto, exact or fast)");
}
