// fast_launch_impl.cuh: the definition of launch_verify_fast (verify_fast_launch.cuh), included
// by the instantiation files alone.
#pragma once

#include "kernels/common/fast_divisor.h"
#include "kernels/verify/fast_item.cuh"
#include "kernels/verify/fast_walk.cuh"
#include "kernels/verify/verify_fast_launch.cuh"

namespace kda::kernels {

template <typename W, int K, int BV>
void launch_verify_fast(const TileArgs& call, const VerifyPlan& plan, cudaStream_t stream) {
  const VerifyParams& p = call.p;
  TileArgs args = call;
  args.div = item_divisors(p, BV);
  args.trigger_at_entry = 0;
  args.stagger_tiles = plan.stagger_tiles ? 1 : 0;
  using Smem = FastSmem<K, BV>;
  // A CTA per item (grid == items), or the resident CTAs walking the items (fast_walk.cuh).
  const bool walk = plan.grid < plan.items;
  auto launch = [&](auto* kernel) {
    // Raises the kernel's dynamic shared-memory limit to its largest call and asks for the
    // largest carveout, so two CTAs of a call reside per SM (__launch_bounds__; cached per device).
    const size_t most = walk ? FastWalkSmem<K, BV>::kBytes : Smem::fold_bytes(kFastMaxTokens);
    persistent_ctas_per_sm(reinterpret_cast<const void*>(kernel), 256, most,
                           /*max_shared_carveout=*/true);
    if (walk) {
      launch_pdl(kernel, dim3(static_cast<unsigned>(plan.grid)), dim3(256), most, stream, plan.pdl,
                 args);
      return;
    }
    // A lazy call's chunk holds up to L tokens (its history and its draft); a call folding its
    // pending steps in the kernel holds their records in the operand rows' space.
    const int tokens = (plan.features & kLazyHistory) != 0 ? p.L : p.T;
    const bool folds = (plan.features & kDeferredFold) != 0 && !plan.pending_fold_first;
    const dim3 grid(static_cast<unsigned>(ceil_div(p.V, BV)), static_cast<unsigned>(p.HV),
                    static_cast<unsigned>(p.B));
    launch_pdl(kernel, grid, dim3(256), folds ? Smem::fold_bytes(tokens) : Smem::bytes(tokens),
               stream, plan.pdl, args);
  };
  using Dense = VerifyTraits<W, K, BV, VerifyPath::kFused, VerifySchedule::kFastChunk, kNoFeatures>;
  using Ragged =
      VerifyTraits<W, K, BV, VerifyPath::kFused, VerifySchedule::kFastChunk, kRaggedRows>;
  constexpr VerifyFeatures kLazyRagged = kLazyHistory | kRaggedRows;
  constexpr VerifyFeatures kDeferredRagged = kDeferredFold | kRaggedRows;
  // A deferred plan folds its pending steps in the kernel unless they were folded first.
  if ((plan.features & kDeferredFold) != 0 && !plan.pending_fold_first) {
    KDA_CHECK(!walk, "launch_verify_fast: a call folding its pending steps does not walk ({})",
              plan.kernel());
    if ((plan.features & kRaggedRows) != 0) {
      launch(&verify_fast_kernel<VerifyTraits<W, K, BV, VerifyPath::kFused,
                                              VerifySchedule::kFastChunk, kDeferredRagged>>);
    } else {
      launch(&verify_fast_kernel<VerifyTraits<W, K, BV, VerifyPath::kFused,
                                              VerifySchedule::kFastChunk, kDeferredFold>>);
    }
  } else if ((plan.features & kLazyHistory) != 0) {
    KDA_CHECK(!walk, "launch_verify_fast: a lazy call does not walk ({})", plan.kernel());
    if ((plan.features & kRaggedRows) != 0) {
      launch(&verify_fast_kernel<
             VerifyTraits<W, K, BV, VerifyPath::kFused, VerifySchedule::kFastChunk, kLazyRagged>>);
    } else {
      launch(&verify_fast_kernel<
             VerifyTraits<W, K, BV, VerifyPath::kFused, VerifySchedule::kFastChunk, kLazyHistory>>);
    }
  } else if ((plan.features & kRaggedRows) != 0) {
    if (walk) {
      launch(&verify_fast_walk_kernel<Ragged>);
    } else {
      launch(&verify_fast_kernel<Ragged>);
    }
  } else if (walk) {
    launch(&verify_fast_walk_kernel<Dense>);
  } else {
    launch(&verify_fast_kernel<Dense>);
  }
}

#define KDA_VERIFY_FAST_DEFINE(W, K, BV) \
  template void launch_verify_fast<W, K, BV>(const TileArgs&, const VerifyPlan&, cudaStream_t);

}  // namespace kda::kernels
