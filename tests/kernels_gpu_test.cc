// kernels_gpu_test.cc: the CUDA kernels against each other (bitwise), against the host
// reference and an fp64 run (tolerances), under graph capture and squeezed schedules.
#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "core/cuda_check.h"
#include "kernels/common/device_caps.h"
#include "kernels/common/launch_utils.h"
#include "kernels/kda_kernels.h"
#include "kernels/ref/kda_host.h"
#include "tests/gpu_test_util.h"
#include "tests/test_problem.h"

using namespace kda;
using namespace kda::testing;

namespace {

// Contract §3 tolerances of GPU vs host / fp64 (relative L2).
constexpr double kOutRelTol = 1e-2;    // bf16 outputs
constexpr double kStateRelTol = 1e-5;  // f32 states
// Worst single output row (one (token, v-head)): a wrong step moves one row by >= 2e-2 while
// the whole-tensor error can stay under kOutRelTol (host_accuracy_test measured both).
constexpr double kOutRowRelTol = 1e-2;
// GPU end to end vs fp64: includes the rare 1-ulp bf16 activation flips of the approximate
// SiLU (each moves a state by ~1e-5 relative); a wrong step moves it by >= 3e-3.
constexpr double kStateFp64RelTol = 1e-4;

const Device kGpu = Device::cuda(0);

/// A fresh seed per run (printed by CAPTURE) mixed with the case's own.
uint64_t run_seed() {
  static const uint64_t seed = std::random_device{}();
  return seed;
}

void sync() { KDA_CUDA_CHECK(cudaDeviceSynchronize()); }

/// Every tensor a verify call may write, whole buffers (pads included).
const Tensor kWritten[] = {Tensor::kOut,      Tensor::kConvWindow, Tensor::kSnapshots,
                           Tensor::kRingRawv, Tensor::kRingRawk,   Tensor::kRingG,
                           Tensor::kRingBeta, Tensor::kConvState,  Tensor::kSsmState};

void require_same_bytes(const VerifyProblem& x, const VerifyProblem& y, const char* what) {
  for (Tensor t : kWritten) {
    INFO(what << ": tensor " << tensor_name(t));
    REQUIRE(bitwise_equal(x.raw(t), y.raw(t)));
  }
}

/// Launch overrides that force the persistent schedule (common/persistent_stage.cuh) on or off,
/// at most `max_ctas` CTAs so each walks many items (padding items in between), and one register
/// budget of the per-item tiles.
kernels::LaunchOverrides forced(kernels::PersistentMode persistent, int max_ctas = 0,
                                kernels::TileOccupancy occupancy = kernels::TileOccupancy::kAuto) {
  kernels::LaunchOverrides o;
  o.persistent = persistent;
  o.persistent_max_ctas = max_ctas;
  o.occupancy = occupancy;
  return o;
}
kernels::LaunchOverrides forced(kernels::TileOccupancy occupancy) {
  kernels::LaunchOverrides o;
  o.occupancy = occupancy;
  return o;
}

/// The plan's one-CTA-per-SM decision of a verify call on the current device.
bool plans_one_per_sm(const VerifyParams& p, int bv, const kernels::LaunchOverrides& o = {}) {
  return kernels::plan_verify_on_device(p, VerifyPath::kFused, bv, o).schedule ==
         kernels::VerifySchedule::kPerItemWide;
}

std::vector<VerifyCase> base_cases() {
  // SGLang's 8 base cases and 3 GQA cases (upstream_backend.md §6.1), then the model shapes.
  std::vector<VerifyCase> cs;
  auto add = [&](int B, int T, int H, int HV, int KV, bool bias, bool safe, float lb, bool neg) {
    VerifyCase c;
    c.B = B;
    c.T = T;
    c.H = H;
    c.HV = HV;
    c.K = c.V = KV;
    c.bias = bias;
    c.safe_gate = safe;
    c.lower_bound = lb;
    c.neg_slot = neg;
    cs.push_back(c);
  };
  add(1, 4, 4, 4, 128, false, false, 0, false);
  add(1, 4, 4, 4, 128, true, false, 0, false);
  add(1, 4, 4, 4, 128, true, true, 2.0f, false);
  add(3, 4, 4, 4, 128, true, false, 0, false);
  add(3, 4, 4, 4, 128, true, false, 0, true);
  add(2, 3, 4, 4, 128, true, false, 0, false);
  add(2, 8, 2, 2, 128, true, true, 1.5f, false);
  add(1, 4, 8, 8, 64, true, false, 0, false);
  add(2, 4, 2, 4, 128, true, false, 0, false);  // GQA
  add(1, 5, 2, 8, 64, true, true, 1.5f, false);
  add(3, 4, 4, 8, 128, true, false, 0, true);
  add(4, 4, 32, 32, 128, false, false, 0, false);  // Kimi-Linear
  add(2, 8, 32, 32, 128, false, false, 0, true);
  add(3, 4, 12, 12, 128, false, true, -5.0f, true);  // Kimi-K3 TP8
  add(1, 1, 2, 2, 64, true, false, 0, false);        // T = 1
  add(2, 2, 2, 4, 64, true, true, -5.0f, false);     // T = 2
  add(2, 6, 1, 16, 128, true, true, -5.0f, true);    // many v-heads per k-head
  add(2, 12, 2, 2, 64, true, false, 0, false);       // two token chunks
  // Padding at either end of the item walk: the streaming CTAs (3 in the schedules below) start
  // on padding items before their first live one, or end on padding after their last live one.
  add(3, 4, 4, 4, 128, true, false, 0, true);
  cs.back().pad_at = 0;
  add(4, 4, 2, 4, 128, true, false, 0, true);
  cs.back().pad_at = 3;
  // V = 80: a partial last V tile at BV = 32, 64 and 128 (16 columns past the last full tile;
  // BV = 8 and 16 divide it): the bulk-copied state stage (BV = 16, 64) copies only the
  // columns below V, and every tile must leave the columns past V alone.
  add(2, 4, 2, 4, 128, true, false, 0, true);
  cs.back().V = 80;
  // KDA_TEST_QUICK=1 (compute-sanitizer runs, tools/gpu_bundle.sh run_all.sh --sanitize):
  // a padding row (also the first request), GQA, the safe gate, two chunks, a model shape and
  // partial V tiles, in a few seconds.
  if (std::getenv("KDA_TEST_QUICK") != nullptr) {
    return {cs[4], cs[10], cs[13], cs[16], cs[17], cs[18], cs.back()};
  }
  return cs;
}

}  // namespace

TEST_CASE("kernels: fused == unfused bitwise over whole tensors, every BV", "[kernels][gpu]") {
  int idx = 0;
  for (VerifyCase c : base_cases()) {
    for (RecordMode mode : {RecordMode::kRing, RecordMode::kSnapshot}) {
      for (ConvWeightType w : {ConvWeightType::kF32, ConvWeightType::kBF16}) {
        c.mode = mode;
        c.wtype = w;
        c.reversed = (idx % 2) == 1;
        c.qkv_pad = (idx % 3) == 2 ? 8 : 0;
        c.pitch_pad = (idx % 4) == 3 ? 4 : 0;
        c.seed = run_seed() + static_cast<uint64_t>(idx++);
        CAPTURE(c);
        const VerifyProblem initial(c, kGpu);
        VerifyProblem unfused = initial.clone_to(kGpu);
        kernels::invoke_verify_unfused(unfused.params(), nullptr);
        sync();
        // Verify never writes the committed state.
        REQUIRE(bitwise_equal(unfused.raw(Tensor::kSsmState), initial.raw(Tensor::kSsmState)));
        REQUIRE(bitwise_equal(unfused.raw(Tensor::kConvState), initial.raw(Tensor::kConvState)));
        // Padding rows: zero output rows.
        if (initial.pad_request() >= 0) {
          const auto out = unfused.out();
          const int64_t row_elems = int64_t{c.HV} * c.V;
          for (int t = 0; t < c.T; ++t) {
            const int64_t r = int64_t{initial.pad_request()} * c.T + t;
            for (int64_t i = 0; i < row_elems; ++i) {
              REQUIRE(out[static_cast<size_t>(r * row_elems + i)].bits == 0);
            }
          }
        }
        // Every BV in both forms of the per-item tiles (one and two CTAs per SM: the one-per-SM
        // form runs the ring-mode steps in groups, and at BV <= 32 the q/k norms on the spare
        // warps; its BV = 32 tile at 128 registers, with spills).
        for (auto occupancy :
             {kernels::TileOccupancy::kTwoPerSm, kernels::TileOccupancy::kOnePerSm}) {
          const kernels::LaunchOverrides force = forced(occupancy);
          CAPTURE(static_cast<int>(occupancy));
          for (int bv : kernels::kFusedBlockVs) {
            CAPTURE(bv);
            VerifyProblem fused = initial.clone_to(kGpu);
            kernels::invoke_verify_fused(fused.params(), bv, nullptr, force);
            sync();
            require_same_bytes(fused, unfused, "fused vs unfused");
          }
        }
        // The BV = 128 tiles as persistent CTAs (3 CTAs: many items each, padding items
        // skipped) and as one CTA per item: the same bits, fused and unfused. Every case with
        // one token chunk can go persistent, except fused with 8-byte conv-state pitches (pad 4).
        // Two CTAs per SM: in ring mode these small grids would otherwise take the one-per-SM
        // per-item form ahead of streaming (checked in the BV loop above).
        if (c.T <= 8) {
          CHECK(kernels::persistent_layout_ok(initial.params(), VerifyPath::kUnfused));
          CHECK(kernels::persistent_layout_ok(initial.params(), VerifyPath::kFused) ==
                (c.pitch_pad % 8 == 0));
        }
        for (auto sched : {kernels::PersistentMode::kAlways, kernels::PersistentMode::kNever}) {
          const kernels::LaunchOverrides force =
              forced(sched, 3, kernels::TileOccupancy::kTwoPerSm);
          CAPTURE(static_cast<int>(sched));
          VerifyProblem fused = initial.clone_to(kGpu);
          VerifyProblem unf = initial.clone_to(kGpu);
          kernels::invoke_verify_fused(fused.params(), 128, nullptr, force);
          kernels::invoke_verify_unfused(unf.params(), nullptr, force);
          sync();
          require_same_bytes(fused, unfused, "streamed/per-item fused vs unfused");
          require_same_bytes(unf, unfused, "streamed/per-item unfused vs unfused");
        }
      }
    }
  }
}

// [slow]: grids of up to ~400 CTAs; the sanitizer runs cover the same kernels through the
// forced one-per-SM cases above.
TEST_CASE("kernels: the fused BV = 128 tile's auto schedules give the unfused bits",
          "[kernels][gpu][slow]") {
  // Auto occupancy and streaming, ring and snapshot mode: the per-item tiles one CTA per SM over
  // 1.5 and kWideFusedMaxWaves waves, then one CTA past them (the persistent kernel, two per SM).
  // Kimi-Linear heads, B from the device's SM count; a padding request, reversed slots.
  const int sms = kernels::device_caps().sms;
  constexpr int kHV = 32;
  const int most = kernels::kWideFusedMaxWaves * sms / kHV;  // B at the last one-per-SM grid
  int idx = 0;
  for (const int B : {(3 * sms + 2 * kHV - 1) / (2 * kHV), most, most + 1}) {
    for (const int T : {4, 8}) {
      // Ring and snapshot alternate, each B gets both; reversed slots alternate by index.
      const RecordMode mode = (idx / 2 + idx) % 2 == 1 ? RecordMode::kSnapshot : RecordMode::kRing;
      VerifyCase c =
          make_case(B, T, kHV, kHV, 128, 128, mode, run_seed() + 7919 + static_cast<uint64_t>(idx));
      c.neg_slot = true;
      c.pad_at = B / 2;
      c.reversed = (idx++ % 2) == 0;
      CAPTURE(c, sms);
      const int64_t ctas = int64_t{B} * kHV;
      const VerifyProblem initial(c, kGpu);
      CHECK(plans_one_per_sm(initial.params(), 128) == (B <= most));
      (void)ctas;
      VerifyProblem unfused = initial.clone_to(kGpu);
      VerifyProblem fused = initial.clone_to(kGpu);
      kernels::invoke_verify_unfused(unfused.params(), nullptr);
      kernels::invoke_verify_fused(fused.params(), 128, nullptr);
      sync();
      require_same_bytes(fused, unfused, "auto-scheduled fused BV = 128 vs unfused");
      REQUIRE(bitwise_equal(fused.raw(Tensor::kSsmState), initial.raw(Tensor::kSsmState)));
    }
  }
}

// [slow]: grids of ~400 CTAs.
TEST_CASE("kernels: snapshot mode's auto tile and wave-fill schedule give the unfused bits",
          "[kernels][gpu][slow]") {
  // K3 TP8 heads, B so that the BV = 128 grid fills ~1.5 waves of one CTA per SM: the default
  // snapshot tile is BV = 64, and its grid runs one CTA per SM (one_per_sm_fills_waves_better;
  // B = 16, 384 CTAs on 132 SMs). Also the forced two-per-SM form of the same grid.
  const int sms = kernels::device_caps().sms;
  constexpr int kHV = 12;
  const int B = 3 * sms / (2 * kHV);  // BV = 64: 3 waves or just under, one per SM
  const int bv = kernels::default_snapshot_block_v(B, kHV, 128, sms);
  const int64_t ctas = int64_t{B} * kHV * (128 / bv);
  CAPTURE(sms, B, bv, ctas);
  CHECK(bv == 64);
  CHECK(kernels::one_per_sm_fills_waves_better(ctas, sms));
  int idx = 0;
  for (const int T : {4, 8}) {
    for (auto occupancy : {kernels::TileOccupancy::kAuto, kernels::TileOccupancy::kTwoPerSm}) {
      const kernels::LaunchOverrides force = forced(occupancy);
      VerifyCase c = make_case(B, T, kHV, kHV, 128, 128, RecordMode::kSnapshot,
                               run_seed() + 104729 + static_cast<uint64_t>(idx));
      c.neg_slot = true;
      c.pad_at = B / 3;
      c.reversed = (idx++ % 2) == 0;
      CAPTURE(c, static_cast<int>(occupancy));
      const VerifyProblem initial(c, kGpu);
      CHECK(plans_one_per_sm(initial.params(), bv, force) ==
            (occupancy == kernels::TileOccupancy::kAuto));
      VerifyProblem unfused = initial.clone_to(kGpu);
      VerifyProblem fused = initial.clone_to(kGpu);
      kernels::invoke_verify_unfused(unfused.params(), nullptr, force);
      kernels::invoke_verify_fused(fused.params(), bv, nullptr, force);
      sync();
      require_same_bytes(fused, unfused, "snapshot auto tile vs unfused");
      REQUIRE(bitwise_equal(fused.raw(Tensor::kSsmState), initial.raw(Tensor::kSsmState)));
    }
  }
}

namespace {

/// Gathers the snapshots of real requests into [B', T, HV, V, K] request order.
template <typename T>
std::vector<T> real_snapshots(const VerifyProblem& pr, const std::vector<T>& snaps) {
  const VerifyCase& c = pr.config();
  const auto rows = pr.rows();
  const auto slots = pr.slots();
  const int64_t step = int64_t{c.HV} * c.V * c.K;
  std::vector<T> g;
  for (int n = 0; n < c.B; ++n) {
    if (slots[static_cast<size_t>(n)] < 0) {
      continue;
    }
    for (int t = 0; t < c.T; ++t) {
      const int64_t src = (int64_t{rows[static_cast<size_t>(n)]} * pr.T_max() + t) * step;
      g.insert(g.end(), snaps.begin() + src, snaps.begin() + src + step);
    }
  }
  return g;
}

std::vector<double> real_states_fp64(const VerifyProblem& pr, const std::vector<double>& st) {
  const VerifyCase& c = pr.config();
  const auto slots = pr.slots();
  const int64_t per_req = int64_t{c.T} * c.HV * c.V * c.K;
  std::vector<double> d;
  for (int n = 0; n < c.B; ++n) {
    if (slots[static_cast<size_t>(n)] >= 0) {
      d.insert(d.end(), st.begin() + n * per_req, st.begin() + (n + 1) * per_req);
    }
  }
  return d;
}

}  // namespace

TEST_CASE("kernels: GPU verify matches the host reference and an fp64 run", "[kernels][gpu]") {
  // Two stages, so each tolerance means one thing. (1) conv + SiLU: the GPU's ex2.approx /
  // div.full forms vs the host's std::exp / IEEE division may round a bf16 activation the
  // other way: at most 1 bf16 ulp, rarely. (2) the recurrence, fed the GPU's activations:
  // states within 1e-5, outputs within a bf16 ulp-level L2 error.
  int idx = 0;
  for (VerifyCase c : base_cases()) {
    c.mode = RecordMode::kSnapshot;
    c.wtype = idx % 2 ? ConvWeightType::kBF16 : ConvWeightType::kF32;
    c.seed = run_seed() + 1000 + static_cast<uint64_t>(idx++);
    CAPTURE(c);
    VerifyProblem gpu(c, kGpu);
    VerifyProblem host = gpu.clone_to(Device::host());
    const host::Fp64Verify f64 = host::verify_fp64(host.params());
    kernels::invoke_verify_unfused(gpu.params(), nullptr);
    sync();

    // (1) conv stage: real rows only (padding rows' qkv_act is never written).
    host::conv_update(host.params());
    const auto act_gpu = gpu.qkv_act();
    const auto act_host = host.qkv_act();
    const auto slots = gpu.slots();
    const int64_t D = gpu.D();
    int64_t flips = 0, compared = 0;
    for (int n = 0; n < c.B; ++n) {
      if (slots[static_cast<size_t>(n)] < 0) {
        continue;
      }
      for (int64_t i = int64_t{n} * c.T * D; i < int64_t{n + 1} * c.T * D; ++i) {
        const int d = std::abs(int{act_gpu[static_cast<size_t>(i)].bits} -
                               int{act_host[static_cast<size_t>(i)].bits});
        REQUIRE(d <= 1);  // at most one bf16 ulp (same sign: SiLU outputs are not tiny)
        flips += d;
        ++compared;
      }
    }
    CHECK(flips * 100 <= compared);                               // rare: under 1%
    CHECK(bitwise_equal(gpu.conv_window(), host.conv_window()));  // pure data movement

    // (2) recurrence on identical activations.
    host.set(Tensor::kQkvAct, act_gpu);
    host::verify_recurrent(host.params());
    const auto out_gpu = gpu.out();
    CHECK(rel_l2(out_gpu, host.out()) <= kOutRelTol);
    CHECK(max_row_rel_l2(out_gpu, host.out(), c.V) <= kOutRowRelTol);
    const auto snaps_gpu = real_snapshots(gpu, gpu.snapshots());
    CHECK(rel_l2(snaps_gpu, real_snapshots(host, host.snapshots())) <= kStateRelTol);

    // End to end against fp64 (its conv is the host's, so activation flips count here).
    CHECK(rel_l2(out_gpu, f64.out) <= kOutRelTol);
    CHECK(max_row_rel_l2(out_gpu, f64.out, c.V) <= kOutRowRelTol);
    CHECK(rel_l2(snaps_gpu, real_states_fp64(gpu, f64.states)) <= kStateFp64RelTol);
  }
}

TEST_CASE("kernels: ring mode rings match the host reference", "[kernels][gpu]") {
  // Rings hold elementwise values only (conv+SiLU, gates): the GPU's ex2.approx/div.full vs
  // the host's std::exp/division may move a bf16 value by one ulp, an f32 gate by a few.
  int idx = 0;
  for (VerifyCase c : base_cases()) {
    c.mode = RecordMode::kRing;
    c.seed = run_seed() + 2000 + static_cast<uint64_t>(idx++);
    CAPTURE(c);
    VerifyProblem gpu(c, kGpu);
    VerifyProblem host = gpu.clone_to(Device::host());
    kernels::invoke_verify_fused(gpu.params(), 16, nullptr);
    sync();
    host::verify_fused(host.params());
    CHECK(rel_l2(gpu.rawk(), host.rawk()) <= 1e-2);
    CHECK(rel_l2(gpu.rawv(), host.rawv()) <= 1e-2);
    CHECK(rel_l2(gpu.ring_g(), host.ring_g()) <= 1e-5);
    CHECK(rel_l2(gpu.ring_beta(), host.ring_beta()) <= 1e-5);
    CHECK(rel_l2(gpu.out(), host.out()) <= kOutRelTol);
  }
}

namespace {

/// A [layers, ...] pool assembled from one VerifyProblem per layer (packed, no pads), for the
/// all-layer commit kernels.
struct LayeredPool {
  int layers = 0;
  std::vector<VerifyProblem> per_layer;
  Buffer ssm, conv_state, conv_window, snapshots, rawv, rawk, g, beta;

  Buffer stack(Tensor t) const {
    const int64_t bytes = static_cast<int64_t>(per_layer[0].raw(t).size());
    Buffer b(kGpu, bytes * layers);
    for (int l = 0; l < layers; ++l) {
      const auto bytes_l = per_layer[static_cast<size_t>(l)].raw(t);
      b.upload(bytes_l.data(), bytes, bytes * l);
    }
    return b;
  }
  void restack() {
    ssm = stack(Tensor::kSsmState);
    conv_state = stack(Tensor::kConvState);
    conv_window = stack(Tensor::kConvWindow);
    snapshots = stack(Tensor::kSnapshots);
    rawv = stack(Tensor::kRingRawv);
    rawk = stack(Tensor::kRingRawk);
    g = stack(Tensor::kRingG);
    beta = stack(Tensor::kRingBeta);
  }
  CommitParams params(const Buffer& accepted, RecordMode mode) const {
    CommitParams p = per_layer[0].commit_params(accepted, mode);
    p.num_layers = layers;
    auto per = [&](const Buffer& b) { return b.bytes() / layers; };
    p.ssm_state = static_cast<float*>(ssm.data());
    p.ssm_layer_stride = per(ssm) / 4;
    p.conv_state = static_cast<bf16_t*>(conv_state.data());
    p.conv_state_layer_stride = per(conv_state) / 2;
    p.conv_window = static_cast<bf16_t*>(conv_window.data());
    p.conv_window_layer_stride = per(conv_window) / 2;
    if (mode == RecordMode::kSnapshot) {
      p.snapshots = static_cast<const float*>(snapshots.data());
      p.snapshot_layer_stride = per(snapshots) / 4;
    } else {
      p.ring_rawv = static_cast<bf16_t*>(rawv.data());
      p.ring_rawv_layer_stride = per(rawv) / 2;
      p.ring_rawk = static_cast<bf16_t*>(rawk.data());
      p.ring_rawk_layer_stride = per(rawk) / 2;
      p.ring_g = static_cast<float*>(g.data());
      p.ring_g_layer_stride = per(g) / 4;
      p.ring_beta = static_cast<float*>(beta.data());
      p.ring_beta_layer_stride = per(beta) / 4;
    }
    return p;
  }
  std::vector<uint8_t> bytes(const Buffer& b) const {
    std::vector<uint8_t> v(static_cast<size_t>(b.bytes()));
    b.download(v.data(), b.bytes());
    return v;
  }
};

/// Runs verify in ring mode AND snapshot mode on each layer (records of both kinds).
LayeredPool make_verified_pool(VerifyCase c, int layers) {
  LayeredPool pool;
  pool.layers = layers;
  for (int l = 0; l < layers; ++l) {
    c.seed = run_seed() + 3000 + static_cast<uint64_t>(l);
    VerifyProblem p(c, kGpu);
    kernels::invoke_verify_fused(p.params(RecordMode::kRing), 32, nullptr);
    kernels::invoke_verify_unfused(p.params(RecordMode::kSnapshot), nullptr);
    sync();
    pool.per_layer.push_back(std::move(p));
  }
  pool.restack();
  return pool;
}

}  // namespace

TEST_CASE("kernels: fold == snapshot commit bitwise; one all-layer launch == per-layer",
          "[kernels][gpu]") {
  VerifyCase c;
  c.B = 4;
  c.T = 6;
  c.H = 2;
  c.HV = 4;
  c.K = c.V = 128;
  c.bias = true;
  c.neg_slot = true;
  c.reversed = true;
  c.L = 16;
  const int layers = 3;
  CAPTURE(c, layers);
  for (int variant = 0; variant < 2; ++variant) {
    c.K = c.V = variant == 0 ? 128 : 64;
    c.safe_gate = variant == 1;
    LayeredPool pool = make_verified_pool(c, layers);
    const auto before_ssm = pool.bytes(pool.ssm);
    // Accepted lengths cover 1..T (the padding request's value is ignored).
    const Buffer accepted = make_buffer({1, 7 /*padding: ignored*/, c.T, 3}, kGpu);

    kernels::invoke_commit_snapshot(pool.params(accepted, RecordMode::kSnapshot), nullptr);
    sync();
    const auto snap_ssm = pool.bytes(pool.ssm);
    REQUIRE_FALSE(bitwise_equal(snap_ssm, before_ssm));

    // Fold over all layers in one launch, from the same committed state.
    pool.ssm.upload(before_ssm.data(), static_cast<int64_t>(before_ssm.size()));
    kernels::invoke_fold(pool.params(accepted, RecordMode::kRing), nullptr);
    sync();
    REQUIRE(bitwise_equal(pool.bytes(pool.ssm), snap_ssm));

    // The fold as persistent CTAs (2 CTAs walking every item, padding requests skipped) and as
    // one CTA per item: the same bits.
    REQUIRE(kernels::fold_persistent_layout_ok(pool.params(accepted, RecordMode::kRing)));
    for (auto sched : {kernels::PersistentMode::kAlways, kernels::PersistentMode::kNever}) {
      const kernels::LaunchOverrides force = forced(sched, 2);
      CAPTURE(static_cast<int>(sched));
      pool.ssm.upload(before_ssm.data(), static_cast<int64_t>(before_ssm.size()));
      kernels::invoke_fold(pool.params(accepted, RecordMode::kRing), nullptr, force);
      sync();
      REQUIRE(bitwise_equal(pool.bytes(pool.ssm), snap_ssm));
    }

    // Per-layer folds (num_layers = 1, layer-offset pointers) give the same bits.
    pool.ssm.upload(before_ssm.data(), static_cast<int64_t>(before_ssm.size()));
    for (int l = 0; l < layers; ++l) {
      CommitParams p = pool.params(accepted, RecordMode::kRing);
      p.num_layers = 1;
      p.ssm_state += l * p.ssm_layer_stride;
      p.ring_rawv += l * p.ring_rawv_layer_stride;
      p.ring_rawk += l * p.ring_rawk_layer_stride;
      p.ring_g += l * p.ring_g_layer_stride;
      p.ring_beta += l * p.ring_beta_layer_stride;
      kernels::invoke_fold(p, nullptr);
    }
    sync();
    REQUIRE(bitwise_equal(pool.bytes(pool.ssm), snap_ssm));

    // Conv commit: window n-1 of each request, all layers.
    const auto before_conv = pool.bytes(pool.conv_state);
    kernels::invoke_commit_conv(pool.params(accepted, RecordMode::kRing), nullptr);
    sync();
    const auto conv = pool.bytes(pool.conv_state);
    // Host oracle: last 3 raw inputs up to the accepted token.
    for (int l = 0; l < layers; ++l) {
      const VerifyProblem& pl = pool.per_layer[static_cast<size_t>(l)];
      VerifyProblem host = pl.clone_to(Device::host());
      host.set(Tensor::kConvState, [&] {
        std::vector<bf16_t> v(host.conv_state().size());
        std::memcpy(v.data(), before_conv.data() + static_cast<size_t>(l) * v.size() * 2,
                    v.size() * 2);
        return v;
      }());
      const Buffer acc_host = make_buffer({1, 7, c.T, 3}, Device::host());
      host::commit_conv(host.commit_params(acc_host, RecordMode::kRing));
      std::vector<bf16_t> got(host.conv_state().size());
      std::memcpy(got.data(), conv.data() + static_cast<size_t>(l) * got.size() * 2,
                  got.size() * 2);
      REQUIRE(bitwise_equal(got, host.conv_state()));
    }

    // The whole commit in one launch (the state kernel carries the conv copy): ring mode under
    // both fold schedules and snapshot mode, from the same committed state and conv state,
    // give the pieces' bits over the whole pool.
    REQUIRE(kernels::conv_commit_vec8(pool.params(accepted, RecordMode::kRing)));
    for (int way = 0; way < 3; ++way) {
      const RecordMode mode = way < 2 ? RecordMode::kRing : RecordMode::kSnapshot;
      const kernels::LaunchOverrides force =
          forced(way == 0 ? kernels::PersistentMode::kAlways : kernels::PersistentMode::kNever, 2);
      CAPTURE(way);
      pool.ssm.upload(before_ssm.data(), static_cast<int64_t>(before_ssm.size()));
      pool.conv_state.upload(before_conv.data(), static_cast<int64_t>(before_conv.size()));
      kernels::invoke_commit(pool.params(accepted, mode), nullptr, force);
      sync();
      REQUIRE(bitwise_equal(pool.bytes(pool.ssm), snap_ssm));
      REQUIRE(bitwise_equal(pool.bytes(pool.conv_state), conv));
    }
  }
}

TEST_CASE("kernels: bad accepted length sets the error flag and commits nothing",
          "[kernels][gpu]") {
  VerifyCase c;
  c.B = 2;
  c.T = 4;
  c.H = c.HV = 2;
  c.K = c.V = 64;
  c.seed = run_seed() + 4000;
  VerifyProblem p(c, kGpu);
  kernels::invoke_verify_fused(p.params(), 32, nullptr);
  const Buffer accepted = make_buffer({0, c.T + 1}, kGpu);
  const Buffer flag = make_buffer({0}, kGpu);
  CommitParams cp = p.commit_params(accepted);
  cp.error_flag = static_cast<int32_t*>(flag.data());
  const auto before = p.raw(Tensor::kSsmState);
  const auto before_conv = p.raw(Tensor::kConvState);
  kernels::invoke_commit(cp, nullptr);
  sync();
  int32_t f = 0;
  flag.download(&f, 4);
  CHECK(f == 1);
  CHECK(bitwise_equal(p.raw(Tensor::kSsmState), before));
  CHECK(bitwise_equal(p.raw(Tensor::kConvState), before_conv));
}

TEST_CASE("kernels: extend == verify + full commit, bitwise; matches host extend",
          "[kernels][gpu]") {
  for (int T : {1, 4, 11}) {
    VerifyCase c;
    c.B = 3;
    c.T = T;
    c.H = 2;
    c.HV = 4;
    c.K = c.V = 128;
    c.bias = true;
    c.neg_slot = true;
    c.reversed = true;
    c.L = 16;
    // T = 4: padded pitches (4 elements), so the conv commit is not 16-byte aligned and
    // invoke_commit takes its two-launch form; the others the one-launch form.
    c.pitch_pad = T == 4 ? 4 : 0;
    c.seed = run_seed() + 5000 + static_cast<uint64_t>(T);
    CAPTURE(c);
    const VerifyProblem initial(c, kGpu);
    VerifyProblem ext = initial.clone_to(kGpu);
    VerifyProblem host = initial.clone_to(Device::host());
    VerifyProblem ver = initial.clone_to(kGpu);
    kernels::invoke_extend(ext.extend_params(), nullptr);
    kernels::invoke_verify_fused(ver.params(), 64, nullptr);
    const Buffer accepted = make_buffer(std::vector<int32_t>(3, T), kGpu);
    REQUIRE(kernels::conv_commit_vec8(ver.commit_params(accepted)) == (c.pitch_pad == 0));
    kernels::invoke_commit(ver.commit_params(accepted), nullptr);
    sync();
    host::extend(host.extend_params());
    CHECK(bitwise_equal(ext.raw(Tensor::kSsmState), ver.raw(Tensor::kSsmState)));
    CHECK(bitwise_equal(ext.raw(Tensor::kConvState), ver.raw(Tensor::kConvState)));
    CHECK(bitwise_equal(ext.out(), ver.out()));
    // Both register budgets of the per-item tiles (extend runs BV = 32): the same bits.
    for (auto occupancy : {kernels::TileOccupancy::kTwoPerSm, kernels::TileOccupancy::kOnePerSm}) {
      CAPTURE(static_cast<int>(occupancy));
      VerifyProblem one_form = initial.clone_to(kGpu);
      kernels::invoke_extend(one_form.extend_params(), nullptr, forced(occupancy));
      sync();
      CHECK(bitwise_equal(one_form.raw(Tensor::kSsmState), ext.raw(Tensor::kSsmState)));
      CHECK(bitwise_equal(one_form.out(), ext.out()));
    }
    // End to end against the host: the host computes its own conv, so rare 1-ulp activation
    // flips of the approximate SiLU count here (T = 1 has few elements: one flip ~3e-5).
    CHECK(rel_l2(ext.ssm_state(), host.ssm_state()) <= kStateFp64RelTol);
    CHECK(bitwise_equal(ext.conv_state(), host.conv_state()));
    CHECK(rel_l2(ext.out(), host.out()) <= kOutRelTol);
  }
}

TEST_CASE("kernels: CUDA-graph capture and replay give the eager bits", "[kernels][gpu]") {
  VerifyCase c;
  c.B = 4;
  c.T = 4;
  c.H = 4;
  c.HV = 8;
  c.K = c.V = 128;
  c.bias = true;
  c.neg_slot = true;
  c.seed = run_seed() + 6000;
  // Passes 2-3: the persistent kernels (BV = 128 verify, fold) under capture. The graph is
  // captured before the eager run, so run alone (tools/gpu_bundle.sh run_all.sh does) this also
  // proves the persistent launch's first-use set-up is legal inside a capture. Pass 0
  // (ring mode, a small grid) takes the per-item tiles' one-CTA-per-SM form.
  for (int pass = 0; pass < 4; ++pass) {
    const RecordMode mode = pass % 2 == 0 ? RecordMode::kRing : RecordMode::kSnapshot;
    const bool streamed = pass >= 2;
    const kernels::LaunchOverrides force =
        forced(streamed ? kernels::PersistentMode::kAlways : kernels::PersistentMode::kAuto, 5,
               streamed ? kernels::TileOccupancy::kTwoPerSm : kernels::TileOccupancy::kAuto);
    const int bv = streamed ? 128 : 16;
    c.mode = mode;
    CAPTURE(c, streamed);
    const VerifyProblem initial(c, kGpu);
    VerifyProblem eager = initial.clone_to(kGpu);
    VerifyProblem graphed = initial.clone_to(kGpu);
    const Buffer accepted = make_buffer({2, 1, 4, 3}, kGpu);

    cudaStream_t stream;
    KDA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraph_t graph;
    KDA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    kernels::invoke_verify_fused(graphed.params(), bv, stream, force);
    kernels::invoke_verify_unfused(graphed.params(), stream, force);
    kernels::invoke_commit(graphed.commit_params(accepted), stream, force);
    KDA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec;
    KDA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    KDA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    KDA_CUDA_CHECK(cudaStreamSynchronize(stream));
    kernels::invoke_verify_fused(eager.params(), bv, nullptr, force);
    kernels::invoke_verify_unfused(eager.params(), nullptr, force);
    kernels::invoke_commit(eager.commit_params(accepted), nullptr, force);
    sync();
    require_same_bytes(eager, graphed, "graph vs eager");
    KDA_CUDA_CHECK(cudaGraphExecDestroy(exec));
    KDA_CUDA_CHECK(cudaGraphDestroy(graph));
    KDA_CUDA_CHECK(cudaStreamDestroy(stream));
  }
}

TEST_CASE("kernels: output does not depend on CTA scheduling (grid squeezed onto 8 SMs)",
          "[kernels][gpu][slow]") {
  // Upstream's conv-state write-back race showed only when V tiles of one head ran in later
  // waves: H = 1 with 16 v-heads sharing it, on 8 SMs vs the whole GPU.
  VerifyCase c;
  c.B = 4;
  c.T = 6;
  c.H = 1;
  c.HV = 16;
  c.K = c.V = 128;
  c.bias = true;
  c.safe_gate = true;
  c.lower_bound = -5.0f;
  c.seed = run_seed() + 7000;
  for (RecordMode mode : {RecordMode::kRing, RecordMode::kSnapshot}) {
    c.mode = mode;
    CAPTURE(c);
    const VerifyProblem initial(c, kGpu);
    VerifyProblem full = initial.clone_to(kGpu);
    VerifyProblem squeezed = initial.clone_to(kGpu);
    kernels::invoke_verify_fused(full.params(), 8, nullptr);
    sync();
    cudaStream_t hog, work;
    KDA_CUDA_CHECK(cudaStreamCreateWithFlags(&hog, cudaStreamNonBlocking));
    KDA_CUDA_CHECK(cudaStreamCreateWithFlags(&work, cudaStreamNonBlocking));
    REQUIRE(launch_sm_hog(/*free_sms=*/8, /*milliseconds=*/200.0, hog) == 8);
    kernels::invoke_verify_fused(squeezed.params(), 8, work);
    KDA_CUDA_CHECK(cudaStreamSynchronize(work));
    KDA_CUDA_CHECK(cudaStreamSynchronize(hog));
    require_same_bytes(full, squeezed, "squeezed vs full GPU");
    KDA_CUDA_CHECK(cudaStreamDestroy(hog));
    KDA_CUDA_CHECK(cudaStreamDestroy(work));
  }
}

TEST_CASE("kernels: launch-boundary errors are kda::Error before anything runs", "[kernels][gpu]") {
  VerifyCase c;
  c.B = 1;
  c.T = 4;
  c.H = c.HV = 2;
  c.K = c.V = 64;
  c.seed = run_seed() + 8000;
  VerifyProblem p(c, kGpu);
  VerifyParams bad = p.params();
  CHECK_THROWS_WITH(kernels::invoke_verify_fused(bad, 12, nullptr),
                    Catch::Contains("block_v=12 unsupported, expected one of 8, 16, 32, 64, 128"));
  bad.K = 96;
  CHECK_THROWS_WITH(kernels::invoke_verify_fused(bad, 32, nullptr),
                    Catch::Contains("invoke_verify_fused: K=96 unsupported, expected 64 or 128"));
  bad = p.params();
  bad.T = bad.T_max + 1;
  CHECK_THROWS_WITH(
      kernels::invoke_verify_unfused(bad, nullptr),
      Catch::Contains("invoke_verify_unfused: T=5 exceeds T_max=4 (the scratch step pitch)"));
  bad = p.params();
  bad.L = 12;
  CHECK_THROWS_WITH(
      kernels::invoke_verify_fused(bad, 32, nullptr),
      Catch::Contains("invoke_verify_fused: L=12 must be a power of two (ring mode)"));
}
