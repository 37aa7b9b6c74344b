// backend_fixture.h: what the backend_*_test files share: a KdaAttentionBackend on a counting
// kernel set with weights and seeded random committed state (Harness), seeded activations, and
// the bitwise / error helpers their oracles use. Runs no test itself.
//
// Built twice (tests/BUILD): :backend_fixture puts every buffer and the kernel set on the host
// (the host reference); :backend_fixture_cuda defines KDA_BACKEND_TEST_CUDA for itself and its
// tests and puts them on cuda:0 (the CUDA kernels). A test links exactly one of the two.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/kda_backend.h"
#include "core/buffer.h"
#include "core/error.h"
#include "core/platform.h"

// Tests whose subject is host-side only (validation messages, configuration, logging, the stub
// CUDA kernel set) are hidden in the CUDA build.
#ifdef KDA_BACKEND_TEST_CUDA
#define KDA_HOST_ONLY "[.host_only]"
#else
#define KDA_HOST_ONLY ""
#endif

namespace kda::testing {

/// Device of every buffer and of the kernel set: host, or cuda:0 under KDA_BACKEND_TEST_CUDA.
extern const Device kTestDevice;

constexpr int kLayers = 2;
constexpr int kT = 4;           // --speculative-num-draft-tokens
constexpr int kMaxRunning = 4;  // R; S = R + 1 (extra slot)
constexpr int kQkvPad = 8;      // mixed_qkv row stride D + 8: the contract allows stride > D

/// Kernel calls the Harness's counting kernel set (the test device's kernels) has seen.
struct KernelCounts {
  int fused = 0, unfused = 0, extend = 0, commit = 0;
  int last_block_v = 0;
  std::vector<int> fold_before_wait;  ///< VerifyParams::fold_before_wait of each verify call
  std::vector<VerifyNumerics> verify_numerics;  ///< VerifyParams::numerics of each verify call
  std::vector<VerifyNumerics> extend_numerics;  ///< ExtendParams::numerics of each extend call
  int total() const { return fused + unfused + extend + commit; }
};

struct ModelCase {
  const char* name;
  int H, HV;
  GateKind gate;
  ConvWeightType wtype;
  bool bias;
};

/// kLayers layers, K = V = 64, the case's heads, gate and conv weights.
ModelConfig model_for(const ModelCase& c);

extern const ModelCase kGqaCase;  ///< GQA HV=2H, standard gate, f32 conv + bias

/// T = kT, R = kMaxRunning, replayssm cache length 8 when `ring`; --kda-deferred-commit on
/// when `deferred`, else off (eager commits).
EngineFlags flags_for(bool ring, bool deferred = false);

// Per-layer weights owned by the test (the backend only holds views).
struct OwnedWeights {
  Buffer A_log, dt_bias, conv_weight, conv_bias;
  LayerWeights views;
};

OwnedWeights make_weights(const ModelConfig& m, uint64_t seed);

// One layer's activations and output for N = B*T rows. Padding requests' rows and the qkv
// row padding are NaN: the backend must not read them.
struct Activations {
  Buffer qkv, a, b, out;
  VerifyInputs in;
  TensorView out_view;
  int64_t D = 0;
};

Activations make_activations(const ModelConfig& m, const std::vector<int32_t>& slots, int T,
                             uint64_t seed);

std::vector<uint8_t> bytes_of(const TensorView& v);

// Bitwise equality of two views' bytes (a bool, so a failure does not print megabytes).
bool same_bits(const TensorView& x, const TensorView& y);
bool same_bits(const TensorView& x, const std::vector<uint8_t>& y);

// One request's conv windows (scratch row `row`, steps 0..T-1) and ring records of one layer,
// bitwise: an eager pool's (`want`, records at ring positions 0..T-1) against a pool that keeps
// a ring cursor (`got`, records at positions (cursor + t) mod L): the deferred and lazy tests.
void check_request_records(const KdaStatePool& want, const KdaStatePool& got, const ModelConfig& m,
                           int layer, int slot, int row, int T, int cursor);
// check_request_records for every request of `batch` (padding rows skipped; scratch rows from
// batch.rows, else the request's index), each at its slot's cursor in `cursors` (before the round).
void check_batch_records(const KdaStatePool& want, const KdaStatePool& got, const ModelConfig& m,
                         int layer, const BatchSpec& batch, const std::vector<int32_t>& cursors);

// A random verify round over `num_slots` slots: 1..kMaxRunning requests in random order (the other
// slots sit out), a padding row now and then, explicit scratch rows now and then, T in 1..kT,
// accepted lengths in 1..T, now and then a bad one (0, T + 1 or -1: `bad`).
struct RandomRound {
  BatchSpec batch;
  std::vector<int32_t> accepted;
  bool bad = false;
};
RandomRound random_round(std::mt19937& rng, int num_slots);

// FNV-1a over every pool tensor: committed state, rings, scratch.
uint64_t pool_checksum(const KdaStatePool& pool);

// A backend on the counting kernel set, with weights and seeded random committed state
// in slots 0..S-1 (all allocated).
struct Harness {
  Harness(const ModelCase& mc, bool ring, const Platform& platform, bool fused = true,
          bool deferred = false);
  /// The same with these flags (max_running_requests = kMaxRunning is kept by the helpers'
  /// batches; every other flag is the caller's).
  Harness(const ModelCase& mc, const EngineFlags& flags, const Platform& platform);
  /// The same with this model (any head dims).
  Harness(const ModelConfig& m, const EngineFlags& flags, const Platform& platform);
  /// The same with these backend options (engine memory: allocator, external_pool); the
  /// harness sets platform_override = `platform` and extra_slots = 1 over them.
  Harness(const ModelConfig& m, const EngineFlags& flags, const Platform& platform,
          BackendOptions options);

  /// Fills the scratch (conv windows, snapshots) and rings with seeded random values (never
  /// zeros), so that a test can see what a round wrote and what it left alone.
  void fill_scratch(uint64_t seed);

  const KdaStatePool& pool() const { return backend->pool(); }

  ModelConfig model;
  std::shared_ptr<KernelCounts> counts;
  /// The launch overrides of the harness's kernel set (CUDA tests force schedules with them; a
  /// change applies from the next kernel call on).
  std::shared_ptr<kernels::LaunchOverrides> launch;
  std::unique_ptr<KdaAttentionBackend> backend;
  std::vector<OwnedWeights> weights;
};

// Runs verify on every layer; returns the layers' activations (inputs kept for oracles).
std::vector<Activations> verify_all(Harness& h, const BatchSpec& batch, uint64_t seed);

// The harness's allocated slots, in order.
std::vector<int32_t> allocated_slots(const Harness& h);

// A verify round of `batch` abandoned after its first `layers` layers (abort_round), on `h`.
void abort_after_layers(Harness& h, const BatchSpec& batch, uint64_t seed, int layers);

// Materializes every allocated slot of `ring` (a deferred or lazy backend) and checks that its
// SSM and conv state equal `eager`'s bitwise and that nothing is pending.
void check_materialized_states(const Harness& eager, Harness& ring);

// `v` uploaded to a buffer on the test device (at least 4 bytes, so an empty list still has an
// address; its bytes past v.size() are unspecified).
Buffer device_i32(const std::vector<int32_t>& v);

/// Every element of a (possibly padded) bf16, f32 or i32 view, packed, as bytes (empty for an
/// undefined view): bitwise comparisons of pool tensors with different pitches.
std::vector<uint8_t> packed_bytes(const TensorView& v);

// A random tree of T nodes (parents[0] = -1, parents[j] < j), at most `topk` children per node.
std::vector<int32_t> random_tree(std::mt19937& rng, int T, int topk);

// Commits the prepared round with these accepted lengths (uploaded to the test device).
void commit(Harness& h, const std::vector<int32_t>& accepted);

// One random round on two backends that must agree bitwise: verify_all on both with the same
// inputs (`seed`), their outputs CHECKed equal layer by layer, then the round's accepted lengths
// committed on both and their device errors checked (a bad length: kInvalidArgument on each).
void twin_round(Harness& a, Harness& b, const RandomRound& rr, uint64_t seed);

// Runs `f`; CHECKs that it throws kda::Error with code `want` and returns its message
// ("<no error>" if it does not throw).
std::string error_of(const std::function<void()>& f, ErrorCode want);

}  // namespace kda::testing
