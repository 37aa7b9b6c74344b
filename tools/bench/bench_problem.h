// bench_problem.h: kda_bench's device buffers for one batch size, and the VerifyParams /
// CommitParams that point into them.
//
// Every per-layer tensor is a Pool of `copies` independent instances ([copies, ...], the
// copy pitch rounded to 256 bytes), so the same object serves one warm layer (copies = 1),
// the L2-cold rotation (copies = n) and the all-layer commit / round (copies = layers).
// Shapes (contract §2) with R = B, S = B + track_slots, slots = rows = arange(B): slots
// B .. S-1 belong to no request (prefix-cache track targets), so every batch has its slots first:
//   inputs     mixed_qkv [B*T_max, D] bf16, a [B*T_max, HV*K] bf16, b [B*T_max, HV] bf16,
//              A_log [HV] f32, dt_bias [HV*K] f32, conv_weight [D, W] f32|bf16,
//              conv_bias [D] (optional), conv_state [S, W-1, D] bf16, ssm_state [S, HV, V, K] f32
//   outputs    out [B*T_max, HV, V] bf16, conv_window [B, T_max, W-1, D] bf16,
//              snapshots [B, T_max, HV, V, K] f32, rings rawv [S, HV, L, V] bf16,
//              rawk [S, H, L, K] bf16, g [S, HV, L, K] f32, beta [S, HV, L] f32
//   tracks     (track_slots > 0) track_slots [B] = B + n, track_steps [B] from set_tracks()
//   scratch    qkv_act [B*T_max, D] bf16, one for all copies (as the state pool has it)
// Output set 0 has `copies` instances; the optional set 1 (the guard's second set) has one.
// Inputs are randn scaled as contract §6 (generated on the device from the seed).
// Ownership: the Problem owns all memory (kda::Buffer); params point into it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "kernels/params/kda_params.h"
#include "tools/bench/bench_args.h"

namespace kda::bench {

struct ProblemConfig {
  Shape shape;
  int B = 1;
  int T_max = 1;           ///< step pitch of windows / snapshots; rows of the inputs per request
  int L = 16;              ///< ring length
  int copies = 1;          ///< independent layer instances
  bool ring = true;        ///< allocate rings
  bool snapshot = true;    ///< allocate snapshots
  bool guard_set = false;  ///< allocate output set 1 (copy 0 only)
  int track_slots = 0;     ///< state slots past the batch (track targets); S = B + track_slots
  /// Allocate mixed_qkv / a / b. false (the step): the caller points the verify at its own
  /// activations, and verify_params leaves them null.
  bool inputs = true;
  uint64_t seed = 0;
  int device = 0;  ///< CUDA ordinal
};

/// `copies` instances of one per-layer tensor.
struct Pool {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  ///< per copy
  int64_t numel = 0;           ///< per copy
  int64_t pitch = 0;           ///< elements between copies
  int copies = 0;
  Buffer buf;

  bool defined() const { return buf.data() != nullptr; }
  int64_t bytes() const { return numel * dtype_size(dtype); }  ///< per copy
  void* at(int copy) const;
  template <typename T>
  T* as(int copy) const {
    return static_cast<T*>(at(copy));
  }
};

/// What a verify writes (one output set).
struct OutputSet {
  Pool out, conv_window, snapshots, rawv, rawk, g, beta;
  /// The record tensors of `mode` in report order (out, conv_window, rings | snapshots).
  std::vector<const Pool*> written(RecordMode mode) const;
};

class Problem {
 public:
  /// Allocates and fills everything (enqueued on `stream`, then synchronised).
  Problem(const ProblemConfig& config, cudaStream_t stream);
  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;

  /// Device bytes `config` allocates (for the memory check before allocating).
  static int64_t device_bytes(const ProblemConfig& config);

  const ProblemConfig& config() const { return config_; }
  int num_slots() const { return config_.B + config_.track_slots; }  ///< S
  const OutputSet& outputs(int set) const;

  /// One layer's verify on copy `copy`, writing into output set `set` (set 1: copy 0 only).
  VerifyParams verify_params(int copy, int T, RecordMode mode, int set = 0) const;
  /// The commit of layers [0, layers) (copies = layers), output set 0, accepted lengths from
  /// set_accepted().
  CommitParams commit_params(int T, RecordMode mode, int layers) const;
  /// commit_params() with the track indices set: request n < track_slots tracks into slot
  /// B + n (distinct, outside the batch, in [0, S)) at the step of set_tracks(); needs
  /// track_slots > 0.
  CommitParams tracked_commit_params(int T, RecordMode mode, int layers) const;
  /// accepted[i] = n for every request (enqueued on `stream`).
  void set_accepted(int n, cudaStream_t stream) const;
  /// accepted[i] = lengths[i] (B entries; uploaded on `stream`, then synchronised).
  void set_accepted(const std::vector<int>& lengths, cudaStream_t stream) const;
  /// track_steps[i] = k for requests i < track_slots, -1 (no track) for the others (enqueued on
  /// `stream`). A valid track needs 0 <= k < the accepted length.
  void set_tracks(int k, cudaStream_t stream) const;
  /// The committed state of every copy (the round guard saves, restores and compares them).
  const Pool& ssm_state() const { return pools_.ssm_state; }
  const Pool& conv_state() const { return pools_.conv_state; }
  /// The commit error flag (synchronous read; resets it to 0).
  int32_t read_and_clear_error_flag(cudaStream_t stream) const;

  /// Identical pseudo-random garbage (from `seed`) into every tensor of output set `set`.
  void prefill_outputs(int set, uint64_t seed, cudaStream_t stream) const;

 private:
  struct Pools {
    Pool mixed_qkv, a, b, A_log, dt_bias, conv_weight, conv_bias, conv_state, ssm_state;
    Pool qkv_act;
    OutputSet sets[2];
    template <typename F>
    void each(F&& f) {
      for (Pool* p : {&mixed_qkv, &a, &b, &A_log, &dt_bias, &conv_weight, &conv_bias, &conv_state,
                      &ssm_state, &qkv_act}) {
        f(*p);
      }
      for (OutputSet& s : sets) {
        for (Pool* p : {&s.out, &s.conv_window, &s.snapshots, &s.rawv, &s.rawk, &s.g, &s.beta}) {
          f(*p);
        }
      }
    }
  };
  /// Every pool's name, dtype, shape and pitch; nothing allocated (copies = 0: absent).
  static Pools plan(const ProblemConfig& config);

  ProblemConfig config_;
  Pools pools_;
  Buffer indices_;  ///< slots [B] | rows [B] | accepted [B] | error flag [1], int32
  Buffer tracks_;   ///< track_slots [B] | track_steps [B], int32 (track_slots > 0 only)
};

}  // namespace kda::bench
