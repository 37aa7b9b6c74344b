// host_fast_test.cc: the host reference's fast outputs (contract §10, kda_host.h
// verify_fused_fast) on random inputs (both gates, GQA, K = 64 and 128, V = 128 and 48,
// T = 1..16, dense and ragged chains, padding requests, input scales x0.1 .. x4):
//  (a) §10 (b): against the exact fused path, >= 99.9% of bf16 outputs bitwise equal (a rate:
//      over the sweep), none more than 1 bf16 ulp apart (an output that cancels far below its
//      head's scale counted at a floor: kUlpFloor);
//  (b) §10 (c): relative L2 error against the fp64 oracle <= 1.25x the exact path's;
//  (c) the fp64 chunked form equals the fp64 sequential recurrence (the chunk algebra);
//  (d) everything but the outputs bitwise the exact path's; the committed state untouched;
//  (e) each planted chunk error fails (a) or (b);
//  (f) the host kernel set runs the fast form exactly when the plan says kFast;
// and the domain errors. Statistics of (a)-(c) are captured on the final checks (-s shows them).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "kernels/kernel_set.h"
#include "kernels/ref/fast_ref_testing.h"
#include "kernels/ref/kda_host.h"
#include "tests/error_message.h"
#include "tests/output_compare.h"
#include "tests/test_problem.h"

using namespace kda;
using namespace kda::testing;
using kda::host::testing::ChunkFault;

namespace {

// Contract §10 (b) and (c).
constexpr double kMaxErrorRatio = 1.25;
// Problems with at least this many outputs check the equal fraction on their own (below it one
// differing element would fail it); smaller ones count in the sweep's total.
constexpr int64_t kRateSample = 8192;
// An exact-path error below this counts as this (an all-zero output must not demand zero).
constexpr double kErrorFloor = 1e-12;
// The chunked fp64 form against the sequential one: double rounding of T <= 16 steps.
constexpr double kChunkAlgebraTol = 1e-10;

uint64_t run_seed() { return static_cast<uint64_t>(Catch::rngSeed()); }

// "1.23e-16": small errors in a captured message (Catch prints doubles in fixed notation).
std::string sci(double x) {
  std::ostringstream os;
  os << std::scientific << std::setprecision(3) << x;
  return os.str();
}

// A verify problem in ring mode with its draft shape: dense (offsets empty) or ragged.
struct FastProblem {
  VerifyProblem problem;
  std::vector<int32_t> offsets;  ///< [B+1] ragged token offsets, or empty (dense)
  std::vector<int64_t> first;    ///< [B] each request's first token row
  std::vector<int32_t> lengths;  ///< [B] T_n
  std::vector<int64_t> rows;     ///< token rows of the real requests, request by request
  int pad = -1;                  ///< the padding request, or -1

  /// The call's params on `p` (this problem or a clone of it).
  VerifyParams params(const VerifyProblem& p) const {
    VerifyParams v = p.params(RecordMode::kRing);
    if (!offsets.empty()) {
      v.token_offsets = offsets.data();
    }
    return v;
  }
};

struct Shape {
  int B = 4, T = 4, H = 2, HV = 4, K = 128, V = 128;
  bool safe_gate = false, ragged = false, padding = false;
  float scale = 1.0f;  ///< multiplies the SSM state and mixed_qkv
  uint64_t seed = 1;
};

std::ostream& operator<<(std::ostream& os, const Shape& s) {
  return os << "B=" << s.B << " T=" << s.T << " H=" << s.H << " HV=" << s.HV << " K=" << s.K
            << " V=" << s.V << " gate=" << (s.safe_gate ? "safe" : "standard")
            << " ragged=" << s.ragged << " padding=" << s.padding << " scale=" << s.scale
            << " seed=" << s.seed;
}

template <typename T>
void scale_tensor(VerifyProblem& p, Tensor t, float s) {
  std::vector<T> x = p.get<T>(t);
  for (T& e : x) {
    if constexpr (std::is_same_v<T, bf16_t>) {
      e = float_to_bf16(bf16_to_float(e) * s);
    } else {
      e = e * s;
    }
  }
  p.set(t, x);
}

// NaN into the token rows [begin, end) of qkv, a and b: inputs a padding request must not read.
void poison_rows(VerifyProblem& p, int64_t begin, int64_t end) {
  const bf16_t nan = float_to_bf16(std::numeric_limits<float>::quiet_NaN());
  for (const Tensor t : {Tensor::kQkv, Tensor::kA, Tensor::kB}) {
    std::vector<bf16_t> x = p.get<bf16_t>(t);
    const int64_t width = static_cast<int64_t>(x.size()) / p.N();
    std::fill(x.begin() + begin * width, x.begin() + end * width, nan);
    p.set(t, x);
  }
}

FastProblem make_problem(const Shape& s) {
  VerifyCase c = make_case(s.B, s.T, s.H, s.HV, s.K, s.V, RecordMode::kRing, s.seed);
  c.safe_gate = s.safe_gate;
  c.bias = s.seed % 2 == 0;
  c.wtype = s.seed % 3 == 0 ? ConvWeightType::kBF16 : ConvWeightType::kF32;
  c.L = std::max(16, 2 * s.T);  // the pool invariant L >= 2 T
  FastProblem f{VerifyProblem(c), {}, {}, {}, {}, -1};
  if (s.scale != 1.0f) {
    scale_tensor<float>(f.problem, Tensor::kSsmState, s.scale);
    scale_tensor<bf16_t>(f.problem, Tensor::kQkv, s.scale);
  }
  std::vector<int32_t>& lengths = f.lengths;
  lengths.assign(static_cast<size_t>(s.B), s.T);
  if (s.ragged) {
    f.offsets.push_back(0);
    for (int n = 0; n < s.B; ++n) {
      lengths[n] = 1 + static_cast<int>((s.seed * 7 + static_cast<uint64_t>(n) * 13) % s.T);
      f.offsets.push_back(f.offsets.back() + lengths[n]);
    }
  }
  for (int n = 0; n < s.B; ++n) {
    f.first.push_back(f.offsets.empty() ? static_cast<int64_t>(n) * s.T : int64_t{f.offsets[n]});
  }
  auto first_row = [&](int n) { return f.first[static_cast<size_t>(n)]; };
  if (s.padding) {
    f.pad = s.B > 1 ? 1 : 0;
    auto slots = f.problem.slots();
    slots[static_cast<size_t>(f.pad)] = -1;
    f.problem.set(Tensor::kSlots, slots);
    poison_rows(f.problem, first_row(f.pad), first_row(f.pad) + lengths[f.pad]);
  }
  for (int n = 0; n < s.B; ++n) {
    if (n != f.pad) {
      for (int t = 0; t < lengths[n]; ++t) {
        f.rows.push_back(first_row(n) + t);
      }
    }
  }
  return f;
}

using VerifyFn = std::function<void(const VerifyParams&)>;

VerifyProblem run(const FastProblem& f, const VerifyFn& verify) {
  VerifyProblem p = f.problem.clone_to(Device::host());
  verify(f.params(p));
  return p;
}

// One problem's fast outputs against the exact path's and the fp64 oracle.
struct Accuracy {
  OutCompare vs_exact;
  double fast_error = 0.0, exact_error = 0.0;  ///< rel L2 against verify_fp64
  double ratio() const { return fast_error / std::max(exact_error, kErrorFloor); }
  /// Contract §10 (c).
  bool within_c() const { return ratio() <= kMaxErrorRatio; }
};

Accuracy accuracy(const FastProblem& f, const VerifyProblem& fast, const VerifyProblem& exact,
                  const host::Fp64Verify& f64) {
  const VerifyCase& c = f.problem.config();
  const int64_t width = static_cast<int64_t>(c.HV) * c.V;
  const std::vector<bf16_t> fast_all = fast.out(), exact_all = exact.out();
  const auto fast_out = gather_rows(fast_all, f.rows, width);
  const auto exact_out = gather_rows(exact_all, f.rows, width);
  const auto oracle = gather_rows(f64.out, f.rows, width);
  Accuracy a;
  a.vs_exact = compare_requests(fast_all, exact_all, f.first, f.lengths, f.pad, c.HV, c.V);
  a.fast_error = rel_l2(fast_out, oracle);
  a.exact_error = rel_l2(exact_out, oracle);
  return a;
}

// The shapes of the accuracy sweep: every T at both K and V, three scales; gate, GQA, draft shape
// and padding cycle through their combinations over the sweep.
std::vector<Shape> sweep(uint64_t seed) {
  std::vector<Shape> shapes;
  int i = 0;
  for (const int K : {64, 128}) {
    for (const int V : {128, 48}) {
      for (const int T : {1, 2, 4, 8, 16}) {
        for (const float scale : {0.1f, 1.0f, 4.0f}) {
          Shape s;
          s.T = T;
          s.K = K;
          s.V = V;
          s.scale = scale;
          s.safe_gate = (i & 1) != 0;
          s.HV = (i & 2) != 0 ? 2 * s.H : s.H;  // GQA: two v-heads per k-head
          s.ragged = (i / 4) % 2 != 0 && T > 1;
          s.padding = (i / 3) % 2 != 0;
          s.seed = seed * 1000 + static_cast<uint64_t>(i) + 1;
          shapes.push_back(s);
          ++i;
        }
      }
    }
  }
  return shapes;
}

}  // namespace

TEST_CASE("host fast outputs: within contract §10 of the exact path and the fp64 oracle",
          "[host][fast]") {
  const uint64_t seed = run_seed();
  CAPTURE(seed);
  double min_equal = 1.0, max_fast_vs_exact = 0.0, max_ratio = 0.0, max_algebra = 0.0;
  double max_fast_error = 0.0, max_exact_error = 0.0;
  int64_t max_ulp = 0, max_raw_ulp = 0, differing = 0, elems = 0;
  for (const Shape& s : sweep(seed)) {
    CAPTURE(s);
    const FastProblem f = make_problem(s);
    const VerifyProblem exact = run(f, host::verify_fused);
    const VerifyProblem fast = run(f, host::verify_fused_fast);
    const host::Fp64Verify f64 = host::verify_fp64(f.params(f.problem));
    const host::Fp64Verify chunked = host::verify_fp64_chunked(f.params(f.problem));

    const Accuracy a = accuracy(f, fast, exact, f64);
    const int64_t width = static_cast<int64_t>(s.HV) * s.V;
    const double algebra =
        rel_l2(gather_rows(chunked.out, f.rows, width), gather_rows(f64.out, f.rows, width));
    CAPTURE(a.vs_exact.equal_fraction(), a.vs_exact.max_ulp, a.vs_exact.max_raw_ulp,
            sci(a.vs_exact.rel_l2()), a.fast_error, a.exact_error, sci(algebra));
    // (a) contract §10 (b) (the equal fraction is a rate: per problem on large ones, and over
    // the sweep); (b) contract §10 (c); (c) the chunked algebra.
    REQUIRE(a.vs_exact.max_ulp <= kMaxUlp);
    if (a.vs_exact.elems >= kRateSample) {
      REQUIRE(a.vs_exact.equal_fraction() >= kMinEqualFraction);
      min_equal = std::min(min_equal, a.vs_exact.equal_fraction());
    }
    REQUIRE(a.within_c());
    REQUIRE(algebra <= kChunkAlgebraTol);

    max_ulp = std::max(max_ulp, a.vs_exact.max_ulp);
    max_raw_ulp = std::max(max_raw_ulp, a.vs_exact.max_raw_ulp);
    max_fast_vs_exact = std::max(max_fast_vs_exact, a.vs_exact.rel_l2());
    max_ratio = std::max(max_ratio, a.ratio());
    max_fast_error = std::max(max_fast_error, a.fast_error);
    max_exact_error = std::max(max_exact_error, a.exact_error);
    max_algebra = std::max(max_algebra, algebra);
    differing += a.vs_exact.elems - a.vs_exact.equal;
    elems += a.vs_exact.elems;
  }
  const double equal = 1.0 - static_cast<double>(differing) / static_cast<double>(elems);
  CAPTURE(equal, min_equal, max_ulp, max_raw_ulp, sci(max_fast_vs_exact), max_ratio, max_fast_error,
          max_exact_error, sci(max_algebra), differing, elems);
  REQUIRE(equal >= kMinEqualFraction);
  // The fast form is a different f32 computation: some outputs must round differently, else the
  // comparison above compared the exact path with itself.
  REQUIRE(differing > 0);
}

TEST_CASE("host fast outputs: records, windows and every input bitwise the exact path's",
          "[host][fast]") {
  Shape s;
  s.T = GENERATE(1, 5, 16);
  s.ragged = GENERATE(false, true);
  s.padding = true;
  s.safe_gate = s.T == 5;
  s.seed = 11 + static_cast<uint64_t>(s.T) + run_seed();
  CAPTURE(s);
  const FastProblem f = make_problem(s);
  const VerifyProblem exact = run(f, host::verify_fused);
  const VerifyProblem fast = run(f, host::verify_fused_fast);
  // (d) Every tensor but the outputs, pads included: records and windows as the exact path
  // writes them, the committed SSM and conv state and all inputs untouched.
  for (int i = 0; i < static_cast<int>(Tensor::kCount); ++i) {
    const Tensor t = static_cast<Tensor>(i);
    if (t == Tensor::kOut) {
      continue;
    }
    INFO("tensor " << tensor_name(t));
    REQUIRE(bitwise_equal(fast.raw(t), exact.raw(t)));
  }
  REQUIRE(bitwise_equal(fast.raw(Tensor::kSsmState), f.problem.raw(Tensor::kSsmState)));
  REQUIRE(bitwise_equal(fast.raw(Tensor::kConvState), f.problem.raw(Tensor::kConvState)));
  // Outputs: the padding request's rows zero and every row outside the real requests' as the
  // exact path leaves it; the real rows computed (no longer the garbage fill).
  const int64_t width = static_cast<int64_t>(s.HV) * s.V;
  std::vector<bf16_t> fast_out = fast.out(), exact_out = exact.out();
  const std::vector<bf16_t> garbage = f.problem.out();
  for (const int64_t row : f.rows) {
    int64_t kept = 0;  // a computed value may equal the garbage by chance, not a whole row
    for (int64_t i = row * width; i < (row + 1) * width; ++i) {
      kept += fast_out[i].bits == garbage[i].bits ? 1 : 0;
      fast_out[i] = exact_out[i];
    }
    REQUIRE(kept < width);
  }
  REQUIRE(bitwise_equal(fast_out, exact_out));
  const int64_t pad_row = f.offsets.empty() ? int64_t{f.pad} * s.T : int64_t{f.offsets[f.pad]};
  REQUIRE(fast.out()[pad_row * width].bits == 0);
}

TEST_CASE("host fast outputs: each planted chunk error fails the §10 checks", "[host][fast]") {
  const ChunkFault fault = GENERATE(ChunkFault::kDecayOffByOneStep, ChunkFault::kDropIntraTerm,
                                    ChunkFault::kMaskOffByOne);
  Shape s;
  s.B = 8;
  s.T = GENERATE(4, 8);
  s.safe_gate = GENERATE(false, true);
  s.ragged = s.T == 8;
  s.seed = 21 + static_cast<uint64_t>(s.T) + run_seed();
  CAPTURE(s, static_cast<int>(fault));
  const FastProblem f = make_problem(s);
  const VerifyProblem exact = run(f, host::verify_fused);
  const host::Fp64Verify f64 = host::verify_fp64(f.params(f.problem));

  // Without a fault the hook is verify_fused_fast, bitwise, and passes.
  const VerifyProblem fast = run(f, host::verify_fused_fast);
  const VerifyProblem clean = run(f, [](const VerifyParams& p) {
    host::testing::verify_fused_fast_with_fault(p, ChunkFault::kNone);
  });
  REQUIRE(bitwise_equal(clean.raw(Tensor::kOut), fast.raw(Tensor::kOut)));
  const Accuracy good = accuracy(f, clean, exact, f64);
  REQUIRE(good.vs_exact.elems >= kRateSample);
  REQUIRE(good.vs_exact.meets_contract());
  REQUIRE(good.within_c());

  // (e) With it, (a) or (b) fails.
  const VerifyProblem bad =
      run(f, [&](const VerifyParams& p) { host::testing::verify_fused_fast_with_fault(p, fault); });
  const Accuracy a = accuracy(f, bad, exact, f64);
  CAPTURE(a.vs_exact.equal_fraction(), a.vs_exact.max_ulp, sci(a.vs_exact.rel_l2()), a.fast_error,
          a.exact_error, a.ratio());
  const bool passes = a.vs_exact.meets_contract() && a.within_c();
  REQUIRE_FALSE(passes);
}

TEST_CASE("host fast outputs: outside the domain kda::Error names the field, writes nothing",
          "[host][fast][validation]") {
  VerifyCase c = make_case(2, 4, 1, 2, 64, 32, RecordMode::kRing, 31);
  const VerifyProblem base(c);
  VerifyProblem p = base.clone_to(Device::host());
  const VerifyParams good = p.params();
  auto fast_error = [&](const std::function<void(VerifyParams&)>& mutate) {
    VerifyParams q = good;
    mutate(q);
    return error_message([&] { host::verify_fused_fast(q); });
  };
  CHECK(fast_error([&](VerifyParams& q) { q = p.params(RecordMode::kSnapshot); }) ==
        "kda::host::verify_fused_fast: mode=kSnapshot: fast outputs are ring mode only "
        "(contract §10)");
  const std::vector<int32_t> parents = {-1, 0, 1, 2, -1, 0, 0, 1};
  CHECK(fast_error([&](VerifyParams& q) { q.parents = parents.data(); }) ==
        "kda::host::verify_fused_fast: parents given (a tree batch): fast outputs verify chains "
        "(dense or ragged)");
  const std::vector<int32_t> pending(static_cast<size_t>(p.num_slots()), 1);
  const std::vector<int32_t> cursor(static_cast<size_t>(p.num_slots()), 3);
  std::vector<float> u_rec(static_cast<size_t>(p.num_slots()) * c.HV * c.L * c.V, 0.5f);
  CHECK(fast_error([&](VerifyParams& q) {
          q.ring_pending = pending.data();
          q.ring_cursor = cursor.data();
          q.ssm_fold_out = const_cast<float*>(q.ssm_state);
          q.ring_u = u_rec.data();
          q.ring_u_slot_stride = int64_t{c.HV} * c.L * c.V;
        }) ==
        "kda::host::verify_fused_fast: ring_pending given with u records (u_free=0): fast "
        "outputs record no u (a deferred commit with fast outputs is u-free)");
  CHECK(fast_error([](VerifyParams& q) {
          q.T = 17;
          q.T_max = 17;
        }) == "kda::host::verify_fused_fast: T=17 unsupported, expected 1..16 (one fast chunk)");
  // The exact path's checks apply too.
  CHECK(fast_error([](VerifyParams& q) { q.ring_rawk = nullptr; }) ==
        "kda::host::verify_fused_fast: ring_rawk is null, expected a pointer (ring mode)");
  CHECK(error_message([&] {
          VerifyParams q = good;
          q.parents = parents.data();
          host::verify_fp64_chunked(q);
        }) ==
        "kda::host::verify_fp64_chunked: parents given (a tree batch): the chunked form verifies "
        "chains");
  for (int t = 0; t < static_cast<int>(Tensor::kCount); ++t) {
    INFO("tensor " << tensor_name(static_cast<Tensor>(t)));
    REQUIRE(bitwise_equal(p.raw(static_cast<Tensor>(t)), base.raw(static_cast<Tensor>(t))));
  }
}

TEST_CASE("host kernel set: runs the fast outputs exactly when the plan says kFast",
          "[host][fast][kernel_set]") {
  const auto ks = make_host_kernel_set();
  Shape s;
  s.B = 2;
  s.T = 8;
  s.seed = 41;
  const FastProblem f = make_problem(s);
  const VerifyProblem exact = run(f, host::verify_fused);
  const VerifyProblem fast = run(f, host::verify_fused_fast);
  // The two forms differ on this problem, so the comparisons below tell them apart.
  REQUIRE_FALSE(bitwise_equal(fast.raw(Tensor::kOut), exact.raw(Tensor::kOut)));

  struct Call {
    const char* what;
    VerifyNumerics numerics;
    RecordMode mode;
    VerifyPath path;
    int block_v;
    bool fast;  ///< expected: the fast form runs
  };
  const Call calls[] = {
      {"fast, fused, BV=32", VerifyNumerics::kFast, RecordMode::kRing, VerifyPath::kFused, 32,
       true},
      {"fast, fused, BV=128", VerifyNumerics::kFast, RecordMode::kRing, VerifyPath::kFused, 128,
       true},
      {"exact, fused", VerifyNumerics::kExact, RecordMode::kRing, VerifyPath::kFused, 32, false},
      {"fast, fused, BV=16 (no fast tile)", VerifyNumerics::kFast, RecordMode::kRing,
       VerifyPath::kFused, 16, false},
      {"fast, unfused", VerifyNumerics::kFast, RecordMode::kRing, VerifyPath::kUnfused, 0, false},
      {"fast, snapshot mode", VerifyNumerics::kFast, RecordMode::kSnapshot, VerifyPath::kFused, 32,
       false},
  };
  for (const Call& call : calls) {
    CAPTURE(call.what);
    VerifyProblem p = f.problem.clone_to(Device::host());
    VerifyParams params = p.params(call.mode);
    params.numerics = call.numerics;
    const kernels::VerifyPlan plan = ks->plan_verify(params, call.path, call.block_v);
    CHECK(plan.numerics == (call.fast ? VerifyNumerics::kFast : VerifyNumerics::kExact));
    CHECK((plan.schedule == kernels::VerifySchedule::kFastChunk) == call.fast);
    CHECK(plan.numerics == (kernels::fast_outputs_plannable(params, call.path, call.block_v)
                                ? VerifyNumerics::kFast
                                : VerifyNumerics::kExact));
    ks->verify(params, plan, /*stream=*/nullptr);
    const VerifyProblem& want = call.fast ? fast : exact;
    REQUIRE(bitwise_equal(p.raw(Tensor::kOut), want.raw(Tensor::kOut)));
    if (call.mode == RecordMode::kRing) {
      for (const Tensor t : {Tensor::kConvWindow, Tensor::kRingRawv, Tensor::kRingRawk,
                             Tensor::kRingG, Tensor::kRingBeta}) {
        INFO("tensor " << tensor_name(t));
        REQUIRE(bitwise_equal(p.raw(t), want.raw(t)));
      }
    }
  }
}
