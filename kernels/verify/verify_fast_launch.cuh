// verify_fast_launch.cuh: launches a kFastChunk plan (verify_plan.h; the kernel:
// verify/fast_item.cuh). Its table: conv weight type x K x the fast tiles (tile_policy.h
// kFastBlockVs) x {dense, ragged rows} x {nothing pending, the lazy history, the pending fold},
// instantiated in
// verify/inst/verify_fast_*.cu; the launcher launches what the plan says and decides nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"
#include "kernels/common/device_caps.h"
#include "kernels/common/launch_pdl.cuh"
#include "kernels/verify/item_args.h"
#include "kernels/verify/tile_policy.h"
#include "kernels/verify/verify_plan.h"
#include "kernels/verify/verify_traits.h"

namespace kda::kernels {

/// Fast-output kernels: 2 conv weight types x 2 K x kFastBlockVs x {dense, ragged} x {nothing
/// pending, the lazy history, the pending fold}.
inline constexpr int kFastVerifyKernelCount = 2 * 2 * 3 * 2 * 3;

/// Launches the fast-output kernel of configuration (W, K, BV) that `plan` names (its features:
/// none, kRaggedRows, kLazyHistory or kDeferredFold, the last two with or without kRaggedRows; a
/// kDeferredFold plan that folds first runs the kernel without pending steps). Enqueues only.
template <typename W, int K, int BV>
void launch_verify_fast(const TileArgs& call, const VerifyPlan& plan, cudaStream_t stream);

#define KDA_VERIFY_FAST_CONFIGS(X, W) \
  X(W, 64, 32) X(W, 64, 64) X(W, 64, 128) X(W, 128, 32) X(W, 128, 64) X(W, 128, 128)
#define KDA_VERIFY_FAST_DECLARE(W, K, BV)                                               \
  extern template void launch_verify_fast<W, K, BV>(const TileArgs&, const VerifyPlan&, \
                                                    cudaStream_t);
KDA_VERIFY_FAST_CONFIGS(KDA_VERIFY_FAST_DECLARE, float)
KDA_VERIFY_FAST_CONFIGS(KDA_VERIFY_FAST_DECLARE, bf16_t)

}  // namespace kda::kernels
