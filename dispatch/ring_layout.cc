#include "dispatch/ring_layout.h"

#include <fmt/format.h>

namespace kda {

namespace {

// The rules for one ring tensor.
struct RingSpec {
  RingTensor id;
  const TensorView* view;
  int ndim;   // 4 or 3
  int heads;  // extent of dim 1
  int last;   // extent of the innermost dim (V or K); beta has none (-1)
  DType dtype;
};

RingLayoutCheck fail(RingLayoutIssue issue, RingTensor t, int dim, int64_t got, int64_t expected) {
  RingLayoutCheck c;
  c.issue = issue;
  c.tensor = t;
  c.dim = dim;
  c.got = got;
  c.expected = expected;
  return c;
}

// A size-1 dim's stride is never used for addressing, so any value is packed.
bool stride_is(const TensorView& v, int dim, int64_t want) {
  return v.size(dim) <= 1 || v.stride(dim) == want;
}

}  // namespace

const char* ring_tensor_name(RingTensor t) noexcept {
  switch (t) {
    case RingTensor::kRawv:
      return "ring_rawv";
    case RingTensor::kRawk:
      return "ring_rawk";
    case RingTensor::kG:
      return "ring_g";
    case RingTensor::kBeta:
      return "ring_beta";
  }
  return "ring_?";
}

const char* ring_layout_issue_name(RingLayoutIssue issue) noexcept {
  switch (issue) {
    case RingLayoutIssue::kOk:
      return "ok";
    case RingLayoutIssue::kMissing:
      return "missing";
    case RingLayoutIssue::kWrongDevice:
      return "wrong_device";
    case RingLayoutIssue::kWrongNdim:
      return "wrong_ndim";
    case RingLayoutIssue::kWrongDtype:
      return "wrong_dtype";
    case RingLayoutIssue::kTooFewSlots:
      return "too_few_slots";
    case RingLayoutIssue::kWrongHeads:
      return "wrong_heads";
    case RingLayoutIssue::kWrongLength:
      return "wrong_length";
    case RingLayoutIssue::kWrongDim:
      return "wrong_dim";
    case RingLayoutIssue::kNotPacked:
      return "not_packed";
    case RingLayoutIssue::kTooShort:
      return "too_short";
  }
  return "?";
}

RingLayoutCheck check_ring_layout(const RingViews& rings,
                                  const RingLayoutExpectation& want) noexcept {
  const RingSpec specs[] = {
      {RingTensor::kRawv, &rings.rawv, 4, want.HV, want.V, want.activation_dtype},
      {RingTensor::kRawk, &rings.rawk, 4, want.H, want.K, want.activation_dtype},
      {RingTensor::kG, &rings.g, 4, want.HV, want.K, DType::kF32},
      {RingTensor::kBeta, &rings.beta, 3, want.HV, -1, DType::kF32},
  };
  for (const RingSpec& s : specs) {
    if (!s.view->defined()) {
      return fail(RingLayoutIssue::kMissing, s.id, -1, 0, 0);
    }
  }
  for (const RingSpec& s : specs) {
    if (s.view->device() != want.device) {
      RingLayoutCheck c = fail(RingLayoutIssue::kWrongDevice, s.id, -1, 0, 0);
      c.got_device = s.view->device();
      c.expected_device = want.device;
      return c;
    }
  }
  for (const RingSpec& s : specs) {
    if (s.view->ndim() != s.ndim) {
      return fail(RingLayoutIssue::kWrongNdim, s.id, -1, s.view->ndim(), s.ndim);
    }
  }
  for (const RingSpec& s : specs) {
    if (s.view->dtype() != s.dtype) {
      RingLayoutCheck c = fail(RingLayoutIssue::kWrongDtype, s.id, -1, 0, 0);
      c.got_dtype = s.view->dtype();
      c.expected_dtype = s.dtype;
      return c;
    }
  }
  for (const RingSpec& s : specs) {
    if (s.view->size(0) < want.num_slots) {
      return fail(RingLayoutIssue::kTooFewSlots, s.id, 0, s.view->size(0), want.num_slots);
    }
  }
  for (const RingSpec& s : specs) {
    if (s.view->size(1) != s.heads) {
      return fail(RingLayoutIssue::kWrongHeads, s.id, 1, s.view->size(1), s.heads);
    }
  }
  const int64_t L = rings.rawv.size(2);
  for (const RingSpec& s : specs) {
    if (s.view->size(2) != L) {
      return fail(RingLayoutIssue::kWrongLength, s.id, 2, s.view->size(2), L);
    }
  }
  for (const RingSpec& s : specs) {
    if (s.last >= 0 && s.view->size(3) != s.last) {
      return fail(RingLayoutIssue::kWrongDim, s.id, 3, s.view->size(3), s.last);
    }
  }
  for (const RingSpec& s : specs) {
    const TensorView& v = *s.view;
    // Packed inner dims: the innermost stride is 1, each outer one the product inside it.
    int64_t packed = 1;
    for (int d = s.ndim - 1; d >= 1; --d) {
      if (!stride_is(v, d, packed)) {
        return fail(RingLayoutIssue::kNotPacked, s.id, d, v.stride(d), packed);
      }
      packed *= v.size(d);
    }
    // The slot pitch may be padded, but a smaller one would overlap neighbouring slots.
    if (v.size(0) > 1 && v.stride(0) < packed) {
      return fail(RingLayoutIssue::kNotPacked, s.id, 0, v.stride(0), packed);
    }
  }
  if (L < want.T) {
    return fail(RingLayoutIssue::kTooShort, RingTensor::kRawv, 2, L, want.T);
  }
  return RingLayoutCheck{};
}

std::string RingLayoutCheck::describe() const {
  const char* name = ring_tensor_name(tensor);
  switch (issue) {
    case RingLayoutIssue::kOk:
      return "ring layout ok";
    case RingLayoutIssue::kMissing:
      return fmt::format("{}: missing (no ring view)", name);
    case RingLayoutIssue::kWrongDevice:
      return fmt::format("{}: on {}, expected {} (the activations' device)", name,
                         device_name(got_device), device_name(expected_device));
    case RingLayoutIssue::kWrongNdim:
      return fmt::format("{}: {}-d, expected {}-d (per-layer view)", name, got, expected);
    case RingLayoutIssue::kWrongDtype:
      return fmt::format("{}: dtype {}, expected {}", name, dtype_name(got_dtype),
                         dtype_name(expected_dtype));
    case RingLayoutIssue::kTooFewSlots:
      return fmt::format("{}: dim 0 (slots) is {}, expected >= S = {}", name, got, expected);
    case RingLayoutIssue::kWrongHeads:
      return fmt::format("{}: dim 1 (heads) is {}, expected {} = {}", name, got,
                         tensor == RingTensor::kRawk ? "H" : "HV", expected);
    case RingLayoutIssue::kWrongLength:
      return fmt::format("{}: dim 2 (ring length) is {}, expected L = {} (ring_rawv's)", name, got,
                         expected);
    case RingLayoutIssue::kWrongDim:
      return fmt::format("{}: dim 3 is {}, expected {} = {}", name, got,
                         tensor == RingTensor::kRawv ? "V" : "K", expected);
    case RingLayoutIssue::kNotPacked:
      return dim == 0 ? fmt::format("{}: slot pitch stride(0) = {} overlaps slots (expected >= {})",
                                    name, got, expected)
                      : fmt::format("{}: stride({}) = {}, expected {} (packed inner dims)", name,
                                    dim, got, expected);
    case RingLayoutIssue::kTooShort:
      return fmt::format("ring length L = {} < T = {}: steps t >= L would be dropped", got,
                         expected);
  }
  return "?";
}

}  // namespace kda
