// dispatch_test.cc: the contract §4 dispatch table and the ring-layout checks.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <iterator>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/platform.h"
#include "dispatch/commit_policy.h"
#include "dispatch/lazy_policy.h"
#include "dispatch/numerics_policy.h"
#include "dispatch/ring_layout.h"
#include "dispatch/verify_dispatch.h"
#include "kernels/common/launch_utils.h"
#include "kernels/kda_kernels.h"
#include "memory_pool/kda_state_pool.h"

using namespace kda;

namespace {

constexpr int kH = 2, kHV = 4, kK = 64, kV = 64, kT = 4, kTMax = 8, kL = 16, kMaxB = 64;
constexpr int64_t kD = 2 * kH * kK + kHV * kV;

// Real (host) memory for every view of a verify call up to B = kMaxB. The dispatcher never
// reads it, but real views keep the test honest about shapes and strides.
class DispatchFixture {
 public:
  DispatchFixture()
      : pool_(pool_config()),
        qkv_(Device::host(), kMaxB * kTMax * kD * 2),
        a_(Device::host(), kMaxB * kTMax * kHV * kK * 2),
        b_(Device::host(), kMaxB * kTMax * kHV * 2),
        weight_(Device::host(), kD * 4 * 4),
        bias_(Device::host(), kD * 4),
        indices_(Device::host(), 2 * kMaxB * 4) {}

  /// A verify call of B requests of T <= kTMax tokens.
  DispatchProblem problem(int B, RecordMode mode, int T = kT) const {
    DispatchProblem p;
    p.B = B;
    p.T = T;
    p.H = kH;
    p.HV = kHV;
    p.K = kK;
    p.V = kV;
    p.mode = mode;
    const int64_t N = static_cast<int64_t>(B) * T;
    p.mixed_qkv = qkv_.view(DType::kBF16, {N, kD});
    p.a = a_.view(DType::kBF16, {N, kHV * kK});
    p.b = b_.view(DType::kBF16, {N, kHV});
    p.conv_weight = weight_.view(DType::kF32, {kD, 4});
    p.conv_bias = bias_.view(DType::kF32, {kD});
    const TensorView idx = indices_.view(DType::kI32, {2, kMaxB});
    p.slots = idx.select(0, 0).narrow(0, 0, B);
    p.rows = idx.select(0, 1).narrow(0, 0, B);
    p.num_slots = pool_.num_slots();
    if (mode == RecordMode::kRing) {
      p.rings = rings();
    }
    return p;
  }

  RingViews rings() const {
    return RingViews{pool_.ring_rawv(0), pool_.ring_rawk(0), pool_.ring_g(0), pool_.ring_beta(0)};
  }
  const KdaStatePool& pool() const { return pool_; }

 private:
  static PoolConfig pool_config() {
    PoolConfig c;
    c.layers = 1;
    c.H = kH;
    c.HV = kHV;
    c.K = kK;
    c.V = kV;
    c.num_slots = kMaxB;
    c.num_rows = 1;
    c.T_max = kT;
    c.ring_mode = true;
    c.ring_len = kL;
    return c;
  }

  KdaStatePool pool_;
  Buffer qkv_, a_, b_, weight_, bias_, indices_;
};

const DispatchFixture& fixture() {
  static const DispatchFixture f;
  return f;
}

struct PlatformCase {
  const char* name;
  Platform platform;
};

std::vector<PlatformCase> platforms() {
  return {{"SM90", fake_platform(9, 0)},           {"SM100", fake_platform(10, 0)},
          {"SM103", fake_platform(10, 3)},         {"other (SM89)", fake_platform(8, 9)},
          {"other (SM120)", fake_platform(12, 0)}, {"no device", Platform{}}};
}

bool ring_platform(const Platform& p) {
  return p.family() == ArchFamily::kSM90 || p.family() == ArchFamily::kSM100;
}

}  // namespace

static_assert(noexcept(choose_verify_path(DispatchProblem{}, Platform{}, DispatchFlags{})),
              "the dispatcher must never throw (contract §4)");
static_assert(noexcept(check_ring_layout(RingViews{}, RingLayoutExpectation{})),
              "the ring-layout checks must never throw");

TEST_CASE("dispatch: the auto tile follows the call's T", "[dispatch]") {
  // B = 8 at HV = 4, V = 64 on 132 SMs: BV = 32's 64 CTAs run one per SM, which takes BV = 32 up
  // to T = kNarrowBv32MaxT and BV = 16 beyond (docs/perf_log.md v42). Snapshot mode ignores T.
  DispatchFlags flags;
  flags.fused_ring_max_batch = 64;
  for (const PlatformCase& pc : {PlatformCase{"SM90", fake_platform(9, 0, 132)},
                                 PlatformCase{"SM100", fake_platform(10, 0, 132)}}) {
    for (const int T : {2, 4, 8}) {
      CAPTURE(pc.name, T);
      const DispatchDecision ring =
          choose_verify_path(fixture().problem(8, RecordMode::kRing, T), pc.platform, flags);
      REQUIRE(ring.fused());
      CHECK(ring.block_v == (T <= kernels::kNarrowBv32MaxT ? 32 : 16));
      const DispatchDecision snap =
          choose_verify_path(fixture().problem(8, RecordMode::kSnapshot, T), pc.platform, flags);
      REQUIRE(snap.fused());
      CHECK(snap.block_v == kernels::default_snapshot_block_v(8, kHV, kV, 132));
    }
  }
}

TEST_CASE("dispatch: a deferred verify takes its own auto tile", "[dispatch]") {
  // HV = 4, V = 64 on 132 SMs: the head tile BV = 64 has 48 CTAs at B = 12 and 64 at B = 16,
  // where the eager rule takes BV = 32 (96 / 128 CTAs); at B = 24 (96 CTAs) both rules agree; at
  // B = 4 no tile from BV = 32 up reaches kDeferredMinCtas CTAs, so the eager rule's BV = 16
  // stands. Snapshot mode ignores the flag.
  DispatchFlags flags;
  flags.fused_ring_max_batch = 64;
  const Platform h200 = fake_platform(9, 0, 132);
  for (const int T : {2, 4, 8}) {
    for (const int B : {4, 12, 16, 24}) {
      CAPTURE(T, B);
      DispatchProblem problem = fixture().problem(B, RecordMode::kRing, T);
      const DispatchDecision eager = choose_verify_path(problem, h200, flags);
      problem.deferred = true;
      problem.u_records = true;  // exact outputs under auto (a u-free one would run fast)
      const DispatchDecision deferred = choose_verify_path(problem, h200, flags);
      REQUIRE(eager.fused());
      REQUIRE(deferred.fused());
      CHECK(eager.block_v == kernels::default_block_v(B, kHV, kV, 132, T));
      CHECK(deferred.block_v == kernels::default_deferred_block_v(B, kHV, kV, 132, T));
      CHECK(deferred.block_v == (B == 12 || B == 16 ? 64 : eager.block_v));
      CHECK(eager.block_v == (B == 4 ? 16 : B == 24 ? 64 : 32));
      // --kda-verify-block-v set: the flag's tile in either mode.
      DispatchFlags fixed = flags;
      fixed.block_v = 16;
      CHECK(choose_verify_path(problem, h200, fixed).block_v == 16);
    }
    DispatchProblem snap = fixture().problem(12, RecordMode::kSnapshot, T);
    snap.deferred = true;
    CHECK(choose_verify_path(snap, h200, flags).block_v ==
          kernels::default_snapshot_block_v(12, kHV, kV, 132));
  }
}

TEST_CASE("dispatch: the deferred tile rule on the presets and on any device", "[dispatch]") {
  // H200 (132 SMs), the deferred round per fixed tile (docs/bench/h200_v54_deferred_tile.txt):
  // Kimi-Linear (HV = 32) B = 1 takes BV = 64 up to T = kNarrowBv32MaxT and BV = 32 beyond,
  // B = 2 BV = 128; K3 TP8 (HV = 12) B = 1 BV = 32 at every T (the eager rule's BV = 16 at
  // T > 4 is 19-22% slower deferred), B = 2-3 BV = 64 then BV = 32, B = 4-7 BV = 128. From a
  // head-tile grid of 96 CTAs the eager rule (default_block_v), except the split of
  // kDeferredSplitMinCtas..264 head-tile CTAs at T <= 3 into BV = 64 (log v58,
  // docs/bench/h200_v58_deferred_split.txt): Kimi-Linear B = 4-8, K3 TP8 B = 11-22.
  const auto deferred = [](int B, int HV, int T) {
    return kernels::default_deferred_block_v(B, HV, 128, 132, T);
  };
  for (const int T : {1, 2, 3, 4}) {
    CAPTURE(T);
    CHECK(deferred(1, 32, T) == 64);
    CHECK(deferred(2, 32, T) == 128);
    CHECK(deferred(1, 12, T) == 32);
    CHECK(deferred(2, 12, T) == 64);
    CHECK(deferred(3, 12, T) == 64);
  }
  for (const int T : {0, 5, 8, 16}) {
    CAPTURE(T);
    CHECK(deferred(1, 32, T) == 32);
    CHECK(deferred(2, 32, T) == 128);
    CHECK(deferred(1, 12, T) == 32);
    CHECK(deferred(2, 12, T) == 32);
    CHECK(deferred(3, 12, T) == 32);
  }
  for (const int T : {1, 4, 8}) {
    for (const int B : {4, 5, 7}) {
      CHECK(deferred(B, 12, T) == 128);
    }
    for (const int B : {3, 16, 64}) {
      CHECK(deferred(B, 32, T) == kernels::default_block_v(B, 32, 128, 132, T));
    }
    for (const int B : {8, 64}) {
      CHECK(deferred(B, 12, T) == kernels::default_block_v(B, 12, 128, 132, T));
    }
    // The split: BV = 64 at T <= 3 where the eager rule runs BV = 128 over 128..264 CTAs.
    for (const int B : {4, 6, 8}) {  // (B = 5: 160 CTAs, where the eager rule splits already)
      CAPTURE(T, B);
      CHECK(kernels::default_block_v(B, 32, 128, 132, T) == 128);
      CHECK(deferred(B, 32, T) == (T <= 3 ? 64 : 128));  // measured: T = 4 loses
    }
    for (const int B : {16, 22}) {
      CAPTURE(T, B);
      CHECK(kernels::default_block_v(B, 12, 128, 132, T) == 128);
      CHECK(deferred(B, 12, T) == (T <= 3 ? 64 : 128));
    }
    CHECK(deferred(9, 32, T) == 128);   // 288 CTAs: beyond two waves
    CHECK(deferred(23, 12, T) == 128);  // 276 CTAs
    CHECK(kernels::default_fused_block_v(RecordMode::kRing, 2, T, 32, 128, 132, true) == 128);
    CHECK(kernels::default_fused_block_v(RecordMode::kRing, 2, T, 32, 128, 132) == 64);
  }
  // On any device size: a supported tile no wider than the head; where it differs from the eager
  // rule, either the head tile's grid is below 2 * kDeferredMinCtas, its own grid has at least
  // kDeferredMinCtas CTAs and runs one CTA per SM, and it is at least BV = 32, or it is the split
  // (BV = 64 for a BV = 128 head tile of kDeferredSplitMinCtas..2 * sms CTAs at T <= 3). No
  // device: the eager rule.
  for (const int sms : {0, 80, 114, 132, 148}) {
    for (const int HV : {1, 4, 12, 16, 32, 64}) {
      for (const int V : {8, 32, 64, 96, 128, 256}) {
        for (int B = 1; B <= 64; ++B) {
          for (const int T : {0, 2, 4, 8}) {
            CAPTURE(sms, HV, V, B, T);
            const int bv = kernels::default_deferred_block_v(B, HV, V, sms, T);
            const int eager = kernels::default_block_v(B, HV, V, sms, T);
            CHECK(kernels::is_fused_block_v(bv));
            CHECK(bv <= kernels::head_block_v(V));
            if (sms == 0) {
              CHECK(bv == eager);
            }
            const long long head_ctas =
                kernels::fused_grid_ctas(B, HV, V, kernels::head_block_v(V));
            if (bv != eager && head_ctas >= 2 * kernels::kDeferredMinCtas) {
              CHECK(bv == 64);
              CHECK(eager == 128);
              CHECK(T >= 1);
              CHECK(T <= kernels::kDeferredSplitMaxT);
              CHECK(head_ctas >= kernels::kDeferredSplitMinCtas);
              CHECK(head_ctas <= 2 * sms);
            } else if (bv != eager) {
              const long long ctas = kernels::fused_grid_ctas(B, HV, V, bv);
              CHECK(ctas >= kernels::kDeferredMinCtas);
              CHECK(ctas <= sms);
              CHECK(bv >= 32);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("dispatch: contract §4 table, platform x batch x mode", "[dispatch]") {
  const int B = GENERATE(1, 2, 4, 16, 64);
  const bool ring = GENERATE(false, true);
  const RecordMode mode = ring ? RecordMode::kRing : RecordMode::kSnapshot;
  const DispatchProblem problem = fixture().problem(B, mode);
  for (const PlatformCase& pc : platforms()) {
    CAPTURE(B, ring, pc.name);
    SECTION("default flags") {
      const DispatchDecision d = choose_verify_path(problem, pc.platform, DispatchFlags{});
      if (!ring) {
        CHECK(d.path == VerifyPath::kFused);
        CHECK(d.reason == DispatchReason::kSnapshotFused);
        CHECK(d.block_v ==
              kernels::default_snapshot_block_v(B, problem.HV, problem.V, pc.platform.sm_count));
      } else if (B > 1) {
        CHECK(d.path == VerifyPath::kUnfused);
        CHECK(d.reason == DispatchReason::kRingBatchAboveLimit);
        CHECK(d.describe_path() ==
              fmt::format("unfused: ring mode with B = {} > --kda-fused-ring-max-batch = 1", B));
      } else if (ring_platform(pc.platform)) {
        CHECK(d.path == VerifyPath::kFused);
        CHECK(d.reason == DispatchReason::kRingFused);
        CHECK(d.block_v ==
              kernels::default_block_v(B, problem.HV, problem.V, pc.platform.sm_count, problem.T));
      } else {
        CHECK(d.path == VerifyPath::kUnfused);
        CHECK(d.reason == DispatchReason::kRingPlatformUnmeasured);
        CHECK(d.describe_path() ==
              "unfused: ring mode on other (fused+ring is enabled on SM90 and SM100 only)");
      }
      const int sms = pc.platform.sm_count;
      CHECK(d.block_v == (!d.fused() ? 0
                          : ring
                              ? kernels::default_block_v(B, problem.HV, problem.V, sms, problem.T)
                              : kernels::default_snapshot_block_v(B, problem.HV, problem.V, sms)));
    }
    SECTION("fused verify switched off") {
      DispatchFlags flags;
      flags.fused_verify = false;
      const DispatchDecision d = choose_verify_path(problem, pc.platform, flags);
      CHECK(d.path == VerifyPath::kUnfused);
      CHECK(d.reason == DispatchReason::kFusedDisabled);
      CHECK(d.describe_path() == "unfused: fused verify switched off (--kda-fused-verify)");
    }
    SECTION("fused ring max batch widened to 64") {
      DispatchFlags flags;
      flags.fused_ring_max_batch = 64;
      flags.block_v = 16;
      const DispatchDecision d = choose_verify_path(problem, pc.platform, flags);
      const bool fused = !ring || ring_platform(pc.platform);
      CHECK(d.fused() == fused);
      CHECK(d.reason == (!ring   ? DispatchReason::kSnapshotFused
                         : fused ? DispatchReason::kRingFused
                                 : DispatchReason::kRingPlatformUnmeasured));
      CHECK(d.block_v == (fused ? 16 : 0));
    }
    SECTION("fused ring max batch 0: ring mode never fused") {
      DispatchFlags flags;
      flags.fused_ring_max_batch = 0;
      const DispatchDecision d = choose_verify_path(problem, pc.platform, flags);
      CHECK(d.fused() == !ring);
    }
  }
}

TEST_CASE("dispatch: the fused ring decision says why", "[dispatch]") {
  const DispatchDecision d = choose_verify_path(fixture().problem(1, RecordMode::kRing),
                                                fake_platform(10, 0), DispatchFlags{});
  CHECK(d.describe() ==
        "fused (block_v = 8): ring mode with B = 1 <= --kda-fused-ring-max-batch = 1 on SM100, "
        "ring layout ok; outputs exact: auto: no measurement for this shape");
  const DispatchDecision s =
      choose_verify_path(fixture().problem(4, RecordMode::kSnapshot), Platform{}, DispatchFlags{});
  CHECK(s.describe() ==
        "fused (block_v = 16): snapshot mode (no batch or platform gate); outputs exact: snapshot "
        "mode");
}

TEST_CASE("dispatch: inputs outside the fused kernel fall back with a reason", "[dispatch]") {
  const RecordMode mode = GENERATE(RecordMode::kSnapshot, RecordMode::kRing);
  CAPTURE(mode == RecordMode::kRing);
  const Platform sm90 = fake_platform(9, 0);
  DispatchProblem p = fixture().problem(1, mode);
  DispatchFlags flags;
  DispatchReason want = DispatchReason::kSnapshotFused;  // kept: the fused path is expected
  std::string text;

  SECTION("a tree draft") {
    p.plain_chain = false;
    want = DispatchReason::kNotPlainChain;
    text = "unfused: a tree draft (the fused kernels verify chains)";
  }
  SECTION("a ragged chain's rows are its packed total") {
    p.tokens = p.B * p.T - 1;  // the views still have B*T rows
    want = DispatchReason::kUnsupportedShape;
    text =
        "unfused: outside the fused kernel (unsupported_shape): mixed_qkv rows is 4, fused needs "
        "the batch's tokens (B*T, or the ragged total)";
  }
  SECTION("K") {
    p.K = 96;
    want = DispatchReason::kUnsupportedShape;
    text =
        "unfused: outside the fused kernel (unsupported_shape): K (head_k_dim) is 96, fused "
        "needs 64 or 128";
  }
  SECTION("conv width") {
    p.conv_width = 3;
    want = DispatchReason::kUnsupportedShape;
    text =
        "unfused: outside the fused kernel (unsupported_shape): conv width W is 3, fused needs 4";
  }
  SECTION("T above the fused buckets") {
    p.T = 17;
    want = DispatchReason::kUnsupportedShape;
    text = "unfused: outside the fused kernel (unsupported_shape): T is 17, fused needs 1..16";
  }
  SECTION("a columns") {
    p.a = p.a.narrow(1, 0, kHV * kK - 1);
    want = DispatchReason::kUnsupportedShape;
    text =
        "unfused: outside the fused kernel (unsupported_shape): a columns is 255, fused needs "
        "HV*K";
  }
  SECTION("a dtype") {
    p.a = TensorView::contiguous(p.a.data(), DType::kF16, Device::host(), {kT, kHV * kK});
    want = DispatchReason::kUnsupportedDtype;
    text =
        "unfused: outside the fused kernel (unsupported_dtype): a dtype is f16, fused needs bf16";
  }
  SECTION("conv bias dtype differs from the weight") {
    p.conv_bias = TensorView::contiguous(p.conv_bias.data(), DType::kBF16, Device::host(), {kD});
    want = DispatchReason::kUnsupportedDtype;
    text =
        "unfused: outside the fused kernel (unsupported_dtype): conv_bias dtype is bf16, fused "
        "needs conv_weight's dtype";
  }
  SECTION("qkv inner stride") {
    p.mixed_qkv = TensorView(p.mixed_qkv.data(), DType::kBF16, Device::host(), {kT, kD}, {1, kT});
    want = DispatchReason::kUnsupportedStrides;
    text =
        "unfused: outside the fused kernel (unsupported_strides): mixed_qkv strides is "
        "4, fused needs 1 (inner dim contiguous)";
  }
  SECTION("unpacked conv weight") {
    p.conv_weight = TensorView(p.conv_weight.data(), DType::kF32, Device::host(), {kD, 4}, {8, 1});
    want = DispatchReason::kUnsupportedStrides;
    text =
        "unfused: outside the fused kernel (unsupported_strides): conv_weight strides is 8, "
        "fused needs packed (4, 1)";
  }
  SECTION("slots dtype") {
    p.slots = TensorView::contiguous(p.slots.data(), DType::kF32, Device::host(), {1});
    want = DispatchReason::kUnsupportedIndices;
    text =
        "unfused: outside the fused kernel (unsupported_indices): slots dtype is f32, fused "
        "needs int32";
  }
  SECTION("rows extent") {
    p.rows = fixture().problem(2, mode).rows;
    want = DispatchReason::kUnsupportedIndices;
    text =
        "unfused: outside the fused kernel (unsupported_indices): rows shape is 2, fused "
        "needs B";
  }
  SECTION("b on another device") {
    p.b = TensorView::contiguous(p.b.data(), DType::kBF16, Device::cuda(1), {kT, kHV});
    want = DispatchReason::kUnsupportedDevice;
    text =
        "unfused: outside the fused kernel (unsupported_device): b device is cuda:1 "
        "(mixed_qkv on host), fused needs mixed_qkv's device";
  }
  SECTION("block_v") {
    flags.block_v = 12;
    want = DispatchReason::kUnsupportedBlockV;
    text =
        "unfused: outside the fused kernel (unsupported_block_v): block_v is 12, fused needs "
        "one of 8, 16, 32, 64, 128";
  }
  SECTION("a padded row pitch is fine") {
    p.mixed_qkv =
        TensorView(p.mixed_qkv.data(), DType::kBF16, Device::host(), {kT, kD}, {kD + 64, 1});
  }
  const DispatchDecision d = choose_verify_path(p, sm90, flags);
  if (want == DispatchReason::kSnapshotFused) {
    CHECK(d.fused());
    CHECK(d.reason == (mode == RecordMode::kRing ? DispatchReason::kRingFused
                                                 : DispatchReason::kSnapshotFused));
  } else {
    CHECK(d.path == VerifyPath::kUnfused);
    CHECK(d.reason == want);
    CHECK(d.describe_path() == text);
  }
}

TEST_CASE("dispatch: an empty problem is rejected without throwing", "[dispatch]") {
  const DispatchDecision d = choose_verify_path(DispatchProblem{}, Platform{}, DispatchFlags{});
  CHECK(d.path == VerifyPath::kUnfused);
  CHECK(d.reason == DispatchReason::kUnsupportedShape);
  CHECK(d.describe() ==
        "unfused: outside the fused kernel (unsupported_shape): B is 0, fused "
        "needs >= 1; outputs exact: snapshot mode");
}

TEST_CASE("dispatch: each ring-layout failure has its own reason", "[dispatch]") {
  const DispatchFixture& f = fixture();
  const RingViews good = f.rings();
  const int64_t S = f.pool().num_slots();
  struct RingCase {
    const char* name;
    RingViews rings;
    RingLayoutIssue issue;
    const char* text;
  };
  RingViews missing = good;
  missing.rawk = TensorView();
  RingViews device = good;
  device.g = TensorView::contiguous(good.g.data(), DType::kF32, Device::cuda(0), {S, kHV, kL, kK});
  RingViews ndim = good;
  ndim.beta = TensorView::contiguous(good.beta.data(), DType::kF32, Device::host(),
                                     {1, S, kHV, kL});  // layer dim still attached
  RingViews gdn_g = good;
  gdn_g.g = TensorView::contiguous(good.g.data(), DType::kF32, Device::host(), {S, kHV, kL});
  RingViews dtype = good;
  dtype.rawv =
      TensorView::contiguous(good.rawv.data(), DType::kF16, Device::host(), {S, kHV, kL, kV});
  RingViews f32_beta = good;
  f32_beta.beta =
      TensorView::contiguous(good.beta.data(), DType::kBF16, Device::host(), {S, kHV, kL});
  RingViews slots = good;
  slots.rawv = good.rawv.narrow(0, 0, S - 1);
  RingViews heads = good;
  heads.rawk =
      TensorView::contiguous(good.rawk.data(), DType::kBF16, Device::host(), {S / 2, kHV, kL, kK});
  heads.rawk = TensorView::contiguous(good.g.data(), DType::kBF16, Device::host(),
                                      {S, kHV, kL, kK});  // per v-head instead of per k-head
  RingViews length = good;
  length.g =
      TensorView::contiguous(good.g.data(), DType::kF32, Device::host(), {S, kHV, kL / 2, kK});
  RingViews dim = good;
  dim.rawv =
      TensorView::contiguous(good.rawv.data(), DType::kBF16, Device::host(), {S, kHV, kL, kV / 2});
  RingViews unpacked = good;
  unpacked.rawk = TensorView(good.rawk.data(), DType::kBF16, Device::host(), {S / 2, kH, kL, kK},
                             {2 * kH * kL * kK, 2 * kL * kK, kK, 1});
  RingViews overlap = good;
  overlap.beta =
      TensorView(good.beta.data(), DType::kF32, Device::host(), {S, kHV, kL}, {kL, kL, 1});
  RingViews padded_pitch = good;  // a padded slot pitch is allowed
  padded_pitch.beta = TensorView(good.beta.data(), DType::kF32, Device::host(), {S / 2, kHV, kL},
                                 {2 * kHV * kL, kL, 1});
  RingViews short_ring;
  short_ring.rawv =
      TensorView::contiguous(good.rawv.data(), DType::kBF16, Device::host(), {S, kHV, 2, kV});
  short_ring.rawk =
      TensorView::contiguous(good.rawk.data(), DType::kBF16, Device::host(), {S, kH, 2, kK});
  short_ring.g =
      TensorView::contiguous(good.g.data(), DType::kF32, Device::host(), {S, kHV, 2, kK});
  short_ring.beta =
      TensorView::contiguous(good.beta.data(), DType::kF32, Device::host(), {S, kHV, 2});

  const std::vector<RingCase> cases = {
      {"missing", missing, RingLayoutIssue::kMissing, "ring_rawk: missing (no ring view)"},
      {"device", device, RingLayoutIssue::kWrongDevice,
       "ring_g: on cuda:0, expected host (the activations' device)"},
      {"ndim", ndim, RingLayoutIssue::kWrongNdim, "ring_beta: 4-d, expected 3-d (per-layer view)"},
      {"gdn g", gdn_g, RingLayoutIssue::kWrongNdim, "ring_g: 3-d, expected 4-d (per-layer view)"},
      {"rawv dtype", dtype, RingLayoutIssue::kWrongDtype, "ring_rawv: dtype f16, expected bf16"},
      {"beta dtype", f32_beta, RingLayoutIssue::kWrongDtype, "ring_beta: dtype bf16, expected f32"},
      {"slots", slots, RingLayoutIssue::kTooFewSlots,
       "ring_rawv: dim 0 (slots) is 63, expected >= S = 64"},
      {"heads", heads, RingLayoutIssue::kWrongHeads,
       "ring_rawk: dim 1 (heads) is 4, expected H = 2"},
      {"length", length, RingLayoutIssue::kWrongLength,
       "ring_g: dim 2 (ring length) is 8, expected L = 16 (ring_rawv's)"},
      {"dim", dim, RingLayoutIssue::kWrongDim, "ring_rawv: dim 3 is 32, expected V = 64"},
      {"unpacked", unpacked, RingLayoutIssue::kTooFewSlots,
       "ring_rawk: dim 0 (slots) is 32, expected >= S = 64"},
      {"overlap", overlap, RingLayoutIssue::kNotPacked,
       "ring_beta: slot pitch stride(0) = 16 overlaps slots (expected >= 64)"},
      {"padded pitch, too few slots", padded_pitch, RingLayoutIssue::kTooFewSlots,
       "ring_beta: dim 0 (slots) is 32, expected >= S = 64"},
      {"short", short_ring, RingLayoutIssue::kTooShort,
       "ring length L = 2 < T = 4: steps t >= L would be dropped"},
  };
  const DispatchProblem base = f.problem(1, RecordMode::kRing);
  for (const RingCase& c : cases) {
    CAPTURE(c.name);
    DispatchProblem p = base;
    p.rings = c.rings;
    const DispatchDecision d = choose_verify_path(p, fake_platform(9, 0), DispatchFlags{});
    CHECK(d.path == VerifyPath::kUnfused);
    CHECK(d.reason == DispatchReason::kRingLayoutRejected);
    CHECK(d.ring.issue == c.issue);
    CHECK(d.ring.describe() == c.text);
    CHECK(d.describe_path() == fmt::format("unfused: ring layout rejected ({}): {}",
                                           ring_layout_issue_name(c.issue), c.text));
  }

  SECTION("inner-stride and slot-pitch rules with S = 32 slots") {
    DispatchProblem p = base;
    p.num_slots = S / 2;
    RingViews r = good;
    r.rawk = unpacked.rawk;  // stride(2) = K but stride(1) = 2*L*K
    p.rings = r;
    DispatchDecision d = choose_verify_path(p, fake_platform(9, 0), DispatchFlags{});
    CHECK(d.ring.issue == RingLayoutIssue::kNotPacked);
    CHECK(d.ring.describe() == "ring_rawk: stride(1) = 2048, expected 1024 (packed inner dims)");
    r = good;
    r.beta = padded_pitch.beta;
    p.rings = r;
    d = choose_verify_path(p, fake_platform(9, 0), DispatchFlags{});
    CHECK(d.ring.ok());
    CHECK(d.reason == DispatchReason::kRingFused);
  }
}

TEST_CASE("dispatch: the default tile is the H200's measured best (docs/perf_log.md v4, v13, v32)",
          "[dispatch]") {
  // Best fused BV per B = 1, 2, 4, 8, 16, 32, 64 (T = 4 and 8 agree but for one row), kda_bench
  // on the H200 (132 SMs): snapshot mode docs/perf_log.md v4; ring mode, where grids of
  // 96..132 CTAs run BV = 128 one CTA per SM, h200_v13k_*.txt. At K3 TP8 B = 1 ring mode takes
  // BV = 32 one per SM on 48 CTAs up to T = 4, BV = 16 beyond (v42, h200_v42_block_v_sweep.txt:
  // BV = 32 -7.2 / -3.7 / +2.2% at T = 2 / 4 / 8).
  const int batches[] = {1, 2, 4, 8, 16, 32, 64};
  const int kimi_linear[] = {32, 64, 64, 128, 128, 128, 128};  // HV = 32, V = 128
  const int k3_tp8[] = {16, 32, 64, 64, 128, 128, 128};        // HV = 12, V = 128
  const int kimi_linear_ring[] = {32, 64, 128, 128, 128, 128, 128};
  const int k3_tp8_ring[] = {32, 32, 64, 128, 128, 128, 128};
  for (size_t i = 0; i < std::size(batches); ++i) {
    CAPTURE(batches[i]);
    CHECK(kernels::default_block_v(batches[i], 32, 128) == kimi_linear[i]);
    CHECK(kernels::default_block_v(batches[i], 12, 128) == k3_tp8[i]);
    CHECK(kernels::default_block_v(batches[i], 32, 128, 132, /*T=*/4) == kimi_linear_ring[i]);
    CHECK(kernels::default_block_v(batches[i], 12, 128, 132, /*T=*/4) == k3_tp8_ring[i]);
    if (i > 0) {
      CHECK(kernels::default_block_v(batches[i], 12, 128, 132, /*T=*/8) == k3_tp8_ring[i]);
    }
  }
  CHECK(kernels::default_block_v(1, 12, 128, 132, /*T=*/8) == 16);
  // Snapshot mode on the H200 (docs/perf_log.md v32): K3 TP8 B = 16 takes BV = 64 (384 CTAs one
  // per SM fill 2.9 waves, BV = 128's 192 fill 1.45), Kimi-Linear B = 32 and 64 BV = 64 (beyond
  // kSnapshotWideMaxWaves waves of BV = 128 CTAs); without a device, default_block_v's rule.
  const int kimi_linear_snapshot[] = {32, 64, 64, 128, 128, 64, 64};
  const int k3_tp8_snapshot[] = {16, 32, 64, 64, 64, 128, 128};
  for (size_t i = 0; i < std::size(batches); ++i) {
    CAPTURE(batches[i]);
    CHECK(kernels::default_snapshot_block_v(batches[i], 32, 128, 132) == kimi_linear_snapshot[i]);
    CHECK(kernels::default_snapshot_block_v(batches[i], 12, 128, 132) == k3_tp8_snapshot[i]);
    CHECK(kernels::default_snapshot_block_v(batches[i], 32, 128, 0) == kimi_linear[i]);
    CHECK(kernels::default_snapshot_block_v(batches[i], 12, 128, 0) == k3_tp8[i]);
  }
  // Fewer SMs than the widest grid's CTAs: no one-per-SM window (H100 PCIe: 114 SMs).
  CHECK(kernels::default_block_v(4, 32, 128, 114) == 64);
  // Small and odd shapes stay on supported tiles.
  CHECK(kernels::default_block_v(1, 1, 64) == 16);
  CHECK(kernels::default_block_v(65535, 64, 1024) == 128);
}

TEST_CASE("dispatch: ring mode's default tile at small grids and V = 64 (docs/perf_log.md v42)",
          "[dispatch]") {
  // The ring-mode default per B = 1, 2, 4, 8 at T = 4 and T = 8 on the H200 (132 SMs), from the
  // sweep of every tile at T = 2, 4, 8 (docs/bench/h200_v42_block_v_sweep.txt). Narrow grids:
  // BV = 16 (BV = 32 up to T = kNarrowBv32MaxT) from 48 CTAs one per SM, else BV = 8; at V = 64
  // never the half-idle BV = 128 tile.
  struct Row {
    int HV, V;
    int t4[4], t8[4];
  };
  const Row rows[] = {
      {4, 128, {8, 16, 32, 32}, {8, 16, 16, 32}},
      {8, 128, {16, 32, 32, 64}, {16, 16, 32, 64}},
      {12, 128, {32, 32, 64, 128}, {16, 32, 64, 128}},
      {16, 128, {32, 32, 64, 128}, {16, 32, 64, 128}},
      {24, 128, {32, 64, 128, 128}, {32, 64, 128, 128}},
      {64, 128, {64, 128, 128, 128}, {64, 128, 128, 128}},
      {16, 64, {16, 32, 32, 64}, {16, 16, 32, 64}},
      {32, 64, {32, 32, 64, 64}, {16, 32, 64, 64}},
  };
  for (const Row& r : rows) {
    for (int i = 0; i < 4; ++i) {
      const int B = 1 << i;
      CAPTURE(r.HV, r.V, B);
      CHECK(kernels::default_block_v(B, r.HV, r.V, 132, /*T=*/2) == r.t4[i]);
      CHECK(kernels::default_block_v(B, r.HV, r.V, 132, /*T=*/4) == r.t4[i]);
      CHECK(kernels::default_block_v(B, r.HV, r.V, 132, /*T=*/8) == r.t8[i]);
      CHECK(kernels::default_block_v(B, r.HV, r.V, 132) == r.t8[i]);  // T unknown
      CHECK(kernels::default_fused_block_v(RecordMode::kRing, B, 4, r.HV, r.V, 132) == r.t4[i]);
    }
  }
  // Snapshot mode keeps its rule but, at V = 64, the head tile BV = 64 where it took BV = 128.
  CHECK(kernels::default_block_v(8, 32, 64) == 64);
  CHECK(kernels::default_snapshot_block_v(64, 32, 64, 132) == 64);
  CHECK(kernels::default_block_v(1, 4, 128) == 16);
  CHECK(kernels::head_block_v(64) == 64);
  CHECK(kernels::head_block_v(6) == 8);
  CHECK(kernels::head_block_v(96) == 128);
  CHECK(kernels::head_block_v(256) == 128);
  // On any device size: a supported tile never wider than the head. Below the head, BV = 8
  // only where its grid runs one CTA per SM (its steps grouped), and BV = 32 below 96 CTAs
  // likewise (BV = 16 is also the fallback of a grid that does not fit one CTA per SM).
  for (const int sms : {0, 80, 114, 132, 148}) {
    for (const int HV : {1, 4, 12, 16, 32, 64}) {
      for (const int V : {8, 32, 64, 96, 128, 256}) {
        for (int B = 1; B <= 64; ++B) {
          CAPTURE(sms, HV, V, B);
          const int bv = kernels::default_block_v(B, HV, V, sms, /*T=*/4);
          CHECK(std::count(std::begin(kernels::kFusedBlockVs), std::end(kernels::kFusedBlockVs),
                           bv) == 1);
          CHECK(bv <= kernels::head_block_v(V));
          const long long ctas = kernels::fused_grid_ctas(B, HV, V, bv);
          const bool one_per_sm = kernels::one_cta_per_sm_tiles_on(ctas, /*grouped=*/true, sms,
                                                                   kernels::TileOccupancy::kAuto);
          if (bv < kernels::head_block_v(V) && (bv == 8 || (bv == 32 && ctas < 96))) {
            CHECK(one_per_sm);
          }
        }
      }
    }
  }
}

TEST_CASE("dispatch: a BV = 128 default below 192 CTAs always runs one CTA per SM", "[dispatch]") {
  // default_block_v picks BV = 128 for 96..SMs CTAs only because the launcher then runs the
  // per-item tiles one CTA per SM (grouped steps); below 192 CTAs in any other form BV = 64 is
  // faster (docs/perf_log.md v13k). The two rules must agree on every shape and device size.
  for (const int sms : {0, 80, 114, 132, 148}) {
    for (const int HV : {1, 4, 12, 16, 32, 64}) {
      for (const int V : {64, 128, 256}) {
        for (int B = 1; B <= 64; ++B) {
          CAPTURE(sms, HV, V, B);
          const int bv = kernels::default_block_v(B, HV, V, sms);
          const int64_t ctas = int64_t{B} * HV * ((V + bv - 1) / bv);
          if (bv == 128 && ctas < 192) {
            CHECK(kernels::one_cta_per_sm_tiles_on(ctas, /*grouped=*/true, sms,
                                                   kernels::TileOccupancy::kAuto));
          }
          // Snapshot mode (no one-per-SM window): never BV = 128 below 192 CTAs.
          const int snap_bv = kernels::default_block_v(B, HV, V);
          CHECK((snap_bv < 128 || int64_t{B} * HV * ((V + 127) / 128) >= 192));
        }
      }
    }
  }
}

TEST_CASE("dispatch: the deferred-commit rule follows its measured step table", "[dispatch]") {
  // Every card's table (dispatch/auto_tables/*.def, made from kda_bench --phases step CSVs by
  // tools/bench/make_auto_table.py): at each measured row the rule defers exactly where the
  // deferred step beat the eager one by more than kDeferredMinGainPct; a configured batch between
  // measured rows takes the largest measured B below it.
  size_t cards = 0;
  const CommitPolicyCard* card = commit_policy_cards(&cards);
  REQUIRE(cards >= 1);
  for (size_t c = 0; c < cards; ++c) {
    CAPTURE(card[c].name);
    REQUIRE(card[c].count > 0);
    int defers = 0, stays = 0;
    for (size_t i = 0; i < card[c].count; ++i) {
      const CommitPolicyRow& r = card[c].rows[i];
      CAPTURE(r.HV, r.K, r.V, r.T, r.B, r.eager_us, r.deferred_us);
      REQUIRE(r.gemm_us > 0.0);
      REQUIRE(r.eager_us > r.gemm_us);  // a step row: the KDA layers cost something
      CommitPolicyShape s{r.HV, r.K, r.V, r.B, r.T};
      s.memory_gbps = card[c].memory_gbps;
      CHECK(&nearest_commit_policy_card(s.memory_gbps) == &card[c]);
      CHECK(deferred_commit_row(s) == &r);
      const bool faster = r.deferred_us < r.eager_us * (1.0 - kDeferredMinGainPct / 100.0);
      CHECK(deferred_commit_pays(s) == faster);
      (faster ? defers : stays) += 1;
      // The next batch up to the next measured row decides by this row.
      s.max_batch = r.B + 1;
      const CommitPolicyRow* next = deferred_commit_row(s);
      REQUIRE(next != nullptr);
      CHECK((next == &r || next->B == r.B + 1));
    }
    CHECK(defers > 0);  // the table decides both ways: a rule flipped everywhere fails above
    CHECK(stays > 0);
  }
}

TEST_CASE("dispatch: the deferred-commit rule on the H100 step, and unmeasured shapes",
          "[dispatch]") {
  // The H100 step table (docs/perf.md §5, docs/bench/h100_step_*): Kimi-Linear defers from
  // B = 16 at every T and never below (the previous kernel of a verify is a GEMM, so the fold
  // before the PDL wait has nothing to overlap at small B); K3 TP8 (hidden 7168: the GEMMs
  // dominate) at B = 64 at every T and at B = 32 for T = 7-8.
  const auto pays = [](int HV, int B, int T) {
    CommitPolicyShape s{HV, 128, 128, B, T};
    s.memory_gbps = 3352.0;
    return deferred_commit_pays(s);
  };
  for (int T = 1; T <= 8; ++T) {
    CAPTURE(T);
    for (const int B : {1, 2, 3, 4, 8, 15}) {
      CHECK_FALSE(pays(32, B, T));
    }
    for (const int B : {16, 31, 32, 64, 256}) {
      CHECK(pays(32, B, T));
    }
    for (const int B : {1, 2, 4, 8, 16, 31}) {
      CHECK_FALSE(pays(12, B, T));
    }
    CHECK(pays(12, 32, T) == (T >= 7));
    for (const int B : {64, 512}) {
      CHECK(pays(12, B, T));
    }
  }
  // Unmeasured shapes (other heads or head dims, T > 8, no batch) keep the eager commit, on any
  // card; an unknown device (0) takes the first card's table.
  for (const double gbps : {0.0, 3352.0, 4800.0}) {
    CAPTURE(gbps);
    const auto at = [gbps](CommitPolicyShape s) {
      s.memory_gbps = gbps;
      return deferred_commit_pays(s);
    };
    CHECK_FALSE(at({32, 128, 128, 64, 9}));
    CHECK_FALSE(at({12, 128, 128, 64, 16}));
    CHECK_FALSE(at({32, 64, 128, 64, 4}));
    CHECK_FALSE(at({32, 128, 64, 64, 4}));
    CHECK_FALSE(at({7, 128, 128, 64, 4}));
    CHECK_FALSE(at({32, 128, 128, 0, 4}));
    CHECK(at({32, 128, 128, 64, 4}));
  }
}

namespace {

// A measured card for the numerics tests: the fixture's shape at T = kT, fast paying from B = 8
// to 31 (rows by B: exact, fast, exact); nothing at other T.
constexpr NumericsPolicyRow kTestNumericsRows[] = {
    {kH, kHV, kK, kV, kT, 1, 950.0, 949.5, 800.0, VerifyNumerics::kExact},
    {kH, kHV, kK, kV, kT, 8, 1400.0, 1200.0, 800.0, VerifyNumerics::kFast},
    {kH, kHV, kK, kV, kT, 32, 2000.0, 1995.0, 800.0, VerifyNumerics::kExact},
};
constexpr NumericsPolicyCard kTestNumericsCard = {"test card", 3352.0, kTestNumericsRows,
                                                  std::size(kTestNumericsRows)};

DispatchFlags fast_flags(NumericsRequest request = NumericsRequest::kFast) {
  DispatchFlags flags;
  flags.fused_ring_max_batch = kMaxB;
  flags.numerics = request;
  return flags;
}

}  // namespace

TEST_CASE("dispatch: each numerics reason, in the rules' order", "[dispatch][numerics]") {
  const Platform sm90 = fake_platform(9, 0, 132);
  DispatchProblem p = fixture().problem(1, RecordMode::kRing);
  DispatchFlags flags = fast_flags();
  NumericsReason want = NumericsReason::kFastRequested;
  std::string text = "outputs fast (tensor cores): --kda-verify-numerics fast";
  SECTION("fast asked for, every gate passed") {}
  SECTION("exact asked for") {
    flags.numerics = NumericsRequest::kExact;
    want = NumericsReason::kExactRequested;
    text = "outputs exact: --kda-verify-numerics exact";
  }
  SECTION("snapshot mode") {
    p = fixture().problem(1, RecordMode::kSnapshot);
    want = NumericsReason::kExactSnapshotMode;
    text = "outputs exact: snapshot mode";
  }
  SECTION("a tree draft") {
    p.plain_chain = false;
    want = NumericsReason::kExactTree;
    text = "outputs exact: a tree draft";
  }
  SECTION("T beyond one fast chunk (before the path: T > 16 is unfused too)") {
    p = fixture().problem(1, RecordMode::kRing, kernels::kFastMaxTokens + 1);
    want = NumericsReason::kExactTokens;
    text = "outputs exact: T = 17 outside one fast chunk (1..16)";
  }
  SECTION("the unfused path: above the fused ring batch") {
    p = fixture().problem(2, RecordMode::kRing);
    flags.fused_ring_max_batch = 1;
    want = NumericsReason::kExactUnfused;
    text = "outputs exact: the unfused path";
  }
  SECTION("the unfused path: fused verify off") {
    flags.fused_verify = false;
    want = NumericsReason::kExactUnfused;
    text = "outputs exact: the unfused path";
  }
  SECTION("a deferred commit with u records") {
    p.deferred = true;
    p.u_records = true;
    want = NumericsReason::kExactDeferredFold;
    text = "outputs exact: the deferred commit keeps u records (its pool is not u-free)";
  }
  SECTION("a u-free deferred commit: fast (its pending steps fold computing u)") {
    p.deferred = true;
    p.u_records = false;
  }
  SECTION("a forced tile outside the fast tiles") {
    flags.block_v = 16;
    want = NumericsReason::kExactBlockV;
    text = "outputs exact: --kda-verify-block-v = 16 is not a fast tile (32, 64, 128)";
  }
  SECTION("auto on a deferred commit with u records: exact whatever the row says") {
    // A backend keeps u records under auto where the step table's exact deferred step is the
    // faster deferred one, so its deferred verifies stay exact even where this table picks fast.
    flags.numerics = NumericsRequest::kAuto;
    flags.numerics_table = &kTestNumericsCard;
    p = fixture().problem(8, RecordMode::kRing);
    p.deferred = true;
    p.u_records = true;
    want = NumericsReason::kExactDeferredFold;
    text = "outputs exact: the deferred commit keeps u records (its pool is not u-free)";
  }
  SECTION("auto on a u-free deferred commit: fast whatever the row says") {
    // The backend went u-free under auto (its step table's fast deferred step was the faster):
    // every call runs the fast outputs, folding in the fast kernel, even where the eager table
    // picks exact (an exact call would fold in a kernel of its own first).
    flags.numerics = NumericsRequest::kAuto;
    flags.numerics_table = &kTestNumericsCard;
    p = fixture().problem(40, RecordMode::kRing);
    p.deferred = true;
    p.u_records = false;
    want = NumericsReason::kAutoUFree;
    text =
        "outputs fast (tensor cores): auto, the deferred commit is u-free (auto's step table "
        "chose it for the backend's batch; the fast kernel folds the pending steps)";
  }
  SECTION("auto on a u-free deferred commit: the gates still apply") {
    flags.numerics = NumericsRequest::kAuto;
    flags.block_v = 16;
    p.deferred = true;
    p.u_records = false;
    want = NumericsReason::kExactBlockV;
    text = "outputs exact: --kda-verify-block-v = 16 is not a fast tile (32, 64, 128)";
  }
  SECTION("auto: the measured row says fast") {
    flags.numerics = NumericsRequest::kAuto;
    flags.numerics_table = &kTestNumericsCard;
    p = fixture().problem(8, RecordMode::kRing);
    want = NumericsReason::kAutoFast;
    text = "outputs fast (tensor cores): auto, measured faster on the step (test card, row B = 8)";
  }
  SECTION("auto: the measured row says exact") {
    flags.numerics = NumericsRequest::kAuto;
    flags.numerics_table = &kTestNumericsCard;
    p = fixture().problem(40, RecordMode::kRing);
    want = NumericsReason::kAutoExact;
    text = "outputs exact: auto, fast measured no faster on the step (test card, row B = 32)";
  }
  SECTION("auto: no measured row (the injected table at another T)") {
    flags.numerics = NumericsRequest::kAuto;
    flags.numerics_table = &kTestNumericsCard;
    p = fixture().problem(8, RecordMode::kRing, kT + 1);
    want = NumericsReason::kAutoUnmeasured;
    text = "outputs exact: auto: no measurement for this shape";
  }
  SECTION("auto: no measured row (the built-in tables have no preset this small)") {
    flags.numerics = NumericsRequest::kAuto;
    want = NumericsReason::kAutoUnmeasured;
    text = "outputs exact: auto: no measurement for this shape";
  }
  const DispatchDecision d = choose_verify_path(p, sm90, flags);
  CAPTURE(d.describe());
  CHECK(d.numerics_reason == want);
  const bool fast = want == NumericsReason::kFastRequested || want == NumericsReason::kAutoFast ||
                    want == NumericsReason::kAutoUFree;
  CHECK(d.fast_outputs() == fast);
  CHECK(d.numerics == (fast ? VerifyNumerics::kFast : VerifyNumerics::kExact));
  CHECK(d.describe_numerics() == text);
  CHECK(d.describe_reason() == d.describe_path() + "; " + text);
  CHECK(d.describe() == d.describe_reason());  // no plan filled
  // The numerics never change the path or its reason; a fast call's auto tile is the fast rule's.
  DispatchFlags exact_flags = flags;
  exact_flags.numerics = NumericsRequest::kExact;
  const DispatchDecision exact = choose_verify_path(p, sm90, exact_flags);
  CHECK(d.path == exact.path);
  CHECK(d.reason == exact.reason);
  CHECK(d.block_v ==
        (fast ? kernels::default_fast_block_v(p.B, kHV, kV, sm90.sm_count) : exact.block_v));
  // The numerics and their reason are part of the choice (a change is logged).
  CHECK(d.same_choice(exact) == (want == NumericsReason::kExactRequested));
}

TEST_CASE("dispatch: the fast outputs' auto tile and a forced fast tile", "[dispatch][numerics]") {
  // HV = 4, V = 64: the head tile BV = 64 has B * 4 CTAs; the fast rule keeps it from one CTA per
  // SM (B * 4 >= SMs) and takes BV = 32 below. A forced fast tile stands.
  for (const int sms : {78, 132}) {
    const Platform platform = fake_platform(9, 0, sms);
    for (const int B : {1, 2, 19, 20, 32, 33, 64}) {
      CAPTURE(sms, B);
      const DispatchProblem p = fixture().problem(B, RecordMode::kRing);
      const DispatchDecision d = choose_verify_path(p, platform, fast_flags());
      REQUIRE(d.fused());
      REQUIRE(d.fast_outputs());
      CHECK(d.block_v == kernels::default_fast_block_v(B, kHV, kV, sms));
      CHECK(d.block_v == (B * kHV >= sms ? 64 : 32));
      for (const int forced : kernels::kFastBlockVs) {
        DispatchFlags flags = fast_flags();
        flags.block_v = forced;
        const DispatchDecision f = choose_verify_path(p, platform, flags);
        CHECK(f.fast_outputs());
        CHECK(f.block_v == forced);
      }
    }
  }
  // The fast rule on the presets' shapes (V = 128, 132 SMs): Kimi-Linear (HV = 32) keeps BV = 128
  // from B = 5 (160 CTAs), K3 TP8 (HV = 12) from B = 11 (132 CTAs).
  CHECK(kernels::default_fast_block_v(4, 32, 128, 132) == 64);
  CHECK(kernels::default_fast_block_v(5, 32, 128, 132) == 128);
  CHECK(kernels::default_fast_block_v(10, 12, 128, 132) == 64);
  CHECK(kernels::default_fast_block_v(11, 12, 128, 132) == 128);
  CHECK(kernels::default_fast_block_v(1, 12, 128, 132) == 32);
}

TEST_CASE("dispatch: a fast decision is what the plan can run (kernels::fast_outputs_plannable)",
          "[dispatch][numerics]") {
  // The dispatcher's gates are the plan's: over mode x draft shape x deferred x T x B x forced
  // tile, the decision is fast exactly where the call's params, with the decision's numerics,
  // plan VerifySchedule::kFastChunk.
  const Platform sm90 = fake_platform(9, 0, 132);
  static const int32_t kSomeIndex = 0;
  int fast = 0, exact = 0;
  for (const bool ring : {false, true}) {
    for (const bool tree : {false, true}) {
      for (const int deferred_kind : {0, 1, 2}) {  // eager, deferred with u records, u-free
        const bool deferred = deferred_kind != 0;
        for (const int T : {1, 4, 8, 17}) {
          for (const int B : {1, 2, 8}) {
            for (const int block_v : {0, 8, 16, 32, 64, 128}) {
              const RecordMode mode = ring ? RecordMode::kRing : RecordMode::kSnapshot;
              DispatchProblem p = fixture().problem(B, mode, T);
              p.plain_chain = !tree;
              p.deferred = deferred;
              p.u_records = deferred_kind == 1;
              DispatchFlags flags = fast_flags();
              flags.fused_ring_max_batch = 2;
              flags.block_v = block_v;
              const DispatchDecision d = choose_verify_path(p, sm90, flags);
              CAPTURE(ring, tree, deferred_kind, T, B, block_v, d.describe());
              VerifyParams params;
              params.B = B;
              params.T = T;
              params.mode = mode;
              params.numerics = d.numerics;
              params.parents = tree ? &kSomeIndex : nullptr;
              params.ring_pending = deferred ? &kSomeIndex : nullptr;
              params.u_free = deferred_kind == 2 ? 1 : 0;
              CHECK(kernels::fast_outputs_plannable(params, d.path, d.block_v) == d.fast_outputs());
              // Asked for fast, never planned exact by the gates alone: plannable with kFast.
              params.numerics = VerifyNumerics::kFast;
              CHECK(kernels::fast_outputs_plannable(params, d.path, d.block_v) == d.fast_outputs());
              (d.fast_outputs() ? fast : exact) += 1;
            }
          }
        }
      }
    }
  }
  CHECK(fast > 0);
  CHECK(exact > 0);
}

TEST_CASE("dispatch: the numerics table's lookup, fallback and rule", "[dispatch][numerics]") {
  // The row of a call: same H, HV, K, V, T; the largest measured B <= the call's B; none below the
  // smallest measured B, at another T or another head shape (auto then keeps the exact outputs).
  const auto row_B = [](NumericsPolicyShape s) {
    const NumericsPolicyRow* r = numerics_policy_row(kTestNumericsCard, s);
    return r == nullptr ? 0 : r->B;
  };
  for (const int B : {1, 2, 7}) {
    CHECK(row_B({kH, kHV, kK, kV, kT, B}) == 1);
  }
  for (const int B : {8, 9, 31}) {
    CHECK(row_B({kH, kHV, kK, kV, kT, B}) == 8);
  }
  for (const int B : {32, 33, 4096}) {
    CHECK(row_B({kH, kHV, kK, kV, kT, B}) == 32);
  }
  CHECK(row_B({kH, kHV, kK, kV, kT, 0}) == 0);
  CHECK(row_B({kH, kHV, kK, kV, kT + 1, 8}) == 0);
  CHECK(row_B({kH + 1, kHV, kK, kV, kT, 8}) == 0);
  CHECK(row_B({kH, kHV, 128, kV, kT, 8}) == 0);
  CHECK(row_B({kH, kHV, kK, 128, kT, 8}) == 0);
  // The dispatcher follows the row's pick.
  for (const int B : {1, 7, 8, 31, 32, 64}) {
    CAPTURE(B);
    DispatchFlags flags = fast_flags(NumericsRequest::kAuto);
    flags.numerics_table = &kTestNumericsCard;
    const DispatchDecision d =
        choose_verify_path(fixture().problem(B, RecordMode::kRing), fake_platform(9, 0), flags);
    CHECK(d.fast_outputs() == (B >= 8 && B < 32));
    CHECK(d.numerics_row_B == (B >= 32 ? 32 : B >= 8 ? 8 : 1));
  }
  // The rule: fast's KDA share (step - gemm-only step) below exact's by more than
  // kFastMinGainPct, never the whole step's.
  CHECK_FALSE(fast_outputs_pay({32, 32, 128, 128, 4, 1, 900.0, 899.0, 800.0,  // 99 vs 100
                                VerifyNumerics::kExact}));
  CHECK(fast_outputs_pay({32, 32, 128, 128, 4, 1, 900.0, 898.9, 800.0, VerifyNumerics::kFast}));
  CHECK_FALSE(fast_outputs_pay({32, 32, 128, 128, 4, 1, 900.0, 905.0, 800.0,  // slower
                                VerifyNumerics::kExact}));
  for (const NumericsPolicyRow& r : kTestNumericsRows) {
    CHECK(fast_outputs_pay(r) == (r.pick == VerifyNumerics::kFast));
  }
}

TEST_CASE("dispatch: the built-in numerics tables are the generator's rule on their numbers",
          "[dispatch][numerics]") {
  // Every card's table (dispatch/auto_tables/<card>_numerics.def, tools/bench/make_auto_table.py
  // --table numerics): each row a step row (the KDA layers cost something), its pick the rule on
  // its numbers, and the row its own lookup's answer. A card may have no rows yet (auto: exact).
  size_t cards = 0;
  const NumericsPolicyCard* card = numerics_policy_cards(&cards);
  REQUIRE(cards >= 1);
  CHECK(&nearest_numerics_policy_card(0.0) == &card[0]);  // an unknown device: the first card
  for (size_t c = 0; c < cards; ++c) {
    CAPTURE(card[c].name);
    CHECK(&nearest_numerics_policy_card(card[c].memory_gbps) == &card[c]);
    for (size_t i = 0; i < card[c].count; ++i) {
      const NumericsPolicyRow& r = card[c].rows[i];
      CAPTURE(r.H, r.HV, r.K, r.V, r.T, r.B, r.exact_us, r.fast_us, r.gemm_us);
      CHECK(r.gemm_us > 0.0);
      CHECK(r.exact_us > r.gemm_us);
      CHECK(r.fast_us > r.gemm_us);
      CHECK(r.T >= 1);
      CHECK(r.T <= kernels::kFastMaxTokens);
      CHECK(fast_outputs_pay(r) == (r.pick == VerifyNumerics::kFast));
      CHECK(numerics_policy_row(card[c], {r.H, r.HV, r.K, r.V, r.T, r.B}) == &r);
    }
  }
}

TEST_CASE("dispatch: numerics names are stable", "[dispatch][numerics]") {
  CHECK(std::string(numerics_request_name(NumericsRequest::kAuto)) == "auto");
  CHECK(std::string(numerics_request_name(NumericsRequest::kExact)) == "exact");
  CHECK(std::string(numerics_request_name(NumericsRequest::kFast)) == "fast");
  CHECK(std::string(verify_numerics_name(VerifyNumerics::kExact)) == "exact");
  CHECK(std::string(verify_numerics_name(VerifyNumerics::kFast)) == "fast");
  const std::vector<std::pair<NumericsReason, std::string>> names = {
      {NumericsReason::kFastRequested, "fast_requested"},
      {NumericsReason::kAutoFast, "auto_fast"},
      {NumericsReason::kExactRequested, "exact_requested"},
      {NumericsReason::kAutoExact, "auto_exact"},
      {NumericsReason::kAutoUnmeasured, "auto_unmeasured"},
      {NumericsReason::kExactSnapshotMode, "exact_snapshot_mode"},
      {NumericsReason::kExactTree, "exact_tree"},
      {NumericsReason::kExactTokens, "exact_tokens"},
      {NumericsReason::kExactUnfused, "exact_unfused"},
      {NumericsReason::kExactDeferredFold, "exact_deferred_fold"},
      {NumericsReason::kExactBlockV, "exact_block_v"},
      {NumericsReason::kLazyHistory, "lazy_history"},
      {NumericsReason::kAutoUFree, "auto_u_free"},
  };
  for (const auto& [reason, name] : names) {
    CHECK(numerics_reason_name(reason) == name);
  }
}

TEST_CASE("dispatch: the lazy write-back's verify runs fused and fast", "[dispatch][numerics]") {
  // Contract §11: its pending steps exist only as the fast chunk's history, so neither rule 5's
  // batch or platform gate nor auto's table (no row: exact) may take it elsewhere.
  DispatchProblem p = fixture().problem(4, RecordMode::kRing);
  p.deferred = true;
  p.lazy = true;
  DispatchFlags flags;  // fused_ring_max_batch = 1, numerics auto
  for (const Platform& platform :
       {fake_platform(9, 0, 132), fake_platform(8, 0, 108), Platform{}}) {
    CAPTURE(platform.describe());
    const DispatchDecision d = choose_verify_path(p, platform, flags);
    CHECK(d.fused());
    CHECK(d.reason == DispatchReason::kRingLazyFused);
    CHECK(std::string(dispatch_reason_name(d.reason)) == "ring_lazy_fused");
    CHECK_THAT(d.describe_path(), Catch::Contains("the lazy write-back"));
    CHECK(d.fast_outputs());
    CHECK(d.numerics_reason == NumericsReason::kLazyHistory);
    CHECK(kernels::is_fast_block_v(d.block_v));
    CHECK_THAT(d.describe_numerics(), Catch::Contains("the lazy write-back"));
  }
  // What it cannot take, it reports (the plan then refuses the call: kernels::check_lazy_plan).
  flags.fused_verify = false;
  CHECK_FALSE(choose_verify_path(p, fake_platform(9, 0, 132), flags).fast_outputs());
  flags.fused_verify = true;
  p.plain_chain = false;
  CHECK(choose_verify_path(p, fake_platform(9, 0, 132), flags).numerics_reason ==
        NumericsReason::kExactTree);
}

TEST_CASE("dispatch: the lazy write-back table's lookup and rule", "[dispatch][lazy]") {
  // Rows by B: 1, lazy within the noise margin of the fast eager step; 8, lazy beats every fast
  // step but not the exact deferred one; 32, lazy beats everything.
  static constexpr LazyPolicyRow rows[] = {
      {kH, kHV, kK, kV, kL, kT, 1, 960.0, 970.0, 900.5, 910.0, 900.0, 800.0},
      {kH, kHV, kK, kV, kL, kT, 8, 1300.0, 1100.0, 1250.0, 1200.0, 1150.0, 800.0},
      {kH, kHV, kK, kV, kL, kT, 32, 2000.0, 1900.0, 1800.0, 1700.0, 1500.0, 800.0},
  };
  constexpr LazyPolicyCard card = {"test card", 3352.0, rows, std::size(rows)};
  const auto shape = [](int B, NumericsRequest n) {
    return LazyPolicyShape{kH, kHV, kK, kV, kL, kT, B, n};
  };
  const auto row_B = [&](LazyPolicyShape s) {
    const LazyPolicyRow* r = lazy_policy_row(card, s);
    return r == nullptr ? 0 : r->B;
  };
  CHECK(row_B(shape(1, NumericsRequest::kFast)) == 1);
  CHECK(row_B(shape(31, NumericsRequest::kFast)) == 8);
  CHECK(row_B(shape(4096, NumericsRequest::kFast)) == 32);
  CHECK(row_B(shape(0, NumericsRequest::kFast)) == 0);
  LazyPolicyShape other = shape(8, NumericsRequest::kFast);
  other.L = 2 * kL;  // another ring length: not measured
  CHECK(row_B(other) == 0);
  other = shape(8, NumericsRequest::kFast);
  other.draft_tokens = kT + 1;
  CHECK(row_B(other) == 0);
  other = shape(8, NumericsRequest::kFast);
  other.HV = kHV * 2;
  CHECK(row_B(other) == 0);
  // The best other step: fast, the better fast one; auto, the best of four; exact: none.
  CHECK(best_other_step_us(rows[1], NumericsRequest::kFast) == 1200.0);
  CHECK(best_other_step_us(rows[1], NumericsRequest::kAuto) == 1100.0);
  CHECK(std::isinf(best_other_step_us(rows[1], NumericsRequest::kExact)));
  // The rule on KDA shares (step - gemm-only), beyond kLazyMinGainPct.
  for (const NumericsRequest n : {NumericsRequest::kFast, NumericsRequest::kAuto}) {
    CHECK_FALSE(lazy_write_back_pays(card, shape(1, n)));  // 100 vs 100.5: noise
    CHECK(lazy_write_back_pays(card, shape(32, n)));
    CHECK_FALSE(lazy_write_back_pays(card, shape(0, n)));  // no row
  }
  CHECK(lazy_write_back_pays(card, shape(8, NumericsRequest::kFast)));
  CHECK_FALSE(lazy_write_back_pays(card, shape(8, NumericsRequest::kAuto)));  // exact deferred wins
  for (const int B : {1, 8, 32}) {
    CHECK_FALSE(lazy_write_back_pays(card, shape(B, NumericsRequest::kExact)));
  }
  // A lazy step just past the margin pays; just inside it does not.
  LazyPolicyRow edge = rows[0];
  edge.fast_eager_us = 800.0 + 100.0 / 0.99 + 0.01;  // the lazy share is 100
  edge.fast_deferred_us = edge.exact_eager_us = edge.exact_deferred_us = 2000.0;
  CHECK(lazy_write_back_pays(edge, NumericsRequest::kFast));
  edge.fast_eager_us = 800.0 + 100.0 / 0.99 - 0.01;
  CHECK_FALSE(lazy_write_back_pays(edge, NumericsRequest::kFast));
}

TEST_CASE("dispatch: the deferred commit's form under auto, on the lazy table's rows",
          "[dispatch][lazy]") {
  // u-free where the fast deferred step's KDA share beats the exact deferred one's by more than
  // kLazyMinGainPct. Rows by B: 1, fast deferred slower; 8, faster within the noise margin; 32,
  // faster beyond it (whatever the eager and lazy steps).
  static constexpr LazyPolicyRow rows[] = {
      {kH, kHV, kK, kV, kL, kT, 1, 900.0, 950.0, 905.0, 960.0, 990.0, 800.0},
      {kH, kHV, kK, kV, kL, kT, 8, 1300.0, 1200.0, 1250.0, 1196.0, 1500.0, 800.0},
      {kH, kHV, kK, kV, kL, kT, 32, 1900.0, 2000.0, 1800.0, 1900.0, 3000.0, 800.0},
  };
  constexpr LazyPolicyCard card = {"test card", 3352.0, rows, std::size(rows)};
  const auto shape = [](int B) {
    return LazyPolicyShape{kH, kHV, kK, kV, kL, kT, B, NumericsRequest::kAuto};
  };
  CHECK_FALSE(u_free_deferred_pays(card, shape(1)));
  CHECK_FALSE(u_free_deferred_pays(card, shape(8)));   // 396 vs 400: inside 1%
  CHECK_FALSE(u_free_deferred_pays(card, shape(31)));  // row B = 8
  CHECK(u_free_deferred_pays(card, shape(32)));        // 1100 vs 1200
  CHECK(u_free_deferred_pays(card, shape(4096)));
  CHECK_FALSE(u_free_deferred_pays(card, shape(0)));  // no row: u records
  LazyPolicyShape other = shape(32);
  other.L = 2 * kL;  // another ring length: not measured
  CHECK_FALSE(u_free_deferred_pays(card, other));
  // Just past the margin and just inside it (the exact deferred share is 400).
  LazyPolicyRow edge = rows[1];
  edge.fast_deferred_us = 800.0 + 400.0 * 0.99 - 0.01;
  CHECK(u_free_deferred_pays(edge));
  edge.fast_deferred_us = 800.0 + 400.0 * 0.99 + 0.01;
  CHECK_FALSE(u_free_deferred_pays(edge));
}

TEST_CASE("dispatch: the built-in lazy write-back tables are step measurements",
          "[dispatch][lazy]") {
  // Every card's table (dispatch/auto_tables/<card>_lazy.def, make_auto_table.py --table lazy):
  // each row a step row (the KDA layers cost something) on a ring a lazy history fits, and the
  // row its own lookup's answer. A card may have no rows yet (auto never goes lazy).
  size_t cards = 0;
  const LazyPolicyCard* card = lazy_policy_cards(&cards);
  REQUIRE(cards >= 1);
  CHECK(&nearest_lazy_policy_card(0.0) == &card[0]);
  for (size_t c = 0; c < cards; ++c) {
    CAPTURE(card[c].name);
    CHECK(&nearest_lazy_policy_card(card[c].memory_gbps) == &card[c]);
    for (size_t i = 0; i < card[c].count; ++i) {
      const LazyPolicyRow& r = card[c].rows[i];
      CAPTURE(r.H, r.HV, r.K, r.V, r.L, r.T, r.B);
      CHECK(r.gemm_us > 0.0);
      for (const double us : {r.exact_eager_us, r.exact_deferred_us, r.fast_eager_us,
                              r.fast_deferred_us, r.lazy_us}) {
        CHECK(us > r.gemm_us);
      }
      CHECK(r.L >= 2 * r.T);
      CHECK(r.L <= kFastMaxChunk);
      CHECK(lazy_policy_row(card[c],
                            {r.H, r.HV, r.K, r.V, r.L, r.T, r.B, NumericsRequest::kFast}) == &r);
    }
  }
}
