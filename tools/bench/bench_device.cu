// bench_device.cu: kda_bench's set-up kernels. Grid-stride loops, one value per element
// from a counter-based hash, so results depend only on (seed, index).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>

#include "core/cuda_check.h"
#include "kernels/common/launch_pdl.cuh"
#include "tools/bench/bench_device.h"

namespace kda::bench {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint64_t hash64(uint64_t seed, uint64_t i) {
  uint64_t x = seed ^ (i * 0xd1342543de82ef95ull);
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// Box-Muller from one 64-bit hash: u1 in (0, 1], u2 in [0, 1).
__device__ __forceinline__ float randn(uint64_t seed, uint64_t i) {
  const uint64_t h = hash64(seed, i);
  const float u1 = static_cast<float>((h >> 40) + 1) * (1.0f / 16777216.0f);
  const float u2 = static_cast<float>(h & 0xffffffull) * (1.0f / 16777216.0f);
  return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

__global__ void randn_f32_kernel(float* dst, int64_t n, float scale, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = scale * randn(seed, static_cast<uint64_t>(i));
  }
}

__global__ void randn_bf16_kernel(bf16_t* dst, int64_t n, float scale, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = float_to_bf16(scale * randn(seed, static_cast<uint64_t>(i)));
  }
}

__global__ void bits_kernel(uint8_t* dst, int64_t bytes, uint64_t seed) {
  const int64_t words = bytes / 8;
  uint64_t* dst64 = reinterpret_cast<uint64_t*>(dst);  // 8-byte aligned (checked by caller)
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < words;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst64[i] = hash64(seed, static_cast<uint64_t>(i));
  }
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (t < bytes - words * 8) {
    dst[words * 8 + t] = static_cast<uint8_t>(hash64(seed, static_cast<uint64_t>(words + t)));
  }
}

__global__ void arange_kernel(int32_t* dst, int64_t n, int32_t value, int arange) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = arange ? static_cast<int32_t>(i) : value;
  }
}

/// *first = min(*first, offset of a differing byte). 16-byte words, then a byte tail.
__global__ void mismatch_kernel(const uint8_t* a, const uint8_t* b, int64_t bytes,
                                unsigned long long* first) {
  const int64_t words = bytes / 16;
  const uint4* a16 = reinterpret_cast<const uint4*>(a);
  const uint4* b16 = reinterpret_cast<const uint4*>(b);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < words;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint4 x = a16[i], y = b16[i];
    if (x.x != y.x || x.y != y.y || x.z != y.z || x.w != y.w) {
      for (int j = 0; j < 16; ++j) {
        if (a[i * 16 + j] != b[i * 16 + j]) {
          atomicMin(first, static_cast<unsigned long long>(i * 16 + j));
          break;
        }
      }
    }
  }
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t tail = words * 16 + t;
  if (tail < bytes && a[tail] != b[tail]) {
    atomicMin(first, static_cast<unsigned long long>(tail));
  }
}

unsigned grid_for(int64_t n) {
  // Enough CTAs to fill any current GPU; the loops stride over the rest.
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, 8192)));
}

}  // namespace

void fill_randn_f32(float* dst, int64_t n, float scale, uint64_t seed, cudaStream_t stream) {
  if (n <= 0) {
    return;
  }
  randn_f32_kernel<<<grid_for(n), kThreads, 0, stream>>>(dst, n, scale, seed);
  KDA_CUDA_CHECK(cudaGetLastError());
}

void fill_randn_bf16(bf16_t* dst, int64_t n, float scale, uint64_t seed, cudaStream_t stream) {
  if (n <= 0) {
    return;
  }
  randn_bf16_kernel<<<grid_for(n), kThreads, 0, stream>>>(dst, n, scale, seed);
  KDA_CUDA_CHECK(cudaGetLastError());
}

void fill_bits(void* dst, int64_t bytes, uint64_t seed, cudaStream_t stream) {
  if (bytes <= 0) {
    return;
  }
  KDA_CHECK(reinterpret_cast<uintptr_t>(dst) % 8 == 0, "fill_bits: destination not 8-byte aligned");
  bits_kernel<<<grid_for(std::max<int64_t>(bytes / 8, 8)), kThreads, 0, stream>>>(
      static_cast<uint8_t*>(dst), bytes, seed);
  KDA_CUDA_CHECK(cudaGetLastError());
}

void fill_arange_i32(int32_t* dst, int64_t n, cudaStream_t stream) {
  if (n <= 0) {
    return;
  }
  arange_kernel<<<grid_for(n), kThreads, 0, stream>>>(dst, n, 0, 1);
  KDA_CUDA_CHECK(cudaGetLastError());
}

void fill_i32(int32_t* dst, int64_t n, int32_t value, cudaStream_t stream) {
  if (n <= 0) {
    return;
  }
  arange_kernel<<<grid_for(n), kThreads, 0, stream>>>(dst, n, value, 0);
  KDA_CUDA_CHECK(cudaGetLastError());
}

namespace {

__device__ __forceinline__ void probe_pdl() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

__global__ void empty_probe_kernel() { probe_pdl(); }

/// Each thread: index = scratch[0] (< 8192), then scratch[16 + (index + thread) % 8192] ->
/// scratch[8208 + thread % 8192]: two dependent loads and a store.
__global__ void dependent_load_probe_kernel(int32_t* scratch) {
  probe_pdl();
  const int idx = *reinterpret_cast<volatile int32_t*>(scratch);
  const int t = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  const int v = reinterpret_cast<volatile int32_t*>(scratch)[16 + (idx + t) % 8192];
  scratch[8208 + t % 8192] = v + 1;
}

template <typename... Args>
void launch_probe(void (*kernel)(Args...), unsigned grid, unsigned block, bool pdl,
                  cudaStream_t stream, Args... args) {
  kernels::launch_pdl(kernel, dim3(grid), dim3(block), 0, stream, pdl, args...);
}

}  // namespace

void launch_empty_probe(bool pdl, cudaStream_t stream) {
  launch_probe(empty_probe_kernel, 1, 32, pdl, stream);
}

void launch_dependent_load_probe(int32_t* scratch, bool pdl, cudaStream_t stream) {
  launch_probe(dependent_load_probe_kernel, 128, 256, pdl, stream, scratch);
}

int64_t first_mismatch(const void* a, const void* b, int64_t bytes, void* scratch,
                       cudaStream_t stream) {
  if (bytes <= 0) {
    return -1;
  }
  KDA_CHECK(reinterpret_cast<uintptr_t>(a) % 16 == 0 && reinterpret_cast<uintptr_t>(b) % 16 == 0,
            "first_mismatch: buffers must be 16-byte aligned");
  auto* first = static_cast<unsigned long long*>(scratch);
  KDA_CUDA_CHECK(cudaMemsetAsync(first, 0xff, sizeof(unsigned long long), stream));
  mismatch_kernel<<<grid_for(std::max<int64_t>(bytes / 16, 16)), kThreads, 0, stream>>>(
      static_cast<const uint8_t*>(a), static_cast<const uint8_t*>(b), bytes, first);
  KDA_CUDA_CHECK(cudaGetLastError());
  unsigned long long host = 0;
  KDA_CUDA_CHECK(cudaMemcpyAsync(&host, first, sizeof(host), cudaMemcpyDeviceToHost, stream));
  KDA_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host == ULLONG_MAX ? -1 : static_cast<int64_t>(host);
}

namespace {

/// stats[0] += non-finite elements, stats[1] = max(stats[1], bits of the largest finite |x|):
/// non-negative floats order as their bit patterns.
template <typename T>
__global__ void finite_stats_kernel(const T* x, int64_t n, unsigned long long* stats) {
  unsigned long long bad = 0;
  unsigned int max_bits = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float v;
    if constexpr (sizeof(T) == 2) {
      v = __uint_as_float(static_cast<unsigned int>(x[i].bits) << 16);
    } else {
      v = x[i];
    }
    if (isfinite(v)) {
      max_bits = max(max_bits, __float_as_uint(fabsf(v)));
    } else {
      ++bad;
    }
  }
  if (bad > 0) {
    atomicAdd(stats, bad);
  }
  atomicMax(stats + 1, static_cast<unsigned long long>(max_bits));
}

}  // namespace

FiniteStats finite_stats(const void* x, DType dtype, int64_t n, void* scratch,
                         cudaStream_t stream) {
  KDA_CHECK(dtype == DType::kF32 || dtype == DType::kBF16, "finite_stats: f32 or bf16 only");
  auto* stats = static_cast<unsigned long long*>(scratch);
  KDA_CUDA_CHECK(cudaMemsetAsync(stats, 0, 2 * sizeof(unsigned long long), stream));
  if (n > 0) {
    if (dtype == DType::kF32) {
      finite_stats_kernel<<<grid_for(n), kThreads, 0, stream>>>(static_cast<const float*>(x), n,
                                                                stats);
    } else {
      finite_stats_kernel<<<grid_for(n), kThreads, 0, stream>>>(static_cast<const bf16_t*>(x), n,
                                                                stats);
    }
    KDA_CUDA_CHECK(cudaGetLastError());
  }
  unsigned long long host[2] = {0, 0};
  KDA_CUDA_CHECK(cudaMemcpyAsync(host, stats, sizeof(host), cudaMemcpyDeviceToHost, stream));
  KDA_CUDA_CHECK(cudaStreamSynchronize(stream));
  FiniteStats out;
  out.nonfinite = static_cast<int64_t>(host[0]);
  const auto bits = static_cast<uint32_t>(host[1]);
  static_assert(sizeof(float) == sizeof(uint32_t), "f32 bits");
  std::memcpy(&out.max_abs, &bits, sizeof(float));
  return out;
}

}  // namespace kda::bench
