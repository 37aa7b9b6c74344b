// bench_bytes.h: the byte model of kda_bench (contract §6): every byte a call must move,
// counted once. The HBM floor of a call is its model bytes / the floor bandwidth.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tools/bench/bench_args.h"

namespace kda::bench {

/// One layer's verify call, per tensor (bytes).
struct VerifyBytes {
  int64_t state = 0;         ///< ssm state read: B*HV*V*K*4
  int64_t mixed_qkv = 0;     ///< N*D*2
  int64_t a = 0;             ///< gate logits: N*HV*K*2
  int64_t b = 0;             ///< beta logits: N*HV*2
  int64_t weights = 0;       ///< A_log HV*4 + dt_bias HV*K*4 + conv weight D*W*w (+ bias D*w)
  int64_t conv_state = 0;    ///< conv state read: B*3*D*2
  int64_t windows = 0;       ///< conv windows written: B*T*3*D*2
  int64_t out = 0;           ///< output: N*HV*V*2
  int64_t records = 0;       ///< ring: N*(HV*V*2 + H*K*2 + HV*K*4 + HV*4); snapshot: N*HV*V*K*4
  int64_t qkv_act_trip = 0;  ///< unfused only: qkv_act written and read back, 2*N*D*2

  /// The fused byte model: the floor of every variant.
  int64_t model() const;
  /// What a variant moves: the model, plus the qkv_act round trip when unfused.
  int64_t moved(bool unfused) const { return model() + (unfused ? qkv_act_trip : 0); }
};

VerifyBytes verify_bytes(const Shape& s, int B, int T, RecordMode mode);

/// Ring record bytes of one request and one step: HV*V*2 + H*K*2 + HV*K*4 + HV*4.
int64_t ring_step_bytes(const Shape& s);

/// Commit of all layers (bytes).
struct CommitBytes {
  int64_t fold = 0;      ///< layers*B*(state read + write + n ring steps read)
  int64_t snapshot = 0;  ///< layers*B*(snapshot read + state write)
  int64_t conv = 0;      ///< layers*B*3*D*2*2 (window read + conv state write)
};

/// `accepted`: steps folded / the snapshot index copied (1..T).
CommitBytes commit_bytes(const Shape& s, int layers, int B, int accepted);

/// What prefix-cache tracks (contract §9) add to a commit of all layers (bytes): `tracks`
/// tracked requests, each tracking accepted step `step` (0-based). Every kind copies the
/// track's conv window (window k read + conv state write, 3*D*2*2) besides its state:
struct TrackBytes {
  int64_t ring = 0;      ///< eager ring: the fold stores the state it passes (one state write)
  int64_t snapshot = 0;  ///< snapshot k read + state write
  /// kDeferred: the track fold reads the slot's state and steps 0..step of the ring, and writes
  /// the track slot's state (the untracked deferred commit moves no state).
  int64_t deferred = 0;
};

TrackBytes track_bytes(const Shape& s, int layers, int tracks, int step);

/// What the deferred commit (contract §7) changes in a round of `layers` layers, B requests of T
/// tokens that fold `accepted_sum` steps in all (the sum of the accepted lengths): one state pass
/// fewer per layer (the fold's read: the next verify folds the state it reads anyway), plus the u
/// records (each verify writes one per token, HV*V f32; a pending step's fold reads its u in place
/// of its rawv and beta). Negative: it saves bytes.
int64_t deferred_round_delta(const Shape& s, int layers, int B, int T, int64_t accepted_sum);

/// The lazy write-back (contract §11) in a round of `layers` layers, B requests that each accept
/// `accepted` steps every round (drafts of up to T_max tokens), on a ring of L (the slots' pending
/// counts follow the lazy commit's rule from zero, over `rounds` rounds): what changes against the
/// eager round, per round on average. Each verify reads its slot's history (the pending steps'
/// records: `history` steps a request on average); the state's fold (read + write + the folded
/// steps' records) runs only where the commit folds (`folds` of `rounds` rounds), not every round.
/// Negative: it saves.
struct LazyRound {
  int64_t delta = 0;     ///< bytes against the eager round, per round on average
  double history = 0.0;  ///< pending steps a verify reads, on average
  int folds = 0;         ///< rounds whose commit folds, of `rounds`
  int rounds = 0;
};
LazyRound lazy_round(const Shape& s, int layers, int B, int T_max, int L, int accepted,
                     int rounds = 240);

/// The KDA share of one step (contract §6 "step"): every layer's verify of B requests of T tokens
/// plus the commit of all layers, request i accepting accepted[i] steps (1..T). The step's GEMMs
/// are not part of it. Deferred ring mode's model is the two-pass floor.
struct StepBytes {
  int64_t ring = 0;      ///< eager ring: verifies + fold (three state passes) + conv commit
  int64_t deferred = 0;  ///< deferred ring: ring + deferred_round_delta (two state passes)
  int64_t snapshot = 0;  ///< snapshot mode: verifies (with snapshots) + snapshot copy + conv
  /// The lazy write-back on a ring of L (T_max, L given; else 0): ring + each request's
  /// lazy_round delta (its own accepted length every step).
  int64_t lazy = 0;
};
StepBytes step_kda_bytes(const Shape& s, int layers, int B, int T, const std::vector<int>& accepted,
                         int T_max = 0, int L = 0);
/// The step's accepted lengths (contract §6 "step": seeded random 1..T): request i's, uniform in
/// [1, T], from (seed, T, B) alone.
std::vector<int> step_accepted(uint64_t seed, int T, int B);
/// Weight bytes one step's GEMMs read (every layer's projections, and the MLP pair when `mlp`).
int64_t step_gemm_weight_bytes(const Shape& s, int layers, int hidden, int mlp);
/// step_kda_bytes as text lines (printed once by the step phase).
std::vector<std::string> describe_step_model(const Shape& s, int layers, int hidden, int mlp);

/// Microseconds needed to move `bytes` at `gbps` GB/s (1 GB = 1e9 B).
inline double floor_us(int64_t bytes, double gbps) {
  return static_cast<double>(bytes) / (gbps * 1e3);
}
/// GB/s achieved when moving `bytes` in `us` microseconds.
inline double achieved_gbps(int64_t bytes, double us) {
  return us > 0.0 ? static_cast<double>(bytes) / (us * 1e3) : 0.0;
}

/// The byte model as text lines (formulas and this shape's coefficients), printed once.
std::vector<std::string> describe_byte_model(const Shape& s, double hbm_gbps);
/// track_bytes() as text lines (printed with --commit-tracks only).
std::vector<std::string> describe_track_model(const Shape& s);

}  // namespace kda::bench
