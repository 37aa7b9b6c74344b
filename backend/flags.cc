#include "backend/flags.h"

#include <fmt/format.h>

#include <charconv>
#include <string_view>

#include "core/error.h"
#include "kernels/kda_kernels.h"

namespace kda {

namespace {

enum class FlagKind {
  kInt,         // an integer in [lo, hi]
  kPowerOfTwo,  // a power of two in [lo, hi]
  kBool,        // on|off, true|false, 1|0 (value required)
  kSwitch,      // bare = true; `=value` like kBool
  kBlockV,      // auto|0 or one of kernels::kFusedBlockVs
  kChoice,      // one of FlagSpec::choices, stored as its index (an enum's value)
};

// The names of the kChoice flags' values, indexed by the enum value each stands for.
constexpr const char* kDeferredCommitNames[] = {"auto", "on", "off", "lazy"};  // DeferredCommit
constexpr const char* kVerifyNumericsNames[] = {"auto", "exact", "fast"};      // NumericsRequest

struct FlagSpec {
  const char* name;
  FlagKind kind;
  int lo, hi;                     // integer kinds
  int EngineFlags::*int_field;    // integer kinds
  bool EngineFlags::*bool_field;  // kBool, kSwitch
  const char* arg;                // for the help text
  const char* help;
  const char* const* choices;  // kChoice: the value names, index lo..hi
};

constexpr FlagSpec kFlags[] = {
    {"--speculative-num-draft-tokens", FlagKind::kInt, 1, 16, &EngineFlags::num_draft_tokens,
     nullptr, "N", "draft tokens per verify (T)", nullptr},
    {"--enable-linear-replayssm-spec", FlagKind::kSwitch, 0, 0, nullptr,
     &EngineFlags::replayssm_spec, "",
     "ReplaySSM ring mode (rollback by replay); off: fp32 snapshot mode", nullptr},
    {"--linear-replayssm-cache-len", FlagKind::kPowerOfTwo, 2, 256,
     &EngineFlags::replayssm_cache_len, nullptr, "N",
     "ring length L; ring mode needs L >= 2 * draft tokens", nullptr},
    {"--max-running-requests", FlagKind::kInt, 1, 4096, &EngineFlags::max_running_requests, nullptr,
     "N", "concurrent requests: state slots and verify scratch rows", nullptr},
    {"--kda-fused-verify", FlagKind::kBool, 0, 0, nullptr, &EngineFlags::fused_verify, "on|off",
     "allow the fused verify kernel", nullptr},
    {"--kda-fused-ring-max-batch", FlagKind::kInt, 0, 4096, &EngineFlags::fused_ring_max_batch,
     nullptr, "N", "largest batch that takes the fused kernel in ring mode (SM90/SM100)", nullptr},
    {"--kda-verify-block-v", FlagKind::kBlockV, 0, 0, &EngineFlags::verify_block_v, nullptr,
     "auto|N", "fused verify V tile", nullptr},
    {"--kda-deferred-commit", FlagKind::kChoice, 0, 3, &EngineFlags::deferred_commit, nullptr,
     "auto|on|off|lazy",
     "ring mode: fold the accepted steps inside the next verify (auto: lazy or deferred where the "
     "step benchmark measured it faster on the nearest measured card, dispatch/lazy_policy.h, "
     "dispatch/commit_policy.h); "
     "lazy: verifies fold nothing (fast outputs over the pending steps), the commit folds when "
     "the ring is full (L <= 16)",
     kDeferredCommitNames},
    {"--kda-lazy-fold-interval", FlagKind::kInt, 0, 16, &EngineFlags::lazy_fold_interval, nullptr,
     "N",
     "with --kda-deferred-commit lazy: also fold a slot once it holds N pending steps (0: only "
     "when the ring is full)",
     nullptr},
    {"--kda-verify-numerics", FlagKind::kChoice, 0, 2, &EngineFlags::verify_numerics, nullptr,
     "exact|fast|auto",
     "verify outputs: exact, or fast (tensor cores; ring-mode chains on the fused path without a "
     "fold of u records, else exact; auto: where the step benchmark measured fast faster on the "
     "nearest measured card, dispatch/numerics_policy.h; a deferred commit u-free and fast where "
     "its fast step measured faster at the configured batch, dispatch/lazy_policy.h)",
     kVerifyNumericsNames},
    {"--speculative-eagle-topk", FlagKind::kInt, 1, 16, &EngineFlags::eagle_topk, nullptr, "N",
     "children per draft-tree node (1: chains; > 1: tree drafts, at most 8 nodes per request)",
     nullptr},
};

std::string block_v_list() {
  std::string s;
  for (int bv : kernels::kFusedBlockVs) {
    s += s.empty() ? std::to_string(bv) : ", " + std::to_string(bv);
  }
  return s;
}

// What the flag accepts, as printed in errors and help.
std::string allowed(const FlagSpec& f) {
  switch (f.kind) {
    case FlagKind::kInt:
      return fmt::format("an integer in [{}, {}]", f.lo, f.hi);
    case FlagKind::kPowerOfTwo:
      return fmt::format("a power of two in [{}, {}]", f.lo, f.hi);
    case FlagKind::kBool:
      return "on|off, true|false or 1|0";
    case FlagKind::kSwitch:
      return "no value, or =on|off, =true|false, =1|0";
    case FlagKind::kBlockV:
      return fmt::format("auto (or 0) or one of {}", block_v_list());
    case FlagKind::kChoice: {
      std::string s;
      for (int i = f.lo; i <= f.hi; ++i) {
        s += i == f.lo ? "" : i == f.hi ? " or " : ", ";
        s += f.choices[i];
      }
      return s;
    }
  }
  return "?";
}

std::string default_text(const FlagSpec& f) {
  const EngineFlags defaults;
  if (f.bool_field != nullptr) {
    return (defaults.*f.bool_field) ? "on" : "off";
  }
  if (f.kind == FlagKind::kChoice) {
    return f.choices[defaults.*f.int_field];
  }
  if (f.kind == FlagKind::kBlockV && defaults.*f.int_field == 0) {
    return std::string("auto: per call, by grid and T (kernels/tile_policy.h)");
  }
  return std::to_string(defaults.*f.int_field);
}

[[noreturn]] void reject(const FlagSpec& f, std::string_view value) {
  KDA_FAIL("{}: invalid value '{}' (expected {})", f.name, value, allowed(f));
}

bool parse_int(std::string_view text, int& out) {
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc() && ptr == end && !text.empty();
}

bool parse_bool(std::string_view text, bool& out) {
  if (text == "on" || text == "true" || text == "1") {
    out = true;
    return true;
  }
  if (text == "off" || text == "false" || text == "0") {
    out = false;
    return true;
  }
  return false;
}

bool int_in_range(const FlagSpec& f, int v) {
  switch (f.kind) {
    case FlagKind::kInt:
      return v >= f.lo && v <= f.hi;
    case FlagKind::kPowerOfTwo:
      return v >= f.lo && v <= f.hi && (v & (v - 1)) == 0;
    case FlagKind::kBlockV:
      return v == 0 || kernels::is_fused_block_v(v);
    case FlagKind::kChoice:
      return v >= f.lo && v <= f.hi;
    case FlagKind::kBool:
    case FlagKind::kSwitch:
      return true;
  }
  return false;
}

void apply(const FlagSpec& f, std::string_view value, EngineFlags& flags) {
  if (f.bool_field != nullptr) {
    bool b = false;
    if (!parse_bool(value, b)) {
      reject(f, value);
    }
    flags.*f.bool_field = b;
    return;
  }
  int v = 0;
  if (f.kind == FlagKind::kChoice) {
    v = f.lo;
    while (v <= f.hi && value != f.choices[v]) {
      ++v;
    }
    if (v > f.hi) {
      reject(f, value);
    }
  } else if (f.kind == FlagKind::kBlockV && value == "auto") {
    v = 0;
  } else if (!parse_int(value, v) || !int_in_range(f, v)) {
    reject(f, value);
  }
  flags.*f.int_field = v;
}

const FlagSpec* find_flag(std::string_view name) {
  for (const FlagSpec& f : kFlags) {
    if (name == f.name) {
      return &f;
    }
  }
  return nullptr;
}

// Parses args[first..] into `flags`; returns, per argument, whether it was consumed.
std::vector<bool> parse_into(const std::vector<std::string_view>& args, size_t first,
                             EngineFlags& flags) {
  std::vector<bool> consumed(args.size(), false);
  for (size_t i = first; i < args.size(); ++i) {
    const std::string_view arg = args[i];
    if (arg == "--") {
      break;  // the engine's own "end of options": leave the rest alone
    }
    const size_t eq = arg.find('=');
    const FlagSpec* f = find_flag(arg.substr(0, eq));
    if (f == nullptr) {
      continue;
    }
    consumed[i] = true;
    if (eq != std::string_view::npos) {
      apply(*f, arg.substr(eq + 1), flags);
    } else if (f->kind == FlagKind::kSwitch) {
      flags.*f->bool_field = true;
    } else {
      // A following "--option" is the next flag, not this one's value.
      KDA_CHECK(i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0,
                "{}: missing value (expected {})", f->name, allowed(*f));
      consumed[++i] = true;
      apply(*f, args[i], flags);
    }
  }
  flags.validate();
  return consumed;
}

}  // namespace

void EngineFlags::validate() const {
  for (const FlagSpec& f : kFlags) {
    if (f.int_field != nullptr && !int_in_range(f, this->*f.int_field)) {
      reject(f, std::to_string(this->*f.int_field));
    }
  }
  // Verify writes ring steps 0..T-1; the pool keeps upstream's 2x early-flush margin.
  KDA_CHECK(!replayssm_spec || replayssm_cache_len >= 2 * num_draft_tokens,
            "--linear-replayssm-cache-len: invalid value '{}' for "
            "--speculative-num-draft-tokens {} with --enable-linear-replayssm-spec (expected a "
            "power of two >= 2 * {} = {})",
            replayssm_cache_len, num_draft_tokens, num_draft_tokens, 2 * num_draft_tokens);
  // A tree's recurrence replays a node's ancestors from one chunk of token inputs.
  KDA_CHECK(!tree_drafts() || num_draft_tokens <= kMaxTreeNodes,
            "--speculative-num-draft-tokens: invalid value '{}' with --speculative-eagle-topk {} "
            "(tree drafts: expected at most {} nodes per request)",
            num_draft_tokens, eagle_topk, kMaxTreeNodes);
  // A tree's accepted path is not a contiguous ring range: trees commit eagerly.
  KDA_CHECK(!tree_drafts() ||
                (deferred_commit != static_cast<int>(DeferredCommit::kOn) && !lazy_write_back()),
            "--kda-deferred-commit: invalid value '{}' with --speculative-eagle-topk {} (tree "
            "drafts commit eagerly: expected auto or off)",
            kDeferredCommitNames[deferred_commit], eagle_topk);
  if (lazy_write_back()) {
    // The lazy verify's outputs are the fast chunk's over the pending steps and the draft.
    KDA_CHECK(replayssm_spec,
              "--kda-deferred-commit: invalid value 'lazy' without "
              "--enable-linear-replayssm-spec (the lazy write-back replays ring records)");
    KDA_CHECK(replayssm_cache_len <= kFastMaxChunk,
              "--linear-replayssm-cache-len: invalid value '{}' with --kda-deferred-commit lazy "
              "(expected at most {}: the pending steps and the next draft share one fast chunk)",
              replayssm_cache_len, kFastMaxChunk);
    KDA_CHECK(numerics_request() != NumericsRequest::kExact,
              "--kda-verify-numerics: invalid value 'exact' with --kda-deferred-commit lazy (the "
              "lazy verify computes fast outputs: expected fast or auto)");
    KDA_CHECK(fused_verify,
              "--kda-fused-verify: invalid value 'off' with --kda-deferred-commit lazy (the fast "
              "outputs run on the fused path)");
  }
  KDA_CHECK(lazy_fold_interval == 0 || lazy_write_back(),
            "--kda-lazy-fold-interval: invalid value '{}' without --kda-deferred-commit lazy "
            "(expected 0)",
            lazy_fold_interval);
}

EngineFlags parse_engine_flags(std::vector<std::string>& args, const EngineFlags& defaults) {
  EngineFlags flags = defaults;
  const std::vector<std::string_view> views(args.begin(), args.end());
  const std::vector<bool> consumed = parse_into(views, 0, flags);
  std::vector<std::string> rest;
  rest.reserve(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    if (!consumed[i]) {
      rest.push_back(std::move(args[i]));
    }
  }
  args = std::move(rest);
  return flags;
}

EngineFlags parse_engine_flags(int& argc, char** argv, const EngineFlags& defaults) {
  KDA_CHECK(argc >= 0 && (argc == 0 || argv != nullptr),
            "parse_engine_flags: argc = {} with a null argv", argc);
  EngineFlags flags = defaults;
  std::vector<std::string_view> views;
  views.reserve(static_cast<size_t>(argc));
  for (int i = 0; i < argc; ++i) {
    views.emplace_back(argv[i] != nullptr ? argv[i] : "");
  }
  const std::vector<bool> consumed = parse_into(views, /*first=*/1, flags);
  int kept = 0;
  for (int i = 0; i < argc; ++i) {
    if (!consumed[static_cast<size_t>(i)]) {
      argv[kept++] = argv[i];
    }
  }
  if (kept < argc) {
    argv[kept] = nullptr;  // keep the C convention argv[argc] == nullptr
  }
  argc = kept;
  return flags;
}

std::string engine_flags_help() {
  std::string s = "KDA backend flags:\n";
  for (const FlagSpec& f : kFlags) {
    const std::string head = f.arg[0] ? fmt::format("{} {}", f.name, f.arg) : f.name;
    s += fmt::format("  {:<40} {}; {} (default {})\n", head, f.help, allowed(f), default_text(f));
  }
  return s;
}

}  // namespace kda
