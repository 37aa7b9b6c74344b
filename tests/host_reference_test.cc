// host_reference_test.cc: the host verify / extend paths: bitwise agreement between paths,
// what is (and is not) written, closed-form gates, parameter validation, the host KernelSet.
#include <fmt/format.h>
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/kernel_set.h"
#include "kernels/ref/host_math.h"
#include "kernels/ref/kda_host.h"
#include "tests/error_message.h"
#include "tests/test_problem.h"

using namespace kda;
using namespace kda::testing;
namespace math = kda::host::math;

namespace {

using VerifyOp = void (*)(const VerifyParams&);

struct Path {
  const char* name;
  VerifyOp op;
  bool writes_qkv_act;
};
const Path kUnfused{"unfused", &host::verify_unfused, true};
const Path kFused{"fused", &host::verify_fused, false};

constexpr Tensor kInputs[] = {Tensor::kQkv,      Tensor::kA,         Tensor::kB,
                              Tensor::kALog,     Tensor::kDtBias,    Tensor::kConvWeight,
                              Tensor::kConvBias, Tensor::kConvState, Tensor::kSsmState,
                              Tensor::kSlots,    Tensor::kRows};
constexpr Tensor kRecords[] = {Tensor::kOut,      Tensor::kConvWindow, Tensor::kSnapshots,
                               Tensor::kRingRawv, Tensor::kRingRawk,   Tensor::kRingG,
                               Tensor::kRingBeta};

VerifyProblem run(const VerifyProblem& base, const Path& path, RecordMode mode) {
  VerifyProblem p = base.clone_to(Device::host());
  path.op(p.params(mode));
  return p;
}

// Variants of the verify problem that every structural test runs over.
std::vector<VerifyCase> structural_cases() {
  std::vector<VerifyCase> cases;
  cases.push_back(make_case(2, 4, 2, 2, 64, 64, RecordMode::kSnapshot, 101));
  VerifyCase gqa = make_case(3, 5, 1, 4, 128, 32, RecordMode::kRing, 102);
  gqa.bias = true;
  gqa.wtype = ConvWeightType::kBF16;
  gqa.reversed = true;
  gqa.neg_slot = true;
  gqa.qkv_pad = 8;
  gqa.pitch_pad = 3;
  gqa.T_max = 7;
  cases.push_back(gqa);
  VerifyCase single = make_case(1, 1, 1, 1, 64, 64, RecordMode::kRing, 103);
  single.safe_gate = true;
  cases.push_back(single);
  VerifyCase snap = make_case(4, 3, 2, 4, 64, 48, RecordMode::kSnapshot, 104);
  snap.safe_gate = true;
  snap.neg_slot = true;
  snap.reversed = true;
  snap.T_max = 5;
  snap.pitch_pad = 1;
  snap.bias = true;
  cases.push_back(snap);
  VerifyCase short_ring = make_case(2, 6, 1, 2, 128, 128, RecordMode::kRing, 105);
  short_ring.L = 4;  // T > L: steps 4, 5 have no ring position
  cases.push_back(short_ring);
  return cases;
}

// Step 1 written out for request n: conv outputs [T, D] from the problem's raw inputs.
std::vector<bf16_t> expected_conv(const VerifyProblem& p, int n) {
  const VerifyCase& c = p.config();
  const int64_t D = p.D();
  const auto qkv = p.qkv();
  const auto state = p.conv_state();
  const auto w = p.conv_weight();
  const auto bias = p.conv_bias();
  const int32_t slot = p.slots()[n];
  std::vector<bf16_t> y(static_cast<size_t>(c.T * D));
  for (int64_t ch = 0; ch < D; ++ch) {
    math::ConvTaps taps;
    for (int j = 0; j < kConvWidth; ++j) {
      taps.w[j] = w[ch * kConvWidth + j];
    }
    taps.bias = bias.empty() ? 0.0f : bias[ch];
    taps.bf16_products = c.wtype == ConvWeightType::kBF16;
    float hist[kConvHistory];
    for (int j = 0; j < kConvHistory; ++j) {
      hist[j] = bf16_to_float(state[(slot * kConvHistory + j) * D + ch]);
    }
    for (int t = 0; t < c.T; ++t) {
      const float x = bf16_to_float(qkv[(static_cast<int64_t>(n) * c.T + t) * D + ch]);
      const float in[kConvWidth] = {hist[0], hist[1], hist[2], x};
      y[t * D + ch] = math::conv_silu_bf16(taps, in);
      hist[0] = hist[1];
      hist[1] = hist[2];
      hist[2] = x;
    }
  }
  return y;
}

using Ranges = std::vector<std::pair<int64_t, int64_t>>;  // [begin, end) of packed elements

// What real request n may write in tensor t (packed host layout), for the given path/mode.
Ranges owned(const VerifyProblem& p, Tensor t, int n, RecordMode mode, bool writes_qkv_act) {
  const VerifyCase& c = p.config();
  const int64_t D = p.D(), T = c.T, HV = c.HV, H = c.H, K = c.K, V = c.V, L = c.L;
  const int64_t Ta = p.T_max(), steps = std::min(T, L);
  const int64_t slot = p.slots()[n], row = p.rows()[n];
  Ranges r;
  auto per_head = [&](int64_t heads, int64_t width) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t b = ((slot * heads + h) * L) * width;
      r.emplace_back(b, b + steps * width);
    }
  };
  switch (t) {
    case Tensor::kOut:
      r.emplace_back(n * T * HV * V, (n + 1) * T * HV * V);
      break;
    case Tensor::kQkvAct:
      if (writes_qkv_act) {
        r.emplace_back(n * T * D, (n + 1) * T * D);
      }
      break;
    case Tensor::kConvWindow:
      r.emplace_back(row * Ta * 3 * D, row * Ta * 3 * D + T * 3 * D);
      break;
    case Tensor::kSnapshots:
      if (mode == RecordMode::kSnapshot) {
        r.emplace_back(row * Ta * p.state_elems(),
                       row * Ta * p.state_elems() + T * p.state_elems());
      }
      break;
    case Tensor::kRingRawv:
      if (mode == RecordMode::kRing) {
        per_head(HV, V);
      }
      break;
    case Tensor::kRingRawk:
      if (mode == RecordMode::kRing) {
        per_head(H, K);
      }
      break;
    case Tensor::kRingG:
      if (mode == RecordMode::kRing) {
        per_head(HV, K);
      }
      break;
    case Tensor::kRingBeta:
      if (mode == RecordMode::kRing) {
        per_head(HV, 1);
      }
      break;
    default:
      break;
  }
  return r;
}

// `before` with the owned ranges of every real request taken from `after`, and the padding
// request's output rows zeroed: the only admissible result of a verify call.
template <typename T>
void expect_only_owned_changed(const VerifyProblem& before, const VerifyProblem& after, Tensor t,
                               RecordMode mode, bool writes_qkv_act) {
  VerifyProblem expected = before.clone_to(Device::host());
  std::vector<T> want = before.get<T>(t);
  const std::vector<T> got = after.get<T>(t);
  const auto slots = before.slots();
  for (int n = 0; n < before.config().B; ++n) {
    if (slots[n] < 0) {
      if (t == Tensor::kOut) {
        for (const auto& [b, e] : owned(before, t, n, mode, writes_qkv_act)) {
          std::fill(want.begin() + b, want.begin() + e, T{0});
        }
      }
      continue;
    }
    for (const auto& [b, e] : owned(before, t, n, mode, writes_qkv_act)) {
      std::copy(got.begin() + b, got.begin() + e, want.begin() + b);
    }
  }
  expected.set(t, want);
  INFO("tensor " << tensor_name(t));
  REQUIRE(bitwise_equal(after.raw(t), expected.raw(t)));
}

void expect_inputs_unchanged(const VerifyProblem& before, const VerifyProblem& after) {
  for (const Tensor t : kInputs) {
    INFO("input " << tensor_name(t));
    REQUIRE(bitwise_equal(after.raw(t), before.raw(t)));
  }
}

}  // namespace

TEST_CASE("host verify: fused and unfused paths are bitwise equal", "[host][verify]") {
  const VerifyCase c = GENERATE(from_range(structural_cases()));
  CAPTURE(c);
  const VerifyProblem base(c);
  const VerifyProblem unfused = run(base, kUnfused, c.mode);
  const VerifyProblem fused = run(base, kFused, c.mode);
  for (const Tensor t : kRecords) {
    INFO("tensor " << tensor_name(t));
    REQUIRE(bitwise_equal(fused.raw(t), unfused.raw(t)));
  }
  // Something was computed: the outputs are no longer the garbage fill.
  REQUIRE_FALSE(bitwise_equal(fused.raw(Tensor::kOut), base.raw(Tensor::kOut)));
}

TEST_CASE("host verify: conv state, SSM state and all inputs stay bitwise unchanged",
          "[host][verify]") {
  const VerifyCase c = GENERATE(from_range(structural_cases()));
  CAPTURE(c);
  const VerifyProblem base(c);
  for (const RecordMode mode : {RecordMode::kSnapshot, RecordMode::kRing}) {
    CAPTURE(static_cast<int>(mode));
    expect_inputs_unchanged(base, run(base, kUnfused, mode));
    expect_inputs_unchanged(base, run(base, kFused, mode));
  }
  VerifyProblem p = base.clone_to(Device::host());
  host::conv_update(p.params());
  host::verify_recurrent(p.params());
  expect_inputs_unchanged(base, p);
}

TEST_CASE("host verify: writes exactly the requests' own rows, windows and records",
          "[host][verify]") {
  const VerifyCase c = GENERATE(from_range(structural_cases()));
  CAPTURE(c);
  const VerifyProblem base(c);
  for (const Path& path : {kUnfused, kFused}) {
    for (const RecordMode mode : {RecordMode::kSnapshot, RecordMode::kRing}) {
      CAPTURE(path.name, static_cast<int>(mode));
      const VerifyProblem after = run(base, path, mode);
      expect_only_owned_changed<bf16_t>(base, after, Tensor::kOut, mode, path.writes_qkv_act);
      expect_only_owned_changed<bf16_t>(base, after, Tensor::kQkvAct, mode, path.writes_qkv_act);
      expect_only_owned_changed<bf16_t>(base, after, Tensor::kConvWindow, mode,
                                        path.writes_qkv_act);
      expect_only_owned_changed<float>(base, after, Tensor::kSnapshots, mode, path.writes_qkv_act);
      expect_only_owned_changed<bf16_t>(base, after, Tensor::kRingRawv, mode, path.writes_qkv_act);
      expect_only_owned_changed<bf16_t>(base, after, Tensor::kRingRawk, mode, path.writes_qkv_act);
      expect_only_owned_changed<float>(base, after, Tensor::kRingG, mode, path.writes_qkv_act);
      expect_only_owned_changed<float>(base, after, Tensor::kRingBeta, mode, path.writes_qkv_act);
    }
  }
}

TEST_CASE("host verify: padding rows: zero output, nothing else read or written",
          "[host][verify]") {
  VerifyCase c = make_case(3, 3, 1, 2, 64, 32, RecordMode::kRing, 201);
  c.neg_slot = true;
  c.qkv_pad = 2;
  c.pitch_pad = 2;
  c.T_max = 4;
  const VerifyProblem base(c);
  VerifyProblem garbage_row = base.clone_to(Device::host());
  // The padding request's scratch row is garbage: a path that used it would write far out of
  // bounds. Its inputs are NaN already (test_problem), so any read would poison a write.
  auto rows = garbage_row.rows();
  rows[static_cast<size_t>(base.pad_request())] = 1 << 30;
  garbage_row.set(Tensor::kRows, rows);
  for (const Path& path : {kUnfused, kFused}) {
    for (const RecordMode mode : {RecordMode::kSnapshot, RecordMode::kRing}) {
      CAPTURE(path.name, static_cast<int>(mode));
      const VerifyProblem after = run(garbage_row, path, mode);
      const auto out = after.out();
      const int64_t row_elems = static_cast<int64_t>(c.HV) * c.V;
      for (int64_t i = 0; i < c.T * row_elems; ++i) {
        REQUIRE(out[base.pad_request() * c.T * row_elems + i].bits == 0);
      }
      expect_inputs_unchanged(garbage_row, after);
      // Whole tensors (pads included): only the real requests' own parts changed.
      expect_only_owned_changed<bf16_t>(garbage_row, after, Tensor::kOut, mode,
                                        path.writes_qkv_act);
      expect_only_owned_changed<bf16_t>(garbage_row, after, Tensor::kQkvAct, mode,
                                        path.writes_qkv_act);
      expect_only_owned_changed<bf16_t>(garbage_row, after, Tensor::kConvWindow, mode,
                                        path.writes_qkv_act);
      expect_only_owned_changed<float>(garbage_row, after, Tensor::kSnapshots, mode,
                                       path.writes_qkv_act);
      expect_only_owned_changed<bf16_t>(garbage_row, after, Tensor::kRingRawv, mode,
                                        path.writes_qkv_act);
      expect_only_owned_changed<bf16_t>(garbage_row, after, Tensor::kRingRawk, mode,
                                        path.writes_qkv_act);
      expect_only_owned_changed<float>(garbage_row, after, Tensor::kRingG, mode,
                                       path.writes_qkv_act);
      expect_only_owned_changed<float>(garbage_row, after, Tensor::kRingBeta, mode,
                                       path.writes_qkv_act);
    }
  }
  // An all-padding batch writes only zeros.
  VerifyCase all_pad = make_case(1, 2, 1, 1, 64, 64, RecordMode::kRing, 202);
  all_pad.neg_slot = true;
  const VerifyProblem lone(all_pad);
  const VerifyProblem after = run(lone, kFused, RecordMode::kRing);
  REQUIRE(bitwise_equal(after.out(), std::vector<bf16_t>(after.out().size(), bf16_t{0})));
  for (const Tensor t : {Tensor::kConvWindow, Tensor::kRingRawv, Tensor::kRingRawk, Tensor::kRingG,
                         Tensor::kRingBeta, Tensor::kQkvAct}) {
    INFO("tensor " << tensor_name(t));
    REQUIRE(bitwise_equal(after.raw(t), lone.raw(t)));
  }
}

TEST_CASE("host verify: ring records hold the conv outputs and gates of steps t < L only",
          "[host][verify]") {
  // (T, L, H, HV): T > L drops steps; T < L leaves positions T..L-1 untouched; GQA G = 2, 4.
  const auto shape = GENERATE(std::make_tuple(6, 4, 1, 2), std::make_tuple(3, 8, 2, 8),
                              std::make_tuple(5, 4, 2, 4), std::make_tuple(4, 4, 2, 2));
  VerifyCase c = make_case(3, std::get<0>(shape), std::get<2>(shape), std::get<3>(shape), 64, 32,
                           RecordMode::kRing, 301 + std::get<0>(shape));
  c.L = std::get<1>(shape);
  c.pitch_pad = 7;  // a write past a slot's records lands in a checked pad
  c.reversed = true;
  c.neg_slot = true;
  c.bias = true;
  CAPTURE(c);
  const VerifyProblem base(c);
  const int64_t D = base.D(), K = c.K, V = c.V, L = c.L, H = c.H, HV = c.HV, T = c.T;
  const int group = c.HV / c.H;

  // Expected records, computed from the raw inputs without the verify loop.
  auto rawv = base.rawv();
  auto rawk = base.rawk();
  auto g = base.ring_g();
  auto beta = base.ring_beta();
  const auto a = base.a();
  const auto b = base.b();
  const auto A_log = base.A_log();
  const auto dt_bias = base.dt_bias();
  const auto slots = base.slots();
  std::vector<std::vector<bf16_t>> conv(static_cast<size_t>(c.B));
  for (int n = 0; n < c.B; ++n) {
    const int64_t s = slots[n];
    if (s < 0) {
      continue;
    }
    conv[static_cast<size_t>(n)] = expected_conv(base, n);
    const auto& y = conv[static_cast<size_t>(n)];
    for (int64_t t = 0; t < std::min(T, L); ++t) {
      const int64_t r = n * T + t;
      for (int64_t h = 0; h < H; ++h) {
        std::copy_n(y.begin() + t * D + (H + h) * K, K, rawk.begin() + ((s * H + h) * L + t) * K);
      }
      for (int64_t hv = 0; hv < HV; ++hv) {
        std::copy_n(y.begin() + t * D + 2 * H * K + hv * V, V,
                    rawv.begin() + ((s * HV + hv) * L + t) * V);
        const float eA = std::exp(A_log[hv]);
        for (int64_t k = 0; k < K; ++k) {
          const float x = bf16_to_float(a[r * HV * K + hv * K + k]) + dt_bias[hv * K + k];
          g[((s * HV + hv) * L + t) * K + k] = math::gate(GateKind::kStandard, x, eA, 0.0f);
        }
        beta[(s * HV + hv) * L + t] = math::sigmoid(bf16_to_float(b[r * HV + hv]));
      }
    }
  }
  VerifyProblem expected = base.clone_to(Device::host());
  expected.set(Tensor::kRingRawv, rawv);
  expected.set(Tensor::kRingRawk, rawk);
  expected.set(Tensor::kRingG, g);
  expected.set(Tensor::kRingBeta, beta);

  for (const Path& path : {kUnfused, kFused}) {
    CAPTURE(path.name, group);
    const VerifyProblem after = run(base, path, RecordMode::kRing);
    // rawk of each k-head is its k conv output (written once, by the group's first v-head);
    // every other position, t >= T or t >= L included, keeps its garbage.
    for (const Tensor t :
         {Tensor::kRingRawv, Tensor::kRingRawk, Tensor::kRingG, Tensor::kRingBeta}) {
      INFO("tensor " << tensor_name(t));
      REQUIRE(bitwise_equal(after.raw(t), expected.raw(t)));
    }
    if (path.writes_qkv_act) {
      const auto act = after.qkv_act();
      for (int n = 0; n < c.B; ++n) {
        if (slots[n] >= 0) {
          REQUIRE(bitwise_equal(slice(act, n * T * D, T * D), conv[static_cast<size_t>(n)]));
        }
      }
    }
  }
}

TEST_CASE("host verify: ring g and beta match closed forms, threshold branch and safe gate",
          "[host][verify]") {
  const bool safe = GENERATE(false, true);
  VerifyCase c = make_case(2, 3, 1, 2, 64, 32, RecordMode::kRing, 401);
  c.safe_gate = safe;
  c.lower_bound = -5.0f;
  CAPTURE(c);
  VerifyProblem base(c);
  // Force both softplus branches: a = 30 (x > 20: sp = x) and a = -40 (1 + exp(x) == 1 in
  // f32: sp = 0, g = +0), beside the random N(0, 0.25) logits.
  auto a = base.a();
  for (size_t i = 0; i < a.size(); ++i) {
    if (i % 7 == 3) {
      a[i] = float_to_bf16(30.0f);
    } else if (i % 11 == 5) {
      a[i] = float_to_bf16(-40.0f);
    }
  }
  base.set(Tensor::kA, a);
  const VerifyProblem after = run(base, kFused, RecordMode::kRing);
  const auto g = after.ring_g();
  const auto beta = after.ring_beta();
  const auto b = base.b();
  const auto A_log = base.A_log();
  const auto dt_bias = base.dt_bias();
  const auto slots = base.slots();
  const int64_t K = c.K, HV = c.HV, L = c.L, T = c.T;
  int above_threshold = 0;
  for (int n = 0; n < c.B; ++n) {
    const int64_t s = slots[n];
    for (int64_t t = 0; t < T; ++t) {
      const int64_t r = n * T + t;
      for (int64_t hv = 0; hv < HV; ++hv) {
        const double eA = std::exp(static_cast<double>(A_log[hv]));
        for (int64_t k = 0; k < K; ++k) {
          const float xf = bf16_to_float(a[r * HV * K + hv * K + k]) + dt_bias[hv * K + k];
          const double x = xf;
          const float got = g[((s * HV + hv) * L + t) * K + k];
          CAPTURE(n, t, hv, k, x);
          if (safe) {
            const double want = c.lower_bound / (1.0 + std::exp(-eA * x));
            REQUIRE(got == Approx(want).epsilon(1e-6).margin(1e-6));
            REQUIRE(got >= c.lower_bound);
            REQUIRE(got <= 0.0f);
          } else if (x > 20.0) {
            ++above_threshold;
            REQUIRE(got == -std::exp(A_log[hv]) * xf);  // sp = x exactly
          } else if (x < -30.0) {
            uint32_t bits;
            std::memcpy(&bits, &got, sizeof(bits));
            REQUIRE(bits == 0u);  // log(1 + exp(x)) == 0 in f32; fma(-eA, 0, +0) = +0
          } else {
            const double want = -eA * std::log1p(std::exp(x));
            REQUIRE(got == Approx(want).epsilon(1e-6).margin(eA * 0x1p-23));
          }
        }
        const double want_beta =
            1.0 / (1.0 + std::exp(-static_cast<double>(bf16_to_float(b[r * HV + hv]))));
        REQUIRE(beta[(s * HV + hv) * L + t] == Approx(want_beta).epsilon(1e-6));
      }
    }
  }
  if (!safe) {
    REQUIRE(above_threshold > 0);
  }
}

TEST_CASE("host extend: N-token verify equals N sequential single-token extends",
          "[host][extend]") {
  VerifyCase gqa = make_case(3, 5, 2, 4, 64, 32, RecordMode::kSnapshot, 501);
  gqa.bias = true;
  gqa.wtype = ConvWeightType::kBF16;
  gqa.reversed = true;
  gqa.neg_slot = true;
  gqa.qkv_pad = 4;
  gqa.pitch_pad = 3;
  VerifyCase mha = make_case(2, 4, 2, 2, 128, 64, RecordMode::kSnapshot, 502);
  mha.safe_gate = true;
  const VerifyCase c = GENERATE_COPY(gqa, mha);
  CAPTURE(c);
  const VerifyProblem base(c);
  const VerifyProblem verified = run(base, kUnfused, RecordMode::kSnapshot);
  const auto v_out = verified.out();
  const auto snapshots = verified.snapshots();
  const auto windows = verified.conv_window();
  const auto slots = base.slots();
  const auto rows = base.rows();
  const int64_t T = c.T, D = base.D(), Ta = base.T_max();
  const int64_t row_elems = static_cast<int64_t>(c.HV) * c.V;
  const int64_t state = base.state_elems();
  const int64_t window = kConvHistory * D;

  VerifyProblem ext = base.clone_to(Device::host());
  std::vector<bf16_t> step_out(static_cast<size_t>(c.B * row_elems));
  for (int64_t t = 0; t < T; ++t) {
    CAPTURE(t);
    // Token t of every request as a T = 1 batch: start at row t, step T rows per request.
    ExtendParams e = ext.extend_params();
    e.T = 1;
    e.mixed_qkv += t * e.mixed_qkv_stride;
    e.mixed_qkv_stride *= T;
    e.a += t * e.a_stride;
    e.a_stride *= T;
    e.b += t * e.b_stride;
    e.b_stride *= T;
    e.out = step_out.data();
    host::extend(e);
    const auto ssm = ext.ssm_state();
    const auto conv = ext.conv_state();
    for (int n = 0; n < c.B; ++n) {
      CAPTURE(n);
      REQUIRE(bitwise_equal(slice(step_out, n * row_elems, row_elems),
                            slice(v_out, (n * T + t) * row_elems, row_elems)));
      if (slots[n] < 0) {
        continue;
      }
      REQUIRE(bitwise_equal(slice(ssm, slots[n] * state, state),
                            slice(snapshots, (rows[n] * Ta + t) * state, state)));
      REQUIRE(bitwise_equal(slice(conv, slots[n] * window, window),
                            slice(windows, (rows[n] * Ta + t) * window, window)));
    }
  }

  // One extend of all T tokens: the same outputs and final states, other slots untouched.
  VerifyProblem whole = base.clone_to(Device::host());
  host::extend(whole.extend_params());
  REQUIRE(bitwise_equal(whole.out(), v_out));
  auto want_ssm = base.ssm_state();
  auto want_conv = base.conv_state();
  for (int n = 0; n < c.B; ++n) {
    if (slots[n] >= 0) {
      std::copy_n(snapshots.begin() + (rows[n] * Ta + T - 1) * state, state,
                  want_ssm.begin() + slots[n] * state);
      std::copy_n(windows.begin() + (rows[n] * Ta + T - 1) * window, window,
                  want_conv.begin() + slots[n] * window);
    }
  }
  VerifyProblem expected = base.clone_to(Device::host());
  expected.set(Tensor::kSsmState, want_ssm);
  expected.set(Tensor::kConvState, want_conv);
  REQUIRE(bitwise_equal(whole.raw(Tensor::kSsmState), expected.raw(Tensor::kSsmState)));
  REQUIRE(bitwise_equal(whole.raw(Tensor::kConvState), expected.raw(Tensor::kConvState)));
  REQUIRE(bitwise_equal(ext.raw(Tensor::kSsmState), expected.raw(Tensor::kSsmState)));
  REQUIRE(bitwise_equal(ext.raw(Tensor::kConvState), expected.raw(Tensor::kConvState)));
}

TEST_CASE("host reference: invalid params throw kda::Error naming the field, writing nothing",
          "[host][validation]") {
  VerifyCase c = make_case(2, 4, 2, 4, 64, 32, RecordMode::kRing, 601);
  c.T_max = 4;
  const VerifyProblem base(c);
  VerifyProblem p = base.clone_to(Device::host());
  const VerifyParams good = p.params();

  auto fused_error = [&](const std::function<void(VerifyParams&)>& mutate) {
    VerifyParams q = good;
    mutate(q);
    return error_message([&] { host::verify_fused(q); });
  };
  CHECK(fused_error([](VerifyParams& q) { q.K = 96; }) ==
        "kda::host::verify_fused: K=96 unsupported, expected 64 or 128");
  CHECK(fused_error([](VerifyParams& q) { q.HV = 3; }) ==
        "kda::host::verify_fused: HV=3 is not a multiple of H=2");
  CHECK(fused_error([](VerifyParams& q) { q.T = 5; }) ==
        "kda::host::verify_fused: T=5 exceeds T_max=4 (the scratch step pitch)");
  CHECK(fused_error([](VerifyParams& q) { q.B = 0; }) ==
        "kda::host::verify_fused: B=0 must be >= 1");
  CHECK(fused_error([](VerifyParams& q) { q.ring_rawk = nullptr; }) ==
        "kda::host::verify_fused: ring_rawk is null, expected a pointer (ring mode)");
  CHECK(fused_error([](VerifyParams& q) { q.L = 12; }) ==
        "kda::host::verify_fused: L=12 must be a power of two (ring mode)");
  CHECK(fused_error([&](VerifyParams& q) { q.mixed_qkv_stride = base.D() - 1; }) ==
        fmt::format("kda::host::verify_fused: mixed_qkv_stride={} is smaller than D = {}",
                    base.D() - 1, base.D()));
  CHECK(fused_error([](VerifyParams& q) { q.ring_beta_slot_stride = 10; }) ==
        "kda::host::verify_fused: ring_beta_slot_stride=10 is smaller than HV x L = 64");
  CHECK(fused_error([](VerifyParams& q) {
          q.gate = GateKind::kSafe;
          q.lower_bound = 0.0f;
        }) ==
        "kda::host::verify_fused: lower_bound=0 must be finite and non-zero for the safe gate");
  CHECK(fused_error([](VerifyParams& q) {
          q.mode = RecordMode::kSnapshot;
          q.snapshots = nullptr;
        }) ==
        "kda::host::verify_fused: snapshots is null, expected a pointer "
        "(snapshot mode)");
  CHECK(error_message([&] {
          VerifyParams q = good;
          q.qkv_act = nullptr;
          host::verify_unfused(q);
        }) ==
        "kda::host::verify_unfused: qkv_act is null, expected a pointer ([N, D] bf16 "
        "scratch of the unfused path)");
  // The deferred commit's fields (contract §7).
  int32_t cursor[8] = {}, pending[8] = {};
  CHECK(fused_error([&](VerifyParams& q) { q.ring_pending = pending; }) ==
        "kda::host::verify_fused: ring_cursor is null, expected a pointer ([S] ring base per "
        "slot, with ring_pending)");
  CHECK(fused_error([&](VerifyParams& q) {
          q.ring_pending = pending;
          q.ring_cursor = cursor;
        }) ==
        "kda::host::verify_fused: ssm_fold_out is null, expected a pointer ([S, HV, V, K] f32 "
        "(the committed state), with ring_pending)");
  std::vector<float> u_rec(static_cast<size_t>(8 * 64 * 16 * 64), 0.5f);
  CHECK(fused_error([&](VerifyParams& q) {
          q.ring_pending = pending;
          q.ring_cursor = cursor;
          q.ssm_fold_out = const_cast<float*>(q.ssm_state);
        }) ==
        "kda::host::verify_fused: ring_u is null, expected a pointer ([S, HV, L, V] f32 u "
        "records, with ring_pending)");
  CHECK(
      fused_error([&](VerifyParams& q) {
        q.ring_pending = pending;
        q.ring_cursor = cursor;
        q.ssm_fold_out = const_cast<float*>(q.ssm_state);
        q.ring_u = u_rec.data();
        q.ring_u_slot_stride = 1;
      }).rfind("kda::host::verify_fused: ring_u_slot_stride=1 is smaller than HV x L x V = ", 0) ==
      0);
  CHECK(fused_error([&](VerifyParams& q) { q.ring_u = u_rec.data(); }) ==
        "kda::host::verify_fused: ring_u is given without ring_pending (u records belong to the "
        "deferred commit)");
  CHECK(fused_error([&](VerifyParams& q) { q.u_free = 1; }) ==
        "kda::host::verify_fused: u_free=1 without ring_pending (the u-free deferred commit's "
        "calls have pending counts)");
  CHECK(fused_error([&](VerifyParams& q) {
          q.ring_cursor = cursor;
          q.L = 4;
        }) ==
        "kda::host::verify_fused: a ring cursor needs L >= 2 * T_max (a round's records off the "
        "pending ones), got L=4, T_max=4");
  CHECK(fused_error([&](VerifyParams& q) {
          q = p.params(RecordMode::kSnapshot);
          q.ring_cursor = cursor;
        }) ==
        "kda::host::verify_fused: ring_cursor / ring_pending are ring-mode records (the call has "
        "none)");
  const Buffer accepted = make_buffer({1, 2}, Device::host());
  const CommitParams good_commit = p.commit_params(accepted);
  auto commit_error = [&](const std::function<void(CommitParams&)>& mutate) {
    CommitParams q = good_commit;
    mutate(q);
    return error_message([&] { host::commit(q); });
  };
  CHECK(commit_error([&](CommitParams& q) { q.ring_cursor = cursor; }) ==
        "kda::host::commit: an eager commit takes no ring_cursor / ring_pending (deferred state)");
  CHECK(commit_error([&](CommitParams& q) { q.ring_u = u_rec.data(); }) ==
        "kda::host::commit: an eager commit takes no ring_u (u records are the deferred commit's)");
  CHECK(commit_error([&](CommitParams& q) { q.u_free = 1; }) ==
        "kda::host::commit: u_free=1 with an eager commit (the u-free form is the deferred "
        "commit's)");
  CHECK(commit_error([&](CommitParams& q) {
          q.kind = CommitKind::kMaterialize;
          q.ring_cursor = cursor;
          q.ring_pending = pending;
        }) ==
        "kda::host::fold: ring_u is null, expected a pointer ([layers, S, HV, L, V] f32 u "
        "records (deferred folds))");
  CHECK(commit_error([](CommitParams& q) { q.kind = static_cast<CommitKind>(7); }) ==
        "kda::host::commit: kind=7 unknown, expected kEager (0), kDeferred (1), kMaterialize (2), "
        "kDropPending (3) or kLazy (4)");
  CHECK(commit_error([&](CommitParams& q) {
          q.kind = CommitKind::kDeferred;
          q.ring_cursor = cursor;
        }) ==
        "kda::host::commit: ring_pending is null, expected a pointer ([layers, S] pending counts)");
  CHECK(commit_error([&](CommitParams& q) {
          q.kind = CommitKind::kDeferred;
          q.mode = RecordMode::kSnapshot;
        }) == "kda::host::commit: kind=1 is ring mode only");

  SECTION("index checks") {
    p.set(Tensor::kSlots, std::vector<int32_t>{0, p.num_slots()});
    CHECK(error_message([&] { host::verify_fused(p.params()); }) ==
          "kda::host::verify_fused: slots[1]=4 out of range [0, num_slots=4) (negative = "
          "padding)");
    p.set(Tensor::kSlots, std::vector<int32_t>{3, 3});
    CHECK(error_message([&] { host::verify_fused(p.params()); }) ==
          "kda::host::verify_fused: slots[0] and slots[1] are both 3: two requests would "
          "write one slot");
    // Snapshot mode writes no slot: a shared slot is fine, a shared scratch row is not.
    host::verify_fused(p.params(RecordMode::kSnapshot));
    p.set(Tensor::kRows, std::vector<int32_t>{2, 2});
    CHECK(error_message([&] { host::verify_fused(p.params(RecordMode::kSnapshot)); }) ==
          "kda::host::verify_fused: rows[0] and rows[1] are both 2: two requests would write "
          "one scratch row");
    p.set(Tensor::kRows, std::vector<int32_t>{0, -1});
    CHECK(error_message([&] { host::verify_unfused(p.params()); }) ==
          "kda::host::verify_unfused: rows[1]=-1 out of range [0, num_rows=3)");
  }
  SECTION("extend") {
    ExtendParams e = p.extend_params();
    e.conv_state_out = nullptr;
    CHECK(error_message([&] { host::extend(e); }) ==
          "kda::host::extend: conv_state_out is null, expected a pointer ([S, W-1, D] "
          "bf16, may alias conv_state)");
  }
  SECTION("a failed call writes nothing") {
    VerifyParams q = good;
    q.ring_g = nullptr;  // the last thing a verify would need
    CHECK_THROWS_AS(host::verify_unfused(q), Error);
    for (int t = 0; t < static_cast<int>(Tensor::kCount); ++t) {
      INFO("tensor " << tensor_name(static_cast<Tensor>(t)));
      REQUIRE(bitwise_equal(p.raw(static_cast<Tensor>(t)), base.raw(static_cast<Tensor>(t))));
    }
  }
}

TEST_CASE("host kernel set: forwards to the reference; block_v checked against the CUDA set",
          "[host][kernel_set]") {
  const auto ks = make_host_kernel_set();
  CHECK(std::string(ks->name()) == "host");
  CHECK(ks->device() == Device::host());
  VerifyCase c = make_case(2, 3, 1, 2, 64, 32, RecordMode::kRing, 701);
  const VerifyProblem base(c);
  VerifyProblem via_set = base.clone_to(Device::host());
  ks->verify_fused(via_set.params(), 32, /*stream=*/nullptr);
  const VerifyProblem direct = run(base, kFused, c.mode);
  for (const Tensor t : kRecords) {
    INFO("tensor " << tensor_name(t));
    REQUIRE(bitwise_equal(via_set.raw(t), direct.raw(t)));
  }
  CHECK(error_message([&] { ks->verify_fused(via_set.params(), 7, nullptr); }) ==
        "HostKernelSet::plan_verify: block_v=7 unsupported, expected one of 8, 16, 32, 64, 128");
  VerifyProblem unfused = base.clone_to(Device::host());
  ks->verify_unfused(unfused.params(), nullptr);
  REQUIRE(bitwise_equal(unfused.raw(Tensor::kOut), direct.raw(Tensor::kOut)));
}
