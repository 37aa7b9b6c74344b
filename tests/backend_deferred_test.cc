// backend_deferred_test.cc: the deferred commit (contract §7) against the eager one, bitwise:
// two ring-mode backends with the same weights, state and inputs, one with
// --kda-deferred-commit on, one off. Every round's outputs and conv windows are equal, its ring
// records are equal at the deferred backend's cursor-shifted positions, and after materialize()
// every layer's SSM and conv state is equal; over random batches (requests joining, leaving,
// sitting a round out, reversed slots, padding rows, explicit scratch rows), T changing between
// rounds, random accepted lengths, abort_round() before / during / after a round's layers,
// extend and a released and reused slot while steps are pending; bad accepted lengths (0, T + 1,
// -1) are flagged and change nothing of their request. The lifecycle errors of materialize
// change nothing.
//
// Runs on the host reference (backend_deferred_test, CI) and, linked with :backend_fixture_cuda,
// on the CUDA kernels (backend_deferred_cuda_test, GPU host).
#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>
#include <random>
#include <vector>

#include "backend/kda_backend.h"
#include "core/platform.h"
#include "tests/backend_fixture.h"

using namespace kda;
using namespace kda::testing;

namespace {

EngineFlags pair_flags(bool deferred, NumericsRequest numerics) {
  EngineFlags f = flags_for(/*ring=*/true, deferred);
  f.verify_numerics = static_cast<int>(numerics);
  return f;
}

// `numerics` on both: exact keeps the deferred backend's u records; fast makes its commit u-free
// (no fold reads ring_u: the pending steps fold computing u, in the fast kernel or first by the
// fold kernel), its B = 1 calls fast and its unfused ones (B > --kda-fused-ring-max-batch = 1)
// exact, each bitwise the eager backend's same call.
struct Pair {
  Harness eager, deferred;
  explicit Pair(const ModelCase& mc, NumericsRequest numerics = NumericsRequest::kExact)
      : eager(mc, pair_flags(false, numerics), fake_platform(9, 0)),
        deferred(mc, pair_flags(true, numerics), fake_platform(9, 0)) {}
};

std::vector<int32_t> cursors(const Harness& h) {
  return to_host_vector<int32_t>(h.pool().ring_cursor());
}

// This round's outputs, windows and ring records of both backends, bitwise. `c` = the deferred
// backend's cursors before the round (the eager backend's are 0).
void check_round(const Pair& p, const std::vector<Activations>& eager,
                 const std::vector<Activations>& deferred, const BatchSpec& batch,
                 const std::vector<int32_t>& c) {
  const ModelConfig& m = p.eager.model;
  for (int layer = 0; layer < kLayers; ++layer) {
    CAPTURE(layer);
    CHECK(same_bits(eager[static_cast<size_t>(layer)].out_view,
                    bytes_of(deferred[static_cast<size_t>(layer)].out_view)));
    check_batch_records(p.eager.pool(), p.deferred.pool(), m, layer, batch, c);
  }
}

// Materializes every allocated slot of the deferred backend and compares all committed state.
void check_states(Pair& p) { check_materialized_states(p.eager, p.deferred); }

// One verify round on both backends: every layer, then commit (or abort after `abort_after`
// layers, -1: commit).
void round_on_both(Pair& p, const BatchSpec& batch, const std::vector<int32_t>& accepted,
                   uint64_t seed, int abort_after = -1) {
  const std::vector<int32_t> c = cursors(p.deferred);
  if (abort_after >= 0) {
    for (Harness* h : {&p.eager, &p.deferred}) {
      abort_after_layers(*h, batch, seed, abort_after);
    }
    return;
  }
  const auto eager = verify_all(p.eager, batch, seed);
  const auto deferred = verify_all(p.deferred, batch, seed);
  check_round(p, eager, deferred, batch, c);
  commit(p.eager, accepted);
  commit(p.deferred, accepted);
  // The conv commit is eager in both modes.
  CHECK(same_bits(p.eager.pool().conv_state_all(), bytes_of(p.deferred.pool().conv_state_all())));
}

}  // namespace

TEST_CASE("backend deferred: random rounds equal the eager commit bitwise", "[backend][deferred]") {
  const ModelCase mc =
      GENERATE(values<ModelCase>({kGqaCase,
                                  {"HV=H, safe gate -5, bf16 conv, no bias", 2, 2, GateKind::kSafe,
                                   ConvWeightType::kBF16, false}}));
  const NumericsRequest numerics =
      GENERATE(NumericsRequest::kExact, NumericsRequest::kFast);  // u records / u-free
  CAPTURE(mc.name, numerics_request_name(numerics));
  Pair p(mc, numerics);
  REQUIRE(p.deferred.backend->deferred_commit());
  REQUIRE_FALSE(p.eager.backend->deferred_commit());
  REQUIRE(p.deferred.pool().config().deferred_u_records == (numerics == NumericsRequest::kExact));
  bool saw_fast = false, saw_exact = false;  // u-free: both kinds of call ran
  std::mt19937 rng(7);
  const int S = p.eager.pool().num_slots();
  for (int r = 0; r < 14; ++r) {
    CAPTURE(r);
    // A random batch (random_round); a bad accepted length: both backends skip and flag it.
    const RandomRound rr = random_round(rng, S);
    const BatchSpec& batch = rr.batch;
    const std::vector<int32_t>& accepted = rr.accepted;
    const bool bad = rr.bad;
    CAPTURE(accepted);
    round_on_both(p, batch, accepted, 500 + 10 * static_cast<uint64_t>(r));
    for (const auto& d : p.deferred.backend->stats().last_decision) {
      REQUIRE(d.has_value());
      // u-free: the exact calls fold first, the fast ones in their kernel.
      CHECK(d->plan.pending_fold_first ==
            (numerics == NumericsRequest::kFast && !d->fast_outputs()));
      (d->fast_outputs() ? saw_fast : saw_exact) = true;
    }
    for (Harness* h : {&p.eager, &p.deferred}) {
      if (bad) {
        CHECK(
            error_of([&] { h->backend->check_device_errors(nullptr); }, ErrorCode::kInvalidArgument)
                .find("an accepted length outside [1, T]") != std::string::npos);
      } else {
        h->backend->check_device_errors(nullptr);
      }
    }
    if (r % 4 == 3) {
      check_states(p);  // also exercises verifies that find nothing pending
    }
  }
  check_states(p);
  CHECK(saw_exact);
  CHECK(saw_fast == (numerics == NumericsRequest::kFast));
}

TEST_CASE("backend deferred: bad accepted lengths are flagged and change nothing",
          "[backend][deferred]") {
  // A request with an accepted length of 0, T + 1 or -1 is skipped: the device flag is raised
  // and its slot's state, conv state, pending counts (every layer) and ring cursor keep their
  // bits; the other requests of the round commit as the eager backend's.
  Pair p(kGqaCase);
  round_on_both(p, {kT, {3, 0, 4, 1}, {}}, {2, kT, 1, 3}, 10);  // steps pending in 3, 0, 4, 1
  check_states(p);                                              // materialized: nothing pending
  round_on_both(p, {kT, {0, 1}, {}}, {2, 1}, 15);  // pending in 0 and 1 again, not in 3 and 4
  const KdaStatePool& pool = p.deferred.pool();
  const int S = pool.num_slots();
  // Slot s's bits in every per-slot tensor the commit may write.
  const auto slot_bits = [&](int s) {
    std::vector<uint8_t> out;
    for (int layer = 0; layer < kLayers; ++layer) {
      for (const TensorView& v :
           {pool.ssm_state(layer).select(0, s), pool.conv_state(layer).select(0, s),
            pool.ring_pending(layer).narrow(0, s, 1)}) {
        const std::vector<uint8_t> b = bytes_of(v);
        out.insert(out.end(), b.begin(), b.end());
      }
    }
    const std::vector<uint8_t> c = bytes_of(pool.ring_cursor().narrow(0, s, 1));
    out.insert(out.end(), c.begin(), c.end());
    return out;
  };
  std::vector<std::vector<uint8_t>> before;
  for (int s = 0; s < S; ++s) {
    before.push_back(slot_bits(s));
  }
  // Slots 3 and 4 have nothing pending: a bad length leaves every bit of them. Slot 2 commits.
  for (const int32_t bad : {0, kT + 1, -1}) {
    CAPTURE(bad);
    round_on_both(p, {kT, {3, 2, 4}, {}}, {bad, 2, bad}, static_cast<uint64_t>(21 + bad));
    for (Harness* h : {&p.eager, &p.deferred}) {
      CHECK(error_of([&] { h->backend->check_device_errors(nullptr); }, ErrorCode::kInvalidArgument)
                .find("an accepted length outside [1, T]") != std::string::npos);
      h->backend->check_device_errors(nullptr);  // cleared
    }
    CHECK(slot_bits(3) == before[3]);
    CHECK(slot_bits(4) == before[4]);
    CHECK(slot_bits(2) != before[2]);
    const std::vector<int32_t> pending = to_host_vector<int32_t>(pool.ring_pending_all());
    for (int layer = 0; layer < kLayers; ++layer) {
      CHECK(pending[static_cast<size_t>(layer * S + 2)] == 2);
    }
    before[2] = slot_bits(2);
  }
  // Slot 0's pending steps are folded by the round's verifies; a bad length records none, keeps
  // the cursor and the conv state: the committed state is the eager backend's.
  const std::vector<int32_t> cursor = cursors(p.deferred);
  round_on_both(p, {kT, {0, 1}, {}}, {kT + 1, 3}, 30);
  CHECK_THROWS_AS(p.deferred.backend->check_device_errors(nullptr), Error);
  CHECK_THROWS_AS(p.eager.backend->check_device_errors(nullptr), Error);
  CHECK(cursors(p.deferred)[0] == cursor[0]);
  CHECK(cursors(p.deferred)[1] == ((cursor[1] + 3) & (pool.ring_len() - 1)));
  for (int layer = 0; layer < kLayers; ++layer) {
    CHECK(to_host_vector<int32_t>(pool.ring_pending(layer))[0] == 0);
  }
  check_states(p);
}

TEST_CASE("backend deferred: abort_round, extend and slot reuse with pending steps",
          "[backend][deferred]") {
  Pair p(kGqaCase);
  const BatchSpec batch{kT, {3, 0, 4}, {}};
  round_on_both(p, batch, {2, kT, 1}, 10);  // steps now pending in slots 3, 0, 4

  SECTION("abort before any layer, after some, after all: nothing folded twice") {
    for (const int after : {0, 1, kLayers}) {
      CAPTURE(after);
      round_on_both(p, {kT, {0, 4, 3}, {}}, {}, 20, after);
      round_on_both(p, {2, {4, 1}, {}}, {2, 1}, 30);  // a different batch, then compare
      check_states(p);
      round_on_both(p, batch, {1, 3, kT}, 40);
    }
  }
  SECTION("extend on slots with pending steps continues from the committed state") {
    const BatchSpec prompt{6, {0, -1, 3}, {}};
    for (Harness* h : {&p.eager, &p.deferred}) {
      h->backend->prepare_extend(prompt, nullptr);
    }
    for (int layer = 0; layer < kLayers; ++layer) {
      Activations xe = make_activations(p.eager.model, prompt.slots, prompt.T, 60 + layer);
      Activations xd = make_activations(p.deferred.model, prompt.slots, prompt.T, 60 + layer);
      p.eager.backend->extend(layer, xe.in, xe.out_view, nullptr);
      p.deferred.backend->extend(layer, xd.in, xd.out_view, nullptr);
      CHECK(same_bits(xe.out_view, bytes_of(xd.out_view)));
    }
    check_states(p);
    round_on_both(p, batch, {kT, 1, 2}, 70);
    check_states(p);
  }
  SECTION("a released slot with pending steps is reused clean") {
    for (Harness* h : {&p.eager, &p.deferred}) {
      h->backend->release_slot(3);
      REQUIRE(h->backend->allocate_slot(nullptr) == 3);  // the only free slot
    }
    CHECK(to_host_vector<int32_t>(p.deferred.pool().ring_cursor())[3] == 0);
    check_states(p);
    round_on_both(p, {kT, {3, 4}, {}}, {kT, 2}, 80);
    round_on_both(p, {kT, {4, 3}, {}}, {1, 3}, 90);
    check_states(p);
  }
}

TEST_CASE("backend deferred: only a round's first verify folds after its PDL wait",
          "[backend][deferred]" KDA_HOST_ONLY) {
  // VerifyParams::fold_before_wait: the first verify of a round may follow the commit (which
  // writes the cursors and counts), so it folds after its wait; the later ones follow another
  // layer's verify. An aborted round starts over; the eager backend never sets it.
  Pair p(kGqaCase);
  const BatchSpec batch{kT, {1, 2}, {}};
  round_on_both(p, batch, {3, 2}, 5);
  round_on_both(p, batch, {1, 1}, 6, /*abort_after=*/1);
  round_on_both(p, batch, {2, 3}, 7);
  static_assert(kLayers == 2, "the expected sequence below");
  CHECK(p.deferred.counts->fold_before_wait == std::vector<int>{0, 1, 0, 0, 1});
  CHECK(p.eager.counts->fold_before_wait == std::vector<int>{0, 0, 0, 0, 0});
}

TEST_CASE("backend deferred: materialize's errors change nothing",
          "[backend][deferred]" KDA_HOST_ONLY) {
  Pair p(kGqaCase);
  round_on_both(p, {kT, {1, 2}, {}}, {3, 2}, 5);
  const uint64_t before = pool_checksum(p.deferred.pool());
  const auto pending = bytes_of(p.deferred.pool().ring_pending_all());
  KdaAttentionBackend& b = *p.deferred.backend;
  b.prepare({kT, {1}, {}}, nullptr);
  CHECK_THAT(error_of([&] { b.materialize({1}, nullptr); }, ErrorCode::kLifecycle),
             Catch::Matchers::StartsWith(
                 "materialize: a round is in progress (verify round, 0 of 2 layers verified"));
  b.abort_round(nullptr);
  CHECK(error_of(
            [&] {
              b.materialize({1, 7}, nullptr);
            },
            ErrorCode::kInvalidArgument) ==
        "materialize: slots[1] = 7 is not an allocated slot in [0, 5)");
  CHECK(error_of(
            [&] {
              b.materialize({2, 2}, nullptr);
            },
            ErrorCode::kInvalidArgument) ==
        "materialize: slots[0] and slots[1] are both 2 (distinct slots)");
  b.release_slot(4);
  CHECK(error_of([&] { b.materialize({4}, nullptr); }, ErrorCode::kInvalidArgument) ==
        "materialize: slots[0] = 4 is not an allocated slot in [0, 5)");
  CHECK(pool_checksum(p.deferred.pool()) == before);
  CHECK(same_bits(p.deferred.pool().ring_pending_all(), pending));
  // An eager backend has nothing pending: materialize validates, then does nothing.
  const uint64_t eager_before = pool_checksum(p.eager.pool());
  CHECK_NOTHROW(p.eager.backend->materialize({1, 2}, nullptr));
  CHECK(pool_checksum(p.eager.pool()) == eager_before);
}
