// commit_copy.cuh: what every commit kernel shares (commit.cu, fold.cu): the accepted-length
// check that reports a bad length, the CTA-share copy loop, and a request's conv commit.
#pragma once

#include <type_traits>

#include "kernels/params/kda_params.h"

namespace kda::kernels {

constexpr int kCopyThreads = 256;
constexpr int kCopyInFlight = 4;  ///< 16-byte loads per thread issued before their stores

/// The accepted length of request n, or 0 after flagging an out-of-range value.
__device__ __forceinline__ int accepted_or_flag(const CommitParams& p, int n, bool reporter) {
  const int acc = p.accepted[n];
  if (acc < 1 || acc > p.T) {
    if (reporter && p.error_flag != nullptr) {
      atomicOr(p.error_flag, kBadAcceptedLength);
    }
    return 0;
  }
  return acc;
}

/// The snapshot of commit step k of request n: node accepted_paths[n*T + k] of a checked tree
/// commit (CommitParams::checked_accepted), else step k.
__device__ __forceinline__ int64_t snapshot_node(const CommitParams& p, int n, int k) {
  return p.accepted_paths != nullptr ? p.accepted_paths[static_cast<int64_t>(n) * p.T + k] : k;
}

/// dst[i] = src[i] for this CTA's share i = part*kCopyThreads + tid (+ parts*kCopyThreads per
/// round) of `count` vectors. kInFlight loads are in flight per thread before their stores:
/// one load per thread at a time leaves a small-B copy well below the copy rate.
template <typename Vec>
__device__ __forceinline__ void copy_share(Vec* dst, const Vec* src, int64_t count, int part,
                                           int parts) {
  constexpr int kInFlight = kCopyInFlight;  // 16-byte vectors: 64 bytes per thread
  const int64_t stride = static_cast<int64_t>(parts) * kCopyThreads;
  int64_t i = static_cast<int64_t>(part) * kCopyThreads + threadIdx.x;
  for (; i + (kInFlight - 1) * stride < count; i += kInFlight * stride) {
    Vec v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      v[u] = src[i + u * stride];
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      dst[i + u * stride] = v[u];
    }
  }
  for (; i < count; i += stride) {
    dst[i] = src[i];
  }
}

/// Share `part` of `parts` of request n's conv commit in `layer`:
/// conv_state[layer][slot] <- conv_window[layer][row][n-1] (W-1 rows of D bf16), VEC bf16 per
/// access (8 when every offset is 16-byte aligned: conv_commit_vec8). Padding requests and bad
/// accepted lengths copy nothing (the state commit reports the latter).
template <int VEC>
__device__ __forceinline__ void commit_conv_share(const CommitParams& p, int layer, int n, int part,
                                                  int parts) {
  using Vec = std::conditional_t<VEC == 8, uint4, bf16_t>;
  const int slot = p.slots[n];
  if (slot < 0) {
    return;
  }
  const int steps = accepted_or_flag(p, n, false);
  if (steps == 0) {
    return;
  }
  const int64_t per_step = 3 * static_cast<int64_t>(qkv_dim(p));
  const Vec* src = reinterpret_cast<const Vec*>(
      p.conv_window + layer * p.conv_window_layer_stride +
      static_cast<int64_t>(p.rows[n]) * p.conv_window_row_stride + (steps - 1) * per_step);
  Vec* dst = reinterpret_cast<Vec*>(p.conv_state + layer * p.conv_state_layer_stride +
                                    slot * p.conv_state_slot_stride);
  copy_share(dst, src, per_step / VEC, part, parts);
}

}  // namespace kda::kernels
