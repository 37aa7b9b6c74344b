// dtype.h: element types of the module's tensors.
//
// bf16_t has exactly the layout of __nv_bfloat16 (one uint16_t, the top half of an IEEE
// float), so params structs stay plain C++ and the same pointers are handed to kernels.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#include "core/platform_macros.h"

namespace kda {

enum class DType : uint8_t { kBF16, kF16, kF32, kI32 };

/// Bytes per element.
constexpr int64_t dtype_size(DType t) {
  switch (t) {
    case DType::kBF16:
      return 2;
    case DType::kF16:
      return 2;
    case DType::kF32:
      return 4;
    case DType::kI32:
      return 4;
  }
  return 0;
}

/// Short lower-case name ("bf16", "f16", "f32", "i32"), as used in error messages.
constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kF32:
      return "f32";
    case DType::kI32:
      return "i32";
  }
  return "?";
}

/// Raw bf16 storage (bit pattern). Conversions round to nearest even; NaN stays NaN.
struct bf16_t {
  uint16_t bits;
};
static_assert(sizeof(bf16_t) == 2, "bf16_t must match __nv_bfloat16");

/// bf16 -> f32 is exact.
KDA_HD float bf16_to_float(bf16_t x) {
  const uint32_t u = static_cast<uint32_t>(x.bits) << 16;
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

/// f32 -> bf16, round to nearest even (cvt.rn.bf16.f32). NaN -> quiet NaN with sign kept.
KDA_HD bf16_t float_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return bf16_t{static_cast<uint16_t>((u >> 16) | 0x0040u)};
  }
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return bf16_t{static_cast<uint16_t>((u + rounding_bias) >> 16)};
}

/// Rounds an f32 to the nearest bf16 value and returns it as f32.
KDA_HD float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<bf16_t> {
  static constexpr DType value = DType::kBF16;
};
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kF32;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kI32;
};

/// DType of a C++ element type: dtype_of<float> == DType::kF32.
template <typename T>
constexpr DType dtype_of = DTypeOf<T>::value;

}  // namespace kda
