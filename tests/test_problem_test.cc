// test_problem_test.cc: the invariants the host and GPU tests rely on.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "tests/test_problem.h"

using namespace kda;
using namespace kda::testing;

namespace {

VerifyCase padded_case() {
  VerifyCase c = make_case(3, 2, 1, 2, 64, 32, RecordMode::kRing, 11);
  c.bias = true;
  c.neg_slot = true;
  c.reversed = true;
  c.qkv_pad = 3;
  c.pitch_pad = 5;
  c.T_max = 4;
  return c;
}

bool all_nonzero_finite(const std::vector<float>& v) {
  for (float x : v) {
    if (x == 0.0f || !std::isfinite(x)) {
      return false;
    }
  }
  return true;
}

bool all_nonzero_finite(const std::vector<bf16_t>& v) {
  for (bf16_t x : v) {
    const float f = bf16_to_float(x);
    if (f == 0.0f || !std::isfinite(f)) {
      return false;
    }
  }
  return true;
}

}  // namespace

TEST_CASE("test_problem: slots, rows and params layout", "[host][test_problem]") {
  const VerifyCase c = padded_case();
  const VerifyProblem p(c);
  CAPTURE(c);
  CHECK(p.num_slots() == 5);
  CHECK(p.num_rows() == 4);
  CHECK(p.pad_request() == 1);
  // Reversed: from the top of [0, S) and [0, R); request 1 is padding.
  CHECK(p.slots() == std::vector<int32_t>{4, -1, 2});
  CHECK(p.rows() == std::vector<int32_t>{3, 2, 1});

  const VerifyParams vp = p.params(RecordMode::kRing);
  CHECK(vp.mixed_qkv_stride == p.D() + 3);
  CHECK(vp.a_stride == c.HV * c.K + 3);
  CHECK(vp.b_stride == c.HV + 3);
  CHECK(vp.ssm_slot_stride == p.state_elems() + 5);
  CHECK(vp.conv_window_row_stride == 4 * 3 * p.D() + 5);
  CHECK(vp.ring_beta_slot_stride == c.HV * c.L + 5);
  CHECK(vp.snapshots == nullptr);
  CHECK(vp.ring_rawk != nullptr);
  CHECK(vp.conv_bias != nullptr);
  const VerifyParams sp = p.params(RecordMode::kSnapshot);
  CHECK(sp.snapshots != nullptr);
  CHECK(sp.snapshot_row_stride == 4 * p.state_elems() + 5);
  CHECK(sp.ring_rawk == nullptr);
}

TEST_CASE("test_problem: the padding request is pad_at, inside the batch", "[host][test_problem]") {
  VerifyCase c = padded_case();
  c.pad_at = 0;
  CHECK(VerifyProblem(c).slots() == std::vector<int32_t>{-1, 3, 2});
  c.pad_at = 2;
  CHECK(VerifyProblem(c).slots() == std::vector<int32_t>{4, 3, -1});
  c.pad_at = 3;  // past the batch
  CHECK_THROWS_AS(VerifyProblem(c), Error);
  c.pad_at = -1;
  CHECK_THROWS_AS(VerifyProblem(c), Error);
}

TEST_CASE("test_problem: NaN where nothing may be read, garbage in every output",
          "[host][test_problem]") {
  const VerifyProblem p(padded_case());
  const auto qkv = p.qkv();
  const int64_t D = p.D();
  for (int64_t r = 0; r < p.N(); ++r) {
    const bool pad_row = r / 2 == 1;
    const float x = bf16_to_float(qkv[r * D]);
    CAPTURE(r);
    CHECK(std::isnan(x) == pad_row);
  }
  // Row padding of qkv (elements D..D+2 of each row) is NaN.
  const auto raw = p.raw(Tensor::kQkv);
  bf16_t pad_elem;
  std::memcpy(&pad_elem, raw.data() + 2 * D, sizeof(pad_elem));
  CHECK(std::isnan(bf16_to_float(pad_elem)));

  CHECK(all_nonzero_finite(p.out()));
  CHECK(all_nonzero_finite(p.conv_window()));
  CHECK(all_nonzero_finite(p.snapshots()));
  CHECK(all_nonzero_finite(p.rawv()));
  CHECK(all_nonzero_finite(p.rawk()));
  CHECK(all_nonzero_finite(p.ring_g()));
  CHECK(all_nonzero_finite(p.ring_beta()));
  CHECK(all_nonzero_finite(p.qkv_act()));
  CHECK(all_nonzero_finite(p.ssm_state()));
}

TEST_CASE("test_problem: seeded, per-tensor streams; clone is byte-identical",
          "[host][test_problem]") {
  VerifyCase c = padded_case();
  const VerifyProblem a(c);
  const VerifyProblem b(c);
  CHECK(bitwise_equal(a.raw(Tensor::kSsmState), b.raw(Tensor::kSsmState)));
  c.mode = RecordMode::kSnapshot;
  c.wtype = ConvWeightType::kBF16;
  const VerifyProblem other_knobs(c);
  CHECK(bitwise_equal(a.raw(Tensor::kQkv), other_knobs.raw(Tensor::kQkv)));
  c.seed += 1;
  const VerifyProblem reseeded(c);
  CHECK_FALSE(bitwise_equal(a.raw(Tensor::kQkv), reseeded.raw(Tensor::kQkv)));

  const VerifyProblem copy = a.clone_to(Device::host());
  for (int t = 0; t < static_cast<int>(Tensor::kCount); ++t) {
    CAPTURE(tensor_name(static_cast<Tensor>(t)));
    CHECK(bitwise_equal(a.raw(static_cast<Tensor>(t)), copy.raw(static_cast<Tensor>(t))));
  }
}

TEST_CASE("test_problem: comparison helpers", "[host][test_problem]") {
  const std::vector<float> ref{3.0f, 4.0f};
  CHECK(rel_l2(std::vector<double>{3.0, 4.0}, ref) == 0.0);
  CHECK(rel_l2(std::vector<float>{3.0f, 4.5f}, ref) == Approx(0.1));
  CHECK(std::isinf(rel_l2(std::vector<float>{1.0f}, ref)));
  CHECK(std::isinf(rel_l2(std::vector<float>{NAN, 4.0f}, ref)));
  CHECK(max_abs_diff(std::vector<float>{3.0f, 4.5f}, ref) == 0.5);

  const BitwiseResult same = bitwise_equal(ref, ref);
  CHECK(static_cast<bool>(same));
  const BitwiseResult zeros = bitwise_equal(std::vector<float>{0.0f}, std::vector<float>{-0.0f});
  CHECK_FALSE(static_cast<bool>(zeros));
  CHECK(zeros.first_diff == 0);
  const BitwiseResult bf = bitwise_equal(std::vector<bf16_t>{{0x3f80}, {0x3f80}},
                                         std::vector<bf16_t>{{0x3f80}, {0x3f81}});
  CHECK(bf.first_diff == 1);
  CHECK(bf.detail ==
        "first difference at [1] of 2: 0x3f80 (1) vs 0x3f81 (1.0078125); 1 "
        "elements differ");
}
