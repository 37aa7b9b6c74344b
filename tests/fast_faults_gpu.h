// fast_faults_gpu.h: the fast-output verify with a planted fault (kernels/verify/fast_item.cuh
// FastFault), for the tests that must see their checks fail on it (fast_gpu_test.cc,
// deferred_gpu_test.cc).
#pragma once

#include "kernels/params/kda_params.h"

namespace kda::testing {

/// The planted faults (FastFault's order, kNone excluded).
enum class PlantedFastFault : int {
  kOneTf32Product,
  kDecayOffByOne,
  kDropIntraTerm,
  kMaskOffByOne,
  kLateTileShort,  ///< launched staggered (TileArgs::stagger_tiles)
  kFoldStepShort,  ///< a u-free deferred call (ring_pending, u_free): its fold a step short
};
const char* planted_fast_fault_name(PlantedFastFault f);

/// The fast verify of `p` (a dense ring-mode chain, f32 conv weights, K = 128; kFoldStepShort: a
/// u-free deferred call, the others none) at BV = 64 with `fault` planted, on the default stream;
/// synchronises.
void verify_fast_with_fault(const VerifyParams& p, PlantedFastFault fault);

}  // namespace kda::testing
