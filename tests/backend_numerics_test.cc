// backend_numerics_test.cc: --kda-verify-numerics end to end on the host kernel set (contract
// §10): the flag reaches the dispatcher, the decision's numerics reach every verify call's params
// (and the plan: VerifySchedule::kFastChunk where the decision is fast), the decision says why
// (fast, or exact: snapshot mode, a tree, the unfused path, a deferred fold, asked for, auto
// without a measured row), extend stays exact, and kda::ops takes the same decision from its
// DispatchFlags. Decisions and plans only: the host kernel set runs its reference for every plan,
// so no output value of the fast mode is asserted here.
//
// Host only (the CUDA kernel set plans the same and launches what the plan says).
#include <catch2/catch.hpp>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "backend/kda_backend.h"
#include "backend/kernel_set_factory.h"
#include "backend/ops.h"
#include "core/platform.h"
#include "kernels/kda_kernels.h"
#include "tests/backend_fixture.h"

using namespace kda;
using namespace kda::testing;

namespace {

EngineFlags numerics_flags(bool ring, bool deferred, NumericsRequest numerics) {
  EngineFlags f = flags_for(ring, deferred);
  f.verify_numerics = static_cast<int>(numerics);
  return f;
}

// Every layer's last decision.
std::vector<DispatchDecision> decisions(const Harness& h) {
  std::vector<DispatchDecision> out;
  for (const auto& d : h.backend->stats().last_decision) {
    REQUIRE(d.has_value());
    out.push_back(*d);
  }
  return out;
}

// Checks every layer's last decision: its numerics, reason and plan; and that the params of the
// last kLayers verify calls carried the decision's numerics.
void check_round(const Harness& h, NumericsReason want) {
  const bool fast = want == NumericsReason::kFastRequested || want == NumericsReason::kAutoFast ||
                    want == NumericsReason::kAutoUFree;
  for (const DispatchDecision& d : decisions(h)) {
    CAPTURE(d.describe());
    CHECK(d.numerics_reason == want);
    CHECK(d.fast_outputs() == fast);
    CHECK(d.plan.numerics == d.numerics);
    CHECK((d.plan.schedule == kernels::VerifySchedule::kFastChunk) == fast);
    CHECK(d.plan.host_reference);
    CHECK_THAT(d.describe(), Catch::Contains(d.describe_numerics()));
  }
  const std::vector<VerifyNumerics>& seen = h.counts->verify_numerics;
  REQUIRE(seen.size() >= static_cast<size_t>(kLayers));
  for (size_t i = seen.size() - kLayers; i < seen.size(); ++i) {
    CHECK(seen[i] == (fast ? VerifyNumerics::kFast : VerifyNumerics::kExact));
  }
}

// Layer 0's ring state of the harness's pool as kda::ops takes it (an engine's own views);
// `deferred`: with ring_cursor, ring_pending and ring_u.
ops::StateTensors layer0_state(const Harness& h, bool deferred) {
  const KdaStatePool& pool = h.pool();
  ops::StateTensors state;
  state.conv_state = pool.conv_state(0);
  state.ssm_state = pool.ssm_state(0);
  state.conv_window = pool.conv_window(0);
  state.ring_rawv = pool.ring_rawv(0);
  state.ring_rawk = pool.ring_rawk(0);
  state.ring_g = pool.ring_g(0);
  state.ring_beta = pool.ring_beta(0);
  state.qkv_act = pool.qkv_act();
  if (deferred) {
    state.ring_cursor = pool.ring_cursor();
    state.ring_pending = pool.ring_pending(0);
    state.ring_u = pool.ring_u(0);
  }
  return state;
}

// ops::verify of one request on slot `slot` (scratch row 0) over layer 0 of the harness's pool,
// with the backend's flags and platform, numerics `numerics`.
DispatchDecision ops_verify(const Harness& h, const ops::StateTensors& state, int32_t slot,
                            NumericsRequest numerics, uint64_t seed) {
  const Buffer slots = device_i32({slot});
  const Buffer rows = device_i32({0});
  Activations x = make_activations(h.model, {slot}, kT, seed);
  ops::VerifyArgs a;
  a.mixed_qkv = x.in.mixed_qkv;
  a.a = x.in.a;
  a.b = x.in.b;
  a.out = x.out_view;
  a.weights = h.weights[0].views;
  a.state = state;
  a.batch.T = kT;
  a.batch.slots = slots.view(DType::kI32, {1});
  a.batch.rows = rows.view(DType::kI32, {1});
  a.options.gate = h.model.gate;
  a.options.dispatch = h.backend->flags().dispatch_flags();
  a.options.dispatch.numerics = numerics;
  a.options.platform = h.backend->platform();
  const std::unique_ptr<KernelSet> kernels = make_kernel_set(kTestDevice);
  return ops::verify(*kernels, a, nullptr);
}

}  // namespace

TEST_CASE("backend numerics: fast in ring mode with the eager commit plans the fast outputs",
          "[backend][numerics]") {
  Harness h(kGqaCase, numerics_flags(/*ring=*/true, /*deferred=*/false, NumericsRequest::kFast),
            fake_platform(9, 0));
  REQUIRE_FALSE(h.pool().config().deferred_commit);
  const ModelConfig& m = h.model;

  SECTION("a dense chain at B = 1, two rounds; then extend stays exact") {
    for (int round = 0; round < 2; ++round) {
      verify_all(h, BatchSpec{kT, {1}}, 10 + round);
      check_round(h, NumericsReason::kFastRequested);
      for (const DispatchDecision& d : decisions(h)) {
        CHECK(d.fused());
        CHECK(d.reason == DispatchReason::kRingFused);
        // The fast auto tile: BV = 32 (HV = 4 CTAs at BV = 64 leave SMs idle).
        CHECK(d.block_v == kernels::default_fast_block_v(1, m.HV, m.V, 132));
        CHECK(d.block_v == 32);
        CHECK(d.plan.block_v == 32);
        CHECK(d.describe() ==
              "fused (block_v = 32): ring mode with B = 1 <= --kda-fused-ring-max-batch = 1 on "
              "SM90, ring layout ok; outputs fast (tensor cores): --kda-verify-numerics fast; "
              "runs the host reference (fused, fast outputs)");
      }
      commit(h, {2});
    }
    h.backend->prepare_extend(BatchSpec{6, {0}}, nullptr);
    for (int layer = 0; layer < kLayers; ++layer) {
      Activations x = make_activations(m, {0}, 6, 30 + layer);
      h.backend->extend(layer, x.in, x.out_view, nullptr);
    }
    CHECK(h.counts->extend_numerics ==
          std::vector<VerifyNumerics>(kLayers, VerifyNumerics::kExact));
  }
  SECTION("a ragged chain (lengths T: verify_all's dense activation rows)") {
    BatchSpec batch(kT, {3});
    batch.lengths = {kT};
    verify_all(h, batch, 20);
    check_round(h, NumericsReason::kFastRequested);
    CHECK((decisions(h)[0].plan.features & kernels::kRaggedRows) != 0);
  }
  SECTION("above the fused ring batch: the unfused path, exact") {
    verify_all(h, BatchSpec{kT, {0, 1}}, 21);
    check_round(h, NumericsReason::kExactUnfused);
    CHECK_FALSE(decisions(h)[0].fused());
  }
  SECTION("a forced tile outside the fast tiles: exact") {
    EngineFlags f = numerics_flags(true, false, NumericsRequest::kFast);
    f.verify_block_v = 16;
    Harness forced(kGqaCase, f, fake_platform(9, 0));
    verify_all(forced, BatchSpec{kT, {0}}, 22);
    check_round(forced, NumericsReason::kExactBlockV);
    CHECK(decisions(forced)[0].block_v == 16);
  }
  SECTION("a forced fast tile") {
    EngineFlags f = numerics_flags(true, false, NumericsRequest::kFast);
    f.verify_block_v = 64;
    Harness forced(kGqaCase, f, fake_platform(9, 0));
    verify_all(forced, BatchSpec{kT, {0}}, 23);
    check_round(forced, NumericsReason::kFastRequested);
    CHECK(decisions(forced)[0].plan.block_v == 64);
  }
}

TEST_CASE("backend numerics: a deferred commit with fast outputs is u-free, folded in the kernel",
          "[backend][numerics]") {
  // --kda-verify-numerics fast with the deferred commit: no fold reads u records (the chunked
  // outputs compute no exact per-step u); each verify's fast kernel folds the pending steps
  // itself (computing u, as the fold kernel does) and writes the records at the cursor.
  Harness h(kGqaCase, numerics_flags(/*ring=*/true, /*deferred=*/true, NumericsRequest::kFast),
            fake_platform(9, 0));
  REQUIRE(h.pool().config().deferred_commit);
  REQUIRE_FALSE(h.pool().config().deferred_u_records);
  for (int round = 0; round < 2; ++round) {
    verify_all(h, BatchSpec{kT, {1}}, 40 + round);
    check_round(h, NumericsReason::kFastRequested);
    for (const DispatchDecision& d : decisions(h)) {
      CHECK(d.fused());
      CHECK((d.plan.features & kernels::kDeferredFold) != 0);
      CHECK_FALSE(d.plan.pending_fold_first);
      CHECK(d.plan.schedule == kernels::VerifySchedule::kFastChunk);
    }
    commit(h, {3});
  }
  SECTION("exact or auto keep the u records (auto's deferred verifies run exact)") {
    for (const NumericsRequest r : {NumericsRequest::kExact, NumericsRequest::kAuto}) {
      Harness e(kGqaCase, numerics_flags(true, true, r), fake_platform(9, 0));
      CHECK(e.pool().config().deferred_u_records);
      verify_all(e, BatchSpec{kT, {1}}, 45);
      for (const DispatchDecision& d : decisions(e)) {
        CHECK_FALSE(d.fast_outputs());
        CHECK_FALSE(d.plan.pending_fold_first);
      }
    }
  }
}

TEST_CASE("backend numerics: auto makes the deferred commit u-free where its step table says so",
          "[backend][numerics][auto]") {
  // An engine-measured table (BackendOptions::lazy_policy_table) for the fixture's model at its
  // ring length and T: at B >= 2 the fast deferred step's KDA share (180 us) beats the exact
  // deferred one's (200 us); at B = 1 it does not (199 us: within kLazyMinGainPct). The lazy and
  // eager steps are slower everywhere, so auto's other rules leave the deferred commit (on here).
  const ModelConfig m = model_for(kGqaCase);
  const EngineFlags base = flags_for(/*ring=*/true, /*deferred=*/true);
  const LazyPolicyRow rows[] = {
      {m.H, m.HV, m.K, m.V, base.replayssm_cache_len, kT, 1, 1300.0, 1200.0, 1300.0, 1199.0, 1400.0,
       1000.0},
      {m.H, m.HV, m.K, m.V, base.replayssm_cache_len, kT, 2, 1300.0, 1200.0, 1300.0, 1180.0, 1400.0,
       1000.0},
  };
  const LazyPolicyCard card = {"engine card", 3352.0, rows, std::size(rows)};
  const auto flags_with = [&](NumericsRequest numerics, int max_batch) {
    EngineFlags f = base;
    f.verify_numerics = static_cast<int>(numerics);
    f.max_running_requests = max_batch;
    f.fused_ring_max_batch = max_batch;
    return f;
  };
  const auto keeps_u = [&](const EngineFlags& f) {
    BackendOptions o;
    o.lazy_policy_table = &card;
    Harness h(m, f, fake_platform(9, 0), o);
    REQUIRE(h.backend->deferred_commit());
    REQUIRE_FALSE(h.backend->lazy_write_back());
    return h.pool().config().deferred_u_records;
  };
  CHECK_FALSE(keeps_u(flags_with(NumericsRequest::kAuto, kMaxRunning)));
  CHECK_FALSE(keeps_u(flags_with(NumericsRequest::kAuto, 2)));
  CHECK_FALSE(keeps_u(flags_with(NumericsRequest::kFast, 1)));  // fast: u-free whatever the row
  // The row within the margin; exact asked for; and where some verify of the batch could not run
  // the fast outputs (above the fused ring batch, the unfused path, a forced tile that is not a
  // fast one, a tree): u records.
  CHECK(keeps_u(flags_with(NumericsRequest::kAuto, 1)));
  CHECK(keeps_u(flags_with(NumericsRequest::kExact, kMaxRunning)));
  {
    EngineFlags f = flags_with(NumericsRequest::kAuto, kMaxRunning);
    f.fused_ring_max_batch = kMaxRunning - 1;
    CHECK(keeps_u(f));
    f = flags_with(NumericsRequest::kAuto, kMaxRunning);
    f.fused_verify = false;
    CHECK(keeps_u(f));
    f = flags_with(NumericsRequest::kAuto, kMaxRunning);
    f.verify_block_v = 16;
    CHECK(keeps_u(f));
    f = flags_with(NumericsRequest::kAuto, kMaxRunning);
    f.verify_block_v = 32;  // a fast tile
    CHECK_FALSE(keeps_u(f));
  }

  // The u-free backend auto chose runs what --kda-verify-numerics fast runs: fast outputs (the
  // reason says auto's), the pending steps folded in the fast kernel, and after random rounds (bad
  // accepted lengths among them) every pool tensor bitwise the fast backend's.
  BackendOptions o;
  o.lazy_policy_table = &card;
  Harness by_auto(m, flags_with(NumericsRequest::kAuto, kMaxRunning), fake_platform(9, 0), o);
  Harness by_flag(m, flags_with(NumericsRequest::kFast, kMaxRunning), fake_platform(9, 0), o);
  REQUIRE_FALSE(by_auto.pool().config().deferred_u_records);
  REQUIRE(pool_checksum(by_auto.pool()) == pool_checksum(by_flag.pool()));
  std::mt19937 rng(7);
  for (int round = 0; round < 10; ++round) {
    const RandomRound rr = random_round(rng, by_auto.pool().num_slots());
    twin_round(by_auto, by_flag, rr, 500 + round);
    check_round(by_auto, NumericsReason::kAutoUFree);
    check_round(by_flag, NumericsReason::kFastRequested);
    for (const DispatchDecision& d : decisions(by_auto)) {
      CHECK((d.plan.features & kernels::kDeferredFold) != 0);
      CHECK_FALSE(d.plan.pending_fold_first);
    }
    CHECK(pool_checksum(by_auto.pool()) == pool_checksum(by_flag.pool()));
  }
}

TEST_CASE("backend numerics: snapshot mode, trees, exact and auto report exact with their reason",
          "[backend][numerics]") {
  SECTION("snapshot mode") {
    Harness h(kGqaCase, numerics_flags(false, false, NumericsRequest::kFast), fake_platform(9, 0));
    verify_all(h, BatchSpec{kT, {0, 1}}, 50);
    check_round(h, NumericsReason::kExactSnapshotMode);
    CHECK(decisions(h)[0].fused());
  }
  SECTION("a tree draft in ring mode") {
    EngineFlags f = numerics_flags(true, false, NumericsRequest::kFast);
    f.eagle_topk = 2;
    Harness h(kGqaCase, f, fake_platform(9, 0));
    BatchSpec batch(kT, {0});
    batch.parents = {-1, 0, 0, 1};
    verify_all(h, batch, 51);
    check_round(h, NumericsReason::kExactTree);
  }
  SECTION("exact asked for") {
    Harness h(kGqaCase, numerics_flags(true, false, NumericsRequest::kExact), fake_platform(9, 0));
    verify_all(h, BatchSpec{kT, {0}}, 52);
    check_round(h, NumericsReason::kExactRequested);
    // The exact path's tile is the exact rule's, not the fast one's.
    CHECK(decisions(h)[0].block_v == kernels::default_block_v(1, h.model.HV, h.model.V, 132, kT));
  }
  SECTION("auto (the default): no measured row for this shape") {
    Harness h(kGqaCase, flags_for(true, false), fake_platform(9, 0));
    REQUIRE(h.backend->flags().numerics_request() == NumericsRequest::kAuto);
    verify_all(h, BatchSpec{kT, {0}}, 53);
    check_round(h, NumericsReason::kAutoUnmeasured);
    CHECK_THAT(decisions(h)[0].describe(),
               Catch::Contains("outputs exact: auto: no measurement for this shape"));
  }
}

TEST_CASE("backend numerics: kda::ops takes the numerics from its DispatchFlags",
          "[backend][numerics]") {
  // ops::verify on the backend's own pool views (one layer), as an engine with its own pool
  // would call it: the same decision as the backend's for the same flags.
  const NumericsRequest request = GENERATE(NumericsRequest::kFast, NumericsRequest::kExact);
  CAPTURE(numerics_request_name(request));
  Harness h(kGqaCase, numerics_flags(true, false, request), fake_platform(9, 0));
  const BatchSpec batch{kT, {2}};
  verify_all(h, batch, 60);
  const DispatchDecision backend_decision = decisions(h)[0];

  const DispatchDecision d =
      ops_verify(h, layer0_state(h, /*deferred=*/false), batch.slots[0], request, 61);
  CAPTURE(d.describe());
  CHECK(d.numerics == backend_decision.numerics);
  CHECK(d.numerics_reason == backend_decision.numerics_reason);
  CHECK(d.block_v == backend_decision.block_v);
  CHECK(d.plan.schedule == backend_decision.plan.schedule);
  CHECK(d.fast_outputs() == (request == NumericsRequest::kFast));
}

TEST_CASE("backend numerics: kda::ops with a deferred state's u records runs exact outputs",
          "[backend][numerics]") {
  // An engine's deferred state (kda::ops replays its u records) asking for fast outputs: the
  // verify folds from the u records in its kernel and records exact u, so its outputs stay exact
  // and the decision says why.
  Harness h(kGqaCase, numerics_flags(true, true, NumericsRequest::kExact), fake_platform(9, 0));
  const DispatchDecision d =
      ops_verify(h, layer0_state(h, /*deferred=*/true), 2, NumericsRequest::kFast, 62);
  CAPTURE(d.describe());
  CHECK(d.fused());
  CHECK((d.plan.features & kernels::kDeferredFold) != 0);
  CHECK(d.numerics_reason == NumericsReason::kExactDeferredFold);
  CHECK_FALSE(d.plan.pending_fold_first);
  CHECK_THAT(d.describe(), Catch::Contains("outputs exact: the deferred commit keeps u records"));
}
