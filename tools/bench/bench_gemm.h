// bench_gemm.h: the step benchmark's projection GEMMs (contract §6 "step") through cuBLASLt, as an
// engine's linear layer: row-major Y[N, M] = X[N, K] * W[M, K]^T (+ R[N, M]), W stored [out, in]
// (PyTorch's layout), bf16 in and out, fp32 accumulation.
//
// Bitwise repeatable by construction: the algorithm is fixed when the Gemm is made (the
// heuristic's first pick), and no algorithm that reduces split-K partials in place through the
// output is allowed (CUBLASLT_REDUCTION_SCHEME_INPLACE); the step guard replays the GEMM-only step
// and checks it. run() only enqueues (no allocation, no sync): graph-capturable.
// Plain C++ over the cuBLASLt API; needs no device until a Gemm is made.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace kda::bench {

/// Workspace every Gemm may use (one buffer serves all: they run in order on one stream).
constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;

/// RAII cuBLASLt handle of the current device.
class LtHandle {
 public:
  LtHandle();
  ~LtHandle();
  LtHandle(const LtHandle&) = delete;
  LtHandle& operator=(const LtHandle&) = delete;
  cublasLtHandle_t get() const { return handle_; }

 private:
  cublasLtHandle_t handle_ = nullptr;
};

/// The shape of one linear layer call. Leading dimensions in elements, each >= the row length
/// it spans (ld_x >= in, ld_w >= in, ld_y >= out).
struct GemmShape {
  int64_t rows = 0;  ///< N: tokens
  int64_t out = 0;   ///< M: output features
  int64_t in = 0;    ///< K: input features
  int64_t ld_x = 0, ld_w = 0, ld_y = 0;
  bool residual = false;  ///< Y = X W^T + R (R has Y's layout; it may be another buffer)
};

class Gemm {
 public:
  /// Picks and fixes the algorithm; throws kda::Error naming the shape when cuBLASLt has none.
  Gemm(const LtHandle& lt, const GemmShape& shape);
  ~Gemm();
  Gemm(Gemm&& other) noexcept;
  Gemm& operator=(Gemm&&) = delete;
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  /// Enqueues y = x * w^T (+ residual) on `stream`. `workspace`: kGemmWorkspaceBytes of device
  /// memory that no other work on another stream uses meanwhile.
  void run(const bf16_t* x, const bf16_t* w, const bf16_t* residual, bf16_t* y, void* workspace,
           cudaStream_t stream) const;

  const GemmShape& shape() const { return shape_; }
  /// "N x M x K (+R): algo <id>, tile <id>, split-K <n>"
  std::string describe() const;
  /// Flops of one call: 2 * rows * out * in.
  double flops() const { return 2.0 * shape_.rows * shape_.out * shape_.in; }

 private:
  const LtHandle* lt_ = nullptr;
  GemmShape shape_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr;  ///< W as stored: K x M column-major, ld_w
  cublasLtMatrixLayout_t b_ = nullptr;  ///< X: K x N column-major, ld_x
  cublasLtMatrixLayout_t c_ = nullptr;  ///< Y and R: M x N column-major, ld_y
  cublasLtMatmulAlgo_t algo_{};
  std::string describe_;
};

}  // namespace kda::bench
