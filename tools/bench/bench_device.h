// bench_device.h: small CUDA helpers of kda_bench (plain C++ header; bodies in
// bench_device.cu): seeded device-side input generation, garbage prefill, bytewise compare.
// The fills enqueue on `stream` (no sync); first_mismatch synchronises `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace kda::bench {

/// dst[i] = scale * randn, where randn is a counter-based normal sample of (seed, i): the
/// same seed always gives the same tensor, whatever the launch shape.
void fill_randn_f32(float* dst, int64_t n, float scale, uint64_t seed, cudaStream_t stream);
/// As fill_randn_f32, rounded to bf16 (round to nearest even).
void fill_randn_bf16(bf16_t* dst, int64_t n, float scale, uint64_t seed, cudaStream_t stream);
/// `bytes` bytes of pseudo-random bits of (seed, i): identical garbage for identical seeds.
void fill_bits(void* dst, int64_t bytes, uint64_t seed, cudaStream_t stream);
/// dst[i] = i for i < n.
void fill_arange_i32(int32_t* dst, int64_t n, cudaStream_t stream);
/// dst[i] = value for i < n.
void fill_i32(int32_t* dst, int64_t n, int32_t value, cudaStream_t stream);

/// Byte offset of the first byte where `a` and `b` differ, or -1 if all `bytes` match.
/// `scratch`: 8 bytes of device memory. Synchronises `stream`.
int64_t first_mismatch(const void* a, const void* b, int64_t bytes, void* scratch,
                       cudaStream_t stream);

/// Non-finite elements of `n` f32 or bf16 values, and the largest finite |x|. `scratch`: 16
/// bytes of device memory. Synchronises `stream`.
struct FiniteStats {
  int64_t nonfinite = 0;
  float max_abs = 0.0f;
};
FiniteStats finite_stats(const void* x, DType dtype, int64_t n, void* scratch, cudaStream_t stream);

/// Launch-latency probes (enqueue one call on `stream`, PDL as the KDA launchers use it):
/// an empty kernel (1 CTA: the graph-node floor of any verify call), and a 128-CTA kernel
/// whose threads each do two dependent global loads (index, then data[index]) and one store
/// (the floor of verify's slot -> state dependency). `scratch`: >= 64 KiB of device memory
/// whose first 4 bytes hold an int32 index < 8192 (fill_i32 it once).
void launch_empty_probe(bool pdl, cudaStream_t stream);
void launch_dependent_load_probe(int32_t* scratch, bool pdl, cudaStream_t stream);

/// splitmix64: seeds of independent tensors (host and device).
constexpr uint64_t mix_seed(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace kda::bench
