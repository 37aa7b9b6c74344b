// launch_utils.h: small host-side helpers shared by the launchers (plain C++).
#pragma once

#include <cstdint>

namespace kda::kernels {

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// Programmatic dependent launch on/off for every launcher (default on; it is a no-op
/// before sm_90). Tests switch it off to compare schedules. Not thread-safe to change
/// while other threads launch.
bool pdl_enabled();
void set_pdl_enabled(bool on);

}  // namespace kda::kernels
