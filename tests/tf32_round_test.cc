// tf32_round_test.cc: kernels::tf32_rna_bits (the fast outputs' TF32 splits) is round to nearest,
// ties away from zero, to 11 significant bits, for every finite f32: checked against a rounding
// written from that definition (in double, where the f32 and its neighbours are exact) on every
// exponent, random mantissas, the ties and the values that carry into the next binade.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "kernels/common/tf32_round.h"

using kda::kernels::tf32_rna_bits;

namespace {

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

uint32_t to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// x rounded to 11 significant bits (TF32's 10 explicit ones and the implicit one; subnormals
// keep TF32's absolute quantum), nearest, ties away from zero. Exact in double.
float rna_by_definition(float x) {
  if (x == 0.0f) {
    return x;
  }
  const double ax = std::fabs(static_cast<double>(x));
  // The TF32 quantum at x: 2^(e - 10) for x in [2^e, 2^(e+1)); subnormals share 2^-136.
  const int e = std::max(std::ilogb(ax), -126);
  const double q = std::ldexp(1.0, e - 10);
  const double n = std::floor(ax / q);
  const double rest = ax - n * q;
  const double r = (rest >= q / 2 ? n + 1 : n) * q;  // ties (rest == q / 2) away from zero
  return static_cast<float>(std::copysign(r, static_cast<double>(x)));
}

bool same(uint32_t bits) {
  const float want = rna_by_definition(from_bits(bits));
  return tf32_rna_bits(bits) == to_bits(want);
}

}  // namespace

TEST_CASE("tf32_rna_bits: round to nearest, ties away, for every finite f32 kind",
          "[kernels][tf32]") {
  std::mt19937 rng(1234);
  int checked = 0;
  // Every exponent (subnormals included), both signs, random mantissas.
  for (uint32_t exp = 0; exp < 255; ++exp) {
    for (int i = 0; i < 400; ++i) {
      const uint32_t bits = (rng() & 0x80000000u) | (exp << 23) | (rng() & 0x7fffffu);
      INFO("bits 0x" << std::hex << bits);
      REQUIRE(same(bits));
      ++checked;
    }
  }
  // Exact ties (low 13 bits 0x1000), one below and one above, and mantissas that carry into
  // the next binade (all 10 kept bits set).
  for (uint32_t exp = 1; exp < 254; ++exp) {
    for (const uint32_t kept : {0u, 0x155u << 13, 0x3ffu << 13}) {
      for (const uint32_t low : {0x0fffu, 0x1000u, 0x1001u, 0x1fffu, 0u}) {
        for (const uint32_t sign : {0u, 0x80000000u}) {
          const uint32_t bits = sign | (exp << 23) | kept | low;
          INFO("bits 0x" << std::hex << bits);
          REQUIRE(same(bits));
          ++checked;
        }
      }
    }
  }
  // The carry from the largest mantissa lands on the next power of two.
  CHECK(from_bits(tf32_rna_bits(to_bits(1.0f + 0x1.ffep-1f))) == 2.0f);
  CHECK(tf32_rna_bits(to_bits(0.0f)) == 0u);
  CHECK(tf32_rna_bits(to_bits(-0.0f)) == 0x80000000u);
  CHECK(checked > 100000);
}

TEST_CASE("tf32_rna_bits: a rounding off by one bit fails the definition", "[kernels][tf32]") {
  // The check above can fail: ties to zero instead of away, or truncation, differ at once.
  const uint32_t tie = to_bits(1.0f) | 0x1000u;
  CHECK(((tie + 0x0fffu) & 0xffffe000u) != to_bits(rna_by_definition(from_bits(tie))));
  const uint32_t above = to_bits(1.0f) | 0x1800u;
  CHECK((above & 0xffffe000u) != to_bits(rna_by_definition(from_bits(above))));
  CHECK(same(tie));
  CHECK(same(above));
}
