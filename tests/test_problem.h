// test_problem.h: one layer's verify problem with every tensor owned, for host and GPU tests.
//
// VerifyProblem allocates (kda::Buffer) and fills every tensor a verify / extend / commit call
// touches, on any Device:
//  * inputs: seeded random draws with the contract §6 scales (mixed_qkv randn*0.5, conv_w
//    *0.3, bias *0.1, a *0.5, b *1, A_log *0.5, dt_bias *0.5, ssm state *0.2, conv state
//    randn*0.5), NaN in the rows of padding requests and in every pitch/row padding element,
//    so that reading anything a kernel must not read poisons a result;
//  * outputs and scratch (out, conv_window, snapshots, the four rings, qkv_act): random
//    finite non-zero garbage, never zeros, so that a missed or misplaced write shows.
// Each tensor draws from its own stream of the case's seed: changing one knob (mode, wtype,
// padding) leaves the other tensors' values alone. Both record buffers (snapshots and rings)
// exist in every problem; params(mode) picks which one a call sees.
//
// Layouts (elements; contract §2): qkv/a/b rows of stride D/HV*K/HV + qkv_pad; every slot or
// scratch-row pitch is its packed extent + pitch_pad. Host accessors return packed copies
// (pads dropped) and work for host and CUDA problems alike.
#pragma once

#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/dtype.h"
#include "core/tensor_view.h"
#include "kernels/params/kda_params.h"

namespace kda::testing {

/// The knobs of one verify problem.
struct VerifyCase {
  int B = 1, T = 1, H = 1, HV = 1, K = 64, V = 64;
  bool bias = false;                            ///< conv bias present
  bool safe_gate = false;                       ///< GateKind::kSafe with lower_bound
  float lower_bound = -5.0f;                    ///< safe gate only
  ConvWeightType wtype = ConvWeightType::kF32;  ///< conv weight / bias dtype
  bool neg_slot = false;  ///< request pad_at (0 if B == 1) is a padding request (slot -1)
  int pad_at = 1;         ///< with neg_slot: which request pads when B > 1
  bool reversed = false;  ///< slots and rows assigned from the top down (rows != position)
  RecordMode mode = RecordMode::kRing;
  int L = 16;       ///< ring length
  int T_max = 0;    ///< scratch step pitch; 0 -> T
  int qkv_pad = 0;  ///< extra elements per qkv / a / b row
  uint64_t seed = 1;
  int extra_slots = 2;  ///< S = B + extra_slots
  int pitch_pad = 0;    ///< extra elements per slot / scratch-row pitch of every pool tensor
};

/// "B=2 T=3 H=1 HV=2 K=64 V=64 bias=false gate=standard ..." (every knob).
std::string describe(const VerifyCase& c);
std::ostream& operator<<(std::ostream& os, const VerifyCase& c);

/// A case with the given sizes, record mode and seed; every other knob at its default.
inline VerifyCase make_case(int B, int T, int H, int HV, int K, int V, RecordMode mode,
                            uint64_t seed) {
  VerifyCase c;
  c.B = B;
  c.T = T;
  c.H = H;
  c.HV = HV;
  c.K = K;
  c.V = V;
  c.mode = mode;
  c.seed = seed;
  return c;
}

/// The tensors of a problem.
enum class Tensor : int {
  kQkv,         ///< [N, D] bf16, row stride D + qkv_pad
  kA,           ///< [N, HV*K] bf16
  kB,           ///< [N, HV] bf16
  kALog,        ///< [HV] f32
  kDtBias,      ///< [HV*K] f32
  kConvWeight,  ///< [D, W] f32 or bf16 (wtype)
  kConvBias,    ///< [D] like the weight; absent (undefined view) without bias
  kConvState,   ///< [S, W-1, D] bf16
  kSsmState,    ///< [S, HV, V, K] f32
  kSlots,       ///< [B] i32
  kRows,        ///< [B] i32
  kOut,         ///< [N, HV, V] bf16
  kConvWindow,  ///< [R, T_max, W-1, D] bf16
  kSnapshots,   ///< [R, T_max, HV, V, K] f32
  kRingRawv,    ///< [S, HV, L, V] bf16
  kRingRawk,    ///< [S, H, L, K] bf16
  kRingG,       ///< [S, HV, L, K] f32
  kRingBeta,    ///< [S, HV, L] f32
  kQkvAct,      ///< [N, D] bf16 packed
  kCount,
};

const char* tensor_name(Tensor t);

class VerifyProblem {
 public:
  /// Allocates and fills every tensor on `device`.
  explicit VerifyProblem(const VerifyCase& c, Device device = Device::host());
  VerifyProblem(VerifyProblem&&) = default;
  VerifyProblem& operator=(VerifyProblem&&) = default;

  /// A byte-identical copy (pads included) on `device`.
  VerifyProblem clone_to(Device device) const;

  const VerifyCase& config() const { return c_; }
  const Device& device() const { return device_; }
  int64_t D() const { return 2LL * c_.H * c_.K + static_cast<int64_t>(c_.HV) * c_.V; }
  int64_t N() const { return static_cast<int64_t>(c_.B) * c_.T; }
  int num_slots() const { return c_.B + c_.extra_slots; }
  int num_rows() const { return c_.B + 1; }
  int T_max() const { return c_.T_max > 0 ? c_.T_max : c_.T; }
  /// Elements of one slot's SSM state (= one snapshot step): HV * V * K.
  int64_t state_elems() const { return static_cast<int64_t>(c_.HV) * c_.V * c_.K; }
  /// The padding request's batch position, or -1.
  int pad_request() const;

  /// Verify params of the case's mode, or of `mode` (only that mode's record pointers set).
  VerifyParams params() const { return params(c_.mode); }
  VerifyParams params(RecordMode mode) const;
  /// Extend committing in place: ssm_state_out = ssm_state, conv_state_out = conv_state.
  ExtendParams extend_params() const;
  /// One-layer commit; `accepted` is [B] i32 on the problem's device.
  CommitParams commit_params(const Buffer& accepted) const {
    return commit_params(accepted, c_.mode);
  }
  CommitParams commit_params(const Buffer& accepted, RecordMode mode) const;

  /// The view of a tensor (undefined for an absent conv bias), on the problem's device.
  TensorView view(Tensor t) const;
  /// Packed host copy of a tensor; empty if absent. T: bf16_t, float or int32_t.
  template <typename T>
  std::vector<T> get(Tensor t) const {
    const TensorView v = view(t);
    return v.defined() ? to_host_vector<T>(v) : std::vector<T>{};
  }
  /// Overwrites a tensor's elements (pads untouched) from a packed host vector.
  template <typename T>
  void set(Tensor t, const std::vector<T>& values) {
    from_host_vector<T>(values, view(t));
  }
  /// Every byte of the tensor's buffer, pads included: for whole-memory before/after checks.
  std::vector<uint8_t> raw(Tensor t) const;

  // Named host copies.
  std::vector<bf16_t> qkv() const { return get<bf16_t>(Tensor::kQkv); }
  std::vector<bf16_t> a() const { return get<bf16_t>(Tensor::kA); }
  std::vector<bf16_t> b() const { return get<bf16_t>(Tensor::kB); }
  std::vector<float> A_log() const { return get<float>(Tensor::kALog); }
  std::vector<float> dt_bias() const { return get<float>(Tensor::kDtBias); }
  /// Weights / bias as f32 whatever their dtype (bf16 converts exactly).
  std::vector<float> conv_weight() const;
  std::vector<float> conv_bias() const;
  std::vector<bf16_t> conv_state() const { return get<bf16_t>(Tensor::kConvState); }
  std::vector<float> ssm_state() const { return get<float>(Tensor::kSsmState); }
  std::vector<int32_t> slots() const { return get<int32_t>(Tensor::kSlots); }
  std::vector<int32_t> rows() const { return get<int32_t>(Tensor::kRows); }
  std::vector<bf16_t> out() const { return get<bf16_t>(Tensor::kOut); }
  std::vector<bf16_t> conv_window() const { return get<bf16_t>(Tensor::kConvWindow); }
  std::vector<float> snapshots() const { return get<float>(Tensor::kSnapshots); }
  std::vector<bf16_t> rawv() const { return get<bf16_t>(Tensor::kRingRawv); }
  std::vector<bf16_t> rawk() const { return get<bf16_t>(Tensor::kRingRawk); }
  std::vector<float> ring_g() const { return get<float>(Tensor::kRingG); }
  std::vector<float> ring_beta() const { return get<float>(Tensor::kRingBeta); }
  std::vector<bf16_t> qkv_act() const { return get<bf16_t>(Tensor::kQkvAct); }

 private:
  struct Entry {
    Buffer buffer;
    TensorView view;
  };
  VerifyProblem(const VerifyCase& c, Device device, bool fill);
  void allocate();
  void fill();
  Entry& entry(Tensor t) { return entries_[static_cast<int>(t)]; }
  const Entry& entry(Tensor t) const { return entries_[static_cast<int>(t)]; }

  VerifyCase c_;
  Device device_;
  std::vector<Entry> entries_;
};

/// An [n] buffer on `device` holding `values` (e.g. accepted lengths for commit_params).
Buffer make_buffer(const std::vector<int32_t>& values, Device device);

/// v[offset, offset + count), e.g. one slot's state out of a packed host copy.
template <typename T>
std::vector<T> slice(const std::vector<T>& v, int64_t offset, int64_t count) {
  return std::vector<T>(v.begin() + offset, v.begin() + offset + count);
}

// ---- comparisons ----

inline double to_double(bf16_t x) { return static_cast<double>(bf16_to_float(x)); }
inline double to_double(float x) { return static_cast<double>(x); }
inline double to_double(double x) { return x; }

/// ||a - ref||_2 / ||ref||_2 (||a - ref||_2 when ref is all zeros); +inf on a size mismatch
/// or a NaN. Element types: bf16_t, float, double, mixed.
template <typename A, typename Ref>
double rel_l2(const std::vector<A>& a, const std::vector<Ref>& ref);

/// The largest rel_l2 over consecutive rows of `row` elements (e.g. row = V: one token of
/// one head). An error confined to one row is not diluted by the rest of the tensor.
template <typename A, typename Ref>
double max_row_rel_l2(const std::vector<A>& a, const std::vector<Ref>& ref, int64_t row);

/// max |a - ref|; +inf on a size mismatch or a NaN.
template <typename A, typename Ref>
double max_abs_diff(const std::vector<A>& a, const std::vector<Ref>& ref);

/// Result of bitwise_equal: true iff same size and same bits everywhere; streams the first
/// difference ("first difference at [i]: 0x3f80 (1) vs 0x3f81 (1.0078125)") for Catch2.
struct BitwiseResult {
  bool equal = true;
  int64_t first_diff = -1;  ///< index of the first differing element; -1 if none
  std::string detail;
  explicit operator bool() const { return equal; }
};
std::ostream& operator<<(std::ostream& os, const BitwiseResult& r);

/// The given token rows of a [N, width] row-major tensor's host copy, in order (e.g. the real
/// requests' outputs: width = HV * V).
template <typename T>
std::vector<T> gather_rows(const std::vector<T>& all, const std::vector<int64_t>& rows,
                           int64_t width) {
  std::vector<T> r;
  r.reserve(rows.size() * static_cast<size_t>(width));
  for (const int64_t row : rows) {
    r.insert(r.end(), all.begin() + row * width, all.begin() + (row + 1) * width);
  }
  return r;
}

/// Bit-pattern equality (NaN == NaN of the same payload, +0 != -0).
BitwiseResult bitwise_equal(const std::vector<bf16_t>& a, const std::vector<bf16_t>& b);
BitwiseResult bitwise_equal(const std::vector<float>& a, const std::vector<float>& b);
BitwiseResult bitwise_equal(const std::vector<int32_t>& a, const std::vector<int32_t>& b);
BitwiseResult bitwise_equal(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b);

// ---- template definitions ----

template <typename A, typename Ref>
double rel_l2(const std::vector<A>& a, const std::vector<Ref>& ref) {
  if (a.size() != ref.size()) {
    return INFINITY;
  }
  double diff = 0.0;
  double norm = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = to_double(a[i]) - to_double(ref[i]);
    diff += d * d;
    norm += to_double(ref[i]) * to_double(ref[i]);
  }
  if (diff != diff || norm != norm) {
    return INFINITY;
  }
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

template <typename A, typename Ref>
double max_row_rel_l2(const std::vector<A>& a, const std::vector<Ref>& ref, int64_t row) {
  if (a.size() != ref.size() || row <= 0 || a.size() % static_cast<size_t>(row) != 0) {
    return INFINITY;
  }
  double worst = 0.0;
  for (size_t begin = 0; begin < a.size(); begin += static_cast<size_t>(row)) {
    const std::vector<A> ra(a.begin() + begin, a.begin() + begin + row);
    const std::vector<Ref> rr(ref.begin() + begin, ref.begin() + begin + row);
    const double e = rel_l2(ra, rr);
    worst = e > worst ? e : worst;
  }
  return worst;
}

template <typename A, typename Ref>
double max_abs_diff(const std::vector<A>& a, const std::vector<Ref>& ref) {
  if (a.size() != ref.size()) {
    return INFINITY;
  }
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(to_double(a[i]) - to_double(ref[i]));
    if (d != d) {
      return INFINITY;
    }
    m = d > m ? d : m;
  }
  return m;
}

}  // namespace kda::testing
