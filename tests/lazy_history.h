// lazy_history.h: a lazy write-back's pending history (contract §11) in a test problem's rings:
// per slot a ring cursor and valid ring records of its pending steps before it, as the verifies of
// earlier rounds would have left them. Host and GPU tests (host_lazy_test, lazy_gpu_test).
#pragma once

#include <cstdint>
#include <vector>

#include "tests/test_problem.h"

namespace kda::testing {

/// Per-slot ring cursors and step counts ([S] host arrays: point VerifyParams / CommitParams at
/// them, or upload them).
struct LazyHistory {
  std::vector<int32_t> cursor, pending;
};

/// For each slot s with steps[s] > 0 (at most L): a random cursor c and valid records at ring
/// positions (c - steps[s] + j) mod L, j < steps[s]: k, v ~ N(0, (0.5 scale)^2) as bf16, g in
/// [-1.5, -0.01] (a decay in (0.22, 0.99)), beta in (0.05, 0.95); the other positions keep the
/// problem's garbage. Slots with steps[s] = 0 get cursor 0. pending = steps.
LazyHistory write_history(VerifyProblem& p, const std::vector<int32_t>& steps, float scale,
                          uint64_t seed);

}  // namespace kda::testing
