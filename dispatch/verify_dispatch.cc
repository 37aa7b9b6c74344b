#include "dispatch/verify_dispatch.h"

#include <fmt/format.h>

#include "kernels/kda_kernels.h"

namespace kda {

namespace {

// Rule 3 bookkeeping: records the first unmet requirement into the decision.
class FusedSupportCheck {
 public:
  explicit FusedSupportCheck(DispatchDecision& d) : d_(d) {}

  /// Records a failure (if none yet) and returns false when `ok` is false.
  bool require(bool ok, DispatchReason reason, const char* subject, const char* expectation,
               int64_t got) {
    if (ok || failed_) {
      return ok;
    }
    failed_ = true;
    d_.reason = reason;
    d_.subject = subject;
    d_.expectation = expectation;
    d_.got = got;
    return false;
  }
  bool require_dtype(bool ok, DispatchReason reason, const char* subject, const char* expectation,
                     DType got) {
    const bool first_failure = !ok && !failed_;
    require(ok, reason, subject, expectation, static_cast<int64_t>(got));
    if (first_failure) {
      d_.got_kind = DispatchDecision::GotKind::kDType;
    }
    return ok;
  }
  bool require_device(bool ok, const char* subject, const Device& got, const Device& expected) {
    const bool first_failure = !ok && !failed_;
    require(ok, DispatchReason::kUnsupportedDevice, subject, "mixed_qkv's device", 0);
    if (first_failure) {
      d_.got_kind = DispatchDecision::GotKind::kDevice;
      d_.got_device = got;
      d_.expected_device = expected;
    }
    return ok;
  }
  bool failed() const { return failed_; }

 private:
  DispatchDecision& d_;
  bool failed_ = false;
};

// A 2-D activation [rows, cols]: extents, unit inner stride, a row pitch that fits a row.
void check_matrix(FusedSupportCheck& c, const TensorView& t, int64_t rows, int64_t cols,
                  const char* ndim_subject, const char* rows_subject, const char* cols_subject,
                  const char* cols_expectation, const char* stride_subject) {
  if (!c.require(t.ndim() == 2, DispatchReason::kUnsupportedShape, ndim_subject, "2", t.ndim())) {
    return;
  }
  c.require(t.size(0) == rows, DispatchReason::kUnsupportedShape, rows_subject,
            "the batch's tokens (B*T, or the ragged total)", t.size(0));
  c.require(t.size(1) == cols, DispatchReason::kUnsupportedShape, cols_subject, cols_expectation,
            t.size(1));
  c.require(t.size(1) <= 1 || t.stride(1) == 1, DispatchReason::kUnsupportedStrides, stride_subject,
            "1 (inner dim contiguous)", t.stride(1));
  c.require(t.size(0) <= 1 || t.stride(0) >= t.size(1), DispatchReason::kUnsupportedStrides,
            stride_subject, ">= the row width (row pitch)", t.stride(0));
}

void check_index(FusedSupportCheck& c, const TensorView& t, int B, const char* shape_subject,
                 const char* dtype_subject, const char* stride_subject) {
  using R = DispatchReason;
  const bool shape_ok = t.defined() && t.ndim() == 1 && t.size(0) == B;
  if (!c.require(t.defined() && t.ndim() == 1, R::kUnsupportedIndices, shape_subject, "1-d [B]",
                 t.ndim())) {
    return;
  }
  c.require(shape_ok, R::kUnsupportedIndices, shape_subject, "B", t.size(0));
  c.require_dtype(t.dtype() == DType::kI32, R::kUnsupportedIndices, dtype_subject, "int32",
                  t.dtype());
  c.require(B <= 1 || t.stride(0) == 1, R::kUnsupportedIndices, stride_subject, "1", t.stride(0));
}

}  // namespace

const char* verify_path_name(VerifyPath path) noexcept {
  switch (path) {
    case VerifyPath::kUnfused:
      return "unfused";
    case VerifyPath::kFused:
      return "fused";
  }
  return "?";
}

const char* dispatch_reason_name(DispatchReason reason) noexcept {
  switch (reason) {
    case DispatchReason::kSnapshotFused:
      return "snapshot_fused";
    case DispatchReason::kRingFused:
      return "ring_fused";
    case DispatchReason::kRingLazyFused:
      return "ring_lazy_fused";
    case DispatchReason::kFusedDisabled:
      return "fused_disabled";
    case DispatchReason::kNotPlainChain:
      return "not_plain_chain";
    case DispatchReason::kUnsupportedShape:
      return "unsupported_shape";
    case DispatchReason::kUnsupportedDtype:
      return "unsupported_dtype";
    case DispatchReason::kUnsupportedStrides:
      return "unsupported_strides";
    case DispatchReason::kUnsupportedDevice:
      return "unsupported_device";
    case DispatchReason::kUnsupportedIndices:
      return "unsupported_indices";
    case DispatchReason::kUnsupportedBlockV:
      return "unsupported_block_v";
    case DispatchReason::kRingBatchAboveLimit:
      return "ring_batch_above_limit";
    case DispatchReason::kRingPlatformUnmeasured:
      return "ring_platform_unmeasured";
    case DispatchReason::kRingLayoutRejected:
      return "ring_layout_rejected";
  }
  return "?";
}

const char* numerics_request_name(NumericsRequest request) noexcept {
  switch (request) {
    case NumericsRequest::kAuto:
      return "auto";
    case NumericsRequest::kExact:
      return "exact";
    case NumericsRequest::kFast:
      return "fast";
  }
  return "?";
}

const char* verify_numerics_name(VerifyNumerics numerics) noexcept {
  switch (numerics) {
    case VerifyNumerics::kExact:
      return "exact";
    case VerifyNumerics::kFast:
      return "fast";
  }
  return "?";
}

const char* numerics_reason_name(NumericsReason reason) noexcept {
  switch (reason) {
    case NumericsReason::kFastRequested:
      return "fast_requested";
    case NumericsReason::kAutoFast:
      return "auto_fast";
    case NumericsReason::kExactRequested:
      return "exact_requested";
    case NumericsReason::kAutoExact:
      return "auto_exact";
    case NumericsReason::kAutoUnmeasured:
      return "auto_unmeasured";
    case NumericsReason::kExactSnapshotMode:
      return "exact_snapshot_mode";
    case NumericsReason::kExactTree:
      return "exact_tree";
    case NumericsReason::kExactTokens:
      return "exact_tokens";
    case NumericsReason::kExactUnfused:
      return "exact_unfused";
    case NumericsReason::kExactDeferredFold:
      return "exact_deferred_fold";
    case NumericsReason::kExactBlockV:
      return "exact_block_v";
    case NumericsReason::kLazyHistory:
      return "lazy_history";
    case NumericsReason::kAutoUFree:
      return "auto_u_free";
  }
  return "?";
}

int resolve_block_v(int block_v) noexcept {
  return block_v == 0 ? kernels::kDefaultFusedBlockV : block_v;
}

namespace {

// Rules 1-5: the path and its tile.
DispatchDecision choose_path(const DispatchProblem& p, const Platform& platform,
                             const DispatchFlags& flags) noexcept {
  DispatchDecision d;
  d.B = p.B;
  d.arch = platform.family();
  d.limit = flags.fused_ring_max_batch;
  if (!flags.fused_verify) {
    d.reason = DispatchReason::kFusedDisabled;
    return d;
  }
  if (!p.plain_chain) {
    d.reason = DispatchReason::kNotPlainChain;
    return d;
  }

  FusedSupportCheck c(d);
  using R = DispatchReason;
  c.require(p.B >= 1, R::kUnsupportedShape, "B", ">= 1", p.B);
  c.require(p.T >= 1 && p.T <= kFusedMaxTokens, R::kUnsupportedShape, "T", "1..16", p.T);
  c.require(p.H >= 1, R::kUnsupportedShape, "H", ">= 1", p.H);
  c.require(p.HV >= 1 && p.HV % (p.H >= 1 ? p.H : 1) == 0, R::kUnsupportedShape, "HV",
            "a positive multiple of H", p.HV);
  c.require(p.K == 64 || p.K == 128, R::kUnsupportedShape, "K (head_k_dim)", "64 or 128", p.K);
  c.require(p.V >= 1, R::kUnsupportedShape, "V (head_v_dim)", ">= 1", p.V);
  c.require(p.conv_width == kConvWidth, R::kUnsupportedShape, "conv width W", "4", p.conv_width);
  if (c.failed()) {
    return d;
  }
  const int64_t N = p.tokens > 0 ? p.tokens : static_cast<int64_t>(p.B) * p.T;
  const int64_t D = 2 * static_cast<int64_t>(p.H) * p.K + static_cast<int64_t>(p.HV) * p.V;
  check_matrix(c, p.mixed_qkv, N, D, "mixed_qkv ndim", "mixed_qkv rows", "mixed_qkv columns",
               "D = 2*H*K + HV*V", "mixed_qkv strides");
  check_matrix(c, p.a, N, static_cast<int64_t>(p.HV) * p.K, "a ndim", "a rows", "a columns", "HV*K",
               "a strides");
  check_matrix(c, p.b, N, p.HV, "b ndim", "b rows", "b columns", "HV", "b strides");
  const bool weight_2d = p.conv_weight.ndim() == 2;
  c.require(weight_2d && p.conv_weight.size(0) == D && p.conv_weight.size(1) == kConvWidth,
            R::kUnsupportedShape, "conv_weight shape", "[D, 4]", p.conv_weight.ndim());
  c.require(!p.conv_bias.defined() || (p.conv_bias.ndim() == 1 && p.conv_bias.size(0) == D),
            R::kUnsupportedShape, "conv_bias shape", "[D]", p.conv_bias.ndim());

  c.require_dtype(p.mixed_qkv.dtype() == DType::kBF16, R::kUnsupportedDtype, "mixed_qkv dtype",
                  "bf16", p.mixed_qkv.dtype());
  c.require_dtype(p.a.dtype() == DType::kBF16, R::kUnsupportedDtype, "a dtype", "bf16",
                  p.a.dtype());
  c.require_dtype(p.b.dtype() == DType::kBF16, R::kUnsupportedDtype, "b dtype", "bf16",
                  p.b.dtype());
  const DType wt = p.conv_weight.dtype();
  c.require_dtype(wt == DType::kF32 || wt == DType::kBF16, R::kUnsupportedDtype,
                  "conv_weight dtype", "f32 or bf16", wt);
  c.require_dtype(!p.conv_bias.defined() || p.conv_bias.dtype() == wt, R::kUnsupportedDtype,
                  "conv_bias dtype", "conv_weight's dtype", p.conv_bias.dtype());

  c.require(p.conv_weight.is_contiguous(), R::kUnsupportedStrides, "conv_weight strides",
            "packed (4, 1)", weight_2d ? p.conv_weight.stride(0) : 0);
  c.require(!p.conv_bias.defined() || p.conv_bias.is_contiguous(), R::kUnsupportedStrides,
            "conv_bias strides", "1", p.conv_bias.ndim() == 1 ? p.conv_bias.stride(0) : 0);

  const Device& dev = p.mixed_qkv.device();
  const struct {
    const TensorView* view;
    const char* subject;
  } placed[] = {{&p.a, "a device"},
                {&p.b, "b device"},
                {&p.conv_weight, "conv_weight device"},
                {&p.conv_bias, "conv_bias device"},
                {&p.slots, "slots device"},
                {&p.rows, "rows device"}};
  for (const auto& t : placed) {
    c.require_device(!t.view->defined() || t.view->device() == dev, t.subject, t.view->device(),
                     dev);
  }

  check_index(c, p.slots, p.B, "slots shape", "slots dtype", "slots stride");
  check_index(c, p.rows, p.B, "rows shape", "rows dtype", "rows stride");

  // auto (0): the benchmark's best tile for this grid (a deferred verify's own rule: it folds
  // pending steps first).
  const int block_v = flags.block_v != 0
                          ? flags.block_v
                          : kernels::default_fused_block_v(p.mode, p.B, p.T, p.HV, p.V,
                                                           platform.sm_count, p.deferred);
  // The supported set, spelled from kernels::kFusedBlockVs (static: the decision keeps the
  // pointer).
  static const std::string kBlockVs =
      fmt::format("one of {}", fmt::join(kernels::kFusedBlockVs, ", "));
  c.require(kernels::is_fused_block_v(block_v), R::kUnsupportedBlockV, "block_v", kBlockVs.c_str(),
            block_v);
  if (c.failed()) {
    return d;
  }

  if (p.mode == RecordMode::kSnapshot) {
    d.path = VerifyPath::kFused;
    d.reason = R::kSnapshotFused;
    d.block_v = block_v;
    return d;
  }
  // Ring mode: fused+ring is only a measured win for small batches on SM90/SM100
  // (upstream §8.1: at B >= 4 it regressed 1.9-5.6x on H20), hence the explicit gates. The lazy
  // write-back's verify runs the fast outputs or nothing: it skips both.
  if (p.B > flags.fused_ring_max_batch && !p.lazy) {
    d.reason = R::kRingBatchAboveLimit;
    return d;
  }
  if (d.arch != ArchFamily::kSM90 && d.arch != ArchFamily::kSM100 && !p.lazy) {
    d.reason = R::kRingPlatformUnmeasured;
    return d;
  }
  RingLayoutExpectation want;
  want.H = p.H;
  want.HV = p.HV;
  want.K = p.K;
  want.V = p.V;
  want.T = p.T;
  want.num_slots = p.num_slots;
  want.activation_dtype = p.mixed_qkv.dtype();
  want.device = dev;
  d.ring = check_ring_layout(p.rings, want);
  if (!d.ring.ok()) {
    d.reason = R::kRingLayoutRejected;
    return d;
  }
  d.path = VerifyPath::kFused;
  d.reason = p.lazy ? R::kRingLazyFused : R::kRingFused;
  d.block_v = block_v;
  return d;
}

// The numerics gates (file comment of verify_dispatch.h) in order: the first that fails, else
// none. Mirrors kernels::fast_outputs_plannable on the call's params.
bool fast_outputs_gated(const DispatchDecision& d, const DispatchProblem& p,
                        const DispatchFlags& flags, NumericsReason& why) noexcept {
  using N = NumericsReason;
  if (p.mode != RecordMode::kRing) {
    why = N::kExactSnapshotMode;
  } else if (!p.plain_chain) {
    why = N::kExactTree;
  } else if (p.T < 1 || p.T > kernels::kFastMaxTokens) {
    why = N::kExactTokens;
  } else if (!d.fused()) {
    why = N::kExactUnfused;
  } else if (p.deferred && p.u_records) {
    why = N::kExactDeferredFold;
  } else if (flags.block_v != 0 && !kernels::is_fast_block_v(flags.block_v)) {
    why = N::kExactBlockV;
  } else {
    return false;
  }
  return true;
}

// The outputs' numerics of the path `d` chose; a fast call's auto tile.
void choose_numerics(DispatchDecision& d, const DispatchProblem& p, const Platform& platform,
                     const DispatchFlags& flags) noexcept {
  using N = NumericsReason;
  d.numerics = VerifyNumerics::kExact;
  d.T = p.T;
  if (flags.numerics == NumericsRequest::kExact) {
    d.numerics_reason = N::kExactRequested;
    return;
  }
  if (fast_outputs_gated(d, p, flags, d.numerics_reason)) {
    return;
  }
  if (p.lazy) {
    d.numerics_reason = N::kLazyHistory;
  } else if (flags.numerics == NumericsRequest::kFast) {
    d.numerics_reason = N::kFastRequested;
  } else if (p.deferred && !p.u_records) {
    // auto in a u-free deferred backend: its fast kernel folds the pending steps; an exact call
    // would fold them in a kernel of its own first (one state pass more).
    d.numerics_reason = N::kAutoUFree;
  } else {
    const NumericsPolicyCard& card = flags.numerics_table != nullptr
                                         ? *flags.numerics_table
                                         : nearest_numerics_policy_card(platform.memory_gbps);
    const NumericsPolicyRow* row = numerics_policy_row(card, {p.H, p.HV, p.K, p.V, p.T, p.B});
    if (row == nullptr) {
      d.numerics_reason = N::kAutoUnmeasured;
      return;
    }
    d.numerics_card = card.name;
    d.numerics_row_B = row->B;
    if (row->pick != VerifyNumerics::kFast) {
      d.numerics_reason = N::kAutoExact;
      return;
    }
    d.numerics_reason = N::kAutoFast;
  }
  d.numerics = VerifyNumerics::kFast;
  // auto (0): the fast kernel's own rule (two CTAs per SM, every SM busy).
  if (flags.block_v == 0) {
    d.block_v = kernels::default_fast_block_v(p.B, p.HV, p.V, platform.sm_count);
  }
}

}  // namespace

DispatchDecision choose_verify_path(const DispatchProblem& p, const Platform& platform,
                                    const DispatchFlags& flags) noexcept {
  DispatchDecision d = choose_path(p, platform, flags);
  choose_numerics(d, p, platform, flags);
  return d;
}

std::string DispatchDecision::describe() const {
  const std::string reason_text = describe_reason();
  return plan.K == 0 ? reason_text : fmt::format("{}; runs {}", reason_text, plan.kernel());
}

std::string DispatchDecision::describe_reason() const {
  return fmt::format("{}; {}", describe_path(), describe_numerics());
}

std::string DispatchDecision::describe_numerics() const {
  using N = NumericsReason;
  switch (numerics_reason) {
    case N::kFastRequested:
      return "outputs fast (tensor cores): --kda-verify-numerics fast";
    case N::kAutoFast:
      return fmt::format(
          "outputs fast (tensor cores): auto, measured faster on the step ({}, row B = {})",
          numerics_card, numerics_row_B);
    case N::kExactRequested:
      return "outputs exact: --kda-verify-numerics exact";
    case N::kAutoExact:
      return fmt::format(
          "outputs exact: auto, fast measured no faster on the step ({}, row B = {})",
          numerics_card, numerics_row_B);
    case N::kAutoUnmeasured:
      return "outputs exact: auto: no measurement for this shape";
    case N::kExactSnapshotMode:
      return "outputs exact: snapshot mode";
    case N::kExactTree:
      return "outputs exact: a tree draft";
    case N::kExactTokens:
      return fmt::format("outputs exact: T = {} outside one fast chunk (1..{})", T,
                         kernels::kFastMaxTokens);
    case N::kExactUnfused:
      return "outputs exact: the unfused path";
    case N::kExactDeferredFold:
      return "outputs exact: the deferred commit keeps u records (its pool is not u-free)";
    case N::kExactBlockV:
      return fmt::format("outputs exact: --kda-verify-block-v = {} is not a fast tile ({})",
                         block_v, fmt::join(kernels::kFastBlockVs, ", "));
    case N::kLazyHistory:
      return "outputs fast (tensor cores): the lazy write-back (the pending steps are the fast "
             "chunk's history)";
    case N::kAutoUFree:
      return "outputs fast (tensor cores): auto, the deferred commit is u-free (auto's step table "
             "chose it for the backend's batch; the fast kernel folds the pending steps)";
  }
  return "?";
}

std::string DispatchDecision::describe_path() const {
  const char* path_text = verify_path_name(path);
  switch (reason) {
    case DispatchReason::kSnapshotFused:
      return fmt::format("fused (block_v = {}): snapshot mode (no batch or platform gate)",
                         block_v);
    case DispatchReason::kRingFused:
      return fmt::format(
          "fused (block_v = {}): ring mode with B = {} <= --kda-fused-ring-max-batch = {} on "
          "{}, ring layout ok",
          block_v, B, limit, arch_family_name(arch));
    case DispatchReason::kRingLazyFused:
      return fmt::format(
          "fused (block_v = {}): ring mode, the lazy write-back (its verify runs the fast "
          "outputs: no batch or platform gate), ring layout ok",
          block_v);
    case DispatchReason::kFusedDisabled:
      return fmt::format("{}: fused verify switched off (--kda-fused-verify)", path_text);
    case DispatchReason::kNotPlainChain:
      return fmt::format("{}: a tree draft (the fused kernels verify chains)", path_text);
    case DispatchReason::kUnsupportedShape:
    case DispatchReason::kUnsupportedDtype:
    case DispatchReason::kUnsupportedStrides:
    case DispatchReason::kUnsupportedDevice:
    case DispatchReason::kUnsupportedIndices:
    case DispatchReason::kUnsupportedBlockV: {
      std::string value = std::to_string(got);
      switch (got_kind) {
        case GotKind::kNumber:
          break;
        case GotKind::kDType:
          value = std::string(dtype_name(static_cast<DType>(got)));
          break;
        case GotKind::kDevice:
          value = fmt::format("{} (mixed_qkv on {})", device_name(got_device),
                              device_name(expected_device));
          break;
      }
      return fmt::format("{}: outside the fused kernel ({}): {} is {}, fused needs {}", path_text,
                         dispatch_reason_name(reason), subject, value, expectation);
    }
    case DispatchReason::kRingBatchAboveLimit:
      return fmt::format("{}: ring mode with B = {} > --kda-fused-ring-max-batch = {}", path_text,
                         B, limit);
    case DispatchReason::kRingPlatformUnmeasured:
      return fmt::format("{}: ring mode on {} (fused+ring is enabled on SM90 and SM100 only)",
                         path_text, arch_family_name(arch));
    case DispatchReason::kRingLayoutRejected:
      return fmt::format("{}: ring layout rejected ({}): {}", path_text,
                         ring_layout_issue_name(ring.issue), ring.describe());
  }
  return "?";
}

}  // namespace kda
