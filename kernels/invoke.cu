// invoke.cu: the public CUDA entry points (kernels/kda_kernels.h). Each validates what the
// launch relies on, maps runtime knobs to compile-time configurations and enqueues.
#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "core/logging.h"
#include "kernels/commit.cuh"
#include "kernels/conv_update.cuh"
#include "kernels/kda_kernels.h"
#include "kernels/verify_tile.cuh"

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

#define KDA_DISPATCH_BV(bv, BV_, ...)                                               \
  switch (bv) {                                                                     \
    case 8: {                                                                       \
      constexpr int BV_ = 8;                                                        \
      __VA_ARGS__ break;                                                            \
    }                                                                               \
    case 16: {                                                                      \
      constexpr int BV_ = 16;                                                       \
      __VA_ARGS__ break;                                                            \
    }                                                                               \
    case 32: {                                                                      \
      constexpr int BV_ = 32;                                                       \
      __VA_ARGS__ break;                                                            \
    }                                                                               \
    case 64: {                                                                      \
      constexpr int BV_ = 64;                                                       \
      __VA_ARGS__ break;                                                            \
    }                                                                               \
    case 128: {                                                                     \
      constexpr int BV_ = 128;                                                      \
      __VA_ARGS__ break;                                                            \
    }                                                                               \
    default:                                                                        \
      KDA_FAIL("KDA_DISPATCH_BV: block_v={} unsupported (8, 16, 32, 64, 128)", bv); \
  }

namespace kda::kernels {

namespace {

bool aligned(const void* ptr, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(bytes) == 0;
}

/// What the verify/extend tile relies on (the backend validates tensors before this).
void check_problem(const VerifyParams& p, const char* who) {
  KDA_CHECK(p.K == 64 || p.K == 128, "{}: K (head_k_dim) must be 64 or 128, got {}", who, p.K);
  KDA_CHECK(p.H >= 1 && p.HV >= p.H && p.HV % p.H == 0,
            "{}: HV must be a positive multiple of H, got H={} HV={}", who, p.H, p.HV);
  KDA_CHECK(p.V >= 1, "{}: V (head_v_dim) must be >= 1, got {}", who, p.V);
  KDA_CHECK(p.B >= 1 && p.B <= 65535, "{}: B must be in [1, 65535], got {}", who, p.B);
  KDA_CHECK(p.HV <= 65535, "{}: HV must be <= 65535, got {}", who, p.HV);
  KDA_CHECK(p.T >= 1, "{}: T must be >= 1, got {}", who, p.T);
  KDA_CHECK(
      p.gate == GateKind::kStandard ||
          (p.gate == GateKind::kSafe && std::isfinite(p.lower_bound) && p.lower_bound != 0.0f),
      "{}: safe gate lower_bound={} must be finite and non-zero", who, p.lower_bound);
  const int64_t D = qkv_dim(p);
  KDA_CHECK(p.qkv != nullptr && p.a != nullptr && p.b != nullptr, "{}: qkv, a and b are required",
            who);
  KDA_CHECK(p.qkv_stride >= D, "{}: qkv row stride must be >= D={}, got {}", who, D, p.qkv_stride);
  KDA_CHECK(p.a_stride >= static_cast<int64_t>(p.HV) * p.K,
            "{}: a row stride must be >= HV*K={}, got {}", who, int64_t{p.HV} * p.K, p.a_stride);
  KDA_CHECK(p.b_stride >= p.HV, "{}: b row stride must be >= HV={}, got {}", who, p.HV, p.b_stride);
  KDA_CHECK(p.A_log != nullptr && p.dt_bias != nullptr, "{}: A_log and dt_bias are required", who);
  KDA_CHECK(p.conv_weight != nullptr && p.conv_state != nullptr && p.ssm_state != nullptr,
            "{}: conv_weight, conv_state and ssm_state are required", who);
  KDA_CHECK(p.conv_weight_type != ConvWeightType::kF32 || aligned(p.conv_weight, 16),
            "{}: f32 conv_weight must be 16-byte aligned (one float4 per channel)", who);
  KDA_CHECK(aligned(p.ssm_state, 16) && p.ssm_slot_stride % 4 == 0,
            "{}: ssm_state must be 16-byte aligned with a slot stride multiple of 4, got "
            "stride {}",
            who, p.ssm_slot_stride);
  KDA_CHECK(p.conv_state_slot_stride >= 3 * D,
            "{}: conv_state slot stride must be >= (W-1)*D={}, got {}", who, 3 * D,
            p.conv_state_slot_stride);
  KDA_CHECK(p.ssm_slot_stride >= static_cast<int64_t>(p.HV) * p.V * p.K,
            "{}: ssm_state slot stride must be >= HV*V*K={}, got {}", who,
            int64_t{p.HV} * p.V * p.K, p.ssm_slot_stride);
  KDA_CHECK(p.slots != nullptr && p.out != nullptr, "{}: slots and out are required", who);
  // The tile moves two adjacent channels per thread (bf16x2): pairs must stay 4-byte aligned.
  KDA_CHECK(p.V % 2 == 0, "{}: V (head_v_dim) must be even on CUDA (bf16 channel pairs), got {}",
            who, p.V);
  KDA_CHECK(aligned(p.qkv, 4) && p.qkv_stride % 2 == 0,
            "{}: mixed_qkv must be 4-byte aligned with an even row stride, got stride {}", who,
            p.qkv_stride);
  KDA_CHECK(aligned(p.conv_state, 4) && p.conv_state_slot_stride % 2 == 0,
            "{}: conv_state must be 4-byte aligned with an even slot stride, got stride {}", who,
            p.conv_state_slot_stride);
}

/// What verify adds: records and scratch.
void check_verify(const VerifyParams& p, const char* who) {
  check_problem(p, who);
  const int64_t D = qkv_dim(p);
  KDA_CHECK(p.T <= p.T_alloc, "{}: T={} exceeds the scratch step pitch T_alloc={}", who, p.T,
            p.T_alloc);
  KDA_CHECK(p.rows != nullptr && p.conv_window != nullptr,
            "{}: rows and conv_window are required for verify", who);
  KDA_CHECK(p.conv_window_row_stride >= int64_t{p.T_alloc} * 3 * D,
            "{}: conv_window row stride must be >= T_alloc*(W-1)*D={}, got {}", who,
            int64_t{p.T_alloc} * 3 * D, p.conv_window_row_stride);
  KDA_CHECK(aligned(p.conv_window, 4) && p.conv_window_row_stride % 2 == 0,
            "{}: conv_window must be 4-byte aligned with an even row stride", who);
  if (p.mode == RecordMode::kSnapshot) {
    KDA_CHECK(p.snapshots != nullptr, "{}: snapshot mode needs snapshots", who);
    KDA_CHECK(aligned(p.snapshots, 16) && p.snapshot_row_stride % 4 == 0,
              "{}: snapshots must be 16-byte aligned with a row stride multiple of 4", who);
    KDA_CHECK(p.snapshot_row_stride >= int64_t{p.T_alloc} * p.HV * p.V * p.K,
              "{}: snapshot row stride must be >= T_alloc*HV*V*K, got {}", who,
              p.snapshot_row_stride);
  } else {
    KDA_CHECK(p.ring_rawv != nullptr && p.ring_rawk != nullptr && p.ring_g != nullptr &&
                  p.ring_beta != nullptr,
              "{}: ring mode needs all four rings (rawv, rawk, g, beta)", who);
    KDA_CHECK(p.L >= 1 && (p.L & (p.L - 1)) == 0,
              "{}: ring length L must be a power of two, got {}", who, p.L);
    KDA_CHECK(aligned(p.ring_rawv, 4) && aligned(p.ring_rawk, 4) &&
                  p.ring_rawv_slot_stride % 2 == 0 && p.ring_rawk_slot_stride % 2 == 0,
              "{}: ring rawk/rawv must be 4-byte aligned with even slot strides", who);
  }
}

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

bool is_supported_block_v(int bv) {
  for (int v : kFusedBlockVs) {
    if (v == bv) {
      return true;
    }
  }
  return false;
}

bool verify_stream_layout_ok(const VerifyParams& p, bool fused) {
  return stream_layout_ok(p, TileConfig<128, 128>::kChunk, fused);
}

void invoke_conv_update(const VerifyParams& p, cudaStream_t stream) {
  check_verify(p, "invoke_conv_update");
  KDA_CHECK(p.qkv_act != nullptr && aligned(p.qkv_act, 4),
            "invoke_conv_update: qkv_act scratch is required (4-byte aligned)");
  dispatch_weight(p.conv_weight_type, [&](auto w) { launch_conv_update<decltype(w)>(p, stream); });
}

void invoke_verify_recurrent(const VerifyParams& p, cudaStream_t stream) {
  check_verify(p, "invoke_verify_recurrent");
  KDA_CHECK(p.qkv_act != nullptr, "invoke_verify_recurrent: qkv_act is required");
  const TileArgs args{p, nullptr, 0};
  KDA_DISPATCH_K(p.K, K, { launch_verify_tile<float, K, kRecurrentBlockV, false>(args, stream); })
}

void invoke_verify_unfused(const VerifyParams& p, cudaStream_t stream) {
  // Everything both kernels rely on is checked before the first one is enqueued.
  check_verify(p, "invoke_verify_unfused");
  KDA_CHECK(p.qkv_act != nullptr && aligned(p.qkv_act, 4),
            "invoke_verify_unfused: qkv_act scratch is required (4-byte aligned)");
  invoke_conv_update(p, stream);
  invoke_verify_recurrent(p, stream);
}

void invoke_verify_fused(const VerifyParams& p, int block_v, cudaStream_t stream) {
  check_verify(p, "invoke_verify_fused");
  const TileArgs args{p, nullptr, 0};
  dispatch_weight(p.conv_weight_type, [&](auto w) {
    using W = decltype(w);
    KDA_DISPATCH_K(
        p.K, K,
        {KDA_DISPATCH_BV(block_v, BV, { launch_verify_tile<W, K, BV, true>(args, stream); })})
  });
}

void invoke_extend(const ExtendParams& e, cudaStream_t stream) {
  check_problem(e.v, "invoke_extend");
  KDA_CHECK(e.ssm_state_out != nullptr && e.conv_state_out != nullptr,
            "invoke_extend: ssm_state_out and conv_state_out are required");
  KDA_CHECK(aligned(e.ssm_state_out, 16), "invoke_extend: ssm_state_out must be 16-byte aligned");
  const TileArgs args{e.v, e.ssm_state_out, 1};
  constexpr int kExtendBlockV = 32;
  dispatch_weight(e.v.conv_weight_type, [&](auto w) {
    using W = decltype(w);
    KDA_DISPATCH_K(e.v.K, K, { launch_verify_tile<W, K, kExtendBlockV, true>(args, stream); })
  });
  // After the recurrence: every CTA has read the old conv history by now (stream order).
  launch_conv_state_roll(e, stream);
}

namespace {
void check_commit(const CommitParams& p, const char* who) {
  KDA_CHECK(p.num_layers >= 1 && p.num_layers * int64_t{p.HV} <= 65535,
            "{}: num_layers*HV must be in [1, 65535], got {}*{}", who, p.num_layers, p.HV);
  KDA_CHECK(p.B >= 1 && p.B <= 65535, "{}: B must be in [1, 65535], got {}", who, p.B);
  KDA_CHECK(p.T >= 1 && p.T <= p.T_alloc, "{}: T must be in [1, T_alloc={}], got {}", who,
            p.T_alloc, p.T);
  KDA_CHECK(p.K == 64 || p.K == 128, "{}: K must be 64 or 128, got {}", who, p.K);
  KDA_CHECK(p.H >= 1 && p.HV % p.H == 0, "{}: HV must be a multiple of H, got H={} HV={}", who, p.H,
            p.HV);
  KDA_CHECK(p.slots != nullptr && p.rows != nullptr && p.accepted != nullptr,
            "{}: slots, rows and accepted are required", who);
  KDA_CHECK(p.ssm_state != nullptr && aligned(p.ssm_state, 16) && p.ssm_slot_stride % 4 == 0 &&
                p.ssm_layer_stride % 4 == 0,
            "{}: ssm_state must be 16-byte aligned with strides multiple of 4", who);
}
}  // namespace

void invoke_fold(const CommitParams& p, cudaStream_t stream) {
  check_commit(p, "invoke_fold");
  KDA_CHECK(p.ring_rawv != nullptr && p.ring_rawk != nullptr && p.ring_g != nullptr &&
                p.ring_beta != nullptr,
            "invoke_fold: all four rings are required");
  KDA_CHECK(p.T <= p.L, "invoke_fold: T={} exceeds the ring length L={}", p.T, p.L);
  KDA_DISPATCH_K(p.K, K, { launch_fold<K>(p, stream); })
}

void invoke_commit_snapshot(const CommitParams& p, cudaStream_t stream) {
  check_commit(p, "invoke_commit_snapshot");
  KDA_CHECK(p.snapshots != nullptr && aligned(p.snapshots, 16) && p.snapshot_row_stride % 4 == 0 &&
                p.snapshot_layer_stride % 4 == 0,
            "invoke_commit_snapshot: snapshots must be 16-byte aligned, strides multiple of 4");
  launch_commit_snapshot(p, stream);
}

void invoke_commit_conv(const CommitParams& p, cudaStream_t stream) {
  check_commit(p, "invoke_commit_conv");
  KDA_CHECK(p.conv_state != nullptr && p.conv_window != nullptr,
            "invoke_commit_conv: conv_state and conv_window are required");
  launch_commit_conv(p, stream);
}

void invoke_commit(const CommitParams& p, cudaStream_t stream) {
  if (p.mode == RecordMode::kRing) {
    invoke_fold(p, stream);
  } else {
    invoke_commit_snapshot(p, stream);
  }
  invoke_commit_conv(p, stream);
}

namespace {
bool g_pdl_enabled = true;
}  // namespace

bool pdl_enabled() { return g_pdl_enabled; }
void set_pdl_enabled(bool on) { g_pdl_enabled = on; }

}  // namespace kda::kernels
