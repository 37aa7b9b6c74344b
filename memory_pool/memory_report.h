// memory_report.h: how many bytes a KdaStatePool takes, per slot, per scratch row and in
// total, and what ReplaySSM ring mode saves against fp32 snapshot mode (upstream §2.3).
//
// All numbers are payload bytes of the pool tensors over all layers (allocator alignment
// padding, <= 255 B per tensor, is not counted).
#pragma once

#include <cstdint>
#include <string>

#include "memory_pool/pool_config.h"

namespace kda {

struct PoolMemoryReport {
  bool ring_mode = false;
  int64_t slots = 0;  ///< S
  int64_t rows = 0;   ///< R

  // Per slot, all layers.
  int64_t conv_state_per_slot = 0;  ///< [W-1, D] bf16
  int64_t ssm_state_per_slot = 0;   ///< [HV, V, K] f32
  /// rawv + rawk + g + beta (+ u, deferred) + cursor and pending counts: ring mode's cost per slot
  int64_t ring_per_slot = 0;

  /// The lazy write-back (PoolConfig::lazy_commit): pending steps a slot's ring holds before the
  /// commit folds them (L - T_max: the ring's capacity beside the next draft); 0 otherwise.
  int64_t lazy_pending_capacity = 0;

  // Per scratch row, all layers.
  int64_t conv_window_per_row = 0;  ///< [T_max, W-1, D] bf16
  int64_t snapshot_per_row = 0;     ///< [T_max, HV, V, K] f32; what snapshot mode costs per row
  int64_t qkv_act_per_row = 0;      ///< [T_max, D] bf16, one layer (reused by every layer)

  // In the configured mode.
  int64_t bytes_per_slot = 0;  ///< conv + ssm (+ rings in ring mode)
  int64_t bytes_per_row = 0;   ///< window + qkv_act (+ snapshots in snapshot mode)
  int64_t total_bytes = 0;     ///< S * bytes_per_slot + R * bytes_per_row

  // Both modes for the same shape, so an engine can see the trade.
  int64_t snapshot_mode_total_bytes = 0;
  int64_t ring_mode_total_bytes = 0;

  // Who holds total_bytes (filled by KdaStatePool; 0 in a compute_memory_report result):
  int64_t allocated_bytes = 0;  ///< allocated by the pool (cudaMalloc or the engine's Allocator)
  int64_t external_bytes = 0;   ///< in engine-owned tensors (PoolStorage::external)
  bool from_allocator = false;  ///< allocated_bytes came from the engine's Allocator
  /// Bytes ring mode saves against snapshot mode (negative: ring mode costs more, which
  /// happens when S is much larger than R * T_max / L).
  int64_t ring_mode_savings_bytes() const {
    return snapshot_mode_total_bytes - ring_mode_total_bytes;
  }

  /// Multi-line human summary (MiB with byte counts), as logged at pool construction.
  std::string to_string() const;
};

/// The report for `config` (validated first: throws like validate_pool_config). Also throws
/// kInvalidArgument if a size overflows int64. Allocates nothing on the device.
PoolMemoryReport compute_memory_report(const PoolConfig& config);

}  // namespace kda
