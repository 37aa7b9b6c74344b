// ring_layout.h: the ReplaySSM ring-layout checks the dispatcher runs before it lets the
// fused kernel write rings (contract §4; upstream §3.3). Pure functions on views: they
// never throw, allocate or touch tensor memory.
//
// Expected per-layer ring views (letters as in docs/contract.md §2):
//   rawv [S', HV, L, V] act dtype (bf16), strides (pitch, L*V, V, 1)
//   rawk [S', H,  L, K] act dtype (bf16), strides (pitch, L*K, K, 1)   one record per k-head
//   g    [S', HV, L, K] f32,              strides (pitch, L*K, K, 1)
//   beta [S', HV, L]    f32,              strides (pitch, L, 1)
// with S' >= S (the state's slot count), L = rawv.size(2) >= T, and each slot pitch
// stride(0) free (padded pools allowed) but at least one packed slot (no overlap).
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/tensor_view.h"

namespace kda {

/// The four ring tensors of one layer (views; the pool owns the memory).
struct RingViews {
  TensorView rawv, rawk, g, beta;
};

enum class RingTensor : uint8_t { kRawv, kRawk, kG, kBeta };
/// "ring_rawv", "ring_rawk", "ring_g", "ring_beta".
const char* ring_tensor_name(RingTensor t) noexcept;

/// Why a set of ring views cannot feed the fused kernel; one value per failure kind.
enum class RingLayoutIssue : uint8_t {
  kOk,
  kMissing,      ///< a ring view is undefined (null data)
  kWrongDevice,  ///< not on the activations' device
  kWrongNdim,    ///< not 4-D / 4-D / 4-D / 3-D (e.g. the [layers] dim still attached)
  kWrongDtype,   ///< rawv/rawk not the activation dtype, or g/beta not f32
  kTooFewSlots,  ///< dim 0 smaller than the state's slot count S
  kWrongHeads,   ///< dim 1 not HV (rawv, g, beta) or H (rawk)
  kWrongLength,  ///< dim 2 (the ring length) differs from rawv's L
  kWrongDim,     ///< last dim not V (rawv) or K (rawk, g); a GDN-shaped g fails as kWrongNdim
  kNotPacked,    ///< inner strides not packed, or a slot pitch smaller than one slot
  kTooShort,     ///< L < T: verify would drop steps the commit needs
};
/// Short stable name ("missing", "wrong_device", ...).
const char* ring_layout_issue_name(RingLayoutIssue issue) noexcept;

/// What the rings must look like for this verify call.
struct RingLayoutExpectation {
  int H = 0, HV = 0, K = 0, V = 0;        ///< heads and head dims
  int T = 0;                              ///< tokens per request of this verify call
  int64_t num_slots = 0;                  ///< S of conv_state / ssm_state
  DType activation_dtype = DType::kBF16;  ///< dtype of mixed_qkv
  Device device{};                        ///< device of mixed_qkv
};

/// The first failed rule (or kOk), with what was found and what was expected. A value;
/// describe() formats it on demand so the check itself never allocates.
struct RingLayoutCheck {
  RingLayoutIssue issue = RingLayoutIssue::kOk;
  RingTensor tensor = RingTensor::kRawv;  ///< the offending ring (issue != kOk)
  int dim = -1;                           ///< the offending dim (shape / stride issues)
  int64_t got = 0, expected = 0;          ///< extents, ndims or strides (by issue)
  DType got_dtype = DType::kF32, expected_dtype = DType::kF32;  ///< kWrongDtype
  Device got_device{}, expected_device{};                       ///< kWrongDevice

  bool ok() const { return issue == RingLayoutIssue::kOk; }
  /// "ring layout ok" or e.g. "ring_rawk: dim 1 (heads) is 4, expected H = 2".
  std::string describe() const;
};

/// Checks `rings` against `want` in the order of RingLayoutIssue; never throws.
RingLayoutCheck check_ring_layout(const RingViews& rings,
                                  const RingLayoutExpectation& want) noexcept;

}  // namespace kda
