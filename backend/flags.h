// flags.h: the engine flags of the KDA backend (contract §5; names follow SGLang).
//
//   --speculative-num-draft-tokens N   T, draft tokens per verify: 1..16 (default 4)
//   --enable-linear-replayssm-spec     switch: ReplaySSM ring mode (off: snapshot mode)
//   --linear-replayssm-cache-len N     L, ring length: power of two in 2..256 (default 16);
//                                      ring mode also needs L >= 2*T
//   --max-running-requests N           1..4096 (default 64): state slots and scratch rows
//   --kda-fused-verify on|off          fused verify kernel allowed (default on)
//   --kda-fused-ring-max-batch N       0..4096 (default 1): largest B fused in ring mode
//   --kda-verify-block-v auto|N        fused V tile: auto (= 0: per call, the measured best
//                                      for its grid and T, kernels::default_block_v in ring mode,
//                                      default_deferred_block_v with the deferred commit,
//                                      default_snapshot_block_v in snapshot mode) or
//                                      8|16|32|64|128
//   --kda-deferred-commit auto|on|off|lazy  ring mode: commit only records the accepted length
//                                      and the next verify folds it (contract §7); auto
//                                      (default): lazy where dispatch/lazy_policy.h's measured
//                                      rule says it pays and the configuration allows it (as
//                                      below), else dispatch/commit_policy.h's rule (the step
//                                      tables of the measured card nearest to the device);
//                                      lazy: the lazy write-back (contract §11): verifies fold
//                                      nothing (their fast outputs take the pending steps as
//                                      history), the commit folds a slot's pending steps when
//                                      the next draft would not fit the ring (L <= 16; needs
//                                      --kda-verify-numerics fast or auto, the fused verify,
//                                      chains)
//   --kda-lazy-fold-interval N         0..16 (default 0): with lazy, also fold a slot once it
//                                      holds N pending steps (0: only when the ring is full)
//   --kda-verify-numerics exact|fast|auto  the verify's outputs (contract §10): exact (§3), or
//                                      fast (the chunked form on tensor cores) where a call can
//                                      take it: ring mode, a dense or ragged chain, T <= 16, the
//                                      fused path, a fast tile (32|64|128); with the deferred
//                                      commit no fold then reads u records (u-free: every fold
//                                      computes u, a fast verify's in its kernel, an exact one's
//                                      first);
//                                      elsewhere exact, the decision's reason says why. auto
//                                      (default): fast where dispatch/numerics_policy.h's step
//                                      table of the nearest measured card says it pays for the
//                                      call's shape; exact where it has no row. With the
//                                      deferred commit auto picks the form once: u-free (fast)
//                                      where dispatch/lazy_policy.h's step table says the fast
//                                      deferred step pays at --max-running-requests, else u
//                                      records (exact). Records, windows and the committed state
//                                      are exact in every mode.
#pragma once

#include <string>
#include <vector>

#include "dispatch/verify_dispatch.h"
#include "kernels/params/kda_params.h"

namespace kda {

/// --kda-deferred-commit (stored as its int value in EngineFlags::deferred_commit).
enum class DeferredCommit : int { kAuto = 0, kOn = 1, kOff = 2, kLazy = 3 };

/// Parsed engine flags (defaults = the flags' defaults). A plain value.
struct EngineFlags {
  int num_draft_tokens = 4;       ///< --speculative-num-draft-tokens (T)
  bool replayssm_spec = false;    ///< --enable-linear-replayssm-spec (ring mode)
  int replayssm_cache_len = 16;   ///< --linear-replayssm-cache-len (L)
  int max_running_requests = 64;  ///< --max-running-requests
  bool fused_verify = true;       ///< --kda-fused-verify
  int fused_ring_max_batch = 1;   ///< --kda-fused-ring-max-batch
  int verify_block_v = 0;         ///< --kda-verify-block-v; 0 = auto
  int deferred_commit = 0;        ///< --kda-deferred-commit: a DeferredCommit value
  int verify_numerics = 0;        ///< --kda-verify-numerics: a NumericsRequest value
  int lazy_fold_interval = 0;     ///< --kda-lazy-fold-interval (0: fold only when the ring is full)
  int eagle_topk = 1;             ///< --speculative-eagle-topk: 1 = chains, > 1 = tree drafts

  /// Tree drafts (contract §8): prepare() takes BatchSpec::parents.
  bool tree_drafts() const { return eagle_topk > 1; }
  /// --kda-deferred-commit lazy (contract §11).
  bool lazy_write_back() const {
    return deferred_commit == static_cast<int>(DeferredCommit::kLazy);
  }

  RecordMode record_mode() const {
    return replayssm_spec ? RecordMode::kRing : RecordMode::kSnapshot;
  }
  /// The fused tile when nothing is known about the call (auto -> kDefaultFusedBlockV); the
  /// dispatcher resolves auto per call with kernels::default_block_v (ring mode: from B, T, HV,
  /// V and the device's SMs; default_deferred_block_v when the verify folds pending steps) or
  /// kernels::default_snapshot_block_v (snapshot mode: B, HV, V, SMs).
  int resolved_block_v() const { return resolve_block_v(verify_block_v); }
  NumericsRequest numerics_request() const { return static_cast<NumericsRequest>(verify_numerics); }
  DispatchFlags dispatch_flags() const {
    DispatchFlags d;
    d.fused_verify = fused_verify;
    d.fused_ring_max_batch = fused_ring_max_batch;
    d.block_v = verify_block_v;
    d.numerics = numerics_request();
    return d;
  }

  /// Checks every field against its flag's range and the cross-flag rules (ring mode:
  /// L >= 2*T; tree drafts: T <= kMaxTreeNodes and no --kda-deferred-commit on or lazy; lazy:
  /// ring mode, L <= kFastMaxChunk, numerics fast or auto, the fused verify on; a fold interval
  /// only with lazy). Throws
  /// kda::Error(kInvalidArgument) naming the flag, the value and the allowed range, exactly as the
  /// parser does.
  void validate() const;
};

/// Parses the module's flags out of `args` (the engine's arguments; every entry is looked
/// at, so pass them without the program name) and removes them; the remaining arguments stay
/// in their original order. Accepts `--flag value` and `--flag=value`; the switch
/// --enable-linear-replayssm-spec takes no separate value but accepts `=on|off|true|false|1|0`.
/// A repeated flag: the last one wins. Scanning stops at a bare `--` (it and everything
/// after it are left alone). Starts from `defaults`, then validates the result (validate()).
/// Throws kda::Error(kInvalidArgument) naming the flag, the value and the allowed range;
/// on a throw `args` is unchanged.
EngineFlags parse_engine_flags(std::vector<std::string>& args, const EngineFlags& defaults = {});

/// The same over a main()-style argv: argv[0] (the program) is kept, consumed flags are
/// removed by compacting argv in place, argc is updated and (if anything was removed)
/// argv[argc] set to nullptr.
/// On a throw argc/argv are unchanged.
EngineFlags parse_engine_flags(int& argc, char** argv, const EngineFlags& defaults = {});

/// A help text listing every flag with its argument, range and default, one per line.
std::string engine_flags_help();

}  // namespace kda
