// demo_test.cc: kda_demo (tools/demo) on the host: small configurations pass the demo's own
// correctness check in ring and snapshot mode, the check fails on states that differ, and the
// command line rejects bad flags with exit code 2 and a precise message.
#include <catch2/catch.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tools/demo/demo_accept.h"
#include "tools/demo/demo_app.h"
#include "tools/demo/demo_args.h"
#include "tools/demo/demo_check.h"
#include "tools/demo/demo_driver.h"
#include "tools/demo/demo_inputs.h"

using namespace kda;
using namespace kda::demo;

namespace {

struct DemoResult {
  int rc = -1;
  std::string out, err;
};

DemoResult run_demo(std::vector<std::string> args) {
  args.insert(args.begin(), "kda_demo");
  std::vector<char*> argv;
  for (std::string& a : args) {
    argv.push_back(a.data());
  }
  argv.push_back(nullptr);
  std::ostringstream out, err;
  DemoResult r;
  r.rc = run_kda_demo(static_cast<int>(args.size()), argv.data(), out, err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

// A tiny shape (D = 2*1*64 + 2*64 = 256) on the host: each run takes well under a second.
const std::vector<std::string> kTiny = {
    "--device",     "host", "--heads",  "1", "--hv-heads", "2", "--head-k-dim", "64",
    "--head-v-dim", "64",   "--layers", "2", "--requests", "3", "--prompt-len", "8",
    "--rounds",     "6",    "--quiet"};

std::vector<std::string> tiny_with(std::vector<std::string> extra) {
  std::vector<std::string> args = kTiny;
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

bool contains(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

RunSpec tiny_spec(bool ring, uint64_t seed) {
  RunSpec s;
  s.model.num_layers = 2;
  s.model.H = 1;
  s.model.HV = 2;
  s.model.K = 64;
  s.model.V = 64;
  s.flags.replayssm_spec = ring;
  s.flags.max_running_requests = 2;
  s.requests = 2;
  s.prompt_len = 5;
  s.rounds = 3;
  s.seed = seed;
  return s;
}

}  // namespace

TEST_CASE("demo: a small run passes its own check in ring and snapshot mode", "[demo]") {
  const std::vector<std::string> mode =
      GENERATE(std::vector<std::string>{"--enable-linear-replayssm-spec"},
               std::vector<std::string>{"--enable-linear-replayssm-spec=off"});
  CAPTURE(mode);
  const DemoResult r = run_demo(tiny_with(mode));
  INFO(r.out << r.err);
  REQUIRE(r.rc == kExitPass);
  CHECK(contains(r.out, "RESULT: PASS (1 of 1 checks)"));
  CHECK(contains(r.out, "bitwise equal -> pass"));
  CHECK(contains(r.out, "compared: all 2 layers x 3 requests; rule: bitwise"));
  CHECK(contains(r.out, "6 rounds, accepted"));
  CHECK(contains(r.out, "ring mode saves"));
  CHECK(r.err.empty());  // --quiet
}

TEST_CASE("demo: fused ring path, safe gate, bf16 conv weights with bias", "[demo]") {
  // B = 1 on a pretended SM90: ring mode takes the fused kernel (contract §4).
  const DemoResult r = run_demo(tiny_with(
      {"--enable-linear-replayssm-spec", "--requests", "1", "--platform", "sm90", "--lower-bound",
       "-5", "--conv-weight", "bf16", "--conv-bias", "--accept", "uniform"}));
  INFO(r.out << r.err);
  REQUIRE(r.rc == kExitPass);
  CHECK(contains(r.out, "12 x fused (block_v = 8): ring mode with B = 1"));
  CHECK(contains(r.out, "safe gate (lower bound -5), bf16 conv weights, conv bias"));
}

TEST_CASE("demo: progress lines go to stderr, one per round", "[demo]") {
  std::vector<std::string> args = kTiny;
  args.pop_back();  // drop --quiet
  const DemoResult r = run_demo(args);
  REQUIRE(r.rc == kExitPass);
  CHECK(contains(r.err, "[primary] round 6/6: accepted"));
  CHECK(contains(r.err, "[check (host ring mode)] round 6/6"));
  CHECK(!contains(r.out, "round 6/6"));
}

TEST_CASE("demo: the check fails when the states differ", "[demo]") {
  // The reference commits every draft token where the primary accepts a geometric prefix: a
  // stand-in for a commit that folds the wrong number of steps. Neither rule may pass it.
  DemoRun a(tiny_spec(/*ring=*/true, /*seed=*/1));
  a.run();
  RunSpec wrong = tiny_spec(/*ring=*/false, /*seed=*/1);
  wrong.accept.kind = AcceptKind::kAll;
  DemoRun b(wrong);
  b.run();
  for (const CompareRule rule : {CompareRule::kBitwise, CompareRule::kRelL2}) {
    const CheckOutcome c = compare_runs(a, b, rule);
    CHECK(!c.passed());
    CHECK(!c.ssm.bitwise());
    CHECK(c.ssm.max_rel_l2 > kStateRelL2Tol);
    CHECK(c.ssm.states == 4);
  }
  // And passes an independent run of the same seed in the other mode.
  DemoRun c(tiny_spec(/*ring=*/false, /*seed=*/1));
  c.run();
  const CheckOutcome same = compare_runs(a, c, CompareRule::kBitwise);
  CHECK(same.passed());
  CHECK(same.ssm.max_abs == 0.0);
}

TEST_CASE("demo: a reduced run reproduces the full run's layers and requests", "[demo]") {
  // What the host check of a CUDA run relies on: fewer layers / requests, same values.
  const RunSpec full = tiny_spec(/*ring=*/true, /*seed=*/7);
  DemoRun a(full);
  a.run();
  DemoRun b(host_reference_spec(full, /*layers=*/1, /*requests=*/1));
  b.run();
  const CheckOutcome c = compare_runs(a, b, CompareRule::kBitwise);
  CHECK(c.passed());
  CHECK(c.ssm.states == 1);
  CHECK(contains(c.coverage, "layers 0..0 of 2 x requests 0..0 of 2"));
}

TEST_CASE("demo: accepted lengths follow the distribution", "[demo]") {
  AcceptSpec s;
  REQUIRE(parse_accept_spec("all", s));
  CHECK(accepted_length(s, 1, 0, 0, 4) == 4);
  REQUIRE(parse_accept_spec("one", s));
  CHECK(accepted_length(s, 1, 0, 0, 4) == 1);
  REQUIRE(parse_accept_spec("geometric:0", s));
  CHECK(accepted_length(s, 1, 3, 2, 8) == 1);
  REQUIRE(parse_accept_spec("geometric:1", s));
  CHECK(accepted_length(s, 1, 3, 2, 8) == 8);
  REQUIRE(parse_accept_spec("uniform", s));
  std::vector<int> seen(9, 0);
  for (int round = 0; round < 400; ++round) {
    const int n = accepted_length(s, 5, round, 1, 8);
    REQUIRE(n >= 1);
    REQUIRE(n <= 8);
    ++seen[static_cast<size_t>(n)];
  }
  for (int n = 1; n <= 8; ++n) {
    CHECK(seen[static_cast<size_t>(n)] > 10);
  }
  CHECK(!parse_accept_spec("geometric:", s));
  CHECK(!parse_accept_spec("geometric:-0.1", s));
  CHECK(!parse_accept_spec("binomial", s));
}

TEST_CASE("demo: activations of a request do not depend on the batch", "[demo]") {
  ModelConfig m;
  m.num_layers = 3;
  m.H = 1;
  m.HV = 2;
  m.K = 64;
  m.V = 64;
  std::vector<HostActivations> big, small;
  const ActivationKey key{/*seed=*/3, Phase::kVerify, /*round=*/2};
  generate_activations(m, key, /*first_layer=*/0, /*num_layers=*/3, /*requests=*/4, /*T=*/3, big);
  generate_activations(m, key, /*first_layer=*/1, /*num_layers=*/1, /*requests=*/1, /*T=*/3, small);
  REQUIRE(small.size() == 1);
  for (size_t i = 0; i < small[0].qkv.size(); ++i) {
    REQUIRE(small[0].qkv[i].bits == big[1].qkv[i].bits);
  }
  for (size_t i = 0; i < small[0].a.size(); ++i) {
    REQUIRE(small[0].a[i].bits == big[1].a[i].bits);
  }
  CHECK(big[0].qkv[0].bits != big[1].qkv[0].bits);
}

TEST_CASE("demo: bad command lines exit 2 with a precise message", "[demo]") {
  struct BadArgs {
    std::vector<std::string> args;
    const char* message;
  };
  const BadArgs c = GENERATE(values<BadArgs>({
      {{"--foo"}, "unknown flag '--foo'"},
      {{"--requests", "0"}, "--requests: invalid value '0' (expected an integer in [1, 4096])"},
      {{"--requests"}, "--requests: missing value"},
      {{"--head-k-dim", "96"}, "--head-k-dim: invalid value '96' (expected 64 or 128)"},
      {{"--heads", "3", "--hv-heads", "4"}, "--hv-heads: invalid value '4' (expected a multiple"},
      {{"--lower-bound", "0.5"}, "--lower-bound: invalid value '0.5'"},
      {{"--accept", "geometric:2"}, "--accept: invalid value 'geometric:2'"},
      {{"--device", "tpu"}, "--device: invalid value 'tpu'"},
      {{"--preset", "gpt"}, "--preset: invalid value 'gpt' (expected kimi-linear|k3-tp8)"},
      {{"stray"}, "unexpected argument 'stray'"},
      {{"--speculative-num-draft-tokens", "17"},
       "--speculative-num-draft-tokens: invalid value '17' (expected an integer in [1, 16])"},
      {{"--kda-fused-verify", "maybe"}, "--kda-fused-verify: invalid value 'maybe'"},
      {{"--requests", "8", "--max-running-requests", "4"},
       "--requests 8 exceeds --max-running-requests 4"},
      {{"--device", "host", "--check", "host"}, "--check host: the host check compares a CUDA run"},
  }));
  CAPTURE(c.args);
  const DemoResult r = run_demo(c.args);
  CHECK(r.rc == kExitUsage);
  CHECK(contains(r.err, c.message));
  CHECK(r.out.empty());
}

TEST_CASE("demo: --help lists every demo flag and every engine flag", "[demo]") {
  const DemoResult r = run_demo({"--help"});
  REQUIRE(r.rc == kExitPass);
  for (const char* flag : {"--preset",
                           "--layers",
                           "--heads",
                           "--hv-heads",
                           "--head-k-dim",
                           "--head-v-dim",
                           "--lower-bound",
                           "--conv-weight",
                           "--conv-bias",
                           "--requests",
                           "--prompt-len",
                           "--rounds",
                           "--accept",
                           "--seed",
                           "--device",
                           "--platform",
                           "--check",
                           "--check-host-layers",
                           "--check-host-requests",
                           "--quiet",
                           "--log-level",
                           "--speculative-num-draft-tokens",
                           "--enable-linear-replayssm-spec",
                           "--linear-replayssm-cache-len",
                           "--max-running-requests",
                           "--kda-fused-verify",
                           "--kda-fused-ring-max-batch",
                           "--kda-verify-block-v"}) {
    CAPTURE(flag);
    CHECK(contains(r.out, std::string("\n  ") + flag + " "));
  }
}
