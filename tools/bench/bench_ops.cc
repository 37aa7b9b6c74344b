#include "tools/bench/bench_ops.h"

#include "core/cuda_check.h"
#include "core/error.h"
#include "kernels/kda_kernels.h"
#include "kernels/verify/tile_policy.h"

namespace kda::bench {

void enqueue_verify(Variant v, int bv, const VerifyParams& p, cudaStream_t stream,
                    const kernels::LaunchOverrides& launch) {
  if (variant_is_fused(v)) {
    kernels::invoke_verify_fused(p, bv, stream, launch);
  } else {
    kernels::invoke_verify_unfused(p, stream, launch);
  }
}

kernels::VerifyPlan planned(Variant v, int bv, const VerifyParams& p,
                            const kernels::LaunchOverrides& launch) {
  return kernels::plan_verify_on_device(
      p, variant_is_fused(v) ? VerifyPath::kFused : VerifyPath::kUnfused, bv, launch);
}

std::string planned_kernel(Variant v, int bv, const VerifyParams& p,
                           const kernels::LaunchOverrides& launch) {
  return planned(v, bv, p, launch).kernel();
}

PlannedLayers planned_layers(Variant v, int bv, const std::vector<VerifyParams>& params,
                             const kernels::LaunchOverrides& launch) {
  KDA_CHECK(!params.empty(), "planned_layers: no layers");
  const kernels::VerifyPlan first = planned(v, bv, params.front(), launch);
  for (size_t l = 1; l < params.size(); ++l) {
    const kernels::VerifyPlan plan = planned(v, bv, params[l], launch);
    KDA_CHECK_CODE(plan.numerics == first.numerics, ErrorCode::kInternal,
                   "{} BV={}: layer {} plans {} numerics ({}), layer 0 {} ({})", variant_name(v),
                   bv, l, numerics_name(plan.numerics), plan.kernel(),
                   numerics_name(first.numerics), first.kernel());
  }
  return {first.numerics, first.kernel()};
}

void check_error_flag(const BenchContext& ctx, const Problem& problem, const char* what) {
  const int32_t flag = problem.read_and_clear_error_flag(ctx.stream);
  KDA_CHECK_CODE(flag == 0, ErrorCode::kInternal,
                 "{}: the commit kernels reported an error (flag {}: {} = bad accepted length, {} "
                 "= bad track): the bench set up bad accepted lengths or tracks",
                 what, flag, static_cast<int>(kBadAcceptedLength), static_cast<int>(kBadTrack));
}

int deferred_bv(const BenchContext& ctx, Variant v, int T, int B, int eager_bv) {
  const BenchArgs& a = ctx.args;
  if (!variant_is_fused(v) || a.block_v > 0) {
    return eager_bv;
  }
  return kernels::default_fused_block_v(RecordMode::kRing, B, T, a.shape.HV, a.shape.V, a.sms,
                                        /*deferred=*/true);
}

DeferredState::DeferredState(const BenchContext& ctx, const Problem& problem)
    : slots_(problem.num_slots()),
      u_slot_(int64_t{problem.config().shape.HV} * problem.config().L * problem.config().shape.V),
      cursor_(Device::cuda(ctx.args.device), slots_ * 4),
      pending_(Device::cuda(ctx.args.device), int64_t{ctx.args.layers} * slots_ * 4),
      u_(Device::cuda(ctx.args.device), int64_t{ctx.args.layers} * slots_ * u_slot_ * 4) {
  KDA_CUDA_CHECK(cudaMemsetAsync(u_.data(), 0, static_cast<size_t>(u_.bytes()), ctx.stream));
  reset(ctx.stream);
}

void DeferredState::reset(cudaStream_t stream) const {
  KDA_CUDA_CHECK(cudaMemsetAsync(cursor_.data(), 0, static_cast<size_t>(cursor_.bytes()), stream));
  KDA_CUDA_CHECK(
      cudaMemsetAsync(pending_.data(), 0, static_cast<size_t>(pending_.bytes()), stream));
}

VerifyParams DeferredState::deferred(VerifyParams p, int layer, bool u_free) const {
  p.ring_cursor = cursor();
  p.ring_pending = pending(layer);
  p.ssm_fold_out = const_cast<float*>(p.ssm_state);
  p.ring_u = u(layer);
  p.ring_u_slot_stride = u_slot_;
  p.fold_before_wait = layer > 0 ? 1 : 0;
  p.u_free = u_free ? 1 : 0;
  return p;
}

CommitParams DeferredState::deferred(CommitParams p, bool u_free) const {
  p.kind = CommitKind::kDeferred;
  p.ring_cursor = cursor();
  p.ring_pending = pending(0);
  p.ring_pending_layer_stride = slots_;
  p.ring_u = u(0);
  p.ring_u_layer_stride = slots_ * u_slot_;
  p.ring_u_slot_stride = u_slot_;
  p.u_free = u_free ? 1 : 0;
  return p;
}

VerifyParams DeferredState::lazy(VerifyParams p, int layer) const {
  p.ring_cursor = cursor();
  p.ring_pending = pending(layer);
  p.lazy = 1;
  p.u_free = 1;
  return p;
}

CommitParams DeferredState::lazy(CommitParams p) const {
  p.kind = CommitKind::kLazy;
  p.ring_cursor = cursor();
  p.ring_pending = pending(0);
  p.ring_pending_layer_stride = slots_;
  p.u_free = 1;
  return p;
}

}  // namespace kda::bench
