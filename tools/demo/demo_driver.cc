#include "tools/demo/demo_driver.h"

#include <chrono>
#include <utility>

#include "backend/kernel_set_factory.h"
#include "core/error.h"

namespace kda::demo {

namespace {

// Prefix caching takes one slot per group (its cache slot) and one per decode track.
int64_t prefix_slots(const RunSpec& s) {
  if (!s.prefix.enabled) {
    return 0;
  }
  return prefix_groups(s.prefix, s.requests) +
         count_decode_tracks(s.prefix, s.accept, s.seed, s.requests, s.rounds, s.prompt_len,
                             s.flags.num_draft_tokens);
}

BackendOptions backend_options(const RunSpec& spec) {
  BackendOptions o;
  o.platform_override = spec.platform;
  const int64_t extra = prefix_slots(spec);
  KDA_CHECK(extra <= (int64_t{1} << 20),
            "{}: prefix caching needs {} extra slots (one per group and per decode track); "
            "raise --track-interval",
            spec.label, extra);
  o.extra_slots = static_cast<int>(extra);
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
  const PrefixSpec& p = s.prefix;
  KDA_CHECK(!p.enabled || (p.shared_len >= 1 && p.shared_len <= s.prompt_len && p.group_size >= 1 &&
                           p.track_interval >= 1),
            "{}: prefix cache: shared_len {} outside [1, prompt_len = {}], group_size {} or "
            "track_interval {} below 1",
            s.label, p.shared_len, s.prompt_len, p.group_size, p.track_interval);
  KDA_CHECK(!p.enabled || s.draft_shape == DraftShapeKind::kChain,
            "{}: prefix caching runs chain drafts only (draft shape {})", s.label,
            draft_shape_kind_name(s.draft_shape));
  KDA_CHECK(s.draft_shape != DraftShapeKind::kTree || s.flags.tree_drafts(),
            "{}: tree drafts need --speculative-eagle-topk > 1 (got {})", s.label,
            s.flags.eagle_topk);
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
      paths_(spec_.device, spec_.requests * spec_.flags.num_draft_tokens),
      round_index_(spec_.device, 1),
      track_slots_(spec_.device, spec_.requests),
      track_steps_(spec_.device, spec_.requests),
      clock_(spec_.device, stream_.get(), 2 * spec_.model.num_layers + 3) {
  for (int l = 0; l < spec_.model.num_layers; ++l) {
    backend_->set_layer_weights(l, weights_.layer(l));
  }
  for (int n = 0; n < spec_.requests; ++n) {
    slots_.push_back(backend_->allocate_slot(stream_.get()));
    committed_.push_back(spec_.prompt_len);
  }
  if (spec_.prefix.enabled) {
    for (int g = 0; g < prefix_groups(spec_.prefix, spec_.requests); ++g) {
      cache_slots_.push_back(backend_->allocate_slot(stream_.get()));
    }
    const int64_t tracks = prefix_slots(spec_) - static_cast<int64_t>(cache_slots_.size());
    for (int64_t i = 0; i < tracks; ++i) {
      track_pool_.push_back(backend_->allocate_slot(stream_.get()));
    }
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
  if (spec_.prefix.enabled) {
    prefill_shared();
  } else {
    stats_.prefill_ms += extend_prompt(0, 1, spec_.requests, 0, spec_.prompt_len, ExtendTrack{});
  }
  stream_.synchronize();
}

double DemoRun::extend_prompt(int request0, int stride, int count, int first_row, int T,
                              const ExtendTrack& track) {
  const int L = spec_.model.num_layers;
  const int64_t rows = int64_t{count} * T;
  LayerActivations acts(spec_.model, spec_.device, rows);
  StreamClock clock(spec_.device, stream_.get(), 2);
  round_index_.staging()[0] = 0;
  round_index_.upload(1, stream_.get());
  BatchSpec batch;
  batch.T = T;
  for (int i = 0; i < count; ++i) {
    batch.slots.push_back(slot_of(request0 + i * stride));
  }
  backend_->prepare_extend(batch, track, stream_.get());
  ActivationKey key{spec_.seed, Phase::kPrompt, round_index_.device_data()};
  key.request0 = request0;
  key.request_stride = stride;
  key.first_row = first_row;
  if (spec_.prefix.enabled) {
    key.shared_rows = spec_.prefix.shared_len;
    key.group_size = spec_.prefix.group_size;
  }
  double ms = 0.0;
  for (int l = 0; l < L; ++l) {
    // Stream order: layer l's inputs overwrite `acts` after layer l-1's extend has read them.
    acts.fill(key, l, count, T, stream_.get());
    clock.mark(0);
    backend_->extend(l, acts.inputs(rows), acts.out(rows), stream_.get());
    clock.mark(1);
    clock.finish(1);
    ms += clock.elapsed_ms(0, 1);
  }
  stream_.synchronize();  // `acts` and the staged round go out of scope / are rewritten next
  return ms;
}

void DemoRun::prefill_shared() {
  const PrefixSpec& ps = spec_.prefix;
  const int G = ps.group_size, P = ps.shared_len, groups = prefix_groups(ps, spec_.requests);
  const int L = spec_.model.num_layers;
  // Leaders (requests 0, G, 2G, ...): the whole prompt, tracking the state after token P-1.
  ExtendTrack track;
  track.slots = cache_slots_;
  const bool plant_prefix = ps.fault == PrefixFault::kPrefixTrackStep && P >= 2;
  track.steps.assign(static_cast<size_t>(groups), plant_prefix ? P - 2 : P - 1);
  fault_planted_ = fault_planted_ || plant_prefix;
  stats_.prefill_ms += extend_prompt(0, G, groups, 0, spec_.prompt_len, track);
  for (int g = 0; g < groups; ++g) {
    PrefixEvent e;
    e.kind = PrefixEventKind::kPrefixTrack;
    e.request = g * G;
    e.tokens = P;
    e.slot = cache_slots_[static_cast<size_t>(g)];
    prefix_events_.push_back(std::move(e));
  }
  // Followers at position j of every group: copy the group's cache slot, then their own
  // prompt rows P.. in one extend batch (the requests j, G+j, 2G+j, ... share T).
  const bool plant_copy = ps.fault == PrefixFault::kCopySource && groups >= 2;
  fault_planted_ = fault_planted_ || plant_copy;
  for (int j = 1; j < G; ++j) {
    std::vector<int32_t> copied;
    for (int m = j; m < spec_.requests; m += G) {
      const int g = group_of(ps, m);
      const int src = plant_copy ? (g + 1) % groups : g;
      backend_->copy_slot(cache_slots_[static_cast<size_t>(src)], slot_of(m), stream_.get());
      copied.push_back(slot_of(m));
    }
    if (copied.empty()) {
      break;  // no group has a member at position j (nor at any later one)
    }
    // Deferred commit: copy_slot may carry pending steps; fold them before reading the views.
    backend_->materialize(copied, stream_.get());
    for (int m = j; m < spec_.requests; m += G) {
      PrefixEvent e;
      e.kind = PrefixEventKind::kCopy;
      e.request = m;
      e.tokens = P;
      for (int l = 0; l < L; ++l) {
        e.ssm.push_back(ssm_state(l, m));
        e.conv.push_back(conv_state(l, m));
      }
      prefix_events_.push_back(std::move(e));
    }
    if (P < spec_.prompt_len) {
      const int count = static_cast<int>(copied.size());
      stats_.prefill_ms += extend_prompt(j, G, count, P, spec_.prompt_len - P, ExtendTrack{});
    }
  }
}

void DemoRun::stage_decode_tracks(int round) {
  const int B = spec_.requests;
  for (int n = 0; n < B; ++n) {
    const int len = accepted_.staging()[n];
    int32_t step =
        decode_track_step(committed_[static_cast<size_t>(n)], len, spec_.prefix.track_interval);
    int32_t slot = -1;
    if (step >= 0) {
      KDA_CHECK(next_track_ < track_pool_.size(),
                "{}: decode track {} has no slot (the schedule counted {})", spec_.label,
                next_track_, track_pool_.size());
      slot = track_pool_[next_track_++];
      PrefixEvent e;
      e.kind = PrefixEventKind::kDecodeTrack;
      e.request = n;
      e.round = round;
      e.tokens = committed_[static_cast<size_t>(n)] + step + 1;
      e.slot = slot;
      prefix_events_.push_back(std::move(e));
      if (spec_.prefix.fault == PrefixFault::kDecodeTrackStep && !fault_planted_ && step >= 1) {
        --step;
        fault_planted_ = true;
      }
    }
    track_slots_.staging()[n] = slot;
    track_steps_.staging()[n] = step;
    committed_[static_cast<size_t>(n)] += len;
  }
}

void DemoRun::capture_round(const BatchSpec& batch) {
  // verify() needs a prepared round; the captured calls only enqueue, so the round they
  // filled is dropped afterwards and every replay is recorded with record_graph_verify_round.
  // A ragged run captures with every T_n = T (B*T rows): the replays' shorter batches read the
  // same buffers through the uploaded offsets.
  const int L = spec_.model.num_layers, B = spec_.requests, T = batch.T;
  const int64_t rows = int64_t{B} * T;
  const ActivationKey key{spec_.seed, Phase::kVerify, round_index_.device_data()};
  BatchSpec capture = batch;
  if (!capture.lengths.empty()) {
    capture.lengths.assign(capture.lengths.size(), T);
  }
  backend_->prepare(capture, stream_.get());
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
  BatchSpec batch;
  batch.T = T;
  batch.slots = slots_;
  int64_t tokens = rows;  // this round's activation rows (ragged: the sum of the T_n)
  if (spec_.draft_shape == DraftShapeKind::kRagged) {
    tokens = 0;
    for (int n = 0; n < B; ++n) {
      batch.lengths.push_back(draft_length(spec_.seed, round, n, T));
      tokens += batch.lengths.back();
    }
  }
  rec.drafted_tokens = tokens;
  for (int n = 0; n < B; ++n) {
    int len = 0;
    switch (spec_.draft_shape) {
      case DraftShapeKind::kChain:
        len = accepted_length(spec_.accept, spec_.seed, round, n, T);
        break;
      case DraftShapeKind::kRagged:
        len = accepted_length(spec_.accept, spec_.seed, round, n,
                              batch.lengths[static_cast<size_t>(n)]);
        break;
      case DraftShapeKind::kTree: {
        const std::vector<int32_t> parents =
            draft_tree(spec_.seed, round, n, T, spec_.flags.eagle_topk);
        batch.parents.insert(batch.parents.end(), parents.begin(), parents.end());
        const std::vector<int32_t> path =
            accepted_path(spec_.accept, spec_.seed, round, n, parents);
        len = static_cast<int>(path.size());
        for (int k = 0; k < T; ++k) {
          paths_.staging()[n * T + k] = k < len ? path[static_cast<size_t>(k)] : -1;
        }
        break;
      }
    }
    accepted_.staging()[n] = len;
    rec.accepted_tokens += len;
  }
  round_index_.staging()[0] = round;
  if (spec_.prefix.enabled) {
    stage_decode_tracks(round);
  }
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
          backend_->verify(l, acts.inputs(tokens), acts.out(tokens), stream_.get()));
      clock_.mark(mark++);
    }
  }
  const int verified = mark - 1;
  accepted_.upload(B, stream_.get());
  const bool tree = spec_.draft_shape == DraftShapeKind::kTree;
  if (tree) {
    paths_.upload(B * T, stream_.get());
  }
  if (spec_.prefix.enabled) {
    track_slots_.upload(B, stream_.get());
    track_steps_.upload(B, stream_.get());
  }
  clock_.mark(mark++);
  if (spec_.prefix.enabled) {
    const CommitTrack track{track_slots_.device_view(B), track_steps_.device_view(B)};
    backend_->commit(accepted_.device_view(B), track, stream_.get());
  } else if (tree) {
    const TensorView paths(const_cast<int32_t*>(paths_.device_data()), DType::kI32, spec_.device,
                           {B, T}, {T, 1});
    backend_->commit_tree(accepted_.device_view(B), paths, stream_.get());
  } else {
    backend_->commit(accepted_.device_view(B), stream_.get());
  }
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
  return slot_ssm_state(layer, slot_of(request));
}

std::vector<bf16_t> DemoRun::conv_state(int layer, int request) const {
  return slot_conv_state(layer, slot_of(request));
}

std::vector<float> DemoRun::slot_ssm_state(int layer, int slot) const {
  stream_.synchronize();
  return to_host_vector<float>(backend_->pool().ssm_state(layer).select(0, slot));
}

std::vector<bf16_t> DemoRun::slot_conv_state(int layer, int slot) const {
  stream_.synchronize();
  return to_host_vector<bf16_t>(backend_->pool().conv_state(layer).select(0, slot));
}

}  // namespace kda::demo
