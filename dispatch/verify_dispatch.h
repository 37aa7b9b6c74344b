// verify_dispatch.h: the gated choice between the fused and the unfused verify kernels
// (contract §4). choose_verify_path is a pure host function: it reads view metadata only
// (shapes, dtypes, strides, devices; never tensor memory), never throws and never
// allocates, so the backend can call it per layer inside a CUDA-graph capture.
//
// Rules, in order (the first that applies decides):
//   1. unfused if the fused path is switched off (--kda-fused-verify off);
//   2. unfused if the verify is not a plain chain (tree / ragged drafts);
//   3. unfused if shapes, dtypes, strides, devices or index tensors are outside what the
//      fused kernel supports (see kFusedMaxTokens below), or block_v is not a fused tile;
//   4. snapshot mode: fused (no batch or platform gate);
//   5. ring mode: fused only if B <= fused_ring_max_batch (default 1) AND the platform is SM90
//      or SM100-family (the lazy write-back, whose verify runs the fast outputs only, skips
//      both gates) AND the ring views pass check_ring_layout; else unfused.
// Both paths produce bitwise-identical results (contract §3), so the choice is a speed
// decision only; the reason records why, for logs and tests.
//
// Then the outputs' numerics (contract §10, --kda-verify-numerics), on the path chosen above (the
// numerics never change the path): exact unless fast is asked for (`fast`; `auto` in a u-free
// deferred backend, whose commit form auto chose on the step table, dispatch/lazy_policy.h; else
// `auto` where numerics_policy.h's measured table says fast pays for this shape) and every gate of
// the fast outputs holds, in this order (the first that fails names the reason): ring mode; a
// chain (dense or ragged; no tree); 1 <= T <= kernels::kFastMaxTokens; the fused path; no
// deferred fold from u records (they are exact u); a fast tile (kernels::kFastBlockVs) when
// --kda-verify-block-v forces one. A fast call's auto tile is kernels::default_fast_block_v's.
// The lazy write-back (contract §11) takes fast outputs whatever auto's table says (its pending
// steps exist only as the fast chunk's history); where a gate fails its plan is refused
// (kernels::check_lazy_plan).
// These gates are kernels::fast_outputs_plannable's, so the plan of a fast decision is
// VerifySchedule::kFastChunk.
#pragma once

#include <cstdint>
#include <string>

#include "core/platform.h"
#include "core/tensor_view.h"
#include "dispatch/numerics_policy.h"
#include "dispatch/ring_layout.h"
#include "kernels/params/kda_params.h"
#include "kernels/verify/verify_plan.h"

namespace kda {

/// Rule 3, what the fused kernel supports beyond a valid verify: K in {64, 128} (32 lanes x
/// K/32 elements, the contract §3 reduction tree), W == kConvWidth (a 3-deep window),
/// T <= kFusedMaxTokens (its T buckets), bf16 activations, f32 or bf16 conv weights,
/// unit inner strides, packed conv weights, [B] int32 contiguous index tensors, one device.
constexpr int kFusedMaxTokens = 16;

/// "fused" or "unfused" (VerifyPath: kernels/verify/verify_traits.h).
const char* verify_path_name(VerifyPath path) noexcept;

/// Why a path was chosen; one value per rule outcome.
enum class DispatchReason : uint8_t {
  kSnapshotFused,           ///< rule 4
  kRingFused,               ///< rule 5, every gate passed
  kFusedDisabled,           ///< rule 1
  kNotPlainChain,           ///< rule 2
  kUnsupportedShape,        ///< rule 3: a problem size or tensor extent
  kUnsupportedDtype,        ///< rule 3: an activation or weight dtype
  kUnsupportedStrides,      ///< rule 3: a non-unit inner stride, short row pitch, unpacked weight
  kUnsupportedDevice,       ///< rule 3: tensors on different devices
  kUnsupportedIndices,      ///< rule 3: slot/row tensors not [B] int32 contiguous
  kUnsupportedBlockV,       ///< rule 3: block_v not in kernels::kFusedBlockVs
  kRingBatchAboveLimit,     ///< rule 5: B > fused_ring_max_batch
  kRingPlatformUnmeasured,  ///< rule 5: neither SM90 nor SM100-family
  kRingLayoutRejected,      ///< rule 5: check_ring_layout failed (see DispatchDecision::ring)
  kRingLazyFused,           ///< rule 5 for the lazy write-back: fused whatever B and platform
};
/// Short stable name ("snapshot_fused", "ring_batch_above_limit", ...).
const char* dispatch_reason_name(DispatchReason reason) noexcept;

/// --kda-verify-numerics: the outputs' numerics asked for (contract §10). EngineFlags keeps it as
/// its int value.
enum class NumericsRequest : uint8_t {
  kAuto = 0,   ///< numerics_policy.h's measured table decides (no row: exact)
  kExact = 1,  ///< §3's exact outputs on every call
  kFast = 2,   ///< the fast outputs wherever a call can take them
};
/// "auto", "exact" or "fast" (the flag's spelling).
const char* numerics_request_name(NumericsRequest request) noexcept;
/// "exact" or "fast".
const char* verify_numerics_name(VerifyNumerics numerics) noexcept;

/// Why the outputs take the numerics they take; one value per outcome of the numerics rules.
enum class NumericsReason : uint8_t {
  kFastRequested,      ///< --kda-verify-numerics fast, every gate passed
  kAutoFast,           ///< auto: the measured row of this shape says fast pays
  kExactRequested,     ///< --kda-verify-numerics exact
  kAutoExact,          ///< auto: the measured row of this shape says fast does not pay
  kAutoUnmeasured,     ///< auto: no measured row for this shape (the fallback: exact)
  kExactSnapshotMode,  ///< snapshot mode (the fast outputs are ring mode's)
  kExactTree,          ///< a tree draft
  kExactTokens,        ///< T outside 1..kernels::kFastMaxTokens (one fast chunk)
  kExactUnfused,       ///< the unfused path was chosen
  kExactDeferredFold,  ///< the deferred commit keeps u records (exact per-step u; not u-free)
  kExactBlockV,        ///< --kda-verify-block-v forces a tile outside kernels::kFastBlockVs
  kLazyHistory,        ///< the lazy write-back: fast whatever auto's table says (contract §11)
  kAutoUFree,  ///< auto: the deferred commit is u-free (auto chose it on the step): fast outputs
};
/// Short stable name ("fast_requested", "auto_unmeasured", "exact_deferred_fold", ...).
const char* numerics_reason_name(NumericsReason reason) noexcept;

/// The dispatcher's knobs (from EngineFlags).
struct DispatchFlags {
  bool fused_verify = true;      ///< --kda-fused-verify
  int fused_ring_max_batch = 1;  ///< --kda-fused-ring-max-batch (0: ring mode never fused)
  int block_v = 0;  ///< --kda-verify-block-v; 0 = by the grid (kernels::default_block_v)
  NumericsRequest numerics = NumericsRequest::kAuto;  ///< --kda-verify-numerics
  /// auto's measured table; null: the measured card nearest to the platform
  /// (nearest_numerics_policy_card). Tests inject one; it must outlive the call.
  const NumericsPolicyCard* numerics_table = nullptr;
};

/// One verify call as the dispatcher sees it: sizes plus the views the kernel would get.
struct DispatchProblem {
  int B = 0, T = 0;  ///< requests, tokens per request
  int H = 0, HV = 0, K = 0, V = 0;
  int conv_width = kConvWidth;  ///< W of the model's conv
  RecordMode mode = RecordMode::kSnapshot;
  /// false: a tree verify (never fused: the fused kernels verify chains; contract §8). Dense
  /// and ragged chains are plain chains.
  bool plain_chain = true;
  int64_t tokens = 0;      ///< activation rows: B*T, or a ragged batch's packed total (0: B*T)
  TensorView mixed_qkv;    ///< [tokens, D]
  TensorView a;            ///< [B*T, HV*K]
  TensorView b;            ///< [B*T, HV]
  TensorView conv_weight;  ///< [D, W]
  TensorView conv_bias;    ///< [D] or undefined
  TensorView slots, rows;  ///< [B] int32 index tensors
  RingViews rings;         ///< ring mode: this layer's rings
  int64_t num_slots = 0;   ///< S of the state (ring slot-count check)
  /// Ring mode with the deferred commit (contract §7): the verify folds pending steps first,
  /// so the auto tile is kernels::default_deferred_block_v's and the outputs stay exact.
  bool deferred = false;
  /// With `deferred`: the pool keeps u records, which the verify's in-kernel fold replays and
  /// writes for its draft steps (exact per-step u): the outputs stay exact. Without them (the
  /// u-free deferred commit, a pool built for fast outputs) the pending steps are folded computing
  /// u (by the fast kernel, or first by the fold kernel) and the outputs may be fast.
  bool u_records = false;
  /// Ring mode with the lazy write-back (contract §11; with `deferred`, no u records): the
  /// verify's pending steps are its fast chunk's history, so it runs fused with fast outputs
  /// (rule 5's batch and platform gates and auto's table do not apply).
  bool lazy = false;
};

/// The outcome: path, reason and what the reason refers to. A value; describe() builds the
/// human string on demand (so choosing allocates nothing).
struct DispatchDecision {
  VerifyPath path = VerifyPath::kUnfused;
  DispatchReason reason = DispatchReason::kFusedDisabled;
  int block_v = 0;               ///< V tile for the fused kernel; 0 when unfused
  const char* subject = "";      ///< rule 3: the offending quantity, e.g. "K", "a dtype"
  const char* expectation = "";  ///< rule 3: what the fused kernel needs, e.g. "64 or 128"
  /// How `got` reads: a number, a DType value, or see got_device.
  enum class GotKind : uint8_t { kNumber, kDType, kDevice };
  GotKind got_kind = GotKind::kNumber;
  int64_t got = 0;                         ///< rule 3: the value found
  Device got_device{}, expected_device{};  ///< GotKind::kDevice
  int64_t limit = 0;                       ///< kRingBatchAboveLimit: fused_ring_max_batch
  int B = 0;                               ///< the batch the decision was made for
  ArchFamily arch = ArchFamily::kOther;    ///< the platform family seen
  RingLayoutCheck ring;                    ///< kRingLayoutRejected: the failed layout rule
  /// The outputs' numerics (VerifyParams::numerics of the call) and why.
  VerifyNumerics numerics = VerifyNumerics::kExact;
  NumericsReason numerics_reason = NumericsReason::kExactUnfused;
  int T = 0;  ///< the call's T (kExactTokens)
  /// kAutoFast / kAutoExact: the measured card and the B of the row that decided.
  const char* numerics_card = "";
  int numerics_row_B = 0;
  /// The kernel-level plan of the call (kernels/verify/verify_plan.h): filled by the caller that
  /// has the call's params (the backend: its kernel set's plan_verify for this path and tile),
  /// and launched as it is; default (K = 0) until then.
  kernels::VerifyPlan plan;

  bool fused() const { return path == VerifyPath::kFused; }
  bool fast_outputs() const { return numerics == VerifyNumerics::kFast; }
  /// e.g. "unfused: ring mode with B = 4 > --kda-fused-ring-max-batch = 1; outputs exact: the
  /// unfused path", then the plan's kernel when the plan is filled ("; runs verify_tile<...>").
  std::string describe() const;
  /// The path and its reason, then the numerics and theirs (describe_numerics).
  std::string describe_reason() const;
  /// The numerics and their reason alone, e.g. "outputs fast (tensor cores): --kda-verify-numerics
  /// fast" or "outputs exact: snapshot mode".
  std::string describe_numerics() const;
  /// The path and its reason alone, e.g. "unfused: fused verify switched off (--kda-fused-verify)".
  std::string describe_path() const;
  /// Same path, reason, tile, numerics and plan (what "the decision changed" means for logging).
  bool same_choice(const DispatchDecision& o) const {
    return path == o.path && reason == o.reason && block_v == o.block_v && numerics == o.numerics &&
           numerics_reason == o.numerics_reason && plan == o.plan;
  }
};

/// The fused tile `flags.block_v` resolves to (0 -> kernels::kDefaultFusedBlockV).
int resolve_block_v(int block_v) noexcept;

/// Applies the rules above (the path, then the numerics). `platform` is the device's
/// (detect_platform) or a test's fake_platform. Never throws, never allocates.
DispatchDecision choose_verify_path(const DispatchProblem& problem, const Platform& platform,
                                    const DispatchFlags& flags) noexcept;

}  // namespace kda
