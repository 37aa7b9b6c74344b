// example.h: --make-example: a replay directory filled with seeded random data (contract §6
// input scales), for tests, docs and trying the tool on a GPU host without an engine.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "tools/npy/npy.h"
#include "tools/replay/manifest.h"

namespace kda::replay {

struct ExampleOptions {
  int B = 2, T = 4, H = 2, HV = 4, K = 64, V = 64;
  int L = kDefaultRingLength;
  int T_max = 0;        ///< 0: T (no T_max key written)
  int extra_slots = 2;  ///< S = B + extra_slots
  uint64_t seed = 1;
  std::optional<float> lower_bound;  ///< set: safe gate
  bool conv_bf16 = false;            ///< bf16 conv weight / bias instead of f32
  bool bias = true;                  ///< write conv_bias
  bool pad_request = false;          ///< request 1 (0 if B == 1) is a padding request
  bool rows = true;                  ///< write rows (reversed: rows[n] = B - n, R = B + 1)
  bool accepted = true;              ///< write accepted lengths (seeded, in 1..T)
  bool prefill = false;              ///< write garbage conv_window, snapshots and rings
  std::optional<RecordMode> mode;    ///< the manifest's "mode"
  ConvLayout conv_layout = ConvLayout::kSWD;
  /// Draft shape (contract §8): "chain"; "ragged" (request n verifies T - n % T tokens, packed:
  /// query_start_loc); "tree" (T nodes per request, node j's parent (j - 1) / 2; with accepted,
  /// request n accepts the root path of node T - 1 - n % T: accepted_paths).
  std::string draft_shape = "chain";
  npy::Bf16Descr bf16 = npy::Bf16Descr::kU2;
};

/// Writes DIR/manifest.json and one .npy per tensor (DIR is created). Slots are distinct and
/// not the batch positions (slots[n] = S - 1 - n); a padding request has slot -1, NaN inputs
/// and an out-of-range scratch row (nothing of it may be read). Returns the manifest.
Manifest make_example(const std::string& dir, const ExampleOptions& o);

}  // namespace kda::replay
