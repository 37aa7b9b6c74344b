// gpu_test_util.h: GPU-only helpers for the [gpu] tests.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kda::testing {

/// Occupies all but `free_sms` SMs of the device for about `milliseconds` with spinning
/// CTAs that each fill a whole SM (max shared memory), so that kernels launched meanwhile
/// on another stream are squeezed onto the few remaining SMs. Returns immediately; the
/// hog runs on `stream`. Returns the number of SMs left free (0 if it could not hog).
int launch_sm_hog(int free_sms, double milliseconds, cudaStream_t stream);

}  // namespace kda::testing
