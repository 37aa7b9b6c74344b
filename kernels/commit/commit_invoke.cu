// commit_invoke.cu: the commit family's entry points (kernels/kda_kernels.h): the fold, the
// snapshot and conv commits, the deferred and lazy bookkeeping, materialize. Every check of a
// call's launches runs before the first is enqueued: an error leaves the state untouched.
#include <cstdint>

#include "core/error.h"
#include "kernels/commit/commit.cuh"
#include "kernels/common/dispatch.h"
#include "kernels/common/launch_utils.h"
#include "kernels/kda_kernels.h"
#include "kernels/params/params_check.h"

namespace kda::kernels {

constexpr int kMaxGridDim = 65535;  ///< gridDim.y / gridDim.z limit (B, layers * HV)

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

void enqueue_fold(const CommitParams& p, cudaStream_t stream, bool with_conv,
                  const LaunchOverrides& o) {
  KDA_DISPATCH_K(p.K, K, { launch_fold<K>(p, stream, with_conv, o); })
}
}  // namespace

void invoke_fold(const CommitParams& p, cudaStream_t stream, const LaunchOverrides& o) {
  check_commit_launch(p, "invoke_fold", params::kFold);
  enqueue_fold(p, stream, /*with_conv=*/false, o);
}

void invoke_commit_snapshot(const CommitParams& p, cudaStream_t stream, const LaunchOverrides& o) {
  check_commit_launch(p, "invoke_commit_snapshot", params::kSnapshot);
  launch_commit_snapshot(p, stream, /*with_conv=*/false, o);
}

void invoke_commit_conv(const CommitParams& p, cudaStream_t stream, const LaunchOverrides& o) {
  check_commit_launch(p, "invoke_commit_conv", params::kConvCommit);
  launch_commit_conv(p, stream, o);
}

void invoke_commit(const CommitParams& p, cudaStream_t stream, const LaunchOverrides& o) {
  if (p.token_offsets != nullptr || p.parents != nullptr) {
    // A shaped round (CommitParams::checked_accepted): every check of both stages before the
    // first launch, then stage 1, then the dense commit from the checked lengths.
    check_commit_launch(p, "invoke_commit", params::commit_needs(p));
    KDA_CHECK(p.num_layers <= kMaxGridDim,
              "invoke_commit: num_layers={} must be <= {} (grid dimension)", p.num_layers,
              kMaxGridDim);
    launch_commit_shape(p, stream, o);
    invoke_commit(params::dense_commit_stage(p), stream, o);
    return;
  }
  switch (p.kind) {
    case CommitKind::kEager:
      break;
    case CommitKind::kDeferred:  // no state pass: the conv commit records the pending counts
      check_commit_launch(p, "invoke_commit",
                          params::kConvCommit | (p.track_slots != nullptr ? params::kFold : 0u));
      if (p.track_slots != nullptr) {  // the tracks read the cursor before the commit moves it
        KDA_DISPATCH_K(p.K, K, { launch_fold_tracks_deferred<K>(p, stream, o); })
        launch_commit_track(p, stream, o);
      }
      launch_commit_conv(p, stream, o);
      return;
    case CommitKind::kMaterialize:
      check_commit_launch(p, "invoke_commit", params::kFold);
      KDA_DISPATCH_K(p.K, K, { launch_materialize<K>(p, stream, o); })
      return;
    case CommitKind::kDropPending:
      check_commit_launch(p, "invoke_commit", 0u);
      launch_drop_pending(p, stream, o);
      return;
    case CommitKind::kLazy:  // the folds read the counts and cursors before the conv commit
      check_commit_launch(p, "invoke_commit", params::commit_needs(p));
      KDA_DISPATCH_K(p.K, K, { launch_fold_lazy<K>(p, stream, o); })
      if (p.track_slots != nullptr) {
        launch_commit_track(p, stream, o);
      }
      launch_commit_conv(p, stream, o);
      return;
  }
  // Both launches' checks before the first is enqueued: an error leaves the state untouched.
  const uint32_t state = p.mode == RecordMode::kRing ? params::kFold : params::kSnapshot;
  check_commit_launch(p, "invoke_commit", state | params::kConvCommit);
  // One launch when the conv commit's offsets allow 16-byte copies (every engine layout we
  // know): the state commit kernel carries it. Otherwise its own launch, after.
  const bool one_launch = conv_commit_vec8(p);
  if (p.mode == RecordMode::kRing) {
    enqueue_fold(p, stream, one_launch, o);
  } else {
    launch_commit_snapshot(p, stream, one_launch, o);
  }
  if (!one_launch) {
    launch_commit_conv(p, stream, o);
  }
  if (p.track_slots != nullptr) {
    launch_commit_track(p, stream, o);
  }
}

}  // namespace kda::kernels
