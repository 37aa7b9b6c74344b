// pool_config.h: the shape of a KdaStatePool and the invariants it must satisfy.
//
// Letters as in docs/contract.md §2. Every tensor of the pool carries a leading [layers] dim.
#pragma once

#include <cstdint>

#include "core/tensor_view.h"

namespace kda {

/// Conv taps (W, contract §2); the pool keeps W-1 raw inputs per channel. Mirrors
/// kConvWidth in kernels/kda_params.h (the pool does not depend on the kernels).
constexpr int kPoolConvWidth = 4;
constexpr int kPoolConvHistory = kPoolConvWidth - 1;
/// Longest ring of the lazy write-back: one fast chunk (kFastMaxChunk in kernels/kda_params.h).
constexpr int kPoolLazyMaxRing = 16;

/// What a KdaStatePool holds. Plain value; validate_pool_config() states every rule.
struct PoolConfig {
  int layers = 0;          ///< KDA layers stacked in every pool tensor
  int H = 0;               ///< q/k heads
  int HV = 0;              ///< v heads; HV % H == 0 (GQA: v-head hv reads k-head hv / (HV/H))
  int K = 0;               ///< head_k_dim: 64 or 128
  int V = 0;               ///< head_v_dim
  int num_slots = 0;       ///< S: persistent per-request state slots
  int num_rows = 0;        ///< R: verify scratch rows; must be >= the largest verify batch
  int T_max = 0;           ///< largest verify T = step pitch (T_max) of windows and snapshots
  bool ring_mode = false;  ///< true: ReplaySSM rings keyed by slot; false: fp32 snapshots by row
  int ring_len = 16;       ///< L (ring mode only): power of two and >= 2 * T_max
  /// Ring mode with the deferred commit (contract §7): also the u records ring_u [layers, S, HV,
  /// L, V] f32, which the deferred folds replay (kernels/kda_params.h VerifyParams::ring_u).
  bool deferred_commit = false;
  /// With deferred_commit: the folds replay the u records (a fold without the key dot). false: the
  /// u-free deferred commit: every fold computes u from the raw records as an eager fold does,
  /// and ring_u (still allocated: the exact verify kernels store into it) is never read (contract
  /// §10: fast outputs record no exact u).
  bool deferred_u_records = true;
  /// With deferred_commit (u-free: deferred_u_records false): the lazy write-back (contract §11).
  /// A verify folds nothing; a slot keeps up to L - T_max pending steps (the ring's capacity: its
  /// history and the next draft in one fast chunk, so L <= kPoolLazyMaxRing) and the commit folds
  /// them when the next draft would not fit. No ring_u.
  bool lazy_commit = false;
  Device device = Device::host();
  int64_t memory_budget_bytes = 0;  ///< 0: no budget; else the pool's total bytes must fit

  /// D = 2*H*K + HV*V: channels of mixed_qkv and of the conv state.
  int64_t qkv_dim() const { return 2 * static_cast<int64_t>(H) * K + static_cast<int64_t>(HV) * V; }
};

/// Checks every rule below; throws kda::Error(kInvalidArgument) whose message names the
/// field, its value and the rule. Rules: layers, H, HV, K, V, num_slots, num_rows,
/// T_max, ring_len all >= 1; K in {64, 128}; HV % H == 0; memory_budget_bytes >= 0; ring mode only:
/// ring_len a power of two and ring_len >= 2 * T_max (the early-flush margin, contract §2);
/// deferred_commit only in ring mode; lazy_commit only with deferred_commit, u-free, and
/// ring_len <= kPoolLazyMaxRing.
/// The budget itself is checked by KdaStatePool (kOutOfMemory) against the memory report.
void validate_pool_config(const PoolConfig& config);

}  // namespace kda
