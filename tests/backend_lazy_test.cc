// backend_lazy_test.cc: the lazy write-back (contract §11, --kda-deferred-commit lazy) against
// the eager commit: two ring-mode backends with the same weights, state and inputs, one lazy
// (fast outputs over each slot's pending history), one eager with exact outputs. Every round's
// outputs are within contract §10 (b) of the eager ones (at most 1 bf16 ulp; >= 99.9% bitwise
// over the test), its conv windows are equal and its ring records equal at the lazy backend's
// cursor-shifted positions; after materialize() every layer's SSM and conv state is equal,
// bitwise; over random batches (requests joining, leaving, sitting rounds out, reversed slots,
// padding rows, explicit scratch rows), T changing between rounds, random and bad accepted
// lengths, L = 8 and 16, a fold interval, abort_round() before / during / after a round's
// layers, extend and a released and reused slot while steps are pending. Every pending count
// stays within the ring's capacity (L - T_max) and the commit folds as the ring fills. The
// decisions name the lazy history; the pool keeps no u records; a kernel set without the lazy
// write-back is refused at construction. --kda-deferred-commit auto goes lazy exactly where its
// table (dispatch/lazy_policy.h) says so and the configuration allows it.
//
// On the host kernel set (backend_lazy_test) and on the CUDA kernels (backend_lazy_cuda_test).
#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>
#include <random>
#include <vector>

#include "backend/kda_backend.h"
#include "core/platform.h"
#include "tests/backend_fixture.h"
#include "tests/output_compare.h"

using namespace kda;
using namespace kda::testing;

namespace {

EngineFlags lazy_flags(int L, int interval) {
  EngineFlags f = flags_for(/*ring=*/true, /*deferred=*/true);
  f.deferred_commit = static_cast<int>(DeferredCommit::kLazy);
  f.verify_numerics = static_cast<int>(NumericsRequest::kFast);
  f.replayssm_cache_len = L;
  f.lazy_fold_interval = interval;
  return f;
}

EngineFlags eager_flags(int L) {
  EngineFlags f = flags_for(/*ring=*/true, /*deferred=*/false);
  f.verify_numerics = static_cast<int>(NumericsRequest::kExact);
  f.replayssm_cache_len = L;
  return f;
}

struct Pair {
  Harness eager, lazy;
  explicit Pair(const ModelCase& mc, int L = 8, int interval = 0)
      : eager(mc, eager_flags(L), fake_platform(9, 0)),
        lazy(mc, lazy_flags(L, interval), fake_platform(9, 0)) {}
  OutCompare outputs;  ///< every round's lazy outputs against the eager ones
  int folds = 0, max_pending = 0;
};

std::vector<int32_t> cursors(const Harness& h) {
  return to_host_vector<int32_t>(h.pool().ring_cursor());
}
std::vector<int32_t> pending_all(const Harness& h) {
  return to_host_vector<int32_t>(h.pool().ring_pending_all());
}

// This round's outputs (§10 (b)), windows and ring records (bitwise at the lazy cursors `c`).
void check_round(Pair& p, const std::vector<Activations>& eager,
                 const std::vector<Activations>& lazy, const BatchSpec& batch,
                 const std::vector<int32_t>& c) {
  const ModelConfig& m = p.eager.model;
  const int B = static_cast<int>(batch.slots.size());
  std::vector<int64_t> first;
  std::vector<int32_t> lengths(static_cast<size_t>(B), batch.T);
  int pad = -1;
  for (int i = 0; i < B; ++i) {
    first.push_back(int64_t{i} * batch.T);
  }
  for (int layer = 0; layer < kLayers; ++layer) {
    CAPTURE(layer);
    const auto e = to_host_vector<bf16_t>(eager[static_cast<size_t>(layer)].out_view);
    const auto l = to_host_vector<bf16_t>(lazy[static_cast<size_t>(layer)].out_view);
    OutCompare round_layer;
    for (int i = 0; i < B; ++i) {
      if (batch.slots[static_cast<size_t>(i)] < 0) {
        // A padding row's outputs are zeros in both.
        const int64_t w = int64_t{m.HV} * m.V;
        CHECK(std::equal(e.begin() + first[i] * w, e.begin() + (first[i] + batch.T) * w,
                         l.begin() + first[i] * w,
                         [](bf16_t x, bf16_t y) { return x.bits == y.bits; }));
        continue;
      }
      round_layer.merge(compare_requests(l, e, {first[i]}, {lengths[i]}, pad, m.HV, m.V));
    }
    CHECK(round_layer.max_ulp <= kMaxUlp);
    CHECK(round_layer.nonfinite == 0);
    p.outputs.merge(round_layer);
    check_batch_records(p.eager.pool(), p.lazy.pool(), m, layer, batch, c);
  }
}

void check_states(Pair& p) { check_materialized_states(p.eager, p.lazy); }

void round_on_both(Pair& p, const BatchSpec& batch, const std::vector<int32_t>& accepted,
                   uint64_t seed, int abort_after = -1) {
  const std::vector<int32_t> c = cursors(p.lazy);
  if (abort_after >= 0) {
    for (Harness* h : {&p.eager, &p.lazy}) {
      abort_after_layers(*h, batch, seed, abort_after);
    }
    return;
  }
  const auto eager = verify_all(p.eager, batch, seed);
  const auto lazy = verify_all(p.lazy, batch, seed);
  for (const auto& d : p.lazy.backend->stats().last_decision) {
    REQUIRE(d.has_value());
    CHECK(d->fused());
    CHECK(d->numerics_reason == NumericsReason::kLazyHistory);
    CHECK((d->plan.features & kernels::kLazyHistory) != 0);
    CHECK_FALSE(d->plan.pending_fold_first);
  }
  check_round(p, eager, lazy, batch, c);
  const std::vector<int32_t> before = pending_all(p.lazy);
  commit(p.eager, accepted);
  commit(p.lazy, accepted);
  const std::vector<int32_t> after = pending_all(p.lazy);
  const int L = p.lazy.pool().ring_len(), T_max = p.lazy.pool().T_max();
  for (size_t i = 0; i < after.size(); ++i) {
    CHECK(after[i] <= L - T_max);  // the ring's capacity beside the next draft
    p.folds += before[i] > 0 && after[i] == 0 ? 1 : 0;
    p.max_pending = std::max(p.max_pending, after[i]);
  }
  CHECK(same_bits(p.eager.pool().conv_state_all(), bytes_of(p.lazy.pool().conv_state_all())));
}

}  // namespace

TEST_CASE("backend lazy: random rounds equal the eager commit bitwise", "[backend][lazy]") {
  const ModelCase mc =
      GENERATE(values<ModelCase>({kGqaCase,
                                  {"HV=H, safe gate -5, bf16 conv, no bias", 2, 2, GateKind::kSafe,
                                   ConvWeightType::kBF16, false}}));
  const int L = GENERATE(8, 16);
  const int interval = GENERATE(0, 6);
  CAPTURE(mc.name, L, interval);
  Pair p(mc, L, interval);
  REQUIRE(p.lazy.backend->lazy_write_back());
  REQUIRE(p.lazy.backend->deferred_commit());
  REQUIRE_FALSE(p.lazy.pool().ring_u(0).defined());  // no u records
  std::mt19937 rng(static_cast<uint32_t>(7 + L + interval));
  const int S = p.eager.pool().num_slots();
  for (int r = 0; r < 30; ++r) {
    CAPTURE(r);
    // A random batch (random_round); a bad accepted length: both backends skip and flag it.
    const RandomRound rr = random_round(rng, S);
    const BatchSpec& batch = rr.batch;
    const std::vector<int32_t>& accepted = rr.accepted;
    const bool bad = rr.bad;
    CAPTURE(accepted);
    round_on_both(p, batch, accepted, 500 + 10 * static_cast<uint64_t>(r));
    for (Harness* h : {&p.eager, &p.lazy}) {
      if (bad) {
        CHECK(
            error_of([&] { h->backend->check_device_errors(nullptr); }, ErrorCode::kInvalidArgument)
                .find("an accepted length outside [1, T]") != std::string::npos);
      } else {
        h->backend->check_device_errors(nullptr);
      }
    }
    if (r == 5) {
      check_states(p);  // part-way: the rounds go on from materialized slots
    }
  }
  check_states(p);
  CAPTURE(p.outputs.describe(), p.folds, p.max_pending);
  CHECK(p.outputs.meets_contract());
  CHECK(p.folds >= 1);
  CHECK(p.max_pending >= 1);
  if (interval > 0) {
    CHECK(p.max_pending < interval);
  }
}

TEST_CASE("backend lazy: abort_round, extend and slot reuse with pending steps",
          "[backend][lazy]") {
  Pair p(kGqaCase, 16);
  const BatchSpec batch{kT, {3, 0, 4}, {}};
  round_on_both(p, batch, {2, kT, 1}, 10);  // steps now pending in slots 3, 0, 4
  round_on_both(p, batch, {1, 2, 3}, 15);
  REQUIRE(pending_all(p.lazy)[3] == 3);

  SECTION("abort before any layer, after some, after all: the state and counts stay") {
    for (const int after : {0, 1, kLayers}) {
      CAPTURE(after);
      const auto pending = pending_all(p.lazy);
      const uint64_t before = pool_checksum(p.lazy.pool());
      round_on_both(p, {kT, {0, 4, 3}, {}}, {}, 20, after);
      CHECK(pending_all(p.lazy) == pending);
      CHECK(same_bits(p.eager.pool().ssm_state_all(), bytes_of(p.eager.pool().ssm_state_all())));
      (void)before;
      round_on_both(p, {2, {4, 1}, {}}, {2, 1}, 30);
      check_states(p);
      round_on_both(p, batch, {1, 3, kT}, 40);
    }
  }
  SECTION("extend on slots with pending steps continues from the committed state") {
    const BatchSpec prompt{6, {0, -1, 3}, {}};
    for (Harness* h : {&p.eager, &p.lazy}) {
      h->backend->prepare_extend(prompt, nullptr);
    }
    for (int layer = 0; layer < kLayers; ++layer) {
      Activations xe = make_activations(p.eager.model, prompt.slots, prompt.T, 60 + layer);
      Activations xl = make_activations(p.lazy.model, prompt.slots, prompt.T, 60 + layer);
      p.eager.backend->extend(layer, xe.in, xe.out_view, nullptr);
      p.lazy.backend->extend(layer, xl.in, xl.out_view, nullptr);
      CHECK(same_bits(xe.out_view, bytes_of(xl.out_view)));  // extend's outputs are exact
    }
    check_states(p);
    round_on_both(p, batch, {kT, 1, 2}, 70);
    check_states(p);
  }
  SECTION("a released slot with pending steps is reused clean") {
    for (Harness* h : {&p.eager, &p.lazy}) {
      h->backend->release_slot(3);
      REQUIRE(h->backend->allocate_slot(nullptr) == 3);
    }
    CHECK(cursors(p.lazy)[3] == 0);
    CHECK(pending_all(p.lazy)[3] == 0);
    check_states(p);
    round_on_both(p, {kT, {3, 4}, {}}, {kT, 2}, 80);
    round_on_both(p, {kT, {4, 3}, {}}, {1, 3}, 90);
    check_states(p);
  }
}

TEST_CASE("backend lazy: the pool, the report and the kernel set", "[backend][lazy]") {
  Pair p(kGqaCase, 16);
  const PoolConfig& c = p.lazy.pool().config();
  CHECK(c.lazy_commit);
  CHECK(c.deferred_commit);
  CHECK_FALSE(c.deferred_u_records);
  const PoolMemoryReport r = p.lazy.backend->memory_report();
  CHECK(r.lazy_pending_capacity == 16 - kT);
  CHECK_THAT(r.to_string(), Catch::Contains("lazy write-back: a slot's ring holds up to 12 "
                                            "pending steps beside the next draft"));
  CHECK(p.eager.backend->memory_report().lazy_pending_capacity == 0);
  // u records cost nothing in the lazy pool: its rings are the eager pool's.
  CHECK(r.ring_per_slot == p.eager.backend->memory_report().ring_per_slot);
}

TEST_CASE("backend lazy: auto takes the lazy write-back where its table says it pays",
          "[backend][lazy][auto]") {
  // An engine-measured table (BackendOptions::lazy_policy_table) for the fixture's model at
  // L = 16, T = kT: at B >= 2 the lazy step's KDA share (100 us) beats the best fast step's
  // (150 us) and every exact one; at B = 1 it does not (the fast eager share is 100.5 us: within
  // kLazyMinGainPct). The commit table has no row of this model, so elsewhere auto commits eagerly.
  const ModelConfig m = model_for(kGqaCase);
  const LazyPolicyRow rows[] = {
      {m.H, m.HV, m.K, m.V, 16, kT, 1, 1300.0, 1310.0, 1100.5, 1120.0, 1100.0, 1000.0},
      {m.H, m.HV, m.K, m.V, 16, kT, 2, 1300.0, 1310.0, 1150.0, 1160.0, 1100.0, 1000.0},
  };
  const LazyPolicyCard card = {"engine card", 3352.0, rows, std::size(rows)};
  const auto mode_of = [&](NumericsRequest numerics, int L, int max_batch, bool fused = true) {
    EngineFlags f = flags_for(/*ring=*/true, /*deferred=*/false);
    f.deferred_commit = static_cast<int>(DeferredCommit::kAuto);
    f.verify_numerics = static_cast<int>(numerics);
    f.replayssm_cache_len = L;
    f.max_running_requests = max_batch;
    f.fused_verify = fused;
    BackendOptions o;
    o.lazy_policy_table = &card;
    Harness h(m, f, fake_platform(9, 0), o);
    const PoolConfig& c = h.pool().config();
    CHECK(c.lazy_commit == h.backend->lazy_write_back());
    CHECK(c.deferred_commit == h.backend->deferred_commit());
    CHECK((c.lazy_commit && c.deferred_u_records) == false);
    return h.backend->lazy_write_back()   ? "lazy"
           : h.backend->deferred_commit() ? "deferred"
                                          : "eager";
  };
  CHECK(std::string(mode_of(NumericsRequest::kFast, 16, kMaxRunning)) == "lazy");
  CHECK(std::string(mode_of(NumericsRequest::kAuto, 16, kMaxRunning)) == "lazy");
  CHECK(std::string(mode_of(NumericsRequest::kFast, 16, 2)) == "lazy");
  // The row's gain within the noise margin, no row below the smallest measured B, another L, exact
  // outputs, the unfused path: no lazy write-back.
  CHECK(std::string(mode_of(NumericsRequest::kFast, 16, 1)) == "eager");
  CHECK(std::string(mode_of(NumericsRequest::kFast, 8, kMaxRunning)) == "eager");
  CHECK(std::string(mode_of(NumericsRequest::kExact, 16, kMaxRunning)) == "eager");
  CHECK(std::string(mode_of(NumericsRequest::kFast, 16, kMaxRunning, /*fused=*/false)) == "eager");
  // The lazy backend auto chose runs rounds as --kda-deferred-commit lazy's does.
  {
    EngineFlags f = flags_for(/*ring=*/true, /*deferred=*/false);
    f.deferred_commit = static_cast<int>(DeferredCommit::kAuto);
    f.verify_numerics = static_cast<int>(NumericsRequest::kFast);
    f.replayssm_cache_len = 16;
    BackendOptions o;
    o.lazy_policy_table = &card;
    Harness by_auto(m, f, fake_platform(9, 0), o);
    Harness by_flag(m, lazy_flags(16, 0), fake_platform(9, 0));
    REQUIRE(by_auto.backend->lazy_write_back());
    std::mt19937 rng(5);
    for (int round = 0; round < 12; ++round) {
      const RandomRound rr = random_round(rng, by_auto.pool().num_slots());
      twin_round(by_auto, by_flag, rr, 300 + round);
      CHECK(pending_all(by_auto) == pending_all(by_flag));
      CHECK(cursors(by_auto) == cursors(by_flag));
    }
    by_flag.backend->materialize(allocated_slots(by_flag), nullptr);  // both lazy: fold both
    check_materialized_states(by_flag, by_auto);
  }
}
