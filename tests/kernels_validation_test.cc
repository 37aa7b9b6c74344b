// kernels_validation_test.cc: the CUDA entry points reject bad parameters with a precise
// kda::Error before any CUDA call, so these run on a CPU-only machine (CI) too.
#include <catch2/catch.hpp>
#include <functional>
#include <string>

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
  CHECK(fused(good, 12) == "KDA_DISPATCH_BV: block_v=12 unsupported (8, 16, 32, 64, 128)");
  VerifyParams p = good;
  p.K = 96;
  CHECK(fused(p) == "invoke_verify_fused: K (head_k_dim) must be 64 or 128, got 96");
  p = good;
  p.HV = 3;
  CHECK(fused(p) == "invoke_verify_fused: HV must be a positive multiple of H, got H=2 HV=3");
  p = good;
  p.V = 63;
  CHECK(fused(p).find("V (head_v_dim) must be") != std::string::npos);
  p = good;
  p.T = p.T_alloc + 1;
  CHECK(fused(p) == "invoke_verify_fused: T=5 exceeds the scratch step pitch T_alloc=4");
  p = good;
  p.L = 12;
  CHECK(fused(p) == "invoke_verify_fused: ring length L must be a power of two, got 12");
  p = good;
  p.ring_g = nullptr;
  CHECK(fused(p) == "invoke_verify_fused: ring mode needs all four rings (rawv, rawk, g, beta)");
  p = good;
  p.qkv_stride = qkv_dim(p) - 2;
  CHECK(fused(p).find("qkv row stride must be >= D=") != std::string::npos);
  p = good;
  p.gate = GateKind::kSafe;
  p.lower_bound = 0.0f;
  CHECK(fused(p) == "invoke_verify_fused: safe gate lower_bound=0 must be finite and non-zero");
  p = good;
  p.B = 0;
  CHECK(fused(p) == "invoke_verify_fused: B must be in [1, 65535], got 0");

  const VerifyProblem snap = small_problem(RecordMode::kSnapshot);
  p = snap.params();
  p.snapshots = nullptr;
  CHECK(fused(p) == "invoke_verify_fused: snapshot mode needs snapshots");
  p = snap.params();
  p.qkv_act = nullptr;
  CHECK(message_of([&] { kernels::invoke_verify_unfused(p, nullptr); }).find("qkv_act") !=
        std::string::npos);
  p = snap.params();
  p.qkv_act = reinterpret_cast<bf16_t*>(reinterpret_cast<char*>(p.qkv_act) + 2);
  CHECK(message_of([&] { kernels::invoke_conv_update(p, nullptr); }) ==
        "invoke_conv_update: qkv_act scratch is required (4-byte aligned)");
}

TEST_CASE("kernels: commit entry points validate before launching", "[kernels]") {
  const VerifyProblem pr = small_problem(RecordMode::kRing);
  const Buffer accepted = make_buffer({1, 4}, Device::host());
  const CommitParams good = pr.commit_params(accepted);
  auto fold = [&](CommitParams p) { return message_of([&] { kernels::invoke_fold(p, nullptr); }); };
  CommitParams p = good;
  p.num_layers = 0;
  CHECK(fold(p) == "invoke_fold: num_layers*HV must be in [1, 65535], got 0*4");
  p = good;
  p.T = p.T_alloc + 1;
  CHECK(fold(p) == "invoke_fold: T must be in [1, T_alloc=4], got 5");
  p = good;
  p.ring_beta = nullptr;
  CHECK(fold(p) == "invoke_fold: all four rings are required");
  p = good;
  p.accepted = nullptr;
  CHECK(fold(p) == "invoke_fold: slots, rows and accepted are required");
  p = good;
  p.T = 4;
  p.L = 2;
  CHECK(fold(p) == "invoke_fold: T=4 exceeds the ring length L=2");
  const VerifyProblem snap = small_problem(RecordMode::kSnapshot);
  p = snap.commit_params(accepted);
  p.snapshots = nullptr;
  CHECK(message_of([&] {
          kernels::invoke_commit_snapshot(p, nullptr);
        }).find("snapshots must be 16-byte aligned") != std::string::npos);
  p = good;
  p.conv_window = nullptr;
  CHECK(message_of([&] { kernels::invoke_commit_conv(p, nullptr); }) ==
        "invoke_commit_conv: conv_state and conv_window are required");
}

TEST_CASE("kernels: which layouts the streaming kernels take", "[kernels]") {
  // A call that fails these runs one CTA per item (same bits); the GPU tests assert that
  // their aligned cases do stream, so the streamed == per-item comparisons compare something.
  const VerifyProblem pr = small_problem(RecordMode::kRing);
  const VerifyParams good = pr.params();
  CHECK(kernels::verify_stream_layout_ok(good, true));
  CHECK(kernels::verify_stream_layout_ok(good, false));
  VerifyParams p = good;
  p.qkv_stride += 4;  // 8-byte pieces only: fused needs 16
  CHECK_FALSE(kernels::verify_stream_layout_ok(p, true));
  CHECK(kernels::verify_stream_layout_ok(p, false));  // unfused reads qkv_act, not mixed_qkv
  p = good;
  p.conv_state_slot_stride += 4;
  CHECK_FALSE(kernels::verify_stream_layout_ok(p, true));
  CHECK(kernels::verify_stream_layout_ok(p, false));
  p = good;
  p.qkv_act += 2;
  CHECK(kernels::verify_stream_layout_ok(p, true));
  CHECK_FALSE(kernels::verify_stream_layout_ok(p, false));
  p = good;
  p.a_stride += 4;
  CHECK_FALSE(kernels::verify_stream_layout_ok(p, true));
  CHECK_FALSE(kernels::verify_stream_layout_ok(p, false));
  p = good;
  p.T = 9;  // two token chunks
  CHECK_FALSE(kernels::verify_stream_layout_ok(p, true));
  p = good;
  p.ssm_slot_stride += 2;
  CHECK_FALSE(kernels::verify_stream_layout_ok(p, false));

  const Buffer accepted = make_buffer({1, 4}, Device::host());
  const CommitParams cgood = pr.commit_params(accepted);
  CHECK(kernels::fold_stream_layout_ok(cgood));
  CommitParams c = cgood;
  c.ring_rawk_slot_stride += 4;
  CHECK_FALSE(kernels::fold_stream_layout_ok(c));
  c = cgood;
  c.ring_g_slot_stride += 2;
  CHECK_FALSE(kernels::fold_stream_layout_ok(c));
  c = cgood;
  c.T = 9;
  CHECK_FALSE(kernels::fold_stream_layout_ok(c));
}
