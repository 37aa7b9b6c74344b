#include "memory_pool/memory_report.h"

#include <fmt/format.h>

#include <initializer_list>

#include "core/error.h"

namespace kda {

namespace {

// Product of non-negative factors; sizes come from engine flags, so overflow is a user error.
int64_t checked_product(std::initializer_list<int64_t> factors) {
  int64_t p = 1;
  for (int64_t f : factors) {
    KDA_CHECK(!__builtin_mul_overflow(p, f, &p),
              "PoolConfig: a pool tensor size overflows int64 (factors too large)");
  }
  return p;
}

int64_t checked_sum(std::initializer_list<int64_t> terms) {
  int64_t s = 0;
  for (int64_t t : terms) {
    KDA_CHECK(!__builtin_add_overflow(s, t, &s),
              "PoolConfig: the pool's total size overflows int64");
  }
  return s;
}

std::string mib(int64_t bytes) {
  return fmt::format("{:.2f} MiB ({} B)", static_cast<double>(bytes) / (1024.0 * 1024.0), bytes);
}

}  // namespace

PoolMemoryReport compute_memory_report(const PoolConfig& c) {
  validate_pool_config(c);
  constexpr int64_t kBf16 = 2;
  constexpr int64_t kF32 = 4;
  constexpr int64_t kInt32 = 4;
  const int64_t layers = c.layers, D = c.qkv_dim(), L = c.ring_len;
  const int64_t H = c.H, HV = c.HV, K = c.K, V = c.V, T = c.T_max;

  PoolMemoryReport r;
  r.ring_mode = c.ring_mode;
  r.slots = c.num_slots;
  r.rows = c.num_rows;
  r.conv_state_per_slot = checked_product({layers, kPoolConvHistory, D, kBf16});
  r.ssm_state_per_slot = checked_product({layers, HV, V, K, kF32});
  // Ring record per slot and layer: rawv [HV, L, V] bf16, rawk [H, L, K] bf16 (one per k-head),
  // g [HV, L, K] f32, beta [HV, L] f32: about 1 KiB per head-step at K = V = 128; with the
  // deferred commit also u [HV, L, V] f32 (0.5 KiB more). Plus the slot's ring cursor (i32) and
  // its pending count per layer (i32).
  r.ring_per_slot = checked_sum(
      {checked_product({layers, HV, L, V, kBf16}), checked_product({layers, H, L, K, kBf16}),
       checked_product({layers, HV, L, K, kF32}), checked_product({layers, HV, L, kF32}),
       c.deferred_commit && !c.lazy_commit ? checked_product({layers, HV, L, V, kF32}) : int64_t{0},
       checked_product({layers + 1, kInt32})});
  r.lazy_pending_capacity = c.ring_mode && c.lazy_commit ? L - T : 0;
  r.conv_window_per_row = checked_product({layers, T, kPoolConvHistory, D, kBf16});
  r.snapshot_per_row = checked_product({layers, T, HV, V, K, kF32});
  r.qkv_act_per_row = checked_product({T, D, kBf16});

  const int64_t common_slot = checked_sum({r.conv_state_per_slot, r.ssm_state_per_slot});
  const int64_t common_row = checked_sum({r.conv_window_per_row, r.qkv_act_per_row});
  const int64_t common =
      checked_sum({checked_product({r.slots, common_slot}), checked_product({r.rows, common_row})});
  r.ring_mode_total_bytes = checked_sum({common, checked_product({r.slots, r.ring_per_slot})});
  r.snapshot_mode_total_bytes =
      checked_sum({common, checked_product({r.rows, r.snapshot_per_row})});

  r.bytes_per_slot = c.ring_mode ? common_slot + r.ring_per_slot : common_slot;
  r.bytes_per_row = c.ring_mode ? common_row : common_row + r.snapshot_per_row;
  r.total_bytes = c.ring_mode ? r.ring_mode_total_bytes : r.snapshot_mode_total_bytes;
  return r;
}

std::string PoolMemoryReport::to_string() const {
  std::string s = fmt::format("KDA state pool ({} mode): {} slots, {} scratch rows, total {}\n",
                              ring_mode ? "ring" : "snapshot", slots, rows, mib(total_bytes));
  s += fmt::format("  per slot {}: conv_state {}, ssm_state {}{}\n", mib(bytes_per_slot),
                   mib(conv_state_per_slot), mib(ssm_state_per_slot),
                   ring_mode ? ", rings " + mib(ring_per_slot) : std::string());
  if (lazy_pending_capacity > 0) {
    s += fmt::format(
        "  lazy write-back: a slot's ring holds up to {} pending steps beside the next draft; the "
        "commit folds them when more would not fit\n",
        lazy_pending_capacity);
  }
  s += fmt::format("  per scratch row {}: conv_window {}, qkv_act {}{}\n", mib(bytes_per_row),
                   mib(conv_window_per_row), mib(qkv_act_per_row),
                   ring_mode ? std::string() : ", snapshots " + mib(snapshot_per_row));
  s += fmt::format("  snapshot mode would take {}, ring mode {}: ring mode saves {}",
                   mib(snapshot_mode_total_bytes), mib(ring_mode_total_bytes),
                   ring_mode_savings_bytes() >= 0
                       ? mib(ring_mode_savings_bytes())
                       : fmt::format("nothing (costs {} more)", mib(-ring_mode_savings_bytes())));
  return s;
}

}  // namespace kda
