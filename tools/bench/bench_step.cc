#include "tools/bench/bench_step.h"

#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/cuda_check.h"
#include "core/error.h"
#include "kernels/kda_kernels.h"
#include "tools/bench/bench_bytes.h"
#include "tools/bench/bench_device.h"
#include "tools/bench/bench_fast.h"
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

/// Enqueues one step's layers: per layer the input projection, `verify(l)`, the output
/// projection + residual (reading layer l's verify output, whatever it holds), the MLP pair.
void enqueue_layers(const StepModel& m, const StepGemms& g, const Problem& problem,
                    const std::function<void(int layer)>& verify, cudaStream_t stream) {
  const StepLayout& lay = m.layout();
  void* ws = m.workspace();
  int stage = 0;
  for (int l = 0; l < lay.layers; ++l) {
    g.in.run(m.hidden(stage), m.w_in(l), nullptr, m.proj(), ws, stream);
    verify(l);
    const bf16_t* out = problem.outputs(0).out.as<const bf16_t>(l);
    g.out.run(out, m.w_out(l), m.hidden(stage), m.hidden(stage + 1), ws, stream);
    ++stage;
    if (g.up) {
      g.up->run(m.hidden(stage), m.w_up(l), nullptr, m.mid(), ws, stream);
      g.down->run(m.mid(), m.w_down(l), m.hidden(stage), m.hidden(stage + 1), ws, stream);
      ++stage;
    }
  }
}

/// Enqueues one step: its layers with `kda`'s verifies (none when null), then the commit (when
/// `kda`).
void enqueue_step(const StepModel& m, const StepGemms& g, const Problem& problem,
                  const StepKda* kda, const kernels::LaunchOverrides& launch, cudaStream_t stream) {
  enqueue_layers(
      m, g, problem,
      [&](int l) {
        if (kda != nullptr) {
          enqueue_verify(kda->variant, kda->bv, kda->verifies[static_cast<size_t>(l)], stream,
                         launch);
        }
      },
      stream);
  if (kda != nullptr) {
    kernels::invoke_commit(kda->commit, stream, launch);
  }
}

/// A step's KDA part for `v` in eager or deferred mode, numerics `nm` (layer params on the
/// projection views); `lazy` (with `deferred`'s counts, fast numerics): the lazy write-back
/// (contract §11). The tile: the first of BenchArgs::block_vs (a fast one in fast numerics; needs
/// one); an exact deferred verify takes the deferred rule's, a fast one keeps the fast tile.
StepKda make_kda(const BenchContext& ctx, const Problem& problem, const StepModel& m, Variant v,
                 int T, int B, const DeferredState* deferred,
                 VerifyNumerics nm = VerifyNumerics::kExact, bool lazy = false) {
  const BenchArgs& a = ctx.args;
  const RecordMode mode = variant_mode(v);
  const std::vector<int> bvs = a.block_vs(v, nm, B, T);
  KDA_CHECK(!bvs.empty(), "step: {} has no {} tile", variant_name(v), numerics_name(nm));
  StepKda k{v, bvs.front(), {}, {}};
  if (deferred != nullptr && nm == VerifyNumerics::kExact) {
    k.bv = deferred_bv(ctx, v, T, B, k.bv);
  }
  KDA_CHECK(!lazy || (deferred != nullptr && nm == VerifyNumerics::kFast),
            "step: a lazy step takes the counts and the fast outputs");
  for (int l = 0; l < a.layers; ++l) {
    VerifyParams p = with_numerics(m.on_projection(problem.verify_params(l, T, mode)), nm);
    // Fast outputs record no u: their deferred commit is u-free.
    k.verifies.push_back(lazy ? deferred->lazy(p, l)
                         : deferred != nullptr
                             ? deferred->deferred(p, l, nm == VerifyNumerics::kFast)
                             : p);
  }
  const CommitParams cp = problem.commit_params(T, mode, a.layers);
  k.commit = lazy                  ? deferred->lazy(cp)
             : deferred != nullptr ? deferred->deferred(cp, nm == VerifyNumerics::kFast)
                                   : cp;
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

/// The first `elems` elements of a device bf16 buffer on the host (synchronises `stream`).
std::vector<bf16_t> download_bf16(const void* src, int64_t elems, cudaStream_t stream) {
  std::vector<bf16_t> host(static_cast<size_t>(elems));
  KDA_CUDA_CHECK(cudaMemcpyAsync(host.data(), src, static_cast<size_t>(elems) * 2,
                                 cudaMemcpyDeviceToHost, stream));
  KDA_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host;
}

/// Which fast steps the step phase times at (T, B), by their plans: the eager fast step (a
/// fused+ring fast tile whose plan runs fast at every layer) and the deferred one (the same with
/// pending steps to fold). Notes name what is left out.
struct FastSteps {
  bool eager = false, deferred = false;
  bool lazy = false;  ///< the lazy write-back's fast step (a ring of 2 T_max <= L <= 16)
};
FastSteps fast_steps(BenchContext& ctx, const Problem& problem, const StepModel& m,
                     const DeferredState& deferred, int T, int B) {
  const BenchArgs& a = ctx.args;
  FastSteps f;
  if (!a.has_numerics(VerifyNumerics::kFast)) {
    return f;
  }
  for (Variant v : a.variants) {
    if (!variant_takes_fast(v)) {
      note(ctx, fast_skip_reason(a, v, T, 0, /*deferred=*/false));
    }
  }
  if (a.fast_block_vs(B).empty()) {
    note(ctx, fast_skip_reason(a, Variant::kFusedRing, T, 0, /*deferred=*/false));
    return f;
  }
  for (const bool defer : {false, true}) {
    const StepKda kda = make_kda(ctx, problem, m, Variant::kFusedRing, T, B,
                                 defer ? &deferred : nullptr, VerifyNumerics::kFast);
    const PlannedLayers plan = planned_layers(kda.variant, kda.bv, kda.verifies, a.launch);
    const bool runs = plan.numerics == VerifyNumerics::kFast;
    if (!runs) {
      note(ctx, defer ? fmt::format("fused+ring+deferred (step) T={} BV={}: the u-free deferred "
                                    "verify's plan runs exact ({})",
                                    T, kda.bv, plan.kernel)
                      : fmt::format("fused+ring (step) T={} BV={}: the plan runs exact ({})", T,
                                    kda.bv, plan.kernel));
    }
    (defer ? f.deferred : f.eager) = runs;
    if (!runs) {
      break;  // no deferred fast step without an eager one
    }
  }
  const int L = problem.config().L, T_max = problem.config().T_max;
  if (f.eager && L <= kFastMaxChunk && 2 * T_max <= L) {
    const StepKda kda = make_kda(ctx, problem, m, Variant::kFusedRing, T, B, &deferred,
                                 VerifyNumerics::kFast, /*lazy=*/true);
    f.lazy = planned_layers(kda.variant, kda.bv, kda.verifies, a.launch).numerics ==
             VerifyNumerics::kFast;
  } else if (f.eager) {
    note(ctx, fmt::format("fused+ring+lazy (step) T={}: a ring of L={} does not hold a lazy "
                          "history (2 T_max <= L <= {})",
                          T, L, kFastMaxChunk));
  }
  return f;
}

/// The step guard of (T, B): from one saved committed state, kStepGuardReplays replays of the
/// eager ring step, then of the deferred ring step and of the snapshot step; after every replay
/// each layer's outputs and the whole hidden-state chain must equal the eager run's replay, and
/// after the last the committed state of every slot and layer (the deferred run materialized
/// first). Also the gemm-only step replayed twice gives the same chain (the GEMMs are
/// repeatable). With fast steps (`fast`), also the fast eager step twice (two captures), bitwise
/// equal replay by replay (every layer's outputs, the chain) and in the committed state; its
/// layer 0 against the exact eager step: the committed state bitwise (the records are exact) and
/// the outputs by their statistics (contract §10 (b); layer 0 reads the same inputs in both, later
/// layers read hidden states that carry the fast outputs); a fast deferred step as the first fast
/// one. The state is restored afterwards. Throws GuardFailure on a difference.
void run_step_guard(BenchContext& ctx, const Problem& problem, const StepModel& m,
                    const StepGemms& g, const DeferredState& deferred, int T, int B,
                    const FastSteps& fast) {
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
  // Per replay: the exact eager step's outputs and chain, and with fast steps the first fast one's.
  std::vector<Buffer> ref_outs, ref_chain, fast_outs, fast_chain;
  for (int r = 0; r < kStepGuardReplays; ++r) {
    ref_outs.emplace_back(dev, outs.buf.bytes());
    ref_chain.emplace_back(dev, chain.bytes());
    if (fast.eager) {
      fast_outs.emplace_back(dev, outs.buf.bytes());
      fast_chain.emplace_back(dev, chain.bytes());
    }
  }
  std::optional<StateCopy> fast_end;
  if (fast.eager) {
    fast_end.emplace(problem, a.device);
  }
  const Variant ring = a.has_variant(Variant::kFusedRing) || !a.has_variant(Variant::kUnfusedRing)
                           ? Variant::kFusedRing
                           : Variant::kUnfusedRing;
  // What a mode's replays and final state are held to.
  enum class Against {
    kNone,         ///< the exact eager step: the reference
    kExact,        ///< bitwise the exact eager step's
    kExactLayer0,  ///< layer 0: the state bitwise, the outputs by statistics (fast steps)
    kFirstFast,    ///< bitwise the first fast step's
  };
  struct Mode {
    const char* name;
    Variant variant;
    bool deferred;
    VerifyNumerics numerics;
    Against against;
    bool lazy = false;  ///< with `deferred`: the lazy write-back
  };
  const VerifyNumerics kExact = VerifyNumerics::kExact, kFast = VerifyNumerics::kFast;
  std::vector<Mode> modes = {
      {"eager", ring, false, kExact, Against::kNone},
      {"deferred", ring, true, kExact, Against::kExact},
      {"snapshot", ring == Variant::kFusedRing ? Variant::kFused : Variant::kUnfused, false, kExact,
       Against::kExact}};
  if (fast.eager) {
    modes.push_back({"fast", Variant::kFusedRing, false, kFast, Against::kExactLayer0});
    modes.push_back({"fast (again)", Variant::kFusedRing, false, kFast, Against::kFirstFast});
  }
  if (fast.deferred) {
    modes.push_back({"fast deferred", Variant::kFusedRing, true, kFast, Against::kExactLayer0});
  }
  if (fast.lazy) {
    modes.push_back({"fast lazy", Variant::kFusedRing, true, kFast, Against::kExactLayer0, true});
  }
  const int64_t layer0_elems = int64_t{B} * T * a.shape.HV * a.shape.V;
  std::vector<std::pair<std::string, OutputDiff>> layer0_diffs;
  bool first_fast = true;
  for (const Mode& mode : modes) {
    start.restore(problem, stream);
    deferred.reset(stream);
    const StepKda kda = make_kda(ctx, problem, m, mode.variant, T, B,
                                 mode.deferred ? &deferred : nullptr, mode.numerics, mode.lazy);
    const bool saves_fast = mode.against == Against::kExactLayer0 && first_fast;
    OutputDiff layer0;
    replay_in_graph(
        stream, [&] { enqueue_step(m, g, problem, &kda, a.launch, stream); }, kStepGuardReplays,
        [&](int r) {
          const auto at = static_cast<size_t>(r);
          switch (mode.against) {
            case Against::kNone:
              copy_device(ref_outs[at].data(), outs.buf.data(), outs.buf.bytes(), stream);
              copy_device(ref_chain[at].data(), chain.data(), chain.bytes(), stream);
              return;
            case Against::kExact:
            case Against::kFirstFast: {
              const bool exact = mode.against == Against::kExact;
              const char* whose = exact ? "eager's" : "the first fast step's";
              differs((exact ? ref_outs : fast_outs)[at].data(), outs.buf.data(), outs.buf.bytes(),
                      fmt::format("{} step, replay {}: the layers' outputs differ from {}",
                                  mode.name, r, whose));
              differs((exact ? ref_chain : fast_chain)[at].data(), chain.data(), chain.bytes(),
                      fmt::format("{} step, replay {}: the hidden states differ from {}", mode.name,
                                  r, whose));
              return;
            }
            case Against::kExactLayer0: {
              const std::vector<bf16_t> got = download_bf16(outs.at(0), layer0_elems, stream);
              const std::vector<bf16_t> want =
                  download_bf16(ref_outs[at].data(), layer0_elems, stream);
              layer0.add(got.data(), want.data(), layer0_elems, a.shape.V);
              if (saves_fast) {
                copy_device(fast_outs[at].data(), outs.buf.data(), outs.buf.bytes(), stream);
                copy_device(fast_chain[at].data(), chain.data(), chain.bytes(), stream);
              }
              return;
            }
          }
        });
    check_error_flag(ctx, problem, "step guard");
    if (mode.deferred) {
      CommitParams materialize = kda.commit;
      materialize.kind = CommitKind::kMaterialize;
      kernels::invoke_commit(materialize, stream, a.launch);
    }
    const Pool& ssm = problem.ssm_state();
    const Pool& conv = problem.conv_state();
    switch (mode.against) {
      case Against::kNone:
        eager_end.save(problem, stream);
        break;
      case Against::kExact:
        differs(eager_end.ssm.data(), ssm.buf.data(), eager_end.ssm.bytes(),
                fmt::format("{} step: the committed SSM state differs from eager's", mode.name));
        differs(eager_end.conv.data(), conv.buf.data(), eager_end.conv.bytes(),
                fmt::format("{} step: the committed conv state differs from eager's", mode.name));
        break;
      case Against::kExactLayer0:
        // Copy 0 (layer 0) leads each pool.
        differs(eager_end.ssm.data(), ssm.at(0), ssm.bytes(),
                fmt::format("{} step: layer 0's committed SSM state differs from the exact eager "
                            "step's",
                            mode.name));
        differs(eager_end.conv.data(), conv.at(0), conv.bytes(),
                fmt::format("{} step: layer 0's committed conv state differs from the exact "
                            "eager step's",
                            mode.name));
        layer0_diffs.emplace_back(mode.name, layer0);
        if (saves_fast) {
          fast_end->save(problem, stream);
          first_fast = false;
        }
        break;
      case Against::kFirstFast:
        differs(fast_end->ssm.data(), ssm.buf.data(), fast_end->ssm.bytes(),
                fmt::format("{} step: the committed SSM state differs from the first fast step's",
                            mode.name));
        differs(fast_end->conv.data(), conv.buf.data(), fast_end->conv.bytes(),
                fmt::format("{} step: the committed conv state differs from the first fast "
                            "step's",
                            mode.name));
        break;
    }
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
  if (fast.eager) {
    fmt::print(stderr,
               "kda_bench: step guard ok (fast step twice: equal over {} replays in every layer's "
               "outputs, the hidden states and every committed state; layer 0's committed state "
               "== the exact step's)\n",
               kStepGuardReplays);
  }
  for (const auto& [name, d] : layer0_diffs) {
    fmt::print(stderr,
               "kda_bench: step guard: {} step, layer 0's outputs vs exact over {} "
               "replays: {}{}\n",
               name, kStepGuardReplays, d.describe(),
               d.meets_contract() ? "" : " (outside contract §10 (b))");
  }
}

/// Contract §10 (b) for a fast step row: one eager step (no graph, no commit: the committed state
/// is untouched) in which every layer's verify runs exact, then fast, on the same projection
/// output (FastCheck), the step going on with the fast outputs. Every layer's outputs feed the
/// statistics; the records and windows must be exact's.
OutputDiff step_output_diff(BenchContext& ctx, const Problem& problem, const StepModel& m,
                            const StepGemms& g, const StepKda& fast, FastCheck& check, int T,
                            int B) {
  check.clear();
  enqueue_layers(
      m, g, problem,
      [&](int l) {
        check.compare(fast.verifies[static_cast<size_t>(l)], fast.bv, l, int64_t{B} * T,
                      ctx.args.launch, ctx.stream);
      },
      ctx.stream);
  KDA_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  fast_failures(ctx, check.failures(), fmt::format("step T={} B={}", T, B));
  fmt::print(stderr, "kda_bench: [step] fast vs exact, every layer of one step: {}\n",
             check.diff().describe());
  return check.diff();
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
      const bool fast = a.has_numerics(VerifyNumerics::kFast);
      const int64_t need = Problem::device_bytes(cfg) +
                           lay.device_bytes(a.shape, cfg, a.guard, fast) +
                           (fast ? FastCheck::device_bytes(cfg) : 0);
      KDA_CHECK_CODE(
          static_cast<double>(need) <= 0.95 * static_cast<double>(free_b), ErrorCode::kOutOfMemory,
          "step B={}: needs {:.2f} GiB of device memory, {:.2f} GiB free; lower "
          "--batch-sizes or --layers, or --skip-guard (no snapshot pools)",
          B, static_cast<double>(need) / (1 << 30), static_cast<double>(free_b) / (1 << 30));
    }
    const Problem problem(cfg, ctx.stream);
    const StepModel model(ctx, lay, ctx.stream);
    const DeferredState deferred(ctx, problem);
    std::optional<FastCheck> check;
    if (a.has_numerics(VerifyNumerics::kFast)) {
      check.emplace(problem);
    }
    for (int T : a.draft_tokens) {
      const std::vector<int> accepted = step_accepted(a.seed, T, B);
      problem.set_accepted(accepted, ctx.stream);
      const StepGemms gemms(lt, lay, a.shape, int64_t{B} * T);
      fmt::print(stderr, "kda_bench: [step] T={} B={} layers={}: GEMMs {} | {}{}\n", T, B, a.layers,
                 gemms.in.describe(), gemms.out.describe(),
                 gemms.up ? fmt::format(" | {} | {}", gemms.up->describe(), gemms.down->describe())
                          : std::string());
      const FastSteps fast = fast_steps(ctx, problem, model, deferred, T, B);
      if (a.guard) {
        run_step_guard(ctx, problem, model, gemms, deferred, T, B, fast);
      }
      const StepBytes bytes = step_kda_bytes(a.shape, a.layers, B, T, accepted, cfg.T_max, cfg.L);
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
        for (const VerifyNumerics nm : a.numerics) {
          const bool is_fast = nm == VerifyNumerics::kFast;
          if (is_fast && (!variant_takes_fast(v) || !fast.eager)) {
            continue;  // fast_steps() noted why
          }
          // 0: eager, 1: deferred, 2: the lazy write-back (fast fused+ring steps only).
          for (const int commit : {0, 1, 2}) {
            const bool defer = commit != 0, lazy = commit == 2;
            if ((defer && !ring) || (commit == 1 && is_fast && !fast.deferred) ||
                (lazy && (!is_fast || v != Variant::kFusedRing || !fast.lazy))) {
              continue;
            }
            deferred.reset(ctx.stream);
            const StepKda kda =
                make_kda(ctx, problem, model, v, T, B, defer ? &deferred : nullptr, nm, lazy);
            const char* suffix = lazy ? "+lazy" : defer ? "+deferred" : "";
            Row r = step_row(ctx, std::string(variant_name(v)) + suffix, v, kda.bv, T, B);
            const PlannedLayers plan = planned_layers(v, kda.bv, kda.verifies, a.launch);
            r.kernel = plan.kernel;
            r.numerics = plan.numerics;
            if (is_fast && !defer) {
              r.diff = step_output_diff(ctx, problem, model, gemms, kda, *check, T, B);
            } else if (is_fast) {
              note(ctx,
                   "fast deferred and lazy steps: no §10 (b) statistics (their verifies read "
                   "pending steps: no exact twin on the same inputs; the step guard compares "
                   "layer 0's)");
            }
            fmt::print(stderr, "kda_bench: [step] {} {}: {}\n", r.what, numerics_name(r.numerics),
                       r.kernel);
            r.timing = time_in_graph(
                ctx.stream, 1,
                [&](int) { enqueue_step(model, gemms, problem, &kda, a.launch, ctx.stream); },
                timer);
            check_error_flag(ctx, problem, "step");
            finish_share(ctx, r, gemm_us,
                         !ring   ? bytes.snapshot
                         : lazy  ? bytes.lazy
                         : defer ? bytes.deferred
                                 : bytes.ring);
            print_row(r);
            rows.push_back(r);
          }
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
      for (const FastStepEntry& e : fast_step_entries(rows)) {
        fmt::print(
            "            fast outputs (step): {} at T={} B={}: KDA share {:.1f} vs {:.1f} us exact "
            "({:.2f}x)\n",
            e.what, T, B, e.fast_share_us, e.exact_share_us,
            e.fast_share_us > 0.0 ? e.exact_share_us / e.fast_share_us : 0.0);
      }
      if (!a.out_path.empty()) {
        write_rows(a.out_path, ctx.info, ctx.rows, recommend(ctx.rows, a));
      }
    }
  }
  print_step_advice(step_advice(ctx.rows, a));
}

}  // namespace kda::bench
