#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/buffer.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/logging.h"
#include "core/platform.h"
#include "core/tensor_view.h"

using namespace kda;

TEST_CASE("dtype: sizes and names", "[core]") {
  CHECK(dtype_size(DType::kBF16) == 2);
  CHECK(dtype_size(DType::kF16) == 2);
  CHECK(dtype_size(DType::kF32) == 4);
  CHECK(dtype_size(DType::kI32) == 4);
  CHECK(dtype_name(DType::kBF16) == "bf16");
  CHECK(dtype_name(DType::kI32) == "i32");
  CHECK(dtype_of<float> == DType::kF32);
}

TEST_CASE("dtype: bf16 rounds to nearest even", "[core]") {
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1 + 2^-7: ties go to even (1.0).
  CHECK(round_to_bf16(1.0f + 0x1p-8f) == 1.0f);
  // (1 + 2^-7) + 2^-8 is halfway between 1+2^-7 (odd mantissa) and 1+2^-6: goes up.
  CHECK(round_to_bf16(1.0f + 0x1p-7f + 0x1p-8f) == 1.0f + 0x1p-6f);
  CHECK(round_to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);
  CHECK(round_to_bf16(-3.0f) == -3.0f);
  CHECK(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  CHECK(std::isinf(round_to_bf16(std::numeric_limits<float>::infinity())));
  CHECK(float_to_bf16(1.0f).bits == 0x3f80);
}

TEST_CASE("tensor_view: strides, contiguity, select, narrow", "[core]") {
  float data[2 * 3 * 4];
  auto v = TensorView::contiguous(data, DType::kF32, Device::host(), {2, 3, 4});
  CHECK(v.ndim() == 3);
  CHECK(v.stride(0) == 12);
  CHECK(v.stride(1) == 4);
  CHECK(v.stride(2) == 1);
  CHECK(v.numel() == 24);
  CHECK(v.is_contiguous());
  CHECK(v.span_bytes() == 24 * 4);
  CHECK(v.shape_str() == "[2, 3, 4]");
  CHECK(v.strides_str() == "(12, 4, 1)");
  CHECK(v.describe() == "f32[2, 3, 4] strides (12, 4, 1) on host");

  auto s = v.select(0, 1);
  CHECK(s.ndim() == 2);
  CHECK(s.data() == data + 12);
  CHECK(s.is_contiguous());

  auto n = v.narrow(2, 1, 2);
  CHECK(n.size(2) == 2);
  CHECK(n.data() == data + 1);
  CHECK_FALSE(n.is_contiguous());
  CHECK(n.span_bytes() == (12 + 2 * 4 + 1 + 1) * 4);

  // A padded row pitch is not contiguous, but its inner dim is.
  TensorView padded(data, DType::kF32, Device::host(), {3, 5}, {8, 1});
  CHECK_FALSE(padded.is_contiguous());
  CHECK_NOTHROW(expect_inner_contiguous(padded, "x"));
  // Size-1 dims do not break contiguity whatever their stride.
  TensorView unit(data, DType::kF32, Device::host(), {1, 4}, {999, 1});
  CHECK(unit.is_contiguous());

  CHECK_THROWS_AS(v.select(0, 2), Error);
  CHECK_THROWS_AS(v.narrow(1, 2, 2), Error);
  CHECK_THROWS_AS(v.size(3), Error);
  CHECK_THROWS_AS(v.data_as<bf16_t>(), Error);
  CHECK(v.data_as<float>() == data);
}

TEST_CASE("tensor_view: boundary checks name the argument, expectation and value", "[core]") {
  float data[6];
  auto v = TensorView::contiguous(data, DType::kF32, Device::host(), {2, 3});
  try {
    expect_shape(v, "mixed_qkv", {2, 4});
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kInvalidArgument);
    CHECK(e.message() == "mixed_qkv: expected shape [2, 4], got [2, 3]");
    CHECK(std::string(e.what()).find("tensor_view.cc") != std::string::npos);
  }
  try {
    expect_dtype(v, "a", DType::kBF16);
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.message() == "a: expected dtype bf16, got f32");
  }
  try {
    expect_device(v, "ssm_state", Device::cuda(0));
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.message() == "ssm_state: expected memory on cuda:0, got host");
  }
  TensorView col(data, DType::kF32, Device::host(), {3, 2}, {1, 3});
  try {
    expect_inner_contiguous(col, "b");
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.message() == "b: expected the innermost dim contiguous (stride 1), got strides (1, 3)");
  }
  CHECK_NOTHROW(expect_shape(v, "x", {-1, 3}));
  try {
    expect_tensor(TensorView(), "conv_weight", DType::kF32, Device::host(), {4});
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.message() == "conv_weight: expected a tensor, got none (null data)");
  }
}

TEST_CASE("error: code names and formatted messages", "[core]") {
  try {
    KDA_CHECK(1 + 1 == 3, "slots[{}]: expected in [0, {}), got {}", 2, 8, 9);
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kInvalidArgument);
    CHECK(e.message() == "slots[2]: expected in [0, 8), got 9");
    CHECK(std::string(e.what()).rfind("[kda:invalid_argument] slots[2]", 0) == 0);
  }
  CHECK(std::string(error_code_name(ErrorCode::kLifecycle)) == "lifecycle");
  CHECK_THROWS_WITH([] { KDA_FAIL("x={}", 3); }(), Catch::Contains("x=3"));
}

TEST_CASE("buffer: host round trip and strided gather/scatter", "[core]") {
  Buffer b(Device::host(), 64 * sizeof(float));
  CHECK(reinterpret_cast<uintptr_t>(b.data()) % 256 == 0);
  auto v = b.view(DType::kF32, {4, 16});
  std::vector<float> src(64);
  for (size_t i = 0; i < src.size(); ++i) {
    src[i] = static_cast<float>(i) * 0.5f - 7.0f;
  }
  from_host_vector(src, v);
  CHECK(to_host_vector<float>(v) == src);
  auto sub = v.narrow(1, 3, 5);
  auto got = to_host_vector<float>(sub);
  REQUIRE(got.size() == 20);
  CHECK(got[0] == src[3]);
  CHECK(got[19] == src[3 * 16 + 7]);
  // Writing a strided view leaves the gaps alone.
  from_host_vector(std::vector<float>(20, 99.0f), sub);
  auto all = to_host_vector<float>(v);
  CHECK(all[2] == src[2]);
  CHECK(all[3] == 99.0f);
  CHECK(all[8] == src[8]);
  CHECK_THROWS_AS(b.view(DType::kF32, {65}), Error);
  Buffer moved = std::move(b);
  CHECK(b.data() == nullptr);
  CHECK(moved.bytes() == 64 * 4);
}

TEST_CASE("platform: detection without a GPU is clean; families", "[core]") {
  const Platform p = detect_platform();
  if (!p.has_device) {
    CHECK_FALSE(p.reason.empty());
    CHECK(p.describe().rfind("no CUDA device", 0) == 0);
    CHECK(p.family() == ArchFamily::kOther);
    CHECK(p.memory_gbps == 0.0);
    CHECK_THROWS_AS(Buffer(Device::cuda(0), 16), Error);
  } else {
    CHECK(p.sm_count > 0);
  }
  CHECK(fake_platform(9, 0).family() == ArchFamily::kSM90);
  CHECK(fake_platform(10, 0).family() == ArchFamily::kSM100);
  CHECK(fake_platform(10, 3).family() == ArchFamily::kSM100);
  CHECK(fake_platform(8, 9).family() == ArchFamily::kOther);
  CHECK(fake_platform(12, 0).family() == ArchFamily::kOther);
  CHECK(fake_platform(9, 0, 132).describe() == "fake sm_90 (sm_90, 132 SMs)");
  Platform h100 = fake_platform(9, 0, 132);
  h100.memory_gbps = 3352.32;
  CHECK(h100.describe() == "fake sm_90 (sm_90, 132 SMs, 3352 GB/s peak memory)");
}

TEST_CASE("logging: level by name, bad name rejected", "[core]") {
  set_log_level("debug");
  CHECK(logger().level() == spdlog::level::debug);
  set_log_level("info");
  CHECK(logger().level() == spdlog::level::info);
  CHECK_THROWS_WITH(set_log_level("loud"), Catch::Contains("got 'loud'"));
  CHECK(logger().level() == spdlog::level::info);
}
