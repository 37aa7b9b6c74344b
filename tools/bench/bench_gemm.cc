#include "tools/bench/bench_gemm.h"

#include <fmt/format.h>

#include <utility>

#include "core/error.h"

namespace kda::bench {

namespace {

/// Throws kda::Error(kCuda) naming the failed cuBLASLt call and its status.
#define KDA_LT_CHECK(expr)                                                              \
  do {                                                                                  \
    const cublasStatus_t kda_lt_status_ = (expr);                                       \
    if (kda_lt_status_ != CUBLAS_STATUS_SUCCESS) {                                      \
      KDA_THROW(::kda::ErrorCode::kCuda, "cuBLASLt call `{}` failed: status {}", #expr, \
                static_cast<int>(kda_lt_status_));                                      \
    }                                                                                   \
  } while (0)

template <typename T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  KDA_LT_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

template <typename T>
T algo_config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T value{};
  size_t written = 0;
  KDA_LT_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &value, sizeof(value), &written));
  return value;
}

}  // namespace

LtHandle::LtHandle() { KDA_LT_CHECK(cublasLtCreate(&handle_)); }

LtHandle::~LtHandle() {
  if (handle_ != nullptr) {
    cublasLtDestroy(handle_);
  }
}

Gemm::Gemm(const LtHandle& lt, const GemmShape& s) : lt_(&lt), shape_(s) {
  KDA_CHECK(
      s.rows >= 1 && s.out >= 1 && s.in >= 1 && s.ld_x >= s.in && s.ld_w >= s.in && s.ld_y >= s.out,
      "Gemm: bad shape rows={} out={} in={} ld_x={} ld_w={} ld_y={}", s.rows, s.out, s.in, s.ld_x,
      s.ld_w, s.ld_y);
  // Column-major view: Y^T [M, N] = op(W^T as stored [K, M]) * X^T [K, N]; op = transpose.
  KDA_LT_CHECK(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_desc(desc_, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  set_desc(desc_, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  KDA_LT_CHECK(cublasLtMatrixLayoutCreate(&a_, CUDA_R_16BF, static_cast<uint64_t>(s.in),
                                          static_cast<uint64_t>(s.out), s.ld_w));
  KDA_LT_CHECK(cublasLtMatrixLayoutCreate(&b_, CUDA_R_16BF, static_cast<uint64_t>(s.in),
                                          static_cast<uint64_t>(s.rows), s.ld_x));
  KDA_LT_CHECK(cublasLtMatrixLayoutCreate(&c_, CUDA_R_16BF, static_cast<uint64_t>(s.out),
                                          static_cast<uint64_t>(s.rows), s.ld_y));

  cublasLtMatmulPreference_t pref = nullptr;
  KDA_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t workspace = kGemmWorkspaceBytes;
  // Split-K partials reduced in a separate pass over the workspace keep a fixed order; the
  // in-place scheme accumulates through the output and is left out.
  const uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = [&] {
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                &reductions, sizeof(reductions));
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
      st =
          cublasLtMatmulAlgoGetHeuristic(lt.get(), desc_, a_, b_, c_, c_, pref, 1, &result, &found);
    }
    return st;
  }();
  cublasLtMatmulPreferenceDestroy(pref);
  KDA_CHECK_CODE(status == CUBLAS_STATUS_SUCCESS && found > 0, ErrorCode::kUnsupported,
                 "Gemm: cuBLASLt has no algorithm for rows={} out={} in={} (ld_x={} ld_w={} "
                 "ld_y={}; status {}, {} found)",
                 s.rows, s.out, s.in, s.ld_x, s.ld_w, s.ld_y, static_cast<int>(status), found);
  algo_ = result.algo;
  describe_ = fmt::format(
      "{} x {} x {}{}: algo {}, tile {}, split-K {}, workspace {} KiB", s.rows, s.out, s.in,
      s.residual ? " (+R)" : "", algo_config<int32_t>(algo_, CUBLASLT_ALGO_CONFIG_ID),
      algo_config<uint32_t>(algo_, CUBLASLT_ALGO_CONFIG_TILE_ID),
      algo_config<uint32_t>(algo_, CUBLASLT_ALGO_CONFIG_SPLITK_NUM), result.workspaceSize >> 10);
}

Gemm::Gemm(Gemm&& o) noexcept
    : lt_(o.lt_),
      shape_(o.shape_),
      desc_(std::exchange(o.desc_, nullptr)),
      a_(std::exchange(o.a_, nullptr)),
      b_(std::exchange(o.b_, nullptr)),
      c_(std::exchange(o.c_, nullptr)),
      algo_(o.algo_),
      describe_(std::move(o.describe_)) {}

Gemm::~Gemm() {
  for (cublasLtMatrixLayout_t l : {a_, b_, c_}) {
    if (l != nullptr) {
      cublasLtMatrixLayoutDestroy(l);
    }
  }
  if (desc_ != nullptr) {
    cublasLtMatmulDescDestroy(desc_);
  }
}

void Gemm::run(const bf16_t* x, const bf16_t* w, const bf16_t* residual, bf16_t* y, void* workspace,
               cudaStream_t stream) const {
  KDA_CHECK(shape_.residual == (residual != nullptr), "Gemm::run: residual {} for a Gemm made {}",
            residual != nullptr ? "given" : "missing", shape_.residual ? "with one" : "without");
  const float alpha = 1.0f;
  const float beta = shape_.residual ? 1.0f : 0.0f;
  KDA_LT_CHECK(cublasLtMatmul(lt_->get(), desc_, &alpha, w, a_, x, b_, &beta,
                              shape_.residual ? static_cast<const void*>(residual) : y, c_, y, c_,
                              &algo_, workspace, kGemmWorkspaceBytes, stream));
}

std::string Gemm::describe() const { return describe_; }

}  // namespace kda::bench
