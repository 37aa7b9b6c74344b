// demo_random.h: counter-based random numbers for the demo, one definition for host code and
// device code (plain C++; KDA_HD functions are __host__ __device__ under nvcc).
//
// Every value is a pure function of (seed, stream key, index): a request's inputs of a round
// and layer are the same whether the batch holds 2 or 16 requests, and the same in the primary
// run and in every independent check run (which may cover fewer layers / requests, or run on
// the other device). No state is carried between draws, so generation splits over threads or
// CUDA threads freely.
//
// Host == device, bit for bit: normal_draw uses 64-bit integer hashing, an exact integer sum,
// one exact int -> float conversion and correctly rounded float multiplies (no add, so no
// contraction into an FMA either side); bf16 rounding is core/dtype.h's integer RNE. No libm.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/platform_macros.h"

namespace kda::demo {

/// splitmix64's finaliser (after its increment): a bijection of 64-bit words with good
/// avalanche.
KDA_HD uint64_t mix64(uint64_t x) {
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
  kDraftShape,
};

/// Phase of the run an activation belongs to (part of its key).
enum class Phase : uint64_t { kWeights = 0, kPrompt = 1, kVerify = 2 };

/// The key of one stream: (seed, tag, phase, round, layer, request).
KDA_HD uint64_t stream_key(uint64_t seed, StreamTag tag, Phase phase, int64_t round, int64_t layer,
                           int64_t request) {
  uint64_t k = mix64(seed);
  k = mix64(k ^ static_cast<uint64_t>(tag));
  k = mix64(k ^ static_cast<uint64_t>(phase));
  k = mix64(k ^ static_cast<uint64_t>(round));
  k = mix64(k ^ static_cast<uint64_t>(layer));
  return mix64(k ^ static_cast<uint64_t>(request));
}

/// 64 random bits: draw `i` of stream `key` (element i of the splitmix64 sequence seeded
/// with `key`).
KDA_HD uint64_t draw_bits(uint64_t key, uint64_t i) {
  return mix64(key + i * 0x9e3779b97f4a7c15ull);
}

/// Uniform in [0, 1): draw `i` of stream `key` (53 random bits; exact in double).
inline double uniform01(uint64_t key, uint64_t i) {
  return static_cast<double>(draw_bits(key, i) >> 11) * 0x1.0p-53;
}

/// 1 / sd of the centred sum of four uniform 16-bit integers: sd = sqrt((2^32 - 1) / 3).
constexpr float kIrwinHallUnit = 0x1.bb67aep-16f;

/// a * b rounded to nearest even, never fused with a neighbouring add.
KDA_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

/// scale * z, z ~ N(0, 1) approximately: draw `i` of stream `key`. z is the Irwin-Hall sum of
/// the 4 16-bit fields of one draw, centred (an integer in [-131070, 131070]) and scaled to
/// unit variance; |z| <= 3.47, mean exactly 0.
KDA_HD float normal_draw(uint64_t key, uint64_t i, float scale) {
  const uint64_t h = draw_bits(key, i);
  const int32_t sum = static_cast<int32_t>(h & 0xffffu) +
                      static_cast<int32_t>((h >> 16) & 0xffffu) +
                      static_cast<int32_t>((h >> 32) & 0xffffu) + static_cast<int32_t>(h >> 48);
  const float centred = static_cast<float>(sum - 131070);  // exact: |sum - 131070| < 2^24
  return mul_rn(centred, mul_rn(kIrwinHallUnit, scale));
}

/// normal_draw rounded to bf16 (round to nearest even).
KDA_HD bf16_t normal_bf16(uint64_t key, uint64_t i, float scale) {
  return float_to_bf16(normal_draw(key, i, scale));
}

}  // namespace kda::demo
