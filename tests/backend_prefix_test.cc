// backend_prefix_test.cc: prefix caching (contract §9) in every commit mode (snapshot, ring
// eager, ring deferred), against independent backends, bitwise:
//   - copy_slot: the copy run forward equals the source run forward (outputs, state), and the
//     copy carries the deferred commit's pending steps;
//   - commit tracks: a track slot (garbage-filled before) equals the state of an independent
//     backend that commits exactly step + 1 tokens of the same round; every other slot equals
//     the untracked commit's; ring == snapshot == deferred tracks; invalid tracks (a slot not
//     allocated when commit() is called among them) raise the device error flag and write
//     nothing;
//   - extend tracks: the track slot equals an independent extend of the first k + 1 prompt
//     tokens; bad tracks are kda::Error with nothing changed;
//   - the errors of copy_slot change nothing.
//
// Runs on the host reference (backend_prefix_test, CI) and, linked with :backend_fixture_cuda,
// on the CUDA kernels (backend_prefix_cuda_test, GPU host; there the tracked eager fold also
// runs as the persistent fold).
#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "backend/kda_backend.h"
#include "core/platform.h"
#include "tests/backend_fixture.h"
#ifdef KDA_BACKEND_TEST_CUDA
#include "kernels/common/launch_utils.h"
#endif

using namespace kda;
using namespace kda::testing;

namespace {

// kRingDeferredUFree: the deferred commit without u records (--kda-verify-numerics fast: its B = 1
// verifies take the fast outputs, its folds compute u). Its committed state equals every other
// mode's; its outputs are compared only with its own (batch-invariant, contract §10 (a)).
// kRingLazy: the lazy write-back (contract §11): its verifies fold nothing,
// the commit folds when the ring is full; committed state as every other mode's, outputs fast.
enum class Mode { kSnapshot, kRingEager, kRingDeferred, kRingDeferredUFree, kRingLazy };
const char* mode_name(Mode m) {
  switch (m) {
    case Mode::kSnapshot:
      return "snapshot";
    case Mode::kRingEager:
      return "ring eager";
    case Mode::kRingDeferred:
      return "ring deferred";
    case Mode::kRingDeferredUFree:
      return "ring deferred u-free";
    case Mode::kRingLazy:
      return "ring lazy";
  }
  return "?";
}
bool deferred(Mode m) {
  return m == Mode::kRingDeferred || m == Mode::kRingDeferredUFree || m == Mode::kRingLazy;
}

Harness make_harness(Mode m) {
  EngineFlags f = flags_for(/*ring=*/m != Mode::kSnapshot, deferred(m));
  if (m == Mode::kRingDeferredUFree || m == Mode::kRingLazy) {
    f.verify_numerics = static_cast<int>(NumericsRequest::kFast);
  }
  if (m == Mode::kRingLazy) {
    f.deferred_commit = static_cast<int>(DeferredCommit::kLazy);
  }
  Harness h(kGqaCase, f, fake_platform(9, 0));
  REQUIRE(h.pool().config().deferred_u_records == (m == Mode::kRingDeferred || !deferred(m)));
  REQUIRE(h.backend->lazy_write_back() == (m == Mode::kRingLazy));
  return h;
}

std::vector<int32_t> all_slots(const Harness& h) {
  std::vector<int32_t> s;
  for (int i = 0; i < h.pool().num_slots(); ++i) {
    s.push_back(i);
  }
  return s;
}

// The slot's state as it is in the pool's views (no materialize): for "complete right after
// commit" checks.
std::vector<uint8_t> slot_state_as_is(const Harness& h, int slot) {
  std::vector<uint8_t> out;
  for (int layer = 0; layer < kLayers; ++layer) {
    for (const TensorView& v :
         {h.pool().ssm_state(layer).select(0, slot), h.pool().conv_state(layer).select(0, slot)}) {
      const std::vector<uint8_t> b = bytes_of(v);
      out.insert(out.end(), b.begin(), b.end());
    }
  }
  return out;
}

// The committed state of one slot, every layer: SSM then conv bytes (materialized first).
std::vector<uint8_t> slot_state(Harness& h, int slot) {
  h.backend->materialize({slot}, nullptr);
  return slot_state_as_is(h, slot);
}

// Random (never zero) SSM and conv state into `slot`, every layer: what a track must overwrite.
void fill_garbage(Harness& h, int slot, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> n(0.0f, 3.0f);
  for (int layer = 0; layer < kLayers; ++layer) {
    const TensorView ssm = h.pool().ssm_state(layer).select(0, slot);
    std::vector<float> f(static_cast<size_t>(ssm.numel()));
    for (float& x : f) {
      x = n(rng) + 0.5f;
    }
    from_host_vector(f, ssm);
    const TensorView conv = h.pool().conv_state(layer).select(0, slot);
    std::vector<bf16_t> c(static_cast<size_t>(conv.numel()));
    for (bf16_t& x : c) {
      x = float_to_bf16(n(rng) + 0.5f);
    }
    from_host_vector(c, conv);
  }
}

// Commits the prepared round with tracks (track_slots / track_steps: B entries each).
void commit_tracked(Harness& h, const std::vector<int32_t>& accepted,
                    const std::vector<int32_t>& track_slots,
                    const std::vector<int32_t>& track_steps) {
  const int64_t B = static_cast<int64_t>(accepted.size());
  Buffer acc = device_i32(accepted), ts = device_i32(track_slots), tk = device_i32(track_steps);
  h.backend->commit(acc.view(DType::kI32, {B}),
                    CommitTrack{ts.view(DType::kI32, {B}), tk.view(DType::kI32, {B})}, nullptr);
}

// Request `from`'s T rows of every input copied over request `to`'s (same inputs for both).
void same_inputs(Activations& x, int T, int from, int to) {
  for (Buffer* buf : {&x.qkv, &x.a, &x.b}) {
    std::vector<uint8_t> bytes(static_cast<size_t>(buf->bytes()));
    buf->download(bytes.data(), buf->bytes());
    const int64_t N = x.in.mixed_qkv.size(0);
    const int64_t row_bytes = buf->bytes() / N;
    std::copy_n(bytes.begin() + from * T * row_bytes, T * row_bytes,
                bytes.begin() + to * T * row_bytes);
    buf->upload(bytes.data(), buf->bytes());
  }
}

// Prefill inputs of the first `T` tokens of each request of `full` (T_full tokens each).
Activations first_tokens(const ModelConfig& m, const std::vector<int32_t>& slots,
                         const Activations& full, int T_full, int T) {
  Activations x = make_activations(m, slots, T, 999);
  const int64_t B = static_cast<int64_t>(slots.size());
  const Buffer* from[] = {&full.qkv, &full.a, &full.b};
  Buffer* to[] = {&x.qkv, &x.a, &x.b};
  for (int i = 0; i < 3; ++i) {
    std::vector<uint8_t> src(static_cast<size_t>(from[i]->bytes()));
    from[i]->download(src.data(), from[i]->bytes());
    std::vector<uint8_t> dst(static_cast<size_t>(to[i]->bytes()));
    const int64_t row_bytes = from[i]->bytes() / (B * T_full);
    for (int64_t n = 0; n < B; ++n) {
      std::copy_n(src.begin() + n * T_full * row_bytes, T * row_bytes,
                  dst.begin() + n * T * row_bytes);
    }
    to[i]->upload(dst.data(), to[i]->bytes());
  }
  return x;
}

void extend_all(Harness& h, const BatchSpec& batch, const ExtendTrack& track,
                std::vector<Activations>& acts) {
  h.backend->prepare_extend(batch, track, nullptr);
  for (int layer = 0; layer < kLayers; ++layer) {
    h.backend->extend(layer, acts[static_cast<size_t>(layer)].in,
                      acts[static_cast<size_t>(layer)].out_view, nullptr);
  }
}

// A round that leaves the deferred backend with pending steps in `slots` (and every backend
// with a committed state that differs from the fixture's).
void warm_up_round(Harness& h, const std::vector<int32_t>& slots, uint64_t seed) {
  verify_all(h, {kT, slots, {}}, seed);
  std::vector<int32_t> accepted;
  for (size_t i = 0; i < slots.size(); ++i) {
    accepted.push_back(1 + static_cast<int32_t>((i + seed) % kT));
  }
  commit(h, accepted);
}

}  // namespace

TEST_CASE("backend prefix: a copied slot run forward equals its source run forward",
          "[backend][prefix]") {
  const Mode mode = GENERATE(Mode::kSnapshot, Mode::kRingEager, Mode::kRingDeferred,
                             Mode::kRingDeferredUFree, Mode::kRingLazy);
  CAPTURE(mode_name(mode));
  Harness h = make_harness(mode);
  // Slot 0 (the source) and slot 3 (the destination) both have pending steps when deferred.
  warm_up_round(h, {0, 3, 1}, 3);
  h.backend->copy_slot(0, 3, nullptr);
  if (deferred(mode)) {
    const std::vector<int32_t> pending = to_host_vector<int32_t>(h.pool().ring_pending_all());
    const int S = h.pool().num_slots();
    for (int layer = 0; layer < kLayers; ++layer) {
      CHECK(pending[static_cast<size_t>(layer * S + 3)] == pending[static_cast<size_t>(layer * S)]);
      CHECK(pending[static_cast<size_t>(layer * S)] > 0);  // carried, not folded
    }
  }
  CHECK(slot_state(h, 3) == slot_state(h, 0));
  // Two rounds with the source and the copy side by side on the same inputs.
  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    const BatchSpec batch{kT, {3, 2, 0}, {}};  // the copy first, the source last
    h.backend->prepare(batch, nullptr);
    for (int layer = 0; layer < kLayers; ++layer) {
      Activations x = make_activations(h.model, batch.slots, kT, 50 + 10 * round + layer);
      same_inputs(x, kT, /*from=*/2, /*to=*/0);
      h.backend->verify(layer, x.in, x.out_view, nullptr);
      const int64_t rows = kT;
      CHECK(
          same_bits(x.out_view.narrow(0, 0, rows), bytes_of(x.out_view.narrow(0, 2 * rows, rows))));
    }
    commit(h, {2 + round, 1, 2 + round});
    CHECK(slot_state(h, 3) == slot_state(h, 0));
  }
}

TEST_CASE("backend prefix: copy_slot errors change nothing", "[backend][prefix]") {
  const Mode mode =
      GENERATE(Mode::kSnapshot, Mode::kRingDeferred, Mode::kRingDeferredUFree, Mode::kRingLazy);
  CAPTURE(mode_name(mode));
  Harness h = make_harness(mode);
  h.backend->release_slot(4);
  const uint64_t before = pool_checksum(h.pool());
  CHECK(error_of([&] { h.backend->copy_slot(4, 0, nullptr); }, ErrorCode::kInvalidArgument) ==
        "copy_slot: src = 4 is not an allocated slot in [0, 5)");
  CHECK(error_of([&] { h.backend->copy_slot(0, 5, nullptr); }, ErrorCode::kInvalidArgument) ==
        "copy_slot: dst = 5 is not an allocated slot in [0, 5)");
  CHECK(error_of([&] { h.backend->copy_slot(-1, 0, nullptr); }, ErrorCode::kInvalidArgument) ==
        "copy_slot: src = -1 is not an allocated slot in [0, 5)");
  CHECK(error_of([&] { h.backend->copy_slot(2, 2, nullptr); }, ErrorCode::kInvalidArgument) ==
        "copy_slot: src and dst are both 2 (distinct slots)");
  h.backend->prepare({kT, {0}, {}}, nullptr);
  CHECK(error_of([&] { h.backend->copy_slot(1, 2, nullptr); }, ErrorCode::kLifecycle)
            .find("copy_slot: a round is in progress") == 0);
  h.backend->abort_round(nullptr);
  CHECK(pool_checksum(h.pool()) == before);
}

TEST_CASE("backend prefix: a commit track equals an independent commit of step + 1 tokens",
          "[backend][prefix]") {
  // Requests on slots 1 and 0 (reversed) with a padding row between; tracks into 3 and 4,
  // slot 2 sits the round out. Every mode's pools are compared with every other's at the end.
  const BatchSpec batch{kT, {1, -1, 0}, {}};
  const std::vector<int32_t> accepted = {4, 2, 3};
  const std::vector<int32_t> track_slots = {4, 2, 3};  // the padding row's entries are ignored
  const std::vector<int32_t> track_steps = {1, 0, 2};
  std::vector<std::vector<uint8_t>> tracked_pools;
  for (const Mode mode :
       {Mode::kSnapshot, Mode::kRingEager, Mode::kRingDeferred, Mode::kRingDeferredUFree}) {
    CAPTURE(mode_name(mode));
    Harness tracked = make_harness(mode), plain = make_harness(mode), short_ = make_harness(mode);
    for (Harness* h : {&tracked, &plain, &short_}) {
      warm_up_round(*h, {0, 2, 1}, 5);  // deferred: pending steps before the tracked round
    }
    fill_garbage(tracked, 3, 11);
    fill_garbage(tracked, 4, 12);
    const std::vector<uint8_t> untouched = slot_state(tracked, 2);

    verify_all(tracked, batch, 21);
    verify_all(plain, batch, 21);
    verify_all(short_, batch, 21);
    commit_tracked(tracked, accepted, track_slots, track_steps);
    commit(plain, accepted);
    commit(short_, {2, 2, 3});  // step + 1 accepted tokens of each tracked request
#ifdef KDA_BACKEND_TEST_CUDA
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
#endif
    tracked.backend->check_device_errors(nullptr);  // no error
    // Complete once the commit ran, without a materialize: no pending steps in track slots.
    if (deferred(mode)) {
      const std::vector<int32_t> pending =
          to_host_vector<int32_t>(tracked.pool().ring_pending_all());
      const int S = tracked.pool().num_slots();
      for (int layer = 0; layer < kLayers; ++layer) {
        CHECK(pending[static_cast<size_t>(layer * S + 3)] == 0);
        CHECK(pending[static_cast<size_t>(layer * S + 4)] == 0);
        CHECK(pending[static_cast<size_t>(layer * S + 1)] == 4);  // the request stays deferred
      }
    }
    CHECK(slot_state_as_is(tracked, 4) == slot_state(short_, 1));
    CHECK(slot_state_as_is(tracked, 3) == slot_state(short_, 0));
    for (const int s : {0, 1}) {
      CAPTURE(s);
      CHECK(slot_state(tracked, s) == slot_state(plain, s));
    }
    CHECK(slot_state(tracked, 2) == untouched);
    // The track slot, run forward, equals the short backend's request run forward.
    tracked.backend->materialize(all_slots(tracked), nullptr);
    verify_all(tracked, {kT, {4, 3}, {}}, 31);
    verify_all(short_, {kT, {1, 0}, {}}, 31);
    commit(tracked, {3, 1});
    commit(short_, {3, 1});
    CHECK(slot_state(tracked, 4) == slot_state(short_, 1));
    CHECK(slot_state(tracked, 3) == slot_state(short_, 0));
    std::vector<uint8_t> pool;
    for (const int s : all_slots(tracked)) {
      const std::vector<uint8_t> b = slot_state(tracked, s);
      pool.insert(pool.end(), b.begin(), b.end());
    }
    tracked_pools.push_back(pool);
  }
  CHECK(tracked_pools[0] == tracked_pools[1]);  // snapshot == ring
  CHECK(tracked_pools[1] == tracked_pools[2]);  // eager == deferred
  CHECK(tracked_pools[2] == tracked_pools[3]);  // u records == u-free
}

#ifdef KDA_BACKEND_TEST_CUDA
TEST_CASE("backend prefix: the tracked persistent fold equals the per-item fold",
          "[backend][prefix]") {
  // The persistent fold serves large batches only; forced here with two CTAs so that each walks
  // many items.
  const BatchSpec batch{kT, {1, 2, 0, 3}, {}};
  std::vector<std::vector<uint8_t>> states;
  for (const kernels::PersistentMode m :
       {kernels::PersistentMode::kNever, kernels::PersistentMode::kAlways}) {
    Harness h = make_harness(Mode::kRingEager);
    fill_garbage(h, 4, 13);
    verify_all(h, batch, 41);
    h.launch->persistent = m;
    h.launch->persistent_max_ctas = 2;
    commit_tracked(h, {3, 4, 2, 1}, {-1, 4, -1, -1}, {-1, 2, -1, -1});
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    std::vector<uint8_t> all;
    for (const int s : all_slots(h)) {
      const std::vector<uint8_t> b = slot_state(h, s);
      all.insert(all.end(), b.begin(), b.end());
    }
    states.push_back(all);
  }
  CHECK(states[0] == states[1]);
}
#endif

TEST_CASE("backend prefix: invalid commit tracks raise the device error flag, write nothing",
          "[backend][prefix]") {
  const Mode mode = GENERATE(Mode::kSnapshot, Mode::kRingEager, Mode::kRingDeferred,
                             Mode::kRingDeferredUFree, Mode::kRingLazy);
  CAPTURE(mode_name(mode));
  struct Case {
    const char* what;
    std::vector<int32_t> slots, steps;
  };
  const Case c = GENERATE(values<Case>({
      {"step at the accepted length", {3, -1}, {2, -1}},
      {"track slot in the batch", {1, -1}, {0, -1}},
      {"track slot out of range", {5, -1}, {0, -1}},
      {"one track slot claimed twice", {3, 3}, {0, 1}},
  }));
  CAPTURE(c.what);
  Harness h = make_harness(mode), plain = make_harness(mode);
  fill_garbage(h, 3, 17);
  const std::vector<uint8_t> garbage = slot_state(h, 3);
  verify_all(h, {kT, {0, 1}, {}}, 61);
  verify_all(plain, {kT, {0, 1}, {}}, 61);
  commit_tracked(h, {2, 3}, c.slots, c.steps);
  commit(plain, {2, 3});
  const std::string msg =
      error_of([&] { h.backend->check_device_errors(nullptr); }, ErrorCode::kInvalidArgument);
  CHECK(msg.find("a track step at or beyond its accepted length") != std::string::npos);
  CHECK(msg.find("accepted length outside") == std::string::npos);
  CHECK(slot_state(h, 3) == garbage);  // nothing written
  for (const int s : {0, 1, 2}) {
    CHECK(slot_state(h, s) == slot_state(plain, s));  // the commit itself went on
  }
  h.backend->check_device_errors(nullptr);  // cleared
}

TEST_CASE("backend prefix: a commit track into a slot that is not allocated writes nothing",
          "[backend][prefix]") {
  // The allocation table the tracks see is the host's when commit() is called: a slot released
  // before the round or during it is refused (flagged, nothing written, its pending counts kept),
  // one allocated during the round is tracked.
  const Mode mode = GENERATE(Mode::kSnapshot, Mode::kRingEager, Mode::kRingDeferred,
                             Mode::kRingDeferredUFree, Mode::kRingLazy);
  enum class When { kBeforeRound, kDuringRound, kReallocatedDuringRound };
  const When when = GENERATE(When::kBeforeRound, When::kDuringRound, When::kReallocatedDuringRound);
  CAPTURE(mode_name(mode), static_cast<int>(when));
  Harness h = make_harness(mode), plain = make_harness(mode), ref = make_harness(mode);
  for (Harness* x : {&h, &plain, &ref}) {
    warm_up_round(*x, {0, 1, 3}, 13);  // deferred: slot 3 has pending steps
  }
  fill_garbage(h, 3, 23);
  if (when != When::kDuringRound) {
    h.backend->release_slot(3);
  }
  const std::vector<uint8_t> before = slot_state_as_is(h, 3);
  const std::vector<int32_t> pending = mode == Mode::kSnapshot
                                           ? std::vector<int32_t>()
                                           : to_host_vector<int32_t>(h.pool().ring_pending_all());
  const BatchSpec batch{kT, {0, 1}, {}};
  for (Harness* x : {&h, &plain, &ref}) {
    verify_all(*x, batch, 63);
  }
  if (when == When::kDuringRound) {
    h.backend->release_slot(3);
  } else if (when == When::kReallocatedDuringRound) {
    REQUIRE(h.backend->allocate_slot(nullptr) == 3);  // the only free slot, zeroed
  }
  commit_tracked(h, {2, 3}, {3, -1}, {1, -1});
  commit_tracked(ref, {2, 3}, {3, -1}, {1, -1});
  commit(plain, {2, 3});
#ifdef KDA_BACKEND_TEST_CUDA
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
#endif
  ref.backend->check_device_errors(nullptr);
  if (when == When::kReallocatedDuringRound) {
    h.backend->check_device_errors(nullptr);  // a valid track
    CHECK(slot_state_as_is(h, 3) == slot_state_as_is(ref, 3));
  } else {
    const std::string msg =
        error_of([&] { h.backend->check_device_errors(nullptr); }, ErrorCode::kInvalidArgument);
    CHECK(msg.find("not allocated") != std::string::npos);
    CHECK(slot_state_as_is(h, 3) == before);  // nothing written
    if (mode != Mode::kSnapshot) {            // slot 3's pending counts (deferred: warm-up's) kept
      const std::vector<int32_t> after = to_host_vector<int32_t>(h.pool().ring_pending_all());
      for (int layer = 0; layer < kLayers; ++layer) {
        const size_t at = static_cast<size_t>(layer * h.pool().num_slots() + 3);
        CHECK(after[at] == pending[at]);
        CHECK((mode == Mode::kRingEager || pending[at] > 0));
      }
    }
  }
  for (const int s : {0, 1, 2}) {
    CHECK(slot_state(h, s) == slot_state(plain, s));  // the commit itself went on
  }
}

TEST_CASE("backend prefix: commit track views are validated", "[backend][prefix]") {
  Harness h = make_harness(Mode::kRingEager);
  verify_all(h, {kT, {0, 1}, {}}, 71);
  const uint64_t before = pool_checksum(h.pool());
  Buffer acc = device_i32({2, 3}), ts = device_i32({3, 4, 0}), tk = device_i32({0, 1});
  const TensorView a = acc.view(DType::kI32, {2});
  CHECK(error_of(
            [&] {
              h.backend->commit(
                  a, CommitTrack{ts.view(DType::kI32, {3}), tk.view(DType::kI32, {2})}, nullptr);
            },
            ErrorCode::kInvalidArgument)
            .find("commit: track.slots") == 0);
  CHECK(error_of(
            [&] {
              h.backend->commit(
                  a, CommitTrack{ts.view(DType::kI32, {2}), tk.view(DType::kF32, {2})}, nullptr);
            },
            ErrorCode::kInvalidArgument)
            .find("commit: track.steps") == 0);
  CHECK(pool_checksum(h.pool()) == before);
  CHECK(h.backend->round_kind() == RoundKind::kVerify);  // still committable
  commit(h, {2, 3});
}

TEST_CASE("backend prefix: an extend track equals an independent extend of k + 1 tokens",
          "[backend][prefix]") {
  constexpr int kPrompt = 6;  // > T_max: extend needs no scratch
  const Mode mode = GENERATE(Mode::kSnapshot, Mode::kRingEager, Mode::kRingDeferred,
                             Mode::kRingDeferredUFree, Mode::kRingLazy);
  CAPTURE(mode_name(mode));
  Harness h = make_harness(mode), ref = make_harness(mode);
  warm_up_round(h, {0, 1, 3}, 7);  // deferred: the requests and a track slot have pending steps
  warm_up_round(ref, {0, 1, 3}, 7);
  fill_garbage(h, 4, 19);
  const BatchSpec batch{kPrompt, {1, 0}, {}};
  const ExtendTrack track{{3, 4}, {2, kPrompt - 1}};  // mid-prompt, and the last token
  std::vector<Activations> full, head;
  for (int layer = 0; layer < kLayers; ++layer) {
    full.push_back(make_activations(h.model, batch.slots, kPrompt, 80 + layer));
    head.push_back(first_tokens(h.model, batch.slots, full.back(), kPrompt, 3));
  }
  extend_all(h, batch, track, full);
  std::vector<uint8_t> out_h;
  for (const Activations& x : full) {
    const std::vector<uint8_t> b = bytes_of(x.out_view);
    out_h.insert(out_h.end(), b.begin(), b.end());
  }
  extend_all(ref, {3, {1, 0}, {}}, ExtendTrack{}, head);
  CHECK(slot_state(h, 3) == slot_state(ref, 1));  // after prompt token 2 of request 0
  CHECK(slot_state(h, 4) == slot_state(h, 0));    // after the last token of request 1
  // The same extend without tracks: same outputs and request state.
  Harness plain = make_harness(mode);
  warm_up_round(plain, {0, 1, 3}, 7);
  std::vector<Activations> again;
  for (int layer = 0; layer < kLayers; ++layer) {
    again.push_back(make_activations(h.model, batch.slots, kPrompt, 80 + layer));
  }
  extend_all(plain, batch, ExtendTrack{}, again);
  std::vector<uint8_t> out_plain;
  for (const Activations& x : again) {
    const std::vector<uint8_t> b = bytes_of(x.out_view);
    out_plain.insert(out_plain.end(), b.begin(), b.end());
  }
  CHECK(out_h == out_plain);
  for (const int s : {0, 1, 2}) {
    CHECK(slot_state(h, s) == slot_state(plain, s));
  }
  if (deferred(mode)) {  // the track slot's own pending steps were dropped
    const std::vector<int32_t> pending = to_host_vector<int32_t>(h.pool().ring_pending_all());
    for (int layer = 0; layer < kLayers; ++layer) {
      CHECK(pending[static_cast<size_t>(layer * h.pool().num_slots() + 3)] == 0);
    }
  }
}

TEST_CASE("backend prefix: bad extend tracks are kda::Error and change nothing",
          "[backend][prefix]") {
  Harness h = make_harness(Mode::kRingDeferred);
  warm_up_round(h, {0, 1, 3}, 9);
  h.backend->release_slot(2);
  const uint64_t before = pool_checksum(h.pool());
  const std::vector<int32_t> pending = to_host_vector<int32_t>(h.pool().ring_pending_all());
  const BatchSpec batch{3, {0, 1}, {}};
  const auto bad = [&](const ExtendTrack& t) {
    return error_of([&] { h.backend->prepare_extend(batch, t, nullptr); },
                    ErrorCode::kInvalidArgument);
  };
  CHECK(bad({{3}, {0}}) ==
        "prepare_extend: ExtendTrack.slots / steps have 1 / 1 entries for 2 requests (both B, or "
        "both empty = no tracks)");
  CHECK(bad({{3, -1}, {3, -1}}) ==
        "prepare_extend: track.steps[0] = 3 out of range [-1, T = 3) (-1 = no track)");
  CHECK(bad({{3, -1}, {-2, -1}}) ==
        "prepare_extend: track.steps[0] = -2 out of range [-1, T = 3) (-1 = no track)");
  CHECK(bad({{2, -1}, {0, -1}}) ==
        "prepare_extend: track.slots[0] = 2 is not an allocated slot in [0, 5)");
  CHECK(bad({{-1, 1}, {-1, 0}}) ==
        "prepare_extend: track.slots[1] = 1 is also slots[1] (a track slot is outside the batch)");
  CHECK(bad({{3, 3}, {0, 1}}) ==
        "prepare_extend: track.slots[0] and track.slots[1] are both 3 (one track per slot)");
  CHECK(pool_checksum(h.pool()) == before);
  CHECK(to_host_vector<int32_t>(h.pool().ring_pending_all()) == pending);
  CHECK(h.backend->round_kind() == RoundKind::kNone);
  // A track slot cannot be released during its extend round.
  h.backend->prepare_extend(batch, {{3, -1}, {1, -1}}, nullptr);
  CHECK(error_of([&] { h.backend->release_slot(3); }, ErrorCode::kLifecycle)
            .find("release_slot: slot 3 is the track slot of request 0") == 0);
  h.backend->abort_round(nullptr);
}
