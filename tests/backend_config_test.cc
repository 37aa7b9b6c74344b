// backend_config_test.cc: what a KdaAttentionBackend is built from and what it reports: bad
// configuration (flags, model, memory budget, no kernel set) rejected at construction, an odd
// head_v_dim refused for CUDA before anything is allocated, pool sizing / memory report /
// platform, and dispatch decisions logged at debug when they change. Host-side only (hidden in
// a CUDA build).
#include <spdlog/sinks/ostream_sink.h>

#include <catch2/catch.hpp>
#include <memory>
#include <sstream>
#include <vector>

#include "backend/kda_backend.h"
#include "core/error.h"
#include "core/logging.h"
#include "core/platform.h"
#include "kernels/kernel_set.h"
#include "tests/backend_fixture.h"

using namespace kda;
using namespace kda::testing;

TEST_CASE("backend: bad configuration is rejected at construction", "[backend]" KDA_HOST_ONLY) {
  const ModelConfig good = model_for(kGqaCase);
  auto construct = [](ModelConfig m, EngineFlags f, BackendOptions o = {}) {
    return [=] { KdaAttentionBackend backend(m, f, make_host_kernel_set(), o); };
  };
  EngineFlags flags = flags_for(true);
  flags.num_draft_tokens = 0;
  CHECK(error_of(construct(good, flags), ErrorCode::kInvalidArgument) ==
        "--speculative-num-draft-tokens: invalid value '0' (expected an integer in [1, 16])");
  flags = flags_for(true);
  flags.replayssm_cache_len = 4;
  CHECK(error_of(construct(good, flags), ErrorCode::kInvalidArgument) ==
        "--linear-replayssm-cache-len: invalid value '4' for --speculative-num-draft-tokens 4 "
        "with --enable-linear-replayssm-spec (expected a power of two >= 2 * 4 = 8)");
  flags = flags_for(true);
  flags.verify_block_v = 7;
  CHECK(error_of(construct(good, flags), ErrorCode::kInvalidArgument) ==
        "--kda-verify-block-v: invalid value '7' (expected auto (or 0) or one of 8, 16, 32, 64, "
        "128)");
  ModelConfig m = good;
  m.K = 32;
  CHECK(error_of(construct(m, flags_for(true)), ErrorCode::kInvalidArgument) ==
        "ModelConfig.K: expected 64 or 128, got 32");
  m = good;
  m.HV = 3;
  CHECK(error_of(construct(m, flags_for(true)), ErrorCode::kInvalidArgument) ==
        "ModelConfig.HV: expected a multiple of H = 2, got 3");
  m = good;
  m.gate = GateKind::kSafe;
  m.lower_bound = 0.5f;
  CHECK(error_of(construct(m, flags_for(true)), ErrorCode::kInvalidArgument) ==
        "ModelConfig.lower_bound: the safe gate needs a finite value < 0, got 0.5");
  BackendOptions tight;
  tight.memory_budget_bytes = 1024;
  CHECK_THAT(error_of(construct(good, flags_for(true), tight), ErrorCode::kOutOfMemory),
             Catch::StartsWith("KDA state pool: ring mode needs"));
  CHECK(error_of([] { KdaAttentionBackend b(model_for(kGqaCase), flags_for(true), nullptr); },
                 ErrorCode::kInvalidArgument) == "KdaAttentionBackend: no kernel set given");
}

TEST_CASE("backend: what a kernel set cannot run is refused before anything is allocated",
          "[backend]" KDA_HOST_ONLY) {
  // A kernel set that reports a CUDA device; construction must fail before the pool touches it.
  class CudaDeviceOnly final : public KernelSet {
   public:
    const char* name() const override { return "cuda device only"; }
    Device device() const override { return Device::cuda(0); }
    kernels::VerifyPlan plan_verify(const VerifyParams&, VerifyPath, int) override { return {}; }
    void verify(const VerifyParams&, const kernels::VerifyPlan&, cudaStream_t) override {}
    bool runs_lazy_write_back() const override { return false; }
    void extend(const ExtendParams&, cudaStream_t) override {}
    void commit(const CommitParams&, cudaStream_t) override {}
  };
  ModelConfig m = model_for(kGqaCase);
  m.V = 63;
  CHECK(error_of(
            [&] { KdaAttentionBackend b(m, flags_for(true), std::make_unique<CudaDeviceOnly>()); },
            ErrorCode::kUnsupported) ==
        "ModelConfig.V: the CUDA kernels need an even head_v_dim (bf16 channel pairs), got 63");
  // The host kernels take any V.
  CHECK_NOTHROW(KdaAttentionBackend(m, flags_for(true), make_host_kernel_set()));
  // A kernel set without the lazy write-back (contract §11) refuses it, before allocating.
  EngineFlags lazy = flags_for(true);
  lazy.deferred_commit = static_cast<int>(DeferredCommit::kLazy);
  CHECK(
      error_of(
          [&] {
            KdaAttentionBackend b(model_for(kGqaCase), lazy, std::make_unique<CudaDeviceOnly>());
          },
          ErrorCode::kUnsupported) ==
      "--kda-deferred-commit lazy: the cuda device only kernel set does not run the lazy "
      "write-back (contract §11; the host kernel set does; on CUDA use --kda-deferred-commit on)");
  CHECK_NOTHROW(KdaAttentionBackend(model_for(kGqaCase), lazy, make_host_kernel_set()));
}

TEST_CASE("backend: pool sizing, memory report and platform", "[backend]" KDA_HOST_ONLY) {
  BackendOptions options;
  options.extra_slots = 2;
  KdaAttentionBackend b(model_for(kGqaCase), flags_for(true), make_host_kernel_set(), options);
  CHECK(b.pool().num_slots() == kMaxRunning + 2);
  CHECK(b.pool().num_rows() == kMaxRunning);
  CHECK(b.pool().T_max() == kT);
  CHECK(b.pool().ring_mode());
  CHECK(b.pool().ring_len() == 8);
  CHECK(b.memory_report().total_bytes == b.pool().memory_report().total_bytes);
  CHECK(b.memory_report().ring_mode);
  CHECK(b.device() == Device::host());
  CHECK_FALSE(b.platform().has_device);  // host kernel set: ring mode never fused
  CHECK(b.platform().family() == ArchFamily::kOther);
}

TEST_CASE("backend: dispatch decisions are logged at debug when they change",
          "[backend]" KDA_HOST_ONLY) {
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  sink->set_pattern("%l %v");
  logger().sinks().push_back(sink);
  const spdlog::level::level_enum level = logger().level();
  set_log_level("debug");
  Harness h(kGqaCase, /*ring=*/true, fake_platform(9, 0));
  log.str("");
  for (const BatchSpec& batch :
       {BatchSpec{kT, {0}, {}}, BatchSpec{kT, {1}, {}}, BatchSpec{kT, {0, 1}, {}}}) {
    verify_all(h, batch, 5);
    commit(h, std::vector<int32_t>(batch.slots.size(), 1));
  }
  logger().set_level(level);
  logger().sinks().pop_back();
  // Two rounds at B = 1 (fused, logged once per layer), then B = 2 (unfused, logged again); each
  // line names what ran (the plan's kernel; on the host kernel set, the reference).
  CHECK(log.str() ==
        "debug verify layer 0 (B=1, T=4): fused (block_v = 8): ring mode with B = 1 <= "
        "--kda-fused-ring-max-batch = 1 on SM90, ring layout ok; outputs exact: auto: no "
        "measurement for this shape; runs the host reference (fused)\n"
        "debug verify layer 1 (B=1, T=4): fused (block_v = 8): ring mode with B = 1 <= "
        "--kda-fused-ring-max-batch = 1 on SM90, ring layout ok; outputs exact: auto: no "
        "measurement for this shape; runs the host reference (fused)\n"
        "debug verify layer 0 (B=2, T=4): unfused: ring mode with B = 2 > "
        "--kda-fused-ring-max-batch = 1; outputs exact: the unfused path; runs the host "
        "reference (unfused)\n"
        "debug verify layer 1 (B=2, T=4): unfused: ring mode with B = 2 > "
        "--kda-fused-ring-max-batch = 1; outputs exact: the unfused path; runs the host "
        "reference (unfused)\n");
  const DispatchStats stats = h.backend->stats();
  CHECK(stats.fused_calls == 4);
  CHECK(stats.unfused_calls == 2);
  h.backend->reset_stats();
  CHECK(h.backend->stats().fused_calls == 0);
  CHECK_FALSE(h.backend->stats().last_decision[0].has_value());
}
