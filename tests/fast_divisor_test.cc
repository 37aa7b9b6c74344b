// FastDivisor (kernels/fast_divisor.h) against `/` and `%`: the kernels split every streamed
// item index with it, so a wrong quotient would send an item to another request's state.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/common/fast_divisor.h"

using kda::kernels::FastDivisor;

namespace {

constexpr uint32_t kMaxNumerator = 0x7fffffffu;  // n < 2^31 (the documented range)

/// Every n checked against the hardware division; returns the number of mismatches.
int mismatches(const FastDivisor& f, const std::vector<uint32_t>& numerators) {
  int bad = 0;
  for (const uint32_t n : numerators) {
    uint32_t q = 0, r = 0;
    f.divmod(n, q, r);
    if (q != n / f.divisor || r != n % f.divisor || f.div(n) != q) {
      if (bad < 5) {
        UNSCOPED_INFO("d = " << f.divisor << ", n = " << n << ": got " << q << " r " << r
                             << ", expected " << n / f.divisor << " r " << n % f.divisor);
      }
      ++bad;
    }
  }
  return bad;
}

/// The edges around a divisor: small n, n near multiples of d and the top of the range.
std::vector<uint32_t> edge_numerators(uint32_t d) {
  std::vector<uint32_t> ns;
  for (uint32_t n = 0; n < 64; ++n) {
    ns.push_back(n);
  }
  for (const uint64_t q :
       {uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{1000}, uint64_t{kMaxNumerator} / d}) {
    for (const int64_t delta : {-1, 0, 1}) {
      const int64_t n = static_cast<int64_t>(q * d) + delta;
      if (n >= 0 && n <= kMaxNumerator) {
        ns.push_back(static_cast<uint32_t>(n));
      }
    }
  }
  ns.push_back(kMaxNumerator);
  ns.push_back(kMaxNumerator - 1);
  return ns;
}

}  // namespace

TEST_CASE("FastDivisor: every divisor up to 4096 at the edges of the range", "[fast_divisor]") {
  int bad = 0;
  for (uint32_t d = 1; d <= 4096; ++d) {
    bad += mismatches(FastDivisor(d), edge_numerators(d));
  }
  CHECK(bad == 0);
}

TEST_CASE("FastDivisor: powers of two and their neighbours up to 2^31", "[fast_divisor]") {
  int bad = 0;
  for (int k = 0; k <= 31; ++k) {
    const uint64_t p = uint64_t{1} << k;
    for (const uint64_t d : {p - 1, p, p + 1}) {
      if (d >= 1 && d <= (uint64_t{1} << 31)) {
        bad += mismatches(FastDivisor(static_cast<uint32_t>(d)),
                          edge_numerators(static_cast<uint32_t>(d)));
      }
    }
  }
  CHECK(bad == 0);
}

TEST_CASE("FastDivisor: random divisors and numerators (fresh seed)", "[fast_divisor]") {
  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> numerator(0, kMaxNumerator);
  // Small divisors (the kernels' tiles / heads / requests / group sizes) and the whole range.
  std::uniform_int_distribution<uint32_t> small(1, 1024);
  std::uniform_int_distribution<uint32_t> any(1, 0x80000000u);
  int bad = 0;
  for (int i = 0; i < 2000; ++i) {
    const FastDivisor f(i % 2 == 0 ? small(rng) : any(rng));
    std::vector<uint32_t> ns(500);
    for (auto& n : ns) {
      n = numerator(rng);
    }
    bad += mismatches(f, ns);
  }
  CHECK(bad == 0);
}

TEST_CASE("FastDivisor: the multiplier and shift of known divisors", "[fast_divisor]") {
  // d = 1: n + umulhi(1, n) = n, shift 0. d = 7: l = 3, m = floor(2^32 * 1 / 7) + 1.
  const FastDivisor one(1);
  CHECK(one.shift == 0);
  CHECK(one.mul == 1);
  const FastDivisor seven(7);
  CHECK(seven.shift == 3);
  CHECK(seven.mul == 613566757u);  // floor(4294967296 / 7) + 1
  const FastDivisor top(0x80000000u);
  CHECK(top.shift == 31);
  CHECK(top.div(kMaxNumerator) == 0);
}
