#include "tools/demo/demo_args.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <utility>
#include <vector>

#include "core/error.h"
#include "tools/demo/demo_model.h"

namespace kda::demo {

namespace {

[[noreturn]] void reject(const std::string& flag, const std::string& value,
                         const std::string& expected) {
  throw UsageError(fmt::format("{}: invalid value '{}' (expected {})", flag, value, expected));
}

int int_in(const std::string& flag, const std::string& value, int lo, int hi) {
  int v = 0;
  const char* end = value.data() + value.size();
  const auto [ptr, ec] = std::from_chars(value.data(), end, v);
  if (value.empty() || ec != std::errc() || ptr != end || v < lo || v > hi) {
    reject(flag, value, fmt::format("an integer in [{}, {}]", lo, hi));
  }
  return v;
}

bool on_off(const std::string& flag, const std::string& value) {
  if (value.empty() || value == "on" || value == "true" || value == "1") {
    return true;
  }
  if (value == "off" || value == "false" || value == "0") {
    return false;
  }
  reject(flag, value, "no value, or =on|off, =true|false, =1|0");
}

// The value of `flag` among named choices; the error lists them ("a, b or c").
template <typename E>
E pick(const std::string& flag, const std::string& value,
       std::initializer_list<std::pair<const char*, E>> choices) {
  std::string names;
  size_t i = 0;
  for (const auto& [name, e] : choices) {
    if (value == name) {
      return e;
    }
    if (i > 0) {
      names += i + 1 == choices.size() ? " or " : ", ";
    }
    names += name;
    ++i;
  }
  reject(flag, value, names);
}

// One demo flag: `arg` is the value's name in --help (nullptr: a switch, `=on|off` allowed).
struct DemoFlag {
  const char* name;
  const char* arg;
  const char* help;
  void (*apply)(DemoArgs& a, const std::string& flag, const std::string& value);
};

const DemoFlag kDemoFlags[] = {
    {"--preset", "NAME",
     "model shape preset: kimi-linear (default) or k3-tp8; the shape flags "
     "below override its fields",
     [](DemoArgs& a, const std::string& f, const std::string& v) {
       if (find_preset(v) == nullptr) {
         reject(f, v, preset_names());
       }
       a.preset = v;
     }},
    {"--layers", "N", "KDA layers, 1..1024 (default: the preset's on CUDA, 2 on the host)",
     [](DemoArgs& a, const std::string& f, const std::string& v) {
       a.layers = int_in(f, v, 1, 1024);
     }},
    {"--heads", "N", "q/k heads H, 1..1024 (also sets HV unless --hv-heads is given)",
     [](DemoArgs& a, const std::string& f, const std::string& v) {
       a.heads = int_in(f, v, 1, 1024);
     }},
    {"--hv-heads", "N", "v heads HV, 1..1024, a multiple of H",
     [](DemoArgs& a, const std::string& f, const std::string& v) {
       a.hv_heads = int_in(f, v, 1, 1024);
     }},
    {"--head-k-dim", "N", "head_k_dim K: 64 or 128",
     [](DemoArgs& a, const std::string& f, const std::string& v) {
       a.head_k_dim = pick<int>(f, v, {{"64", 64}, {"128", 128}});
     }},
    {"--head-v-dim", "N", "head_v_dim V, 1..1024",
     [](DemoArgs& a, const std::string& f, const std::string& v) {
       a.head_v_dim = int_in(f, v, 1, 1024);
     }},
    {"--lower-bound", "X|none",
     "safe gate with lower bound X (finite, < 0; Kimi-K3: -5); none = "
     "standard gate",
     [](DemoArgs& a, const std::string& f, const std::string& v) {
       if (v == "none") {
         a.gate = GateKind::kStandard;
         return;
       }
       char* end = nullptr;
       errno = 0;
       const float x = std::strtof(v.c_str(), &end);
       if (v.empty() || errno != 0 || *end != '\0' || !std::isfinite(x) || x >= 0.0f) {
         reject(f, v, "a finite number < 0, or none");
       }
       a.gate = GateKind::kSafe;
       a.lower_bound = x;
     }},
    {"--conv-weight", "f32|bf16", "conv weight (and bias) dtype",
     [](DemoArgs& a, const std::string& f, const std::string& v) {
       a.conv_weight = pick<ConvWeightType>(
           f, v, {{"f32", ConvWeightType::kF32}, {"bf16", ConvWeightType::kBF16}});
     }},
    {"--conv-bias", nullptr, "the conv has a bias (=off: none)",
     [](DemoArgs& a, const std::string& f, const std::string& v) { a.conv_bias = on_off(f, v); }},
    {"--requests", "N", "requests in the batch, 1..4096 (default 16 on CUDA, 4 on the host)",
     [](DemoArgs& a, const std::string& f, const std::string& v) {
       a.requests = int_in(f, v, 1, 4096);
     }},
    {"--prompt-len", "N",
     "prompt tokens prefilled per request through extend, 0..65536 (default "
     "64 on CUDA, 32 on the host)",
     [](DemoArgs& a, const std::string& f, const std::string& v) {
       a.prompt_len = int_in(f, v, 0, 65536);
     }},
    {"--rounds", "N", "verify -> commit rounds, 1..1000000 (default 32 on CUDA, 16 on the host)",
     [](DemoArgs& a, const std::string& f, const std::string& v) {
       a.rounds = int_in(f, v, 1, 1000000);
     }},
    {"--accept", "DIST",
     "accepted length per request and round: uniform (1..T), geometric:P (each "
     "draft token accepted with probability P until the first rejection), all (T) or one (1); "
     "default geometric:0.7",
     [](DemoArgs& a, const std::string& f, const std::string& v) {
       if (!parse_accept_spec(v, a.accept)) {
         reject(f, v, "uniform, geometric:P with P in [0, 1], all or one");
       }
     }},
    {"--draft-shape", "SHAPE",
     "the rounds' drafts (contract §8): chain (T tokens per request), ragged (each request a "
     "seeded T_n in 1..T, packed rows) or tree (a seeded tree of T nodes per request, at most "
     "--speculative-eagle-topk children per node, committed along a seeded root path whose "
     "length follows --accept); default chain",
     [](DemoArgs& a, const std::string& f, const std::string& v) {
       if (!parse_draft_shape(v, a.draft_shape)) {
         reject(f, v, "chain, ragged or tree");
       }
     }},
    {"--seed", "N", "seed of the weights, inputs and acceptance draws (default 1)",
     [](DemoArgs& a, const std::string& f, const std::string& v) {
       const char* end = v.data() + v.size();
       const auto [ptr, ec] = std::from_chars(v.data(), end, a.seed);
       if (v.empty() || ec != std::errc() || ptr != end) {
         reject(f, v, "an unsigned 64-bit integer");
       }
     }},
    {"--prefix-cache", nullptr,
     "prefix caching (contract §9): requests come in groups of G = --prefix-group (request m "
     "in group m / G) sharing their first --prefix-len prompt tokens. The group leaders prefill "
     "their whole prompt and track the state after the shared prefix into a cache slot "
     "(ExtendTrack); the others start from copy_slot of it and extend only their own suffix. "
     "Every round's commit tracks (CommitTrack) the step at which a request's committed length "
     "reaches a multiple of --track-interval, each into a fresh slot. The check then "
     "recomputes every tracked, copied and final state from scratch (extend only) and compares "
     "them bitwise. Needs --prompt-len >= 1",
     [](DemoArgs& a, const std::string& f, const std::string& v) {
       a.prefix_cache = on_off(f, v);
     }},
    {"--prefix-len", "N",
     "--prefix-cache: shared prompt tokens per group, 1..65536, at most --prompt-len (default "
     "half the prompt, at least 1)",
     [](DemoArgs& a, const std::string& f, const std::string& v) {
       a.prefix_len = int_in(f, v, 1, 65536);
     }},
    {"--prefix-group", "N", "--prefix-cache: requests per group, 1..4096 (default 2)",
     [](DemoArgs& a, const std::string& f, const std::string& v) {
       a.prefix_group = int_in(f, v, 1, 4096);
     }},
    {"--track-interval", "N",
     "--prefix-cache: decode rounds track the state at committed lengths that are multiples of "
     "N, 1..1000000 (default 16)",
     [](DemoArgs& a, const std::string& f, const std::string& v) {
       a.track_interval = int_in(f, v, 1, 1000000);
     }},
    {"--device", "host|cuda|cuda:N|auto",
     "where the backend runs; auto (default): CUDA when "
     "detect_platform() finds a device, else the host implementation",
     [](DemoArgs& a, const std::string& f, const std::string& v) {
       if (v == "auto" || v == "host" || v == "cuda") {
         a.device = v == "auto" ? DeviceChoice::kAuto
                                : (v == "host" ? DeviceChoice::kHost : DeviceChoice::kCuda);
         a.cuda_index = 0;
         return;
       }
       if (v.rfind("cuda:", 0) != 0) {
         reject(f, v, "host, cuda, cuda:N or auto");
       }
       a.device = DeviceChoice::kCuda;
       a.cuda_index = int_in(f, v.substr(5), 0, 1023);
     }},
    {"--platform", "detect|sm90|sm100|other",
     "the platform the dispatcher is told (default detect; "
     "the others pretend an architecture, e.g. to see the ring-mode gate on the host)",
     [](DemoArgs& a, const std::string& f, const std::string& v) {
       a.platform = pick<PlatformChoice>(f, v,
                                         {{"detect", PlatformChoice::kDetect},
                                          {"sm90", PlatformChoice::kSM90},
                                          {"sm100", PlatformChoice::kSM100},
                                          {"other", PlatformChoice::kOther}});
     }},
    {"--cuda-graph", nullptr,
     "CUDA: capture the first round's input generation and verify of every layer into one CUDA "
     "graph and replay it every round (prepare, record_graph_verify_round, replay, then the "
     "accepted-lengths upload and commit eagerly, as the backend's graph protocol has it). The "
     "demo's batch (B, T, slots) is the same every round, so one capture serves the run; a batch "
     "of another shape would need its own capture. Per-layer verify times are then not "
     "separated. Default on with a CUDA device; =off: eager launches with a time mark around "
     "every call. Not on the host (its kernels run synchronously)",
     [](DemoArgs& a, const std::string& f, const std::string& v) { a.cuda_graph = on_off(f, v); }},
    {"--check", "auto|off|mode|host|both",
     "correctness check of the final states: mode = an "
     "independent backend on the same device in the other record mode (bitwise), host = the host "
     "implementation (CUDA runs; relative L2 <= 1e-4); auto (default): mode on the host, both on "
     "CUDA",
     [](DemoArgs& a, const std::string& f, const std::string& v) {
       a.check = pick<CheckChoice>(f, v,
                                   {{"auto", CheckChoice::kAuto},
                                    {"off", CheckChoice::kOff},
                                    {"mode", CheckChoice::kMode},
                                    {"host", CheckChoice::kHost},
                                    {"both", CheckChoice::kBoth}});
     }},
    {"--check-host-layers", "N",
     "layers of the host check run of a CUDA run, 0..1024 (0 = all; "
     "default 2: the host is slow)",
     [](DemoArgs& a, const std::string& f, const std::string& v) {
       a.check_host_layers = int_in(f, v, 0, 1024);
     }},
    {"--check-host-requests", "N",
     "requests of the host check run of a CUDA run, 0..4096 (0 = "
     "all; default 2)",
     [](DemoArgs& a, const std::string& f, const std::string& v) {
       a.check_host_requests = int_in(f, v, 0, 4096);
     }},
    {"--quiet", nullptr, "no per-round progress lines on stderr",
     [](DemoArgs& a, const std::string& f, const std::string& v) { a.quiet = on_off(f, v); }},
    {"--log-level", "LEVEL",
     "the module's log level: trace|debug|info|warn|error|critical|off "
     "(default warn; info shows the pool and backend set-up, debug every dispatch change)",
     [](DemoArgs& a, const std::string& f, const std::string& v) {
       a.log_level = pick<const char*>(f, v,
                                       {{"trace", "trace"},
                                        {"debug", "debug"},
                                        {"info", "info"},
                                        {"warn", "warn"},
                                        {"error", "error"},
                                        {"critical", "critical"},
                                        {"off", "off"}});
     }},
};

const DemoFlag* find_demo_flag(const std::string& name) {
  for (const DemoFlag& f : kDemoFlags) {
    if (name == f.name) {
      return &f;
    }
  }
  return nullptr;
}

bool is_help(const std::string& arg) { return arg == "--help" || arg == "-h"; }

// "  head   text..." with the text word-wrapped at kHelpWidth, continuation lines aligned.
constexpr size_t kHelpWidth = 100;
constexpr size_t kHelpIndent = 43;  // as engine_flags_help(): "  {:<40} "
std::string help_entry(const std::string& head, const std::string& text) {
  std::string out = fmt::format("  {:<{}} ", head, kHelpIndent - 3);
  if (out.size() > kHelpIndent) {
    out += "\n" + std::string(kHelpIndent, ' ');
  }
  size_t col = kHelpIndent;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(' ', pos);
    end = end == std::string::npos ? text.size() : end;
    const std::string word = text.substr(pos, end - pos);
    if (col > kHelpIndent && col + 1 + word.size() > kHelpWidth) {
      out += "\n" + std::string(kHelpIndent, ' ');
      col = kHelpIndent;
    } else if (col > kHelpIndent) {
      out += ' ';
      ++col;
    }
    out += word;
    col += word.size();
    pos = end + 1;
  }
  return out + "\n";
}

}  // namespace

const char* check_choice_name(CheckChoice c) {
  switch (c) {
    case CheckChoice::kAuto:
      return "auto";
    case CheckChoice::kOff:
      return "off";
    case CheckChoice::kMode:
      return "mode";
    case CheckChoice::kHost:
      return "host";
    case CheckChoice::kBoth:
      return "both";
  }
  return "?";
}

DemoArgs parse_demo_args(int argc, char** argv) {
  DemoArgs a;
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    args.emplace_back(argv[i] != nullptr ? argv[i] : "");
  }
  for (const std::string& arg : args) {
    if (arg == "--") {
      break;
    }
    if (is_help(arg)) {
      a.help = true;
      return a;
    }
    if (arg == "--max-running-requests" || arg.rfind("--max-running-requests=", 0) == 0) {
      a.max_running_requests_given = true;
    }
  }
  // Engine flags first, through the backend's parser; it leaves everything else in order.
  try {
    a.flags = parse_engine_flags(args);
  } catch (const Error& e) {
    throw UsageError(e.message());
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      if (i + 1 < args.size()) {
        throw UsageError(fmt::format("unexpected argument '{}' after '--'", args[i + 1]));
      }
      break;
    }
    if (arg.rfind("--", 0) != 0) {
      throw UsageError(fmt::format("unexpected argument '{}' (flags start with --)", arg));
    }
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const DemoFlag* f = find_demo_flag(name);
    if (f == nullptr) {
      throw UsageError(fmt::format("unknown flag '{}'", name));
    }
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (f->arg != nullptr) {
      // A following "--flag" is the next flag, not this one's value (negative numbers pass).
      if (i + 1 >= args.size() || args[i + 1].rfind("--", 0) == 0) {
        throw UsageError(fmt::format("{}: missing value (expected {})", name, f->arg));
      }
      value = args[++i];
    }
    f->apply(a, name, value);
  }
  return a;
}

PrefixSpec resolve_prefix(const DemoArgs& args, int prompt_len) {
  PrefixSpec s;
  if (!args.prefix_cache) {
    const char* stray = args.prefix_len       ? "--prefix-len"
                        : args.prefix_group   ? "--prefix-group"
                        : args.track_interval ? "--track-interval"
                                              : nullptr;
    if (stray != nullptr) {
      throw UsageError(fmt::format("{}: needs --prefix-cache", stray));
    }
    return s;
  }
  if (prompt_len < 1) {
    throw UsageError("--prefix-cache: needs --prompt-len >= 1 (the groups share a prompt prefix)");
  }
  s.enabled = true;
  s.shared_len = args.prefix_len.value_or(std::max(1, prompt_len / 2));
  if (s.shared_len > prompt_len) {
    throw UsageError(
        fmt::format("--prefix-len {} exceeds --prompt-len {}", s.shared_len, prompt_len));
  }
  s.group_size = args.prefix_group.value_or(s.group_size);
  s.track_interval = args.track_interval.value_or(s.track_interval);
  return s;
}

ModelConfig resolve_model(const DemoArgs& args, int default_layers) {
  const ModelPreset* preset = find_preset(args.preset);
  if (preset == nullptr) {
    throw UsageError(
        fmt::format("--preset: invalid value '{}' (expected {})", args.preset, preset_names()));
  }
  ModelConfig m = preset->config;
  m.num_layers = args.layers.value_or(default_layers);
  if (args.heads) {
    m.H = *args.heads;
    m.HV = *args.heads;
  }
  m.HV = args.hv_heads.value_or(m.HV);
  m.K = args.head_k_dim.value_or(m.K);
  m.V = args.head_v_dim.value_or(m.V);
  if (args.gate) {
    m.gate = *args.gate;
    m.lower_bound = m.gate == GateKind::kSafe ? args.lower_bound : 0.0f;
  }
  m.conv_weight_type = args.conv_weight.value_or(m.conv_weight_type);
  m.has_conv_bias = args.conv_bias.value_or(m.has_conv_bias);
  if (m.HV % m.H != 0) {
    throw UsageError(
        fmt::format("--hv-heads: invalid value '{}' (expected a multiple of H = {})", m.HV, m.H));
  }
  try {
    m.validate();
  } catch (const Error& e) {
    throw UsageError(fmt::format("model shape: {}", e.message()));
  }
  return m;
}

std::string demo_help(const std::string& program) {
  std::string s = fmt::format(
      "usage: {} [flags]\n"
      "\n"
      "End-to-end speculative decoding through the KDA verify backend, the way an engine drives\n"
      "it: seeded random weights, a batch of requests each with a state slot, prompt prefill\n"
      "through extend, then rounds of verify (every layer) -> simulated acceptance -> commit\n"
      "(--prefix-cache: shared prompt prefixes through copy_slot, and tracked states).\n"
      "Prints progress per round on stderr and a summary (accepted tokens, latency, dispatch\n"
      "decisions, pool memory) followed by a correctness check of every committed state against\n"
      "an independent run. Exit code: 0 check passed, 1 check failed or runtime error, 2 bad\n"
      "command line.\n"
      "\n"
      "Demo flags (`--flag value` or `--flag=value`):\n",
      program);
  for (const DemoFlag& f : kDemoFlags) {
    const std::string head = f.arg != nullptr ? fmt::format("{} {}", f.name, f.arg) : f.name;
    s += help_entry(head, f.help);
  }
  s += help_entry("--help, -h", "this text");
  s += "\n";
  s += engine_flags_help();
  s += "  (the demo defaults --max-running-requests to --requests, so the pool holds exactly the\n"
       "  batch; ring mode is off unless --enable-linear-replayssm-spec is given)\n";
  return s;
}

}  // namespace kda::demo
