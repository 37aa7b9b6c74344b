// verify_launch.cuh: launches a VerifyPlan (verify_plan.h). One table lists every verify kernel
// instantiation: the configurations (conv weight type, K, V tile, path: KDA_VERIFY_CONFIGS below,
// instantiated in verify/inst/) times the schedules and feature sets verify_kernel_exists allows;
// the launch switch, the instantiation files and the count assertion read that table alone.
// A launcher launches what the plan says and decides nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <utility>

#include "core/error.h"
#include "kernels/common/device_caps.h"
#include "kernels/common/launch_pdl.cuh"
#include "kernels/verify/per_item.cuh"
#include "kernels/verify/persistent.cuh"
#include "kernels/verify/tile_policy.h"
#include "kernels/verify/verify_plan.h"

namespace kda::kernels {

/// The schedules and feature sets an instantiation may combine.
inline constexpr VerifySchedule kVerifySchedules[] = {
    VerifySchedule::kPerItem, VerifySchedule::kPerItemWide, VerifySchedule::kPersistentRing,
    VerifySchedule::kPersistentSnapshot};
inline constexpr VerifyFeatures kVerifyFeatureSets[] = {kNoFeatures, kDeferredFold, kRaggedRows,
                                                        kRaggedRows | kDeferredFold, kExtendTracks};

/// Whether the kernel (path, V tile `bv`, schedule, features) is instantiated: the per-item
/// schedules for every tile, the persistent ones at BV = 128 (snapshot mode: the dense kernel
/// alone; ragged rows: fused ring mode only); an unfused ragged call runs two CTAs per SM only;
/// tracked extend is the fused BV = kExtendBlockV tile's dense per-item forms.
constexpr bool verify_kernel_exists(VerifyPath path, int bv, VerifySchedule s, VerifyFeatures f) {
  const bool fused = path == VerifyPath::kFused;
  const bool ragged = (f & kRaggedRows) != 0;
  if (f == kExtendTracks) {
    return fused && bv == kExtendBlockV && !is_persistent(s);
  }
  switch (s) {
    case VerifySchedule::kPerItem:
      return true;
    case VerifySchedule::kPerItemWide:
      return fused || !ragged;
    case VerifySchedule::kPersistentRing:
      return bv == 128 && (fused || !ragged);
    case VerifySchedule::kPersistentSnapshot:
      return bv == 128 && f == kNoFeatures;
    case VerifySchedule::kFastChunk:
      return false;
  }
  return false;
}

/// Kernels of one configuration.
constexpr int verify_kernels_of(VerifyPath path, int bv) {
  int n = 0;
  for (const VerifySchedule s : kVerifySchedules) {
    for (const VerifyFeatures f : kVerifyFeatureSets) {
      n += verify_kernel_exists(path, bv, s, f) ? 1 : 0;
    }
  }
  return n;
}

/// Every verify kernel: 2 conv weight types x 2 K x the fused tiles, and the unfused recurrence
/// (K = 64, 128; BV = kRecurrentBlockV).
constexpr int verify_kernel_count() {
  int fused = 0;
  for (const int bv : kFusedBlockVs) {
    fused += verify_kernels_of(VerifyPath::kFused, bv);
  }
  return 4 * fused + 2 * verify_kernels_of(VerifyPath::kUnfused, kRecurrentBlockV);
}
// A change to the instantiated set changes this count: build time, binary size and the ptxas
// table (docs/ptxas_sm90.txt) follow it.
static_assert(verify_kernel_count() == 206, "the verify kernel table changed: update the count");

namespace detail {

/// Launches the instantiation (W, K, BV, PATH, S, F) of `plan`.
template <typename W, int K, int BV, VerifyPath PATH, VerifySchedule S, VerifyFeatures F>
void launch_verify_kernel(const TileArgs& args, const VerifyPlan& plan, cudaStream_t stream) {
  using Traits = VerifyTraits<W, K, BV, PATH, S, F>;
  constexpr int kThreads = TileConfig<K, BV>::kThreads;
  const VerifyParams& p = args.p;
  if constexpr (is_persistent(S)) {
    auto* kernel = &verify_persistent_kernel<Traits>;
    constexpr size_t kSmem = kVerifyPersistentSmemBytes<K, BV>;
    persistent_ctas_per_sm(reinterpret_cast<const void*>(kernel), kThreads, kSmem);  // smem limit
    launch_pdl(kernel, dim3(static_cast<unsigned>(plan.grid)), dim3(kThreads), kSmem, stream,
               plan.pdl, args);
  } else {
    const dim3 grid(static_cast<unsigned>(ceil_div(p.V, BV)), static_cast<unsigned>(p.HV),
                    static_cast<unsigned>(p.B));
    launch_pdl(&verify_tile_kernel<Traits>, grid, dim3(kThreads), 0, stream, plan.pdl, args);
  }
}

/// Calls f(integral_constant<schedule index>, integral_constant<feature set index>) for every
/// instantiated (schedule, features) pair of (PATH, BV).
template <VerifyPath PATH, int BV, size_t S, size_t FI, typename F>
void for_kernel(F& f) {
  if constexpr (verify_kernel_exists(PATH, BV, kVerifySchedules[S], kVerifyFeatureSets[FI])) {
    f(std::integral_constant<size_t, S>{}, std::integral_constant<size_t, FI>{});
  }
}
template <VerifyPath PATH, int BV, size_t S, typename F, size_t... Fs>
void for_each_feature_set(F& f, std::index_sequence<Fs...>) {
  (for_kernel<PATH, BV, S, Fs>(f), ...);
}
template <VerifyPath PATH, int BV, typename F, size_t... Ss>
void for_each_schedule(F& f, std::index_sequence<Ss...>) {
  (for_each_feature_set<PATH, BV, Ss>(f, std::make_index_sequence<std::size(kVerifyFeatureSets)>{}),
   ...);
}
template <VerifyPath PATH, int BV, typename F>
void for_each_kernel(F&& f) {
  for_each_schedule<PATH, BV>(f, std::make_index_sequence<std::size(kVerifySchedules)>{});
}

}  // namespace detail

/// Launches `plan` (its instantiation must be this configuration's) with `call`'s params; the
/// item divisors and the entry trigger come from the plan. Enqueues only.
template <typename W, int K, int BV, VerifyPath PATH>
void launch_verify(const TileArgs& call, const VerifyPlan& plan, cudaStream_t stream) {
  const VerifyParams& p = call.p;
  TileArgs args = call;
  args.div = item_divisors(p, BV);
  args.trigger_at_entry = plan.entry_trigger ? 1 : 0;
  bool launched = false;
  detail::for_each_kernel<PATH, BV>([&](auto s, auto f) {
    constexpr VerifySchedule S = kVerifySchedules[decltype(s)::value];
    constexpr VerifyFeatures F = kVerifyFeatureSets[decltype(f)::value];
    if (!launched && plan.schedule == S && plan.features == F) {
      detail::launch_verify_kernel<W, K, BV, PATH, S, F>(args, plan, stream);
      launched = true;
    }
  });
  KDA_CHECK(launched, "launch_verify: no kernel instantiated for the plan {}", plan.kernel());
}

/// Resident CTAs per SM of the persistent kernel of this configuration for `mode` and `features`
/// (raising its shared-memory limit), or 0 where there is none (the plan's occupancy input).
template <typename W, int K, int BV, VerifyPath PATH>
int persistent_occupancy(RecordMode mode, VerifyFeatures features) {
  const VerifySchedule want = mode == RecordMode::kRing ? VerifySchedule::kPersistentRing
                                                        : VerifySchedule::kPersistentSnapshot;
  const VerifyFeatures f = mode == RecordMode::kRing ? features : kNoFeatures;
  int ctas = 0;
  detail::for_each_kernel<PATH, BV>([&](auto s, auto fi) {
    constexpr VerifySchedule S = kVerifySchedules[decltype(s)::value];
    constexpr VerifyFeatures F = kVerifyFeatureSets[decltype(fi)::value];
    if constexpr (is_persistent(S)) {
      if (S == want && F == f) {
        using Traits = VerifyTraits<W, K, BV, PATH, S, F>;
        ctas =
            persistent_ctas_per_sm(reinterpret_cast<const void*>(&verify_persistent_kernel<Traits>),
                                   TileConfig<K, BV>::kThreads, kVerifyPersistentSmemBytes<K, BV>);
      }
    }
  });
  return ctas;
}

// ---- the configurations (instantiated in verify/inst/, one weight type x K per file) ----

/// X(W, K, BV, PATH) for every verify configuration of weight W and head dim K: the fused tiles
/// (tile_policy.h KDA_FUSED_BLOCK_VS), and for W = float the unfused recurrence's tile.
#define KDA_VERIFY_CONFIG_DECLARE(W, K, BV, PATH)                                        \
  extern template void launch_verify<W, K, BV, PATH>(const TileArgs&, const VerifyPlan&, \
                                                     cudaStream_t);                      \
  extern template int persistent_occupancy<W, K, BV, PATH>(RecordMode, VerifyFeatures);
#define KDA_VERIFY_CONFIG_DEFINE(W, K, BV, PATH)                                                 \
  template void launch_verify<W, K, BV, PATH>(const TileArgs&, const VerifyPlan&, cudaStream_t); \
  template int persistent_occupancy<W, K, BV, PATH>(RecordMode, VerifyFeatures);
#define KDA_VERIFY_FUSED_F32_K64(bv, X) X(float, 64, bv, VerifyPath::kFused)
#define KDA_VERIFY_FUSED_F32_K128(bv, X) X(float, 128, bv, VerifyPath::kFused)
#define KDA_VERIFY_FUSED_BF16_K64(bv, X) X(bf16_t, 64, bv, VerifyPath::kFused)
#define KDA_VERIFY_FUSED_BF16_K128(bv, X) X(bf16_t, 128, bv, VerifyPath::kFused)
#define KDA_VERIFY_UNFUSED(X)                          \
  X(float, 64, kRecurrentBlockV, VerifyPath::kUnfused) \
  X(float, 128, kRecurrentBlockV, VerifyPath::kUnfused)

#define KDA_VERIFY_DECLARE_F32_K64(bv) KDA_VERIFY_FUSED_F32_K64(bv, KDA_VERIFY_CONFIG_DECLARE)
#define KDA_VERIFY_DECLARE_F32_K128(bv) KDA_VERIFY_FUSED_F32_K128(bv, KDA_VERIFY_CONFIG_DECLARE)
#define KDA_VERIFY_DECLARE_BF16_K64(bv) KDA_VERIFY_FUSED_BF16_K64(bv, KDA_VERIFY_CONFIG_DECLARE)
#define KDA_VERIFY_DECLARE_BF16_K128(bv) KDA_VERIFY_FUSED_BF16_K128(bv, KDA_VERIFY_CONFIG_DECLARE)
KDA_FUSED_BLOCK_VS(KDA_VERIFY_DECLARE_F32_K64)
KDA_FUSED_BLOCK_VS(KDA_VERIFY_DECLARE_F32_K128)
KDA_FUSED_BLOCK_VS(KDA_VERIFY_DECLARE_BF16_K64)
KDA_FUSED_BLOCK_VS(KDA_VERIFY_DECLARE_BF16_K128)
KDA_VERIFY_UNFUSED(KDA_VERIFY_CONFIG_DECLARE)
#undef KDA_VERIFY_DECLARE_F32_K64
#undef KDA_VERIFY_DECLARE_F32_K128
#undef KDA_VERIFY_DECLARE_BF16_K64
#undef KDA_VERIFY_DECLARE_BF16_K128

}  // namespace kda::kernels
