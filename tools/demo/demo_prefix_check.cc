#include "tools/demo/demo_prefix_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "backend/kernel_set_factory.h"
#include "core/error.h"
#include "tools/demo/demo_device.h"
#include "tools/demo/demo_inputs.h"
#include "tools/demo/demo_model.h"

namespace kda::demo {

namespace {

// Rows [0, len) of one source of a request's history: its prompt, or round r's accepted rows.
struct Segment {
  Phase phase;
  int round;
  int len;
};

// What was compared for one event kind (or the final states).
struct KindTally {
  explicit KindTally(const char* w) : what(w) {}
  const char* what;
  int64_t events = 0;
  StateDiff ssm, conv;
};

std::string tally_line(const KindTally& t) {
  if (t.events == 0) {
    return fmt::format("{:>5} {}", 0, t.what);
  }
  const auto part = [](const char* name, const StateDiff& d) {
    return d.bitwise() ? fmt::format("{} bitwise equal", name)
                       : fmt::format(
                             "{} NOT bitwise equal ({} values differ, max abs err {:.3g}, "
                             "worst layer {}, request {})",
                             name, d.differing, d.max_abs, d.worst_layer, d.worst_request);
  };
  return fmt::format("{:>5} {} ({} layer states): {}; {}", t.events, t.what, t.ssm.states,
                     part("ssm", t.ssm), part("conv", t.conv));
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

CheckOutcome check_prefix_cache(const DemoRun& primary) {
  const RunSpec& p = primary.spec();
  KDA_CHECK(p.prefix.enabled, "check_prefix_cache: {} has no prefix cache", p.label);
  const int L = p.model.num_layers, T = p.flags.num_draft_tokens;

  DemoStream stream(p.device);
  const DemoWeights weights(p.model, p.device, p.seed);
  EngineFlags flags = p.flags;
  flags.max_running_requests = 1;  // one request at a time
  BackendOptions options;
  options.platform_override = p.platform;
  KdaAttentionBackend ref(p.model, flags, make_kernel_set(p.device), options);
  for (int l = 0; l < L; ++l) {
    ref.set_layer_weights(l, weights.layer(l));
  }
  const LayerActivations acts(p.model, p.device, std::max(p.prompt_len, T));
  StagedInts round_index(p.device, 1);

  // Indexed by PrefixEventKind, then the final states.
  KindTally tallies[] = {KindTally("prefix tracks (ExtendTrack, cache slots)"),
                         KindTally("copies (copy_slot into a follower, before its suffix)"),
                         KindTally("decode tracks (CommitTrack, track slots)"),
                         KindTally("final committed states")};
  KindTally& finals = tallies[3];
  CheckOutcome out;
  out.rule = CompareRule::kBitwise;
  double compare_seconds = 0.0;
  const auto t_start = std::chrono::steady_clock::now();

  // Compares the reference slot's states with the primary's (`held`: per layer, or nullptr =
  // read `slot` of the primary).
  const auto compare = [&](KindTally& tally, int request, int ref_slot, int slot,
                           const PrefixEvent* held) {
    const auto t0 = std::chrono::steady_clock::now();
    stream.synchronize();
    for (int l = 0; l < L; ++l) {
      const std::vector<float> ref_ssm =
          to_host_vector<float>(ref.pool().ssm_state(l).select(0, ref_slot));
      const std::vector<bf16_t> ref_conv =
          to_host_vector<bf16_t>(ref.pool().conv_state(l).select(0, ref_slot));
      const std::vector<float> ssm =
          held != nullptr ? held->ssm[static_cast<size_t>(l)] : primary.slot_ssm_state(l, slot);
      const std::vector<bf16_t> conv =
          held != nullptr ? held->conv[static_cast<size_t>(l)] : primary.slot_conv_state(l, slot);
      for (StateDiff* d : {&tally.ssm, &out.ssm}) {
        compare_state(*d, ssm, ref_ssm, l, request);
      }
      for (StateDiff* d : {&tally.conv, &out.conv}) {
        compare_state(*d, conv, ref_conv, l, request);
      }
    }
    ++tally.events;
    compare_seconds += seconds_since(t0);
  };

  int64_t compared_events = 0;
  for (int m = 0; m < p.requests; ++m) {
    std::vector<const PrefixEvent*> events;
    for (const PrefixEvent& e : primary.prefix_events()) {
      if (e.request == m) {
        events.push_back(&e);
      }
    }
    std::vector<Segment> history;
    if (p.prompt_len > 0) {
      history.push_back({Phase::kPrompt, 0, p.prompt_len});
    }
    for (int r = 0; r < p.rounds; ++r) {
      history.push_back({Phase::kVerify, r, accepted_length(p.accept, p.seed, r, m, T)});
    }
    const int slot = ref.allocate_slot(stream.get());
    int64_t pos = 0;  // tokens of the history extended so far
    for (const Segment& seg : history) {
      for (int a = 0; a < seg.len;) {
        // The chunk ends at the segment's end or at the next tracked position.
        int64_t end = pos + (seg.len - a);
        for (const PrefixEvent* e : events) {
          if (e->tokens > pos && e->tokens < end) {
            end = e->tokens;
          }
        }
        const int len = static_cast<int>(end - pos);
        round_index.staging()[0] = seg.round;
        round_index.upload(1, stream.get());
        BatchSpec batch;
        batch.T = len;
        batch.slots = {slot};
        ref.prepare_extend(batch, stream.get());
        ActivationKey key{p.seed, seg.phase, round_index.device_data()};
        key.request0 = m;
        key.first_row = a;
        if (seg.phase == Phase::kPrompt) {
          key.shared_rows = p.prefix.shared_len;
          key.group_size = p.prefix.group_size;
        }
        for (int l = 0; l < L; ++l) {
          acts.fill(key, l, 1, len, stream.get());
          ref.extend(l, acts.inputs(len), acts.out(len), stream.get());
        }
        stream.synchronize();  // the staged round is rewritten by the next chunk
        a += len;
        pos = end;
        for (const PrefixEvent* e : events) {
          if (e->tokens == pos) {
            compare(tallies[static_cast<int>(e->kind)], m, slot, e->slot,
                    e->kind == PrefixEventKind::kCopy ? e : nullptr);
            ++compared_events;
          }
        }
      }
    }
    compare(finals, m, slot, primary.slot_of(m), nullptr);
    ref.release_slot(slot);
  }
  KDA_CHECK(compared_events == static_cast<int64_t>(primary.prefix_events().size()),
            "check_prefix_cache: compared {} of {} prefix-cache states (an event outside its "
            "request's history)",
            compared_events, primary.prefix_events().size());

  out.name = fmt::format(
      "{} prefix cache: tracked, copied and final states vs independent "
      "extend-only recomputation",
      device_name(p.device));
  out.coverage =
      fmt::format("all {} layers: {} prefix tracks, {} copies, {} decode tracks, {} final states",
                  L, tallies[0].events, tallies[1].events, tallies[2].events, finals.events);
  for (const KindTally& t : tallies) {
    out.details.push_back(tally_line(t));
  }
  out.compare_seconds = compare_seconds;
  out.run_seconds = seconds_since(t_start) - compare_seconds;
  return out;
}

}  // namespace kda::demo
