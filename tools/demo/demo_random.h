// demo_random.h: counter-based random numbers for the demo (plain C++, header-only).
//
// Every value is a pure function of (seed, stream key, index): a request's inputs of a round
// and layer are the same whether the batch holds 2 or 16 requests, and the same in the primary
// run and in every independent check run (which may cover fewer layers / requests). No state
// is carried between draws, so generation can be split over threads freely.
#pragma once

#include <cmath>
#include <cstdint>

namespace kda::demo {

/// splitmix64's finaliser: a bijection of 64-bit words with good avalanche.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// What a stream of draws is for (part of its key).
enum class StreamTag : uint64_t {
  kConvWeight = 1,
  kConvBias,
  kALog,
  kDtBias,
  kMixedQkv,
  kGateA,
  kBetaB,
  kAccept,
};

/// Phase of the run an activation belongs to (part of its key).
enum class Phase : uint64_t { kWeights = 0, kPrompt = 1, kVerify = 2 };

/// The key of one stream: (seed, tag, phase, round, layer, request).
inline uint64_t stream_key(uint64_t seed, StreamTag tag, Phase phase, int64_t round, int64_t layer,
                           int64_t request) {
  uint64_t k = mix64(seed);
  k = mix64(k ^ static_cast<uint64_t>(tag));
  k = mix64(k ^ static_cast<uint64_t>(phase));
  k = mix64(k ^ static_cast<uint64_t>(round));
  k = mix64(k ^ static_cast<uint64_t>(layer));
  return mix64(k ^ static_cast<uint64_t>(request));
}

/// Uniform in [0, 1): draw `i` of stream `key` (53 random bits).
inline double uniform01(uint64_t key, uint64_t i) {
  return static_cast<double>(mix64(key ^ mix64(i)) >> 11) * 0x1.0p-53;
}

/// Fills dst[0, n) with scale * N(0, 1) draws of stream `key` (Box-Muller: draw pair j gives
/// elements 2j and 2j+1). `Store` converts a float into the element type.
template <typename T, typename Store>
void fill_normal(T* dst, int64_t n, uint64_t key, float scale, Store store) {
  constexpr double kTwoPi = 6.283185307179586;
  for (int64_t j = 0; 2 * j < n; ++j) {
    const uint64_t h = mix64(key ^ mix64(static_cast<uint64_t>(j)));
    const uint64_t h2 = mix64(h);
    const double u1 = (static_cast<double>(h >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]: log finite
    const double u2 = static_cast<double>(h2 >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1));
    dst[2 * j] = store(static_cast<float>(scale * r * std::cos(kTwoPi * u2)));
    if (2 * j + 1 < n) {
      dst[2 * j + 1] = store(static_cast<float>(scale * r * std::sin(kTwoPi * u2)));
    }
  }
}

}  // namespace kda::demo
