#include "tests/test_problem.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace kda::testing {
namespace {

// splitmix64: tiny, fast and identical on every platform (std:: distributions are not).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}

  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

  /// Uniform in (0, 1].
  double uniform() { return (static_cast<double>(next() >> 11) + 1.0) * 0x1p-53; }

  /// Standard normal (Box-Muller).
  static constexpr double kTwoPi = 6.283185307179586;
  float normal() {
    const double r = std::sqrt(-2.0 * std::log(uniform()));
    return static_cast<float>(r * std::cos(kTwoPi * uniform()));
  }

  /// Finite, never zero, magnitude in [2^-8, 2^9): garbage that no kernel computes by chance.
  float garbage() {
    const uint64_t r = next();
    const uint32_t sign = static_cast<uint32_t>(r >> 63) << 31;
    const uint32_t exponent = static_cast<uint32_t>(127 - 8 + (r >> 32) % 17) << 23;
    const uint32_t mantissa = static_cast<uint32_t>(r) & 0x7fffffu;
    const uint32_t bits = sign | exponent | mantissa;
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
  }

 private:
  uint64_t state_;
};

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

bool is_input(Tensor t) {
  switch (t) {
    case Tensor::kQkv:
    case Tensor::kA:
    case Tensor::kB:
    case Tensor::kALog:
    case Tensor::kDtBias:
    case Tensor::kConvWeight:
    case Tensor::kConvBias:
    case Tensor::kConvState:
    case Tensor::kSsmState:
    case Tensor::kSlots:
    case Tensor::kRows:
      return true;
    case Tensor::kOut:
    case Tensor::kConvWindow:
    case Tensor::kSnapshots:
    case Tensor::kRingRawv:
    case Tensor::kRingRawk:
    case Tensor::kRingG:
    case Tensor::kRingBeta:
    case Tensor::kQkvAct:
    case Tensor::kCount:
      return false;
  }
  return false;
}

// The layout of `l` (shape and strides) over other memory.
TensorView rebase(const TensorView& l, void* data, Device device) {
  auto d = [&](int i) { return l.size(i); };
  auto st = [&](int i) { return l.stride(i); };
  switch (l.ndim()) {
    case 1:
      return TensorView(data, l.dtype(), device, {d(0)}, {st(0)});
    case 2:
      return TensorView(data, l.dtype(), device, {d(0), d(1)}, {st(0), st(1)});
    case 3:
      return TensorView(data, l.dtype(), device, {d(0), d(1), d(2)}, {st(0), st(1), st(2)});
    case 4:
      return TensorView(data, l.dtype(), device, {d(0), d(1), d(2), d(3)},
                        {st(0), st(1), st(2), st(3)});
    case 5:
      return TensorView(data, l.dtype(), device, {d(0), d(1), d(2), d(3), d(4)},
                        {st(0), st(1), st(2), st(3), st(4)});
    default:
      KDA_FAIL("test_problem: a {}-d layout is unsupported", l.ndim());
  }
}

// Writes packed `values` into the logical elements of `layout` over host memory `base`.
template <typename T>
void scatter(const TensorView& layout, void* base, const std::vector<T>& values) {
  from_host_vector<T>(values, rebase(layout, base, Device::host()));
}

std::vector<bf16_t> randn_bf16(Rng& rng, int64_t n, float scale) {
  std::vector<bf16_t> v(static_cast<size_t>(n));
  for (auto& x : v) {
    x = float_to_bf16(rng.normal() * scale);
  }
  return v;
}

std::vector<float> randn_f32(Rng& rng, int64_t n, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) {
    x = rng.normal() * scale;
  }
  return v;
}

}  // namespace

std::string describe(const VerifyCase& c) {
  return fmt::format(
      "B={} T={} H={} HV={} K={} V={} bias={} gate={}{} wtype={} neg_slot={} "
      "pad_at={} reversed={} mode={} L={} T_max={} qkv_pad={} pitch_pad={} seed={} "
      "extra_slots={}",
      c.B, c.T, c.H, c.HV, c.K, c.V, c.bias, c.safe_gate ? "safe" : "standard",
      c.safe_gate ? fmt::format("({})", c.lower_bound) : "",
      c.wtype == ConvWeightType::kF32 ? "f32" : "bf16", c.neg_slot, c.pad_at, c.reversed,
      c.mode == RecordMode::kRing ? "ring" : "snapshot", c.L, c.T_max, c.qkv_pad, c.pitch_pad,
      c.seed, c.extra_slots);
}

std::ostream& operator<<(std::ostream& os, const VerifyCase& c) { return os << describe(c); }

const char* tensor_name(Tensor t) {
  switch (t) {
    case Tensor::kQkv:
      return "qkv";
    case Tensor::kA:
      return "a";
    case Tensor::kB:
      return "b";
    case Tensor::kALog:
      return "A_log";
    case Tensor::kDtBias:
      return "dt_bias";
    case Tensor::kConvWeight:
      return "conv_weight";
    case Tensor::kConvBias:
      return "conv_bias";
    case Tensor::kConvState:
      return "conv_state";
    case Tensor::kSsmState:
      return "ssm_state";
    case Tensor::kSlots:
      return "slots";
    case Tensor::kRows:
      return "rows";
    case Tensor::kOut:
      return "out";
    case Tensor::kConvWindow:
      return "conv_window";
    case Tensor::kSnapshots:
      return "snapshots";
    case Tensor::kRingRawv:
      return "ring_rawv";
    case Tensor::kRingRawk:
      return "ring_rawk";
    case Tensor::kRingG:
      return "ring_g";
    case Tensor::kRingBeta:
      return "ring_beta";
    case Tensor::kQkvAct:
      return "qkv_act";
    case Tensor::kCount:
      break;
  }
  return "?";
}

VerifyProblem::VerifyProblem(const VerifyCase& c, Device device)
    : VerifyProblem(c, device, /*fill=*/true) {}

VerifyProblem::VerifyProblem(const VerifyCase& c, Device device, bool fill_values)
    : c_(c), device_(device), entries_(static_cast<size_t>(Tensor::kCount)) {
  KDA_CHECK(c.B >= 1 && c.T >= 1 && c.H >= 1 && c.HV >= 1 && c.K >= 32 && c.V >= 1,
            "VerifyProblem: bad sizes in case {{{}}}", describe(c));
  KDA_CHECK(c.HV % c.H == 0 && c.L >= 1 && T_max() >= c.T && c.extra_slots >= 0 && c.qkv_pad >= 0 &&
                c.pitch_pad >= 0 && c.pad_at >= 0 && (c.B == 1 || c.pad_at < c.B),
            "VerifyProblem: inconsistent case {{{}}}", describe(c));
  allocate();
  if (fill_values) {
    fill();
  }
}

int VerifyProblem::pad_request() const {
  if (!c_.neg_slot) {
    return -1;
  }
  return c_.B == 1 ? 0 : c_.pad_at;
}

void VerifyProblem::allocate() {
  const int64_t B = c_.B, N = this->N(), D = this->D(), H = c_.H, HV = c_.HV, K = c_.K, V = c_.V,
                L = c_.L, S = num_slots(), R = num_rows(), Ta = T_max();
  const int64_t Q = c_.qkv_pad, P = c_.pitch_pad;
  const DType wdt = c_.wtype == ConvWeightType::kF32 ? DType::kF32 : DType::kBF16;
  const DType bf = DType::kBF16, f32 = DType::kF32, i32 = DType::kI32;
  const Device dev = device_;
  // Layouts over null data first; the buffer size follows from the outermost pitch.
  auto layout = [&](Tensor t) -> TensorView {
    switch (t) {
      case Tensor::kQkv:
        return TensorView(nullptr, bf, dev, {N, D}, {D + Q, 1});
      case Tensor::kA:
        return TensorView(nullptr, bf, dev, {N, HV * K}, {HV * K + Q, 1});
      case Tensor::kB:
        return TensorView(nullptr, bf, dev, {N, HV}, {HV + Q, 1});
      case Tensor::kALog:
        return TensorView::contiguous(nullptr, f32, dev, {HV});
      case Tensor::kDtBias:
        return TensorView::contiguous(nullptr, f32, dev, {HV * K});
      case Tensor::kConvWeight:
        return TensorView::contiguous(nullptr, wdt, dev, {D, kConvWidth});
      case Tensor::kConvBias:
        return c_.bias ? TensorView::contiguous(nullptr, wdt, dev, {D}) : TensorView();
      case Tensor::kConvState:
        return TensorView(nullptr, bf, dev, {S, kConvHistory, D}, {kConvHistory * D + P, D, 1});
      case Tensor::kSsmState:
        return TensorView(nullptr, f32, dev, {S, HV, V, K}, {HV * V * K + P, V * K, K, 1});
      case Tensor::kSlots:
      case Tensor::kRows:
        return TensorView::contiguous(nullptr, i32, dev, {B});
      case Tensor::kOut:
        return TensorView::contiguous(nullptr, bf, dev, {N, HV, V});
      case Tensor::kConvWindow:
        return TensorView(nullptr, bf, dev, {R, Ta, kConvHistory, D},
                          {Ta * kConvHistory * D + P, kConvHistory * D, D, 1});
      case Tensor::kSnapshots:
        return TensorView(nullptr, f32, dev, {R, Ta, HV, V, K},
                          {Ta * HV * V * K + P, HV * V * K, V * K, K, 1});
      case Tensor::kRingRawv:
        return TensorView(nullptr, bf, dev, {S, HV, L, V}, {HV * L * V + P, L * V, V, 1});
      case Tensor::kRingRawk:
        return TensorView(nullptr, bf, dev, {S, H, L, K}, {H * L * K + P, L * K, K, 1});
      case Tensor::kRingG:
        return TensorView(nullptr, f32, dev, {S, HV, L, K}, {HV * L * K + P, L * K, K, 1});
      case Tensor::kRingBeta:
        return TensorView(nullptr, f32, dev, {S, HV, L}, {HV * L + P, L, 1});
      case Tensor::kQkvAct:
        return TensorView::contiguous(nullptr, bf, dev, {N, D});
      case Tensor::kCount:
        break;
    }
    return TensorView();
  };
  for (int i = 0; i < static_cast<int>(Tensor::kCount); ++i) {
    const TensorView l = layout(static_cast<Tensor>(i));
    Entry& e = entries_[static_cast<size_t>(i)];
    if (l.ndim() == 0) {
      continue;  // absent (no conv bias)
    }
    const int64_t elems = l.size(0) * l.stride(0);
    e.buffer = Buffer(device_, elems * dtype_size(l.dtype()));
    e.view = rebase(l, e.buffer.data(), device_);
  }
}

void VerifyProblem::fill() {
  const int64_t D = this->D(), HV = c_.HV, K = c_.K;
  const int pad = pad_request();
  for (int i = 0; i < static_cast<int>(Tensor::kCount); ++i) {
    const Tensor t = static_cast<Tensor>(i);
    Entry& e = entries_[static_cast<size_t>(i)];
    if (!e.view.defined()) {
      continue;
    }
    Rng rng(c_.seed * 0x100000001b3ull + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(i + 1));
    const int64_t bytes = e.buffer.bytes();
    std::vector<uint8_t> staging(static_cast<size_t>(bytes));
    const bool bf16 = e.view.dtype() == DType::kBF16;
    // Background (pads, and for outputs everything): NaN under inputs, garbage under outputs.
    if (bf16) {
      auto* p = reinterpret_cast<bf16_t*>(staging.data());
      for (int64_t j = 0; j < bytes / 2; ++j) {
        p[j] = float_to_bf16(is_input(t) ? kNaN : rng.garbage());
      }
    } else {
      auto* p = reinterpret_cast<float*>(staging.data());  // f32 and i32 (overwritten)
      for (int64_t j = 0; j < bytes / 4; ++j) {
        p[j] = is_input(t) ? kNaN : rng.garbage();
      }
    }
    const int64_t n = e.view.numel();
    // Padding request's token rows are NaN: nothing of a padding request may be read.
    auto nan_pad_rows = [&](std::vector<bf16_t>& v, int64_t width) {
      if (pad >= 0) {
        const int64_t first = static_cast<int64_t>(pad) * c_.T * width;
        std::fill_n(v.begin() + first, c_.T * width, float_to_bf16(kNaN));
      }
    };
    switch (t) {
      case Tensor::kQkv: {
        auto v = randn_bf16(rng, n, 0.5f);
        nan_pad_rows(v, D);
        scatter(e.view, staging.data(), v);
        break;
      }
      case Tensor::kA: {
        auto v = randn_bf16(rng, n, 0.5f);
        nan_pad_rows(v, HV * K);
        scatter(e.view, staging.data(), v);
        break;
      }
      case Tensor::kB: {
        auto v = randn_bf16(rng, n, 1.0f);
        nan_pad_rows(v, HV);
        scatter(e.view, staging.data(), v);
        break;
      }
      case Tensor::kALog:
      case Tensor::kDtBias:
        scatter(e.view, staging.data(), randn_f32(rng, n, 0.5f));
        break;
      case Tensor::kConvWeight:
      case Tensor::kConvBias: {
        const float scale = t == Tensor::kConvWeight ? 0.3f : 0.1f;
        if (bf16) {
          scatter(e.view, staging.data(), randn_bf16(rng, n, scale));
        } else {
          scatter(e.view, staging.data(), randn_f32(rng, n, scale));
        }
        break;
      }
      case Tensor::kConvState:
        scatter(e.view, staging.data(), randn_bf16(rng, n, 0.5f));
        break;
      case Tensor::kSsmState:
        scatter(e.view, staging.data(), randn_f32(rng, n, 0.2f));
        break;
      case Tensor::kSlots:
      case Tensor::kRows: {
        const int top = t == Tensor::kSlots ? num_slots() : num_rows();
        std::vector<int32_t> v(static_cast<size_t>(c_.B));
        for (int r = 0; r < c_.B; ++r) {
          v[static_cast<size_t>(r)] = c_.reversed ? top - 1 - r : r;
        }
        if (t == Tensor::kSlots && pad >= 0) {
          v[static_cast<size_t>(pad)] = -1;
        }
        scatter(e.view, staging.data(), v);
        break;
      }
      case Tensor::kOut:
      case Tensor::kConvWindow:
      case Tensor::kSnapshots:
      case Tensor::kRingRawv:
      case Tensor::kRingRawk:
      case Tensor::kRingG:
      case Tensor::kRingBeta:
      case Tensor::kQkvAct:
      case Tensor::kCount:
        break;  // garbage background only
    }
    e.buffer.upload(staging.data(), bytes);
  }
}

VerifyProblem VerifyProblem::clone_to(Device device) const {
  VerifyProblem copy(c_, device, /*fill=*/false);
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Buffer& src = entries_[i].buffer;
    copy_bytes(copy.entries_[i].buffer.data(), device, src.data(), device_, src.bytes());
  }
  return copy;
}

TensorView VerifyProblem::view(Tensor t) const { return entry(t).view; }

std::vector<uint8_t> VerifyProblem::raw(Tensor t) const {
  const Buffer& b = entry(t).buffer;
  std::vector<uint8_t> bytes(static_cast<size_t>(b.bytes()));
  if (b.bytes() > 0) {
    b.download(bytes.data(), b.bytes());
  }
  return bytes;
}

std::vector<float> VerifyProblem::conv_weight() const {
  if (c_.wtype == ConvWeightType::kF32) {
    return get<float>(Tensor::kConvWeight);
  }
  const auto w = get<bf16_t>(Tensor::kConvWeight);
  std::vector<float> f(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    f[i] = bf16_to_float(w[i]);
  }
  return f;
}

std::vector<float> VerifyProblem::conv_bias() const {
  if (!c_.bias) {
    return {};
  }
  if (c_.wtype == ConvWeightType::kF32) {
    return get<float>(Tensor::kConvBias);
  }
  const auto w = get<bf16_t>(Tensor::kConvBias);
  std::vector<float> f(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    f[i] = bf16_to_float(w[i]);
  }
  return f;
}

VerifyParams VerifyProblem::params(RecordMode mode) const {
  auto ptr = [&](Tensor t) { return entry(t).buffer.data(); };
  auto pitch = [&](Tensor t) { return entry(t).view.stride(0); };
  VerifyParams p;
  p.B = c_.B;
  p.T = c_.T;
  p.H = c_.H;
  p.HV = c_.HV;
  p.K = c_.K;
  p.V = c_.V;
  p.T_max = T_max();
  p.L = c_.L;
  p.num_slots = num_slots();
  p.num_rows = num_rows();
  p.gate = c_.safe_gate ? GateKind::kSafe : GateKind::kStandard;
  p.lower_bound = c_.safe_gate ? c_.lower_bound : 0.0f;
  p.mode = mode;
  p.mixed_qkv = static_cast<const bf16_t*>(ptr(Tensor::kQkv));
  p.mixed_qkv_stride = pitch(Tensor::kQkv);
  p.a = static_cast<const bf16_t*>(ptr(Tensor::kA));
  p.a_stride = pitch(Tensor::kA);
  p.b = static_cast<const bf16_t*>(ptr(Tensor::kB));
  p.b_stride = pitch(Tensor::kB);
  p.A_log = static_cast<const float*>(ptr(Tensor::kALog));
  p.dt_bias = static_cast<const float*>(ptr(Tensor::kDtBias));
  p.conv_weight = ptr(Tensor::kConvWeight);
  p.conv_bias = c_.bias ? ptr(Tensor::kConvBias) : nullptr;
  p.conv_weight_type = c_.wtype;
  p.conv_state = static_cast<const bf16_t*>(ptr(Tensor::kConvState));
  p.conv_state_slot_stride = pitch(Tensor::kConvState);
  p.ssm_state = static_cast<const float*>(ptr(Tensor::kSsmState));
  p.ssm_slot_stride = pitch(Tensor::kSsmState);
  p.slots = static_cast<const int32_t*>(ptr(Tensor::kSlots));
  p.rows = static_cast<const int32_t*>(ptr(Tensor::kRows));
  p.out = static_cast<bf16_t*>(ptr(Tensor::kOut));
  p.conv_window = static_cast<bf16_t*>(ptr(Tensor::kConvWindow));
  p.conv_window_row_stride = pitch(Tensor::kConvWindow);
  if (mode == RecordMode::kSnapshot) {
    p.snapshots = static_cast<float*>(ptr(Tensor::kSnapshots));
    p.snapshot_row_stride = pitch(Tensor::kSnapshots);
  } else {
    p.ring_rawv = static_cast<bf16_t*>(ptr(Tensor::kRingRawv));
    p.ring_rawv_slot_stride = pitch(Tensor::kRingRawv);
    p.ring_rawk = static_cast<bf16_t*>(ptr(Tensor::kRingRawk));
    p.ring_rawk_slot_stride = pitch(Tensor::kRingRawk);
    p.ring_g = static_cast<float*>(ptr(Tensor::kRingG));
    p.ring_g_slot_stride = pitch(Tensor::kRingG);
    p.ring_beta = static_cast<float*>(ptr(Tensor::kRingBeta));
    p.ring_beta_slot_stride = pitch(Tensor::kRingBeta);
  }
  p.qkv_act = static_cast<bf16_t*>(ptr(Tensor::kQkvAct));
  return p;
}

ExtendParams VerifyProblem::extend_params() const {
  ExtendParams e = extend_params_of(params());
  e.ssm_state_out = static_cast<float*>(entry(Tensor::kSsmState).buffer.data());
  e.conv_state_out = static_cast<bf16_t*>(entry(Tensor::kConvState).buffer.data());
  return e;
}

CommitParams VerifyProblem::commit_params(const Buffer& accepted, RecordMode mode) const {
  KDA_CHECK(accepted.device() == device_ && accepted.bytes() >= c_.B * 4,
            "VerifyProblem::commit_params: accepted needs {} i32 on {}, has {} bytes on {}", c_.B,
            device_name(device_), accepted.bytes(), device_name(accepted.device()));
  auto ptr = [&](Tensor t) { return entry(t).buffer.data(); };
  auto pitch = [&](Tensor t) { return entry(t).view.stride(0); };
  // One layer: a layer pitch is the whole tensor.
  auto layer = [&](Tensor t) { return entry(t).view.size(0) * entry(t).view.stride(0); };
  CommitParams q;
  q.num_layers = 1;
  q.B = c_.B;
  q.T = c_.T;
  q.T_max = T_max();
  q.H = c_.H;
  q.HV = c_.HV;
  q.K = c_.K;
  q.V = c_.V;
  q.L = c_.L;
  q.num_slots = num_slots();
  q.num_rows = num_rows();
  q.mode = mode;
  q.slots = static_cast<const int32_t*>(ptr(Tensor::kSlots));
  q.rows = static_cast<const int32_t*>(ptr(Tensor::kRows));
  q.accepted = static_cast<const int32_t*>(accepted.data());
  q.ssm_state = static_cast<float*>(ptr(Tensor::kSsmState));
  q.ssm_layer_stride = layer(Tensor::kSsmState);
  q.ssm_slot_stride = pitch(Tensor::kSsmState);
  q.conv_state = static_cast<bf16_t*>(ptr(Tensor::kConvState));
  q.conv_state_layer_stride = layer(Tensor::kConvState);
  q.conv_state_slot_stride = pitch(Tensor::kConvState);
  q.conv_window = static_cast<bf16_t*>(ptr(Tensor::kConvWindow));
  q.conv_window_layer_stride = layer(Tensor::kConvWindow);
  q.conv_window_row_stride = pitch(Tensor::kConvWindow);
  if (mode == RecordMode::kSnapshot) {
    q.snapshots = static_cast<const float*>(ptr(Tensor::kSnapshots));
    q.snapshot_layer_stride = layer(Tensor::kSnapshots);
    q.snapshot_row_stride = pitch(Tensor::kSnapshots);
  } else {
    q.ring_rawv = static_cast<bf16_t*>(ptr(Tensor::kRingRawv));
    q.ring_rawv_layer_stride = layer(Tensor::kRingRawv);
    q.ring_rawv_slot_stride = pitch(Tensor::kRingRawv);
    q.ring_rawk = static_cast<bf16_t*>(ptr(Tensor::kRingRawk));
    q.ring_rawk_layer_stride = layer(Tensor::kRingRawk);
    q.ring_rawk_slot_stride = pitch(Tensor::kRingRawk);
    q.ring_g = static_cast<float*>(ptr(Tensor::kRingG));
    q.ring_g_layer_stride = layer(Tensor::kRingG);
    q.ring_g_slot_stride = pitch(Tensor::kRingG);
    q.ring_beta = static_cast<float*>(ptr(Tensor::kRingBeta));
    q.ring_beta_layer_stride = layer(Tensor::kRingBeta);
    q.ring_beta_slot_stride = pitch(Tensor::kRingBeta);
  }
  return q;
}

Buffer make_buffer(const std::vector<int32_t>& values, Device device) {
  Buffer b(device, static_cast<int64_t>(values.size() * sizeof(int32_t)));
  b.upload(values.data(), b.bytes());
  return b;
}

// ---- bitwise comparison ----

namespace {

template <typename T, typename Bits, typename Show>
BitwiseResult compare_bits(const std::vector<T>& a, const std::vector<T>& b, Bits bits, Show show) {
  BitwiseResult r;
  if (a.size() != b.size()) {
    r.equal = false;
    r.detail = fmt::format("sizes differ: {} vs {}", a.size(), b.size());
    return r;
  }
  int64_t differing = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (bits(a[i]) != bits(b[i])) {
      if (differing == 0) {
        r.first_diff = static_cast<int64_t>(i);
      }
      ++differing;
    }
  }
  if (differing > 0) {
    const size_t i = static_cast<size_t>(r.first_diff);
    r.equal = false;
    r.detail = fmt::format("first difference at [{}] of {}: {} vs {}; {} elements differ", i,
                           a.size(), show(a[i]), show(b[i]), differing);
  }
  return r;
}

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const BitwiseResult& r) {
  return os << (r.equal ? std::string("bitwise equal") : r.detail);
}

BitwiseResult bitwise_equal(const std::vector<bf16_t>& a, const std::vector<bf16_t>& b) {
  return compare_bits(
      a, b, [](bf16_t x) { return x.bits; },
      [](bf16_t x) { return fmt::format("{:#06x} ({})", x.bits, bf16_to_float(x)); });
}

BitwiseResult bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return compare_bits(a, b, float_bits,
                      [](float x) { return fmt::format("{:#010x} ({})", float_bits(x), x); });
}

BitwiseResult bitwise_equal(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  return compare_bits(
      a, b, [](int32_t x) { return x; }, [](int32_t x) { return fmt::format("{}", x); });
}

BitwiseResult bitwise_equal(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  return compare_bits(
      a, b, [](uint8_t x) { return x; }, [](uint8_t x) { return fmt::format("{:#04x}", x); });
}

}  // namespace kda::testing
