// mma_tf32.cuh: fp32-grade products on tensor cores (contract §10): 3xTF32 split operands and
// the warp-level mma.sync m16n8k8 TF32 instruction with fp32 accumulation (sm_80+).
// Fragment layout of m16n8k8 .row.col (groupID g = lane / 4, tig = lane % 4):
//   A (16 x 8): a0 (g, tig), a1 (g + 8, tig), a2 (g, tig + 4), a3 (g + 8, tig + 4)
//   B (8 x 8):  b0 (k = tig, n = g), b1 (k = tig + 4, n = g)
//   C (16 x 8): c0 (g, 2 tig), c1 (g, 2 tig + 1), c2 (g + 8, 2 tig), c3 (g + 8, 2 tig + 1)
// A k-step's eight k slots may stand for any eight k values, provided A and B agree on the map.
// 3xTF32: with x = big + small (split_tf32), a b ~ a_big b_big + a_small b_big + a_big b_small
// (the dropped small x small term is below 2^-22 of the product); the products are exact in f32,
// but the instruction's f32 accumulation truncates toward zero, so a caller that needs f32-grade
// sums keeps the large partials out of long in-instruction accumulations (fast_item.cuh).
#pragma once

#include <cstdint>

#include "kernels/common/tf32_round.h"

namespace kda::kernels {

/// x rounded to TF32 (10 explicit mantissa bits, round to nearest, ties away), as the bits of an
/// f32 whose low 13 mantissa bits are zero: tf32_rna_bits, cvt.rna.tf32.f32 bit for bit for finite
/// x in two integer instructions (sm_90 expands cvt.rna.tf32 into a longer sequence with inf / NaN
/// checks); the operands here are finite (state values, decayed normalised keys and queries).
__device__ __forceinline__ uint32_t to_tf32(float x) { return tf32_rna_bits(__float_as_uint(x)); }

/// x = big + small to 2 x 11 significant bits: big = tf32(x), small = tf32(x - big).
struct Tf32Split {
  uint32_t big, small;
};
__device__ __forceinline__ Tf32Split split_tf32(float x) {
  const uint32_t big = to_tf32(x);
  return {big, to_tf32(__fsub_rn(x, __uint_as_float(big)))};
}

/// c += A(16 x 8) * B(8 x 8), TF32 inputs, f32 accumulation; a = {a0, a1, a2, a3},
/// b = {b0, b1} (the header's fragment layout: a uint4 loaded from shared memory in that order is
/// the instruction's register quad as it is).
__device__ __forceinline__ void mma_tf32_16x8x8(float (&c)[4], const uint4& a, const uint2& b) {
  // Not volatile: the accumulator's in/out operands order the products that share it, and the
  // compiler may interleave independent ones.
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b.x), "r"(b.y));
}

}  // namespace kda::kernels
