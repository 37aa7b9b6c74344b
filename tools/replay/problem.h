// problem.h: a replay directory loaded into host memory, in the module's layouts
// (docs/contract.md §2): transposed conv files are converted on load, absent optional tensors are
// given their defaults (rows = arange(B), zero-filled scratch and rings).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/params/kda_params.h"
#include "tools/replay/manifest.h"

namespace kda::replay {

/// One captured verify step. Every vector is packed row-major in the contract §2 layout.
struct ReplayProblem {
  Manifest manifest;
  std::string dir;  ///< where it was loaded from
  RecordMode mode = RecordMode::kRing;

  // Sizes (letters of contract §2).
  int B = 0, T = 0, H = 0, HV = 0, K = 0, V = 0;
  int64_t D = 0, N = 0;
  int S = 0;           ///< slots: ssm_state / conv_state dim 0
  int R = 0;           ///< scratch rows: conv_window / snapshots dim 0
  int T_max = 0;       ///< scratch step pitch
  int L = 0;           ///< ring length
  int ring_slots = 0;  ///< S' >= S: ring dim 0
  ConvWeightType wtype = ConvWeightType::kF32;
  bool has_bias = false;

  // Inputs.
  std::vector<bf16_t> mixed_qkv;                 ///< [N, D]
  std::vector<bf16_t> a;                         ///< [N, HV*K]
  std::vector<bf16_t> b;                         ///< [N, HV]
  std::vector<float> A_log;                      ///< [HV]
  std::vector<float> dt_bias;                    ///< [HV*K]
  std::vector<uint8_t> conv_weight;              ///< [D, W] raw f32 or bf16 (wtype)
  std::vector<uint8_t> conv_bias;                ///< [D] like the weight; empty without bias
  std::vector<bf16_t> conv_state;                ///< [S, W-1, D] (converted from SDW if needed)
  std::vector<float> ssm_state;                  ///< [S, HV, V, K]
  std::vector<int32_t> slots;                    ///< [B]
  std::vector<int32_t> rows;                     ///< [B]
  std::optional<std::vector<int32_t>> accepted;  ///< [B]; present: commit runs
  /// Draft shape (contract §8): [B+1] ragged rows (N = its last entry), or [B, T] tree parents
  /// and (with accepted) [B, T] accepted paths.
  std::optional<std::vector<int32_t>> query_start_loc, parents, accepted_paths;

  // Output buffer templates (pre-filled from files, else zeros). Only the mode's record
  // buffers are allocated: snapshots in snapshot mode, rings in ring mode.
  std::vector<bf16_t> conv_window;  ///< [R, T_max, W-1, D]
  std::vector<float> snapshots;     ///< [R, T_max, HV, V, K]
  std::vector<bf16_t> ring_rawv;    ///< [S', HV, L, V]
  std::vector<bf16_t> ring_rawk;    ///< [S', H, L, K]
  std::vector<float> ring_g;        ///< [S', HV, L, K]
  std::vector<float> ring_beta;     ///< [S', HV, L]

  int64_t state_elems() const { return static_cast<int64_t>(HV) * V * K; }
  /// Batch positions of padding requests (slot < 0).
  std::vector<int> padding_requests() const;
};

/// Loads DIR (manifest.json + .npy files) for a run in `mode` (nullopt: the manifest's
/// "mode", else ring). Checks every file's dtype and shape against the manifest (kda::Error
/// naming the file, what was expected and what came) and the indices of the real requests:
/// slots in [0, S) and distinct, rows in [0, R) and distinct (the CUDA launchers do not
/// range-check device indices, so the tool does before any launch).
ReplayProblem load_problem(const std::string& dir, std::optional<RecordMode> mode = std::nullopt);

/// Transposes the last two dims of `outer` consecutive [rows, cols] matrices.
template <typename T>
std::vector<T> transpose_last2(const std::vector<T>& in, int64_t outer, int64_t rows,
                               int64_t cols) {
  std::vector<T> out(in.size());
  for (int64_t o = 0; o < outer; ++o) {
    const T* src = in.data() + o * rows * cols;
    T* dst = out.data() + o * rows * cols;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        dst[c * rows + r] = src[r * cols + c];
      }
    }
  }
  return out;
}

}  // namespace kda::replay
