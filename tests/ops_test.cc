// ops_test.cc: kda::ops (backend/ops.h) on an engine's own buffers, SGLang-shaped (MambaPool
// style: [layers, size + 1, ...] in contract §2's layouts, the last slot the engine's dummy one;
// index tensors on the device), against KdaAttentionBackend, bitwise: the same rounds (dense,
// ragged and tree drafts; snapshot mode, eager, deferred and lazy ring mode; padding rows, explicit
// scratch rows, random accepted lengths and paths), then materialize: every output and every
// state, record and scratch tensor equal. Each bad argument is a kda::Error naming it, and
// changes nothing (outputs, state and scratch bitwise as before).
//
// Runs on the host reference (ops_test, CI) and, linked with :backend_fixture_cuda, on the CUDA
// kernels (ops_cuda_test, GPU host).
#include <algorithm>
#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/kda_backend.h"
#include "backend/kernel_set_factory.h"
#include "backend/ops.h"
#include "core/platform.h"
#include "tests/backend_fixture.h"

using namespace kda;
using namespace kda::testing;

namespace {

TensorView i32_view(const Buffer& b, std::initializer_list<int64_t> shape) {
  return b.view(DType::kI32, shape);
}

// The engine's pool: one packed buffer per tensor, S + 1 slots (SGLang's size + 1).
struct EnginePool {
  std::vector<Buffer> buffers;
  ops::StateTensors stack;  // [layers, ...]

  ops::StateTensors layer(int l) const {
    ops::StateTensors t;
    auto sel = [l](const TensorView& v) { return v.defined() ? v.select(0, l) : TensorView(); };
    t.conv_state = sel(stack.conv_state);
    t.ssm_state = sel(stack.ssm_state);
    t.conv_window = sel(stack.conv_window);
    t.snapshots = sel(stack.snapshots);
    t.ring_rawv = sel(stack.ring_rawv);
    t.ring_rawk = sel(stack.ring_rawk);
    t.ring_g = sel(stack.ring_g);
    t.ring_beta = sel(stack.ring_beta);
    t.ring_pending = sel(stack.ring_pending);
    t.ring_cursor = stack.ring_cursor;
    t.ring_u = sel(stack.ring_u);
    t.qkv_act = stack.qkv_act;
    return t;
  }
};

// Pairs of (the backend pool's view, the engine's view over its first S slots).
std::vector<std::pair<TensorView, TensorView>> pairs(const KdaStatePool& p, const EnginePool& e) {
  const int S = p.num_slots();
  auto slots = [S](const TensorView& v, int dim) {
    return v.defined() ? v.narrow(dim, 0, S) : TensorView();
  };
  return {{p.conv_state_all(), slots(e.stack.conv_state, 1)},
          {p.ssm_state_all(), slots(e.stack.ssm_state, 1)},
          {p.conv_window_all(), e.stack.conv_window},
          {p.snapshots_all(), e.stack.snapshots},
          {p.ring_rawv_all(), slots(e.stack.ring_rawv, 1)},
          {p.ring_rawk_all(), slots(e.stack.ring_rawk, 1)},
          {p.ring_g_all(), slots(e.stack.ring_g, 1)},
          {p.ring_beta_all(), slots(e.stack.ring_beta, 1)},
          {p.ring_pending_all(), slots(e.stack.ring_pending, 1)},
          {p.ring_cursor(), slots(e.stack.ring_cursor, 0)},
          {p.ring_u_all(), slots(e.stack.ring_u, 1)}};
}

// The engine's pool, starting as a copy of the backend's (state, scratch and records), with one
// more slot (never used) and `deferred`'s tensors when the backend defers.
EnginePool engine_copy(const KdaStatePool& p) {
  EnginePool e;
  auto like = [&](const TensorView& v, bool slot_dim_plus_one, int slot_dim) {
    if (!v.defined()) {
      return TensorView();
    }
    std::vector<int64_t> shape;
    for (int d = 0; d < v.ndim(); ++d) {
      shape.push_back(v.size(d) + (slot_dim_plus_one && d == slot_dim ? 1 : 0));
    }
    int64_t n = 1;
    for (int64_t x : shape) {
      n *= x;
    }
    e.buffers.emplace_back(kTestDevice, n * dtype_size(v.dtype()));
    const std::vector<uint8_t> junk(static_cast<size_t>(e.buffers.back().bytes()), 0x5A);
    e.buffers.back().upload(junk.data(), e.buffers.back().bytes());
    const TensorView whole = TensorView::contiguous(e.buffers.back().data(), v.dtype(), kTestDevice,
                                                    shape.data(), v.ndim());
    const TensorView part = slot_dim_plus_one ? whole.narrow(slot_dim, 0, v.size(slot_dim)) : whole;
    switch (v.dtype()) {
      case DType::kBF16:
        from_host_vector(to_host_vector<bf16_t>(v), part);
        break;
      case DType::kF32:
        from_host_vector(to_host_vector<float>(v), part);
        break;
      default:
        from_host_vector(to_host_vector<int32_t>(v), part);
        break;
    }
    return whole;
  };
  e.buffers.reserve(12);
  e.stack.conv_state = like(p.conv_state_all(), true, 1);
  e.stack.ssm_state = like(p.ssm_state_all(), true, 1);
  e.stack.conv_window = like(p.conv_window_all(), false, 1);
  e.stack.snapshots = like(p.snapshots_all(), false, 1);
  e.stack.ring_rawv = like(p.ring_rawv_all(), true, 1);
  e.stack.ring_rawk = like(p.ring_rawk_all(), true, 1);
  e.stack.ring_g = like(p.ring_g_all(), true, 1);
  e.stack.ring_beta = like(p.ring_beta_all(), true, 1);
  e.stack.qkv_act = like(p.qkv_act(), false, 0);
  if (p.config().deferred_commit) {
    e.stack.ring_cursor = like(p.ring_cursor(), true, 0);
    e.stack.ring_pending = like(p.ring_pending_all(), true, 1);
    e.stack.ring_u = like(p.ring_u_all(), true, 1);
  }
  return e;
}

void check_same(const KdaStatePool& p, const EnginePool& e) {
  const char* names[] = {"conv_state",   "ssm_state",   "conv_window", "snapshots",
                         "ring_rawv",    "ring_rawk",   "ring_g",      "ring_beta",
                         "ring_pending", "ring_cursor", "ring_u"};
  const auto all = pairs(p, e);
  for (size_t i = 0; i < all.size(); ++i) {
    CAPTURE(names[i]);
    if (!all[i].second.defined()) {
      continue;  // eager pools keep a cursor and pending counts the engine needs not have
    }
    CHECK(packed_bytes(all[i].first) == packed_bytes(all[i].second));
  }
}

// Every byte of the engine's buffers.
std::vector<std::vector<uint8_t>> engine_bytes(const EnginePool& e) {
  std::vector<std::vector<uint8_t>> all;
  for (const Buffer& b : e.buffers) {
    std::vector<uint8_t> v(static_cast<size_t>(b.bytes()));
    b.download(v.data(), b.bytes());
    all.push_back(std::move(v));
  }
  return all;
}

struct Case {
  const char* name;
  bool ring, deferred;
  int topk;
  bool fused;
  bool lazy = false;  ///< the lazy write-back
};

// The engine's side of one round: the index tensors it keeps on the device.
struct EngineRound {
  Buffer slots, rows, qsl, parents, accepted, paths, checked, flag;
  ops::BatchTensors batch;
  TensorView accepted_view, paths_view, checked_view, flag_view;
};

EngineRound engine_round(const BatchSpec& b, const std::vector<int32_t>& accepted,
                         const std::vector<int32_t>& paths) {
  const int64_t B = static_cast<int64_t>(b.slots.size());
  std::vector<int32_t> rows = b.rows;
  if (rows.empty()) {
    rows.resize(static_cast<size_t>(B));
    std::iota(rows.begin(), rows.end(), 0);
  }
  std::vector<int32_t> qsl;
  if (!b.lengths.empty()) {
    qsl.push_back(0);
    for (int32_t len : b.lengths) {
      qsl.push_back(qsl.back() + len);
    }
  }
  EngineRound r{device_i32(b.slots),
                device_i32(rows),
                device_i32(qsl),
                device_i32(b.parents),
                device_i32(accepted),
                device_i32(paths),
                device_i32(std::vector<int32_t>(static_cast<size_t>(B), 0)),
                device_i32({0}),
                ops::BatchTensors{},
                TensorView(),
                TensorView(),
                TensorView(),
                TensorView()};
  r.batch.T = b.T;
  r.batch.slots = i32_view(r.slots, {B});
  r.batch.rows = i32_view(r.rows, {B});
  if (!qsl.empty()) {
    r.batch.query_start_loc = i32_view(r.qsl, {B + 1});
  }
  if (!b.parents.empty()) {
    r.batch.parents = i32_view(r.parents, {B, int64_t{b.T}});
    r.paths_view = i32_view(r.paths, {B, int64_t{b.T}});
  }
  r.accepted_view = i32_view(r.accepted, {B});
  r.checked_view = i32_view(r.checked, {B});
  r.flag_view = i32_view(r.flag, {1});
  return r;
}

ops::VerifyArgs verify_args(const Harness& h, const EnginePool& e, const EngineRound& r, int layer,
                            const VerifyInputs& in, const TensorView& out) {
  ops::VerifyArgs a;
  a.mixed_qkv = in.mixed_qkv;
  a.a = in.a;
  a.b = in.b;
  a.out = out;
  a.weights = h.weights[static_cast<size_t>(layer)].views;
  a.state = e.layer(layer);
  a.batch = r.batch;
  a.options.gate = h.model.gate;
  a.options.lower_bound = h.model.lower_bound;
  a.options.dispatch = h.backend->flags().dispatch_flags();
  a.options.platform = h.backend->platform();
  a.options.lazy = h.backend->lazy_write_back();
  return a;
}

}  // namespace

TEST_CASE("ops: an ops call sequence on SGLang-shaped buffers is bitwise the backend's", "[ops]") {
  const Case c = GENERATE(values<Case>({{"snapshot, fused", false, false, 1, true},
                                        {"snapshot, unfused", false, false, 1, false},
                                        {"ring eager", true, false, 1, true},
                                        {"ring deferred", true, true, 1, true},
                                        {"snapshot trees", false, false, 2, true},
                                        {"ring trees", true, false, 2, true},
                                        {"ring lazy", true, true, 1, true, true}}));
  CAPTURE(c.name);
  EngineFlags f = flags_for(c.ring, c.deferred);
  if (c.lazy) {
    f.deferred_commit = static_cast<int>(DeferredCommit::kLazy);
  }
  f.eagle_topk = c.topk;
  f.fused_verify = c.fused;
  f.fused_ring_max_batch = 2;
  Harness h(model_for(kGqaCase), f, fake_platform(9, 0));
  h.fill_scratch(4);
  EnginePool e = engine_copy(h.pool());
  check_same(h.pool(), e);
  const std::unique_ptr<KernelSet> kernel_set = make_kernel_set(kTestDevice);
  KernelSet& kernels = *kernel_set;
  const int S = h.pool().num_slots(), R = f.max_running_requests;
  std::mt19937 rng(580);
  int fused = 0, unfused = 0;
  for (int round = 0; round < 10; ++round) {
    CAPTURE(round);
    // A random batch: 1..R requests, a padding row sometimes, explicit rows sometimes.
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
    const bool tree = c.topk > 1;
    const int T = tree ? 2 + static_cast<int>(rng() % (kT - 1)) : 1 + static_cast<int>(rng() % kT);
    BatchSpec batch(T, slots, rows);
    std::vector<int32_t> accepted, paths;
    int64_t N = int64_t{B} * T;
    if (tree) {
      for (int n = 0; n < B; ++n) {
        const auto par = random_tree(rng, T, c.topk);
        batch.parents.insert(batch.parents.end(), par.begin(), par.end());
        std::vector<int32_t> path;
        for (int j = static_cast<int>(rng() % static_cast<unsigned>(T)); j >= 0;
             j = par[static_cast<size_t>(j)]) {
          path.insert(path.begin(), j);
        }
        accepted.push_back(static_cast<int32_t>(path.size()));
        path.resize(static_cast<size_t>(T), 0);
        paths.insert(paths.end(), path.begin(), path.end());
      }
    } else {
      const bool ragged = rng() % 2 == 0;
      N = 0;
      for (int n = 0; n < B; ++n) {
        const int len = ragged ? 1 + static_cast<int>(rng() % static_cast<unsigned>(T)) : T;
        if (ragged) {
          batch.lengths.push_back(len);
        }
        N += len;
        accepted.push_back(1 + static_cast<int32_t>(rng() % static_cast<unsigned>(len)));
      }
    }
    CAPTURE(batch.T, batch.slots, batch.rows, batch.lengths, accepted);
    const EngineRound er = engine_round(batch, accepted, paths);
    h.backend->prepare(batch, nullptr);
    for (int layer = 0; layer < kLayers; ++layer) {
      CAPTURE(layer);
      const std::vector<int32_t> nan_slots =
          batch.lengths.empty() ? batch.slots : std::vector<int32_t>(batch.slots.size(), 0);
      Activations x = make_activations(h.model, nan_slots, T, 1000 * round + layer);
      const VerifyInputs in{x.in.mixed_qkv.narrow(0, 0, N), x.in.a.narrow(0, 0, N),
                            x.in.b.narrow(0, 0, N)};
      const TensorView out = x.out.view(DType::kBF16, {N, x.out_view.size(1), x.out_view.size(2)});
      Buffer out2(kTestDevice, x.out.bytes());
      copy_bytes(out2.data(), kTestDevice, x.out.data(), kTestDevice, x.out.bytes());
      const TensorView out_ops = out2.view(DType::kBF16, {N, out.size(1), out.size(2)});
      const DispatchDecision db = h.backend->verify(layer, in, out, nullptr);
      const DispatchDecision dops =
          ops::verify(kernels, verify_args(h, e, er, layer, in, out_ops), nullptr);
      CHECK(db.path == dops.path);
      CHECK(db.reason == dops.reason);
      CHECK(db.block_v == dops.block_v);
      ++(dops.fused() ? fused : unfused);
      CHECK(same_bits(out, bytes_of(out_ops)));
    }
    const Buffer acc = device_i32(accepted);
    if (tree) {
      const Buffer p = device_i32(paths);
      h.backend->commit_tree(acc.view(DType::kI32, {B}), p.view(DType::kI32, {B, int64_t{T}}),
                             nullptr);
    } else {
      h.backend->commit(acc.view(DType::kI32, {B}), nullptr);
    }
    ops::CommitArgs ca;
    ca.state = e.stack;
    ca.batch = er.batch;
    ca.accepted_lengths = er.accepted_view;
    ca.accepted_paths = er.paths_view;
    ca.checked_accepted = er.checked_view;
    ca.error_flag = er.flag_view;
    ca.lazy = c.lazy;
    const ops::CommitDecision cd = ops::commit(kernels, ca, nullptr);
    CHECK(std::string(cd.reason) == (c.lazy       ? "lazy_record"
                                     : c.deferred ? "deferred_record"
                                     : c.ring     ? "ring_fold"
                                                  : "snapshot_copy"));
    CHECK(to_host_vector<int32_t>(er.flag_view)[0] == 0);
    check_same(h.pool(), e);
  }
  CHECK(fused + unfused == 10 * kLayers);
  if (c.deferred) {
    std::vector<int32_t> every(static_cast<size_t>(S));
    std::iota(every.begin(), every.end(), 0);
    h.backend->materialize(every, nullptr);
    const Buffer s = device_i32(every);
    ops::materialize(kernels, {e.stack, s.view(DType::kI32, {S}), c.lazy}, nullptr);
    check_same(h.pool(), e);
    const auto pending = to_host_vector<int32_t>(e.stack.ring_pending.narrow(1, 0, S));
    CHECK(std::all_of(pending.begin(), pending.end(), [](int32_t n) { return n == 0; }));
  }
}

TEST_CASE("ops: a bad argument is named and changes nothing", "[ops]" KDA_HOST_ONLY) {
  EngineFlags f = flags_for(/*ring=*/true, /*deferred=*/true);
  f.fused_ring_max_batch = 1;
  Harness h(model_for(kGqaCase), f, fake_platform(9, 0));
  h.fill_scratch(4);
  EnginePool e = engine_copy(h.pool());
  const std::unique_ptr<KernelSet> kernel_set = make_kernel_set(kTestDevice);
  KernelSet& kernels = *kernel_set;
  BatchSpec batch(kT, {3, 0});
  batch.lengths = {2, 4};
  const EngineRound er = engine_round(batch, {1, 2}, {});
  Activations x = make_activations(h.model, {0, 0}, kT, 7);
  const int64_t N = 6;
  const VerifyInputs in{x.in.mixed_qkv.narrow(0, 0, N), x.in.a.narrow(0, 0, N),
                        x.in.b.narrow(0, 0, N)};
  const TensorView out = x.out.view(DType::kBF16, {N, 4, 64});
  const ops::VerifyArgs good = verify_args(h, e, er, 0, in, out);
  Buffer small(kTestDevice, 4 * 4);
  struct Bad {
    const char* what;
    std::function<void(ops::VerifyArgs&)> spoil;
    const char* needle;
  };
  const std::vector<Bad> cases = {
      {"dtype",
       [&](ops::VerifyArgs& a) {
         const TensorView& g = a.state.ring_g;
         a.state.ring_g = TensorView(g.data(), DType::kI32, kTestDevice, {g.size(0), 4, 8, 64},
                                     {g.stride(0), 8 * 64, 64, 1});
       },
       "ops.verify: state.ring_g: expected dtype f32, got i32"},
      {"shape", [&](ops::VerifyArgs& a) { a.a = a.a.narrow(1, 0, 100); },
       "ops.verify: a: expected shape [6, 256], got [6, 100]"},
      {"stride",
       [&](ops::VerifyArgs& a) {
         a.b = TensorView(a.b.data(), DType::kBF16, kTestDevice, {N, 4}, {8, 2});
       },
       "ops.verify: b: expected the innermost dim contiguous"},
      {"pitch",
       [&](ops::VerifyArgs& a) {
         const TensorView& cs = a.state.conv_state;
         a.state.conv_state =
             TensorView(cs.data(), DType::kBF16, kTestDevice, {cs.size(0), 3, 512}, {1000, 512, 1});
       },
       "ops.verify: state.conv_state: slot pitch stride(0) = 1000 is smaller than one packed slot"},
      {"device",
       [&](ops::VerifyArgs& a) {
         a.batch.slots = TensorView(a.batch.slots.data(), DType::kI32, Device::cuda(3), {2}, {1});
       },
       "ops.verify: batch.slots: expected memory on host, got cuda:3"},
      {"too small",
       [&](ops::VerifyArgs& a) {
         a.state.conv_window = a.state.conv_window.narrow(1, 0, 2);
         a.batch.T = 3;
       },
       "ops.verify: batch.T: T = 3 outside [1, T_max = 2]"},
      {"overlapping",
       [&](ops::VerifyArgs& a) {
         const TensorView& u = a.state.ring_u;
         a.state.ring_u = TensorView(a.state.ssm_state.data(), DType::kF32, kTestDevice,
                                     {u.size(0), 4, 8, 64}, {u.stride(0), 8 * 64, 64, 1});
       },
       "ops.verify: state.ring_u: its bytes"},
      {"missing ring", [&](ops::VerifyArgs& a) { a.state.ring_beta = TensorView(); },
       "ops.verify: state.ring_beta: missing: ring mode needs all four rings"},
      {"half the deferred tensors", [&](ops::VerifyArgs& a) { a.state.ring_u = TensorView(); },
       "ops.verify: state.ring_u: missing: the deferred commit"},
      {"weights", [&](ops::VerifyArgs& a) { a.weights.A_log = a.weights.dt_bias; },
       "ops.verify: A_log: expected shape [4], got [256]"},
      {"rows", [&](ops::VerifyArgs& a) { a.batch.rows = TensorView(); },
       "ops.verify: batch.rows: expected an int32 tensor [2], got none"},
      {"ragged total",
       [&](ops::VerifyArgs& a) {
         a.mixed_qkv = x.in.mixed_qkv.narrow(0, 0, 5);
         a.a = x.in.a.narrow(0, 0, 5);
         a.b = x.in.b.narrow(0, 0, 5);
         a.out = x.out.view(DType::kBF16, {5, 4, 64});
       },
       "ops.verify: batch.query_start_loc: query_start_loc[B] = 6 packed rows, mixed_qkv has 5"},
      {"qkv_act for the unfused path",
       [&](ops::VerifyArgs& a) {
         a.state.qkv_act = TensorView();  // B = 2 > fused_ring_max_batch = 1: unfused
       },
       "ops.verify: state.qkv_act: none given, but the unfused path runs"},
      // The lazy write-back (contract §11): no u records, fast outputs, pending counts.
      {"lazy with u records", [&](ops::VerifyArgs& a) { a.options.lazy = true; },
       "ops.verify: state.ring_u: given with lazy = true: the lazy write-back keeps no u records"},
      {"lazy without pending counts",
       [&](ops::VerifyArgs& a) {
         a.options.lazy = true;
         a.state.ring_pending = a.state.ring_cursor = a.state.ring_u = TensorView();
       },
       "ops.verify: state.ring_pending: none given: the lazy write-back (lazy = true) keeps "
       "pending counts"},
      {"lazy with exact outputs",
       [&](ops::VerifyArgs& a) {
         a.options.lazy = true;
         a.state.ring_u = TensorView();
         a.options.dispatch.numerics = NumericsRequest::kExact;
       },
       "ops.verify: options.dispatch.numerics: exact with lazy = true"},
  };
  const auto before = engine_bytes(e);
  const std::vector<uint8_t> out_before = bytes_of(out);
  for (const Bad& bad : cases) {
    CAPTURE(bad.what);
    ops::VerifyArgs a = good;
    bad.spoil(a);
    CHECK_THAT(error_of([&] { ops::verify(kernels, a, nullptr); }, ErrorCode::kInvalidArgument),
               Catch::Contains(bad.needle));
    CHECK(engine_bytes(e) == before);
    CHECK(same_bits(out, out_before));
  }

  // Commit and materialize.
  ops::CommitArgs ca;
  ca.state = e.stack;
  ca.batch = er.batch;
  ca.accepted_lengths = er.accepted_view;
  ca.checked_accepted = er.checked_view;
  const std::vector<std::pair<std::function<void(ops::CommitArgs&)>, const char*>> commits = {
      {[](ops::CommitArgs& a) { a.checked_accepted = TensorView(); },
       "ops.commit: checked_accepted: expected an int32 tensor [2], got none"},
      {[&](ops::CommitArgs& a) { a.accepted_paths = er.checked_view; },
       "ops.commit: accepted_paths: given for a chain"},
      {[&](ops::CommitArgs& a) { a.track_slots = er.checked_view; },
       "ops.commit: track_steps: track_slots and track_steps go together"},
      {[&](ops::CommitArgs& a) { a.accepted_lengths = small.view(DType::kI32, {4}); },
       "ops.commit: accepted_lengths: expected shape [2], got [4]"},
      {[&](ops::CommitArgs& a) { a.state.ring_pending = a.state.ring_pending.select(0, 0); },
       "ops.commit: state.ring_pending: expected shape [2, >= 6], got [6]"},
      {[&](ops::CommitArgs& a) { a.state.conv_window = TensorView(); },
       "ops.commit: state.conv_window: expected a tensor [layers, R, T_max, W-1, D], got none"},
      {[](ops::CommitArgs& a) { a.lazy_fold_interval = 4; },
       "ops.commit: lazy_fold_interval: 4 without lazy = true (expected 0)"},
      {[](ops::CommitArgs& a) {
         a.lazy = true;
         a.state.ring_u = TensorView();
         a.lazy_fold_interval = 17;
       },
       "ops.commit: lazy_fold_interval: 17, expected 0..16"},
  };
  for (const auto& [spoil, needle] : commits) {
    CAPTURE(needle);
    ops::CommitArgs a = ca;
    spoil(a);
    CHECK_THAT(error_of([&] { ops::commit(kernels, a, nullptr); }, ErrorCode::kInvalidArgument),
               Catch::Contains(needle));
    CHECK(engine_bytes(e) == before);
  }
  const Buffer dup = device_i32({1, 1});
  CHECK_THAT(error_of(
                 [&] {
                   ops::materialize(kernels, {e.stack, dup.view(DType::kI32, {2})}, nullptr);
                 },
                 ErrorCode::kInvalidArgument),
             Catch::Contains("ops.materialize: slots: slots[0] and slots[1] are both 1"));
  ops::StateTensors eager = e.stack;
  eager.ring_cursor = eager.ring_pending = eager.ring_u = TensorView();
  CHECK_THAT(error_of(
                 [&] {
                   ops::materialize(kernels, {eager, dup.view(DType::kI32, {1})}, nullptr);
                 },
                 ErrorCode::kInvalidArgument),
             Catch::Contains("ops.materialize: state.ring_pending: none given"));
  CHECK(engine_bytes(e) == before);
}
