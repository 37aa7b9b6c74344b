// demo_test.cc: kda_demo (tools/demo) on the host: small configurations pass the demo's own
// correctness check in ring and snapshot mode, the check fails on states that differ, the
// input generator is a pinned, batch-independent function of its key, --prefix-cache's check
// passes in every mode and catches a planted wrong track or copy, and the command line
// rejects bad flags with exit code 2 and a precise message. [gpu] cases (demo_gpu_test): the
// device generator writes the host generator's bits, and CUDA-graph rounds the eager bits.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "core/buffer.h"
#include "core/platform.h"
#include "tools/demo/demo_accept.h"
#include "tools/demo/demo_app.h"
#include "tools/demo/demo_args.h"
#include "tools/demo/demo_check.h"
#include "tools/demo/demo_driver.h"
#include "tools/demo/demo_generate.h"
#include "tools/demo/demo_inputs.h"
#include "tools/demo/demo_prefix.h"
#include "tools/demo/demo_prefix_check.h"
#include "tools/demo/demo_random.h"

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
  // Ring mode with the deferred commit and the lazy write-back too: their check folds the
  // pending steps first and compares with an independent snapshot-mode run, bitwise.
  const std::vector<std::string> mode = GENERATE(
      std::vector<std::string>{"--enable-linear-replayssm-spec"},
      std::vector<std::string>{"--enable-linear-replayssm-spec", "--kda-deferred-commit", "on"},
      std::vector<std::string>{"--enable-linear-replayssm-spec", "--kda-deferred-commit", "lazy"},
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

namespace {

// One layer's activations in host vectors, through the host generator.
struct HostLayer {
  std::vector<bf16_t> t[kActivationTensors];
  int32_t round = 0;
  ActivationParams params;
};

// Which rows of which requests a fill writes (ActivationParams' layout fields).
struct RowLayout {
  int32_t request0 = 0, request_stride = 1, first_row = 0, shared_rows = 0, group_size = 1;
};

HostLayer host_layer(const ModelConfig& m, uint64_t seed, Phase phase, int32_t round, int layer,
                     int B, int T, const RowLayout& rows = {}) {
  HostLayer h;
  h.round = round;
  const int64_t row_elems[] = {m.qkv_dim(), int64_t{m.HV} * m.K, int64_t{m.HV}};
  for (int t = 0; t < kActivationTensors; ++t) {
    h.t[t].assign(static_cast<size_t>(int64_t{B} * T * row_elems[t]), bf16_t{0xffff});
    h.params.dst[t] = h.t[t].data();
    h.params.row_elems[t] = row_elems[t];
  }
  h.params.round = &h.round;
  h.params.seed = seed;
  h.params.phase = phase;
  h.params.layer = layer;
  h.params.B = B;
  h.params.T = T;
  h.params.request0 = rows.request0;
  h.params.request_stride = rows.request_stride;
  h.params.first_row = rows.first_row;
  h.params.shared_rows = rows.shared_rows;
  h.params.group_size = rows.group_size;
  fill_activations_host(h.params);
  h.params.round = nullptr;  // h may move; the fill has read it
  return h;
}

ModelConfig tiny_model(int HV, int V) {
  ModelConfig m;
  m.num_layers = 3;
  m.H = 1;
  m.HV = HV;
  m.K = 64;
  m.V = V;
  return m;
}

// Request n's block of tensor t (T rows) of a host layer.
std::vector<uint16_t> block_bits(const HostLayer& h, int t, int n) {
  const int64_t count = int64_t{h.params.T} * h.params.row_elems[t];
  std::vector<uint16_t> bits;
  for (int64_t e = 0; e < count; ++e) {
    bits.push_back(h.t[t][static_cast<size_t>(n * count + e)].bits);
  }
  return bits;
}

}  // namespace

TEST_CASE("demo: the input formula gives its pinned values", "[demo]") {
  // Pinned from an independent implementation of demo_random.h (Python integers, f32
  // products rounded from their exact double values, integer bf16 RNE).
  const uint64_t key = stream_key(/*seed=*/1, StreamTag::kMixedQkv, Phase::kVerify, /*round=*/3,
                                  /*layer=*/1, /*request=*/2);
  CHECK(key == 0xc2271ffc8293a1fdull);
  CHECK(normal_draw(key, 0, 0.5f) == 0.14422303438186646f);
  CHECK(normal_draw(key, 1, 0.5f) == -0.4338187873363495f);
  CHECK(normal_draw(stream_key(42, StreamTag::kConvWeight, Phase::kWeights, 0, 0, 0), 1, 0.3f) ==
        0.19231852889060974f);
  // Request 2 of layer 1, round 3, through the host generator: elements 0..2 of each tensor.
  const HostLayer h = host_layer(tiny_model(2, 64), 1, Phase::kVerify, 3, 1, /*B=*/3, /*T=*/2);
  const std::vector<std::vector<uint16_t>> expected = {
      {0x3e14, 0xbede, 0x3e7f}, {0xbe89, 0xbf32, 0xbf0b}, {0xbe8b, 0x3f76, 0xbedb}};
  for (int t = 0; t < kActivationTensors; ++t) {
    CAPTURE(t);
    const std::vector<uint16_t> bits = block_bits(h, t, 2);
    CHECK(std::vector<uint16_t>(bits.begin(), bits.begin() + 3) == expected[t]);
  }
}

TEST_CASE("demo: normal draws have mean 0, unit variance and a bounded range", "[demo]") {
  const uint64_t key = stream_key(9, StreamTag::kGateA, Phase::kVerify, 0, 0, 0);
  constexpr int64_t kDraws = int64_t{1} << 20;
  double sum = 0.0, sum2 = 0.0, sum4 = 0.0, max_abs = 0.0, bf16_sum2 = 0.0;
  for (int64_t i = 0; i < kDraws; ++i) {
    const double z = normal_draw(key, static_cast<uint64_t>(i), 1.0f);
    sum += z;
    sum2 += z * z;
    sum4 += z * z * z * z;
    max_abs = std::max(max_abs, std::fabs(z));
    const double half = bf16_to_float(normal_bf16(key, static_cast<uint64_t>(i), 0.5f));
    bf16_sum2 += half * half;
  }
  const double mean = sum / kDraws, var = sum2 / kDraws - mean * mean;
  CHECK(std::fabs(mean) < 0.005);  // sd of the mean: 1 / 1024
  CHECK(std::fabs(var - 1.0) < 0.01);
  CHECK(std::fabs(sum4 / kDraws - 2.7) < 0.05);  // Irwin-Hall n = 4: kurtosis 3 - 6/(5n)
  CHECK(max_abs <= 3.47);
  CHECK(std::fabs(bf16_sum2 / kDraws - 0.25) < 0.0025);  // scale 0.5, rounded to bf16
}

TEST_CASE("demo: activations of a request do not depend on the batch", "[demo]") {
  const ModelConfig m = tiny_model(2, 64);
  const HostLayer big = host_layer(m, 3, Phase::kVerify, /*round=*/2, /*layer=*/1, /*B=*/4, 3);
  const HostLayer one = host_layer(m, 3, Phase::kVerify, 2, 1, /*B=*/1, 3);
  const HostLayer three = host_layer(m, 3, Phase::kVerify, 2, 1, /*B=*/3, 3);
  for (int t = 0; t < kActivationTensors; ++t) {
    CAPTURE(t);
    CHECK(block_bits(one, t, 0) == block_bits(big, t, 0));
    CHECK(block_bits(three, t, 2) == block_bits(big, t, 2));
    CHECK(block_bits(big, t, 1) != block_bits(big, t, 2));
  }
  // Every other key component changes the values.
  const std::vector<uint16_t> ref = block_bits(big, 0, 0);
  CHECK(block_bits(host_layer(m, 4, Phase::kVerify, 2, 1, 1, 3), 0, 0) != ref);
  CHECK(block_bits(host_layer(m, 3, Phase::kPrompt, 2, 1, 1, 3), 0, 0) != ref);
  CHECK(block_bits(host_layer(m, 3, Phase::kVerify, 5, 1, 1, 3), 0, 0) != ref);
  CHECK(block_bits(host_layer(m, 3, Phase::kVerify, 2, 0, 1, 3), 0, 0) != ref);
}

TEST_CASE("demo: shared prompt prefixes, strided batches and chunks of a request's rows",
          "[demo]") {
  // --prefix-cache's inputs: groups of 2 share sequence rows 0..3 (the leader's); a batch of
  // every other request and a chunk of later rows reproduce the same rows of the whole fill.
  const ModelConfig m = tiny_model(2, 64);
  const int T = 6;
  RowLayout shared;
  shared.shared_rows = 4;
  shared.group_size = 2;
  const HostLayer all = host_layer(m, 3, Phase::kPrompt, 0, 1, /*B=*/3, T, shared);
  const HostLayer plain = host_layer(m, 3, Phase::kPrompt, 0, 1, /*B=*/3, T);
  for (int t = 0; t < kActivationTensors; ++t) {
    CAPTURE(t);
    const size_t row = static_cast<size_t>(all.params.row_elems[t]);
    const std::vector<uint16_t> r0 = block_bits(all, t, 0), r1 = block_bits(all, t, 1);
    const std::vector<uint16_t> r2 = block_bits(all, t, 2);
    CHECK(r0 == block_bits(plain, t, 0));  // a leader's rows are its own
    CHECK(r2 == block_bits(plain, t, 2));
    const std::vector<uint16_t> p1 = block_bits(plain, t, 1);
    CHECK(std::equal(r1.begin(), r1.begin() + 4 * row, r0.begin()));          // the shared prefix
    CHECK(std::equal(r1.begin() + 4 * row, r1.end(), p1.begin() + 4 * row));  // its own suffix
    CHECK(!std::equal(r1.begin() + 4 * row, r1.end(), r0.begin() + 4 * row));
    CHECK(!std::equal(r2.begin(), r2.begin() + 4 * row, r0.begin()));  // another group

    RowLayout strided = shared;
    strided.request_stride = 2;  // requests 0 and 2
    const HostLayer evens = host_layer(m, 3, Phase::kPrompt, 0, 1, /*B=*/2, T, strided);
    CHECK(block_bits(evens, t, 1) == r2);
    RowLayout chunk = shared;
    chunk.request0 = 1;
    chunk.first_row = 3;  // rows 3..5 of request 1: one shared row, then its own
    const HostLayer tail = host_layer(m, 3, Phase::kPrompt, 0, 1, /*B=*/1, 3, chunk);
    CHECK(block_bits(tail, t, 0) == std::vector<uint16_t>(r1.begin() + 3 * row, r1.end()));
  }
}

TEST_CASE("demo: decode track steps follow SGLang's mamba_steps_to_track", "[demo]") {
  // Committed length seq_pre -> seq_pre + n: track the step that reaches the last multiple of I.
  CHECK(decode_track_step(/*seq_pre=*/8, /*accepted=*/3, /*interval=*/4) == -1);  // 8 -> 11
  CHECK(decode_track_step(9, 3, 4) == 2);   // 9 -> 12: step 2 commits 12
  CHECK(decode_track_step(11, 1, 4) == 0);  // 11 -> 12
  CHECK(decode_track_step(11, 4, 4) == 0);  // 11 -> 15: 12 is reached at step 0
  CHECK(decode_track_step(7, 8, 4) == 4);   // 7 -> 15 crosses 8 and 12: the last, 12
  CHECK(decode_track_step(12, 4, 4) == 3);  // 12 -> 16
  CHECK(decode_track_step(5, 1, 1) == 0);   // every token
  // The driver allocates one slot per track: the count follows the same formula.
  PrefixSpec s;
  s.enabled = true;
  s.track_interval = 4;
  AcceptSpec all;
  all.kind = AcceptKind::kAll;
  CHECK(count_decode_tracks(s, all, 1, /*requests=*/2, /*rounds=*/3, /*prompt_len=*/6, 4) == 6);
  s.track_interval = 5;  // 6 -> 10 -> 14 -> 18: crosses 10 and 15
  CHECK(count_decode_tracks(s, all, 1, 2, 3, 6, 4) == 4);
}

namespace {

// The tiny spec with a prefix cache: 3 requests in groups of 2 (2 groups, 1 follower), 3 of 5
// prompt tokens shared, decode tracks every 3 tokens.
RunSpec tiny_prefix_spec(bool ring, bool deferred, PrefixFault fault) {
  RunSpec s = tiny_spec(ring, /*seed=*/5);
  s.requests = 3;
  s.flags.max_running_requests = 3;
  s.flags.deferred_commit = deferred ? 1 : 0;
  s.rounds = 4;
  s.prefix.enabled = true;
  s.prefix.shared_len = 3;
  s.prefix.group_size = 2;
  s.prefix.track_interval = 3;
  s.prefix.fault = fault;
  return s;
}

}  // namespace

TEST_CASE("demo: --prefix-cache passes its checks in snapshot, ring, deferred and lazy ring mode",
          "[demo]") {
  const std::vector<std::string> mode = GENERATE(
      std::vector<std::string>{"--enable-linear-replayssm-spec=off"},
      std::vector<std::string>{"--enable-linear-replayssm-spec"},
      std::vector<std::string>{"--enable-linear-replayssm-spec", "--kda-deferred-commit", "on"},
      std::vector<std::string>{"--enable-linear-replayssm-spec", "--kda-deferred-commit", "lazy"});
  CAPTURE(mode);
  std::vector<std::string> args = tiny_with({"--prefix-cache", "--track-interval", "4"});
  args.insert(args.end(), mode.begin(), mode.end());
  const DemoResult r = run_demo(args);
  INFO(r.out << r.err);
  REQUIRE(r.rc == kExitPass);
  CHECK(contains(r.out, "RESULT: PASS (2 of 2 checks)"));
  CHECK(contains(r.out,
                 "prefix    --prefix-cache: 2 groups of up to 2 requests share their "
                 "first 4 of 8 prompt tokens"));
  CHECK(contains(r.out, "pool: 17 slots = 3 (--max-running-requests) + 2 cache + 12 track slots"));
  CHECK(contains(r.out,
                 "host prefix cache: tracked, copied and final states vs independent "
                 "extend-only recomputation: PASS"));
  CHECK(contains(r.out,
                 "compared: all 2 layers: 2 prefix tracks, 1 copies, 12 decode tracks, "
                 "3 final states; rule: bitwise"));
  CHECK(contains(r.out,
                 "12 decode tracks (CommitTrack, track slots) (24 layer states): ssm "
                 "bitwise equal; conv bitwise equal"));
  CHECK(!contains(r.out, "NOT bitwise"));
}

TEST_CASE("demo: the prefix check catches a planted wrong track or copy", "[demo]") {
  // A wrong state propagates: followers copy a wrong cache slot and decode on from a wrong
  // copy, so every state downstream of the fault differs, and only those.
  struct Planted {
    PrefixFault fault;
    const char* kind;                     // the detail line of the planted error
    std::vector<const char*> unaffected;  // detail lines that must stay bitwise equal
  };
  const Planted c = GENERATE(values<Planted>({
      {PrefixFault::kPrefixTrackStep, "prefix tracks", {}},
      {PrefixFault::kCopySource, "copies", {"prefix tracks"}},
      {PrefixFault::kDecodeTrackStep, "decode tracks", {"prefix tracks", "copies", "final"}},
  }));
  const int mode = GENERATE(0, 1, 2);  // snapshot, ring, ring with the deferred commit
  const bool ring = mode >= 1, deferred = mode == 2;
  CAPTURE(static_cast<int>(c.fault), ring, deferred);

  DemoRun clean(tiny_prefix_spec(ring, deferred, PrefixFault::kNone));
  clean.run();
  const CheckOutcome ok = check_prefix_cache(clean);
  CHECK(ok.passed());

  DemoRun planted(tiny_prefix_spec(ring, deferred, c.fault));
  planted.run();
  const CheckOutcome bad = check_prefix_cache(planted);
  CHECK(!bad.passed());
  CHECK(!bad.ssm.bitwise());
  REQUIRE(bad.details.size() == 4);
  for (const std::string& d : bad.details) {
    CAPTURE(d);
    const bool unaffected = std::any_of(c.unaffected.begin(), c.unaffected.end(),
                                        [&](const char* k) { return contains(d, k); });
    CHECK(contains(d, "NOT bitwise equal") == !unaffected);
    if (contains(d, c.kind)) {
      CHECK(contains(d, "NOT bitwise equal"));
    }
  }
  // A wrong decode track leaves every committed state right: comparing final states (the
  // mode check) cannot see it.
  if (c.fault == PrefixFault::kDecodeTrackStep) {
    CHECK(compare_runs(planted, clean, CompareRule::kBitwise).passed());
  }
}

TEST_CASE("demo: the device generator writes the host formula's bits", "[demo][gpu]") {
  REQUIRE(detect_platform(0).has_device);  // a [gpu] test without a device fails
  struct GenCase {
    int HV, V, B, T;
  };
  // D = 2*64 + HV*V: 256 (even) and 143 (odd rows, odd b blocks).
  const GenCase c = GENERATE(values<GenCase>({{2, 64, 3, 5}, {3, 5, 4, 3}, {2, 64, 1, 16}}));
  const Phase phase = GENERATE(Phase::kPrompt, Phase::kVerify);
  // Plain, and --prefix-cache's layout: strided requests, a chunk of rows, a shared prefix.
  const RowLayout rows = GENERATE(values<RowLayout>({{}, {1, 2, 2, 3, 2}}));
  CAPTURE(c.HV, c.V, c.B, c.T, static_cast<int>(phase), rows.request0, rows.first_row);
  const ModelConfig m = tiny_model(c.HV, c.V);
  const int32_t round = 11;
  const HostLayer host = host_layer(m, /*seed=*/5, phase, round, /*layer=*/2, c.B, c.T, rows);

  const Device gpu = Device::cuda(0);
  Buffer round_buf(gpu, sizeof(int32_t));
  round_buf.upload(&round, sizeof(round));
  std::vector<Buffer> bufs;
  ActivationParams p = host.params;
  p.round = static_cast<const int32_t*>(round_buf.data());
  for (int t = 0; t < kActivationTensors; ++t) {
    const int64_t bytes = static_cast<int64_t>(host.t[t].size() * sizeof(bf16_t));
    std::vector<uint8_t> garbage(static_cast<size_t>(bytes));
    for (size_t i = 0; i < garbage.size(); ++i) {
      garbage[i] = static_cast<uint8_t>(mix64(1000 + t * 100000 + i));
    }
    bufs.emplace_back(gpu, bytes);
    bufs.back().upload(garbage.data(), bytes);
    p.dst[t] = static_cast<bf16_t*>(bufs.back().data());
  }
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  fill_activations_cuda(p, stream);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);
  for (int t = 0; t < kActivationTensors; ++t) {
    CAPTURE(t);
    std::vector<bf16_t> device_values(host.t[t].size());
    bufs[static_cast<size_t>(t)].download(device_values.data(),
                                          static_cast<int64_t>(device_values.size() * 2));
    int64_t differing = 0;
    for (size_t i = 0; i < device_values.size(); ++i) {
      differing += device_values[i].bits != host.t[t][i].bits ? 1 : 0;
    }
    CHECK(differing == 0);
  }
}

TEST_CASE("demo: CUDA-graph rounds commit the eager rounds' bits", "[demo][gpu]") {
  REQUIRE(detect_platform(0).has_device);
  RunSpec eager = tiny_spec(/*ring=*/true, /*seed=*/3);
  eager.device = Device::cuda(0);
  eager.rounds = 5;
  RunSpec graphed = eager;
  graphed.cuda_graph = true;
  DemoRun a(eager);
  a.run();
  DemoRun b(graphed);
  b.run();
  const CheckOutcome c = compare_runs(a, b, CompareRule::kBitwise);
  CHECK(c.passed());
  CHECK(c.ssm.max_abs == 0.0);
  CHECK(b.stats().rounds.back().graphed);
}

TEST_CASE("demo: a CUDA run with a CUDA graph passes both checks", "[demo][gpu]") {
  REQUIRE(detect_platform(0).has_device);
  std::vector<std::string> args = tiny_with({"--enable-linear-replayssm-spec", "--check", "both"});
  args[1] = "cuda";  // --device
  const DemoResult r = run_demo(args);
  INFO(r.out << r.err);
  REQUIRE(r.rc == kExitPass);
  CHECK(contains(r.out, "RESULT: PASS (2 of 2 checks)"));
  CHECK(contains(r.out, "one CUDA graph replay per round"));
  CHECK(contains(r.out, "round on the GPU (cudaEvents), first to last mark"));
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
      {{"--device", "host", "--cuda-graph"}, "--cuda-graph: needs a CUDA device"},
      {{"--prefix-len", "4"}, "--prefix-len: needs --prefix-cache"},
      {{"--track-interval", "4"}, "--track-interval: needs --prefix-cache"},
      {{"--prefix-cache", "--track-interval", "0"},
       "--track-interval: invalid value '0' (expected an integer in [1, 1000000])"},
      {{"--prefix-cache", "--prompt-len", "0"}, "--prefix-cache: needs --prompt-len >= 1"},
      {{"--prefix-cache", "--prompt-len", "4", "--prefix-len", "5"},
       "--prefix-len 5 exceeds --prompt-len 4"},
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
                           "--cuda-graph",
                           "--check",
                           "--check-host-layers",
                           "--check-host-requests",
                           "--prefix-cache",
                           "--prefix-len",
                           "--prefix-group",
                           "--track-interval",
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
