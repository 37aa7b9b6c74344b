// cuda_check.h: KDA_CUDA_CHECK for CUDA runtime calls (plain C++; needs cuda_runtime_api.h).
#pragma once

#include <cuda_runtime_api.h>

#include "core/error.h"

/// Throws kda::Error(kCuda) naming the failed expression and the CUDA error.
#define KDA_CUDA_CHECK(expr)                                                               \
  do {                                                                                     \
    const cudaError_t kda_cuda_status_ = (expr);                                           \
    if (kda_cuda_status_ != cudaSuccess) {                                                 \
      KDA_THROW(::kda::ErrorCode::kCuda, "CUDA call `{}` failed: {} ({})", #expr,          \
                cudaGetErrorName(kda_cuda_status_), cudaGetErrorString(kda_cuda_status_)); \
    }                                                                                      \
  } while (0)
