// host_math_test.cc: contract §3's per-step functions against closed forms and the literal
// 32-lane reduction tree.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/ref/host_math.h"

using namespace kda;
namespace math = kda::host::math;

namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// The warp as the contract describes it: 32 lanes, each with its own partial, combined by
// p_j = p_j + p_{j^d} on every lane for d = 16, 8, 4, 2, 1.
template <typename R>
std::vector<R> warp_tree(const std::vector<R>& x, const std::vector<R>& y) {
  const int K = static_cast<int>(x.size());
  const int m = K / 32;
  std::vector<R> lane(32);
  for (int j = 0; j < 32; ++j) {
    R p = std::fma(x[j * m], y[j * m], x[j * m + 1] * y[j * m + 1]);
    for (int i = 2; i < m; ++i) {
      p = std::fma(x[j * m + i], y[j * m + i], p);
    }
    lane[j] = p;
  }
  for (int d = 16; d >= 1; d /= 2) {
    std::vector<R> next(32);
    for (int j = 0; j < 32; ++j) {
      next[j] = lane[j] + lane[j ^ d];
    }
    lane = next;
  }
  return lane;
}

// Closed forms in double (log1p / exp), independent of the contract's instruction forms.
double softplus_closed(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }
double sigmoid_closed(double z) { return 1.0 / (1.0 + std::exp(-z)); }

}  // namespace

TEST_CASE("host_math: tree_dot equals the 32-lane xor butterfly on every lane", "[host]") {
  const int K = GENERATE(64, 128);
  const uint32_t seed = static_cast<uint32_t>(Catch::rngSeed()) + static_cast<uint32_t>(K);
  CAPTURE(K, seed);
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> x(K), y(K);
    for (int k = 0; k < K; ++k) {
      x[k] = dist(gen);
      y[k] = dist(gen);
    }
    const std::vector<float> lanes = warp_tree(x, y);
    const float r = math::tree_dot(x.data(), y.data(), K);
    for (int j = 0; j < 32; ++j) {
      REQUIRE(bits_of(lanes[j]) == bits_of(r));
    }
    std::vector<double> xd(x.begin(), x.end()), yd(y.begin(), y.end());
    REQUIRE(warp_tree(xd, yd)[7] == math::tree_dot(xd.data(), yd.data(), K));
  }
}

TEST_CASE("host_math: standard gate matches -exp(A_log) * softplus(x)", "[host]") {
  const float eA = std::exp(0.3f);
  for (const float x : {-15.0f, -3.0f, -0.5f, 0.0f, 0.7f, 5.0f, 19.5f, 20.0f}) {
    CAPTURE(x);
    const double closed = -static_cast<double>(eA) * softplus_closed(x);
    // log(1 + exp(x)) (the contract's form, not log1p) rounds 1 + exp(x) first: an absolute
    // error of up to half an ulp of 1 in softplus, hence the margins for negative x.
    CHECK(math::gate_standard(x, eA) == Approx(closed).epsilon(2e-7).margin(eA * 0x1p-23));
    CHECK(math::gate_standard<double>(x, eA) == Approx(closed).epsilon(1e-14).margin(1e-15));
  }
}

TEST_CASE("host_math: softplus threshold: x > 20 gives sp = x exactly", "[host]") {
  const float eA = std::exp(-0.4f);
  for (const float x : {20.0001f, 20.5f, 25.0f, 100.0f}) {
    CAPTURE(x);
    // -eA * x rounded once: the fma with +0 adds nothing to a non-zero product.
    CHECK(bits_of(math::gate_standard(x, eA)) == bits_of(-eA * x));
  }
  // x = 20 takes the log branch (<=): log(1 + exp(20)) rounds to 20 in f32 as well.
  CHECK(math::gate_standard(20.0f, eA) == Approx(-eA * 20.0f).epsilon(1e-7));
}

TEST_CASE("host_math: softplus underflow gives g = +0 exactly", "[host]") {
  // 1 + exp(-20) == 1 in f32, so log(...) = 0 (the contract's log(1+exp), not log1p), and
  // fma(-eA, 0, +0) = +0: the sign the kernels record in the ring.
  const float g = math::gate_standard(-20.0f, 1.5f);
  CHECK(bits_of(g) == 0u);
  // In double the same formula still sees the tail.
  CHECK(math::gate_standard(-20.0, 1.5) < 0.0);
}

TEST_CASE("host_math: safe gate is lb * sigmoid(exp(A_log) * x), within [lb, 0]", "[host]") {
  const float lb = -5.0f;
  const float eA = std::exp(0.6f);
  for (const float x : {-30.0f, -2.0f, -0.1f, 0.0f, 0.3f, 4.0f, 30.0f}) {
    CAPTURE(x);
    const double closed = lb * sigmoid_closed(static_cast<double>(eA) * x);
    const float g = math::gate_safe(x, eA, lb);
    CHECK(g == Approx(closed).epsilon(2e-7).margin(1e-30));
    CHECK(g >= lb);
    CHECK(g <= 0.0f);
    CHECK(math::gate(GateKind::kSafe, x, eA, lb) == g);
  }
  CHECK(math::gate_safe(0.0f, eA, lb) == lb / 2);
}

TEST_CASE("host_math: SiLU and sigmoid use DIV(x, 1 + EXP(0 - x)), bit for bit", "[host]") {
  // The bf16 rounding after SiLU hides most 1-ulp f32 differences, so check the f32 form:
  // a division, not a multiply by the reciprocal.
  int differs_from_reciprocal = 0;
  for (int i = -2000; i <= 2000; ++i) {
    const float x = static_cast<float>(i) * 0.00731f;
    CAPTURE(x);
    REQUIRE(bits_of(math::silu(x)) == bits_of(x / (1.0f + std::exp(0.0f - x))));
    REQUIRE(bits_of(math::sigmoid(x)) == bits_of(1.0f / (1.0f + std::exp(0.0f - x))));
    differs_from_reciprocal += math::silu(x) != x * (1.0f / (1.0f + std::exp(0.0f - x)));
  }
  CHECK(differs_from_reciprocal > 0);  // the check above can tell the two forms apart
}

TEST_CASE("host_math: beta = sigmoid(b)", "[host]") {
  for (const float b : {-8.0f, -1.0f, 0.0f, 0.25f, 3.0f}) {
    CAPTURE(b);
    CHECK(math::sigmoid(b) == Approx(sigmoid_closed(b)).epsilon(2e-7));
  }
  CHECK(math::sigmoid(0.0f) == 0.5f);
}

TEST_CASE("host_math: q scale is K^-0.5 correctly rounded", "[host]") {
  CHECK(bits_of(math::q_scale<float>(128)) == 0x3DB504F3u);
  CHECK(math::q_scale<float>(64) == 0.125f);
  CHECK(math::q_scale<double>(128) == 1.0 / std::sqrt(128.0));
}

TEST_CASE("host_math: L2 norm puts eps inside the sqrt and divides element-wise", "[host]") {
  std::vector<float> x(64, 0.0f), xn(64);
  x[0] = 3.0f;
  x[5] = 4.0f;
  math::l2_normalize(x.data(), 64, xn.data());
  const float norm = std::sqrt(25.0f + kNormEps);
  CHECK(xn[0] == 3.0f / norm);
  CHECK(xn[5] == 4.0f / norm);
  CHECK(xn[1] == 0.0f);
  // q: normalised first, then scaled by K^-0.5.
  std::vector<float> qs(64);
  math::normalize_q(x.data(), 64, qs.data());
  CHECK(qs[0] == (3.0f / norm) * 0.125f);
  CHECK(qs[5] == (4.0f / norm) * 0.125f);
  // All-zero input: eps keeps the norm finite.
  std::vector<float> zeros(64, 0.0f);
  math::l2_normalize(zeros.data(), 64, xn.data());
  CHECK(xn[0] == 0.0f);
}

TEST_CASE("host_math: conv taps: f32 FMA chain vs bf16-rounded products", "[host]") {
  // x = w = 1 + 2^-7: the product 1 + 2^-6 + 2^-14 is exact in f32, 1 + 2^-6 in bf16.
  const float v = 1.0f + 0x1p-7f;
  math::ConvTaps c;
  c.w[3] = v;
  const float in[kConvWidth] = {0.5f, -0.25f, 2.0f, v};
  c.bf16_products = false;
  CHECK(math::conv_acc(c, in) == 1.0f + 0x1p-6f + 0x1p-14f);
  c.bf16_products = true;
  CHECK(math::conv_acc(c, in) == 1.0f + 0x1p-6f);

  // Full chain, f32: acc = bias; acc = fma(tap, w, acc), oldest first.
  math::ConvTaps f;
  f.w[0] = 0.3f;
  f.w[1] = -0.7f;
  f.w[2] = 0.11f;
  f.w[3] = 0.9f;
  f.bias = 0.05f;
  float acc = f.bias;
  for (int j = 0; j < kConvWidth; ++j) {
    acc = std::fma(in[j], f.w[j], acc);
  }
  CHECK(math::conv_acc(f, in) == acc);
  const float y = acc / (1.0f + std::exp(0.0f - acc));
  CHECK(math::conv_silu_bf16(f, in).bits == float_to_bf16(y).bits);
}

TEST_CASE("host_math: delta rule step: decay, then subtract-and-scale, then FMA update", "[host]") {
  // One head, K = 64, V = 1: compare with the formula written out.
  const int K = 64;
  std::vector<float> S(K), kn(K), g(K), decay(K);
  for (int k = 0; k < K; ++k) {
    S[k] = 0.01f * static_cast<float>(k % 7) - 0.02f;
    kn[k] = 0.125f * ((k % 3) - 1.0f);
    g[k] = -0.1f * static_cast<float>(k % 5);
  }
  const float v = 0.75f;
  const float beta = 0.6f;
  std::vector<float> want = S;
  for (int k = 0; k < K; ++k) {
    want[k] = want[k] * std::exp(g[k]);
  }
  const float u = (v - math::tree_dot(want.data(), kn.data(), K)) * beta;
  for (int k = 0; k < K; ++k) {
    want[k] = std::fma(kn[k], u, want[k]);
  }
  math::decay_state(S.data(), g.data(), K, 1, decay.data());
  float u_rec = 0.0f;
  math::delta_update(S.data(), kn.data(), beta, &v, K, 1, &u_rec);
  REQUIRE(bits_of(u_rec) == bits_of(u));
  for (int k = 0; k < K; ++k) {
    REQUIRE(bits_of(S[k]) == bits_of(want[k]));
  }
}
