#include "tools/bench/bench_step.h"

#include <fmt/format.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/cuda_check.h"
#include "core/error.h"
#include "kernels/kda_kernels.h"
#include "tools/bench/bench_bytes.h"
#include "tools/bench/bench_device.h"
#include "tools/bench/bench_gemm.h"
#include "tools/bench/bench_ops.h"
#include "tools/bench/bench_plan.h"
#include "tools/bench/bench_problem.h"
#include "tools/bench/bench_timer.h"

namespace kda::bench {

namespace {

/// Replays of each mode's step graph in the step guard.
constexpr int kStepGuardReplays = 3;

// Weight tensor ids for the seeds (a layer's tensor seed = f(seed, id, layer)).
enum StepTensor : uint64_t { kWIn = 101, kWOut, kWUp, kWDown, kHidden0 };

uint64_t step_seed(uint64_t seed, uint64_t id, int layer) {
  return mix_seed(mix_seed(seed * 0x100000001b3ull + id) + static_cast<uint64_t>(layer));
}

/// The step's model besides the Problem: per layer W_in [P, hidden], W_out [hidden, HV*V] (and
/// W_up [mlp, hidden], W_down [hidden, mlp]), all bf16 [out, in] row-major; the hidden-state chain
/// [stages + 1, rows, hidden] (stage 0 is the step's input x, never written); the projection
/// output [rows, ld_proj] (its pad columns zero) and the MLP activation [rows, mlp]; the GEMM
/// workspace. Scales keep the activations in the verify workload's range (contract §6: mixed_qkv
/// x0.5, a x0.5, b x1) and the residual stream bounded over the layers: a projection's rows are
/// randn * scale / sqrt(fan-in) with x ~ randn.
class StepModel {
 public:
  StepModel(const BenchContext& ctx, const StepLayout& lay, cudaStream_t stream)
      : lay_(lay), shape_(ctx.args.shape) {
    const Device dev = Device::cuda(ctx.args.device);
    const int64_t hvv = int64_t{shape_.HV} * shape_.V;
    w_in_ = lay.P * lay.hidden;
    w_out_ = int64_t{lay.hidden} * hvv;
    w_mlp_ = int64_t{lay.hidden} * lay.mlp;
    const int64_t per_layer = w_in_ + w_out_ + 2 * w_mlp_;
    weights_ = Buffer(dev, per_layer * lay.layers * 2);
    chain_ = Buffer(dev, (lay.stages + 1) * lay.rows * lay.hidden * 2);
    proj_ = Buffer(dev, lay.rows * lay.ld_proj * 2);
    mid_ = Buffer(dev, std::max<int64_t>(1, lay.rows * lay.mlp) * 2);
    workspace_ = Buffer(dev, static_cast<int64_t>(kGemmWorkspaceBytes));

    const uint64_t seed = ctx.args.seed;
    const int64_t D = shape_.D(), HVK = int64_t{shape_.HV} * shape_.K;
    const float in_scale = 1.0f / std::sqrt(static_cast<float>(lay.hidden));
    for (int l = 0; l < lay.layers; ++l) {
      // W_in's rows by output column group: mixed_qkv, a, b.
      bf16_t* w = const_cast<bf16_t*>(w_in(l));
      const uint64_t s = step_seed(seed, kWIn, l);
      fill_randn_bf16(w, D * lay.hidden, 0.5f * in_scale, s, stream);
      fill_randn_bf16(w + D * lay.hidden, HVK * lay.hidden, 0.5f * in_scale, mix_seed(s + 1),
                      stream);
      fill_randn_bf16(w + (D + HVK) * lay.hidden, int64_t{shape_.HV} * lay.hidden, in_scale,
                      mix_seed(s + 2), stream);
      fill_randn_bf16(const_cast<bf16_t*>(w_out(l)), w_out_,
                      0.5f / std::sqrt(static_cast<float>(hvv)), step_seed(seed, kWOut, l), stream);
      if (lay.mlp > 0) {
        fill_randn_bf16(const_cast<bf16_t*>(w_up(l)), w_mlp_, in_scale, step_seed(seed, kWUp, l),
                        stream);
        fill_randn_bf16(const_cast<bf16_t*>(w_down(l)), w_mlp_,
                        0.1f / std::sqrt(static_cast<float>(lay.mlp)), step_seed(seed, kWDown, l),
                        stream);
      }
    }
    KDA_CUDA_CHECK(cudaMemsetAsync(chain_.data(), 0, static_cast<size_t>(chain_.bytes()), stream));
    fill_randn_bf16(hidden(0), lay.rows * lay.hidden, 1.0f, step_seed(seed, kHidden0, 0), stream);
    KDA_CUDA_CHECK(cudaMemsetAsync(proj_.data(), 0, static_cast<size_t>(proj_.bytes()), stream));
    KDA_CUDA_CHECK(cudaMemsetAsync(mid_.data(), 0, static_cast<size_t>(mid_.bytes()), stream));
    KDA_CUDA_CHECK(cudaStreamSynchronize(stream));
  }

  const StepLayout& layout() const { return lay_; }
  const bf16_t* w_in(int l) const { return layer_base(l); }
  const bf16_t* w_out(int l) const { return layer_base(l) + w_in_; }
  const bf16_t* w_up(int l) const { return layer_base(l) + w_in_ + w_out_; }
  const bf16_t* w_down(int l) const { return layer_base(l) + w_in_ + w_out_ + w_mlp_; }
  /// Hidden state `stage` (0: the step's input) [rows, hidden].
  bf16_t* hidden(int stage) const {
    return static_cast<bf16_t*>(chain_.data()) + stage * lay_.rows * lay_.hidden;
  }
  const Buffer& chain() const { return chain_; }
  bf16_t* proj() const { return static_cast<bf16_t*>(proj_.data()); }
  bf16_t* mid() const { return static_cast<bf16_t*>(mid_.data()); }
  void* workspace() const { return workspace_.data(); }

  /// `p` reading its activations from the projection output: mixed_qkv at column 0, a at D,
  /// b at D + HV*K, every row ld_proj elements apart.
  VerifyParams on_projection(VerifyParams p) const {
    const int64_t D = shape_.D(), HVK = int64_t{shape_.HV} * shape_.K;
    p.mixed_qkv = proj();
    p.a = proj() + D;
    p.b = proj() + D + HVK;
    p.mixed_qkv_stride = p.a_stride = p.b_stride = lay_.ld_proj;
    return p;
  }

 private:
  const bf16_t* layer_base(int l) const {
    return static_cast<const bf16_t*>(weights_.data()) + l * (w_in_ + w_out_ + 2 * w_mlp_);
  }

  StepLayout lay_;
  Shape shape_;
  int64_t w_in_ = 0, w_out_ = 0, w_mlp_ = 0;  ///< elements per layer
  Buffer weights_, chain_, proj_, mid_, workspace_;
};

/// The GEMMs of a step of N = B*T tokens.
struct StepGemms {
  StepGemms(const LtHandle& lt, const StepLayout& lay, const Shape& s, int64_t N)
      : in(lt, {N, lay.P, lay.hidden, lay.hidden, lay.hidden, lay.ld_proj, false}),
        out(lt, {N, lay.hidden, int64_t{s.HV} * s.V, int64_t{s.HV} * s.V, int64_t{s.HV} * s.V,
                 lay.hidden, true}) {
    if (lay.mlp > 0) {
      up.emplace(lt, GemmShape{N, lay.mlp, lay.hidden, lay.hidden, lay.hidden, lay.mlp, false});
      down.emplace(lt, GemmShape{N, lay.hidden, lay.mlp, lay.mlp, lay.mlp, lay.hidden, true});
    }
  }
  Gemm in, out;
  std::optional<Gemm> up, down;
};

/// What a step runs of the KDA layers: a variant's verifies (one per layer) and the commit.
struct StepKda {
  Variant variant;
  int bv;
  std::vector<VerifyParams> verifies;
  CommitParams commit;
};

/// Enqueues one step: per layer the input projection, the verify (when `kda`), the output
/// projection + residual (reading the verify's output of that layer, whatever it holds when `kda`
/// is null), the MLP pair; then the commit (when `kda`).
void enqueue_step(const StepModel& m, const StepGemms& g, const Problem& problem,
                  const StepKda* kda, const kernels::LaunchOverrides& launch, cudaStream_t stream) {
  const StepLayout& lay = m.layout();
  void* ws = m.workspace();
  int stage = 0;
  for (int l = 0; l < lay.layers; ++l) {
    g.in.run(m.hidden(stage), m.w_in(l), nullptr, m.proj(), ws, stream);
    if (kda != nullptr) {
      enqueue_verify(kda->variant, kda->bv, kda->verifies[static_cast<size_t>(l)], stream, launch);
    }
    const bf16_t* out = problem.outputs(0).out.as<const bf16_t>(l);
    g.out.run(out, m.w_out(l), m.hidden(stage), m.hidden(stage + 1), ws, stream);
    ++stage;
    if (g.up) {
      g.up->run(m.hidden(stage), m.w_up(l), nullptr, m.mid(), ws, stream);
      g.down->run(m.mid(), m.w_down(l), m.hidden(stage), m.hidden(stage + 1), ws, stream);
      ++stage;
    }
  }
  if (kda != nullptr) {
    kernels::invoke_commit(kda->commit, stream, launch);
  }
}

/// A step's KDA part for `v` in eager or deferred mode (layer params on the projection views).
StepKda make_kda(const BenchContext& ctx, const Problem& problem, const StepModel& m, Variant v,
                 int T, int B, const DeferredState* deferred) {
  const BenchArgs& a = ctx.args;
  const RecordMode mode = variant_mode(v);
  StepKda k{v, variant_is_fused(v) ? a.fused_block_vs(B, T, mode).front() : 0, {}, {}};
  if (deferred != nullptr) {
    k.bv = deferred_bv(ctx, v, T, B, k.bv);
  }
  for (int l = 0; l < a.layers; ++l) {
    VerifyParams p = m.on_projection(problem.verify_params(l, T, mode));
    k.verifies.push_back(deferred != nullptr ? deferred->deferred(p, l) : p);
  }
  const CommitParams cp = problem.commit_params(T, mode, a.layers);
  k.commit = deferred != nullptr ? deferred->deferred(cp) : cp;
  return k;
}

/// Device copies of a Problem's committed state (every layer, every slot).
struct StateCopy {
  StateCopy(const Problem& problem, int device)
      : ssm(Device::cuda(device), problem.ssm_state().buf.bytes()),
        conv(Device::cuda(device), problem.conv_state().buf.bytes()) {}
  void save(const Problem& problem, cudaStream_t stream) const {
    copy(ssm.data(), problem.ssm_state().buf, stream, true);
    copy(conv.data(), problem.conv_state().buf, stream, true);
  }
  void restore(const Problem& problem, cudaStream_t stream) const {
    copy(ssm.data(), problem.ssm_state().buf, stream, false);
    copy(conv.data(), problem.conv_state().buf, stream, false);
  }
  Buffer ssm, conv;

 private:
  static void copy(void* mine, const Buffer& pool, cudaStream_t stream, bool save) {
    KDA_CUDA_CHECK(cudaMemcpyAsync(save ? mine : pool.data(), save ? pool.data() : mine,
                                   static_cast<size_t>(pool.bytes()), cudaMemcpyDeviceToDevice,
                                   stream));
  }
};

void copy_device(void* dst, const void* src, int64_t bytes, cudaStream_t stream) {
  KDA_CUDA_CHECK(
      cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream));
}

/// The step guard of (T, B): from one saved committed state, kStepGuardReplays replays of the
/// eager ring step, then of the deferred ring step and of the snapshot step; after every replay
/// each layer's outputs and the whole hidden-state chain must equal the eager run's replay, and
/// after the last the committed state of every slot and layer (the deferred run materialized
/// first). Also the gemm-only step replayed twice gives the same chain (the GEMMs are
/// repeatable). The state is restored afterwards. Throws GuardFailure on a difference.
void run_step_guard(BenchContext& ctx, const Problem& problem, const StepModel& m,
                    const StepGemms& g, const DeferredState& deferred, int T, int B) {
  const BenchArgs& a = ctx.args;
  const cudaStream_t stream = ctx.stream;
  const Device dev = Device::cuda(a.device);
  const Pool& outs = problem.outputs(0).out;
  const Buffer& chain = m.chain();
  Buffer scratch(dev, 64);
  std::vector<std::string> failures;
  const auto differs = [&](const void* x, const void* y, int64_t bytes, const std::string& what) {
    const int64_t at = first_mismatch(x, y, bytes, scratch.data(), stream);
    if (at >= 0) {
      failures.push_back(fmt::format("{} (first differing byte {})", what, at));
    }
  };

  // The GEMMs alone: two replays, the same chain. One eager step first loads cuBLASLt's kernels
  // outside any capture.
  enqueue_step(m, g, problem, nullptr, a.launch, stream);
  KDA_CUDA_CHECK(cudaStreamSynchronize(stream));
  {
    Buffer first(dev, chain.bytes());
    replay_in_graph(
        stream, [&] { enqueue_step(m, g, problem, nullptr, a.launch, stream); }, 2,
        [&](int r) {
          if (r == 0) {
            copy_device(first.data(), chain.data(), chain.bytes(), stream);
          } else {
            differs(first.data(), chain.data(), chain.bytes(),
                    "gemm-only step: the hidden-state chain differs between two replays");
          }
        });
  }

  const StateCopy start(problem, a.device), eager_end(problem, a.device);
  start.save(problem, stream);
  std::vector<Buffer> ref_outs, ref_chain;
  for (int r = 0; r < kStepGuardReplays; ++r) {
    ref_outs.emplace_back(dev, outs.buf.bytes());
    ref_chain.emplace_back(dev, chain.bytes());
  }
  const Variant ring = a.has_variant(Variant::kFusedRing) || !a.has_variant(Variant::kUnfusedRing)
                           ? Variant::kFusedRing
                           : Variant::kUnfusedRing;
  struct Mode {
    const char* name;
    Variant variant;
    bool deferred;
  };
  const Mode modes[] = {
      {"eager", ring, false},
      {"deferred", ring, true},
      {"snapshot", ring == Variant::kFusedRing ? Variant::kFused : Variant::kUnfused, false}};
  for (const Mode& mode : modes) {
    start.restore(problem, stream);
    deferred.reset(stream);
    const StepKda kda =
        make_kda(ctx, problem, m, mode.variant, T, B, mode.deferred ? &deferred : nullptr);
    const bool reference = &mode == &modes[0];
    replay_in_graph(
        stream, [&] { enqueue_step(m, g, problem, &kda, a.launch, stream); }, kStepGuardReplays,
        [&](int r) {
          const auto at = static_cast<size_t>(r);
          if (reference) {
            copy_device(ref_outs[at].data(), outs.buf.data(), outs.buf.bytes(), stream);
            copy_device(ref_chain[at].data(), chain.data(), chain.bytes(), stream);
            return;
          }
          differs(ref_outs[at].data(), outs.buf.data(), outs.buf.bytes(),
                  fmt::format("{} step, replay {}: the layers' outputs differ from eager's",
                              mode.name, r));
          differs(ref_chain[at].data(), chain.data(), chain.bytes(),
                  fmt::format("{} step, replay {}: the hidden states differ from eager's",
                              mode.name, r));
        });
    check_error_flag(ctx, problem, "step guard");
    if (mode.deferred) {
      CommitParams materialize = kda.commit;
      materialize.kind = CommitKind::kMaterialize;
      kernels::invoke_commit(materialize, stream, a.launch);
    }
    if (reference) {
      eager_end.save(problem, stream);
      continue;
    }
    differs(eager_end.ssm.data(), problem.ssm_state().buf.data(), eager_end.ssm.bytes(),
            fmt::format("{} step: the committed SSM state differs from eager's", mode.name));
    differs(eager_end.conv.data(), problem.conv_state().buf.data(), eager_end.conv.bytes(),
            fmt::format("{} step: the committed conv state differs from eager's", mode.name));
  }
  start.restore(problem, stream);
  deferred.reset(stream);
  KDA_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (!failures.empty()) {
    fmt::print(stderr, "kda_bench: step guard FAILED at T={} B={}\n", T, B);
    for (const std::string& f : failures) {
      fmt::print(stderr, "kda_bench: step guard: {}\n", f);
    }
    throw GuardFailure{};
  }
  fmt::print(stderr,
             "kda_bench: step guard ok (gemm-only twice; eager == deferred == snapshot over {} "
             "replays: every layer's outputs, the hidden states, every slot's committed state)\n",
             kStepGuardReplays);
}

/// The hidden and committed states after the timed replays must be finite: a model-like stack of
/// random weights blows up unless its projections are scaled, and a blown-up step times nothing
/// an engine runs. Prints the largest magnitudes; throws kda::Error(kInternal) otherwise.
void check_finite(const BenchContext& ctx, const Problem& problem, const StepModel& m, int T,
                  int B) {
  const StepLayout& lay = m.layout();
  const Buffer scratch(Device::cuda(ctx.args.device), 64);
  const FiniteStats x = finite_stats(m.hidden(lay.stages), DType::kBF16,
                                     int64_t{B} * T * lay.hidden, scratch.data(), ctx.stream);
  FiniteStats state;
  const Pool& ssm = problem.ssm_state();
  for (int c = 0; c < ssm.copies; ++c) {
    const FiniteStats s =
        finite_stats(ssm.at(c), DType::kF32, ssm.numel, scratch.data(), ctx.stream);
    state.nonfinite += s.nonfinite;
    state.max_abs = std::max(state.max_abs, s.max_abs);
  }
  fmt::print(
      "            finite after the timed replays: last hidden state max |x| {:.3g}, "
      "committed states max |S| {:.3g}\n",
      x.max_abs, state.max_abs);
  KDA_CHECK_CODE(x.nonfinite == 0 && state.nonfinite == 0, ErrorCode::kInternal,
                 "step T={} B={}: {} non-finite hidden values, {} non-finite state values: the "
                 "step's scaling does not keep the model bounded",
                 T, B, x.nonfinite, state.nonfinite);
}

Row step_row(const BenchContext& ctx, const std::string& what, Variant v, int bv, int T, int B) {
  Row r;
  r.phase = Phase::kStep;
  r.what = what;
  r.mode = variant_mode(v);
  r.fused = variant_is_fused(v);
  r.bv = r.fused ? bv : 0;
  r.T = T;
  r.B = B;
  r.layers = ctx.args.layers;
  return r;
}

/// Fills the KDA share columns of a timed step row: share = step - gemm-only, its byte model,
/// floor (at the measured copy rate, contract §6) and %.
void finish_share(const BenchContext& ctx, Row& r, double gemm_us, int64_t model_bytes) {
  r.gemm_us = gemm_us;
  r.share_us = r.timing.median_us - gemm_us;
  r.model_bytes = r.moved_bytes = model_bytes;
  r.floor_us = floor_us(model_bytes, ctx.copy_gbps);
  r.gbps = achieved_gbps(model_bytes, r.share_us);
  r.pct = r.share_us > 0.0 ? 100.0 * r.floor_us / r.share_us : 0.0;
}

}  // namespace

void run_step_phase(BenchContext& ctx) {
  const BenchArgs& a = ctx.args;
  for (const std::string& line : describe_step_model(a.shape, a.layers, a.step_hidden(), a.mlp)) {
    fmt::print("{}\n", line);
  }
  print_table_header(Phase::kStep);
  TimerConfig timer = ctx.timer;
  timer.iters = a.step_iters;
  const LtHandle lt;
  for (int B : a.batch_sizes) {
    const ProblemConfig cfg = step_problem_config(a, B);
    const StepLayout lay = step_layout(a, B);
    {
      size_t free_b = 0, total_b = 0;
      KDA_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
      const int64_t need = Problem::device_bytes(cfg) + lay.device_bytes(a.shape, cfg, a.guard);
      KDA_CHECK_CODE(
          static_cast<double>(need) <= 0.95 * static_cast<double>(free_b), ErrorCode::kOutOfMemory,
          "step B={}: needs {:.2f} GiB of device memory, {:.2f} GiB free; lower "
          "--batch-sizes or --layers, or --skip-guard (no snapshot pools)",
          B, static_cast<double>(need) / (1 << 30), static_cast<double>(free_b) / (1 << 30));
    }
    const Problem problem(cfg, ctx.stream);
    const StepModel model(ctx, lay, ctx.stream);
    const DeferredState deferred(ctx, problem);
    for (int T : a.draft_tokens) {
      const std::vector<int> accepted = step_accepted(a.seed, T, B);
      problem.set_accepted(accepted, ctx.stream);
      const StepGemms gemms(lt, lay, a.shape, int64_t{B} * T);
      fmt::print(stderr, "kda_bench: [step] T={} B={} layers={}: GEMMs {} | {}{}\n", T, B, a.layers,
                 gemms.in.describe(), gemms.out.describe(),
                 gemms.up ? fmt::format(" | {} | {}", gemms.up->describe(), gemms.down->describe())
                          : std::string());
      if (a.guard) {
        run_step_guard(ctx, problem, model, gemms, deferred, T, B);
      }
      const StepBytes bytes = step_kda_bytes(a.shape, a.layers, B, T, accepted);
      std::vector<Row> rows;
      Row gemm_only = step_row(ctx, "gemm-only", Variant::kFusedRing, 0, T, B);
      gemm_only.fused = false;
      gemm_only.timing = time_in_graph(
          ctx.stream, 1,
          [&](int) { enqueue_step(model, gemms, problem, nullptr, a.launch, ctx.stream); }, timer);
      gemm_only.gemm_us = gemm_only.timing.median_us;
      print_row(gemm_only);
      rows.push_back(gemm_only);
      const double gemm_us = gemm_only.timing.median_us;
      for (Variant v : a.variants) {
        const bool ring = variant_mode(v) == RecordMode::kRing;
        for (const bool defer : {false, true}) {
          if (defer && !ring) {
            continue;
          }
          deferred.reset(ctx.stream);
          const StepKda kda = make_kda(ctx, problem, model, v, T, B, defer ? &deferred : nullptr);
          Row r = step_row(ctx, std::string(variant_name(v)) + (defer ? "+deferred" : ""), v,
                           kda.bv, T, B);
          r.kernel = planned_kernel(v, kda.bv, kda.verifies.front(), a.launch);
          fmt::print(stderr, "kda_bench: [step] {}: {}\n", r.what, r.kernel);
          r.timing = time_in_graph(
              ctx.stream, 1,
              [&](int) { enqueue_step(model, gemms, problem, &kda, a.launch, ctx.stream); }, timer);
          check_error_flag(ctx, problem, "step");
          finish_share(ctx, r, gemm_us,
                       !ring ? bytes.snapshot : (defer ? bytes.deferred : bytes.ring));
          print_row(r);
          rows.push_back(r);
        }
      }
      deferred.reset(ctx.stream);
      check_finite(ctx, problem, model, T, B);
      for (const Row& r : rows) {
        ctx.rows.push_back(r);
      }
      const StepAdvice here = step_advice(rows, a);
      for (const StepAdviceEntry& e : here.entries) {
        fmt::print(
            "            auto (--kda-deferred-commit, step): {} at T={} B={} (KDA share {:.1f} vs "
            "{:.1f} us eager)\n",
            e.defer ? "deferred" : "eager", T, B, e.deferred_us - e.gemm_us,
            e.eager_us - e.gemm_us);
      }
      if (!a.out_path.empty()) {
        write_rows(a.out_path, ctx.info, ctx.rows, recommend(ctx.rows, a));
      }
    }
  }
  print_step_advice(step_advice(ctx.rows, a));
}

}  // namespace kda::bench
