// fast_layout.h: where the fast kernel's mma operands sit in shared memory and which lane holds
// which element (fast_item.cuh; tests/fast_layout_test.cc emulates mma.sync over these maps on
// the host). One k-step pair j covers k = 16 j .. 16 j + 15; in its step s, the k slot tig
// (tig = lane % 4) stands for k = 16 j + 4 tig + 2 s and the slot tig + 4 for the k after it, for
// A and B alike (fragments of m16n8k8: mma_tf32.cuh). g = lane / 4.
#pragma once

#include "core/platform_macros.h"

namespace kda::kernels::fast_layout {

/// The key of slot `slot` (0..7) of step `step` of pair j (the header's map).
KDA_HD constexpr int slot_key(int j, int step, int slot) {
  return 16 * j + 4 * (slot & 3) + 2 * step + (slot >> 2);
}

/// Element (r, k) of a [rows][K] f32 array whose 16-byte chunk q of row r sits at chunk
/// q ^ (4 * (r & 1)): a warp's 16-byte loads of rows g = 0..7 at k = 16 j + 4 tig take the ideal
/// 4 wavefronts. The state stage and the narrow form's operand rows.
template <int K>
KDA_HD constexpr int swz(int r, int k) {
  return r * K + (k ^ ((r & 1) << 4));
}

// ---- the wide form (T > 4: the tokens' rows are the A operand, a state tile the B operand) ----

/// Words of one 16-row tile (8 key rows, then 8 query rows) of split operand rows:
/// [part][K / 16][step][lane][4], part 0 the big halves, 1 the small ones.
template <int K>
constexpr int kWideTileWords = 2 * 16 * K;
/// The word of row r (0..15) and key k of `part` in a row tile: lane 4 (r % 8) + (k / 4) % 4,
/// register 2 (k % 2) + r / 8, step (k / 2) % 2, pair k / 16; so lane l's A fragment
/// {a0, a1, a2, a3} of (part, pair, step) is the uint4 at wide_a_word(part, pair, step, l).
template <int K>
KDA_HD constexpr int wide_word(int part, int r, int k) {
  return (((part * (K / 16) + (k >> 4)) * 2 + ((k >> 1) & 1)) * 32 + 4 * (r & 7) + ((k >> 2) & 3)) *
             4 +
         2 * (k & 1) + (r >> 3);
}
template <int K>
KDA_HD constexpr int wide_a_word(int part, int j, int step, int lane) {
  return ((part * (K / 16) + j) * 2 + step) * 32 * 4 + 4 * lane;
}
/// Lane (g, tig)'s B fragment of column tile nt, pair j: the stage's 16-byte chunk at
/// swz(nt * 8 + g, 16 j + 4 tig); elements (0, 1) are step 0's {b0, b1}, (2, 3) step 1's.
/// Its C fragment: c0, c1 at W[m * 8 + g][nt * 8 + 2 tig + {0, 1}], c2, c3 at QS[...] alike.

// ---- the narrow form (T <= 4: a 16-row state tile is the A operand, the tokens' rows B) ----

/// The operand rows: [part][8][K] swizzled, rows 0..3 the keys, 4..7 the queries.
template <int K>
KDA_HD constexpr int narrow_word(int part, int r, int k) {
  return part * 8 * K + swz<K>(r, k);
}
/// Lane (g, tig)'s A fragment of state tile mt, pair j: the stage's chunks at
/// swz(16 mt + g, 16 j + 4 tig) (x0) and swz(16 mt + g + 8, ...) (x1); step s's quad is
/// {x0[2 s], x1[2 s], x0[2 s + 1], x1[2 s + 1]}. Its B fragment: the chunk of operand row g at
/// narrow_word(part, g, 16 j + 4 tig), elements (2 s, 2 s + 1).
/// Where C element e (c0..c3) of lane (g, tig) of state tile mt goes, as a word offset from W
/// (QS starts 8 BV words after W): row 16 mt + g + 8 (e / 2) of the state is output column c,
/// mma column 2 tig + e % 2 is key t (columns 0..3, W) or query t - 4 (4..7, QS).
template <int BV>
KDA_HD constexpr int narrow_out_word(int e, int g, int tig, int mt) {
  return (tig >= 2 ? 8 * BV : 0) + (2 * (tig & 1) + (e & 1)) * BV + 16 * mt + g + 8 * (e >> 1);
}

}  // namespace kda::kernels::fast_layout
