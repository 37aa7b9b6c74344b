// fast_faults_gpu.cu: the fast-output kernel instantiated with each planted FastFault
// (fast_faults_gpu.h); test code only, the library instantiates none of them.
#include "tests/fast_faults_gpu.h"

#include "core/cuda_check.h"
#include "core/error.h"
#include "kernels/common/launch_pdl.cuh"
#include "kernels/verify/fast_item.cuh"

namespace kda::testing {

namespace {

template <kernels::VerifyFeatures kFeatures>
using FastTraits = kernels::VerifyTraits<float, 128, 64, VerifyPath::kFused,
                                         kernels::VerifySchedule::kFastChunk, kFeatures>;

template <kernels::FastFault F>
void launch(const VerifyParams& p) {
  constexpr bool kFolds = F == kernels::FastFault::kFoldStepShort;
  using Traits = FastTraits<kFolds ? kernels::kDeferredFold : kernels::kNoFeatures>;
  kernels::TileArgs args{p, nullptr, 0, {}};
  args.div = kernels::item_divisors(p, 64);
  args.stagger_tiles = F == kernels::FastFault::kLateTileShort ? 1 : 0;
  auto* kernel = &kernels::verify_fast_kernel<Traits, F>;
  const size_t smem =
      kFolds ? kernels::FastSmem<128, 64>::fold_bytes(p.T) : kernels::FastSmem<128, 64>::bytes(p.T);
  KDA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(kernels::ceil_div(p.V, 64)), static_cast<unsigned>(p.HV),
                  static_cast<unsigned>(p.B));
  kernels::launch_pdl(kernel, grid, dim3(256), smem, nullptr, false, args);
  KDA_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace

const char* planted_fast_fault_name(PlantedFastFault f) {
  switch (f) {
    case PlantedFastFault::kOneTf32Product:
      return "1xTF32 (split operands dropped)";
    case PlantedFastFault::kDecayOffByOne:
      return "decay ratio one step late";
    case PlantedFastFault::kDropIntraTerm:
      return "token 1 without its intra-chunk terms";
    case PlantedFastFault::kMaskOffByOne:
      return "output mask off by one (no diagonal)";
    case PlantedFastFault::kLateTileShort:
      return "staggered late tile a column short";
    case PlantedFastFault::kFoldStepShort:
      return "pending fold a step short";
  }
  return "?";
}

void verify_fast_with_fault(const VerifyParams& p, PlantedFastFault fault) {
  KDA_CHECK(p.K == 128 && p.conv_weight_type == ConvWeightType::kF32 &&
                p.mode == RecordMode::kRing && p.token_offsets == nullptr && p.T <= 16,
            "verify_fast_with_fault: a dense ring-mode chain, f32 conv weights, K = 128");
  const bool deferred = p.ring_pending != nullptr && p.u_free != 0 && p.lazy == 0;
  KDA_CHECK(deferred == (fault == PlantedFastFault::kFoldStepShort),
            "verify_fast_with_fault: the fold fault takes a u-free deferred call, the others none");
  switch (fault) {
    case PlantedFastFault::kOneTf32Product:
      return launch<kernels::FastFault::kOneTf32Product>(p);
    case PlantedFastFault::kDecayOffByOne:
      return launch<kernels::FastFault::kDecayOffByOne>(p);
    case PlantedFastFault::kDropIntraTerm:
      return launch<kernels::FastFault::kDropIntraTerm>(p);
    case PlantedFastFault::kMaskOffByOne:
      return launch<kernels::FastFault::kMaskOffByOne>(p);
    case PlantedFastFault::kLateTileShort:
      return launch<kernels::FastFault::kLateTileShort>(p);
    case PlantedFastFault::kFoldStepShort:
      return launch<kernels::FastFault::kFoldStepShort>(p);
  }
}

}  // namespace kda::testing
