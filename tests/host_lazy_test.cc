// host_lazy_test.cc: the lazy write-back of the host reference (contract §11; kda_host.h: a lazy
// verify, VerifyParams::lazy, and CommitKind::kLazy):
//  (a) a lazy verify's outputs over a pending history of every length P = 0..L - T satisfy §10
//      against the exact path on the materialized state: >= 99.9% of bf16 outputs bitwise equal,
//      none more than 1 ulp apart, rel L2 against the fp64 oracle <= 1.25x the exact path's
//      (both gates, GQA, K = 64 and 128, V = 128 and 48, T = 1..8, dense and ragged chains,
//      padding requests, reversed slots, input scales x0.1 .. x4);
//  (b) its records and windows bitwise the exact path's, the committed state and the history's
//      records untouched;
//  (c) rounds of lazy verifies and lazy commits (random accepted lengths, bad ones, ragged
//      rounds, prefix-cache tracks, a fold interval, materialize part-way) equal eager rounds
//      bitwise after materialize, and hold every pending count <= L - T_max;
//  (d) each planted error fails: the history skipping its first step (a), a fold triggered one
//      step late and a pending step counted twice (c);
// and the lazy domain's errors.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/kernel_set.h"
#include "kernels/ref/fast_ref_testing.h"
#include "kernels/ref/kda_host.h"
#include "tests/error_message.h"
#include "tests/lazy_history.h"
#include "tests/output_compare.h"
#include "tests/test_problem.h"

using namespace kda;
using namespace kda::testing;
using kda::host::testing::ChunkFault;
using kda::host::testing::LazyFault;

namespace {

constexpr int kL = kFastMaxChunk;  // the lazy ring: one fast chunk
constexpr double kMaxErrorRatio = 1.25;
constexpr double kErrorFloor = 1e-12;

struct Shape {
  int B = 4, T = 4, H = 2, HV = 4, K = 128, V = 128;
  bool safe_gate = false, ragged = false, padding = false, reversed = false;
  float scale = 1.0f;
  uint64_t seed = 1;
};

std::string describe(const Shape& s, int P) {
  std::ostringstream os;
  os << "B=" << s.B << " T=" << s.T << " H=" << s.H << " HV=" << s.HV << " K=" << s.K
     << " V=" << s.V << " gate=" << (s.safe_gate ? "safe" : "standard") << " ragged=" << s.ragged
     << " padding=" << s.padding << " reversed=" << s.reversed << " scale=" << s.scale
     << " seed=" << s.seed << " P=" << P;
  return os.str();
}

template <typename E>
void scale_all(VerifyProblem& p, Tensor t, float s) {
  std::vector<E> x = p.get<E>(t);
  for (E& e : x) {
    if constexpr (std::is_same_v<E, bf16_t>) {
      e = float_to_bf16(bf16_to_float(e) * s);
    } else {
      e = e * s;
    }
  }
  p.set(t, x);
}

// A ring-mode problem (L = 16, T_max = T) whose real slots each hold P pending steps before a
// random cursor (write_history), the rings' garbage elsewhere.
struct LazyProblem {
  VerifyProblem problem;
  std::vector<int32_t> cursor, pending;  ///< [S] host arrays (the params point at them)
  std::vector<int32_t> offsets;          ///< ragged [B + 1], or empty
  std::vector<int64_t> first;            ///< [B] first token row per request
  std::vector<int32_t> lengths;          ///< [B] T_n
  int pad = -1;

  VerifyParams lazy_params(VerifyProblem& p) {
    VerifyParams v = p.params(RecordMode::kRing);
    v.numerics = VerifyNumerics::kFast;
    v.ring_cursor = cursor.data();
    v.ring_pending = pending.data();
    v.lazy = 1;
    v.u_free = 1;
    v.token_offsets = offsets.empty() ? nullptr : offsets.data();
    return v;
  }
  /// The rows of the real requests' tokens.
  std::vector<int64_t> real_rows() const {
    std::vector<int64_t> rows;
    for (size_t n = 0; n < first.size(); ++n) {
      for (int t = 0; t < lengths[n] && static_cast<int>(n) != pad; ++t) {
        rows.push_back(first[n] + t);
      }
    }
    return rows;
  }
};

LazyProblem make_lazy(const Shape& s, int P) {
  VerifyCase c = make_case(s.B, s.T, s.H, s.HV, s.K, s.V, RecordMode::kRing, s.seed);
  c.safe_gate = s.safe_gate;
  c.bias = s.seed % 2 == 0;
  c.wtype = s.seed % 3 == 0 ? ConvWeightType::kBF16 : ConvWeightType::kF32;
  c.L = kL;
  c.neg_slot = s.padding && !s.ragged;  // a ragged batch's padding rows: poisoned below
  c.reversed = s.reversed;
  LazyProblem f{VerifyProblem(c), {}, {}, {}, {}, {}, -1};
  if (s.scale != 1.0f) {
    scale_all<float>(f.problem, Tensor::kSsmState, s.scale);
    scale_all<bf16_t>(f.problem, Tensor::kQkv, s.scale);
  }
  f.pad = s.ragged ? -1 : f.problem.pad_request();
  const int S = f.problem.num_slots();
  f.lengths.assign(static_cast<size_t>(s.B), s.T);
  if (s.ragged) {
    f.offsets.push_back(0);
    for (int n = 0; n < s.B; ++n) {
      f.lengths[n] = 1 + static_cast<int>((s.seed * 7 + static_cast<uint64_t>(n) * 13) % s.T);
      f.offsets.push_back(f.offsets.back() + f.lengths[n]);
    }
  }
  for (int n = 0; n < s.B; ++n) {
    f.first.push_back(f.offsets.empty() ? int64_t{n} * s.T : int64_t{f.offsets[n]});
  }
  if (s.padding && s.ragged) {
    // Request 1 pads: slot -1, NaN in its packed rows (nothing of it may be read).
    f.pad = 1;
    std::vector<int32_t> slots = f.problem.slots();
    slots[1] = -1;
    f.problem.set(Tensor::kSlots, slots);
    const bf16_t nan = float_to_bf16(std::numeric_limits<float>::quiet_NaN());
    for (const Tensor t : {Tensor::kQkv, Tensor::kA, Tensor::kB}) {
      std::vector<bf16_t> x = f.problem.get<bf16_t>(t);
      const int64_t width = static_cast<int64_t>(x.size()) / f.problem.N();
      std::fill(x.begin() + f.first[1] * width, x.begin() + (f.first[1] + f.lengths[1]) * width,
                nan);
      f.problem.set(t, x);
    }
  }
  // P pending steps in every real slot of the batch.
  std::vector<int32_t> steps(static_cast<size_t>(S), 0);
  for (const int32_t slot : f.problem.slots()) {
    if (slot >= 0) {
      steps[static_cast<size_t>(slot)] = P;
    }
  }
  const LazyHistory h =
      write_history(f.problem, steps, s.scale, s.seed * 7919 + static_cast<uint64_t>(P));
  f.cursor = h.cursor;
  f.pending = h.pending;
  return f;
}

// The exact path on the lazy problem's materialized state: a clone whose pending steps are
// folded (CommitKind::kMaterialize, u-free), then an exact verify at the same cursors.
VerifyProblem exact_twin(LazyProblem& f) {
  VerifyProblem e = f.problem.clone_to(Device::host());
  std::vector<int32_t> cursor = f.cursor, pending = f.pending;
  const Buffer accepted = make_buffer(std::vector<int32_t>(f.first.size(), 1), Device::host());
  CommitParams m = e.commit_params(accepted, RecordMode::kRing);
  m.kind = CommitKind::kMaterialize;
  m.ring_cursor = cursor.data();
  m.ring_pending = pending.data();
  m.ring_pending_layer_stride = e.num_slots();
  m.u_free = 1;
  host::commit(m);
  VerifyParams v = e.params(RecordMode::kRing);
  v.ring_cursor = f.cursor.data();
  v.token_offsets = f.offsets.empty() ? nullptr : f.offsets.data();
  host::verify_fused(v);
  return e;
}

struct LazyAccuracy {
  OutCompare vs_exact;
  double fast_error = 0.0, exact_error = 0.0;  ///< rel L2 vs the fp64 oracle (dense only)
  bool has_fp64 = false;
  double ratio() const { return fast_error / std::max(exact_error, kErrorFloor); }
  bool ok() const {
    return vs_exact.max_ulp <= kMaxUlp && vs_exact.nonfinite == 0 &&
           (!has_fp64 || ratio() <= kMaxErrorRatio);
  }
};

// One lazy call (`fault` planted) against its exact twin and the fp64 oracle.
LazyAccuracy run_case(const Shape& s, int P, ChunkFault fault = ChunkFault::kNone,
                      VerifyProblem* lazy_out = nullptr, VerifyProblem* exact_out = nullptr) {
  LazyProblem f = make_lazy(s, P);
  VerifyProblem exact = exact_twin(f);
  VerifyProblem lazy = f.problem.clone_to(Device::host());
  const VerifyParams p = f.lazy_params(lazy);
  if (fault == ChunkFault::kNone) {
    std::unique_ptr<KernelSet> ks = make_host_kernel_set();
    const kernels::VerifyPlan plan = ks->plan_verify(p, VerifyPath::kFused, 64);
    REQUIRE(plan.numerics == VerifyNumerics::kFast);
    REQUIRE((plan.features & kernels::kLazyHistory) != 0);
    ks->verify(p, plan, nullptr);
  } else {
    host::testing::verify_fused_fast_with_fault(p, fault);
  }
  const int64_t width = int64_t{s.HV} * s.V;
  LazyAccuracy a;
  a.vs_exact = compare_requests(lazy.out(), exact.out(), f.first, f.lengths, f.pad, s.HV, s.V);
  if (f.offsets.empty()) {
    const host::Fp64Verify oracle = host::verify_fp64(exact.params(RecordMode::kRing), false);
    const std::vector<int64_t> rows = f.real_rows();
    const std::vector<double> want = gather_rows(oracle.out, rows, width);
    a.fast_error = rel_l2(gather_rows(lazy.out(), rows, width), want);
    a.exact_error = rel_l2(gather_rows(exact.out(), rows, width), want);
    a.has_fp64 = true;
  }
  if (lazy_out != nullptr) {
    *lazy_out = std::move(lazy);
    *exact_out = std::move(exact);
  }
  return a;
}

std::vector<Shape> sweep(uint64_t seed) {
  std::vector<Shape> shapes;
  int i = 0;
  for (const int K : {64, 128}) {
    for (const int V : {128, 48}) {
      for (const int T : {1, 2, 4, 8}) {
        Shape s;
        s.K = K;
        s.V = V;
        s.T = T;
        const float scales[] = {0.1f, 1.0f, 4.0f};
        s.scale = scales[i % 3];
        s.safe_gate = (i & 1) != 0;
        s.HV = (i & 2) != 0 ? 2 * s.H : s.H;
        s.ragged = (i / 4) % 2 != 0 && T > 1;
        s.padding = (i / 3) % 2 != 0;
        s.reversed = (i / 5) % 2 != 0;
        s.seed = seed * 1000 + static_cast<uint64_t>(i) + 1;
        shapes.push_back(s);
        ++i;
      }
    }
  }
  return shapes;
}

}  // namespace

TEST_CASE("host lazy verify: outputs within contract §10 over every pending length",
          "[host][lazy]") {
  OutCompare total;
  double worst_ratio = 0.0;
  int cases = 0;
  for (const Shape& s : sweep(static_cast<uint64_t>(Catch::rngSeed()) % 1000)) {
    for (int P = 0; P <= kL - s.T; P += s.T <= 2 ? 3 : 1) {
      CAPTURE(describe(s, P));
      const LazyAccuracy a = run_case(s, P);
      CAPTURE(a.vs_exact.describe(), a.fast_error, a.exact_error);
      CHECK(a.vs_exact.max_ulp <= kMaxUlp);
      CHECK(a.vs_exact.nonfinite == 0);
      if (a.has_fp64) {
        CHECK(a.ratio() <= kMaxErrorRatio);
        worst_ratio = std::max(worst_ratio, a.ratio());
      }
      total.merge(a.vs_exact);
      ++cases;
    }
  }
  CAPTURE(cases, total.describe(), worst_ratio);
  CHECK(total.equal_fraction() >= kMinEqualFraction);
  CHECK(total.meets_contract());
}

TEST_CASE("host lazy verify: records and windows the exact path's, state and history untouched",
          "[host][lazy]") {
  Shape s;
  s.T = GENERATE(1, 4, 8);
  s.ragged = GENERATE(false, true);
  s.padding = true;
  s.HV = 2 * s.H;
  const int P = kL - s.T;
  CAPTURE(describe(s, P));
  LazyProblem f = make_lazy(s, P);
  VerifyProblem lazy(f.problem.clone_to(Device::host()));
  VerifyProblem exact(f.problem.clone_to(Device::host()));
  run_case(s, P, ChunkFault::kNone, &lazy, &exact);
  // The exact twin's rings hold the same history (materialize reads it) and the same draft
  // records at the cursor; the lazy call wrote nothing else.
  CHECK(bitwise_equal(lazy.rawk(), exact.rawk()));
  CHECK(bitwise_equal(lazy.rawv(), exact.rawv()));
  CHECK(bitwise_equal(lazy.ring_g(), exact.ring_g()));
  CHECK(bitwise_equal(lazy.ring_beta(), exact.ring_beta()));
  CHECK(bitwise_equal(lazy.conv_window(), exact.conv_window()));
  // The committed state and conv state, every byte (pads included): never written.
  CHECK(lazy.raw(Tensor::kSsmState) == f.problem.raw(Tensor::kSsmState));
  CHECK(lazy.raw(Tensor::kConvState) == f.problem.raw(Tensor::kConvState));
  CHECK(lazy.raw(Tensor::kSnapshots) == f.problem.raw(Tensor::kSnapshots));
}

TEST_CASE("host lazy verify: the history skipping its first step fails the §10 checks",
          "[host][lazy]") {
  int caught = 0, cases = 0;
  for (const Shape& s : sweep(3)) {
    for (const int P : {1, kL - s.T}) {
      CAPTURE(describe(s, P));
      const LazyAccuracy good = run_case(s, P);
      REQUIRE(good.ok());
      const LazyAccuracy bad = run_case(s, P, ChunkFault::kHistorySkipsFirstStep);
      CAPTURE(bad.vs_exact.describe(), bad.ratio());
      caught += bad.ok() ? 0 : 1;
      ++cases;
    }
  }
  CAPTURE(caught, cases);
  CHECK(caught == cases);
}

// ---- rounds: lazy verify + lazy commit against exact verify + eager commit ----

namespace {

struct RoundsResult {
  std::string error;  ///< a kda::Error a lazy call threw ("" if none)
  bool states_equal = true;
  bool tracks_equal = true;
  int folds = 0, max_pending = 0;
  OutCompare outputs;
};

// `rounds` verify rounds of one layer on two copies of a problem: lazy (fast outputs over the
// history, kLazy commits with `fault`) and eager (exact verifies at cursor 0, kEager commits).
// Every round: fresh inputs, random accepted lengths (now and then a bad one), now and then a
// ragged round and a track of request 0 into the spare slot; every few rounds the lazy copy is
// materialized (a clone; the copy itself once, at round 11) and compared with the eager one.
RoundsResult run_rounds(int T, int L, int interval, LazyFault fault, int rounds, uint64_t seed) {
  VerifyCase c = make_case(3, T, 2, 4, 64, 48, RecordMode::kRing, seed);
  c.L = L;
  c.neg_slot = true;  // request 1 pads
  c.reversed = true;
  c.bias = true;
  VerifyProblem lazy(c), eager(lazy.clone_to(Device::host()));
  const int S = lazy.num_slots(), B = c.B;
  std::vector<int32_t> cursor(static_cast<size_t>(S), 0), pending(static_cast<size_t>(S), 0);
  const std::vector<int32_t> slots = lazy.slots();
  const int32_t track_slot = B;  // a spare slot, outside the batch (slots are 0..B-1 reversed)
  REQUIRE(std::find(slots.begin(), slots.end(), track_slot) == slots.end());
  std::mt19937 rng(static_cast<uint32_t>(seed));
  RoundsResult r;
  int32_t flag_lazy = 0, flag_eager = 0;
  std::vector<int32_t> checked(static_cast<size_t>(B));
  for (int round = 0; round < rounds && r.error.empty(); ++round) {
    // Fresh inputs for both copies.
    const VerifyProblem inputs(make_case(B, T, 2, 4, 64, 48, RecordMode::kRing,
                                         seed * 100 + static_cast<uint64_t>(round)));
    for (VerifyProblem* p : {&lazy, &eager}) {
      p->set(Tensor::kQkv, inputs.qkv());
      p->set(Tensor::kA, inputs.a());
      p->set(Tensor::kB, inputs.b());
    }
    // The draft shape: dense, or ragged lengths 1..T.
    std::vector<int32_t> offsets, lengths(static_cast<size_t>(B), T);
    std::vector<int64_t> first;
    if (rng() % 3 == 0) {
      offsets.push_back(0);
      for (int n = 0; n < B; ++n) {
        lengths[n] = 1 + static_cast<int>(rng() % static_cast<unsigned>(T));
        offsets.push_back(offsets.back() + lengths[n]);
      }
    }
    for (int n = 0; n < B; ++n) {
      first.push_back(offsets.empty() ? int64_t{n} * T : int64_t{offsets[n]});
    }
    const int32_t* shape = offsets.empty() ? nullptr : offsets.data();
    VerifyParams lv = lazy.params(RecordMode::kRing);
    lv.numerics = VerifyNumerics::kFast;
    lv.ring_cursor = cursor.data();
    lv.ring_pending = pending.data();
    lv.lazy = 1;
    lv.u_free = 1;
    lv.token_offsets = shape;
    VerifyParams ev = eager.params(RecordMode::kRing);
    ev.token_offsets = shape;
    try {
      host::verify_fused_fast(lv);
    } catch (const Error& e) {
      r.error = e.what();
      break;
    }
    host::verify_fused(ev);
    r.outputs.merge(
        compare_requests(lazy.out(), eager.out(), first, lengths, lazy.pad_request(), c.HV, c.V));

    // Accepted lengths; now and then a bad one, a track of request 0 at a step below its length.
    std::vector<int32_t> accepted;
    for (int n = 0; n < B; ++n) {
      accepted.push_back(1 + static_cast<int>(rng() % static_cast<unsigned>(lengths[n])));
      if (n == 2 && rng() % 7 == 0) {
        accepted.back() = lengths[n] + 1;
      }
    }
    const bool track = rng() % 3 == 0;
    std::vector<int32_t> track_slots(static_cast<size_t>(B), -1),
        track_steps(static_cast<size_t>(B), -1);
    if (track) {
      track_slots[0] = track_slot;
      track_steps[0] = static_cast<int32_t>(rng() % static_cast<unsigned>(accepted[0]));
    }
    const Buffer acc = make_buffer(accepted, Device::host());
    CommitParams lc = lazy.commit_params(acc, RecordMode::kRing);
    CommitParams ec = eager.commit_params(acc, RecordMode::kRing);
    for (CommitParams* cp : {&lc, &ec}) {
      cp->token_offsets = shape;
      cp->checked_accepted = shape != nullptr ? checked.data() : nullptr;
      if (track) {
        cp->track_slots = track_slots.data();
        cp->track_steps = track_steps.data();
      }
    }
    lc.kind = CommitKind::kLazy;
    lc.ring_cursor = cursor.data();
    lc.ring_pending = pending.data();
    lc.ring_pending_layer_stride = S;
    lc.u_free = 1;
    lc.lazy_fold_interval = interval;
    lc.error_flag = &flag_lazy;
    ec.error_flag = &flag_eager;
    const std::vector<int32_t> before = pending;
    try {
      if (fault == LazyFault::kNone || shape != nullptr) {
        host::commit(lc);  // a ragged round's faults: in its dense second stage, not planted
      } else {
        host::testing::commit_lazy_with_fault(lc, fault);
      }
    } catch (const Error& e) {
      r.error = e.what();
      break;
    }
    host::commit(ec);
    REQUIRE(flag_lazy == flag_eager);
    for (const int32_t slot : slots) {
      if (slot >= 0) {
        const size_t s = static_cast<size_t>(slot);
        r.folds += before[s] > 0 && pending[s] == 0 ? 1 : 0;
        r.max_pending = std::max(r.max_pending, pending[s]);
      }
    }
    if (track) {
      const int64_t n = lazy.state_elems();
      r.tracks_equal = r.tracks_equal && slice(lazy.ssm_state(), track_slot * n, n) ==
                                             slice(eager.ssm_state(), track_slot * n, n);
    }
    if (round % 4 == 3 || round == rounds - 1) {
      // Materialize (a clone; the copy itself every other time) and compare everything.
      VerifyProblem m = lazy.clone_to(Device::host());
      std::vector<int32_t> mc = cursor, mp = pending;
      const bool in_place = round == 11;  // once: the rounds go on from a materialized slot
      VerifyProblem& target = in_place ? lazy : m;
      CommitParams mat = target.commit_params(acc, RecordMode::kRing);
      mat.kind = CommitKind::kMaterialize;
      mat.ring_cursor = in_place ? cursor.data() : mc.data();
      mat.ring_pending = in_place ? pending.data() : mp.data();
      mat.ring_pending_layer_stride = S;
      mat.u_free = 1;
      host::commit(mat);
      const bool equal = bitwise_equal(target.ssm_state(), eager.ssm_state()) &&
                         bitwise_equal(target.conv_state(), eager.conv_state());
      r.states_equal = r.states_equal && equal;
    }
  }
  return r;
}

}  // namespace

TEST_CASE("host lazy rounds: equal eager rounds bitwise after materialize", "[host][lazy]") {
  const int T = GENERATE(2, 4);
  const int L = GENERATE(8, 16);
  const int interval = GENERATE(0, 5);
  CAPTURE(T, L, interval);
  const RoundsResult r = run_rounds(T, L, interval, LazyFault::kNone, 32, 11 + T + L + interval);
  CAPTURE(r.error, r.outputs.describe(), r.folds, r.max_pending);
  REQUIRE(r.error.empty());
  CHECK(r.states_equal);
  CHECK(r.tracks_equal);
  CHECK(r.outputs.max_ulp <= kMaxUlp);
  CHECK(r.outputs.nonfinite == 0);
  // The ring's capacity beside the next draft, and folds as it fills (or at the interval).
  CHECK(r.max_pending <= L - T);
  CHECK(r.max_pending >= 1);
  CHECK(r.folds >= 1);
  if (interval > 0) {
    CHECK(r.max_pending < interval);
  }
}

TEST_CASE("host lazy rounds: each planted commit error is caught", "[host][lazy]") {
  const LazyFault fault = GENERATE(LazyFault::kFoldOneStepLate, LazyFault::kPendingCountedTwice);
  CAPTURE(static_cast<int>(fault));
  const RoundsResult good = run_rounds(4, 8, 0, LazyFault::kNone, 24, 5);
  REQUIRE(good.error.empty());
  REQUIRE(good.states_equal);
  const RoundsResult bad = run_rounds(4, 8, 0, fault, 24, 5);
  CAPTURE(bad.error, bad.max_pending);
  // A late fold leaves a history the next draft cannot fit beside (the lazy verify refuses it);
  // a double count folds steps nobody accepted.
  CHECK((!bad.error.empty() || !bad.states_equal || !bad.tracks_equal));
}

TEST_CASE("host lazy: outside the domain kda::Error names the field, writes nothing",
          "[host][lazy]") {
  Shape s;
  s.T = 4;
  LazyProblem f = make_lazy(s, 2);
  VerifyProblem p = f.problem.clone_to(Device::host());
  const auto raw_before = p.raw(Tensor::kOut);
  const auto error = [&](const std::function<void(VerifyParams&)>& edit) {
    VerifyParams v = f.lazy_params(p);
    edit(v);
    return error_message([&] { host::verify_fused_fast(v); });
  };
  CHECK_THAT(error([](VerifyParams& v) { v.numerics = VerifyNumerics::kExact; }),
             Catch::Contains("lazy=1 with numerics=exact"));
  float dummy = 0.0f;
  CHECK_THAT(error([&](VerifyParams& v) { v.ssm_fold_out = &dummy; }),
             Catch::Contains("ssm_fold_out given to a lazy verify"));
  CHECK_THAT(error([&](VerifyParams& v) { v.ring_u = &dummy; }),
             Catch::Contains("ring_u given to a lazy verify"));
  CHECK_THAT(error([](VerifyParams& v) { v.ring_pending = nullptr; }),
             Catch::Contains("lazy=1 without ring_pending"));
  // A history the draft cannot fit beside (the lazy commit never leaves one).
  const int32_t slot = p.slots()[0];
  f.pending[static_cast<size_t>(slot)] = kL - s.T + 1;
  CHECK_THAT(error([](VerifyParams&) {}),
             Catch::Contains(fmt::format("ring_pending[{}]={}", slot, kL - s.T + 1)));
  f.pending[static_cast<size_t>(slot)] = 2;
  CHECK(p.raw(Tensor::kOut) == raw_before);

  // The lazy commit: u-free, 2 T_max <= L <= 16, a non-negative interval (only its own).
  const Buffer acc = make_buffer(std::vector<int32_t>(static_cast<size_t>(s.B), 1), Device::host());
  const auto commit_error = [&](const std::function<void(CommitParams&)>& edit) {
    CommitParams c = p.commit_params(acc, RecordMode::kRing);
    c.kind = CommitKind::kLazy;
    c.ring_cursor = f.cursor.data();
    c.ring_pending = f.pending.data();
    c.ring_pending_layer_stride = p.num_slots();
    c.u_free = 1;
    edit(c);
    return error_message([&] { host::commit(c); });
  };
  CHECK_THAT(commit_error([&](CommitParams& c) { c.ring_u = &dummy; }),
             Catch::Contains("ring_u given to a lazy commit"));
  CHECK_THAT(commit_error([](CommitParams& c) { c.lazy_fold_interval = -1; }),
             Catch::Contains("lazy_fold_interval=-1, expected >= 0"));
  CHECK_THAT(commit_error([](CommitParams& c) { c.L = 32; }),
             Catch::Contains("a lazy commit needs 2 * T_max <= L <= 16"));
  CHECK_THAT(commit_error([](CommitParams& c) {
               c.kind = CommitKind::kDeferred;
               c.lazy_fold_interval = 3;
             }),
             Catch::Contains("lazy_fold_interval=3 with kind=1"));
  CHECK(p.ssm_state() == f.problem.ssm_state());
  CHECK(f.pending[static_cast<size_t>(slot)] == 2);

  // A lazy call off the fast path: its plan is refused.
  std::unique_ptr<KernelSet> ks = make_host_kernel_set();
  const VerifyParams v = f.lazy_params(p);
  CHECK_THAT(error_message([&] { ks->plan_verify(v, VerifyPath::kUnfused, 0); }),
             Catch::Contains("a lazy verify (VerifyParams::lazy, contract §11) needs the fast "
                             "outputs"));
  CHECK_THAT(error_message([&] { ks->plan_verify(v, VerifyPath::kFused, 16); }),
             Catch::Contains("needs the fast outputs"));
}
