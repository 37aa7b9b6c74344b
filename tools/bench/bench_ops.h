// bench_ops.h: what several kda_bench phases enqueue and check: one verify of a variant, the
// commit's error flag, and the deferred commit's bookkeeping (contract §7) over a Problem.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "kernels/common/launch_utils.h"
#include "kernels/params/kda_params.h"
#include "kernels/verify/verify_plan.h"
#include "tools/bench/bench_args.h"
#include "tools/bench/bench_phases.h"
#include "tools/bench/bench_problem.h"

namespace kda::bench {

/// Enqueues one verify of `v` (fused: tile `bv`).
void enqueue_verify(Variant v, int bv, const VerifyParams& p, cudaStream_t stream,
                    const kernels::LaunchOverrides& launch);

/// The plan of a verify of `v` (fused: tile `bv`) on the current device.
kernels::VerifyPlan planned(Variant v, int bv, const VerifyParams& p,
                            const kernels::LaunchOverrides& launch);
/// The kernel a verify of `v` (fused: tile `bv`) runs, as planned on the current device
/// (kernels::VerifyPlan::kernel).
std::string planned_kernel(Variant v, int bv, const VerifyParams& p,
                           const kernels::LaunchOverrides& launch);
/// The numerics every verify of `params` (one per layer) runs, planned on the current device, and
/// the first layer's kernel. Throws kda::Error(kInternal) when the layers' plans disagree.
struct PlannedLayers {
  VerifyNumerics numerics = VerifyNumerics::kExact;
  std::string kernel;
};
PlannedLayers planned_layers(Variant v, int bv, const std::vector<VerifyParams>& params,
                             const kernels::LaunchOverrides& launch);

/// `p` with numerics `n`.
inline VerifyParams with_numerics(VerifyParams p, VerifyNumerics n) {
  p.numerics = n;
  return p;
}

/// Reads and clears the commit error flag (synchronises); throws kda::Error(kInternal) naming
/// `what` when a commit reported a bad accepted length or track: the bench's own set-up error.
void check_error_flag(const BenchContext& ctx, const Problem& problem, const char* what);

/// The tile of a deferred verify: --block-v when fixed, else the dispatcher's deferred auto tile
/// (kernels::default_deferred_block_v); `eager_bv` for unfused variants.
int deferred_bv(const BenchContext& ctx, Variant v, int T, int B, int eager_bv);

/// A deferred commit's bookkeeping (contract §7) over every slot of a Problem: ring_cursor [S]
/// and ring_pending [layers, S] (layer pitch S), zeroed by reset(), and the u records ring_u
/// [layers, S, HV, L, V] f32 (written by the deferred verifies before any fold reads them).
class DeferredState {
 public:
  /// Zeroed u records, cursors and counts (enqueued on ctx.stream).
  DeferredState(const BenchContext& ctx, const Problem& problem);
  /// Cursors and counts to 0: no slot has anything pending (enqueued on `stream`).
  void reset(cudaStream_t stream) const;
  int32_t* cursor() const { return static_cast<int32_t*>(cursor_.data()); }
  /// Layer `layer`'s counts [S].
  int32_t* pending(int layer) const {
    return static_cast<int32_t*>(pending_.data()) + int64_t{layer} * slots_;
  }
  /// Layer `layer`'s u records [S, HV, L, V] (slot pitch u_slot_stride()).
  float* u(int layer) const {
    return static_cast<float*>(u_.data()) + int64_t{layer} * slots_ * u_slot_;
  }
  int64_t u_slot_stride() const { return u_slot_; }
  /// `p` (a ring-mode verify of layer `layer`) as a deferred verify over these counts.
  /// Layers after the first fold before their PDL wait (VerifyParams::fold_before_wait): a round
  /// or a step verifies its layers in order after the commit, and nothing between two verifies
  /// writes what a fold reads. `u_free`: the u-free deferred commit (VerifyParams::u_free, what
  /// fast outputs need: the plan folds the pending steps first, computing u).
  VerifyParams deferred(VerifyParams p, int layer, bool u_free = false) const;
  /// `p` (a ring-mode commit of every layer) as the kDeferred commit over these counts (`u_free`
  /// as above: its track folds and a materialize compute u).
  CommitParams deferred(CommitParams p, bool u_free = false) const;
  /// `p` (a ring-mode fast verify of layer `layer`) as a lazy verify over these counts (contract
  /// §11: the pending steps its history; no fold, no u records).
  VerifyParams lazy(VerifyParams p, int layer) const;
  /// `p` (a ring-mode commit of every layer) as the kLazy commit over these counts.
  CommitParams lazy(CommitParams p) const;

 private:
  int64_t slots_, u_slot_;
  Buffer cursor_, pending_, u_;
};

}  // namespace kda::bench
