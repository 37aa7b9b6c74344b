// kernels_validation_test.cc: the CUDA entry points reject bad parameters with a precise
// kda::Error before any CUDA call, so these run on a CPU-only machine (CI) too.
#include <fmt/format.h>
#include <catch2/catch.hpp>
#include <functional>
#include <string>
#include <utility>

#include "core/error.h"
#include "kernels/kda_kernels.h"
#include "tests/test_problem.h"

using namespace kda;
using namespace kda::testing;

namespace {

VerifyProblem small_problem(RecordMode mode) {
  VerifyCase c;
  c.B = 2;
  c.T = 4;
  c.H = 2;
  c.HV = 4;
  c.K = c.V = 64;
  c.mode = mode;
  c.seed = 77;
  return VerifyProblem(c, Device::host());  // validation never dereferences a pointer
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kInvalidArgument);
    return e.message();
  }
  return "<no error>";
}

}  // namespace

TEST_CASE("kernels: verify entry points validate before launching", "[kernels]") {
  const VerifyProblem pr = small_problem(RecordMode::kRing);
  const VerifyParams good = pr.params();
  auto fused = [&](VerifyParams p, int bv = 32) {
    return message_of([&] { kernels::invoke_verify_fused(p, bv, nullptr); });
  };
  CHECK(fused(good, 12) ==
        "invoke_verify_fused: block_v=12 unsupported, expected one of 8, 16, 32, 64, 128");
  VerifyParams p = good;
  p.K = 96;
  CHECK(fused(p) == "invoke_verify_fused: K=96 unsupported, expected 64 or 128");
  p = good;
  p.HV = 3;
  CHECK(fused(p) == "invoke_verify_fused: HV=3 is not a multiple of H=2");
  p = good;
  p.V = 63;
  CHECK(fused(p) == "invoke_verify_fused: V=63 must be even on CUDA (bf16 channel pairs)");
  p = good;
  p.T = p.T_max + 1;
  CHECK(fused(p) == "invoke_verify_fused: T=5 exceeds T_max=4 (the scratch step pitch)");
  p = good;
  p.L = 12;
  CHECK(fused(p) == "invoke_verify_fused: L=12 must be a power of two (ring mode)");
  p = good;
  p.ring_g = nullptr;
  CHECK(fused(p) == "invoke_verify_fused: ring_g is null, expected a pointer (ring mode)");
  p = good;
  p.mixed_qkv_stride = qkv_dim(p) - 2;
  CHECK(fused(p) == fmt::format("invoke_verify_fused: mixed_qkv_stride={} is smaller than D = {}",
                                qkv_dim(p) - 2, qkv_dim(p)));
  p = good;
  p.ring_rawk_slot_stride -= 1;
  CHECK(fused(p).rfind("invoke_verify_fused: ring_rawk_slot_stride=", 0) == 0);
  // What only a CUDA launch needs: grid limits and the alignment of vector accesses.
  p = good;
  p.B = 65536;
  CHECK(fused(p) == "invoke_verify_fused: B=65536 and HV=4 must be <= 65535 (grid dimensions)");
  p = good;
  p.B = 65535;
  p.T = p.T_max = 256;  // 65535 * 256 * HV 4 * V 64 elements: past 2^31
  p.conv_window_row_stride = int64_t{p.T_max} * kConvHistory * qkv_dim(p);
  CHECK(fused(p) == fmt::format("invoke_verify_fused: out has B*T*HV*V = {} elements, the CUDA "
                                "kernels index it in 32 bits (< 2^31)",
                                int64_t{65535} * 256 * 4 * 64));
  // Token row pitches: the per-item kernels step through a chunk's rows in 32 bits.
  for (auto [field, name] : {std::pair{&VerifyParams::mixed_qkv_stride, "mixed_qkv_stride"},
                             std::pair{&VerifyParams::a_stride, "a_stride"},
                             std::pair{&VerifyParams::b_stride, "b_stride"}}) {
    p = good;
    p.*field = int64_t{1} << 28;  // the first pitch refused
    CHECK(fused(p) == fmt::format("invoke_verify_fused: {}=268435456 is too large, the CUDA "
                                  "kernels need token row pitches below 2^28 elements",
                                  name));
  }
  p = good;
  p.mixed_qkv += 1;
  CHECK(fused(p).rfind("invoke_verify_fused: mixed_qkv must be 4-byte aligned", 0) == 0);
  p = good;
  p.ssm_state += 1;
  CHECK(fused(p).rfind("invoke_verify_fused: ssm_state must be 16-byte aligned", 0) == 0);
  p = good;
  p.ring_rawv_slot_stride += 1;
  CHECK(fused(p) ==
        "invoke_verify_fused: ring_rawk / ring_rawv must be 4-byte aligned with even "
        "slot strides");
  p = good;
  p.conv_window_row_stride += 1;
  CHECK(fused(p).rfind("invoke_verify_fused: conv_window must be 4-byte aligned", 0) == 0);
  p = good;
  p.gate = GateKind::kSafe;
  p.lower_bound = 0.0f;
  CHECK(fused(p) ==
        "invoke_verify_fused: lower_bound=0 must be finite and non-zero for the safe gate");
  p = good;
  p.B = 0;
  CHECK(fused(p) == "invoke_verify_fused: B=0 must be >= 1");

  const VerifyProblem snap = small_problem(RecordMode::kSnapshot);
  p = snap.params();
  p.snapshots = nullptr;
  CHECK(fused(p) == "invoke_verify_fused: snapshots is null, expected a pointer (snapshot mode)");
  p = snap.params();
  p.qkv_act = nullptr;
  CHECK(message_of([&] { kernels::invoke_verify_unfused(p, nullptr); }).find("qkv_act") !=
        std::string::npos);
  p = snap.params();
  p.qkv_act = reinterpret_cast<bf16_t*>(reinterpret_cast<char*>(p.qkv_act) + 2);
  CHECK(message_of([&] { kernels::invoke_conv_update(p, nullptr); }) ==
        "invoke_conv_update: qkv_act must be 4-byte aligned");
}

TEST_CASE("kernels: commit entry points validate before launching", "[kernels]") {
  const VerifyProblem pr = small_problem(RecordMode::kRing);
  const Buffer accepted = make_buffer({1, 4}, Device::host());
  const CommitParams good = pr.commit_params(accepted);
  auto fold = [&](CommitParams p) { return message_of([&] { kernels::invoke_fold(p, nullptr); }); };
  CommitParams p = good;
  p.num_layers = 0;
  CHECK(fold(p) == "invoke_fold: num_layers=0 must be >= 1");
  p = good;
  p.ring_beta = nullptr;
  CHECK(fold(p) == "invoke_fold: ring_beta is null, expected a pointer (ring mode)");
  p = good;
  p.accepted = nullptr;
  CHECK(fold(p) == "invoke_fold: accepted is null, expected a pointer ([B] accepted lengths)");
  p = good;
  p.T = 4;
  p.L = 2;
  CHECK(fold(p) == "invoke_fold: L=2 is smaller than T=4: steps t >= L have no ring records");
  const VerifyProblem snap = small_problem(RecordMode::kSnapshot);
  p = snap.commit_params(accepted);
  p.snapshots = nullptr;
  auto snapshot = [&](CommitParams q) {
    return message_of([&] { kernels::invoke_commit_snapshot(q, nullptr); });
  };
  CHECK(snapshot(p) ==
        "invoke_commit_snapshot: snapshots is null, expected a pointer (snapshot "
        "mode)");
  p = snap.commit_params(accepted);
  p.T = p.T_max + 1;
  CHECK(snapshot(p) == "invoke_commit_snapshot: T=5 exceeds T_max=4 (the scratch step pitch)");
  p = snap.commit_params(accepted);
  p.snapshots += 2;
  CHECK(snapshot(p) ==
        "invoke_commit_snapshot: snapshots must be 16-byte aligned with row / layer "
        "strides multiples of 4");
  p = good;
  p.conv_window = nullptr;
  CHECK(message_of([&] { kernels::invoke_commit_conv(p, nullptr); }) ==
        "invoke_commit_conv: conv_window is null, expected a pointer ([layers, R, T_max, W-1, "
        "D] bf16)");
  // The combined commit checks the conv part before it enqueues the fold.
  CHECK(message_of([&] { kernels::invoke_commit(p, nullptr); }) ==
        "invoke_commit: conv_window is null, expected a pointer ([layers, R, T_max, W-1, D] "
        "bf16)");
  p = good;
  p.num_layers = 2;
  p.ssm_layer_stride = p.ssm_slot_stride;  // layer 1 would overlap layer 0's slots
  CHECK(fold(p).rfind(
            fmt::format("invoke_fold: ssm_layer_stride={} is smaller than", p.ssm_slot_stride),
            0) == 0);
  p = good;
  p.ssm_state += 1;
  CHECK(fold(p) ==
        "invoke_fold: ssm_state must be 16-byte aligned with slot / layer strides "
        "multiples of 4");
}

TEST_CASE("kernels: which layouts the persistent kernels take", "[kernels]") {
  // A call that fails these runs one CTA per item (same bits); the GPU tests assert that
  // their aligned cases go persistent, so the persistent == per-item comparisons compare
  // something.
  const VerifyProblem pr = small_problem(RecordMode::kRing);
  const VerifyParams good = pr.params();
  CHECK(kernels::persistent_layout_ok(good, VerifyPath::kFused));
  CHECK(kernels::persistent_layout_ok(good, VerifyPath::kUnfused));
  VerifyParams p = good;
  p.mixed_qkv_stride += 4;  // 8-byte pieces only: fused needs 16
  CHECK_FALSE(kernels::persistent_layout_ok(p, VerifyPath::kFused));
  CHECK(kernels::persistent_layout_ok(
      p, VerifyPath::kUnfused));  // unfused reads qkv_act, not mixed_qkv
  p = good;
  p.conv_state_slot_stride += 4;
  CHECK_FALSE(kernels::persistent_layout_ok(p, VerifyPath::kFused));
  CHECK(kernels::persistent_layout_ok(p, VerifyPath::kUnfused));
  p = good;
  p.qkv_act += 2;
  CHECK(kernels::persistent_layout_ok(p, VerifyPath::kFused));
  CHECK_FALSE(kernels::persistent_layout_ok(p, VerifyPath::kUnfused));
  p = good;
  p.a_stride += 4;
  CHECK_FALSE(kernels::persistent_layout_ok(p, VerifyPath::kFused));
  CHECK_FALSE(kernels::persistent_layout_ok(p, VerifyPath::kUnfused));
  p = good;
  p.T = 9;  // two token chunks
  CHECK_FALSE(kernels::persistent_layout_ok(p, VerifyPath::kFused));
  p = good;
  p.ssm_slot_stride += 2;
  CHECK_FALSE(kernels::persistent_layout_ok(p, VerifyPath::kUnfused));

  const Buffer accepted = make_buffer({1, 4}, Device::host());
  const CommitParams cgood = pr.commit_params(accepted);
  CHECK(kernels::fold_persistent_layout_ok(cgood));
  CommitParams c = cgood;
  c.ring_rawk_slot_stride += 4;
  CHECK_FALSE(kernels::fold_persistent_layout_ok(c));
  c = cgood;
  c.ring_g_slot_stride += 2;
  CHECK_FALSE(kernels::fold_persistent_layout_ok(c));
  c = cgood;
  c.T = 9;
  CHECK_FALSE(kernels::fold_persistent_layout_ok(c));

  // The one-launch commit (the state kernel copies the conv windows 16 bytes at a time) needs
  // every conv offset a multiple of 8 bf16 and both bases 16-byte aligned; else two launches.
  CHECK(kernels::conv_commit_vec8(cgood));
  struct VecCase {
    const char* what;
    void (*change)(CommitParams&);
    bool vec8;
  };
  const VecCase vec_cases[] = {
      {"conv_state_slot_stride + 4", [](CommitParams& q) { q.conv_state_slot_stride += 4; }, false},
      {"conv_window_row_stride + 2", [](CommitParams& q) { q.conv_window_row_stride += 2; }, false},
      {"conv_window_layer_stride + 4", [](CommitParams& q) { q.conv_window_layer_stride += 4; },
       false},
      // 8 bytes: bf16 pairs stay aligned, 16-byte vectors do not; 16 bytes: still vec8.
      {"conv_state + 8 bytes", [](CommitParams& q) { q.conv_state += 4; }, false},
      {"conv_window + 16 bytes", [](CommitParams& q) { q.conv_window += 8; }, true},
      // 3 * D = 3 * (2 * 64 + 6) = 402 bf16: not a multiple of 8.
      {"D = 134",
       [](CommitParams& q) {
         q.H = q.HV = 1;
         q.K = 64;
         q.V = 6;
       },
       false},
  };
  for (const VecCase& vc : vec_cases) {
    CAPTURE(vc.what);
    c = cgood;
    vc.change(c);
    CHECK(kernels::conv_commit_vec8(c) == vc.vec8);
  }
}
