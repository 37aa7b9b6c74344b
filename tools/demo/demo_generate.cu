// demo_generate.cu: the demo's device-side activation generator (demo_generate.h).
// Grid (chunks, B, 3 tensors), block kThreads: CTA (x, n, t) writes a grid-stride share of
// request n's block of tensor t; every thread derives the block's stream keys itself (one key
// per thread, no shared memory). Writes the three tensors only; reads *round once per thread.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda_check.h"
#include "core/error.h"
#include "tools/demo/demo_generate.h"

namespace kda::demo {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kElemsPerThread = 8;  // grid-stride trips per thread in the largest tensor

__global__ void __launch_bounds__(kThreads)
    fill_activations_kernel(const __grid_constant__ ActivationParams p) {
  const int t = static_cast<int>(blockIdx.z);
  const int32_t n = static_cast<int32_t>(blockIdx.y);
  const int64_t count = int64_t{p.T} * p.row_elems[t];
  bf16_t* dst = p.dst[t] + n * count;
  const BlockStreams s = block_streams(p, t, *p.round, n);
  for (int64_t e = blockIdx.x * int64_t{kThreads} + threadIdx.x; e < count;
       e += int64_t{gridDim.x} * kThreads) {
    dst[e] = block_value(t, s, e);
  }
}

}  // namespace

void fill_activations_cuda(const ActivationParams& p, cudaStream_t stream) {
  KDA_CHECK(p.B >= 1 && p.B <= 65535 && p.T >= 1,
            "fill_activations_cuda: B = {} (expected 1..65535), T = {} (expected >= 1)", p.B, p.T);
  KDA_CHECK(p.round != nullptr, "fill_activations_cuda: no round pointer");
  KDA_CHECK(p.group_size >= 1 && p.first_row >= 0 && p.shared_rows >= 0,
            "fill_activations_cuda: group_size {} (expected >= 1), first_row {}, shared_rows {} "
            "(expected >= 0)",
            p.group_size, p.first_row, p.shared_rows);
  int64_t largest = 0;
  for (int t = 0; t < kActivationTensors; ++t) {
    KDA_CHECK(p.dst[t] != nullptr && p.row_elems[t] >= 1,
              "fill_activations_cuda: tensor {}: dst {}, row_elems {} (expected >= 1)", t,
              static_cast<const void*>(p.dst[t]), p.row_elems[t]);
    largest = std::max(largest, int64_t{p.T} * p.row_elems[t]);
  }
  const int64_t per_cta = kThreads * kElemsPerThread;
  const dim3 grid(
      static_cast<unsigned>(std::min<int64_t>((largest + per_cta - 1) / per_cta, 1 << 20)),
      static_cast<unsigned>(p.B), kActivationTensors);
  fill_activations_kernel<<<grid, kThreads, 0, stream>>>(p);
  KDA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kda::demo
