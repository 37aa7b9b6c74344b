// tf32_round.h: TF32 rounding as integer operations on an f32's bits (kernels and host tests).
#pragma once

#include <cstdint>

#include "core/platform_macros.h"

namespace kda::kernels {

/// The bits of f32 `bits` rounded to TF32 (10 explicit mantissa bits), round to nearest with ties
/// away from zero, low 13 mantissa bits zero: half a TF32 ulp added to the magnitude's bits (a
/// carry moves into the exponent, the next binade), then the low 13 bits cleared. For every finite
/// input this is PTX cvt.rna.tf32.f32 bit for bit (tests/tf32_round_test.cc checks it against a
/// rounding written from the definition); infinities and NaNs are not inputs here.
KDA_HD uint32_t tf32_rna_bits(uint32_t bits) { return (bits + 0x1000u) & 0xffffe000u; }

}  // namespace kda::kernels
