// invoke.cu: the public CUDA entry points (kernels/kda_kernels.h). Each validates what the
// launch relies on, maps runtime knobs to compile-time configurations and enqueues.
#include <atomic>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "core/error.h"
#include "core/logging.h"
#include "kernels/commit/commit.cuh"
#include "kernels/conv_update/conv_update.cuh"
#include "kernels/kda_kernels.h"
#include "kernels/params/params_check.h"
#include "kernels/verify/per_item.cuh"

// Runtime value -> constexpr, else a precise error naming the knob and the supported set.
#define KDA_DISPATCH_K(k, K_, ...)                                          \
  switch (k) {                                                              \
    case 64: {                                                              \
      constexpr int K_ = 64;                                                \
      __VA_ARGS__ break;                                                    \
    }                                                                       \
    case 128: {                                                             \
      constexpr int K_ = 128;                                               \
      __VA_ARGS__ break;                                                    \
    }                                                                       \
    default:                                                                \
      KDA_FAIL("KDA_DISPATCH_K: head_k_dim K={} unsupported (64, 128)", k); \
  }

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

constexpr int kMaxGridDim = 65535;  ///< gridDim.y / gridDim.z limit (B, HV, layers * HV)

/// Row pitches of the token inputs (qkv, a, b; qkv_act's is D, an int32): the per-item verify
/// kernels hold them in 32 bits and step through a chunk's gate rows with 32-bit offsets
/// (verify_tile.cuh GlobalSource), so kChunk pitches must fit.
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

template <typename F>
void dispatch_weight(ConvWeightType t, F&& f) {
  switch (t) {
    case ConvWeightType::kF32:
      f(float{});
      return;
    case ConvWeightType::kBF16:
      f(bf16_t{});
      return;
  }
  KDA_FAIL("conv weight type {} unsupported (f32, bf16)", static_cast<int>(t));
}

}  // namespace

bool verify_stream_layout_ok(const VerifyParams& p, bool fused) {
  return stream_layout_ok(p, TileConfig<128, 128>::kChunk, fused);
}

// Enqueue only (the invoke_* entry points check first; the combined ones check once for both
// launches).
namespace {
void enqueue_conv_update(const VerifyParams& p, cudaStream_t stream) {
  dispatch_weight(p.conv_weight_type, [&](auto w) { launch_conv_update<decltype(w)>(p, stream); });
}
void enqueue_verify_recurrent(const VerifyParams& p, cudaStream_t stream) {
  const TileArgs args{p, nullptr, 0, {}};  // divisors: set by launch_verify_tile
  KDA_DISPATCH_K(p.K, K, { launch_verify_tile<float, K, kRecurrentBlockV, false>(args, stream); })
}
}  // namespace

void invoke_conv_update(const VerifyParams& p, cudaStream_t stream) {
  check_verify_launch(p, "invoke_conv_update", kConvUpdateNeeds);
  enqueue_conv_update(p, stream);
}

void invoke_verify_unfused(const VerifyParams& p, cudaStream_t stream) {
  // Everything both kernels rely on is checked before the first one is enqueued.
  check_verify_launch(p, "invoke_verify_unfused", kConvUpdateNeeds | kRecurrentNeeds);
  enqueue_conv_update(p, stream);
  enqueue_verify_recurrent(p, stream);
}

void invoke_verify_fused(const VerifyParams& p, int block_v, cudaStream_t stream) {
  check_verify_launch(p, "invoke_verify_fused", kFusedNeeds);
  params::check_fused_shape(p, "invoke_verify_fused");
  params::check_block_v(block_v, "invoke_verify_fused");
  const TileArgs args{p, nullptr, 0, {}};  // divisors: set by launch_verify_tile
  dispatch_weight(p.conv_weight_type, [&](auto w) {
    using W = decltype(w);
    KDA_DISPATCH_K(p.K, K, {
      dispatch_block_v(block_v, [&](auto bv) {
        launch_verify_tile<W, K, decltype(bv)::value, true>(args, stream);
      });
    })
  });
}

void invoke_extend(const ExtendParams& e, cudaStream_t stream) {
  params::check_extend(e, "invoke_extend");
  check_cuda_layout(e.v, "invoke_extend", params::kConv | params::kRecurrence | params::kOut);
  KDA_CHECK(is_aligned(e.ssm_state_out, 16),
            "invoke_extend: ssm_state_out must be 16-byte aligned");
  TileArgs args{e.v, e.ssm_state_out, 1, {}};  // divisors: set by launch_verify_tile
  args.track_slots = e.track_slots;
  args.track_steps = e.track_steps;
  dispatch_weight(e.v.conv_weight_type, [&](auto w) {
    using W = decltype(w);
    if (e.track_steps != nullptr) {
      KDA_DISPATCH_K(e.v.K, K, { launch_extend_tracked<W, K>(args, stream); })
    } else {
      KDA_DISPATCH_K(e.v.K, K, { launch_verify_tile<W, K, kExtendBlockV, true>(args, stream); })
    }
  });
  // After the recurrence: every CTA has read the old conv history by now (stream order).
  launch_conv_state_roll(e, stream);
}

namespace {
/// params::check_commit plus what the CUDA commits rely on: grid limits and float4 state /
/// snapshot copies.
void check_commit_launch(const CommitParams& p, const char* who, uint32_t needs) {
  params::check_commit(p, who, needs);
  KDA_CHECK(p.B <= kMaxGridDim && int64_t{p.num_layers} * p.HV <= kMaxGridDim,
            "{}: B={} and num_layers*HV={}*{} must be <= {} (grid dimensions)", who, p.B,
            p.num_layers, p.HV, kMaxGridDim);
  if ((needs & (params::kFold | params::kSnapshot)) != 0) {
    KDA_CHECK(
        is_aligned(p.ssm_state, 16) && p.ssm_slot_stride % 4 == 0 && p.ssm_layer_stride % 4 == 0,
        "{}: ssm_state must be 16-byte aligned with slot / layer strides multiples of 4", who);
  }
  if ((needs & params::kSnapshot) != 0) {
    KDA_CHECK(is_aligned(p.snapshots, 16) && p.snapshot_row_stride % 4 == 0 &&
                  p.snapshot_layer_stride % 4 == 0,
              "{}: snapshots must be 16-byte aligned with row / layer strides multiples of 4", who);
  }
}

void enqueue_fold(const CommitParams& p, cudaStream_t stream, bool with_conv) {
  KDA_DISPATCH_K(p.K, K, { launch_fold<K>(p, stream, with_conv); })
}
}  // namespace

void invoke_fold(const CommitParams& p, cudaStream_t stream) {
  check_commit_launch(p, "invoke_fold", params::kFold);
  enqueue_fold(p, stream, /*with_conv=*/false);
}

void invoke_commit_snapshot(const CommitParams& p, cudaStream_t stream) {
  check_commit_launch(p, "invoke_commit_snapshot", params::kSnapshot);
  launch_commit_snapshot(p, stream, /*with_conv=*/false);
}

void invoke_commit_conv(const CommitParams& p, cudaStream_t stream) {
  check_commit_launch(p, "invoke_commit_conv", params::kConvCommit);
  launch_commit_conv(p, stream);
}

void invoke_commit(const CommitParams& p, cudaStream_t stream) {
  if (p.token_offsets != nullptr || p.parents != nullptr) {
    // A shaped round (CommitParams::checked_accepted): every check of both stages before the
    // first launch, then stage 1, then the dense commit from the checked lengths.
    check_commit_launch(p, "invoke_commit", params::commit_needs(p));
    KDA_CHECK(p.num_layers <= kMaxGridDim,
              "invoke_commit: num_layers={} must be <= {} (grid dimension)", p.num_layers,
              kMaxGridDim);
    launch_commit_shape(p, stream);
    invoke_commit(params::dense_commit_stage(p), stream);
    return;
  }
  switch (p.kind) {
    case CommitKind::kEager:
      break;
    case CommitKind::kDeferred:  // no state pass: the conv commit records the pending counts
      check_commit_launch(p, "invoke_commit",
                          params::kConvCommit | (p.track_slots != nullptr ? params::kFold : 0u));
      if (p.track_slots != nullptr) {  // the tracks read the cursor before the commit moves it
        KDA_DISPATCH_K(p.K, K, { launch_fold_tracks_deferred<K>(p, stream); })
        launch_commit_track(p, stream);
      }
      launch_commit_conv(p, stream);
      return;
    case CommitKind::kMaterialize:
      check_commit_launch(p, "invoke_commit", params::kFold);
      KDA_DISPATCH_K(p.K, K, { launch_materialize<K>(p, stream); })
      return;
    case CommitKind::kDropPending:
      check_commit_launch(p, "invoke_commit", 0u);
      launch_drop_pending(p, stream);
      return;
  }
  // Both launches' checks before the first is enqueued: an error leaves the state untouched.
  const uint32_t state = p.mode == RecordMode::kRing ? params::kFold : params::kSnapshot;
  check_commit_launch(p, "invoke_commit", state | params::kConvCommit);
  // One launch when the conv commit's offsets allow 16-byte copies (every engine layout we
  // know): the state commit kernel carries it. Otherwise its own launch, after.
  const bool one_launch = conv_commit_vec8(p);
  if (p.mode == RecordMode::kRing) {
    enqueue_fold(p, stream, one_launch);
  } else {
    launch_commit_snapshot(p, stream, one_launch);
  }
  if (!one_launch) {
    launch_commit_conv(p, stream);
  }
  if (p.track_slots != nullptr) {
    launch_commit_track(p, stream);
  }
}

namespace {
std::atomic<bool> g_pdl_enabled{true};
}  // namespace

bool pdl_enabled() { return g_pdl_enabled.load(std::memory_order_relaxed); }
void set_pdl_enabled(bool on) { g_pdl_enabled.store(on, std::memory_order_relaxed); }

}  // namespace kda::kernels
