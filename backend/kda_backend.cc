#include "backend/kda_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "backend/ops.h"
#include "core/cuda_check.h"
#include "core/error.h"
#include "core/logging.h"
#include "dispatch/commit_policy.h"
#include "dispatch/lazy_policy.h"
#include "dispatch/numerics_policy.h"
#include "kernels/kda_kernels.h"

namespace kda {

namespace {

// The backend's commit (contract §7, §11), decided once: eager, deferred or the lazy write-back.
enum class CommitMode { kEager, kDeferred, kLazy };

// Whether --kda-deferred-commit auto may take the lazy write-back at all: ring chains whose
// verifies may run fast outputs on the fused path, a ring short enough for one fast chunk, and a
// kernel set that runs it. Whether it pays is dispatch/lazy_policy.h's measured rule.
bool lazy_is_possible(const EngineFlags& f, const KernelSet& kernels) {
  return f.replayssm_spec && !f.tree_drafts() && f.fused_verify &&
         f.numerics_request() != NumericsRequest::kExact &&
         f.replayssm_cache_len <= kFastMaxChunk &&
         f.replayssm_cache_len >= 2 * f.num_draft_tokens && kernels.runs_lazy_write_back();
}

// Ring mode only (trees commit eagerly: an accepted path is not a contiguous ring range; flags
// reject on and lazy there). on / lazy / off as asked; auto: lazy where dispatch/lazy_policy.h's
// rule says the lazy step beats every other step the numerics request could run, else deferred
// where dispatch/commit_policy.h's rule says it pays, for the configured batch on the measured
// card nearest to the device (by its peak memory bandwidth).
CommitMode commit_mode(const ModelConfig& m, const EngineFlags& f, const Platform& platform,
                       const KernelSet& kernels, const LazyPolicyCard& lazy_table) {
  if (!f.replayssm_spec || f.tree_drafts()) {
    return CommitMode::kEager;
  }
  switch (static_cast<DeferredCommit>(f.deferred_commit)) {
    case DeferredCommit::kOn:
      return CommitMode::kDeferred;
    case DeferredCommit::kLazy:
      return CommitMode::kLazy;
    case DeferredCommit::kOff:
      return CommitMode::kEager;
    case DeferredCommit::kAuto:
      break;
  }
  if (lazy_is_possible(f, kernels) &&
      lazy_write_back_pays(lazy_table,
                           {m.H, m.HV, m.K, m.V, f.replayssm_cache_len, f.num_draft_tokens,
                            f.max_running_requests, f.numerics_request()})) {
    return CommitMode::kLazy;
  }
  return deferred_commit_pays(
             {m.HV, m.K, m.V, f.max_running_requests, f.num_draft_tokens, platform.memory_gbps})
             ? CommitMode::kDeferred
             : CommitMode::kEager;
}

// Whether a deferred commit keeps u records (its verifies replay them and run exact outputs, the
// dispatcher's kExactDeferredFold) or is u-free (no u records: the fast kernel folds the pending
// steps computing u, and the verifies run fast outputs). fast: u-free; exact: u records; auto:
// u-free where dispatch/lazy_policy.h's u_free_deferred_pays says the fast deferred step beat the
// exact deferred one at the configured batch, and only where every verify of that batch can run
// the fast outputs (ring chains on the fused path up to that batch, a draft of one fast chunk, a
// fast tile): elsewhere a u-free call would fold in a kernel of its own first. An eager backend
// keeps no deferred records (its flag is moot: auto reads no table there); the lazy write-back
// keeps none (its outputs are fast, contract §11).
bool keeps_u_records(const ModelConfig& m, const EngineFlags& f, CommitMode mode,
                     const LazyPolicyCard& table) {
  switch (f.numerics_request()) {
    case NumericsRequest::kFast:
      return false;
    case NumericsRequest::kExact:
      return true;
    case NumericsRequest::kAuto:
      break;
  }
  if (mode != CommitMode::kDeferred) {
    return true;
  }
  const bool fast_possible = f.replayssm_spec && !f.tree_drafts() && f.fused_verify &&
                             f.fused_ring_max_batch >= f.max_running_requests &&
                             f.num_draft_tokens <= kFastMaxChunk &&
                             (f.verify_block_v == 0 || kernels::is_fast_block_v(f.verify_block_v));
  return !(fast_possible && u_free_deferred_pays(table, {m.H, m.HV, m.K, m.V, f.replayssm_cache_len,
                                                         f.num_draft_tokens, f.max_running_requests,
                                                         NumericsRequest::kAuto}));
}

PoolConfig make_pool_config(const ModelConfig& m, const EngineFlags& f, const Device& device,
                            const Platform& platform, const KernelSet& kernels,
                            const BackendOptions& o) {
  KDA_CHECK(o.extra_slots >= 0 &&
                o.extra_slots <= std::numeric_limits<int>::max() - f.max_running_requests,
            "BackendOptions.extra_slots: expected in [0, {}], got {}",
            std::numeric_limits<int>::max() - f.max_running_requests, o.extra_slots);
  PoolConfig c;
  c.layers = m.num_layers;
  c.H = m.H;
  c.HV = m.HV;
  c.K = m.K;
  c.V = m.V;
  c.num_slots = f.max_running_requests + o.extra_slots;
  c.num_rows = f.max_running_requests;
  c.T_max = f.num_draft_tokens;
  c.ring_mode = f.replayssm_spec;
  c.ring_len = f.replayssm_cache_len;
  // --kda-deferred-commit auto's lazy table; it also decides the deferred form under auto.
  const LazyPolicyCard& lazy_table = o.lazy_policy_table != nullptr
                                         ? *o.lazy_policy_table
                                         : nearest_lazy_policy_card(platform.memory_gbps);
  const CommitMode mode = commit_mode(m, f, platform, kernels, lazy_table);
  c.deferred_commit = mode != CommitMode::kEager;
  c.lazy_commit = mode == CommitMode::kLazy;
  c.deferred_u_records = !c.lazy_commit && keeps_u_records(m, f, mode, lazy_table);  // ring_u
  c.device = device;
  c.memory_budget_bytes = o.memory_budget_bytes;
  return c;
}

// Construction-order helpers: members are built from validated arguments only.
const ModelConfig& validated(const ModelConfig& m) {
  m.validate();
  return m;
}
const EngineFlags& validated(const EngineFlags& f) {
  f.validate();
  return f;
}
std::unique_ptr<KernelSet> non_null(std::unique_ptr<KernelSet> k) {
  KDA_CHECK(k != nullptr, "KdaAttentionBackend: no kernel set given");
  return k;
}

/// The kernel set's device, after the constraints that only that kernel set has: the lazy
/// write-back where the set runs it; the CUDA kernels move two adjacent bf16 channels per
/// thread, so head_v_dim must be even there.
Device device_for(const KernelSet& kernels, const ModelConfig& m, const EngineFlags& f) {
  KDA_CHECK_CODE(!(f.replayssm_spec && f.lazy_write_back()) || kernels.runs_lazy_write_back(),
                 ErrorCode::kUnsupported,
                 "--kda-deferred-commit lazy: the {} kernel set does not run the lazy write-back "
                 "(contract §11; the host kernel set does; on CUDA use --kda-deferred-commit on)",
                 kernels.name());
  const Device d = kernels.device();
  KDA_CHECK_CODE(!d.is_cuda() || m.V % 2 == 0, ErrorCode::kUnsupported,
                 "ModelConfig.V: the CUDA kernels need an even head_v_dim (bf16 channel pairs), "
                 "got {}",
                 m.V);
  return d;
}

Platform platform_for(const Device& device, const BackendOptions& o) {
  if (o.platform_override) {
    return *o.platform_override;
  }
  if (device.is_cuda()) {
    return detect_platform(device.index);
  }
  Platform p;
  p.reason = "the host kernel set runs on the CPU";
  return p;
}

// The pool's shapes as the ops see them.
ops::detail::Dims dims_of(const KdaStatePool& pool, bool deferred) {
  const PoolConfig& c = pool.config();
  ops::detail::Dims d;
  d.layers = c.layers;
  d.S = c.num_slots;
  d.R = c.num_rows;
  d.T_max = c.T_max;
  d.L = c.ring_len;
  d.H = c.H;
  d.HV = c.HV;
  d.K = c.K;
  d.V = c.V;
  d.mode = c.ring_mode ? RecordMode::kRing : RecordMode::kSnapshot;
  d.deferred = deferred;
  d.u_records = deferred && c.deferred_u_records;
  d.lazy = deferred && c.lazy_commit;
  return d;
}

// Whether `stream` is capturing a CUDA graph (then enqueued work has not run).
bool capturing(const Device& device, cudaStream_t stream) {
  if (!device.is_cuda()) {
    return false;
  }
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  KDA_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

Buffer zeroed_flag(const Device& device, const BackendOptions& o) {
  Buffer flag(device, sizeof(int32_t), o.allocator, o.allocation_stream);
  const int32_t zero = 0;
  flag.upload(&zero, sizeof(zero));
  return flag;
}

// Row pitch as the kernels read it: a single row's pitch is never used, so a packed one is
// passed (views of one row may carry any stride).
int64_t row_pitch(const TensorView& t) { return t.size(0) > 1 ? t.stride(0) : t.size(1); }

// A 2-D activation [rows, cols] of bf16 on `device`: inner dim contiguous, row pitch >= cols.
void expect_activation(const TensorView& t, const char* name, const Device& device, int64_t rows,
                       int64_t cols) {
  expect_tensor(t, name, DType::kBF16, device, {rows, cols});
  expect_inner_contiguous(t, name);
  expect_aligned(t, name, dtype_size(DType::kBF16));
  KDA_CHECK(row_pitch(t) >= cols,
            "{}: row stride {} is smaller than the row width {} (rows would overlap)", name,
            t.stride(0), cols);
}

}  // namespace

KdaAttentionBackend::KdaAttentionBackend(const ModelConfig& model, const EngineFlags& flags,
                                         std::unique_ptr<KernelSet> kernels,
                                         const BackendOptions& options)
    : model_(validated(model)),
      flags_(validated(flags)),
      kernels_(non_null(std::move(kernels))),
      device_(device_for(*kernels_, model_, flags_)),
      platform_(platform_for(device_, options)),
      pool_(make_pool_config(model_, flags_, device_, platform_, *kernels_, options),
            PoolStorage{options.allocator, options.allocation_stream, options.external_pool}),
      weights_(static_cast<size_t>(model.num_layers)),
      indices_(device_, flags.max_running_requests, flags.num_draft_tokens, pool_.num_slots(),
               options.allocator, options.allocation_stream),
      error_flag_(zeroed_flag(device_, options)),
      round_(model.num_layers),
      deferred_(pool_.config().deferred_commit),
      lazy_(pool_.config().lazy_commit),
      verify_ran_(static_cast<size_t>(model.num_layers), 0),
      checked_accepted_(device_, int64_t{flags.max_running_requests} * 4, options.allocator,
                        options.allocation_stream),
      last_decision_(static_cast<size_t>(model.num_layers)) {
  batch_slots_.reserve(static_cast<size_t>(flags.max_running_requests));
  upload_rows_.reserve(static_cast<size_t>(flags.max_running_requests));
  logger().info(
      "KDA backend: {} layers, H={} HV={} K={} V={}, {} mode (L={}, {} commit), T_max={}, "
      "numerics {}, kernels {} on {}, dispatch platform {}",
      model_.num_layers, model_.H, model_.HV, model_.K, model_.V,
      flags_.replayssm_spec ? "ring" : "snapshot", flags_.replayssm_cache_len,
      lazy_       ? "lazy"
      : deferred_ ? "deferred"
                  : "eager",
      flags_.num_draft_tokens, numerics_request_name(flags_.numerics_request()), kernels_->name(),
      device_name(device_), platform_.describe());
}

KdaAttentionBackend::~KdaAttentionBackend() = default;

const char* draft_shape_name(DraftShape s) {
  switch (s) {
    case DraftShape::kDense:
      return "dense chain";
    case DraftShape::kRagged:
      return "ragged chain";
    case DraftShape::kTree:
      return "tree";
  }
  return "?";
}

void KdaAttentionBackend::set_layer_weights(int layer, const LayerWeights& weights) {
  KDA_CHECK(layer >= 0 && layer < model_.num_layers,
            "set_layer_weights: layer {} out of range [0, {})", layer, model_.num_layers);
  try {
    validate_layer_weights(weights, model_, device_);
  } catch (const Error& e) {
    KDA_THROW(e.code(), "set_layer_weights(layer {}): {}", layer, e.message());
  }
  weights_[static_cast<size_t>(layer)] = weights;
}

int KdaAttentionBackend::allocate_slot(cudaStream_t stream) {
  const int slot = pool_.allocate_slot(stream);
  indices_.set_slot_allocated(slot, true);  // the commit's slot table (BatchIndices)
  return slot;
}

void KdaAttentionBackend::claim_slot(int slot, SlotInit init, cudaStream_t stream) {
  KDA_CHECK(init == SlotInit::kZero || init == SlotInit::kKeepState,
            "claim_slot: init = {} unknown, expected kZero (0) or kKeepState (1)",
            static_cast<int>(init));
  pool_.claim_slot(slot, init, stream);
  indices_.set_slot_allocated(slot, true);
}

int64_t KdaAttentionBackend::workspace_bytes() const {
  return indices_.device_bytes() + error_flag_.bytes() + checked_accepted_.bytes();
}

void KdaAttentionBackend::release_slot(int slot) {
  if (slot >= 0 && round_.kind() != RoundKind::kNone) {
    const auto it = std::find(batch_slots_.begin(), batch_slots_.end(), slot);
    KDA_CHECK_CODE(it == batch_slots_.end(), ErrorCode::kLifecycle,
                   "release_slot: slot {} belongs to request {} of the {}; commit() or "
                   "abort_round() first",
                   slot, it - batch_slots_.begin(), round_.describe());
    const auto track = std::find(batch_tracks_.begin(), batch_tracks_.end(), slot);
    KDA_CHECK_CODE(track == batch_tracks_.end(), ErrorCode::kLifecycle,
                   "release_slot: slot {} is the track slot of request {} of the {}; finish the "
                   "round or abort_round() first",
                   slot, track - batch_tracks_.begin(), round_.describe());
  }
  pool_.release_slot(slot);
  indices_.set_slot_allocated(slot, false);
}

void KdaAttentionBackend::copy_slot(int src, int dst, cudaStream_t stream) {
  KDA_CHECK_CODE(round_.kind() == RoundKind::kNone, ErrorCode::kLifecycle,
                 "copy_slot: a round is in progress ({}); commit() or abort_round() first",
                 round_.describe());
  const int S = pool_.num_slots();
  KDA_CHECK(src >= 0 && src < S && pool_.is_slot_allocated(src),
            "copy_slot: src = {} is not an allocated slot in [0, {})", src, S);
  KDA_CHECK(dst >= 0 && dst < S && pool_.is_slot_allocated(dst),
            "copy_slot: dst = {} is not an allocated slot in [0, {})", dst, S);
  KDA_CHECK(src != dst, "copy_slot: src and dst are both {} (distinct slots)", src);
  pool_.copy_slot(src, dst, deferred_ ? SlotCopy::kStateAndPending : SlotCopy::kState, stream);
}

// ---- lifecycle ----

void KdaAttentionBackend::validate_batch(RoundKind kind, const BatchSpec& batch) const {
  const char* call = kind == RoundKind::kVerify ? "prepare" : "prepare_extend";
  const int R = pool_.num_rows(), S = pool_.num_slots();
  const int64_t B = static_cast<int64_t>(batch.slots.size());
  KDA_CHECK(B >= 1, "{}: empty batch (BatchSpec.slots has no entries)", call);
  KDA_CHECK(B <= R, "{}: batch of {} requests exceeds --max-running-requests = {}", call, B, R);
  if (kind == RoundKind::kVerify) {
    KDA_CHECK(batch.T >= 1 && batch.T <= pool_.T_max(),
              "{}: BatchSpec.T = {} outside [1, {}] (--speculative-num-draft-tokens)", call,
              batch.T, pool_.T_max());
    KDA_CHECK(batch.rows.empty() || static_cast<int64_t>(batch.rows.size()) == B,
              "{}: BatchSpec.rows has {} entries for {} requests (empty = batch position)", call,
              batch.rows.size(), B);
  } else {
    // N = B*T rows are addressed with int32 row counts by the kernels' params.
    KDA_CHECK(batch.T >= 1 && B * batch.T <= std::numeric_limits<int32_t>::max(),
              "{}: BatchSpec.T = {} outside [1, {}] for {} requests", call, batch.T,
              std::numeric_limits<int32_t>::max() / B, B);
    KDA_CHECK(batch.rows.empty(),
              "{}: BatchSpec.rows has {} entries, expected none (extend uses no scratch rows)",
              call, batch.rows.size());
    KDA_CHECK(batch.lengths.empty() && batch.offsets.empty() && batch.parents.empty(),
              "{}: BatchSpec.lengths / offsets / parents given (a draft shape is for verify: "
              "extend runs T prompt tokens per request)",
              call);
  }

  if (kind == RoundKind::kVerify) {
    validate_shape(batch);
  }
  for (int64_t n = 0; n < B; ++n) {
    const int32_t s = batch.slots[static_cast<size_t>(n)];
    KDA_CHECK(s >= -1 && s < S, "{}: slots[{}] = {} out of range [-1, {}) (-1 = padding row)", call,
              n, s, S);
    if (s < 0) {
      continue;
    }
    KDA_CHECK(pool_.is_slot_allocated(s),
              "{}: slots[{}] = {} is not allocated (allocate_slot() first)", call, n, s);
    const int32_t r =
        batch.rows.empty() ? static_cast<int32_t>(n) : batch.rows[static_cast<size_t>(n)];
    KDA_CHECK(r >= 0 && r < R, "{}: rows[{}] = {} out of range [0, {}) (--max-running-requests)",
              call, n, r, R);
    for (int64_t m = 0; m < n; ++m) {
      const int32_t other = batch.slots[static_cast<size_t>(m)];
      if (other < 0) {
        continue;
      }
      KDA_CHECK(other != s, "{}: slots[{}] and slots[{}] are both {} (one slot per request)", call,
                m, n, s);
      KDA_CHECK(batch.rows.empty() || batch.rows[static_cast<size_t>(m)] != r,
                "{}: rows[{}] and rows[{}] are both {} (one scratch row per request)", call, m, n,
                r);
    }
  }
}

void KdaAttentionBackend::validate_shape(const BatchSpec& batch) const {
  const size_t B = batch.slots.size();
  const int T = batch.T;
  if (!batch.lengths.empty()) {
    KDA_CHECK(batch.lengths.size() == B,
              "prepare: BatchSpec.lengths has {} entries for {} requests (empty = T each)",
              batch.lengths.size(), B);
    for (size_t n = 0; n < B; ++n) {
      KDA_CHECK(batch.lengths[n] >= 1 && batch.lengths[n] <= T,
                "prepare: lengths[{}] = {} out of range [1, T = {}]", n, batch.lengths[n], T);
    }
  }
  if (!batch.offsets.empty()) {
    KDA_CHECK(!batch.lengths.empty(),
              "prepare: BatchSpec.offsets given without lengths (offsets describe a ragged batch)");
    KDA_CHECK(batch.offsets.size() == B + 1,
              "prepare: BatchSpec.offsets has {} entries for {} requests (expected B + 1 = {})",
              batch.offsets.size(), B, B + 1);
    KDA_CHECK(batch.offsets[0] == 0, "prepare: offsets[0] = {}, expected 0 (packed rows)",
              batch.offsets[0]);
    for (size_t n = 0; n < B; ++n) {
      KDA_CHECK(int64_t{batch.offsets[n + 1]} - batch.offsets[n] == batch.lengths[n],
                "prepare: offsets[{}] - offsets[{}] = {} - {} does not match lengths[{}] = {}",
                n + 1, n, batch.offsets[n + 1], batch.offsets[n], n, batch.lengths[n]);
    }
  }
  if (batch.parents.empty()) {
    return;
  }
  KDA_CHECK(
      flags_.tree_drafts(),
      "prepare: BatchSpec.parents given with --speculative-eagle-topk {} (trees need topk > 1)",
      flags_.eagle_topk);
  KDA_CHECK(batch.lengths.empty(),
            "prepare: BatchSpec.parents with lengths (a tree batch has T nodes per request)");
  KDA_CHECK(batch.parents.size() == B * static_cast<size_t>(T),
            "prepare: BatchSpec.parents has {} entries for {} requests of T = {} nodes (expected "
            "{})",
            batch.parents.size(), B, T, B * static_cast<size_t>(T));
  std::vector<int> children(static_cast<size_t>(T));
  for (size_t n = 0; n < B; ++n) {
    if (batch.slots[n] < 0) {
      continue;  // padding: its parents are not read
    }
    const int32_t* par = batch.parents.data() + n * static_cast<size_t>(T);
    KDA_CHECK(par[0] == -1,
              "prepare: parents[{}] = {} for node 0 of request {}, expected -1 (the root)",
              n * static_cast<size_t>(T), par[0], n);
    std::fill(children.begin(), children.end(), 0);
    for (int j = 1; j < T; ++j) {
      const size_t at = n * static_cast<size_t>(T) + static_cast<size_t>(j);
      KDA_CHECK(par[j] != -1,
                "prepare: parents[{}] = -1 for node {} of request {}: a second root (only node 0 "
                "has parent -1)",
                at, j, n);
      KDA_CHECK(par[j] >= 0 && par[j] < j,
                "prepare: parents[{}] = {} for node {} of request {}, expected in [0, {}) (a "
                "parent comes before its child)",
                at, par[j], j, n, j);
      KDA_CHECK(++children[static_cast<size_t>(par[j])] <= flags_.eagle_topk,
                "prepare: node {} of request {} has more than --speculative-eagle-topk = {} "
                "children (parents[{}] = {})",
                par[j], n, flags_.eagle_topk, at, par[j]);
    }
  }
}

void KdaAttentionBackend::validate_tracks(const BatchSpec& batch, const ExtendTrack& track) const {
  const size_t B = batch.slots.size();
  if (track.slots.empty() && track.steps.empty()) {
    return;
  }
  KDA_CHECK(track.slots.size() == B && track.steps.size() == B,
            "prepare_extend: ExtendTrack.slots / steps have {} / {} entries for {} requests "
            "(both B, or both empty = no tracks)",
            track.slots.size(), track.steps.size(), B);
  const int S = pool_.num_slots();
  for (size_t n = 0; n < B; ++n) {
    const int32_t k = track.steps[n], t = track.slots[n];
    if (batch.slots[n] < 0 || k == -1) {
      continue;
    }
    KDA_CHECK(k >= 0 && k < batch.T,
              "prepare_extend: track.steps[{}] = {} out of range [-1, T = {}) (-1 = no track)", n,
              k, batch.T);
    KDA_CHECK(t >= 0 && t < S && pool_.is_slot_allocated(t),
              "prepare_extend: track.slots[{}] = {} is not an allocated slot in [0, {})", n, t, S);
    for (size_t m = 0; m < B; ++m) {
      KDA_CHECK(batch.slots[m] != t,
                "prepare_extend: track.slots[{}] = {} is also slots[{}] (a track slot is outside "
                "the batch)",
                n, t, m);
      KDA_CHECK(m >= n || batch.slots[m] < 0 || track.steps[m] == -1 || track.slots[m] != t,
                "prepare_extend: track.slots[{}] and track.slots[{}] are both {} (one track per "
                "slot)",
                m, n, t);
    }
  }
}

void KdaAttentionBackend::prepare_round(RoundKind kind, const BatchSpec& batch,
                                        const ExtendTrack* track, cudaStream_t stream) {
  round_.check_can_prepare(kind == RoundKind::kVerify ? "prepare" : "prepare_extend");
  validate_batch(kind, batch);
  if (track != nullptr) {
    validate_tracks(batch, *track);
  }
  const int B = static_cast<int>(batch.slots.size());
  // Scratch rows default to the batch position (a padding row's entry is never read).
  upload_rows_.clear();
  for (int n = 0; n < B; ++n) {
    upload_rows_.push_back(batch.rows.empty() ? n : batch.rows[static_cast<size_t>(n)]);
  }
  const bool tracks = track != nullptr && !track->slots.empty();
  // A ragged batch's packed offsets (validated against its lengths when given).
  BatchIndices::Shape shape;
  int64_t tokens = static_cast<int64_t>(B) * batch.T;
  if (!batch.lengths.empty()) {
    upload_offsets_.assign(1, 0);
    for (const int32_t len : batch.lengths) {
      upload_offsets_.push_back(upload_offsets_.back() + len);
    }
    shape.offsets = upload_offsets_.data();
    tokens = upload_offsets_.back();
  }
  if (!batch.parents.empty()) {
    shape.parents = batch.parents.data();
    shape.T = batch.T;
  }
  indices_.upload(batch.slots.data(), upload_rows_.data(), B, stream,
                  tracks ? track->slots.data() : nullptr, tracks ? track->steps.data() : nullptr,
                  shape);
  batch_slots_.assign(batch.slots.begin(), batch.slots.end());
  batch_tracks_.clear();
  for (size_t n = 0; tracks && n < batch.slots.size(); ++n) {
    if (batch.slots[n] >= 0 && track->steps[n] >= 0) {
      batch_tracks_.push_back(track->slots[n]);
    }
  }
  batch_B_ = B;
  batch_T_ = batch.T;
  batch_tokens_ = tokens;
  batch_shape_ = !batch.parents.empty()   ? DraftShape::kTree
                 : !batch.lengths.empty() ? DraftShape::kRagged
                                          : DraftShape::kDense;
  round_.on_prepared(kind);
}

void KdaAttentionBackend::prepare(const BatchSpec& batch, cudaStream_t stream) {
  prepare_round(RoundKind::kVerify, batch, nullptr, stream);
}

void KdaAttentionBackend::prepare_extend(const BatchSpec& batch, cudaStream_t stream) {
  prepare_extend(batch, ExtendTrack{}, stream);
}

void KdaAttentionBackend::prepare_extend(const BatchSpec& batch, const ExtendTrack& track,
                                         cudaStream_t stream) {
  if (deferred_) {
    // Extend continues from the committed state: fold what is pending first (validated first,
    // so that a bad batch changes nothing). A prepared round that no layer ran is replaced.
    // The track slots' own pending steps go too (their state is overwritten).
    validate_batch(RoundKind::kExtend, batch);
    validate_tracks(batch, track);
    round_.check_can_prepare("prepare_extend");
    round_.abort();
    std::vector<int32_t> live;
    for (size_t n = 0; n < batch.slots.size(); ++n) {
      if (batch.slots[n] >= 0) {
        live.push_back(batch.slots[n]);
        if (!track.steps.empty() && track.steps[n] >= 0) {
          live.push_back(track.slots[n]);
        }
      }
    }
    materialize(live, stream);
  }
  prepare_round(RoundKind::kExtend, batch, &track, stream);
}

void KdaAttentionBackend::check_layer_ready(RoundKind kind, int layer) const {
  const char* call = round_kind_name(kind);
  KDA_CHECK(layer >= 0 && layer < model_.num_layers, "{}: layer {} out of range [0, {})", call,
            layer, model_.num_layers);
  round_.check_can_run(kind, layer);
  KDA_CHECK_CODE(weights_[static_cast<size_t>(layer)].A_log.defined(), ErrorCode::kLifecycle,
                 "{}(layer {}): no weights set (call set_layer_weights({}, ...) first)", call,
                 layer, layer);
}

void KdaAttentionBackend::validate_activations(const char* call, int layer, const VerifyInputs& in,
                                               const TensorView& out) const {
  const int64_t N = batch_tokens_;  // B*T, or a ragged batch's packed rows
  const int64_t HV = model_.HV;
  try {
    expect_activation(in.mixed_qkv, "mixed_qkv", device_, N, model_.qkv_dim());
    expect_activation(in.a, "a", device_, N, HV * model_.K);
    expect_activation(in.b, "b", device_, N, HV);
    expect_tensor(out, "out", DType::kBF16, device_, {N, HV, model_.V});
    expect_contiguous(out, "out");
    expect_aligned(out, "out", dtype_size(DType::kBF16));
  } catch (const Error& e) {
    KDA_THROW(e.code(), "{}(layer {}): {}", call, layer, e.message());
  }
}

VerifyParams KdaAttentionBackend::make_verify_params(int layer, const VerifyInputs& in,
                                                     const TensorView& out) const {
  ops::StateTensors state;
  state.conv_state = pool_.conv_state(layer);
  state.ssm_state = pool_.ssm_state(layer);
  state.conv_window = pool_.conv_window(layer);
  if (pool_.ring_mode()) {
    state.ring_rawv = pool_.ring_rawv(layer);
    state.ring_rawk = pool_.ring_rawk(layer);
    state.ring_g = pool_.ring_g(layer);
    state.ring_beta = pool_.ring_beta(layer);
  } else {
    state.snapshots = pool_.snapshots(layer);
  }
  state.qkv_act = pool_.qkv_act();
  if (deferred_) {
    state.ring_cursor = pool_.ring_cursor();
    state.ring_pending = pool_.ring_pending(layer);
    state.ring_u = pool_.ring_u(layer);  // undefined with the lazy write-back
  }
  ops::detail::VerifyCall call;
  call.B = batch_B_;
  call.T = batch_T_;
  call.gate = model_.gate;
  call.lower_bound = model_.lower_bound;
  call.conv_weight_type = model_.conv_weight_type;
  call.mixed_qkv = in.mixed_qkv;
  call.a = in.a;
  call.b = in.b;
  call.out = out;
  call.weights = &weights_[static_cast<size_t>(layer)];
  call.slots = indices_.slots_data();
  call.rows = indices_.rows_data();
  if (batch_shape_ == DraftShape::kRagged) {
    call.token_offsets = indices_.offsets_data();
  } else if (batch_shape_ == DraftShape::kTree) {
    call.parents = indices_.parents_data();
  }
  // After the round's first verify the commit has ended (VerifyParams::fold_before_wait), and the
  // previous verify wrote another layer.
  call.fold_before_wait = round_.layers_done() > 0 ? 1 : 0;
  return ops::detail::verify_params(dims_of(pool_, deferred_), state, call);
}

DispatchProblem KdaAttentionBackend::make_dispatch_problem(int layer,
                                                           const VerifyInputs& in) const {
  RingViews rings;
  if (pool_.ring_mode()) {
    rings = RingViews{pool_.ring_rawv(layer), pool_.ring_rawk(layer), pool_.ring_g(layer),
                      pool_.ring_beta(layer)};
  }
  // Ragged chains take the fused path too; trees are not plain chains.
  return ops::detail::dispatch_problem(
      dims_of(pool_, deferred_), batch_B_, batch_T_, batch_shape_ != DraftShape::kTree,
      batch_tokens_, in.mixed_qkv, in.a, in.b, weights_[static_cast<size_t>(layer)],
      indices_.slots(batch_B_), indices_.rows(batch_B_), rings);
}

void KdaAttentionBackend::record_decision(int layer, const DispatchDecision& d) {
  std::optional<DispatchDecision>& last = last_decision_[static_cast<size_t>(layer)];
  if ((!last || !last->same_choice(d)) && logger().should_log(spdlog::level::debug)) {
    logger().debug("verify layer {} (B={}, T={}): {}", layer, batch_B_, batch_T_, d.describe());
  }
  last = d;
  ++(d.fused() ? fused_calls_ : unfused_calls_);
}

DispatchDecision KdaAttentionBackend::verify(int layer, const VerifyInputs& in,
                                             const TensorView& out, cudaStream_t stream) {
  check_layer_ready(RoundKind::kVerify, layer);
  validate_activations("verify", layer, in, out);
  const VerifyParams params = make_verify_params(layer, in, out);
  // The ops' dispatch: choose the path, plan it once, launch what the plan says.
  const DispatchDecision decision =
      ops::detail::run_verify(*kernels_, params, make_dispatch_problem(layer, in), platform_,
                              flags_.dispatch_flags(), stream);
  record_decision(layer, decision);
  // Only a deferred backend whose verifies fold needs it (abort_round); the query is a driver
  // call per verify.
  verify_ran_[static_cast<size_t>(layer)] = deferred_ && !lazy_ && !capturing(device_, stream);
  round_.on_layer_done(layer);
  return decision;
}

void KdaAttentionBackend::extend(int layer, const VerifyInputs& in, const TensorView& out,
                                 cudaStream_t stream) {
  check_layer_ready(RoundKind::kExtend, layer);
  validate_activations("extend", layer, in, out);
  // Extend commits in place: it takes the verify's sizes, inputs, weights, state and batch, and
  // no scratch or records (T may exceed T_max: T_max = T keeps the params' T <= T_max).
  ExtendParams e = extend_params_of(make_verify_params(layer, in, out));
  e.T_max = batch_T_;
  // Extend's outputs come with the committed state it writes: exact (§3) whatever
  // --kda-verify-numerics says (contract §10).
  e.numerics = VerifyNumerics::kExact;
  e.ssm_state_out = static_cast<float*>(pool_.ssm_state(layer).data());
  e.conv_state_out = static_cast<bf16_t*>(pool_.conv_state(layer).data());
  if (!batch_tracks_.empty()) {
    e.track_slots = indices_.track_slots_data();
    e.track_steps = indices_.track_steps_data();
  }
  kernels_->extend(e, stream);
  round_.on_layer_done(layer);
}

void KdaAttentionBackend::commit(const TensorView& accepted_lengths, cudaStream_t stream) {
  enqueue_commit(accepted_lengths, nullptr, nullptr, stream);
}

void KdaAttentionBackend::commit(const TensorView& accepted_lengths, const CommitTrack& track,
                                 cudaStream_t stream) {
  enqueue_commit(accepted_lengths, nullptr, &track, stream);
}

void KdaAttentionBackend::commit_tree(const TensorView& accepted_lengths,
                                      const TensorView& accepted_paths, cudaStream_t stream) {
  enqueue_commit(accepted_lengths, &accepted_paths, nullptr, stream);
}

void KdaAttentionBackend::commit_tree(const TensorView& accepted_lengths,
                                      const TensorView& accepted_paths, const CommitTrack& track,
                                      cudaStream_t stream) {
  enqueue_commit(accepted_lengths, &accepted_paths, &track, stream);
}

void KdaAttentionBackend::enqueue_commit(const TensorView& accepted_lengths,
                                         const TensorView* accepted_paths, const CommitTrack* track,
                                         cudaStream_t stream) {
  const char* call = accepted_paths != nullptr ? "commit_tree" : "commit";
  round_.check_can_commit(call);
  const bool tree = batch_shape_ == DraftShape::kTree;
  KDA_CHECK_CODE(tree == (accepted_paths != nullptr), ErrorCode::kLifecycle,
                 "{}: the prepared round is a {} batch; {}", call, draft_shape_name(batch_shape_),
                 tree ? "a tree round commits with its accepted paths (commit_tree)"
                      : "only a tree round commits accepted paths (commit)");
  try {
    if (accepted_paths != nullptr) {
      expect_tensor(*accepted_paths, "accepted_paths", DType::kI32, device_, {batch_B_, batch_T_});
      expect_contiguous(*accepted_paths, "accepted_paths");
      expect_aligned(*accepted_paths, "accepted_paths", dtype_size(DType::kI32));
    }
    const std::pair<const TensorView*, const char*> views[] = {
        {&accepted_lengths, "accepted_lengths"},
        {track != nullptr ? &track->slots : nullptr, "track.slots"},
        {track != nullptr ? &track->steps : nullptr, "track.steps"}};
    for (const auto& [view, name] : views) {
      if (view != nullptr) {
        expect_tensor(*view, name, DType::kI32, device_, {batch_B_});
        expect_contiguous(*view, name);
        expect_aligned(*view, name, dtype_size(DType::kI32));
      }
    }
  } catch (const Error& e) {
    KDA_THROW(e.code(), "{}: {}", call, e.message());
  }
  CommitParams c = make_commit_params(lazy_       ? CommitKind::kLazy
                                      : deferred_ ? CommitKind::kDeferred
                                                  : CommitKind::kEager);
  if (lazy_) {
    c.lazy_fold_interval = flags_.lazy_fold_interval;
  }
  c.B = batch_B_;
  c.T = batch_T_;
  c.accepted = static_cast<const int32_t*>(accepted_lengths.data());
  if (batch_shape_ != DraftShape::kDense) {
    c.checked_accepted = static_cast<int32_t*>(checked_accepted_.data());
  }
  if (batch_shape_ == DraftShape::kRagged) {
    c.token_offsets = indices_.offsets_data();
  } else if (tree) {
    c.parents = indices_.parents_data();
    c.accepted_paths = static_cast<const int32_t*>(accepted_paths->data());
  }
  if (track != nullptr) {
    c.track_slots = static_cast<const int32_t*>(track->slots.data());
    c.track_steps = static_cast<const int32_t*>(track->steps.data());
    // Slots allocated or released since prepare: the tracks see the table as of this call. A
    // captured commit keeps the table of the prepare before each replay.
    if (indices_.slot_table_dirty() && !capturing(device_, stream)) {
      indices_.flush_slot_table(stream);
    }
  }
  kernels_->commit(c, stream);
  round_.on_committed();
}

ExternalPoolTensors KdaAttentionBackend::pool_state() const {
  ExternalPoolTensors t;
  t.conv_state = pool_.conv_state_all();
  t.ssm_state = pool_.ssm_state_all();
  t.conv_window = pool_.conv_window_all();
  t.snapshots = pool_.snapshots_all();
  t.ring_rawv = pool_.ring_rawv_all();
  t.ring_rawk = pool_.ring_rawk_all();
  t.ring_g = pool_.ring_g_all();
  t.ring_beta = pool_.ring_beta_all();
  t.ring_cursor = pool_.ring_cursor();
  t.ring_pending = pool_.ring_pending_all();
  t.ring_u = pool_.ring_u_all();
  t.qkv_act = pool_.qkv_act();
  return t;
}

CommitParams KdaAttentionBackend::make_commit_params(CommitKind kind) const {
  // The ops' commit params (backend/ops.h) over the pool, with the backend's index buffers.
  ops::detail::CommitCall call;
  call.kind = kind;
  call.slots = indices_.slots_data();
  call.rows = indices_.rows_data();
  call.slot_allocated = indices_.slot_table_data();
  call.error_flag = static_cast<int32_t*>(error_flag_.data());
  return ops::detail::commit_params(dims_of(pool_, deferred_), pool_state(), call);
}

void KdaAttentionBackend::materialize(const std::vector<int32_t>& slots, cudaStream_t stream) {
  KDA_CHECK_CODE(round_.kind() == RoundKind::kNone, ErrorCode::kLifecycle,
                 "materialize: a round is in progress ({}); commit() or abort_round() first",
                 round_.describe());
  for (size_t i = 0; i < slots.size(); ++i) {
    const int32_t s = slots[i];
    KDA_CHECK(s >= 0 && s < pool_.num_slots() && pool_.is_slot_allocated(s),
              "materialize: slots[{}] = {} is not an allocated slot in [0, {})", i, s,
              pool_.num_slots());
    for (size_t j = 0; j < i; ++j) {
      KDA_CHECK(slots[j] != s, "materialize: slots[{}] and slots[{}] are both {} (distinct slots)",
                j, i, s);
    }
  }
  if (!deferred_ || slots.empty()) {
    return;  // nothing is ever pending
  }
  // In pieces of the index buffer's capacity: the fold kernel reads the uploaded slots.
  const int capacity = indices_.capacity();
  upload_rows_.assign(static_cast<size_t>(capacity), -1);
  for (size_t first = 0; first < slots.size(); first += static_cast<size_t>(capacity)) {
    const int B = static_cast<int>(std::min(slots.size() - first, static_cast<size_t>(capacity)));
    indices_.upload(slots.data() + first, upload_rows_.data(), B, stream);
    CommitParams c = make_commit_params(CommitKind::kMaterialize);
    c.B = B;
    c.T = pool_.T_max();
    kernels_->commit(c, stream);
  }
}

void KdaAttentionBackend::record_graph_verify_round() {
  round_.check_can_mark_graph_round();
  std::fill(verify_ran_.begin(), verify_ran_.end(), 1);  // the replay runs every layer
  round_.on_graph_round();
}

void KdaAttentionBackend::abort_round(cudaStream_t stream) {
  // The verifies that ran folded their layer's pending steps and wrote them back: those layers'
  // counts go (the others keep theirs for the next verify).
  if (deferred_ && !lazy_ && round_.kind() == RoundKind::kVerify) {
    CommitParams c = make_commit_params(CommitKind::kDropPending);
    c.B = batch_B_;
    c.T = batch_T_;
    c.num_layers = 1;
    for (int layer = 0; layer < model_.num_layers; ++layer) {
      if (round_.layer_done(layer) && verify_ran_[static_cast<size_t>(layer)] != 0) {
        c.ring_pending = static_cast<int32_t*>(pool_.ring_pending(layer).data());
        kernels_->commit(c, stream);
      }
    }
  }
  round_.abort();
}

DispatchStats KdaAttentionBackend::stats() const {
  DispatchStats s;
  s.fused_calls = fused_calls_;
  s.unfused_calls = unfused_calls_;
  s.last_decision = last_decision_;
  return s;
}

void KdaAttentionBackend::reset_stats() {
  fused_calls_ = 0;
  unfused_calls_ = 0;
  std::fill(last_decision_.begin(), last_decision_.end(), std::nullopt);
}

void KdaAttentionBackend::check_device_errors(cudaStream_t stream) {
  int32_t flag = 0;
  if (device_.is_cuda()) {
    KDA_CUDA_CHECK(cudaStreamSynchronize(stream));  // every commit enqueued so far has run
    KDA_CUDA_CHECK(cudaMemcpy(&flag, error_flag_.data(), sizeof(flag), cudaMemcpyDeviceToHost));
  } else {
    error_flag_.download(&flag, sizeof(flag));
  }
  if (flag == 0) {
    return;
  }
  // Cleared on `stream`, so it is ordered before the next commit enqueued there.
  if (device_.is_cuda()) {
    KDA_CUDA_CHECK(cudaMemsetAsync(error_flag_.data(), 0, sizeof(int32_t), stream));
  } else {
    const int32_t zero = 0;
    error_flag_.upload(&zero, sizeof(zero));
  }
  std::vector<std::string> what;
  if ((flag & kBadPath) != 0) {
    what.emplace_back(
        "an accepted path that is not a root path of its request's tree was passed; the affected "
        "requests were skipped and keep their previous committed state");
  } else if ((flag & kBadAcceptedLength) != 0) {
    // (A bad path also skips its request as a zero length: reported above.)
    what.emplace_back(
        "an accepted length outside [1, T] (ragged: [1, T_n]) was passed; the affected requests "
        "were skipped and keep their previous committed state");
  }
  if ((flag & kBadTrack) != 0) {
    what.emplace_back(
        "a track step at or beyond its accepted length, or a track slot out of range, not "
        "allocated, in the batch or claimed twice, was passed; those tracks were not written");
  }
  KDA_THROW(ErrorCode::kInvalidArgument, "commit: {}", fmt::format("{}", fmt::join(what, "; ")));
}

}  // namespace kda
