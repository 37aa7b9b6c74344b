// fast_ref_testing.h: test-only access to verify_fused_fast with a planted error in its chunked
// form, so that the tests of the fast outputs can prove they fail on a wrong chunk (contract §3:
// a tolerance test must fail when one step is skipped or misordered). Not part of the reference's
// API: nothing outside tests includes it.
#pragma once

#include "kernels/params/kda_params.h"

namespace kda::host::testing {

/// One planted error in the chunked form (kda_host.h verify_fused_fast).
enum class ChunkFault {
  kNone,
  /// The ratio decay of A[t][i] and M[t][i] takes d_{t-1} where it takes d_t (t > i): every decay
  /// ratio one step off.
  kDecayOffByOneStep,
  /// Token t = 1 drops its intra-chunk terms i < t (A[1][0] in u_1, M[1][0] in o_1).
  kDropIntraTerm,
  /// The outputs' mask is the strictly lower one: o_t sums M[t][i] u_i over i < t, missing the
  /// diagonal term i = t.
  kMaskOffByOne,
  /// A lazy verify's history (contract §11) starts one ring position late: its first pending
  /// step is left out (the chunk's first step is the second).
  kHistorySkipsFirstStep,
};

/// verify_fused_fast with `fault` planted in its chunk solve (kNone: verify_fused_fast itself);
/// records and windows are unaffected.
void verify_fused_fast_with_fault(const VerifyParams& p, ChunkFault fault);

/// One planted error in the lazy commit (contract §11; kda_host.h commit, CommitKind::kLazy).
enum class LazyFault {
  kNone,
  /// The fold is triggered one step late (decided for m - 1 steps): a slot may keep
  /// L - T_max + 1 pending steps, and the next draft's records would overwrite the oldest.
  kFoldOneStepLate,
  /// The pending count adds this round's accepted steps twice (m = pending + 2 n): folds replay
  /// steps the request never accepted.
  kPendingCountedTwice,
};

/// host::commit of a kLazy CommitParams with `fault` planted (kNone: host::commit itself).
void commit_lazy_with_fault(const CommitParams& p, LazyFault fault);

}  // namespace kda::host::testing
