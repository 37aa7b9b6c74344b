// replay_test.cc: the kda_replay tool (tools/replay) on the host kernel set: a replay of
// files written with the npy writer is bitwise equal to running the same tensors directly
// through the host KernelSet; --compare finds a planted difference; dispatch plumbing; layout
// conversions; load errors.
#include <unistd.h>

#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/error.h"
#include "kernels/kernel_set.h"
#include "tests/test_problem.h"
#include "tools/npy/npy.h"
#include "tools/replay/cli.h"
#include "tools/replay/compare.h"
#include "tools/replay/example.h"
#include "tools/replay/manifest.h"
#include "tools/replay/problem.h"
#include "tools/replay/runner.h"

namespace kda::replay {
namespace {

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using testing::bitwise_equal;
using testing::Tensor;
using testing::VerifyCase;
using testing::VerifyProblem;

std::string temp_dir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(base != nullptr ? base : fs::temp_directory_path()) /
                       ("replay_test_" + std::to_string(getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

struct CliResult {
  int code = 0;
  std::string out, err;
};

CliResult cli(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  CliResult r;
  r.code = run_cli(args, out, err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

template <typename T>
std::vector<T> load(const std::string& path) {
  const npy::NpyArray a = npy::read_npy(path);
  return npy::elements<T>(a, path);
}

// Writes a VerifyProblem's tensors (packed copies: pitch pads dropped) as a replay directory,
// every scratch and ring buffer included as a pre-filled template.
void write_problem(const VerifyProblem& p, const std::string& dir, ConvLayout layout,
                   const std::vector<int32_t>& accepted) {
  const VerifyCase& c = p.config();
  const int64_t N = p.N(), D = p.D(), S = p.num_slots(), R = p.num_rows(), Ta = p.T_max();
  const int64_t HV = c.HV, H = c.H, K = c.K, V = c.V, L = c.L, W1 = kConvHistory;
  Manifest m;
  m.B = c.B;
  m.T = c.T;
  m.H = c.H;
  m.HV = c.HV;
  m.K = c.K;
  m.V = c.V;
  if (c.safe_gate) {
    m.lower_bound = c.lower_bound;
  }
  m.L = c.L;
  m.T_max = p.T_max();
  m.R = p.num_rows();
  m.conv_state_layout = layout;
  m.conv_window_layout = layout;
  auto put = [&](const std::string& name, const std::vector<int64_t>& shape, const auto& values) {
    npy::write_npy(dir + "/" + name + ".npy", shape, values);
    m.tensors[name] = name + ".npy";
  };
  const bool sdw = layout == ConvLayout::kSDW;
  put("mixed_qkv", {N, D}, p.qkv());
  put("a", {N, HV * K}, p.a());
  put("b", {N, HV}, p.b());
  put("A_log", {HV}, p.A_log());
  put("dt_bias", {HV * K}, p.dt_bias());
  if (c.wtype == ConvWeightType::kF32) {
    put("conv_weight", {D, kConvWidth}, p.get<float>(Tensor::kConvWeight));
    if (c.bias) {
      put("conv_bias", {D}, p.get<float>(Tensor::kConvBias));
    }
  } else {
    put("conv_weight", {D, kConvWidth}, p.get<bf16_t>(Tensor::kConvWeight));
    if (c.bias) {
      put("conv_bias", {D}, p.get<bf16_t>(Tensor::kConvBias));
    }
  }
  put("conv_state", sdw ? std::vector<int64_t>{S, D, W1} : std::vector<int64_t>{S, W1, D},
      sdw ? transpose_last2(p.conv_state(), S, W1, D) : p.conv_state());
  put("ssm_state", {S, HV, V, K}, p.ssm_state());
  put("slots", {c.B}, p.slots());
  put("rows", {c.B}, p.rows());
  put("accepted", {c.B}, accepted);
  put("conv_window", sdw ? std::vector<int64_t>{R, Ta, D, W1} : std::vector<int64_t>{R, Ta, W1, D},
      sdw ? transpose_last2(p.conv_window(), R * Ta, W1, D) : p.conv_window());
  put("snapshots", {R, Ta, HV, V, K}, p.snapshots());
  put("ring_rawv", {S, HV, L, V}, p.rawv());
  put("ring_rawk", {S, H, L, K}, p.rawk());
  put("ring_g", {S, HV, L, K}, p.ring_g());
  put("ring_beta", {S, HV, L}, p.ring_beta());
  std::ofstream(dir + "/" + kManifestFile) << manifest_to_json(m);
}

struct RoundTripCase {
  VerifyCase c;
  ConvLayout layout;
};

std::vector<RoundTripCase> round_trip_cases() {
  std::vector<RoundTripCase> cases;
  // padding request, reversed slots/rows, T_max > T
  VerifyCase a = testing::make_case(3, 4, 1, 2, 64, 32, RecordMode::kRing, 81);
  a.bias = true;
  a.neg_slot = true;
  a.reversed = true;
  a.T_max = 5;
  cases.push_back({a, ConvLayout::kSWD});
  // safe gate, bf16 weights, padded pitches in the direct run, SGLang layout
  VerifyCase b = testing::make_case(2, 3, 2, 4, 128, 16, RecordMode::kRing, 82);
  b.bias = true;
  b.safe_gate = true;
  b.wtype = ConvWeightType::kBF16;
  b.pitch_pad = 3;
  b.qkv_pad = 2;
  b.L = 8;
  cases.push_back({b, ConvLayout::kSDW});
  VerifyCase d;  // single request, no bias, L == T
  d.B = 1;
  d.T = 4;
  d.L = 4;
  d.seed = 83;
  cases.push_back({d, ConvLayout::kSWD});
  return cases;
}

TEST_CASE("replay: host replay of written files is bitwise equal to the direct host kernel set",
          "[tools][replay]") {
  const RoundTripCase rc = GENERATE(from_range(round_trip_cases()));
  const std::string mode_name = GENERATE(as<std::string>{}, "ring", "snapshot");
  const std::string path = GENERATE(as<std::string>{}, "fused", "unfused");
  const RecordMode mode = parse_record_mode(mode_name, "mode");
  CAPTURE(rc.c, conv_layout_name(rc.layout), mode_name, path);

  VerifyCase c = rc.c;
  c.mode = mode;
  const VerifyProblem base(c, Device::host());
  std::vector<int32_t> accepted;
  for (int n = 0; n < c.B; ++n) {
    accepted.push_back(1 + (n * 2 + 1) % c.T);
  }
  const std::string in = temp_dir("rt_in"), out = temp_dir("rt_out");
  write_problem(base, in, rc.layout, accepted);

  // Direct: the same tensors (padded pitches and all) through the host KernelSet.
  VerifyProblem direct = base.clone_to(Device::host());
  auto kernels = make_host_kernel_set();
  if (path == "fused") {
    kernels->verify_fused(direct.params(mode), 32, nullptr);
  } else {
    kernels->verify_unfused(direct.params(mode), nullptr);
  }
  const Buffer acc = testing::make_buffer(accepted, Device::host());
  kernels->commit(direct.commit_params(acc, mode), nullptr);

  // Replay: files -> kda_replay -> files.
  const CliResult r =
      cli({"--in", in, "--out", out, "--device", "host", "--path", path, "--mode", mode_name});
  INFO(r.out << r.err);
  REQUIRE(r.code == kExitOk);

  const bool sdw = rc.layout == ConvLayout::kSDW;
  const int64_t D = base.D(), W1 = kConvHistory;
  const int64_t RTa = int64_t{base.num_rows()} * base.T_max();
  CHECK(bitwise_equal(load<bf16_t>(out + "/output.npy"), direct.out()));
  std::vector<bf16_t> window = load<bf16_t>(out + "/conv_window.npy");
  CHECK(bitwise_equal(sdw ? transpose_last2(window, RTa, D, W1) : window, direct.conv_window()));
  if (mode == RecordMode::kRing) {
    CHECK(bitwise_equal(load<bf16_t>(out + "/ring_rawv.npy"), direct.rawv()));
    CHECK(bitwise_equal(load<bf16_t>(out + "/ring_rawk.npy"), direct.rawk()));
    CHECK(bitwise_equal(load<float>(out + "/ring_g.npy"), direct.ring_g()));
    CHECK(bitwise_equal(load<float>(out + "/ring_beta.npy"), direct.ring_beta()));
    CHECK_FALSE(fs::exists(out + "/snapshots.npy"));
  } else {
    CHECK(bitwise_equal(load<float>(out + "/snapshots.npy"), direct.snapshots()));
    CHECK_FALSE(fs::exists(out + "/ring_g.npy"));
  }
  CHECK(bitwise_equal(load<float>(out + "/ssm_state.npy"), direct.ssm_state()));
  std::vector<bf16_t> conv = load<bf16_t>(out + "/conv_state.npy");
  CHECK(npy::read_npy(out + "/conv_state.npy").shape ==
        (sdw ? std::vector<int64_t>{base.num_slots(), D, W1}
             : std::vector<int64_t>{base.num_slots(), W1, D}));
  CHECK(bitwise_equal(sdw ? transpose_last2(conv, base.num_slots(), D, W1) : conv,
                      direct.conv_state()));
  CHECK_THAT(r.out, Contains("path " + path));
  CHECK(fs::exists(out + "/summary.json"));
}

TEST_CASE("replay: ragged and tree captures (contract §8) replay with the bitwise contract",
          "[tools][replay]") {
  // A ragged capture: fused and unfused give the same bits (every tensor, the commit's too). A
  // tree capture: the fused path refuses it, and ring-mode and snapshot-mode commits of the
  // same accepted paths give the same committed state. A dense capture's files replayed as a
  // ragged one with every length T give the dense bits.
  const std::string shape = GENERATE(as<std::string>{}, "ragged", "tree");
  CAPTURE(shape);
  const std::string ex = temp_dir("sh_ex"), o1 = temp_dir("sh_o1"), o2 = temp_dir("sh_o2");
  ExampleOptions eo;
  eo.B = 3;
  eo.T = 4;
  eo.prefill = true;
  eo.pad_request = true;
  eo.draft_shape = shape;
  make_example(ex, eo);
  if (shape == "ragged") {
    CHECK(npy::read_npy(ex + "/mixed_qkv.npy").shape[0] == 4 + 3 + 2);
    REQUIRE(cli({"--in", ex, "--out", o1, "--device", "host", "--path", "unfused"}).code == 0);
    const CliResult r =
        cli({"--in", ex, "--out", o2, "--device", "host", "--path", "fused", "--compare", o1});
    INFO(r.out << r.err);
    CHECK(r.code == kExitOk);
    CHECK_THAT(r.out, Contains("bitwise equal") && Contains("-> OK"));
  } else {
    const CliResult fused = cli({"--in", ex, "--out", o1, "--device", "host", "--path", "fused"});
    CHECK(fused.code != kExitOk);
    CHECK_THAT(fused.err, Contains("the fused path verifies chains"));
    const CliResult ring =
        cli({"--in", ex, "--out", o1, "--device", "host", "--path", "auto", "--mode", "ring"});
    INFO(ring.out << ring.err);
    REQUIRE(ring.code == kExitOk);
    CHECK_THAT(ring.out, Contains("a tree draft"));
    REQUIRE(cli({"--in", ex, "--out", o2, "--device", "host", "--mode", "snapshot"}).code == 0);
    for (const char* t : {"ssm_state", "conv_state", "output"}) {
      CAPTURE(t);
      CHECK(npy::read_npy(o1 + "/" + t + ".npy").bytes ==
            npy::read_npy(o2 + "/" + t + ".npy").bytes);
    }
  }
  // Dense files plus query_start_loc = [0, T, 2T, ...]: the dense replay's bits.
  const std::string dense = temp_dir("sh_dense"), d1 = temp_dir("sh_d1"), d2 = temp_dir("sh_d2");
  eo.draft_shape = "chain";
  make_example(dense, eo);
  REQUIRE(cli({"--in", dense, "--out", d1, "--device", "host"}).code == 0);
  Manifest m = read_manifest(dense);
  npy::write_npy(dense + "/query_start_loc.npy", {4}, std::vector<int32_t>{0, 4, 8, 12});
  m.tensors["query_start_loc"] = "query_start_loc.npy";
  std::ofstream(dense + "/" + kManifestFile) << manifest_to_json(m);
  const CliResult r = cli({"--in", dense, "--out", d2, "--device", "host", "--compare", d1});
  INFO(r.out << r.err);
  CHECK(r.code == kExitOk);
}

TEST_CASE("replay: --compare reports a planted single-element difference and its index",
          "[tools][replay]") {
  const std::string ex = temp_dir("cmp_ex"), o1 = temp_dir("cmp_o1"), o2 = temp_dir("cmp_o2");
  const std::string ref = temp_dir("cmp_ref");
  ExampleOptions eo;
  eo.B = 2;
  eo.T = 3;
  eo.prefill = true;
  eo.pad_request = true;
  make_example(ex, eo);
  REQUIRE(cli({"--in", ex, "--out", o1, "--device", "host", "--path", "unfused"}).code == 0);

  // fused vs unfused on the host: the bitwise contract holds.
  const CliResult same =
      cli({"--in", ex, "--out", o2, "--device", "host", "--path", "fused", "--compare", o1});
  INFO(same.out << same.err);
  REQUIRE(same.code == kExitOk);
  CHECK_THAT(same.out, Contains("8 tensors: 8 bitwise equal") && Contains("-> OK"));

  // Plant one 1-ulp difference in the reference's ring_g.
  fs::copy(o1, ref, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  npy::NpyArray g = npy::read_npy(ref + "/ring_g.npy");
  const int64_t flat = 1234;
  uint32_t bits;
  std::memcpy(&bits, g.bytes.data() + 4 * flat, 4);
  bits += 1;
  std::memcpy(g.bytes.data() + 4 * flat, &bits, 4);
  npy::write_npy(ref + "/ring_g.npy", g.type, g.shape, g.bytes.data());
  // ring_g is [S, HV, L, K] = [4, 4, 16, 64]: 1234 = ((0*4 + 1)*16 + 3)*64 + 18.
  REQUIRE(g.shape == std::vector<int64_t>{4, 4, 16, 64});

  SECTION("bitwise: exit 1, the tensor, counts and the first index") {
    const CliResult r = cli({"--out", o2, "--compare", ref});
    INFO(r.out << r.err);
    CHECK(r.code == kExitCompareFailed);
    CHECK_THAT(r.out, Contains("ring_g") && Contains("DIFFERS: 1 of 16384 elements differ") &&
                          Contains("max ulp diff 1") &&
                          Contains("first at [0, 1, 3, 18] (flat 1234)") &&
                          Contains("FAIL (bitwise contract violated: ring_g)"));
    const CompareReport report = compare_dirs(o2, ref, Expect::kBitwise);
    const TensorComparison* t = report.find("ring_g");
    REQUIRE(t != nullptr);
    CHECK(t->status == CompareStatus::kDiffers);
    CHECK(t->failed);
    CHECK(t->num_diff == 1);
    CHECK(t->first_diff == flat);
    CHECK(t->first_index == std::vector<int64_t>{0, 1, 3, 18});
    CHECK(t->max_ulp_diff == 1);
    CHECK(report.failures == 1);
    CHECK(report.find("output")->status == CompareStatus::kEqual);
  }
  SECTION("close: one f32 ulp is within the contract tolerance") {
    const CliResult r = cli({"--out", o2, "--compare", ref, "--expect", "close"});
    CHECK(r.code == kExitOk);
    CHECK_THAT(r.out, Contains("within tolerance"));
  }
  SECTION("close: a large difference in a bf16 output fails") {
    npy::NpyArray o = npy::read_npy(ref + "/output.npy");
    o.bytes[2 * 5 + 1] ^= 0x40;  // element 5: flip an exponent bit
    npy::write_npy(ref + "/output.npy", o.type, o.shape, o.bytes.data());
    const CliResult r = cli({"--out", o2, "--compare", ref, "--expect", "close"});
    CHECK(r.code == kExitCompareFailed);
    CHECK_THAT(r.out, Contains("DIFFERS beyond tolerance") && Contains("(flat 5)") &&
                          Contains("beyond contract tolerance: output"));
  }
  SECTION("tensors missing in the reference are skipped") {
    fs::remove(ref + "/ring_g.npy");
    fs::remove(ref + "/conv_state.npy");
    const CliResult r = cli({"--out", o2, "--compare", ref});
    CHECK(r.code == kExitOk);
    CHECK_THAT(r.out, Contains("skipped: not in the reference dir") && Contains("2 skipped"));
  }
  SECTION("a shape mismatch fails") {
    npy::write_npy(ref + "/output.npy", {2}, std::vector<bf16_t>(2));
    const CliResult r = cli({"--out", o2, "--compare", ref});
    CHECK(r.code == kExitCompareFailed);
    CHECK_THAT(r.out, Contains("MISMATCH: reference is bf16[2]"));
  }
}

TEST_CASE("replay: --path auto reports the dispatcher's choice and reason", "[tools][replay]") {
  struct Case {
    int B;
    const char* mode;
    const char* platform;
    VerifyPath path;
    DispatchReason reason;
  };
  const Case c = GENERATE(values<Case>({
      {1, "ring", "sm90", VerifyPath::kFused, DispatchReason::kRingFused},
      {1, "ring", "other", VerifyPath::kUnfused, DispatchReason::kRingPlatformUnmeasured},
      {2, "ring", "sm100", VerifyPath::kUnfused, DispatchReason::kRingBatchAboveLimit},
      {2, "snapshot", "other", VerifyPath::kFused, DispatchReason::kSnapshotFused},
  }));
  CAPTURE(c.B, c.mode, c.platform);
  const std::string ex = temp_dir("auto_ex"), out = temp_dir("auto_out");
  ExampleOptions eo;
  eo.B = c.B;
  eo.T = 2;
  eo.H = 1;
  eo.HV = 1;
  make_example(ex, eo);
  const CliResult r = cli({"--in", ex, "--out", out, "--device", "host", "--mode", c.mode,
                           "--pretend-platform", c.platform});
  INFO(r.out << r.err);
  REQUIRE(r.code == kExitOk);
  std::ifstream f(out + "/summary.json");
  const std::string summary((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  CHECK_THAT(summary,
             Contains(fmt::format("\"path\": \"{}\"", verify_path_name(c.path))) &&
                 Contains(fmt::format("\"reason\": \"{}\"", dispatch_reason_name(c.reason))) &&
                 Contains("\"path_requested\": \"auto\""));
}

TEST_CASE("replay: SGLang's transposed conv layout replays like the contract layout",
          "[tools][replay]") {
  ExampleOptions eo;
  eo.seed = 5;
  eo.prefill = true;
  const std::string swd = temp_dir("swd"), sdw = temp_dir("sdw");
  make_example(swd, eo);
  eo.conv_layout = ConvLayout::kSDW;
  make_example(sdw, eo);
  const ReplayProblem a = load_problem(swd), b = load_problem(sdw);
  CHECK(bitwise_equal(a.conv_state, b.conv_state));
  CHECK(bitwise_equal(a.conv_window, b.conv_window));
  RunOptions o;
  const RunResult ra = run_replay(a, o), rb = run_replay(b, o);
  CHECK(bitwise_equal(ra.find("output")->as<bf16_t>(), rb.find("output")->as<bf16_t>()));
  const OutputTensor* ca = ra.find("conv_state");
  const OutputTensor* cb = rb.find("conv_state");
  REQUIRE((ca != nullptr && cb != nullptr));
  CHECK(cb->shape == std::vector<int64_t>{ca->shape[0], ca->shape[2], ca->shape[1]});
  CHECK(bitwise_equal(transpose_last2(cb->as<bf16_t>(), cb->shape[0], cb->shape[1], cb->shape[2]),
                      ca->as<bf16_t>()));
}

TEST_CASE("replay: bad inputs fail before any kernel runs, naming the file", "[tools][replay]") {
  const std::string ex = temp_dir("bad_ex"), out = temp_dir("bad_out");
  ExampleOptions eo;  // B=2 T=4 H=2 HV=4 K=64 V=64: N = 8, D = 512
  make_example(ex, eo);
  auto manifest = [&] {
    std::ifstream f(ex + "/" + kManifestFile);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  auto set_manifest = [&](const std::string& text) {
    std::ofstream(ex + "/" + kManifestFile) << text;
  };
  auto run = [&] { return cli({"--in", ex, "--out", out, "--device", "host"}); };

  SECTION("wrong shape of an input") {
    npy::write_npy(ex + "/mixed_qkv.npy", {8, 500}, std::vector<bf16_t>(8 * 500));
    const CliResult r = run();
    CHECK(r.code == kExitError);
    CHECK_THAT(r.err, Contains(ex + "/mixed_qkv.npy: shape is [8, 500], expected [8, 512] "
                                    "(N = B*T (ragged: qsl[B]), D = 2*H*K + HV*V)"));
  }
  SECTION("wrong dtype of an input") {
    npy::write_npy(ex + "/A_log.npy", {4}, std::vector<bf16_t>(4));
    CHECK_THAT(run().err, Contains(ex + "/A_log.npy: dtype is bf16 ('<u2'), expected f32"));
  }
  SECTION("slot out of range") {
    npy::write_npy(ex + "/slots.npy", {2}, std::vector<int32_t>{0, 4});
    CHECK_THAT(run().err, Contains("slots[1] = 4 out of range [0, S = 4)"));
  }
  SECTION("manifest without lower_bound") {
    std::string text = manifest();
    text.replace(text.find("\"lower_bound\""), std::string("\"lower_bound\"").size(), "\"_lb\"");
    set_manifest(text);
    CHECK_THAT(run().err, Contains("missing \"lower_bound\""));
  }
  SECTION("manifest with an unknown key") {
    std::string text = manifest();
    text.replace(text.find("\"lower_bound\""), std::string("\"lower_bound\"").size(),
                 "\"lowerbound\"");
    set_manifest(text);
    CHECK_THAT(run().err, Contains("unknown key \"lowerbound\""));
  }
  SECTION("usage errors") {
    CHECK(cli({"--in", ex, "--out", ex}).code == kExitError);
    CHECK_THAT(cli({"--in", ex, "--out", ex}).err, Contains("is the input directory"));
    CHECK_THAT(cli({"--bogus"}).err, Contains("unknown option --bogus"));
    CHECK_THAT(cli({"--in", ex, "--out", out, "--block-v", "12"}).err,
               Contains("--block-v: 12 unsupported"));
    CHECK_THAT(cli({"--B", "3"}).err, Contains("--B is a --make-example option"));
    CHECK(cli({"--help"}).code == kExitOk);
    CHECK_THAT(cli({"--help"}).out, Contains("\"conv_state_layout\"") && Contains("'<u2'"));
  }
}

}  // namespace
}  // namespace kda::replay
