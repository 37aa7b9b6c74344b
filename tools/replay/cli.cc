// cli.cc: kda_replay's argument parsing, reports and help text.
#include "tools/replay/cli.h"

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <optional>

#include "core/error.h"
#include "core/platform.h"
#include "kernels/kda_kernels.h"
#include "tools/replay/compare.h"
#include "tools/replay/example.h"
#include "tools/replay/manifest.h"
#include "tools/replay/problem.h"
#include "tools/replay/runner.h"

namespace kda::replay {
namespace {

enum class Group { kCommon, kReplay, kCompare, kExample };

struct OptionSpec {
  const char* name;  // without "--"
  bool takes_value;
  Group group;
};

constexpr OptionSpec kOptions[] = {
    {"help", false, Group::kCommon},
    {"mode", true, Group::kCommon},
    {"bf16-descr", true, Group::kCommon},
    {"out", true, Group::kCommon},
    {"in", true, Group::kReplay},
    {"device", true, Group::kReplay},
    {"path", true, Group::kReplay},
    {"block-v", true, Group::kReplay},
    {"fused-ring-max-batch", true, Group::kReplay},
    {"pretend-platform", true, Group::kReplay},
    {"repeat", true, Group::kReplay},
    {"compare", true, Group::kCompare},
    {"expect", true, Group::kCompare},
    {"make-example", true, Group::kExample},
    {"B", true, Group::kExample},
    {"T", true, Group::kExample},
    {"H", true, Group::kExample},
    {"HV", true, Group::kExample},
    {"K", true, Group::kExample},
    {"V", true, Group::kExample},
    {"L", true, Group::kExample},
    {"T-alloc", true, Group::kExample},
    {"extra-slots", true, Group::kExample},
    {"seed", true, Group::kExample},
    {"lower-bound", true, Group::kExample},
    {"conv-dtype", true, Group::kExample},
    {"conv-layout", true, Group::kExample},
    {"no-bias", false, Group::kExample},
    {"no-rows", false, Group::kExample},
    {"no-accepted", false, Group::kExample},
    {"pad-request", false, Group::kExample},
    {"prefill", false, Group::kExample},
    {"draft-shape", true, Group::kExample},
};

const OptionSpec* find_option(const std::string& name) {
  for (const OptionSpec& o : kOptions) {
    if (name == o.name) {
      return &o;
    }
  }
  return nullptr;
}

class Args {
 public:
  explicit Args(const std::vector<std::string>& args) {
    for (size_t i = 0; i < args.size(); ++i) {
      const std::string& a = args[i];
      KDA_CHECK(a.size() > 2 && a.compare(0, 2, "--") == 0,
                "unexpected argument '{}' (options start with --; see --help)", a);
      std::string name = a.substr(2), value;
      const size_t eq = name.find('=');
      const bool inline_value = eq != std::string::npos;
      if (inline_value) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      }
      const OptionSpec* spec = name == "h" ? find_option("help") : find_option(name);
      KDA_CHECK(spec != nullptr, "unknown option --{} (see --help)", name);
      if (spec->takes_value && !inline_value) {
        KDA_CHECK(i + 1 < args.size(), "--{} needs a value", name);
        value = args[++i];
      }
      KDA_CHECK(spec->takes_value || !inline_value, "--{} takes no value", name);
      KDA_CHECK(values_.emplace(spec->name, value).second, "--{} given twice", name);
    }
  }

  bool has(const char* name) const { return values_.count(name) != 0; }
  bool any_of(Group g) const {
    for (const auto& [name, value] : values_) {
      if (find_option(name)->group == g) {
        return true;
      }
    }
    return false;
  }
  std::string first_of(Group g) const {
    for (const auto& [name, value] : values_) {
      if (find_option(name)->group == g) {
        return name;
      }
    }
    return "";
  }
  std::string str(const char* name) const { return values_.at(name); }
  int integer(const char* name, int fallback, int min, int max) const {
    if (!has(name)) {
      return fallback;
    }
    const std::string& s = values_.at(name);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    KDA_CHECK(used == s.size() && !s.empty(), "--{}: '{}' is not an integer", name, s);
    KDA_CHECK(v >= min && v <= max, "--{}: {} out of range [{}, {}]", name, v, min, max);
    return static_cast<int>(v);
  }
  float real(const char* name) const {
    const std::string& s = values_.at(name);
    size_t used = 0;
    float v = 0.0f;
    try {
      v = std::stof(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    KDA_CHECK(used == s.size() && !s.empty(), "--{}: '{}' is not a number", name, s);
    return v;
  }

 private:
  std::map<std::string, std::string> values_;
};

npy::Bf16Descr parse_bf16_descr(const Args& args) {
  if (!args.has("bf16-descr")) {
    return npy::Bf16Descr::kU2;
  }
  const std::string v = args.str("bf16-descr");
  if (v == "u2") {
    return npy::Bf16Descr::kU2;
  }
  if (v == "bfloat16") {
    return npy::Bf16Descr::kBfloat16;
  }
  KDA_FAIL("--bf16-descr: '{}' unsupported, expected u2 or bfloat16", v);
}

std::optional<RecordMode> parse_mode(const Args& args) {
  if (!args.has("mode")) {
    return std::nullopt;
  }
  return parse_record_mode(args.str("mode"), "--mode");
}

Device parse_device(const Args& args) {
  if (!args.has("device")) {
    const Platform p = detect_platform();
    return p.has_device ? Device::cuda(p.device) : Device::host();
  }
  const std::string v = args.str("device");
  if (v == "host" || v == "cpu") {
    return Device::host();
  }
  if (v == "cuda") {
    return Device::cuda(0);
  }
  if (v.compare(0, 5, "cuda:") == 0) {
    const std::string idx = v.substr(5);
    KDA_CHECK(!idx.empty() && idx.find_first_not_of("0123456789") == std::string::npos,
              "--device: '{}' unsupported, expected host, cuda or cuda:N", v);
    return Device::cuda(std::stoi(idx));
  }
  KDA_FAIL("--device: '{}' unsupported, expected host, cuda or cuda:N", v);
}

PathChoice parse_path(const Args& args) {
  if (!args.has("path")) {
    return PathChoice::kAuto;
  }
  const std::string v = args.str("path");
  if (v == "auto") {
    return PathChoice::kAuto;
  }
  if (v == "fused") {
    return PathChoice::kFused;
  }
  if (v == "unfused") {
    return PathChoice::kUnfused;
  }
  KDA_FAIL("--path: '{}' unsupported, expected auto, fused or unfused", v);
}

std::optional<Platform> parse_platform(const Args& args) {
  if (!args.has("pretend-platform")) {
    return std::nullopt;
  }
  const std::string v = args.str("pretend-platform");
  if (v == "sm90") {
    return fake_platform(9, 0);
  }
  if (v == "sm100") {
    return fake_platform(10, 0);
  }
  if (v == "other") {
    return fake_platform(8, 0);
  }
  KDA_FAIL("--pretend-platform: '{}' unsupported, expected sm90, sm100 or other", v);
}

Expect parse_expect(const Args& args) {
  if (!args.has("expect")) {
    return Expect::kBitwise;
  }
  const std::string v = args.str("expect");
  if (v == "bitwise") {
    return Expect::kBitwise;
  }
  if (v == "close") {
    return Expect::kClose;
  }
  KDA_FAIL("--expect: '{}' unsupported, expected bitwise or close", v);
}

bool same_dir(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path pa = fs::weakly_canonical(a, ec);
  const fs::path pb = fs::weakly_canonical(b, ec);
  return !ec && pa == pb;
}

int make_example_cmd(const Args& args, std::ostream& out) {
  KDA_CHECK(!args.any_of(Group::kReplay) && !args.any_of(Group::kCompare) && !args.has("out"),
            "--make-example takes only example options (--{} given); run the replay separately",
            args.has("out") ? std::string("out")
                            : (args.any_of(Group::kReplay) ? args.first_of(Group::kReplay)
                                                           : args.first_of(Group::kCompare)));
  ExampleOptions o;
  constexpr int kMaxDim = 1 << 16;
  o.B = args.integer("B", o.B, 1, kMaxDim);
  o.T = args.integer("T", o.T, 1, kMaxDim);
  o.H = args.integer("H", o.H, 1, kMaxDim);
  o.HV = args.integer("HV", o.HV, 1, kMaxDim);
  o.K = args.integer("K", o.K, 1, kMaxDim);
  o.V = args.integer("V", o.V, 1, kMaxDim);
  o.L = args.integer("L", o.L, 1, kMaxDim);
  o.T_max = args.integer("T-alloc", 0, 1, kMaxDim);
  o.extra_slots = args.integer("extra-slots", o.extra_slots, 0, kMaxDim);
  o.seed = static_cast<uint64_t>(args.integer("seed", 1, 0, 1 << 30));
  if (args.has("lower-bound")) {
    o.lower_bound = args.real("lower-bound");
  }
  if (args.has("conv-dtype")) {
    const std::string v = args.str("conv-dtype");
    KDA_CHECK(v == "f32" || v == "bf16", "--conv-dtype: '{}' unsupported, expected f32 or bf16", v);
    o.conv_bf16 = v == "bf16";
  }
  if (args.has("conv-layout")) {
    o.conv_layout = parse_conv_layout(args.str("conv-layout"), "--conv-layout");
  }
  o.bias = !args.has("no-bias");
  o.rows = !args.has("no-rows");
  o.accepted = !args.has("no-accepted");
  o.pad_request = args.has("pad-request");
  o.prefill = args.has("prefill");
  if (args.has("draft-shape")) {
    o.draft_shape = args.str("draft-shape");
  }
  o.mode = parse_mode(args);
  o.bf16 = parse_bf16_descr(args);
  const std::string dir = args.str("make-example");
  const Manifest m = make_example(dir, o);
  out << fmt::format("kda_replay: wrote example {} ({} tensors + {}):\n{}", dir, m.tensors.size(),
                     kManifestFile, manifest_to_json(m));
  return kExitOk;
}

int compare_cmd(const Args& args, const std::string& out_dir, std::ostream& out) {
  const Expect expect = parse_expect(args);
  const std::string ref = args.str("compare");
  const CompareReport report = compare_dirs(out_dir, ref, expect);
  print_report(report, out_dir, ref, expect, out);
  return report.ok() ? kExitOk : kExitCompareFailed;
}

void print_run(const ReplayProblem& p, const RunResult& r, const std::string& out_dir,
               std::ostream& out) {
  const Manifest& m = p.manifest;
  std::string pads;
  for (int n : p.padding_requests()) {
    pads += (pads.empty() ? "" : ", ") + std::to_string(n);
  }
  out << fmt::format("kda_replay: {} -> {} on {} (kernel set {}; platform {})\n", p.dir, out_dir,
                     r.device, r.kernel_set, r.platform.describe());
  out << fmt::format(
      "  problem: B={} T={} H={} HV={} K={} V={} D={} S={} R={} T_max={} L={}; {} gate; conv "
      "weight {}{}; conv layout {}; padding requests: {}\n",
      p.B, p.T, p.H, p.HV, p.K, p.V, p.D, p.S, p.R, p.T_max, p.L,
      m.lower_bound ? fmt::format("safe (lower_bound {})", *m.lower_bound) : "standard",
      p.wtype == ConvWeightType::kF32 ? "f32" : "bf16", p.has_bias ? " + bias" : ", no bias",
      conv_layout_name(m.conv_state_layout), pads.empty() ? "none" : pads);
  out << fmt::format("  mode {}; path {}{} (requested {}); dispatcher: {} [{}]\n",
                     record_mode_name(r.mode), verify_path_name(r.path),
                     r.path == VerifyPath::kFused ? fmt::format(", block_v {}", r.block_v) : "",
                     path_choice_name(r.requested), r.decision.describe(),
                     dispatch_reason_name(r.decision.reason));
  out << fmt::format("  verify {:.3f} ms", r.timings.verify_first_ms);
  if (r.timings.verify_calls > 1) {
    out << fmt::format(" (first call; mean of {} calls {:.3f} ms)", r.timings.verify_calls,
                       r.timings.verify_mean_ms);
  }
  if (r.committed) {
    out << fmt::format("; commit {:.3f} ms (accepted [{}], error flag {})", r.timings.commit_ms,
                       fmt::join(*p.accepted, ", "), r.commit_error_flag);
  } else {
    out << "; no accepted lengths: commit not run";
  }
  out << "\n  wrote:";
  for (const OutputTensor& o : r.outputs) {
    out << fmt::format(" {} {}{};", o.name, npy::npy_type_name(o.type),
                       npy::shape_to_string(o.shape));
  }
  out << " summary.json\n";
  if (r.commit_error_flag != 0) {
    out << "  WARNING: the commit skipped a request whose accepted length is outside [1, T]\n";
  }
}

int replay_cmd(const Args& args, std::ostream& out) {
  KDA_CHECK(args.has("out"), "--in needs --out DIR (where the outputs are written)");
  const std::string in_dir = args.str("in"), out_dir = args.str("out");
  KDA_CHECK(!same_dir(in_dir, out_dir),
            "--out {} is the input directory: outputs share the inputs' names (conv_state, "
            "ssm_state, rings), choose another directory",
            out_dir);
  RunOptions o;
  o.device = parse_device(args);
  o.path = parse_path(args);
  o.block_v = args.integer("block-v", 0, 0, 1 << 20);
  KDA_CHECK(o.block_v == 0 || kernels::is_fused_block_v(o.block_v),
            "--block-v: {} unsupported, expected one of {}", o.block_v,
            fmt::join(kernels::kFusedBlockVs, ", "));
  o.fused_ring_max_batch = args.integer("fused-ring-max-batch", 1, 0, 1 << 20);
  o.platform = parse_platform(args);
  o.repeat = args.integer("repeat", 1, 1, 1 << 20);
  const npy::Bf16Descr bf16 = parse_bf16_descr(args);

  const auto start = std::chrono::steady_clock::now();
  const ReplayProblem p = load_problem(in_dir, parse_mode(args));
  const double load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const RunResult r = run_replay(p, o);
  write_outputs(p, r, out_dir, bf16, load_ms);
  print_run(p, r, out_dir, out);
  return args.has("compare") ? compare_cmd(args, out_dir, out) : kExitOk;
}

}  // namespace

std::string replay_help_text() {
  std::string tensors;
  for (const TensorSpec& s : tensor_specs()) {
    tensors += fmt::format("    {:<12} {:<8} {:<14} {}\n", s.name,
                           s.required ? "required" : "optional", s.dtype, s.shape);
    if (*s.note != '\0') {
      tensors += fmt::format("{:<41}{}\n", "", s.note);
    }
  }
  return fmt::format(
      R"(kda_replay: replay one captured KDA verify step (one layer) through the module and
compare the results, bit for bit, with another run or with the engine's own tensors.

USAGE
  kda_replay --in DIR --out OUT [--device cuda|cuda:N|host] [--path auto|fused|unfused]
             [--mode ring|snapshot] [--block-v N] [--compare REF [--expect bitwise|close]]
  kda_replay --out OUT --compare REF [--expect bitwise|close]     compare existing outputs
  kda_replay --make-example DIR [--B 2 --T 4 --H 2 --HV 4 --K 64 --V 64 ...]
  kda_replay --help

REPLAY
  --in DIR          replay directory: manifest.json + .npy files (format below)
  --out OUT         output directory (created; must not be --in)
  --device D        host | cuda | cuda:N (default: cuda:0 if a CUDA device is usable, else host)
  --path P          auto (default): the dispatcher's choice (contract section 4) for the real
                    platform; fused | unfused: force that path (the dispatcher's choice is still
                    reported)
  --mode M          ring | snapshot (default: the manifest's "mode", else ring)
  --block-v N       fused V tile: {} (default: the dispatcher's tile for this call)
  --fused-ring-max-batch N   the dispatcher's --kda-fused-ring-max-batch (default 1)
  --pretend-platform P       sm90 | sm100 | other: dispatch as if on that platform
  --repeat N        run verify N times (timing only: verify never writes the committed state,
                    so every call gives the same outputs)
  --bf16-descr D    how bf16 outputs are written: u2 (default: '<u2', bf16 bit patterns as
                    uint16; loads anywhere) or bfloat16 (descr 'bfloat16', for ml_dtypes)
  Runs verify, then commit if the directory has accepted lengths, and writes to OUT:
    output.npy       bf16 [N, HV, V]          token t of request n is row n*T + t
    conv_window.npy  bf16 [R, T_max, W-1, D] (or [R, T_max, D, W-1], conv_window_layout)
    ring mode:       ring_rawv.npy ring_rawk.npy ring_g.npy ring_beta.npy  (whole rings)
    snapshot mode:   snapshots.npy f32 [R, T_max, HV, V, K]
    with accepted:   ssm_state.npy f32 [S, HV, V, K], conv_state.npy bf16 [S, W-1, D] (or
                     [S, D, W-1]): the committed state
    summary.json     path taken, the dispatcher's decision and reason, shapes, timings (ms)
  Every output buffer is written whole: regions verify does not write keep the pre-filled
  contents from DIR (or zeros), so a capture taken before and after the engine's verify
  compares in full.

COMPARE
  --compare REF     compare every OUT/<name>.npy with REF/<name>.npy (after the replay, or
                    alone with --out). Per tensor: "bitwise equal", or the number of differing
                    elements, max abs diff, max ulp diff, rel L2 and the first differing index.
                    Tensors missing in REF are listed as skipped.
  --expect E        bitwise (default): contract section 3 - outputs, ring records, conv windows,
                    snapshots and the committed state are bitwise equal across paths, tiles and
                    batch compositions (and with SGLang's kernels on sm_90);
                    close: the contract's GPU-vs-host tolerances, relative L2 <= {:g} (bf16) and
                    <= {:g} (f32): use it to compare a CUDA run with a host run.
  Exit status: 0 ok; 1 a bitwise-contract tensor differs (beyond tolerance with close) or its
  dtype/shape mismatch; 2 usage or input error.

MAKE EXAMPLE
  --make-example DIR  write a replay directory of seeded random data (contract section 6 input
                    scales) with the options: --B --T --H --HV --K --V (default 2 4 2 4 64 64)
                    --L 16  --T-alloc N  --extra-slots 2 (S = B + 2)  --seed 1
                    --lower-bound X (safe gate; default standard)  --conv-dtype f32|bf16
                    --conv-layout SWD|SDW  --mode ring|snapshot  --bf16-descr u2|bfloat16
                    --no-bias  --no-rows  --no-accepted
                    --pad-request (request 1 is a padding request: slot -1, NaN inputs)
                    --draft-shape chain|ragged|tree (contract section 8: ragged lengths
                    T - n % T, query_start_loc; a breadth-first binary tree, parents and
                    accepted_paths)
                    --prefill (garbage conv_window, snapshots and rings templates)

MANIFEST (DIR/manifest.json)
  One layer's verify step. Letters as in contract section 2: D = 2*H*K + HV*V, N = B*T, W = 4,
  S = slots (ssm_state dim 0), R = scratch rows, L = ring length.
    "format"             "{}" (optional)
    "comment"            free text (optional; keys starting with '_' are ignored too)
    "B" "T" "H" "HV" "K" "V"   required integers
    "lower_bound"        required: null = standard gate, a number (e.g. -5) = safe gate
    "L"                  ring length (optional: the ring files' dim 2, else 16)
    "T_max"            scratch step pitch (optional: conv_window/snapshots dim 1, else T)
    "R"                  scratch rows (optional: conv_window/snapshots dim 0, else
                         max(B, max(rows of real requests) + 1))
    "mode"               "ring" | "snapshot": default of --mode (optional)
    "conv_state_layout"  "SWD" (default): [S, W-1, D] as contract section 2, or "SDW": SGLang's
                         transposed view [S, D, W-1] (conv.transpose(-1, -2).contiguous());
                         converted on load, and conv_state.npy is written back the same way
    "conv_window_layout" the same for conv_window ([R, T_max, W-1, D] | [R, T_max, D, W-1]);
                         default: conv_state_layout
    "tensors"            {{"name": "file.npy", ...}} (files relative to DIR), or ["name", ...]
                         meaning name.npy
  Tensors (C order; dtype and shape are checked, errors name the file):
{}  Files: numpy .npy v1.0/2.0/3.0, little-endian, fortran_order False; dtypes '<f4' (f32),
  '<i4' (i32), bf16 as '<u2' bit patterns, '<V2' (ml_dtypes) or 'bfloat16'.
  Padding requests (slot -1): their inputs may be anything (NaN), their rows are not read.

  Example (kda_replay --make-example DIR --B 2 --T 4):
    {{
      "format": "{}",
      "B": 2, "T": 4, "H": 2, "HV": 4, "K": 64, "V": 64,
      "lower_bound": null,
      "L": 16,
      "R": 3,
      "conv_state_layout": "SWD",
      "tensors": {{
        "mixed_qkv": "mixed_qkv.npy", "a": "a.npy", "b": "b.npy",
        "A_log": "A_log.npy", "dt_bias": "dt_bias.npy",
        "conv_weight": "conv_weight.npy", "conv_bias": "conv_bias.npy",
        "conv_state": "conv_state.npy", "ssm_state": "ssm_state.npy",
        "slots": "slots.npy", "rows": "rows.npy", "accepted": "accepted.npy"
      }}
    }}

  Capturing from an engine: save the inputs (and, optionally, the scratch and ring buffers as
  templates) just before one layer's verify call; save the engine's results after it (and
  after the commit for ssm_state / conv_state) under the output names above (output.npy,
  conv_window.npy, ring_*.npy | snapshots.npy, ssm_state.npy, conv_state.npy) into REF, then
  kda_replay --in DIR --out OUT --device cuda --compare REF. From PyTorch:
    def save(name, t):
        t = t.detach().contiguous().cpu()
        a = t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 \
            else t.numpy()
        np.save(f"{{d}}/{{name}}.npy", a)
  Loading a bf16 output:
    torch.from_numpy(np.load("output.npy").view(np.int16)).view(torch.bfloat16)
)",
      fmt::join(kernels::kFusedBlockVs, " "), kBf16RelTol, kF32RelTol, kManifestFormat, tensors,
      kManifestFormat);
}

int run_cli(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  try {
    const Args args(argv);
    if (args.has("help") || argv.empty()) {
      out << replay_help_text();
      return argv.empty() ? kExitError : kExitOk;
    }
    if (args.has("make-example")) {
      return make_example_cmd(args, out);
    }
    KDA_CHECK(!args.any_of(Group::kExample), "--{} is a --make-example option (see --help)",
              args.first_of(Group::kExample));
    if (args.has("in")) {
      return replay_cmd(args, out);
    }
    KDA_CHECK(!args.any_of(Group::kReplay), "--{} needs --in DIR (see --help)",
              args.first_of(Group::kReplay));
    KDA_CHECK(args.has("compare") && args.has("out"),
              "nothing to do: give --in DIR --out OUT, --out OUT --compare REF, or "
              "--make-example DIR (see --help)");
    return compare_cmd(args, args.str("out"), out);
  } catch (const Error& e) {
    err << "kda_replay: error: " << e.message() << "\n";
    return kExitError;
  } catch (const std::exception& e) {
    err << "kda_replay: error: " << e.what() << "\n";
    return kExitError;
  }
}

}  // namespace kda::replay
