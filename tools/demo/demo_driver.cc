#include "tools/demo/demo_driver.h"

#include <chrono>
#include <utility>

#include "backend/kernel_set_factory.h"
#include "core/error.h"

namespace kda::demo {

namespace {

BackendOptions backend_options(const RunSpec& spec) {
  BackendOptions o;
  o.platform_override = spec.platform;
  return o;
}

const RunSpec& checked(const RunSpec& s) {
  KDA_CHECK(s.requests >= 1 && s.requests <= s.flags.max_running_requests,
            "{}: {} requests outside [1, --max-running-requests = {}]", s.label, s.requests,
            s.flags.max_running_requests);
  KDA_CHECK(s.prompt_len >= 0 && s.rounds >= 0, "{}: prompt_len {} / rounds {} negative", s.label,
            s.prompt_len, s.rounds);
  KDA_CHECK(!s.cuda_graph || s.device.is_cuda(), "{}: cuda_graph needs a CUDA device, got {}",
            s.label, device_name(s.device));
  return s;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

DemoRun::DemoRun(RunSpec spec)
    : spec_(checked(std::move(spec))),
      stream_(spec_.device),
      weights_(spec_.model, spec_.device, spec_.seed),
      backend_(std::make_unique<KdaAttentionBackend>(
          spec_.model, spec_.flags, make_kernel_set(spec_.device), backend_options(spec_))),
      accepted_(spec_.device, spec_.requests),
      round_index_(spec_.device, 1),
      clock_(spec_.device, stream_.get(), 2 * spec_.model.num_layers + 3) {
  for (int l = 0; l < spec_.model.num_layers; ++l) {
    backend_->set_layer_weights(l, weights_.layer(l));
  }
  for (int n = 0; n < spec_.requests; ++n) {
    slots_.push_back(backend_->allocate_slot(stream_.get()));
  }
  const int64_t rows = int64_t{spec_.requests} * spec_.flags.num_draft_tokens;
  round_decisions_.reserve(static_cast<size_t>(spec_.model.num_layers));
  verify_inputs_.reserve(static_cast<size_t>(spec_.model.num_layers));
  for (int l = 0; l < spec_.model.num_layers; ++l) {
    verify_inputs_.emplace_back(spec_.model, spec_.device, rows);
  }
}

DemoRun::~DemoRun() = default;

void DemoRun::run(const ProgressFn& progress) {
  prefill();
  for (int r = 0; r < spec_.rounds; ++r) {
    const RoundRecord rec = run_round(r);
    if (progress) {
      progress(spec_, rec);
    }
  }
  finish();
}

void DemoRun::finish() {
  // Deferred commit: the last round's accepted steps are still pending; fold them so that the
  // pool's state views (the check reads them) hold the committed state.
  backend_->materialize(slots_, stream_.get());
  stream_.synchronize();
}

void DemoRun::prefill() {
  if (spec_.prompt_len == 0) {
    return;
  }
  const int L = spec_.model.num_layers, B = spec_.requests, P = spec_.prompt_len;
  const int64_t rows = int64_t{B} * P;
  LayerActivations acts(spec_.model, spec_.device, rows);
  StreamClock clock(spec_.device, stream_.get(), 2);
  round_index_.staging()[0] = 0;
  round_index_.upload(1, stream_.get());
  BatchSpec batch;
  batch.T = P;
  batch.slots = slots_;
  backend_->prepare_extend(batch, stream_.get());
  const ActivationKey key{spec_.seed, Phase::kPrompt, round_index_.device_data()};
  for (int l = 0; l < L; ++l) {
    // Stream order: layer l's inputs overwrite `acts` after layer l-1's extend has read them.
    acts.fill(key, l, B, P, stream_.get());
    clock.mark(0);
    backend_->extend(l, acts.inputs(rows), acts.out(rows), stream_.get());
    clock.mark(1);
    clock.finish(1);
    stats_.prefill_ms += clock.elapsed_ms(0, 1);
  }
  stream_.synchronize();
}

void DemoRun::capture_round(const BatchSpec& batch) {
  // verify() needs a prepared round; the captured calls only enqueue, so the round they
  // filled is dropped afterwards and every replay is recorded with record_graph_verify_round.
  const int L = spec_.model.num_layers, B = spec_.requests, T = batch.T;
  const int64_t rows = int64_t{B} * T;
  const ActivationKey key{spec_.seed, Phase::kVerify, round_index_.device_data()};
  backend_->prepare(batch, stream_.get());
  graph_decisions_.clear();
  try {
    graph_.capture(stream_.get(), [&] {
      for (int l = 0; l < L; ++l) {
        const LayerActivations& acts = verify_inputs_[static_cast<size_t>(l)];
        acts.fill(key, l, B, T, stream_.get());
        graph_decisions_.push_back(
            backend_->verify(l, acts.inputs(rows), acts.out(rows), stream_.get()));
      }
    });
  } catch (...) {
    backend_->abort_round(stream_.get());
    throw;
  }
  backend_->abort_round(stream_.get());
}

RoundRecord DemoRun::run_round(int round) {
  const int L = spec_.model.num_layers, B = spec_.requests, T = spec_.flags.num_draft_tokens;
  const int64_t rows = int64_t{B} * T;
  RoundRecord rec;
  rec.round = round;
  rec.graphed = spec_.cuda_graph;
  rec.drafted_tokens = rows;

  // The simulated sampler's verdict and the round number, staged in pinned memory (the
  // previous round has finished: run_round ends with a synchronisation).
  for (int n = 0; n < B; ++n) {
    const int len = accepted_length(spec_.accept, spec_.seed, round, n, T);
    accepted_.staging()[n] = len;
    rec.accepted_tokens += len;
  }
  round_index_.staging()[0] = round;
  BatchSpec batch;
  batch.T = T;
  batch.slots = slots_;
  // Every round verifies the same batch (B, T, slots), so one capture serves the whole run.
  if (spec_.cuda_graph && !graph_.captured()) {
    capture_round(batch);
  }

  const auto t0 = std::chrono::steady_clock::now();
  round_index_.upload(1, stream_.get());
  backend_->prepare(batch, stream_.get());
  round_decisions_.clear();
  // Marks: 0; eager: after each layer's inputs (2l+1) and verify (2l+2); graphed: after the
  // replay (1); then after the upload and after the commit.
  int mark = 0;
  clock_.mark(mark++);
  if (spec_.cuda_graph) {
    backend_->record_graph_verify_round();
    graph_.launch(stream_.get());
    round_decisions_ = graph_decisions_;
    clock_.mark(mark++);
  } else {
    const ActivationKey key{spec_.seed, Phase::kVerify, round_index_.device_data()};
    for (int l = 0; l < L; ++l) {
      const LayerActivations& acts = verify_inputs_[static_cast<size_t>(l)];
      acts.fill(key, l, B, T, stream_.get());
      clock_.mark(mark++);
      round_decisions_.push_back(
          backend_->verify(l, acts.inputs(rows), acts.out(rows), stream_.get()));
      clock_.mark(mark++);
    }
  }
  const int verified = mark - 1;
  accepted_.upload(B, stream_.get());
  clock_.mark(mark++);
  backend_->commit(accepted_.device_view(B), stream_.get());
  clock_.mark(mark++);
  const int last = mark - 1;
  clock_.finish(last);
  rec.wall_ms = ms_since(t0);
  backend_->check_device_errors(stream_.get());
  count_decisions();

  if (spec_.cuda_graph) {
    rec.verify_total_ms = clock_.elapsed_ms(0, 1);
  } else {
    for (int l = 0; l < L; ++l) {
      rec.inputs_ms += clock_.elapsed_ms(2 * l, 2 * l + 1);
      rec.verify_ms.push_back(clock_.elapsed_ms(2 * l + 1, 2 * l + 2));
      rec.verify_total_ms += rec.verify_ms.back();
    }
  }
  rec.upload_ms = clock_.elapsed_ms(verified, verified + 1);
  rec.commit_ms = clock_.elapsed_ms(verified + 1, last);
  rec.device_ms = clock_.elapsed_ms(0, last);
  stats_.rounds.push_back(rec);
  stats_.accepted_tokens += rec.accepted_tokens;
  stats_.drafted_tokens += rec.drafted_tokens;
  return rec;
}

void DemoRun::count_decisions() {
  for (const DispatchDecision& d : round_decisions_) {
    std::string text = d.describe();
    bool seen = false;
    for (DecisionCount& c : stats_.decisions) {
      if (c.text == text) {
        ++c.calls;
        seen = true;
        break;
      }
    }
    if (!seen) {
      stats_.decisions.push_back(DecisionCount{std::move(text), d.fused(), 1});
    }
  }
}

std::vector<float> DemoRun::ssm_state(int layer, int request) const {
  stream_.synchronize();
  return to_host_vector<float>(backend_->pool().ssm_state(layer).select(0, slot_of(request)));
}

std::vector<bf16_t> DemoRun::conv_state(int layer, int request) const {
  stream_.synchronize();
  return to_host_vector<bf16_t>(backend_->pool().conv_state(layer).select(0, slot_of(request)));
}

}  // namespace kda::demo
