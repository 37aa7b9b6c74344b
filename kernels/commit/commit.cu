// commit.cu: the copy-only commit kernels (commit_snapshot_kernel, commit_conv_kernel with the
// deferred commit's bookkeeping, commit_track_kernel, drop_pending_kernel) and their launchers;
// the fold is fold.cu. Writes only ssm_state and conv_state of slots >= 0 and of valid track
// slots, ring_pending / ring_cursor (deferred) and *error_flag; never reads snapshot rows past a
// request's accepted length.
#include "kernels/commit/commit.cuh"

#include <algorithm>

#include "kernels/kda_kernels.h"

#include "core/cuda_check.h"
#include "kernels/commit/commit_copy.cuh"
#include "kernels/commit/commit_track.h"
#include "kernels/common/device_caps.h"
#include "kernels/common/fast_divisor.h"
#include "kernels/common/launch_pdl.cuh"
#include "kernels/common/launch_utils.h"
#include "kernels/common/persistent_stage.cuh"
#include "kernels/common/tile_layout.cuh"

namespace kda::kernels {

namespace {

/// grid (chunks, B, layers): state[layer][slot] <- snapshots[layer][row][n-1]; with
/// `with_conv` the same CTAs then copy the request's conv commit (vec8 form).
__global__ void __launch_bounds__(kCopyThreads)
    commit_snapshot_kernel(const __grid_constant__ CommitParams p, bool with_conv) {
  const int n = blockIdx.y;
  const int layer = blockIdx.z;
  pdl_enter();
  const int slot = p.slots[n];
  if (slot < 0) {
    return;
  }
  const int steps = accepted_or_flag(p, n, blockIdx.x == 0 && layer == 0 && threadIdx.x == 0);
  if (steps == 0) {
    return;
  }
  const int64_t per_step = static_cast<int64_t>(p.HV) * p.V * p.K;  // multiple of 4 (K % 4 == 0)
  const float4* src =
      reinterpret_cast<const float4*>(p.snapshots + layer * p.snapshot_layer_stride +
                                      static_cast<int64_t>(p.rows[n]) * p.snapshot_row_stride +
                                      snapshot_node(p, n, steps - 1) * per_step);
  float4* dst = reinterpret_cast<float4*>(p.ssm_state + layer * p.ssm_layer_stride +
                                          slot * p.ssm_slot_stride);
  copy_share(dst, src, per_step / 4, static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x));
  if (with_conv) {
    commit_conv_share<8>(p, layer, n, static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x));
  }
}

/// grid (chunks, B, layers): request n's valid track k (commit_track.h) in `layer`:
/// conv_state[track] <- conv_window[row][k]; snapshot mode also state[track] <- snapshots[row][k];
/// with pending counts (deferred commit) ring_pending[layer][track] <- 0. Reports invalid
/// tracks (kBadTrack). Ring mode's track state comes from the fold (FoldRole).
__global__ void __launch_bounds__(kCopyThreads)
    commit_track_kernel(const __grid_constant__ CommitParams p, bool vec8) {
  const int n = blockIdx.y;
  const int layer = blockIdx.z;
  const int part = blockIdx.x;
  const int parts = gridDim.x;
  pdl_enter();
  const int k = track_step_of(p, n);
  if (k == kInvalidTrack && part == 0 && layer == 0 && threadIdx.x == 0 && p.error_flag) {
    atomicOr(p.error_flag, kBadTrack);
  }
  if (k < 0) {
    return;
  }
  const int track = p.track_slots[n];
  const int64_t row = p.rows[n];
  const int64_t per_step = 3 * static_cast<int64_t>(qkv_dim(p));
  const bf16_t* window = p.conv_window + layer * p.conv_window_layer_stride +
                         row * p.conv_window_row_stride + k * per_step;
  bf16_t* conv =
      p.conv_state + layer * p.conv_state_layer_stride + track * p.conv_state_slot_stride;
  if (vec8) {
    copy_share(reinterpret_cast<uint4*>(conv), reinterpret_cast<const uint4*>(window), per_step / 8,
               part, parts);
  } else {
    copy_share(conv, window, per_step, part, parts);
  }
  if (p.mode == RecordMode::kSnapshot) {
    const int64_t state = static_cast<int64_t>(p.HV) * p.V * p.K;
    copy_share(reinterpret_cast<float4*>(p.ssm_state + layer * p.ssm_layer_stride +
                                         track * p.ssm_slot_stride),
               reinterpret_cast<const float4*>(p.snapshots + layer * p.snapshot_layer_stride +
                                               row * p.snapshot_row_stride +
                                               snapshot_node(p, n, k) * state),
               state / 4, part, parts);
  }
  if (p.ring_pending != nullptr && part == 0 && threadIdx.x == 0) {
    p.ring_pending[layer * p.ring_pending_layer_stride + track] = 0;
  }
}

/// A deferred commit's bookkeeping for request n in `layer` (one thread): ring_pending[layer]
/// [slot] <- n (0 for a bad accepted length, which it reports; lazy: the pending count plus n,
/// or 0 where it folded), and in layer 0 the cursor advanced by n (mod L). Nothing else of the
/// launch reads these.
__device__ __forceinline__ void commit_pending(const CommitParams& p, int layer, int n) {
  const int slot = p.slots[n];
  if (slot < 0) {
    return;
  }
  const int steps = accepted_or_flag(p, n, layer == 0);
  int32_t& pending = p.ring_pending[layer * p.ring_pending_layer_stride + slot];
  if (p.kind == CommitKind::kLazy) {
    // The lazy commit (contract §11): the steps join the slot's pending ones, which the fold
    // launch before this one folded where lazy_commit_folds says so; a bad length changes
    // nothing.
    if (steps > 0) {
      const int32_t m = pending + steps;
      pending = lazy_commit_folds(p, m) ? 0 : m;
    }
  } else {
    pending = steps;
  }
  if (layer == 0 && steps > 0) {
    p.ring_cursor[slot] = (p.ring_cursor[slot] + steps) & (p.L - 1);
  }
}

/// grid (chunks, B, layers): conv_state[layer][slot] <- conv_window[layer][row][n-1] alone;
/// a deferred or lazy commit also records the pending counts (commit_pending).
template <int VEC>
__global__ void __launch_bounds__(kCopyThreads)
    commit_conv_kernel(const __grid_constant__ CommitParams p) {
  pdl_enter();
  if ((p.kind == CommitKind::kDeferred || p.kind == CommitKind::kLazy) && blockIdx.x == 0 &&
      threadIdx.x == 0) {
    commit_pending(p, static_cast<int>(blockIdx.z), static_cast<int>(blockIdx.y));
  }
  commit_conv_share<VEC>(p, static_cast<int>(blockIdx.z), static_cast<int>(blockIdx.y),
                         static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x));
}

/// grid (ceil(B / kCopyThreads)): ring_pending[layer][slots[n]] <- 0 for layers 0..num_layers-1
/// (after a materializing fold, and for abort_round's layers that folded).
__global__ void __launch_bounds__(kCopyThreads)
    drop_pending_kernel(const __grid_constant__ CommitParams p) {
  pdl_enter();
  const int n = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (n >= p.B || p.slots[n] < 0) {
    return;
  }
  for (int layer = 0; layer < p.num_layers; ++layer) {
    p.ring_pending[layer * p.ring_pending_layer_stride + p.slots[n]] = 0;
  }
}

/// Elements [0, count) of `rec` + from * pitch -> `rec` + to * pitch, this thread's share.
template <typename E>
__device__ __forceinline__ void move_step(E* rec, int64_t pitch, int from, int to, int64_t count) {
  for (int64_t e = threadIdx.x; e < count; e += blockDim.x) {
    rec[to * pitch + e] = rec[from * pitch + e];
  }
}

/// grid (B, layers): stage 1 of a shaped commit (CommitParams::checked_accepted). Request n's
/// length if in [1, T_n] and, for a tree, its path a root path, else 0 (a bad path reports
/// kBadPath; the dense stage reports every 0 as a bad length); a valid tree path's windows and
/// (ring mode) ring records of every head move from node path[k] to step k, k < n. Path nodes
/// increase, so node path[k] >= k: no move overwrites a later one's source, and each thread
/// moves the same elements of every step (no barrier).
__global__ void __launch_bounds__(kCopyThreads)
    commit_shape_kernel(const __grid_constant__ CommitParams p) {
  const int n = blockIdx.x;
  const int layer = blockIdx.y;
  pdl_enter();
  const int slot = p.slots[n];
  const int acc = p.accepted[n];
  int steps = acc;
  const int32_t* path = p.accepted_paths + static_cast<int64_t>(n) * p.T;
  if (slot >= 0) {
    const int len = p.token_offsets != nullptr ? p.token_offsets[n + 1] - p.token_offsets[n] : p.T;
    steps = acc >= 1 && acc <= len ? acc : 0;
    if (steps > 0 && p.parents != nullptr) {
      const int32_t* par = p.parents + static_cast<int64_t>(n) * p.T;
      bool ok = path[0] == 0;
      for (int k = 1; k < steps && ok; ++k) {
        ok = path[k] > 0 && path[k] < p.T && par[path[k]] == path[k - 1];
      }
      if (!ok) {
        if (layer == 0 && threadIdx.x == 0 && p.error_flag != nullptr) {
          atomicOr(p.error_flag, kBadPath);
        }
        steps = 0;
      }
    }
  }
  if (layer == 0 && threadIdx.x == 0) {
    p.checked_accepted[n] = steps;
  }
  if (slot < 0 || p.parents == nullptr) {
    return;
  }
  const int64_t D = qkv_dim(p);
  const int64_t L = p.L;
  for (int k = 1; k < steps; ++k) {
    const int from = path[k];
    if (from == k) {
      continue;
    }
    move_step(p.conv_window + layer * p.conv_window_layer_stride +
                  static_cast<int64_t>(p.rows[n]) * p.conv_window_row_stride,
              3 * D, from, k, 3 * D);
    if (p.mode != RecordMode::kRing) {
      continue;
    }
    for (int h = 0; h < p.H; ++h) {
      move_step(p.ring_rawk + layer * p.ring_rawk_layer_stride + slot * p.ring_rawk_slot_stride +
                    h * L * p.K,
                p.K, from, k, p.K);
    }
    for (int hv = 0; hv < p.HV; ++hv) {
      move_step(p.ring_rawv + layer * p.ring_rawv_layer_stride + slot * p.ring_rawv_slot_stride +
                    hv * L * p.V,
                p.V, from, k, p.V);
      move_step(
          p.ring_g + layer * p.ring_g_layer_stride + slot * p.ring_g_slot_stride + hv * L * p.K,
          p.K, from, k, p.K);
    }
    for (int hv = threadIdx.x; hv < p.HV; hv += blockDim.x) {
      float* beta =
          p.ring_beta + layer * p.ring_beta_layer_stride + slot * p.ring_beta_slot_stride + hv * L;
      beta[k] = beta[from];
    }
  }
}

/// A copy kernel taking only the params (the conv commit's own launch).
template <typename Kernel>
void launch(Kernel kernel, dim3 grid, const CommitParams& p, cudaStream_t stream, bool pdl) {
  launch_pdl(kernel, grid, dim3(kCopyThreads), 0, stream, pdl, p);
}

/// CTAs per (request, layer) for a copy of `vecs` vectors each: 1..64 (at most the copy's
/// rounds of kCopyInFlight vectors per thread), the count whose grid best fills its last wave
/// of resident copy CTAs (8 per SM at 256 threads): one CTA per pair, leaving a partial last
/// wave, proved slower.
unsigned copy_chunks(int64_t vecs, int64_t requests) {
  const int64_t wave = static_cast<int64_t>(device_sm_count()) * (2048 / kCopyThreads);
  const int64_t most = std::min<int64_t>(64, ceil_div(vecs, kCopyThreads * kCopyInFlight));
  return static_cast<unsigned>(ctas_per_unit_filling_waves(requests, most, wave));
}

}  // namespace

bool conv_commit_vec8(const CommitParams& p) {
  const int64_t per_step = 3 * static_cast<int64_t>(qkv_dim(p));
  return per_step % 8 == 0 && p.conv_window_layer_stride % 8 == 0 &&
         p.conv_window_row_stride % 8 == 0 && p.conv_state_layer_stride % 8 == 0 &&
         p.conv_state_slot_stride % 8 == 0 && is_aligned(p.conv_window, 16) &&
         is_aligned(p.conv_state, 16);
}

void launch_commit_track(const CommitParams& p, cudaStream_t stream, const LaunchOverrides& o) {
  const int64_t vecs = p.mode == RecordMode::kSnapshot ? static_cast<int64_t>(p.HV) * p.V * p.K / 4
                                                       : 3 * static_cast<int64_t>(qkv_dim(p)) / 8;
  const dim3 grid(copy_chunks(vecs, static_cast<int64_t>(p.B) * p.num_layers),
                  static_cast<unsigned>(p.B), static_cast<unsigned>(p.num_layers));
  launch_pdl(commit_track_kernel, grid, dim3(kCopyThreads), 0, stream, o.pdl, p,
             conv_commit_vec8(p));
}

void launch_commit_shape(const CommitParams& p, cudaStream_t stream, const LaunchOverrides& o) {
  launch(commit_shape_kernel, dim3(static_cast<unsigned>(p.B), static_cast<unsigned>(p.num_layers)),
         p, stream, o.pdl);
}

void launch_drop_pending(const CommitParams& p, cudaStream_t stream, const LaunchOverrides& o) {
  launch(drop_pending_kernel, dim3(static_cast<unsigned>(ceil_div(p.B, kCopyThreads))), p, stream,
         o.pdl);
}

void launch_commit_snapshot(const CommitParams& p, cudaStream_t stream, bool with_conv,
                            const LaunchOverrides& o) {
  const int64_t n4 = static_cast<int64_t>(p.HV) * p.V * p.K / 4;
  const dim3 grid(copy_chunks(n4, static_cast<int64_t>(p.B) * p.num_layers),
                  static_cast<unsigned>(p.B), static_cast<unsigned>(p.num_layers));
  launch_pdl(commit_snapshot_kernel, grid, dim3(kCopyThreads), 0, stream, o.pdl, p, with_conv);
}

void launch_commit_conv(const CommitParams& p, cudaStream_t stream, const LaunchOverrides& o) {
  const bool vec8 = conv_commit_vec8(p);
  const int64_t per_step = 3 * static_cast<int64_t>(qkv_dim(p));
  const int64_t nv = vec8 ? per_step / 8 : per_step;
  const dim3 grid(copy_chunks(nv, static_cast<int64_t>(p.B) * p.num_layers),
                  static_cast<unsigned>(p.B), static_cast<unsigned>(p.num_layers));
  if (vec8) {
    launch(commit_conv_kernel<8>, grid, p, stream, o.pdl);
  } else {
    launch(commit_conv_kernel<1>, grid, p, stream, o.pdl);
  }
}

}  // namespace kda::kernels
