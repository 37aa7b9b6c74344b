// pool_test.cc: KdaStatePool invariants, views, slot reuse and the memory report.
#include <cuda_runtime_api.h>
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/error.h"
#include "core/platform.h"
#include "memory_pool/kda_state_pool.h"
#include "memory_pool/slot_allocator.h"

using namespace kda;

namespace {

// A small valid config: D = 2*2*64 + 4*64 = 512.
PoolConfig small_config(bool ring_mode) {
  PoolConfig c;
  c.layers = 2;
  c.H = 2;
  c.HV = 4;
  c.K = 64;
  c.V = 64;
  c.num_slots = 5;
  c.num_rows = 3;
  c.T_max = 4;
  c.ring_mode = ring_mode;
  c.ring_len = 8;
  return c;
}

std::string error_message(const std::function<void()>& f, ErrorCode* code = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (code != nullptr) {
      *code = e.code();
    }
    return e.message();
  }
  return "<no error>";
}

template <typename T>
void fill_view(const TensorView& v, T value) {
  from_host_vector(std::vector<T>(static_cast<size_t>(v.numel()), value), v);
}

template <typename T>
bool all_equal(const TensorView& v, T value) {
  for (const T& x : to_host_vector<T>(v)) {
    if (std::memcmp(&x, &value, sizeof(T)) != 0) {
      return false;
    }
  }
  return true;
}

}  // namespace

TEST_CASE("pool: every bad config raises a precise error", "[pool]") {
  struct BadCase {
    const char* what;
    std::function<void(PoolConfig&)> mutate;
    const char* message;
  };
  const std::vector<BadCase> cases = {
      {"layers", [](PoolConfig& c) { c.layers = 0; }, "PoolConfig.layers: expected >= 1, got 0"},
      {"H", [](PoolConfig& c) { c.H = -1; }, "PoolConfig.H: expected >= 1, got -1"},
      {"V", [](PoolConfig& c) { c.V = 0; }, "PoolConfig.V: expected >= 1, got 0"},
      {"slots", [](PoolConfig& c) { c.num_slots = 0; },
       "PoolConfig.num_slots: expected >= 1, got 0"},
      {"rows", [](PoolConfig& c) { c.num_rows = 0; }, "PoolConfig.num_rows: expected >= 1, got 0"},
      {"T_max", [](PoolConfig& c) { c.T_max = 0; }, "PoolConfig.T_max: expected >= 1, got 0"},
      {"K", [](PoolConfig& c) { c.K = 96; }, "PoolConfig.K: expected 64 or 128, got 96"},
      {"GQA", [](PoolConfig& c) { c.HV = 3; },
       "PoolConfig.HV: expected a multiple of H = 2, got 3"},
      {"L pow2", [](PoolConfig& c) { c.ring_len = 12; },
       "PoolConfig.ring_len: spec-verify ring length must be a power of two, got 12"},
      {"L >= 2T", [](PoolConfig& c) { c.ring_len = 4; },
       "PoolConfig.ring_len: spec-verify ring too small: expected >= 2 * T_max = 8, got 4"},
      {"budget sign", [](PoolConfig& c) { c.memory_budget_bytes = -1; },
       "PoolConfig.memory_budget_bytes: expected >= 0 (0 = no budget), got -1"},
      {"overflow",
       [](PoolConfig& c) {
         c.layers = 1 << 20;
         c.num_slots = 1 << 30;
       },
       "PoolConfig: a pool tensor size overflows int64 (factors too large)"},
  };
  for (const BadCase& bad : cases) {
    CAPTURE(bad.what);
    PoolConfig c = small_config(/*ring_mode=*/true);
    bad.mutate(c);
    ErrorCode code = ErrorCode::kInternal;
    CHECK(error_message([&] { KdaStatePool pool(c); }, &code) == bad.message);
    CHECK(code == ErrorCode::kInvalidArgument);
  }
  SECTION("the deferred commit's u records need ring mode") {
    PoolConfig c = small_config(/*ring_mode=*/false);
    c.deferred_commit = true;
    ErrorCode code = ErrorCode::kInternal;
    CHECK(error_message([&] { KdaStatePool pool(c); }, &code) ==
          "PoolConfig.deferred_commit: the deferred commit is ring mode only (ring_mode is off)");
    CHECK(code == ErrorCode::kInvalidArgument);
  }
  SECTION("ring-length rules apply in ring mode only") {
    PoolConfig c = small_config(/*ring_mode=*/false);
    c.ring_len = 4;
    CHECK_NOTHROW(KdaStatePool(c));
  }
  SECTION("a budget too small names both modes' needs") {
    PoolConfig c = small_config(/*ring_mode=*/false);
    const PoolMemoryReport r = compute_memory_report(c);
    c.memory_budget_bytes = r.total_bytes - 1;
    ErrorCode code = ErrorCode::kInternal;
    const std::string msg = error_message([&] { KdaStatePool pool(c); }, &code);
    CHECK(code == ErrorCode::kOutOfMemory);
    CHECK(msg == fmt::format("KDA state pool: snapshot mode needs {} bytes, over the memory "
                             "budget of {} bytes (ring mode would need {} bytes)",
                             r.total_bytes, r.total_bytes - 1, r.ring_mode_total_bytes));
    c.memory_budget_bytes = r.total_bytes;
    CHECK_NOTHROW(KdaStatePool(c));
  }
}

TEST_CASE("pool: views have the contract layouts in both modes", "[pool]") {
  const bool ring = GENERATE(false, true);
  CAPTURE(ring);
  const PoolConfig c = small_config(ring);
  KdaStatePool pool(c);
  const int64_t D = 512, S = 5, R = 3, T = 4, L = 8;
  CHECK(pool.qkv_dim() == D);
  for (int layer = 0; layer < 2; ++layer) {
    const TensorView conv = pool.conv_state(layer);
    CHECK(conv.shape_str() == "[5, 3, 512]");
    CHECK(conv.dtype() == DType::kBF16);
    CHECK(conv.is_contiguous());
    CHECK(static_cast<char*>(conv.data()) ==
          static_cast<char*>(pool.conv_state_all().data()) + layer * S * 3 * D * 2);
    CHECK(pool.ssm_state(layer).shape_str() == "[5, 4, 64, 64]");
    CHECK(pool.ssm_state(layer).dtype() == DType::kF32);
    CHECK(pool.conv_window(layer).shape_str() == "[3, 4, 3, 512]");
    if (ring) {
      CHECK_FALSE(pool.snapshots(layer).defined());
      CHECK(pool.ring_rawv(layer).shape_str() == "[5, 4, 8, 64]");
      CHECK(pool.ring_rawv(layer).strides_str() ==
            fmt::format("({}, {}, 64, 1)", 4 * L * 64, L * 64));
      CHECK(pool.ring_rawk(layer).shape_str() == "[5, 2, 8, 64]");
      CHECK(pool.ring_rawk(layer).dtype() == DType::kBF16);
      CHECK(pool.ring_g(layer).shape_str() == "[5, 4, 8, 64]");
      CHECK(pool.ring_g(layer).dtype() == DType::kF32);
      CHECK(pool.ring_beta(layer).shape_str() == "[5, 4, 8]");
    } else {
      CHECK(pool.snapshots(layer).shape_str() == "[3, 4, 4, 64, 64]");
      CHECK_FALSE(pool.ring_rawv(layer).defined());
      CHECK_FALSE(pool.ring_beta(layer).defined());
    }
  }
  CHECK(pool.qkv_act().shape_str() == fmt::format("[{}, {}]", R * T, D));
  CHECK(pool.conv_state_all().shape_str() == "[2, 5, 3, 512]");
  CHECK(all_equal(pool.ssm_state_all(), 0.0f));  // zeroed at construction
  CHECK(error_message([&] { pool.ssm_state(2); }) ==
        "KdaStatePool::ssm_state: layer 2 out of range [0, 2)");
  CHECK(error_message([&] { pool.conv_window(-1); }) ==
        "KdaStatePool::conv_window: layer -1 out of range [0, 2)");
}

TEST_CASE("pool: a released slot is reset before reuse; bad releases fail", "[pool]") {
  KdaStatePool pool(small_config(/*ring_mode=*/true));
  const int a = pool.allocate_slot();
  const int b = pool.allocate_slot();
  CHECK(a == 0);
  CHECK(b == 1);
  CHECK(pool.num_allocated_slots() == 2);
  // Dirty both slots in every layer and every per-slot tensor.
  for (int layer = 0; layer < 2; ++layer) {
    for (int s : {a, b}) {
      fill_view(pool.conv_state(layer).select(0, s), float_to_bf16(1.5f));
      fill_view(pool.ssm_state(layer).select(0, s), 2.5f);
      fill_view(pool.ring_rawv(layer).select(0, s), float_to_bf16(-1.0f));
      fill_view(pool.ring_rawk(layer).select(0, s), float_to_bf16(3.0f));
      fill_view(pool.ring_g(layer).select(0, s), -0.5f);
      fill_view(pool.ring_beta(layer).select(0, s), 0.25f);
    }
  }
  pool.release_slot(a);
  CHECK_FALSE(pool.is_slot_allocated(a));
  const int again = pool.allocate_slot();
  CHECK(again == a);  // most recently released first
  for (int layer = 0; layer < 2; ++layer) {
    CAPTURE(layer);
    CHECK(all_equal(pool.conv_state(layer).select(0, a), bf16_t{0}));
    CHECK(all_equal(pool.ssm_state(layer).select(0, a), 0.0f));
    CHECK(all_equal(pool.ring_rawv(layer).select(0, a), bf16_t{0}));
    CHECK(all_equal(pool.ring_rawk(layer).select(0, a), bf16_t{0}));
    CHECK(all_equal(pool.ring_g(layer).select(0, a), 0.0f));
    CHECK(all_equal(pool.ring_beta(layer).select(0, a), 0.0f));
    // The neighbour keeps its state.
    CHECK(all_equal(pool.ssm_state(layer).select(0, b), 2.5f));
    CHECK(all_equal(pool.ring_beta(layer).select(0, b), 0.25f));
  }

  CHECK(error_message([&] { pool.release_slot(3); }) ==
        "release_slot: slot 3 is not allocated (double release?)");
  pool.release_slot(b);
  CHECK(error_message([&] { pool.release_slot(b); }) ==
        "release_slot: slot 1 is not allocated (double release?)");
  CHECK(error_message([&] { pool.release_slot(5); }) ==
        "release_slot: slot 5 is not a slot of this pool (expected in [0, 5))");
  CHECK(error_message([&] { pool.release_slot(-1); }) ==
        "release_slot: slot -1 is not a slot of this pool (expected in [0, 5))");
  CHECK(pool.num_allocated_slots() == 1);

  while (pool.num_free_slots() > 0) {
    pool.allocate_slot();
  }
  ErrorCode code = ErrorCode::kInternal;
  CHECK(error_message([&] { pool.allocate_slot(); }, &code) ==
        "allocate_slot: all 5 state slots are in use (raise --max-running-requests or release "
        "finished requests)");
  CHECK(code == ErrorCode::kOutOfMemory);
}

TEST_CASE("pool: memory report numbers, both modes", "[pool]") {
  PoolConfig c = small_config(/*ring_mode=*/true);
  const PoolMemoryReport r = compute_memory_report(c);
  // Per slot, 2 layers: conv 3*512*2 B, ssm 4*64*64*4 B; rings at L = 8:
  // rawv 4*8*64*2 + rawk 2*8*64*2 + g 4*8*64*4 + beta 4*8*4.
  CHECK(r.conv_state_per_slot == 2 * 3 * 512 * 2);
  CHECK(r.ssm_state_per_slot == 2 * 4 * 64 * 64 * 4);
  CHECK(r.ring_per_slot ==
        2 * (4 * 8 * 64 * 2 + 2 * 8 * 64 * 2 + 4 * 8 * 64 * 4 + 4 * 8 * 4) + (2 + 1) * 4);
  CHECK(r.conv_window_per_row == 2 * 4 * 3 * 512 * 2);
  CHECK(r.snapshot_per_row == 2 * 4 * 4 * 64 * 64 * 4);
  CHECK(r.qkv_act_per_row == 4 * 512 * 2);
  CHECK(r.bytes_per_slot == r.conv_state_per_slot + r.ssm_state_per_slot + r.ring_per_slot);
  CHECK(r.bytes_per_row == r.conv_window_per_row + r.qkv_act_per_row);
  CHECK(r.total_bytes == 5 * r.bytes_per_slot + 3 * r.bytes_per_row);
  CHECK(r.ring_mode_total_bytes == r.total_bytes);
  CHECK(r.snapshot_mode_total_bytes ==
        r.total_bytes - 5 * r.ring_per_slot + 3 * r.snapshot_per_row);
  CHECK(r.ring_mode_savings_bytes() == 3 * r.snapshot_per_row - 5 * r.ring_per_slot);
  CHECK(r.ring_mode_savings_bytes() > 0);

  c.ring_mode = false;
  const PoolMemoryReport s = compute_memory_report(c);
  CHECK(s.total_bytes == r.snapshot_mode_total_bytes);
  CHECK(s.bytes_per_row == r.bytes_per_row + r.snapshot_per_row);
  CHECK(s.ring_mode_savings_bytes() == r.ring_mode_savings_bytes());

  const std::string text = r.to_string();
  CHECK_THAT(text, Catch::StartsWith("KDA state pool (ring mode): 5 slots, 3 scratch rows"));
  CHECK_THAT(text, Catch::Contains(fmt::format("({} B)", r.total_bytes)));
  CHECK_THAT(text, Catch::Contains(fmt::format("ring mode saves {:.2f} MiB ({} B)",
                                               r.ring_mode_savings_bytes() / 1048576.0,
                                               r.ring_mode_savings_bytes())));
  // Many slots, few rows: the rings outweigh the snapshots and the report says so.
  c.num_slots = 4000;
  c.num_rows = 1;
  const PoolMemoryReport many = compute_memory_report(c);
  CHECK(many.ring_mode_savings_bytes() < 0);
  CHECK_THAT(many.to_string(), Catch::Contains("ring mode saves nothing (costs"));

  KdaStatePool pool(small_config(/*ring_mode=*/true));
  CHECK(pool.memory_report().total_bytes == r.total_bytes);
  CHECK_FALSE(pool.ring_u(0).defined());  // only deferred pools hold u records

  // The deferred commit's u records: [layers, S, HV, L, V] f32 more per slot, zeroed, per layer.
  PoolConfig d = small_config(/*ring_mode=*/true);
  d.deferred_commit = true;
  const PoolMemoryReport rd = compute_memory_report(d);
  CHECK(rd.ring_per_slot == r.ring_per_slot + 2 * 4 * 8 * 64 * 4);
  CHECK(rd.total_bytes == r.total_bytes + 5 * 2 * 4 * 8 * 64 * 4);
  KdaStatePool deferred(d);
  CHECK(deferred.memory_report().total_bytes == rd.total_bytes);
  REQUIRE(deferred.ring_u(1).defined());
  CHECK(deferred.ring_u(1).dtype() == DType::kF32);
  CHECK(deferred.ring_u_all().numel() == 2 * 5 * 4 * 8 * 64);
  CHECK(all_equal<float>(deferred.ring_u_all(), 0.0f));
}

TEST_CASE("slot allocator: deterministic order, LIFO reuse", "[pool]") {
  SlotAllocator slots(3);
  CHECK(slots.allocate() == 0);
  CHECK(slots.allocate() == 1);
  slots.release(0);
  CHECK(slots.allocate() == 0);
  CHECK(slots.allocate() == 2);
  CHECK(slots.num_free() == 0);
  CHECK_FALSE(slots.is_allocated(7));
  CHECK_THROWS_AS(SlotAllocator(0), Error);
}

TEST_CASE("pool: CUDA memory is zeroed and a reused slot is reset on the stream", "[pool][gpu]") {
  const Platform platform = detect_platform(0);
  REQUIRE(platform.has_device);  // a [gpu] test without a device fails (style guide)
  PoolConfig c = small_config(/*ring_mode=*/true);
  c.device = Device::cuda(0);
  KdaStatePool pool(c);
  CHECK(pool.ssm_state(0).device() == Device::cuda(0));
  CHECK(all_equal(pool.ssm_state_all(), 0.0f));
  CHECK(all_equal(pool.ring_g_all(), 0.0f));
  CHECK(all_equal(pool.conv_window_all(), bf16_t{0}));
  const int a = pool.allocate_slot();
  const int b = pool.allocate_slot();
  for (int layer = 0; layer < 2; ++layer) {
    for (int s : {a, b}) {
      fill_view(pool.conv_state(layer).select(0, s), float_to_bf16(1.5f));
      fill_view(pool.ssm_state(layer).select(0, s), 2.5f);
      fill_view(pool.ring_rawk(layer).select(0, s), float_to_bf16(3.0f));
      fill_view(pool.ring_beta(layer).select(0, s), 0.25f);
    }
  }
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  pool.release_slot(a);
  CHECK(pool.allocate_slot(stream) == a);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  for (int layer = 0; layer < 2; ++layer) {
    CAPTURE(layer);
    CHECK(all_equal(pool.conv_state(layer).select(0, a), bf16_t{0}));
    CHECK(all_equal(pool.ssm_state(layer).select(0, a), 0.0f));
    CHECK(all_equal(pool.ring_rawk(layer).select(0, a), bf16_t{0}));
    CHECK(all_equal(pool.ring_beta(layer).select(0, a), 0.0f));
    CHECK(all_equal(pool.ssm_state(layer).select(0, b), 2.5f));
    CHECK(all_equal(pool.ring_rawk(layer).select(0, b), float_to_bf16(3.0f)));
  }
  cudaStreamDestroy(stream);
}
