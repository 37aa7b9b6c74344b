#include "memory_pool/pool_config.h"

namespace kda {

namespace {

void expect_positive(int value, const char* field) {
  KDA_CHECK(value >= 1, "PoolConfig.{}: expected >= 1, got {}", field, value);
}

bool is_power_of_two(int x) { return x > 0 && (x & (x - 1)) == 0; }

}  // namespace

void validate_pool_config(const PoolConfig& c) {
  expect_positive(c.layers, "layers");
  expect_positive(c.H, "H");
  expect_positive(c.HV, "HV");
  expect_positive(c.K, "K");
  expect_positive(c.V, "V");
  expect_positive(c.num_slots, "num_slots");
  expect_positive(c.num_rows, "num_rows");
  expect_positive(c.T_max, "T_max");
  // Positive even in snapshot mode: the memory report prices the ring alternative with it.
  expect_positive(c.ring_len, "ring_len");
  // The kernels tile K as 32 lanes x (K/32) elements (contract §3 reduction tree).
  KDA_CHECK(c.K == 64 || c.K == 128, "PoolConfig.K: expected 64 or 128, got {}", c.K);
  KDA_CHECK(c.HV % c.H == 0, "PoolConfig.HV: expected a multiple of H = {}, got {}", c.H, c.HV);
  KDA_CHECK(c.memory_budget_bytes >= 0,
            "PoolConfig.memory_budget_bytes: expected >= 0 (0 = no budget), got {}",
            c.memory_budget_bytes);
  if (c.ring_mode) {
    KDA_CHECK(is_power_of_two(c.ring_len),
              "PoolConfig.ring_len: spec-verify ring length must be a power of two, got {}",
              c.ring_len);
    // Verify writes steps 0..T-1 and commit folds 0..n-1; the 2x margin is upstream's
    // early-flush invariant, kept so ring and snapshot pools size identically.
    KDA_CHECK(c.ring_len >= 2 * c.T_max,
              "PoolConfig.ring_len: spec-verify ring too small: expected >= 2 * T_max = {}, got {}",
              2 * c.T_max, c.ring_len);
  }
  KDA_CHECK(c.ring_mode || !c.deferred_commit,
            "PoolConfig.deferred_commit: the deferred commit is ring mode only (ring_mode is off)");
  if (c.lazy_commit) {
    KDA_CHECK(c.deferred_commit && !c.deferred_u_records,
              "PoolConfig.lazy_commit: the lazy write-back keeps the deferred commit's cursors and "
              "pending counts without u records (expected deferred_commit on and "
              "deferred_u_records off, got {} and {})",
              c.deferred_commit, c.deferred_u_records);
    KDA_CHECK(c.ring_len <= kPoolLazyMaxRing,
              "PoolConfig.ring_len: {} for the lazy write-back, expected at most {} (the pending "
              "history and the next draft share one fast chunk)",
              c.ring_len, kPoolLazyMaxRing);
  }
}

}  // namespace kda
