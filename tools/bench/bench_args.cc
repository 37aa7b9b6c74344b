#include "tools/bench/bench_args.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <string_view>
#include <utility>

#include "core/error.h"
#include "kernels/kda_kernels.h"

namespace kda::bench {

const char* variant_name(Variant v) {
  switch (v) {
    case Variant::kUnfused:
      return "unfused";
    case Variant::kUnfusedRing:
      return "unfused+ring";
    case Variant::kFused:
      return "fused";
    case Variant::kFusedRing:
      return "fused+ring";
  }
  return "?";
}

const char* numerics_name(VerifyNumerics n) {
  switch (n) {
    case VerifyNumerics::kExact:
      return "exact";
    case VerifyNumerics::kFast:
      return "fast";
  }
  return "?";
}

const char* draft_shape_name(DraftShape s) {
  switch (s) {
    case DraftShape::kDense:
      return "dense";
    case DraftShape::kRagged:
      return "ragged";
    case DraftShape::kMixed:
      return "mixed";
    case DraftShape::kTree:
      return "tree";
  }
  return "?";
}

const char* preset_name(Preset p) {
  switch (p) {
    case Preset::kNone:
      return "none";
    case Preset::kKimiLinear:
      return "kimi-linear";
    case Preset::kK3Tp8:
      return "k3-tp8";
  }
  return "?";
}

Shape preset_shape(Preset p) {
  Shape s;  // the defaults are Kimi-Linear's
  switch (p) {
    case Preset::kNone:
    case Preset::kKimiLinear:
      break;
    case Preset::kK3Tp8:
      s.H = 12;
      s.HV = 12;
      s.gate = GateKind::kSafe;
      s.lower_bound = -5.0f;
      break;
  }
  return s;
}

int preset_hidden(Preset p) { return p == Preset::kK3Tp8 ? 7168 : 2304; }

std::string Shape::describe() const {
  std::string gate_str =
      gate == GateKind::kStandard ? std::string("std") : fmt::format("safe({:g})", lower_bound);
  return fmt::format("H={} HV={} K={} V={} D={} gate={} conv_w={} bias={}", H, HV, K, V, D(),
                     gate_str, conv_weight_type == ConvWeightType::kF32 ? "f32" : "bf16",
                     conv_bias ? "yes" : "no");
}

int next_pow2(int x) {
  int p = 1;
  while (p < x) {
    p *= 2;
  }
  return p;
}

int BenchArgs::max_T() const { return *std::max_element(draft_tokens.begin(), draft_tokens.end()); }

int BenchArgs::effective_ring_len() const {
  return ring_len > 0 ? ring_len : std::max(16, next_pow2(2 * max_T()));
}

bool BenchArgs::has_variant(Variant v) const {
  return std::find(variants.begin(), variants.end(), v) != variants.end();
}

bool BenchArgs::any_mode(RecordMode m) const {
  return std::any_of(variants.begin(), variants.end(),
                     [m](Variant v) { return variant_mode(v) == m; });
}

std::vector<int> BenchArgs::fused_block_vs(int B, int T, RecordMode mode) const {
  if (sweep_bv) {
    return std::vector<int>(std::begin(kernels::kFusedBlockVs), std::end(kernels::kFusedBlockVs));
  }
  if (block_v > 0) {
    return {block_v};
  }
  return {kernels::default_fused_block_v(mode, B, T, shape.HV, shape.V, sms)};
}

std::string BenchArgs::fused_block_v_text() const {
  if (sweep_bv) {
    return fmt::format("{}", fmt::join(kernels::kFusedBlockVs, ","));
  }
  return block_v > 0 ? std::to_string(block_v)
                     : std::string("auto (kernels::default_block_v per B)");
}

bool BenchArgs::has_numerics(VerifyNumerics n) const {
  return std::find(numerics.begin(), numerics.end(), n) != numerics.end();
}

std::vector<int> BenchArgs::fast_block_vs(int B) const {
  if (sweep_bv) {
    return std::vector<int>(std::begin(kernels::kFastBlockVs), std::end(kernels::kFastBlockVs));
  }
  if (block_v > 0) {
    return kernels::is_fast_block_v(block_v) ? std::vector<int>{block_v} : std::vector<int>{};
  }
  return {kernels::default_fast_block_v(B, shape.HV, shape.V, sms)};
}

std::vector<int> BenchArgs::block_vs(Variant v, VerifyNumerics n, int B, int T) const {
  if (n == VerifyNumerics::kFast) {
    return variant_takes_fast(v) ? fast_block_vs(B) : std::vector<int>{};
  }
  return variant_is_fused(v) ? fused_block_vs(B, T, variant_mode(v)) : std::vector<int>{0};
}

std::string fast_skip_reason(const BenchArgs& args, Variant v, int T, int bv, bool deferred) {
  if (!variant_takes_fast(v)) {
    return fmt::format("{}: exact only (the fast outputs are the fused ring-mode verify's)",
                       variant_name(v));
  }
  if (bv == 0) {
    return fmt::format("--block-v {}: not a fast tile ({})", args.block_v,
                       fmt::join(kernels::kFastBlockVs, ", "));
  }
  VerifyParams p;
  p.mode = RecordMode::kRing;
  p.numerics = VerifyNumerics::kFast;
  p.T = T;
  // Only its presence matters: the predicate reads no memory. A fast deferred run is u-free
  // (DeferredState::deferred): its pending steps fold computing u.
  int32_t pending = 0;
  p.ring_pending = deferred ? &pending : nullptr;
  p.u_free = deferred ? 1 : 0;
  if (kernels::fast_outputs_plannable(p, VerifyPath::kFused, bv)) {
    return "";
  }
  if (T > kernels::kFastMaxTokens) {
    return fmt::format("T={} exceeds the fast chunk ({} tokens)", T, kernels::kFastMaxTokens);
  }
  return fmt::format("T={} BV={}: the plan runs exact", T, bv);
}

std::string bench_usage() {
  return fmt::format(
      R"(kda_bench: times the KDA verify / commit kernels of one model shape on the current GPU.

Usage: kda_bench [--preset kimi-linear|k3-tp8] [flags]     (flags: --name VALUE or --name=VALUE)

Shape (a preset sets these; later flags override; default shape = kimi-linear):
  --preset NAME          kimi-linear: H=HV=32, K=V=128, standard gate, f32 conv weights, no bias
                         k3-tp8:      H=HV=12, K=V=128, safe gate lb=-5, f32 conv weights, no bias
  --heads H              q/k heads
  --hv-heads HV          v heads (multiple of H; default H)
  --head-k-dim K         64 or 128
  --head-v-dim V
  --lower-bound LB       safe gate g = LB*sigmoid(...) (LB < 0); 'none' = standard gate
  --conv-weight f32|bf16 conv weight / bias dtype
  --conv-bias            with a conv bias (default none)

Sweep:
  --batch-sizes LIST     comma list of B (default 1,2,4,8,16,32,64)
  --draft-tokens LIST    comma list of T (default 4,8)
  --variants LIST        unfused,unfused+ring,fused,fused+ring or all (default all)
  --draft-shapes LIST    verify phase: dense,ragged,mixed,tree (default dense); ragged = every
                         T_n = T through the ragged kernels, mixed = T_n = T - n % T, tree = T
                         nodes per request, breadth-first binary (unfused variants only)
  --block-v BV|auto      fused V tile: one of {0} or auto (default: the dispatcher's
                         kernels::default_block_v per B, as --kda-verify-block-v=auto)
  --sweep-bv             time every fused BV and report the best
  --numerics LIST        exact,fast (default exact): the verify's output numerics (contract §10)
                         in the verify, round and step phases; a row's numerics column says what
                         its plan ran, its kernel column which kernel (fast: fast-chunk). Fast
                         rows: fused+ring only (the other variants run exact whatever is asked:
                         no row, a note), a deferred round or step u-free (its pending steps
                         folded computing u, by the fast kernel: --fast-fold), T <= {2}, the
                         fast tiles {1} (auto: kernels::default_fast_block_v per B; --sweep-bv: each;
                         --block-v outside them: no fast rows, a note). Every fast row carries
                         its outputs against exact's on the same inputs (contract §10 (b)):
                         eq% (bf16 elements bitwise equal), ulp (largest bf16 ulp distance) and
                         rel L2 (||fast - exact|| / ||exact||), from untimed runs before the
                         timing: verify: the call (copy 0); round: every layer's verify; step:
                         every layer's verify in one untimed step (each layer's exact and fast
                         verify on the same projection output; the step then goes on with the
                         fast outputs). Their records and conv windows must be bitwise exact's.
                         Fast fused+ring rounds and steps also time the lazy write-back
                         (contract §11, +lazy: L <= 16; the commit's folds every few rounds, the
                         history read; a lazy step's share is set against the exact eager one).
  --phases LIST          verify,commit,round,step or all (default verify)
                         commit: fold (ring), snapshot commit and conv commit of all layers;
                         round: every layer's verify + the commit in one graph;
                         step (contract §6, what an engine pays): per layer the input projection
                         GEMM (cuBLASLt), the verify on column views of its output, the output
                         projection GEMM + residual, then the commit, one graph; also the same
                         step without the verifies and the commit (gemm-only) and the KDA share
  --layers N             layers of the commit / round / step pools (default 20, Kimi-Linear)
  --hidden N             step: the model's hidden size (default: kimi-linear 2304, k3-tp8 7168)
  --mlp N                step: a dense MLP GEMM pair of width N per layer (default 0: none)
  --accepted N           commit: accepted length of every request (default T: all accepted)
  --commit-tracks        commit: also time the commits with prefix-cache tracks (every
                         request tracks its last accepted step, n-1, into a slot of its own
                         past the batch: the state pools get 2*B slots): commit+ring+track,
                         commit+track (snapshot), commit+deferred, commit+deferred+track

Timing (contract §6 methodology):
  --calls N              calls captured in one CUDA graph (default 10)
  --warmup N             untimed graph replays (default 5)
  --iters N              timed graph replays per repetition (default 200)
  --reps N               repetitions; report median / min / max (default 5)
  --commit-iters N       timed replays of a commit graph (default 20; each call = all layers)
  --round-iters N        timed replays of the one-round graph (default 20)
  --step-iters N         timed replays of the one-step graph (default 20)
  --l2-cold              verify: rotate through independent layer copies so the bytes touched
                         between two uses of one copy exceed 2x the L2 size
  --max-copies N         cap on --l2-cold copies (default 256)
  --hbm-gbps X           HBM floor bandwidth in GB/s (default: the measured D2D copy rate)
  --copy-mib N           size of the D2D copy-bandwidth probe (default 256)

Other:
  --ring-len L           ring length (power of two >= 2*T_max; default max(16, pow2(2*T_max)))
  --seed N               input RNG seed (default 0)
  --skip-guard           skip the bitwise guards run before timing: fused vs unfused (verify
                         phase), the deferred round vs the eager round (round phase:
                         4 replays of a graph of two rounds, every layer's outputs and
                         windows after each, the materialized state after the last) and the
                         step guard (step phase: eager, deferred and snapshot steps from one
                         state, 3 replays each, every layer's outputs, the last hidden state
                         and every request's committed state; the gemm-only step twice).
                         With --numerics fast also: verify: the fast outputs bitwise equal at
                         every fast tile timed (contract §10 (a)); step: the fast step twice
                         from one state, 3 replays each, bitwise equal to each other (every
                         layer's outputs, the hidden states, every committed state), layer 0's
                         committed state bitwise the exact step's (later layers read hidden
                         states that carry the fast outputs) and layer 0's outputs against the
                         exact step's (§10 (b), printed). The fast-vs-exact statistics and the
                         records check of the fast rows run whatever this flag says (a record
                         difference then only warns)
  --brief                table: fused rows only for the best BV (files always get every row)
  --dry-run              print the plan: device memory per B, timings, a device-time lower
                         bound (assumes an H200: 50 MiB L2); needs no GPU
  --no-pdl               launch without programmatic dependent launch (default: with PDL)
  --persistent MODE      large-tile kernels (BV = 128, fold) as persistent CTAs: auto (default:
                         the fused verify whenever its layout allows; the unfused recurrence
                         and the fold beyond one wave of CTAs), always, never
  --fast-walk on|off     fast-output verifies beyond one wave of CTAs: the resident CTAs walk
                         the items (on) or a CTA per item (off, default)
  --fast-stagger on|off  fast-output verifies with a CTA per item beyond one wave: odd-parity
                         CTAs stage their state tile late (on, default) or none (off)
  --fast-fold kernel|first  fast-output u-free deferred verifies with a CTA per item: the fast
                         kernel folds the pending steps (kernel, default) or the fold kernel
                         folds them first (first)
  --tile-occupancy MODE  per-item verify tiles' form: auto (default: the one-CTA-per-SM form,
                         up to 255 registers (the deferred BV = 32 tile: 128), for ring-mode
                         grids of at most one CTA per SM, three for the fused BV = 128 tile;
                         else two per SM with 128), one, two
  --device N             CUDA device ordinal (default 0)
  --out FILE             also write every row to FILE (.csv or .json)
  -h, --help             this text

Exit status: 0 ok, 1 error (no CUDA device, CUDA or kernel error), 2 bad arguments,
3 bitwise guard mismatch (fused vs unfused, deferred vs eager rounds, step modes, fast records
vs exact ones, or fast runs that should be equal differ).
)",
      fmt::join(kernels::kFusedBlockVs, ","), fmt::join(kernels::kFastBlockVs, ","),
      kernels::kFastMaxTokens);
}

namespace {

[[noreturn]] void arg_fail(std::string_view flag, std::string_view value, std::string_view want) {
  throw ArgError(fmt::format("{}: bad value '{}' ({})", flag, value, want));
}

int parse_int(std::string_view flag, std::string_view s, int lo, int hi) {
  int v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size() || v < lo || v > hi) {
    arg_fail(flag, s, fmt::format("an integer in [{}, {}]", lo, hi));
  }
  return v;
}

/// One of a flag's named values (`choices`: name -> value); anything else fails with the names
/// as "a, b or c".
template <typename T, size_t N>
T parse_choice(std::string_view flag, std::string_view s,
               const std::pair<std::string_view, T> (&choices)[N]) {
  static_assert(N >= 2, "a choice of at least two values");
  std::string want;
  for (size_t i = 0; i < N; ++i) {
    if (s == choices[i].first) {
      return choices[i].second;
    }
    want += (i == 0 ? "" : i + 1 == N ? " or " : ", ");
    want += choices[i].first;
  }
  arg_fail(flag, s, want);
}

double parse_double(std::string_view flag, std::string_view s) {
  const std::string str(s);
  char* end = nullptr;
  const double v = std::strtod(str.c_str(), &end);
  if (str.empty() || end != str.c_str() + str.size() || !std::isfinite(v)) {
    arg_fail(flag, s, "a finite number");
  }
  return v;
}

std::vector<std::string_view> split_commas(std::string_view s) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    const size_t comma = s.find(',', start);
    parts.push_back(s.substr(start, comma == std::string_view::npos ? s.npos : comma - start));
    if (comma == std::string_view::npos) {
      return parts;
    }
    start = comma + 1;
  }
}

/// Sorted, duplicate-free list of ints in [lo, hi].
std::vector<int> parse_int_list(std::string_view flag, std::string_view s, int lo, int hi) {
  std::vector<int> out;
  for (std::string_view part : split_commas(s)) {
    if (part.empty()) {
      arg_fail(flag, s, "a comma list of integers, e.g. 1,2,4");
    }
    out.push_back(parse_int(flag, part, lo, hi));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<Variant> parse_variants(std::string_view flag, std::string_view s) {
  std::vector<Variant> out;
  for (std::string_view part : split_commas(s)) {
    if (part == "all") {
      out.assign(std::begin(kAllVariants), std::end(kAllVariants));
      continue;
    }
    bool found = false;
    for (Variant v : kAllVariants) {
      if (part == variant_name(v)) {
        if (std::find(out.begin(), out.end(), v) == out.end()) {
          out.push_back(v);
        }
        found = true;
      }
    }
    if (!found) {
      arg_fail(flag, part, "unfused, unfused+ring, fused, fused+ring or all");
    }
  }
  // Report order follows kAllVariants whatever the command line order.
  std::sort(out.begin(), out.end());
  return out;
}

/// exact / fast, in that order whatever the command line's.
std::vector<VerifyNumerics> parse_numerics(std::string_view flag, std::string_view s) {
  std::vector<VerifyNumerics> out;
  for (std::string_view part : split_commas(s)) {
    const VerifyNumerics n = parse_choice<VerifyNumerics>(
        flag, part, {{"exact", VerifyNumerics::kExact}, {"fast", VerifyNumerics::kFast}});
    if (std::find(out.begin(), out.end(), n) == out.end()) {
      out.push_back(n);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

void validate(const BenchArgs& a) {
  const Shape& s = a.shape;
  if (s.HV % s.H != 0) {
    throw ArgError(fmt::format("--hv-heads: HV={} must be a multiple of --heads H={}", s.HV, s.H));
  }
  if (a.accepted > 0) {
    for (int T : a.draft_tokens) {
      if (a.accepted > T) {
        throw ArgError(fmt::format("--accepted: {} exceeds T={} of --draft-tokens (allowed 1..T)",
                                   a.accepted, T));
      }
    }
  }
  if (a.ring_len > 0 && (a.ring_len & (a.ring_len - 1)) != 0) {
    throw ArgError(fmt::format("--ring-len: {} is not a power of two", a.ring_len));
  }
  if (a.ring_len > 0 && a.ring_len < 2 * a.max_T()) {
    throw ArgError(fmt::format("--ring-len: L={} must be >= 2*T_max={} (contract §2)", a.ring_len,
                               2 * a.max_T()));
  }
  if ((a.phase_commit || a.phase_round || a.phase_step) && int64_t{a.layers} * s.HV > 65535) {
    throw ArgError(fmt::format("--layers: layers*HV = {}*{} exceeds the commit grid limit 65535",
                               a.layers, s.HV));
  }
  if (a.variants.empty()) {
    throw ArgError("--variants: nothing to time");
  }
  if (a.step_hidden() % 8 != 0 || a.mlp % 8 != 0) {
    throw ArgError(
        fmt::format("--hidden / --mlp: {} / {} must be multiples of 8 (16-byte rows for the GEMMs)",
                    a.step_hidden(), a.mlp));
  }
  if (a.has_numerics(VerifyNumerics::kFast)) {
    if (!a.has_variant(Variant::kFusedRing)) {
      throw ArgError(
          "--numerics: fast outputs are fused+ring's (contract §10), which --variants leaves out");
    }
    if (a.numerics.size() == 1 && a.block_v > 0 && !a.sweep_bv &&
        !kernels::is_fast_block_v(a.block_v)) {
      throw ArgError(fmt::format("--numerics fast: --block-v {} is not a fast tile ({})", a.block_v,
                                 fmt::join(kernels::kFastBlockVs, ", ")));
    }
  }
  if (a.commit_tracks && !a.phase_commit) {
    throw ArgError("--commit-tracks: times commit rows, needs the commit phase (--phases commit)");
  }
}

struct FlagSpec {
  const char* name;
  bool takes_value;
};
// Every flag bench_usage() documents (the handlers below must cover the same set).
constexpr FlagSpec kFlags[] = {
    {"--preset", true},
    {"--heads", true},
    {"--hv-heads", true},
    {"--head-k-dim", true},
    {"--head-v-dim", true},
    {"--lower-bound", true},
    {"--conv-weight", true},
    {"--conv-bias", false},
    {"--batch-sizes", true},
    {"--draft-tokens", true},
    {"--variants", true},
    {"--block-v", true},
    {"--draft-shapes", true},
    {"--numerics", true},
    {"--sweep-bv", false},
    {"--phases", true},
    {"--layers", true},
    {"--hidden", true},
    {"--mlp", true},
    {"--step-iters", true},
    {"--accepted", true},
    {"--commit-tracks", false},
    {"--calls", true},
    {"--warmup", true},
    {"--iters", true},
    {"--reps", true},
    {"--round-iters", true},
    {"--commit-iters", true},
    {"--l2-cold", false},
    {"--max-copies", true},
    {"--hbm-gbps", true},
    {"--copy-mib", true},
    {"--ring-len", true},
    {"--seed", true},
    {"--skip-guard", false},
    {"--brief", false},
    {"--dry-run", false},
    {"--no-pdl", false},
    {"--device", true},
    {"--persistent", true},
    {"--fast-walk", true},
    {"--fast-stagger", true},
    {"--fast-fold", true},
    {"--tile-occupancy", true},
    {"--out", true},
    {"--help", false},
    {"-h", false},
};

}  // namespace

std::optional<BenchArgs> parse_bench_args(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {  // --help wins over everything else on the line
    if (std::string_view(argv[i]) == "--help" || std::string_view(argv[i]) == "-h") {
      fmt::print("{}", bench_usage());
      return std::nullopt;
    }
  }
  std::vector<std::pair<std::string, std::string>> flags;  // (name, value) in order
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg.substr(0, 1) != "-") {
      throw ArgError(
          fmt::format("unexpected argument '{}' (flags start with --; see --help)", arg));
    }
    std::string name(arg), value;
    const size_t eq = arg.find('=');
    if (eq != std::string_view::npos) {
      name = std::string(arg.substr(0, eq));
    }
    const auto known = std::find_if(std::begin(kFlags), std::end(kFlags),
                                    [&](const FlagSpec& f) { return name == f.name; });
    if (known == std::end(kFlags)) {
      throw ArgError(fmt::format("unknown flag '{}' (see --help)", name));
    }
    if (eq != std::string_view::npos) {
      value = std::string(arg.substr(eq + 1));
      if (!known->takes_value) {
        throw ArgError(fmt::format("{}: takes no value (got '{}')", name, value));
      }
    } else if (known->takes_value) {
      if (i + 1 >= argc) {
        throw ArgError(fmt::format("{}: missing value", name));
      }
      value = argv[++i];
    }
    flags.emplace_back(std::move(name), std::move(value));
  }

  BenchArgs a;
  a.block_v = 0;  // auto
  // The preset first, so that every other flag overrides it whatever the order.
  for (const auto& [name, value] : flags) {
    if (name == "--preset") {
      if (value == "kimi-linear") {
        a.preset = Preset::kKimiLinear;
      } else if (value == "k3-tp8") {
        a.preset = Preset::kK3Tp8;
      } else {
        arg_fail(name, value, "kimi-linear or k3-tp8");
      }
      a.shape = preset_shape(a.preset);
    }
  }

  bool heads_given = false, hv_given = false;
  using Handler = std::function<void(const std::string&, const std::string&)>;
  const std::pair<const char*, Handler> handlers[] = {
      {"--preset", [](const std::string&, const std::string&) {}},
      {"--heads",
       [&](auto& n, auto& v) {
         a.shape.H = parse_int(n, v, 1, 1024);
         heads_given = true;
       }},
      {"--hv-heads",
       [&](auto& n, auto& v) {
         a.shape.HV = parse_int(n, v, 1, 4096);
         hv_given = true;
       }},
      {"--head-k-dim",
       [&](auto& n, auto& v) {
         a.shape.K = parse_int(n, v, 1, 1 << 20);
         if (a.shape.K != 64 && a.shape.K != 128) {
           arg_fail(n, v, "64 or 128 (contract §2)");
         }
       }},
      {"--head-v-dim", [&](auto& n, auto& v) { a.shape.V = parse_int(n, v, 1, 1024); }},
      {"--lower-bound",
       [&](auto& n, auto& v) {
         if (v == "none") {
           a.shape.gate = GateKind::kStandard;
           a.shape.lower_bound = 0.0f;
           return;
         }
         const double lb = parse_double(n, v);
         if (!(lb < 0.0)) {
           arg_fail(n, v, "a negative number (safe gate) or 'none'");
         }
         a.shape.gate = GateKind::kSafe;
         a.shape.lower_bound = static_cast<float>(lb);
       }},
      {"--conv-weight",
       [&](auto& n, auto& v) {
         a.shape.conv_weight_type = parse_choice<ConvWeightType>(
             n, v, {{"f32", ConvWeightType::kF32}, {"bf16", ConvWeightType::kBF16}});
       }},
      {"--conv-bias", [&](auto&, auto&) { a.shape.conv_bias = true; }},
      {"--batch-sizes", [&](auto& n, auto& v) { a.batch_sizes = parse_int_list(n, v, 1, 65535); }},
      {"--draft-tokens", [&](auto& n, auto& v) { a.draft_tokens = parse_int_list(n, v, 1, 64); }},
      {"--variants", [&](auto& n, auto& v) { a.variants = parse_variants(n, v); }},
      {"--draft-shapes",
       [&](auto& n, auto& v) {
         a.draft_shapes.clear();
         size_t start = 0;
         while (start <= v.size()) {
           const size_t comma = std::min(v.find(',', start), v.size());
           a.draft_shapes.push_back(parse_choice<DraftShape>(n, v.substr(start, comma - start),
                                                             {{"dense", DraftShape::kDense},
                                                              {"ragged", DraftShape::kRagged},
                                                              {"mixed", DraftShape::kMixed},
                                                              {"tree", DraftShape::kTree}}));
           start = comma + 1;
         }
       }},
      {"--numerics", [&](auto& n, auto& v) { a.numerics = parse_numerics(n, v); }},
      {"--block-v",
       [&](auto& n, auto& v) {
         if (v == "auto") {
           a.block_v = 0;
           return;
         }
         a.block_v = parse_int(n, v, 1, 1 << 20);
         if (std::find(std::begin(kernels::kFusedBlockVs), std::end(kernels::kFusedBlockVs),
                       a.block_v) == std::end(kernels::kFusedBlockVs)) {
           arg_fail(n, v, fmt::format("one of {}", fmt::join(kernels::kFusedBlockVs, ", ")));
         }
       }},
      {"--sweep-bv", [&](auto&, auto&) { a.sweep_bv = true; }},
      {"--phases",
       [&](auto& n, auto& v) {
         a.phase_verify = a.phase_commit = a.phase_round = a.phase_step = false;
         for (std::string_view p : split_commas(v)) {
           if (p == "verify") {
             a.phase_verify = true;
           } else if (p == "commit") {
             a.phase_commit = true;
           } else if (p == "round") {
             a.phase_round = true;
           } else if (p == "step") {
             a.phase_step = true;
           } else if (p == "all") {
             a.phase_verify = a.phase_commit = a.phase_round = a.phase_step = true;
           } else {
             arg_fail(n, p, "verify, commit, round, step or all");
           }
         }
       }},
      {"--layers", [&](auto& n, auto& v) { a.layers = parse_int(n, v, 1, 4096); }},
      {"--hidden", [&](auto& n, auto& v) { a.hidden = parse_int(n, v, 8, 1 << 16); }},
      {"--mlp", [&](auto& n, auto& v) { a.mlp = parse_int(n, v, 0, 1 << 18); }},
      {"--step-iters", [&](auto& n, auto& v) { a.step_iters = parse_int(n, v, 1, 1000000); }},
      {"--accepted", [&](auto& n, auto& v) { a.accepted = parse_int(n, v, 1, 64); }},
      {"--commit-tracks", [&](auto&, auto&) { a.commit_tracks = true; }},
      {"--calls", [&](auto& n, auto& v) { a.calls = parse_int(n, v, 1, 1000); }},
      {"--warmup", [&](auto& n, auto& v) { a.warmup = parse_int(n, v, 0, 100000); }},
      {"--iters", [&](auto& n, auto& v) { a.iters = parse_int(n, v, 1, 1000000); }},
      {"--reps", [&](auto& n, auto& v) { a.reps = parse_int(n, v, 1, 1000); }},
      {"--commit-iters", [&](auto& n, auto& v) { a.commit_iters = parse_int(n, v, 1, 1000000); }},
      {"--round-iters", [&](auto& n, auto& v) { a.round_iters = parse_int(n, v, 1, 1000000); }},
      {"--l2-cold", [&](auto&, auto&) { a.l2_cold = true; }},
      {"--max-copies", [&](auto& n, auto& v) { a.max_copies = parse_int(n, v, 1, 4096); }},
      {"--hbm-gbps",
       [&](auto& n, auto& v) {
         a.hbm_gbps = parse_double(n, v);
         if (!(a.hbm_gbps > 0.0)) {
           arg_fail(n, v, "a positive bandwidth in GB/s");
         }
       }},
      {"--copy-mib", [&](auto& n, auto& v) { a.copy_mib = parse_int(n, v, 1, 65536); }},
      {"--ring-len", [&](auto& n, auto& v) { a.ring_len = parse_int(n, v, 2, 1 << 16); }},
      {"--seed",
       [&](auto& n, auto& v) { a.seed = static_cast<uint64_t>(parse_int(n, v, 0, 1 << 30)); }},
      {"--skip-guard", [&](auto&, auto&) { a.guard = false; }},
      {"--brief", [&](auto&, auto&) { a.brief = true; }},
      {"--dry-run", [&](auto&, auto&) { a.dry_run = true; }},
      {"--no-pdl", [&](auto&, auto&) { a.launch.pdl = false; }},
      {"--persistent",
       [&](auto& n, auto& v) {
         using M = kernels::PersistentMode;
         a.launch.persistent = parse_choice<M>(
             n, v, {{"auto", M::kAuto}, {"always", M::kAlways}, {"never", M::kNever}});
       }},
      {"--fast-walk",
       [&](auto& n, auto& v) {
         a.launch.fast_walk = parse_choice<bool>(n, v, {{"on", true}, {"off", false}});
       }},
      {"--fast-stagger",
       [&](auto& n, auto& v) {
         a.launch.fast_stagger = parse_choice<bool>(n, v, {{"on", true}, {"off", false}});
       }},
      {"--fast-fold",
       [&](auto& n, auto& v) {
         a.launch.fast_fold_in_kernel =
             parse_choice<bool>(n, v, {{"kernel", true}, {"first", false}});
       }},
      {"--tile-occupancy",
       [&](auto& n, auto& v) {
         using O = kernels::TileOccupancy;
         a.launch.occupancy = parse_choice<O>(
             n, v, {{"auto", O::kAuto}, {"one", O::kOnePerSm}, {"two", O::kTwoPerSm}});
       }},
      {"--device", [&](auto& n, auto& v) { a.device = parse_int(n, v, 0, 1023); }},
      {"--out",
       [&](auto& n, auto& v) {
         if (!ends_with(v, ".csv") && !ends_with(v, ".json")) {
           arg_fail(n, v, "a file name ending in .csv or .json");
         }
         a.out_path = v;
       }},
  };
  for (const auto& [name, value] : flags) {
    const auto it = std::find_if(std::begin(handlers), std::end(handlers),
                                 [&](const auto& h) { return name == h.first; });
    KDA_CHECK_CODE(it != std::end(handlers), ErrorCode::kInternal,
                   "kda_bench: flag {} has no handler", name);
    it->second(name, value);
  }
  if (heads_given && !hv_given) {
    a.shape.HV = a.shape.H;  // --hv-heads defaults to --heads
  }
  validate(a);
  return a;
}

}  // namespace kda::bench
