// host_commit_test.cc: fold, snapshot commit and conv commit of the host reference.
#include <fmt/format.h>
#include <algorithm>
#include <catch2/catch.hpp>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/ref/kda_host.h"
#include "tests/error_message.h"
#include "tests/test_problem.h"

using namespace kda;
using namespace kda::testing;

namespace {

std::vector<VerifyCase> commit_cases() {
  std::vector<VerifyCase> cases;
  VerifyCase a = make_case(3, 5, 1, 2, 64, 64, RecordMode::kRing, 801);
  a.reversed = true;
  a.neg_slot = true;
  a.bias = true;
  cases.push_back(a);
  VerifyCase b = make_case(2, 8, 2, 4, 128, 32, RecordMode::kRing, 802);
  b.safe_gate = true;
  b.wtype = ConvWeightType::kBF16;
  b.pitch_pad = 5;
  b.L = 8;
  b.T_max = 9;
  cases.push_back(b);
  cases.push_back(make_case(1, 1, 1, 1, 64, 64, RecordMode::kRing, 803));
  VerifyCase d = make_case(2, 4, 1, 1, 64, 16, RecordMode::kRing, 804);
  d.L = 4;  // L == T: the pool's L >= 2T is a pool rule; fold needs only L >= T
  d.qkv_pad = 3;
  cases.push_back(d);
  return cases;
}

VerifyProblem verified(const VerifyProblem& base, RecordMode mode, bool fused) {
  VerifyProblem p = base.clone_to(Device::host());
  if (fused) {
    host::verify_fused(p.params(mode));
  } else {
    host::verify_unfused(p.params(mode));
  }
  return p;
}

// The committed SSM state the contract demands: slot s_i <- snapshot[row_i][n_i - 1] for the
// real requests with a valid n_i, every other slot untouched (pads included).
VerifyProblem expected_state(const VerifyProblem& base, const VerifyProblem& snap,
                             const std::vector<int32_t>& accepted) {
  const int64_t state = base.state_elems(), Ta = base.T_max();
  const auto slots = base.slots();
  const auto rows = base.rows();
  const auto snapshots = snap.snapshots();
  auto want = base.ssm_state();
  for (int i = 0; i < base.config().B; ++i) {
    const int32_t n = accepted[static_cast<size_t>(i)];
    if (slots[i] >= 0 && n >= 1 && n <= base.config().T) {
      std::copy_n(snapshots.begin() + (rows[i] * Ta + n - 1) * state, state,
                  want.begin() + slots[i] * state);
    }
  }
  VerifyProblem e = base.clone_to(Device::host());
  e.set(Tensor::kSsmState, want);
  return e;
}

// The committed conv state from first principles: the last W-1 rows of
// concat(conv_state[slot], x[0:n]) for the real requests with a valid n.
VerifyProblem expected_conv(const VerifyProblem& base, const std::vector<int32_t>& accepted) {
  const VerifyCase& c = base.config();
  const int64_t D = base.D(), window = kConvHistory * D;
  const auto slots = base.slots();
  const auto qkv = base.qkv();
  auto want = base.conv_state();
  for (int i = 0; i < c.B; ++i) {
    const int32_t n = accepted[static_cast<size_t>(i)];
    if (slots[i] < 0 || n < 1 || n > c.T) {
      continue;
    }
    std::vector<bf16_t> history(want.begin() + slots[i] * window,
                                want.begin() + (slots[i] + 1) * window);
    history.insert(history.end(), qkv.begin() + static_cast<int64_t>(i) * c.T * D,
                   qkv.begin() + (static_cast<int64_t>(i) * c.T + n) * D);
    std::copy(history.end() - window, history.end(), want.begin() + slots[i] * window);
  }
  VerifyProblem e = base.clone_to(Device::host());
  e.set(Tensor::kConvState, want);
  return e;
}

}  // namespace

TEST_CASE("host commit: fold(ring, n) equals snapshot n-1 bitwise, every n in 1..T",
          "[host][commit]") {
  const VerifyCase c = GENERATE(from_range(commit_cases()));
  CAPTURE(c);
  const VerifyProblem base(c);
  // Rings from the fused path, snapshots from the unfused one: the fold must not care.
  const VerifyProblem snap = verified(base, RecordMode::kSnapshot, /*fused=*/false);
  const VerifyProblem ring = verified(base, RecordMode::kRing, /*fused=*/true);
  std::vector<std::vector<int32_t>> variants;
  for (int n = 1; n <= c.T; ++n) {
    variants.emplace_back(static_cast<size_t>(c.B), n);
  }
  std::vector<int32_t> mixed(static_cast<size_t>(c.B));
  for (int i = 0; i < c.B; ++i) {
    mixed[static_cast<size_t>(i)] = 1 + (3 * i + 1) % c.T;
  }
  variants.push_back(mixed);
  for (const auto& accepted : variants) {
    CAPTURE(accepted);
    VerifyProblem folded = ring.clone_to(Device::host());
    const Buffer acc = make_buffer(accepted, Device::host());
    host::fold(folded.commit_params(acc, RecordMode::kRing));
    const VerifyProblem want = expected_state(base, snap, accepted);
    REQUIRE(bitwise_equal(folded.raw(Tensor::kSsmState), want.raw(Tensor::kSsmState)));
    // The fold reads the rings and writes nothing but the state.
    REQUIRE(bitwise_equal(folded.raw(Tensor::kConvState), base.raw(Tensor::kConvState)));
    REQUIRE(bitwise_equal(folded.raw(Tensor::kRingRawk), ring.raw(Tensor::kRingRawk)));
  }
}

TEST_CASE("host commit: both modes commit the state of token n-1 and the conv oracle",
          "[host][commit]") {
  const VerifyCase c = GENERATE(from_range(commit_cases()));
  CAPTURE(c);
  const VerifyProblem base(c);
  const VerifyProblem snap = verified(base, RecordMode::kSnapshot, /*fused=*/true);
  std::vector<int32_t> accepted(static_cast<size_t>(c.B));
  for (int i = 0; i < c.B; ++i) {
    accepted[static_cast<size_t>(i)] = c.T - (i % c.T);
  }
  CAPTURE(accepted);
  const VerifyProblem want_state = expected_state(base, snap, accepted);
  const VerifyProblem want_conv = expected_conv(base, accepted);
  for (const RecordMode mode : {RecordMode::kSnapshot, RecordMode::kRing}) {
    CAPTURE(static_cast<int>(mode));
    VerifyProblem p = verified(base, mode, /*fused=*/false);
    const Buffer acc = make_buffer(accepted, Device::host());
    int32_t flag = 0;
    CommitParams q = p.commit_params(acc, mode);
    q.error_flag = &flag;
    host::commit(q);
    CHECK(flag == 0);
    // Ring and snapshot mode commit the same bits (contract §3 bitwise contract).
    REQUIRE(bitwise_equal(p.raw(Tensor::kSsmState), want_state.raw(Tensor::kSsmState)));
    REQUIRE(bitwise_equal(p.raw(Tensor::kConvState), want_conv.raw(Tensor::kConvState)));
  }
  SECTION("the pieces: commit_snapshot, commit_conv") {
    VerifyProblem p = snap.clone_to(Device::host());
    const Buffer acc = make_buffer(accepted, Device::host());
    host::commit_snapshot(p.commit_params(acc, RecordMode::kSnapshot));
    REQUIRE(bitwise_equal(p.raw(Tensor::kSsmState), want_state.raw(Tensor::kSsmState)));
    REQUIRE(bitwise_equal(p.raw(Tensor::kConvState), base.raw(Tensor::kConvState)));
    host::commit_conv(p.commit_params(acc, RecordMode::kSnapshot));
    REQUIRE(bitwise_equal(p.raw(Tensor::kConvState), want_conv.raw(Tensor::kConvState)));
  }
}

TEST_CASE("host commit: an accepted length outside [1, T] skips the request, sets the flag",
          "[host][commit]") {
  VerifyCase c = make_case(4, 3, 1, 2, 64, 32, RecordMode::kRing, 901);
  c.neg_slot = true;  // request 1 is padding: its accepted length is garbage, not an error
  const VerifyProblem base(c);
  const RecordMode mode = GENERATE(RecordMode::kSnapshot, RecordMode::kRing);
  CAPTURE(static_cast<int>(mode));
  const VerifyProblem snap = verified(base, RecordMode::kSnapshot, false);
  const VerifyProblem run = verified(base, mode, false);

  const std::vector<int32_t> accepted{0, -5, 2, c.T + 1};
  const Buffer acc = make_buffer(accepted, Device::host());
  VerifyProblem p = run.clone_to(Device::host());
  int32_t flag = 0;
  CommitParams q = p.commit_params(acc, mode);
  q.error_flag = &flag;
  host::commit(q);
  CHECK(flag == 1);
  // Only request 2 committed.
  REQUIRE(bitwise_equal(p.raw(Tensor::kSsmState),
                        expected_state(base, snap, accepted).raw(Tensor::kSsmState)));
  REQUIRE(bitwise_equal(p.raw(Tensor::kConvState),
                        expected_conv(base, accepted).raw(Tensor::kConvState)));

  // Without a flag the same requests are skipped, silently.
  VerifyProblem quiet = run.clone_to(Device::host());
  host::commit(quiet.commit_params(acc, mode));
  REQUIRE(bitwise_equal(quiet.raw(Tensor::kSsmState), p.raw(Tensor::kSsmState)));

  // A garbage length on the padding request alone does not raise the flag.
  const Buffer pad_only = make_buffer({1, 99, 3, 2}, Device::host());
  VerifyProblem ok = run.clone_to(Device::host());
  flag = 0;
  q = ok.commit_params(pad_only, mode);
  q.error_flag = &flag;
  host::commit(q);
  CHECK(flag == 0);
}

TEST_CASE("host commit: all layers, each at its own layer pitch", "[host][commit]") {
  const RecordMode mode = GENERATE(RecordMode::kSnapshot, RecordMode::kRing);
  CAPTURE(static_cast<int>(mode));
  VerifyCase c = make_case(2, 4, 1, 2, 64, 32, RecordMode::kRing, 1001);
  c.reversed = true;
  std::vector<VerifyProblem> layers;
  for (const uint64_t seed : {1001u, 1002u, 1003u}) {
    c.seed = seed;
    layers.push_back(verified(VerifyProblem(c), mode, true));
  }
  const std::vector<int32_t> accepted{3, 1};
  const Buffer acc = make_buffer(accepted, Device::host());

  // The pool layout: each tensor of the three layers back to back (packed: no pitch_pad).
  auto stack_bf16 = [&](Tensor t) {
    std::vector<bf16_t> all;
    for (const auto& l : layers) {
      const auto v = l.get<bf16_t>(t);
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  };
  auto stack_f32 = [&](Tensor t) {
    std::vector<float> all;
    for (const auto& l : layers) {
      const auto v = l.get<float>(t);
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  };
  auto ssm = stack_f32(Tensor::kSsmState);
  auto conv = stack_bf16(Tensor::kConvState);
  auto window = stack_bf16(Tensor::kConvWindow);
  const auto snapshots = stack_f32(Tensor::kSnapshots);
  auto rawv = stack_bf16(Tensor::kRingRawv);
  auto rawk = stack_bf16(Tensor::kRingRawk);
  auto g = stack_f32(Tensor::kRingG);
  auto beta = stack_f32(Tensor::kRingBeta);

  CommitParams q = layers[0].commit_params(acc, mode);
  q.num_layers = 3;
  q.ssm_state = ssm.data();
  q.conv_state = conv.data();
  q.conv_window = window.data();
  if (mode == RecordMode::kSnapshot) {
    q.snapshots = snapshots.data();
  } else {
    q.ring_rawv = rawv.data();
    q.ring_rawk = rawk.data();
    q.ring_g = g.data();
    q.ring_beta = beta.data();
  }
  host::commit(q);

  for (size_t l = 0; l < layers.size(); ++l) {
    CAPTURE(l);
    VerifyProblem single = layers[l].clone_to(Device::host());
    host::commit(single.commit_params(acc, mode));
    const auto want_ssm = single.ssm_state();
    const auto want_conv = single.conv_state();
    REQUIRE(bitwise_equal(slice(ssm, l * want_ssm.size(), want_ssm.size()), want_ssm));
    REQUIRE(bitwise_equal(slice(conv, l * want_conv.size(), want_conv.size()), want_conv));
  }
}

TEST_CASE("host commit: invalid params throw kda::Error naming the field", "[host][commit]") {
  VerifyCase c = make_case(2, 6, 1, 2, 64, 32, RecordMode::kRing, 1101);
  c.L = 4;
  const VerifyProblem base(c);
  VerifyProblem p = base.clone_to(Device::host());
  const Buffer acc = make_buffer({1, 2}, Device::host());
  const CommitParams ring = p.commit_params(acc, RecordMode::kRing);
  CHECK(error_message([&] { host::fold(ring); }) ==
        "kda::host::fold: L=4 is smaller than T=6: steps t >= L have no ring records");
  CHECK(error_message([&] { host::commit(ring); }) ==
        "kda::host::commit: L=4 is smaller than T=6: steps t >= L have no ring records");
  CommitParams q = p.commit_params(acc, RecordMode::kSnapshot);
  q.num_layers = 0;
  CHECK(error_message([&] { host::commit(q); }) == "kda::host::commit: num_layers=0 must be >= 1");
  q = p.commit_params(acc, RecordMode::kSnapshot);
  q.num_layers = 2;
  q.ssm_layer_stride = 100;
  CHECK(error_message([&] { host::commit_snapshot(q); }) ==
        fmt::format("kda::host::commit_snapshot: ssm_layer_stride=100 is smaller than 4 x {} = "
                    "{}: layers would overlap",
                    q.ssm_slot_stride, 4 * q.ssm_slot_stride));
  q = p.commit_params(acc, RecordMode::kSnapshot);
  q.conv_window = nullptr;
  CHECK(error_message([&] { host::commit_conv(q); }) ==
        "kda::host::commit_conv: conv_window is null, expected a pointer ([layers, R, "
        "T_max, W-1, D] bf16)");
  q = p.commit_params(acc, RecordMode::kSnapshot);
  q.accepted = nullptr;
  CHECK(error_message([&] { host::commit(q); }) ==
        "kda::host::commit: accepted is null, expected a pointer ([B] accepted lengths)");
  p.set(Tensor::kSlots, std::vector<int32_t>{2, 2});
  CHECK(error_message([&] { host::commit(p.commit_params(acc, RecordMode::kSnapshot)); }) ==
        "kda::host::commit: slots[0] and slots[1] are both 2: two requests would write one slot");
  // Nothing was written by any failed call.
  REQUIRE(bitwise_equal(p.raw(Tensor::kSsmState), base.raw(Tensor::kSsmState)));
  REQUIRE(bitwise_equal(p.raw(Tensor::kConvState), base.raw(Tensor::kConvState)));
}
