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
      clock_(spec_.device, stream_.get(), spec_.model.num_layers + 3) {
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
}

void DemoRun::prefill() {
  if (spec_.prompt_len == 0) {
    return;
  }
  const int L = spec_.model.num_layers, B = spec_.requests, P = spec_.prompt_len;
  const int64_t rows = int64_t{B} * P;
  LayerActivations acts(spec_.model, spec_.device, rows);
  StreamClock clock(spec_.device, stream_.get(), 2);
  BatchSpec batch;
  batch.T = P;
  batch.slots = slots_;
  backend_->prepare_extend(batch, stream_.get());
  const ActivationKey key{spec_.seed, Phase::kPrompt, 0};
  for (int l = 0; l < L; ++l) {
    generate_activations(spec_.model, key, l, 1, B, P, host_inputs_);
    stream_.synchronize();  // the previous layer's extend has read `acts`
    acts.upload(host_inputs_[0]);
    clock.mark(0);
    backend_->extend(l, acts.inputs(rows), acts.out(rows), stream_.get());
    clock.mark(1);
    clock.finish(1);
    stats_.prefill_ms += clock.elapsed_ms(0, 1);
  }
  stream_.synchronize();
  host_inputs_.clear();
}

RoundRecord DemoRun::run_round(int round) {
  const int L = spec_.model.num_layers, B = spec_.requests, T = spec_.flags.num_draft_tokens;
  const int64_t rows = int64_t{B} * T;
  RoundRecord rec;
  rec.round = round;
  rec.drafted_tokens = rows;

  // Inputs of every layer, uploaded before the timed part (the previous round has finished:
  // run_round ends with a synchronisation, so no kernel still reads these buffers).
  generate_activations(spec_.model, ActivationKey{spec_.seed, Phase::kVerify, round}, 0, L, B, T,
                       host_inputs_);
  for (int l = 0; l < L; ++l) {
    verify_inputs_[static_cast<size_t>(l)].upload(host_inputs_[static_cast<size_t>(l)]);
  }
  // The simulated sampler's verdict, staged in pinned memory (uploaded after the verifies).
  for (int n = 0; n < B; ++n) {
    const int len = accepted_length(spec_.accept, spec_.seed, round, n, T);
    accepted_.staging()[n] = len;
    rec.accepted_tokens += len;
  }

  const auto t0 = std::chrono::steady_clock::now();
  BatchSpec batch;
  batch.T = T;
  batch.slots = slots_;
  backend_->prepare(batch, stream_.get());
  round_decisions_.clear();
  clock_.mark(0);
  for (int l = 0; l < L; ++l) {
    const LayerActivations& acts = verify_inputs_[static_cast<size_t>(l)];
    round_decisions_.push_back(
        backend_->verify(l, acts.inputs(rows), acts.out(rows), stream_.get()));
    clock_.mark(l + 1);
  }
  accepted_.upload(B, stream_.get());
  clock_.mark(L + 1);
  backend_->commit(accepted_.device_view(B), stream_.get());
  clock_.mark(L + 2);
  clock_.finish(L + 2);
  rec.wall_ms = ms_since(t0);
  backend_->check_device_errors(stream_.get());
  count_decisions();

  for (int l = 0; l < L; ++l) {
    rec.verify_ms.push_back(clock_.elapsed_ms(l, l + 1));
  }
  rec.verify_total_ms = clock_.elapsed_ms(0, L);
  rec.upload_ms = clock_.elapsed_ms(L, L + 1);
  rec.commit_ms = clock_.elapsed_ms(L + 1, L + 2);
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
