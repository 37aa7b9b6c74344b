// flags_test.cc: engine-flag parsing: values, ranges, consumption and messages.
#include <catch2/catch.hpp>
#include <functional>
#include <string>
#include <vector>

#include "backend/flags.h"
#include "core/error.h"
#include "kernels/kda_kernels.h"

using namespace kda;

namespace {

using Args = std::vector<std::string>;

// Parses `args`; returns the error message ("" if none) and leaves the rest in `args`.
std::string parse_error(Args& args) {
  try {
    parse_engine_flags(args);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kInvalidArgument);
    return e.message();
  }
  return "";
}

}  // namespace

TEST_CASE("flags: defaults", "[flags]") {
  Args args;
  const EngineFlags f = parse_engine_flags(args);
  CHECK(f.num_draft_tokens == 4);
  CHECK_FALSE(f.replayssm_spec);
  CHECK(f.record_mode() == RecordMode::kSnapshot);
  CHECK(f.replayssm_cache_len == 16);
  CHECK(f.max_running_requests == 64);
  CHECK(f.fused_verify);
  CHECK(f.fused_ring_max_batch == 1);
  CHECK(f.verify_block_v == 0);
  CHECK(f.resolved_block_v() == kernels::kDefaultFusedBlockV);
  CHECK(f.verify_numerics == static_cast<int>(NumericsRequest::kAuto));
  CHECK(f.numerics_request() == NumericsRequest::kAuto);
  CHECK(f.dispatch_flags().numerics == NumericsRequest::kAuto);
  CHECK(f.dispatch_flags().numerics_table == nullptr);  // auto: the built-in measured tables
  CHECK(args.empty());
}

TEST_CASE("flags: good values in both spellings; others left in order", "[flags]") {
  Args args = {"--model",
               "kimi",
               "--speculative-num-draft-tokens",
               "8",
               "--enable-linear-replayssm-spec",
               "--linear-replayssm-cache-len=32",
               "-v",
               "--max-running-requests",
               "4096",
               "--kda-fused-verify=off",
               "--kda-fused-ring-max-batch",
               "0",
               "--kda-verify-block-v=128",
               "--kda-verify-numerics",
               "fast",
               "--port=30000",
               "positional"};
  const EngineFlags f = parse_engine_flags(args);
  CHECK(f.num_draft_tokens == 8);
  CHECK(f.replayssm_spec);
  CHECK(f.record_mode() == RecordMode::kRing);
  CHECK(f.replayssm_cache_len == 32);
  CHECK(f.max_running_requests == 4096);
  CHECK_FALSE(f.fused_verify);
  CHECK(f.fused_ring_max_batch == 0);
  CHECK(f.verify_block_v == 128);
  CHECK(f.resolved_block_v() == 128);
  const DispatchFlags d = f.dispatch_flags();
  CHECK_FALSE(d.fused_verify);
  CHECK(d.fused_ring_max_batch == 0);
  CHECK(d.block_v == 128);
  CHECK(f.numerics_request() == NumericsRequest::kFast);
  CHECK(d.numerics == NumericsRequest::kFast);
  CHECK(args == Args{"--model", "kimi", "-v", "--port=30000", "positional"});
}

TEST_CASE("flags: every accepted spelling of each value", "[flags]") {
  struct Good {
    Args args;
    std::function<bool(const EngineFlags&)> holds;
  };
  const std::vector<Good> cases = {
      {{"--speculative-num-draft-tokens", "1"}, [](auto& f) { return f.num_draft_tokens == 1; }},
      {{"--speculative-num-draft-tokens=16"}, [](auto& f) { return f.num_draft_tokens == 16; }},
      {{"--enable-linear-replayssm-spec=true"}, [](auto& f) { return f.replayssm_spec; }},
      {{"--enable-linear-replayssm-spec=off"}, [](auto& f) { return !f.replayssm_spec; }},
      {{"--enable-linear-replayssm-spec", "--enable-linear-replayssm-spec=0"},
       [](auto& f) { return !f.replayssm_spec; }},  // the last one wins
      {{"--linear-replayssm-cache-len", "2"}, [](auto& f) { return f.replayssm_cache_len == 2; }},
      {{"--linear-replayssm-cache-len", "256"},
       [](auto& f) { return f.replayssm_cache_len == 256; }},
      {{"--max-running-requests=1"}, [](auto& f) { return f.max_running_requests == 1; }},
      {{"--kda-fused-verify", "on"}, [](auto& f) { return f.fused_verify; }},
      {{"--kda-fused-verify", "false"}, [](auto& f) { return !f.fused_verify; }},
      {{"--kda-fused-verify", "0"}, [](auto& f) { return !f.fused_verify; }},
      {{"--kda-fused-verify=1"}, [](auto& f) { return f.fused_verify; }},
      {{"--kda-fused-ring-max-batch", "4096"},
       [](auto& f) { return f.fused_ring_max_batch == 4096; }},
      {{"--kda-verify-block-v", "auto"}, [](auto& f) { return f.verify_block_v == 0; }},
      {{"--kda-verify-block-v", "0"}, [](auto& f) { return f.verify_block_v == 0; }},
      {{"--kda-verify-block-v=8"}, [](auto& f) { return f.verify_block_v == 8; }},
      {{"--kda-verify-block-v", "64"}, [](auto& f) { return f.verify_block_v == 64; }},
      {{"--kda-verify-numerics", "exact"},
       [](auto& f) { return f.numerics_request() == NumericsRequest::kExact; }},
      {{"--kda-verify-numerics=fast"},
       [](auto& f) { return f.numerics_request() == NumericsRequest::kFast; }},
      {{"--kda-verify-numerics", "auto"},
       [](auto& f) { return f.numerics_request() == NumericsRequest::kAuto; }},
      {{"--kda-verify-numerics", "fast", "--kda-verify-numerics=exact"},
       [](auto& f) { return f.numerics_request() == NumericsRequest::kExact; }},  // the last wins
      // Not a cross-flag error: snapshot mode, trees and the deferred commit keep exact outputs
      // per call, and the decision says why.
      {{"--kda-verify-numerics", "fast", "--kda-deferred-commit", "on",
        "--enable-linear-replayssm-spec"},
       [](auto& f) { return f.numerics_request() == NumericsRequest::kFast; }},
      {{"--kda-verify-numerics", "fast", "--speculative-eagle-topk", "4"},
       [](auto& f) { return f.numerics_request() == NumericsRequest::kFast; }},
      {{"--enable-linear-replayssm-spec", "--kda-deferred-commit", "lazy"},
       [](auto& f) { return f.lazy_write_back() && f.lazy_fold_interval == 0; }},
      {{"--enable-linear-replayssm-spec", "--kda-deferred-commit=lazy", "--kda-verify-numerics",
        "fast", "--kda-lazy-fold-interval", "6"},
       [](auto& f) { return f.lazy_write_back() && f.lazy_fold_interval == 6; }},
  };
  for (const Good& c : cases) {
    Args args = c.args;
    CAPTURE(c.args);
    CHECK(c.holds(parse_engine_flags(args)));
    CHECK(args.empty());
  }
}

TEST_CASE("flags: bad values name the flag, the value and the range", "[flags]") {
  struct Bad {
    Args args;
    const char* message;
  };
  const std::vector<Bad> cases = {
      {{"--speculative-num-draft-tokens", "0"},
       "--speculative-num-draft-tokens: invalid value '0' (expected an integer in [1, 16])"},
      {{"--speculative-num-draft-tokens=17"},
       "--speculative-num-draft-tokens: invalid value '17' (expected an integer in [1, 16])"},
      {{"--speculative-num-draft-tokens", "4x"},
       "--speculative-num-draft-tokens: invalid value '4x' (expected an integer in [1, 16])"},
      {{"--speculative-num-draft-tokens="},
       "--speculative-num-draft-tokens: invalid value '' (expected an integer in [1, 16])"},
      {{"--speculative-num-draft-tokens"},
       "--speculative-num-draft-tokens: missing value (expected an integer in [1, 16])"},
      {{"--max-running-requests", "--kda-fused-verify", "on"},
       "--max-running-requests: missing value (expected an integer in [1, 4096])"},
      {{"--enable-linear-replayssm-spec=maybe"},
       "--enable-linear-replayssm-spec: invalid value 'maybe' (expected no value, or =on|off, "
       "=true|false, =1|0)"},
      {{"--linear-replayssm-cache-len", "24"},
       "--linear-replayssm-cache-len: invalid value '24' (expected a power of two in [2, 256])"},
      {{"--linear-replayssm-cache-len", "1"},
       "--linear-replayssm-cache-len: invalid value '1' (expected a power of two in [2, 256])"},
      {{"--linear-replayssm-cache-len=512"},
       "--linear-replayssm-cache-len: invalid value '512' (expected a power of two in [2, 256])"},
      {{"--max-running-requests", "0"},
       "--max-running-requests: invalid value '0' (expected an integer in [1, 4096])"},
      {{"--max-running-requests", "4097"},
       "--max-running-requests: invalid value '4097' (expected an integer in [1, 4096])"},
      {{"--max-running-requests", "99999999999999999999"},
       "--max-running-requests: invalid value '99999999999999999999' (expected an integer in "
       "[1, 4096])"},
      {{"--kda-fused-verify", "yes"},
       "--kda-fused-verify: invalid value 'yes' (expected on|off, true|false or 1|0)"},
      {{"--kda-fused-ring-max-batch", "-1"},
       "--kda-fused-ring-max-batch: invalid value '-1' (expected an integer in [0, 4096])"},
      {{"--kda-verify-block-v", "12"},
       "--kda-verify-block-v: invalid value '12' (expected auto (or 0) or one of 8, 16, 32, 64, "
       "128)"},
      {{"--kda-verify-block-v=4"},
       "--kda-verify-block-v: invalid value '4' (expected auto (or 0) or one of 8, 16, 32, 64, "
       "128)"},
      {{"--kda-verify-numerics", "tf32"},
       "--kda-verify-numerics: invalid value 'tf32' (expected auto, exact or fast)"},
      {{"--kda-verify-numerics=Fast"},
       "--kda-verify-numerics: invalid value 'Fast' (expected auto, exact or fast)"},
      {{"--kda-verify-numerics", "1"},
       "--kda-verify-numerics: invalid value '1' (expected auto, exact or fast)"},
      {{"--kda-verify-numerics="},
       "--kda-verify-numerics: invalid value '' (expected auto, exact or fast)"},
      {{"--kda-verify-numerics"},
       "--kda-verify-numerics: missing value (expected auto, exact or fast)"},
      {{"--kda-deferred-commit", "eager"},
       "--kda-deferred-commit: invalid value 'eager' (expected auto, on, off or lazy)"},
      // The lazy write-back (contract §11): ring mode, one fast chunk, fast outputs, fused, chains.
      {{"--kda-deferred-commit", "lazy"},
       "--kda-deferred-commit: invalid value 'lazy' without --enable-linear-replayssm-spec (the "
       "lazy write-back replays ring records)"},
      {{"--enable-linear-replayssm-spec", "--kda-deferred-commit", "lazy",
        "--linear-replayssm-cache-len", "32"},
       "--linear-replayssm-cache-len: invalid value '32' with --kda-deferred-commit lazy "
       "(expected at most 16: the pending steps and the next draft share one fast chunk)"},
      {{"--enable-linear-replayssm-spec", "--kda-deferred-commit", "lazy", "--kda-verify-numerics",
        "exact"},
       "--kda-verify-numerics: invalid value 'exact' with --kda-deferred-commit lazy (the lazy "
       "verify computes fast outputs: expected fast or auto)"},
      {{"--enable-linear-replayssm-spec", "--kda-deferred-commit", "lazy", "--kda-fused-verify",
        "off"},
       "--kda-fused-verify: invalid value 'off' with --kda-deferred-commit lazy (the fast "
       "outputs run on the fused path)"},
      {{"--enable-linear-replayssm-spec", "--kda-deferred-commit", "lazy",
        "--speculative-eagle-topk", "2"},
       "--kda-deferred-commit: invalid value 'lazy' with --speculative-eagle-topk 2 (tree drafts "
       "commit eagerly: expected auto or off)"},
      {{"--enable-linear-replayssm-spec", "--kda-lazy-fold-interval", "4"},
       "--kda-lazy-fold-interval: invalid value '4' without --kda-deferred-commit lazy (expected "
       "0)"},
      {{"--kda-lazy-fold-interval", "17"},
       "--kda-lazy-fold-interval: invalid value '17' (expected an integer in [0, 16])"},
      {{"--enable-linear-replayssm-spec", "--speculative-num-draft-tokens", "16"},
       "--linear-replayssm-cache-len: invalid value '16' for --speculative-num-draft-tokens 16 "
       "with --enable-linear-replayssm-spec (expected a power of two >= 2 * 16 = 32)"},
  };
  for (const Bad& c : cases) {
    CAPTURE(c.args);
    Args args = c.args;
    args.insert(args.begin(), "--keep-me");
    const Args before = args;
    CHECK(parse_error(args) == c.message);
    CHECK(args == before);  // nothing consumed on a throw
  }
}

TEST_CASE("flags: a bare -- ends the module's flags", "[flags]") {
  Args args = {"--kda-fused-verify", "off", "--", "--kda-fused-verify", "on"};
  const EngineFlags f = parse_engine_flags(args);
  CHECK_FALSE(f.fused_verify);
  CHECK(args == Args{"--", "--kda-fused-verify", "on"});
}

TEST_CASE("flags: argc/argv form keeps the program name and compacts", "[flags]") {
  std::string storage[] = {"engine",  "--speculative-num-draft-tokens", "2", "--host",
                           "0.0.0.0", "--kda-fused-verify=false"};
  char* argv[7];
  for (int i = 0; i < 6; ++i) {
    argv[i] = storage[i].data();
  }
  argv[6] = nullptr;
  int argc = 6;
  const EngineFlags f = parse_engine_flags(argc, argv);
  CHECK(f.num_draft_tokens == 2);
  CHECK_FALSE(f.fused_verify);
  REQUIRE(argc == 3);
  CHECK(std::string(argv[0]) == "engine");
  CHECK(std::string(argv[1]) == "--host");
  CHECK(std::string(argv[2]) == "0.0.0.0");
  CHECK(argv[3] == nullptr);

  // The program name is never taken as a flag; a bad value leaves argv alone.
  std::string bad[] = {"--kda-fused-verify", "--max-running-requests", "0"};
  char* bad_argv[] = {bad[0].data(), bad[1].data(), bad[2].data(), nullptr};
  int bad_argc = 3;
  CHECK_THROWS_WITH(parse_engine_flags(bad_argc, bad_argv),
                    Catch::StartsWith("[kda:invalid_argument] --max-running-requests: invalid "
                                      "value '0' (expected an integer in [1, 4096])"));
  CHECK(bad_argc == 3);
  CHECK(bad_argv[0] == bad[0].data());
  CHECK(bad_argv[1] == bad[1].data());
}

TEST_CASE("flags: validate() checks programmatic values like the parser", "[flags]") {
  EngineFlags f;
  CHECK_NOTHROW(f.validate());
  f.verify_block_v = 48;
  CHECK_THROWS_WITH(f.validate(), Catch::Contains("--kda-verify-block-v: invalid value '48'"));
  f = EngineFlags{};
  f.replayssm_spec = true;
  f.num_draft_tokens = 9;
  CHECK_THROWS_WITH(f.validate(),
                    Catch::Contains("--linear-replayssm-cache-len: invalid value '16' for "
                                    "--speculative-num-draft-tokens 9"));
  f.replayssm_spec = false;  // snapshot mode has no ring to size
  CHECK_NOTHROW(f.validate());
  f = EngineFlags{};
  f.verify_numerics = 3;
  CHECK_THROWS_WITH(f.validate(), Catch::Contains("--kda-verify-numerics: invalid value '3' "
                                                  "(expected auto, exact or fast)"));
  f.verify_numerics = static_cast<int>(NumericsRequest::kFast);
  CHECK_NOTHROW(f.validate());
}

TEST_CASE("flags: help lists every flag with range and default", "[flags]") {
  const std::string help = engine_flags_help();
  for (const char* needle : {"--speculative-num-draft-tokens N",
                             "an integer in [1, 16] (default 4)",
                             "--enable-linear-replayssm-spec",
                             "(default off)",
                             "--linear-replayssm-cache-len N",
                             "a power of two in [2, 256] (default 16)",
                             "--max-running-requests N",
                             "(default 64)",
                             "--kda-fused-verify on|off",
                             "(default on)",
                             "--kda-fused-ring-max-batch N",
                             "an integer in [0, 4096] (default 1)",
                             "--kda-verify-block-v auto|N",
                             "(default auto: per call, by grid and T",
                             "--kda-deferred-commit auto|on|off|lazy",
                             "auto, on, off or lazy (default auto)",
                             "--kda-lazy-fold-interval N",
                             "an integer in [0, 16] (default 0)",
                             "--kda-verify-numerics exact|fast|auto",
                             "auto, exact or fast (default auto)"}) {
    CAPTURE(needle);
    CHECK_THAT(help, Catch::Contains(needle));
  }
}
