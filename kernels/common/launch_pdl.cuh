// launch_pdl.cuh: the one way our launchers enqueue a kernel (nvcc translation units only).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "core/cuda_check.h"

namespace kda::kernels {

/// Enqueues kernel<<<grid, block, smem_bytes, stream>>>(args...) through cudaLaunchKernelEx,
/// with programmatic stream serialisation (PDL) when `pdl` is set: the kernel may start while
/// its predecessor in the stream is still running, so it must pdl_wait() before reading what
/// that predecessor wrote (a no-op attribute before sm_90). Launch errors throw kda::Error.
template <typename... KernelArgs, typename... Args>
void launch_pdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem_bytes,
                cudaStream_t stream, bool pdl, const Args&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem_bytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = pdl ? 1 : 0;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  KDA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

}  // namespace kda::kernels
