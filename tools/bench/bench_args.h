// bench_args.h: command line of kda_bench (plain C++; no CUDA). parse_bench_args never
// touches the device, so --help and argument errors work on a machine without a GPU.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/common/launch_utils.h"
#include "kernels/params/kda_params.h"

namespace kda::bench {

/// One layer's KDA shape (letters: docs/contract.md §2).
struct Shape {
  int H = 32, HV = 32, K = 128, V = 128;
  GateKind gate = GateKind::kStandard;
  float lower_bound = 0.0f;  ///< safe gate only
  ConvWeightType conv_weight_type = ConvWeightType::kF32;
  bool conv_bias = false;

  /// D = 2*H*K + HV*V (mixed_qkv channels).
  int64_t D() const { return 2 * int64_t{H} * K + int64_t{HV} * V; }
  int64_t conv_weight_elem_bytes() const {
    return conv_weight_type == ConvWeightType::kF32 ? 4 : 2;
  }
  /// "H=32 HV=32 K=128 V=128 gate=std conv_w=f32 bias=no"
  std::string describe() const;
};

/// The four dispatchable verify variants (contract §6 naming).
enum class Variant : uint8_t { kUnfused, kUnfusedRing, kFused, kFusedRing };
constexpr Variant kAllVariants[] = {Variant::kUnfused, Variant::kUnfusedRing, Variant::kFused,
                                    Variant::kFusedRing};
const char* variant_name(Variant v);  ///< "unfused", "unfused+ring", "fused", "fused+ring"
inline bool variant_is_fused(Variant v) { return v == Variant::kFused || v == Variant::kFusedRing; }
inline RecordMode variant_mode(Variant v) {
  return v == Variant::kUnfusedRing || v == Variant::kFusedRing ? RecordMode::kRing
                                                                : RecordMode::kSnapshot;
}

/// The verify numerics of a row (contract §10): "exact" or "fast".
const char* numerics_name(VerifyNumerics n);
/// Whether `v` takes the fast outputs (contract §10): the fused ring-mode verify. The unfused
/// path and snapshot mode run exact whatever is asked, so their fast rows would repeat the exact
/// ones.
inline bool variant_takes_fast(Variant v) { return v == Variant::kFusedRing; }

/// A verify draft shape the verify phase times beside the dense batch (contract §8):
/// ragged = every T_n = T through the ragged kernels (the dense batch's tokens); mixed = T_n =
/// T - n % T (fewer tokens); tree = T nodes per request in breadth-first binary-tree order
/// (parent of node j: (j - 1) / 2; the unfused variants only).
enum class DraftShape : uint8_t { kDense, kRagged, kMixed, kTree };
const char* draft_shape_name(DraftShape s);

/// A named shape preset; its targets (contract §6) apply only while the shape is unchanged.
enum class Preset : uint8_t { kNone, kKimiLinear, kK3Tp8 };
const char* preset_name(Preset p);
Shape preset_shape(Preset p);
/// The model's hidden size for the step's projections (contract §6): Kimi-Linear-48B 2304 (also
/// without a preset), K3 TP8 7168.
int preset_hidden(Preset p);

struct BenchArgs {
  Preset preset = Preset::kNone;
  Shape shape;
  std::vector<int> batch_sizes{1, 2, 4, 8, 16, 32, 64};
  std::vector<int> draft_tokens{4, 8};  ///< T list
  std::vector<Variant> variants{std::begin(kAllVariants), std::end(kAllVariants)};
  std::vector<DraftShape> draft_shapes{DraftShape::kDense};  ///< verify phase
  /// --numerics: the verify numerics timed (verify, round, step), exact first. Fast rows only for
  /// variant_takes_fast variants with a fast tile (fast_block_vs) whose plan runs fast.
  std::vector<VerifyNumerics> numerics{VerifyNumerics::kExact};
  int block_v = 0;  ///< fused V tile; 0 = auto (kernels::default_block_v per B, as the engine)
  int sms = 0;      ///< the device's SM count (kda_bench sets it; 0 before a device is known)
  bool sweep_bv = false;

  bool phase_verify = true;
  bool phase_commit = false;
  bool phase_round = false;
  /// step (contract §6): per layer the projection GEMMs around the verify, then the commit.
  bool phase_step = false;
  int hidden = 0;    ///< step: the model's hidden size; 0 = the preset's (preset_hidden)
  int mlp = 0;       ///< step: width of a dense MLP GEMM pair per layer; 0 = none
  int layers = 20;   ///< Kimi-Linear KDA layer count
  int accepted = 0;  ///< commit: accepted length per request; 0 = T (all accepted)
  /// commit: also time the commits with prefix-cache tracks (every request tracks its last
  /// accepted step into its own slot past the batch) and the deferred commit with and without.
  bool commit_tracks = false;

  int calls = 10;         ///< calls captured per graph
  int warmup = 5;         ///< untimed graph replays
  int iters = 200;        ///< timed graph replays per repetition
  int reps = 5;           ///< repetitions (median / min / max)
  int commit_iters = 20;  ///< timed replays of a commit graph (all layers per call)
  int round_iters = 20;   ///< timed replays of the one-round graph
  int step_iters = 20;    ///< timed replays of the one-step graph
  bool l2_cold = false;
  int max_copies = 256;  ///< l2-cold: cap on independent layer copies

  /// Floor bandwidth in GB/s; 0: the card's measured D2D copy rate (contract §6), which run()
  /// writes here before any floor is printed or computed.
  double hbm_gbps = 0.0;
  /// The floor bandwidth before the copy rate is measured (the dry run's estimates): --hbm-gbps,
  /// else kPlanningGbps.
  double planning_gbps() const { return hbm_gbps > 0.0 ? hbm_gbps : kPlanningGbps; }
  static constexpr double kPlanningGbps = 4150.0;  ///< an H200's copy rate (contract §6)
  int copy_mib = 256;                              ///< D2D copy-bandwidth probe size
  int ring_len = 0;                                ///< 0: max(16, next pow2 of 2*T_max)
  uint64_t seed = 0;
  bool guard = true;
  bool brief = false;    ///< table: fused rows only for the best BV
  bool dry_run = false;  ///< print the plan (memory, timings, time bound); no device needed
  /// --no-pdl, --persistent, --tile-occupancy: handed to every launch (launch_utils.h).
  kernels::LaunchOverrides launch;
  int device = 0;
  std::string out_path;  ///< .csv or .json; empty: none

  int max_T() const;
  /// hidden, or the preset's when 0.
  int step_hidden() const { return hidden > 0 ? hidden : preset_hidden(preset); }
  int effective_ring_len() const;
  bool has_variant(Variant v) const;
  bool any_mode(RecordMode m) const;
  /// The fused BV values to time at batch size B and T draft tokens in `mode`: every
  /// kFusedBlockVs with --sweep-bv, else {block_v}, or with block_v == 0 (auto) the dispatcher's
  /// {kernels::default_fused_block_v(mode, B, T, HV, V, sms)}.
  std::vector<int> fused_block_vs(int B, int T, RecordMode mode) const;
  /// The fused BV choice as text, for the plan: "8,16,32,64,128", "64" or "auto".
  std::string fused_block_v_text() const;
  bool has_numerics(VerifyNumerics n) const;
  /// The fast-output tiles to time at batch size B: every kernels::kFastBlockVs with --sweep-bv,
  /// {block_v} when it is one of them, none when it is not, and with block_v == 0 (auto) the
  /// dispatcher's {kernels::default_fast_block_v(B, HV, V, sms)}.
  std::vector<int> fast_block_vs(int B) const;
  /// The tiles of `v` in numerics `n` at (B, T): exact: fused_block_vs (unfused: {0}); fast:
  /// fast_block_vs for a variant that takes fast outputs, else none.
  std::vector<int> block_vs(Variant v, VerifyNumerics n, int B, int T) const;
};

/// The accepted step each request tracks under --commit-tracks, of `accepted` (n) steps: the
/// last, n - 1, where the deferred track fold reads the most ring steps (n); the eager and
/// snapshot tracks move the same bytes at every step.
inline int commit_track_step(int accepted) { return accepted - 1; }

/// Why the fast rows of `v` at T draft tokens with fast tile `bv` (0: none) are not timed, or ""
/// when they are: kernels::fast_outputs_plannable on a ring-mode chain, without (`deferred`
/// false) or with pending steps to fold (u-free: folded computing u). The phases also check the
/// plan on the device.
std::string fast_skip_reason(const BenchArgs& args, Variant v, int T, int bv, bool deferred);

/// Thrown on a bad command line; what() names the flag, the value and what is allowed.
class ArgError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Parses argv. Returns std::nullopt when --help was given (usage already printed to
/// stdout). Throws ArgError on a bad flag or value.
std::optional<BenchArgs> parse_bench_args(int argc, const char* const* argv);

/// The --help text.
std::string bench_usage();

/// 1 -> 1, 3 -> 4, 16 -> 16.
int next_pow2(int x);

}  // namespace kda::bench
