// verify_traits.h: what a verify kernel instantiation is, named (CUTLASS's kernel-schedule style):
// its path, its schedule and its feature set, carried by one traits type that every verify kernel
// and work-item template takes. A schedule is a name, not a product of boolean template flags.
// Plain C++ (constexpr): the planner (verify_plan.h), tests and the ptxas table name them too.
#pragma once

#include <cstdint>

#include "core/platform_macros.h"
#include "kernels/params/kda_params.h"

namespace kda {

/// Fused (conv + gates + recurrence in one kernel) or unfused (the conv-update kernel, then the
/// recurrence reading its output): contract §4's two paths.
enum class VerifyPath : uint8_t { kUnfused, kFused };

}  // namespace kda

namespace kda::kernels {

/// Which kernel runs a call's work items, (V tile, v-head, request), and how.
enum class VerifySchedule : uint8_t {
  /// verify_tile_kernel: one CTA per item, two CTAs per SM (128 registers per thread).
  kPerItem,
  /// verify_tile_kernel: one CTA per item, one CTA per SM: up to 255 registers, ring-mode steps
  /// grouped (TileConfig's wide form; the deferred BV = 32 tile keeps 128 registers).
  kPerItemWide,
  /// verify_persistent_kernel, ring mode: persistent CTAs stream the state tiles of their items
  /// through shared memory (BV = 128 only; common/persistent_stage.cuh).
  kPersistentRing,
  /// The same in snapshot mode.
  kPersistentSnapshot,
  /// verify_fast_kernel (verify/fast_item.cuh), contract §10: a CTA per item, two per SM (beyond
  /// one wave its tiles staggered), or, when asked, the resident CTAs walking the items, each
  /// staging its next item's state (verify_fast_walk_kernel); the
  /// exact prologue (records, windows, at the slot's ring cursor), then the outputs from the
  /// chunked form with the state contractions on tensor cores. Ring-mode chains (dense or
  /// ragged), fused; a u-free deferred call's pending steps folded onto the staged tile after the
  /// prologue (kDeferredFold), or by the fold kernel before it (VerifyPlan::pending_fold_first).
  kFastChunk,
};

/// What an instantiation carries besides the dense verify: a set of independent features.
enum VerifyFeature : uint32_t {
  kNoFeatures = 0,
  /// A ring-mode call of the deferred commit (VerifyParams::ring_pending): records at the slot's
  /// ring cursor, its pending steps folded first (item_fold.cuh: from u records in the exact
  /// kernels, computing u in the fast kernel; or ring_pending reaches the kernel null: the fold
  /// kernel ran first, VerifyPlan::pending_fold_first).
  kDeferredFold = 1u << 0,
  /// Ragged or tree rows (VerifyParams::token_offsets / parents, contract §8).
  kRaggedRows = 1u << 1,
  /// Extend with prefix-cache tracks (ExtendParams::track_steps).
  kExtendTracks = 1u << 2,
  /// A lazy verify (contract §11; ring_pending without ssm_fold_out, fast outputs only): records
  /// at the slot's ring cursor, the pending steps the history of the fast chunk, nothing folded.
  kLazyHistory = 1u << 3,
};
using VerifyFeatures = uint32_t;

KDA_HD constexpr bool is_persistent(VerifySchedule s) {
  return s == VerifySchedule::kPersistentRing || s == VerifySchedule::kPersistentSnapshot;
}

/// One verify kernel instantiation: the conv weight type, K, the V tile, the path, the schedule
/// and the feature set. The work-item templates read every compile-time choice from here.
template <typename WeightT, int K_, int BV_, VerifyPath PATH, VerifySchedule SCHEDULE,
          VerifyFeatures FEATURES>
struct VerifyTraits {
  using Weight = WeightT;
  static constexpr int K = K_;
  static constexpr int BV = BV_;
  static constexpr VerifyPath kPath = PATH;
  static constexpr VerifySchedule kSchedule = SCHEDULE;
  static constexpr VerifyFeatures kFeatures = FEATURES;

  static constexpr bool kFused = PATH == VerifyPath::kFused;
  /// The one-CTA-per-SM form (TileConfig's wide registers and grouped steps).
  static constexpr bool kWide = SCHEDULE == VerifySchedule::kPerItemWide;
  static constexpr bool kDeferred = (FEATURES & kDeferredFold) != 0;
  static constexpr bool kShaped = (FEATURES & kRaggedRows) != 0;
  static constexpr bool kTrackedExtend = (FEATURES & kExtendTracks) != 0;
  /// A lazy verify (contract §11): the fast chunk's pending history.
  static constexpr bool kLazy = (FEATURES & kLazyHistory) != 0;

  static_assert(K == 64 || K == 128, "K must be 64 or 128 (contract §2)");
  static_assert(!is_persistent(SCHEDULE) || BV == 128, "persistent kernels run BV = 128 tiles");
  static_assert(!(kShaped && kWide && !kFused),
                "an unfused shaped call steps one token at a time (two CTAs per SM)");
  static_assert(!(kShaped && is_persistent(SCHEDULE)) ||
                    (kFused && SCHEDULE == VerifySchedule::kPersistentRing),
                "ragged persistent verify is the fused ring-mode kernel");
  static_assert(!(kDeferred && SCHEDULE == VerifySchedule::kPersistentSnapshot),
                "the deferred commit is ring mode");
  static_assert(!(kTrackedExtend && (kDeferred || kShaped || is_persistent(SCHEDULE))),
                "tracked extend runs the dense per-item kernels");
  static_assert(!kLazy || (SCHEDULE == VerifySchedule::kFastChunk && !kDeferred),
                "the lazy history is the fast chunk's (it folds nothing)");
};

/// The traits' compile-time choices as members of a work-item template (ItemPrologue, ItemSteps,
/// VerifyItem: each derives from the one before, a dependent base whose members it cannot name
/// unqualified), under the names the item code uses.
#define KDA_VERIFY_TRAITS_MEMBERS(Traits)                        \
  using WeightT = typename Traits::Weight;                       \
  static constexpr int K = Traits::K;                            \
  static constexpr int BV = Traits::BV;                          \
  static constexpr bool FUSED = Traits::kFused;                  \
  static constexpr bool kWide = Traits::kWide;                   \
  static constexpr bool kDeferred = Traits::kDeferred;           \
  static constexpr bool kTrackedExtend = Traits::kTrackedExtend; \
  static constexpr bool kShaped = Traits::kShaped

}  // namespace kda::kernels
