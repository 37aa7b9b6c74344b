// backend_lifecycle_test.cc: KdaAttentionBackend's verify -> commit -> verify lifecycle over
// rounds of reordered slots, padding requests and explicit scratch rows: ring mode checked
// bitwise against an independent snapshot-mode backend (and a forced-unfused one) with
// per-request oracles for the committed state; extend against verify + a full commit; a bad
// accepted length flagged on the device, its request skipped.
//
// Runs on the host reference (backend_lifecycle_test, CI) and, linked with
// :backend_fixture_cuda, on the CUDA kernels (backend_lifecycle_cuda_test, GPU host).
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "backend/kda_backend.h"
#include "core/platform.h"
#include "kernels/kda_kernels.h"
#include "tests/backend_fixture.h"

using namespace kda;
using namespace kda::testing;

namespace {

// Checks one round's outputs of the ring backend against the snapshot backend (bitwise) and
// that padding requests' rows are zero.
void check_outputs_equal(const std::vector<Activations>& ring, const std::vector<Activations>& snap,
                         const std::vector<int32_t>& slots, int T, const ModelConfig& m) {
  const int64_t row_elems = static_cast<int64_t>(m.HV) * m.V;
  for (int layer = 0; layer < kLayers; ++layer) {
    CAPTURE(layer);
    const auto r = to_host_vector<bf16_t>(ring[static_cast<size_t>(layer)].out_view);
    const auto s = to_host_vector<bf16_t>(snap[static_cast<size_t>(layer)].out_view);
    REQUIRE(r.size() == s.size());
    CHECK(std::memcmp(r.data(), s.data(), r.size() * sizeof(bf16_t)) == 0);
    for (size_t n = 0; n < slots.size(); ++n) {
      if (slots[n] >= 0) {
        continue;
      }
      for (int64_t i = n * T * row_elems; i < static_cast<int64_t>((n + 1) * T) * row_elems; ++i) {
        REQUIRE(r[static_cast<size_t>(i)].bits == 0);
      }
    }
  }
}

}  // namespace

TEST_CASE("backend: ring mode commits bitwise like an independent snapshot-mode backend",
          "[backend]") {
  const ModelCase mc =
      GENERATE(values<ModelCase>({kGqaCase,
                                  {"HV=H, safe gate -5, bf16 conv, no bias", 2, 2, GateKind::kSafe,
                                   ConvWeightType::kBF16, false}}));
  CAPTURE(mc.name);
  // Ring mode on a pretended SM90: B = 1 rounds take the fused kernel, larger ones unfused.
  // Snapshot mode takes the fused kernel at every B; a third backend forces unfused.
  Harness ring(mc, /*ring=*/true, fake_platform(9, 0));
  Harness snap(mc, /*ring=*/false, Platform{});
  Harness unfused(mc, /*ring=*/false, Platform{}, /*fused=*/false);
  REQUIRE(same_bits(ring.pool().ssm_state_all(), snap.pool().ssm_state_all()));
  const std::vector<uint8_t> initial_conv = bytes_of(ring.pool().conv_state_all());
  const ModelConfig& m = ring.model;
  const int64_t D = m.qkv_dim();
  const int64_t S = ring.pool().num_slots();

  struct Round {
    BatchSpec batch;
    std::vector<int32_t> accepted;
  };
  const std::vector<Round> rounds = {
      // Reversed slots (slot != batch position), a padding row, n = 1, T and 2.
      {{kT, {4, 2, -1, 0}, {}}, {1, kT, 1, 2}},
      // The next round reads the committed state: B = 1 (fused ring), partial acceptance.
      {{kT, {2}, {}}, {2}},
      // Explicit scratch rows (not the batch position), full acceptance, shorter T.
      {{3, {0, 3, 4}, {2, 0, 3}}, {3, 3, 1}},
      // And once more after all of it.
      {{kT, {1, 4}, {}}, {kT, 2}},
  };
  int round_index = 0;
  for (const Round& round : rounds) {
    CAPTURE(round_index);
    const std::vector<uint8_t> conv_before = bytes_of(ring.pool().conv_state_all());
    const std::vector<uint8_t> ssm_before = bytes_of(ring.pool().ssm_state_all());
    const uint64_t seed = 1000 + static_cast<uint64_t>(round_index);
    const auto ring_acts = verify_all(ring, round.batch, seed);
    const auto snap_acts = verify_all(snap, round.batch, seed);
    const auto unfused_acts = verify_all(unfused, round.batch, seed);
    // Verify reads the committed state but never writes it.
    CHECK(same_bits(ring.pool().conv_state_all(), conv_before));
    CHECK(same_bits(ring.pool().ssm_state_all(), ssm_before));
    check_outputs_equal(ring_acts, snap_acts, round.batch.slots, round.batch.T, m);
    check_outputs_equal(unfused_acts, snap_acts, round.batch.slots, round.batch.T, m);

    commit(ring, round.accepted);
    commit(snap, round.accepted);
    commit(unfused, round.accepted);
    CHECK(same_bits(ring.pool().ssm_state_all(), snap.pool().ssm_state_all()));
    CHECK(same_bits(ring.pool().conv_state_all(), snap.pool().conv_state_all()));
    CHECK(same_bits(unfused.pool().ssm_state_all(), snap.pool().ssm_state_all()));

    // Independent oracles per request: the ring fold equals the snapshot-mode state after
    // token n-1 (read from the snapshot backend's scratch, not its commit), and the conv state
    // is the last W-1 raw inputs of concat(previous conv state, x[0..n)).
    for (size_t i = 0; i < round.batch.slots.size(); ++i) {
      const int32_t slot = round.batch.slots[i];
      if (slot < 0) {
        continue;
      }
      const int row = round.batch.rows.empty() ? static_cast<int>(i) : round.batch.rows[i];
      const int n = round.accepted[i];
      CAPTURE(i, slot, row, n);
      for (int layer = 0; layer < kLayers; ++layer) {
        CAPTURE(layer);
        const TensorView snapshot = snap.pool().snapshots(layer).select(0, row).select(0, n - 1);
        const TensorView committed = ring.pool().ssm_state(layer).select(0, slot);
        CHECK(same_bits(committed, snapshot));
        // ... and commit did move it.
        const size_t state_bytes = static_cast<size_t>(committed.numel()) * 4;
        const size_t state_at = static_cast<size_t>(layer * S + slot) * state_bytes;
        CHECK_FALSE(same_bits(committed,
                              std::vector<uint8_t>(ssm_before.begin() + state_at,
                                                   ssm_before.begin() + state_at + state_bytes)));
        // Expected conv state: the previous W-1 rows then the n raw inputs; keep the last 3.
        const size_t window_bytes = static_cast<size_t>(3 * D * 2);
        std::vector<uint8_t> history(conv_before.begin() + (layer * S + slot) * window_bytes,
                                     conv_before.begin() + (layer * S + slot + 1) * window_bytes);
        const std::vector<uint8_t> x = bytes_of(
            ring_acts[static_cast<size_t>(layer)].in.mixed_qkv.narrow(0, i * round.batch.T, n));
        const size_t pitch_bytes = static_cast<size_t>(D + kQkvPad) * 2;
        for (int t = 0; t < n; ++t) {  // drop each row's NaN padding
          history.insert(history.end(), x.begin() + t * pitch_bytes,
                         x.begin() + t * pitch_bytes + D * 2);
        }
        CHECK(same_bits(ring.pool().conv_state(layer).select(0, slot),
                        std::vector<uint8_t>(history.end() - window_bytes, history.end())));
      }
    }
    ++round_index;
  }
  // Which kernels ran: the counting kernel set proves the dispatch, not just the stats.
  const DispatchStats ring_stats = ring.backend->stats();
  CHECK(ring.counts->fused == kLayers);  // the B = 1 round only
  CHECK(ring.counts->unfused == 3 * kLayers);
  CHECK(ring_stats.fused_calls == kLayers);
  CHECK(ring_stats.unfused_calls == 3 * kLayers);
  REQUIRE(ring_stats.last_decision[0].has_value());
  CHECK(ring_stats.last_decision[0]->reason == DispatchReason::kRingBatchAboveLimit);
  CHECK(snap.counts->fused == 4 * kLayers);
  CHECK(snap.counts->unfused == 0);
  CHECK(snap.counts->last_block_v ==
        kernels::default_block_v(4, snap.model.HV, snap.model.V));  // last round: B = 4
  CHECK(unfused.counts->fused == 0);
  CHECK(unfused.backend->stats().last_decision[1]->reason == DispatchReason::kFusedDisabled);
  CHECK(ring.counts->commit == 4);
  CHECK_FALSE(same_bits(ring.pool().conv_state_all(), initial_conv));
}

TEST_CASE("backend: extend prefills past T_max and matches verify + full commit", "[backend]") {
  Harness ring(kGqaCase, /*ring=*/true, fake_platform(9, 0));
  Harness snap(kGqaCase, /*ring=*/false, Platform{});
  const ModelConfig& m = ring.model;

  SECTION("6-token prompts, ring and snapshot backends agree bitwise") {
    const BatchSpec batch{6, {3, -1, 1}, {}};
    std::vector<std::vector<uint8_t>> outs[2];
    int k = 0;
    for (Harness* h : {&ring, &snap}) {
      h->backend->prepare_extend(batch, nullptr);
      CHECK(h->backend->round_kind() == RoundKind::kExtend);
      for (int layer = 0; layer < kLayers; ++layer) {
        Activations x = make_activations(m, batch.slots, batch.T, 50 + layer);
        h->backend->extend(layer, x.in, x.out_view, nullptr);
        outs[k].push_back(bytes_of(x.out_view));
      }
      CHECK(h->backend->round_kind() == RoundKind::kNone);  // extend commits in place
      CHECK(h->counts->extend == kLayers);
      ++k;
    }
    const bool same_outputs = outs[0] == outs[1];
    CHECK(same_outputs);
    CHECK(same_bits(ring.pool().ssm_state_all(), snap.pool().ssm_state_all()));
    CHECK(same_bits(ring.pool().conv_state_all(), snap.pool().conv_state_all()));
  }
  SECTION("extend of T tokens == verify of T tokens + commit of n = T") {
    const BatchSpec batch{kT, {2, 0}, {}};
    ring.backend->prepare_extend(batch, nullptr);
    std::vector<std::vector<uint8_t>> extend_out;
    for (int layer = 0; layer < kLayers; ++layer) {
      Activations x = make_activations(m, batch.slots, batch.T, 70 + layer);
      ring.backend->extend(layer, x.in, x.out_view, nullptr);
      extend_out.push_back(bytes_of(x.out_view));
    }
    const auto snap_acts = verify_all(snap, batch, 7);
    for (int layer = 0; layer < kLayers; ++layer) {
      CHECK(same_bits(snap_acts[static_cast<size_t>(layer)].out_view,
                      extend_out[static_cast<size_t>(layer)]));
    }
    commit(snap, {kT, kT});
    CHECK(same_bits(ring.pool().ssm_state_all(), snap.pool().ssm_state_all()));
    CHECK(same_bits(ring.pool().conv_state_all(), snap.pool().conv_state_all()));
  }
}

TEST_CASE("backend: a bad accepted length is flagged on the device and skips the request",
          "[backend]") {
  Harness h(kGqaCase, /*ring=*/true, fake_platform(9, 0));
  const BatchSpec batch{kT, {0, 1}, {}};
  verify_all(h, batch, 11);
  const auto slot0_before = bytes_of(h.pool().ssm_state(0).select(0, 0));
  const auto slot1_before = bytes_of(h.pool().ssm_state(0).select(0, 1));
  commit(h, {kT + 1, 2});
  CHECK(same_bits(h.pool().ssm_state(0).select(0, 0), slot0_before));        // skipped
  CHECK_FALSE(same_bits(h.pool().ssm_state(0).select(0, 1), slot1_before));  // committed
  CHECK(error_of([&] { h.backend->check_device_errors(nullptr); }, ErrorCode::kInvalidArgument) ==
        "commit: an accepted length outside [1, T] (ragged: [1, T_n]) was passed; the affected "
        "requests were "
        "skipped and keep their previous committed state");
  CHECK_NOTHROW(h.backend->check_device_errors(nullptr));  // the flag was cleared
}
