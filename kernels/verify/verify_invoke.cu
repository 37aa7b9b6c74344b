// verify_invoke.cu: the verify family's entry points (kernels/kda_kernels.h): the conv update,
// the verify (plan, validate, launch the plan) and extend. Each validates what the launch relies
// on before anything is enqueued, then launches what the plan says.
#include <cstdint>
#include <type_traits>
#include <utility>

#include "core/error.h"
#include "kernels/commit/commit.cuh"
#include "kernels/common/device_caps.h"
#include "kernels/common/dispatch.h"
#include "kernels/conv_update/conv_update.cuh"
#include "kernels/kda_kernels.h"
#include "kernels/params/params_check.h"
#include "kernels/verify/verify_fast_launch.cuh"
#include "kernels/verify/verify_launch.cuh"

namespace kda::kernels {

namespace {

/// Runs f(std::integral_constant<int, BV>) for the fused tile block_v (checked by the caller:
/// params::check_block_v).
template <typename F, int... BVs>
void dispatch_block_v(int block_v, F&& f, std::integer_sequence<int, BVs...>) {
  (void)((block_v == BVs ? (f(std::integral_constant<int, BVs>{}), true) : false) || ...);
}
template <typename F>
void dispatch_block_v(int block_v, F&& f) {
  dispatch_block_v(block_v, std::forward<F>(f), FusedBlockVSeq{});
}

/// Runs f(std::integral_constant<int, BV>) for the fast tile block_v (kFastBlockVs); false if
/// block_v is none of them.
template <typename F>
bool dispatch_fast_block_v(int block_v, F&& f) {
  switch (block_v) {
    case 32:
      f(std::integral_constant<int, 32>{});
      return true;
    case 64:
      f(std::integral_constant<int, 64>{});
      return true;
    case 128:
      f(std::integral_constant<int, 128>{});
      return true;
    default:
      return false;
  }
}

/// Runs f(WeightT{}, K constant, BV constant, PATH constant) for the plan's configuration.
template <typename F>
void dispatch_config(const VerifyPlan& plan, F&& f) {
  if (plan.path == VerifyPath::kUnfused) {
    KDA_DISPATCH_K(plan.K, K, {
      f(float{}, std::integral_constant<int, K>{}, std::integral_constant<int, kRecurrentBlockV>{},
        std::integral_constant<VerifyPath, VerifyPath::kUnfused>{});
    })
    return;
  }
  dispatch_weight(plan.weight, [&](auto w) {
    KDA_DISPATCH_K(plan.K, K, {
      dispatch_block_v(plan.block_v, [&](auto bv) {
        f(w, std::integral_constant<int, K>{}, bv,
          std::integral_constant<VerifyPath, VerifyPath::kFused>{});
      });
    })
  });
}

constexpr int kMaxGridDim = 65535;  ///< gridDim.y / gridDim.z limit (B, HV, layers * HV)

/// Row pitches of the token inputs (qkv, a, b; qkv_act's is D, an int32): the per-item verify
/// kernels hold them in 32 bits and step through a chunk's gate rows with 32-bit offsets
/// (verify/per_item.cuh GlobalSource), so kChunk pitches must fit.
constexpr int64_t kMaxRowPitch = int64_t{1} << 28;

void check_row_pitch(int64_t pitch, const char* who, const char* name) {
  KDA_CHECK(pitch < kMaxRowPitch,
            "{}: {}={} is too large, the CUDA kernels need token row pitches below 2^28 elements",
            who, name, pitch);
}

/// What a CUDA verify / extend launch relies on beyond the structural checks
/// (params::check_verify): grid limits, and the alignment of its vector accesses. Channels
/// move in pairs (bf16x2), so V is even, bf16 bases are 4-byte aligned and bf16 pitches even;
/// f32 conv weights are one float4 per channel; state and snapshots move as float4.
void check_cuda_layout(const VerifyParams& p, const char* who, uint32_t needs) {
  KDA_CHECK(p.B <= kMaxGridDim && p.HV <= kMaxGridDim,
            "{}: B={} and HV={} must be <= {} (grid dimensions)", who, p.B, p.HV, kMaxGridDim);
  KDA_CHECK(p.V % 2 == 0, "{}: V={} must be even on CUDA (bf16 channel pairs)", who, p.V);
  if ((needs & params::kOut) != 0) {
    const int64_t out_elems = int64_t{p.B} * p.T * p.HV * p.V;
    KDA_CHECK(out_elems < (int64_t{1} << 31),
              "{}: out has B*T*HV*V = {} elements, the CUDA kernels index it in 32 bits (< 2^31)",
              who, out_elems);
  }
  if ((needs & params::kConv) != 0) {
    check_row_pitch(p.mixed_qkv_stride, who, "mixed_qkv_stride");
    KDA_CHECK(p.conv_weight_type != ConvWeightType::kF32 || is_aligned(p.conv_weight, 16),
              "{}: f32 conv_weight must be 16-byte aligned (one float4 per channel)", who);
    KDA_CHECK(is_aligned(p.mixed_qkv, 4) && p.mixed_qkv_stride % 2 == 0,
              "{}: mixed_qkv must be 4-byte aligned with an even mixed_qkv_stride, got "
              "mixed_qkv_stride={}",
              who, p.mixed_qkv_stride);
    KDA_CHECK(is_aligned(p.conv_state, 4) && p.conv_state_slot_stride % 2 == 0,
              "{}: conv_state must be 4-byte aligned with an even conv_state_slot_stride, got {}",
              who, p.conv_state_slot_stride);
  }
  if ((needs & params::kWindows) != 0) {
    KDA_CHECK(is_aligned(p.conv_window, 4) && p.conv_window_row_stride % 2 == 0,
              "{}: conv_window must be 4-byte aligned with an even conv_window_row_stride, got {}",
              who, p.conv_window_row_stride);
  }
  if ((needs & params::kAct) != 0) {
    KDA_CHECK(is_aligned(p.qkv_act, 4), "{}: qkv_act must be 4-byte aligned", who);
  }
  if ((needs & params::kRecurrence) != 0) {
    check_row_pitch(p.a_stride, who, "a_stride");
    check_row_pitch(p.b_stride, who, "b_stride");
    KDA_CHECK(is_aligned(p.ssm_state, 16) && p.ssm_slot_stride % 4 == 0,
              "{}: ssm_state must be 16-byte aligned with ssm_slot_stride a multiple of 4, got {}",
              who, p.ssm_slot_stride);
  }
  if ((needs & params::kRecords) != 0 && p.mode == RecordMode::kSnapshot) {
    KDA_CHECK(is_aligned(p.snapshots, 16) && p.snapshot_row_stride % 4 == 0,
              "{}: snapshots must be 16-byte aligned with snapshot_row_stride a multiple of 4, "
              "got {}",
              who, p.snapshot_row_stride);
  }
  if ((needs & params::kRecords) != 0 && p.mode == RecordMode::kRing) {
    KDA_CHECK(is_aligned(p.ring_rawv, 4) && is_aligned(p.ring_rawk, 4) &&
                  p.ring_rawv_slot_stride % 2 == 0 && p.ring_rawk_slot_stride % 2 == 0,
              "{}: ring_rawk / ring_rawv must be 4-byte aligned with even slot strides", who);
  }
}

void check_verify_launch(const VerifyParams& p, const char* who, uint32_t needs) {
  params::check_verify(p, who, needs);
  check_cuda_layout(p, who, needs);
}

// What each entry point reads or writes (params::VerifyNeeds).
constexpr uint32_t kConvUpdateNeeds = params::kConv | params::kWindows | params::kAct;
constexpr uint32_t kRecurrentNeeds =
    params::kAct | params::kRecurrence | params::kOut | params::kRecords;
constexpr uint32_t kFusedNeeds =
    params::kConv | params::kWindows | params::kRecurrence | params::kOut | params::kRecords;

void enqueue_conv_update(const VerifyParams& p, cudaStream_t stream, bool pdl) {
  dispatch_weight(p.conv_weight_type,
                  [&](auto w) { launch_conv_update<decltype(w)>(p, stream, pdl); });
}

/// The plan's kernel with `args` (launch_verify of its configuration).
void enqueue_plan(const TileArgs& args, const VerifyPlan& plan, cudaStream_t stream) {
  if (plan.schedule == VerifySchedule::kFastChunk) {
    bool launched = false;
    dispatch_weight(plan.weight, [&](auto w) {
      using W = decltype(w);
      KDA_DISPATCH_K(plan.K, K, {
        launched = dispatch_fast_block_v(plan.block_v, [&](auto bv) {
          launch_verify_fast<W, K, decltype(bv)::value>(args, plan, stream);
        });
      })
    });
    KDA_CHECK(launched, "enqueue_plan: no fast-output kernel for the plan {}", plan.kernel());
    return;
  }
  dispatch_config(plan, [&](auto w, auto k, auto bv, auto path) {
    launch_verify<decltype(w), decltype(k)::value, decltype(bv)::value, decltype(path)::value>(
        args, plan, stream);
  });
}

/// plan_verify with the current device's caps and the persistent kernel's occupancy.
VerifyPlan plan_on_device(const VerifyParams& p, VerifyPath path, int block_v,
                          const LaunchOverrides& o, bool extend, bool tracked) {
  const DeviceCaps caps = device_caps();
  int occupancy = 0;
  const VerifyFeatures features = verify_features(p, extend && tracked);
  const bool may_persist = !extend && caps.sm_major >= 9 &&
                           o.persistent != PersistentMode::kNever &&
                           (path == VerifyPath::kUnfused || block_v == 128);
  if (may_persist) {
    VerifyPlan config;
    config.path = path;
    config.weight = path == VerifyPath::kFused ? p.conv_weight_type : ConvWeightType::kF32;
    config.K = p.K;
    config.block_v = path == VerifyPath::kFused ? block_v : kRecurrentBlockV;
    dispatch_config(config, [&](auto w, auto k, auto bv, auto pa) {
      occupancy = persistent_occupancy<decltype(w), decltype(k)::value, decltype(bv)::value,
                                       decltype(pa)::value>(p.mode, features);
    });
  }
  return plan_verify(p, path, block_v, caps, o, occupancy, extend, tracked);
}

/// `plan` is the plan of a call of `p`: the same instantiation, tile and items (a plan made for
/// another call would launch the wrong kernel or grid).
void check_plan(const VerifyParams& p, const VerifyPlan& plan, const char* who) {
  const bool fused = plan.path == VerifyPath::kFused;
  const bool persistent_snapshot = plan.schedule == VerifySchedule::kPersistentSnapshot;
  const VerifyFeatures want =
      persistent_snapshot ? kNoFeatures : verify_features(p, (plan.features & kExtendTracks) != 0);
  // A u-free deferred call folds its pending steps first, or (a fast plan with a CTA per item)
  // in its kernel.
  const bool u_free_pending = p.ring_pending != nullptr && p.u_free != 0 && !is_lazy_verify(p);
  const bool fast_per_item = plan.schedule == VerifySchedule::kFastChunk && plan.grid == plan.items;
  KDA_CHECK(plan.K == p.K && plan.weight == (fused ? p.conv_weight_type : ConvWeightType::kF32) &&
                plan.features == want && plan.items == ceil_div(p.V, plan.block_v) * p.HV * p.B &&
                (plan.pending_fold_first == u_free_pending ||
                 (fast_per_item && u_free_pending && !plan.pending_fold_first)) &&
                (fused || plan.block_v == kRecurrentBlockV),
            "{}: the plan ({}) is not this call's (K={}, HV={}, V={}, B={}): plan each call with "
            "plan_verify_on_device",
            who, plan.kernel(), p.K, p.HV, p.V, p.B);
  const bool walks = is_persistent(plan.schedule) ||
                     (plan.schedule == VerifySchedule::kFastChunk && fast_walk_possible(p));
  KDA_CHECK(walks ? (plan.grid >= 1 && plan.grid <= plan.items) : plan.grid == plan.items,
            "{}: the plan {} needs {} CTAs, got {}", who, plan.kernel(),
            walks ? fmt::format("1..{}", plan.items) : fmt::format("{}", plan.items), plan.grid);
  const bool folds_in_kernel = (plan.features & kDeferredFold) != 0 && !plan.pending_fold_first;
  KDA_CHECK(!plan.stagger_tiles ||
                (fast_per_item && (plan.features & kLazyHistory) == 0 && !folds_in_kernel),
            "{}: the plan {} staggers its tiles, which only a fast-output plan with a CTA per "
            "item, neither lazy nor folding pending steps in its kernel (schedule fast-chunk, "
            "grid == items) does; it has schedule {}, {} of {} CTAs{}",
            who, plan.kernel(), verify_schedule_name(plan.schedule), plan.grid, plan.items,
            (plan.features & kLazyHistory) != 0 ? ", lazy"
            : folds_in_kernel                   ? ", folding pending steps"
                                                : "");
}

}  // namespace

void invoke_conv_update(const VerifyParams& p, cudaStream_t stream, const LaunchOverrides& o) {
  check_verify_launch(p, "invoke_conv_update", kConvUpdateNeeds);
  enqueue_conv_update(p, stream, o.pdl);
}

VerifyPlan plan_verify_on_device(const VerifyParams& p, VerifyPath path, int block_v,
                                 const LaunchOverrides& o) {
  KDA_CHECK(p.K == 64 || p.K == 128, "plan_verify_on_device: head_k_dim K={} unsupported (64, 128)",
            p.K);
  if (path == VerifyPath::kFused) {
    params::check_block_v(block_v, "plan_verify_on_device");
  }
  // A lazy call plans its fast kernel here (the tests and the benchmark run it); the CUDA kernel
  // set offers the lazy write-back to the backend and the ops only once it has been measured
  // (CudaKernelSet::runs_lazy_write_back).
  const VerifyPlan plan = plan_on_device(p, path, block_v, o, /*extend=*/false, /*tracked=*/false);
  check_lazy_plan(p, plan, "plan_verify_on_device");
  return plan;
}

void invoke_verify(const VerifyParams& p, const VerifyPlan& plan, cudaStream_t stream) {
  const bool fused = plan.path == VerifyPath::kFused;
  const char* who = fused ? "invoke_verify (fused)" : "invoke_verify (unfused)";
  KDA_CHECK(!plan.extend, "{}: an extend plan (invoke_extend runs it)", who);
  // Everything both unfused kernels rely on is checked before the first one is enqueued.
  check_verify_launch(p, who, fused ? kFusedNeeds : kConvUpdateNeeds | kRecurrentNeeds);
  if (fused) {
    params::check_fused_shape(p, who);
    params::check_block_v(plan.block_v, who);
  }
  check_plan(p, plan, who);
  VerifyParams run = p;
  if (plan.pending_fold_first) {
    // The u-free deferred commit: the pending steps folded into the committed state first (their
    // u computed as an eager fold computes it), then the planned kernel as without pending steps.
    LaunchOverrides fold_o;
    fold_o.pdl = plan.pdl;
    KDA_DISPATCH_K(p.K, K, { launch_verify_pending_fold<K>(p, stream, fold_o); })
    run.ring_pending = nullptr;
    run.ssm_fold_out = nullptr;
    run.fold_before_wait = 0;
  }
  if (!fused) {
    enqueue_conv_update(run, stream, plan.pdl);
  }
  enqueue_plan(TileArgs{run, nullptr, 0, {}}, plan, stream);
}

void invoke_verify_unfused(const VerifyParams& p, cudaStream_t stream, const LaunchOverrides& o) {
  check_verify_launch(p, "invoke_verify_unfused", kConvUpdateNeeds | kRecurrentNeeds);
  invoke_verify(p, plan_on_device(p, VerifyPath::kUnfused, 0, o, false, false), stream);
}

void invoke_verify_fused(const VerifyParams& p, int block_v, cudaStream_t stream,
                         const LaunchOverrides& o) {
  check_verify_launch(p, "invoke_verify_fused", kFusedNeeds);
  params::check_fused_shape(p, "invoke_verify_fused");
  params::check_block_v(block_v, "invoke_verify_fused");
  invoke_verify(p, plan_on_device(p, VerifyPath::kFused, block_v, o, false, false), stream);
}

void invoke_extend(const ExtendParams& e, cudaStream_t stream, const LaunchOverrides& o) {
  params::check_extend(e, "invoke_extend");
  const VerifyParams v = verify_view(e);
  check_cuda_layout(v, "invoke_extend", params::kConv | params::kRecurrence | params::kOut);
  KDA_CHECK(is_aligned(e.ssm_state_out, 16),
            "invoke_extend: ssm_state_out must be 16-byte aligned");
  const bool tracked = e.track_steps != nullptr;
  const VerifyPlan plan =
      plan_on_device(v, VerifyPath::kFused, kExtendBlockV, o, /*extend=*/true, tracked);
  TileArgs args{v, e.ssm_state_out, 1, {}};  // divisors and trigger: set by launch_verify
  args.track_slots = e.track_slots;
  args.track_steps = e.track_steps;
  enqueue_plan(args, plan, stream);
  // After the recurrence: every CTA has read the old conv history by now (stream order).
  launch_conv_state_roll(e, stream, o.pdl);
}

}  // namespace kda::kernels
