#include "tools/demo/demo_report.h"

#include <fmt/format.h>

#include <algorithm>

namespace kda::demo {

namespace {

constexpr int kLabelWidth = 10;

std::string mib(int64_t bytes) {
  return fmt::format("{:.2f} MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

// "label     text", continuation lines indented under the text.
void section(std::ostream& os, const char* label, const std::string& text) {
  os << fmt::format("{:<{}}{}\n", label, kLabelWidth, text);
}
void more(std::ostream& os, const std::string& text) {
  os << fmt::format("{:<{}}{}\n", "", kLabelWidth + 2, text);
}

struct MeanMinMax {
  double mean = 0, min = 0, max = 0;
};
template <typename F>
MeanMinMax over_rounds(const std::vector<RoundRecord>& rounds, F value) {
  MeanMinMax m;
  if (rounds.empty()) {
    return m;
  }
  m.min = m.max = value(rounds.front());
  for (const RoundRecord& r : rounds) {
    const double v = value(r);
    m.mean += v;
    m.min = std::min(m.min, v);
    m.max = std::max(m.max, v);
  }
  m.mean /= static_cast<double>(rounds.size());
  return m;
}

std::string ms(double v) {
  return v >= 100.0 ? fmt::format("{:.1f} ms", v) : fmt::format("{:.3f} ms", v);
}

std::string mmm(const MeanMinMax& m) {
  return fmt::format("{} (min {}, max {})", ms(m.mean), ms(m.min), ms(m.max));
}

void print_diff(std::ostream& os, const char* what, const StateDiff& d, CompareRule rule) {
  std::string text = fmt::format(
      "{:<10} {} states, {} values: max abs err {:.3g}, {}", what, d.states, d.elements, d.max_abs,
      d.bitwise() ? "bitwise equal"
                  : fmt::format("NOT bitwise equal ({} values differ)", d.differing));
  if (rule == CompareRule::kRelL2 || !d.bitwise()) {
    text += fmt::format(", max rel L2 {:.3g}", d.max_rel_l2);
    if (d.worst_layer >= 0) {
      text += fmt::format(" (layer {}, request {})", d.worst_layer, d.worst_request);
    }
  }
  if (d.non_finite != 0) {
    text += fmt::format(", {} NaN/Inf values", d.non_finite);
  }
  text += d.passes(rule) ? " -> pass" : " -> FAIL";
  more(os, text);
}

// What the prefix cache did (demo_prefix.h): groups, copies, tracks and the slots they took.
void print_prefix(std::ostream& os, const DemoRun& primary) {
  const RunSpec& spec = primary.spec();
  const PrefixSpec& ps = spec.prefix;
  int64_t counts[3] = {0, 0, 0};
  int64_t first_decode = -1, last_decode = -1;
  for (const PrefixEvent& e : primary.prefix_events()) {
    ++counts[static_cast<int>(e.kind)];
    if (e.kind == PrefixEventKind::kDecodeTrack) {
      first_decode = first_decode < 0 ? e.tokens : std::min(first_decode, e.tokens);
      last_decode = std::max(last_decode, e.tokens);
    }
  }
  const int groups = prefix_groups(ps, spec.requests);
  section(
      os, "prefix",
      fmt::format("--prefix-cache: {} group{} of up to {} requests share their first {} of {} "
                  "prompt tokens",
                  groups, groups == 1 ? "" : "s", ps.group_size, ps.shared_len, spec.prompt_len));
  more(os, fmt::format("prefill: {} leader{} extended the whole prompt and tracked the state "
                       "after the {} shared tokens into a cache slot (ExtendTrack); {} "
                       "follower{} started from copy_slot of it and extended {} suffix tokens",
                       counts[0], counts[0] == 1 ? "" : "s", ps.shared_len, counts[1],
                       counts[1] == 1 ? "" : "s", spec.prompt_len - ps.shared_len));
  more(os, counts[2] == 0
               ? fmt::format("decode: no committed length crossed a multiple of "
                             "--track-interval {}",
                             ps.track_interval)
               : fmt::format("decode: {} tracks (CommitTrack) where a committed length reached a "
                             "multiple of --track-interval {} (at {}..{} tokens), one fresh slot "
                             "each",
                             counts[2], ps.track_interval, first_decode, last_decode));
  more(os, fmt::format("pool: {} slots = {} (--max-running-requests) + {} cache + {} track slots",
                       primary.backend().memory_report().slots, spec.flags.max_running_requests,
                       groups, counts[2]));
}

}  // namespace

std::string describe_engine_flags(const EngineFlags& f) {
  return fmt::format(
      "T={} (--speculative-num-draft-tokens), {}, max-running-requests {}, fused verify {}, "
      "fused-ring-max-batch {}, verify-block-v {}",
      f.num_draft_tokens,
      f.replayssm_spec ? fmt::format("ring mode (ReplaySSM, L={})", f.replayssm_cache_len)
                       : std::string("snapshot mode"),
      f.max_running_requests, f.fused_verify ? "on" : "off", f.fused_ring_max_batch,
      f.verify_block_v == 0 ? std::string("auto (per call, by grid and T)")
                            : std::to_string(f.verify_block_v));
}

std::string progress_line(const RunSpec& spec, const RoundRecord& rec) {
  const int layers = static_cast<int>(rec.verify_ms.size());
  const std::string work = rec.graphed
                               ? fmt::format("inputs + verify (graph) {}", ms(rec.verify_total_ms))
                               : fmt::format("inputs {}, verify {} ({} per layer)",
                                             ms(rec.inputs_ms), ms(rec.verify_total_ms),
                                             ms(layers > 0 ? rec.verify_total_ms / layers : 0.0));
  return fmt::format("[{}] round {}/{}: accepted {}/{} tokens; {}, commit {}; device {}, wall {}",
                     spec.label, rec.round + 1, spec.rounds, rec.accepted_tokens,
                     rec.drafted_tokens, work, ms(rec.commit_ms), ms(rec.device_ms),
                     ms(rec.wall_ms));
}

void print_summary(std::ostream& os, const SummaryContext& ctx, const DemoRun& primary,
                   const std::vector<CheckOutcome>& checks) {
  const RunSpec& spec = primary.spec();
  const RunStats& st = primary.stats();
  const int rounds = static_cast<int>(st.rounds.size());
  const int layers = spec.model.num_layers;
  const KdaAttentionBackend& backend = primary.backend();

  os << "\n==== kda_demo summary ====\n";
  section(os, "device", ctx.device_text);
  more(os, "dispatcher platform: " + backend.platform().describe());
  section(os, "model", ctx.model_text);
  section(os, "engine", describe_engine_flags(spec.flags));
  section(os, "workload",
          fmt::format("{} request{} (one slot each), prompt {} tokens each (extend), {} rounds "
                      "of inputs + verify -> commit ({}), accept {}, seed {}",
                      spec.requests, spec.requests == 1 ? "" : "s", spec.prompt_len, spec.rounds,
                      !spec.device.is_cuda()
                          ? "inputs drawn on the host"
                          : (spec.cuda_graph ? "inputs drawn on the GPU; one CUDA graph replay "
                                               "per round"
                                             : "inputs drawn on the GPU; eager launches"),
                      spec.accept.describe(), spec.seed));
  for (const std::string& n : ctx.notes) {
    more(os, "note: " + n);
  }
  if (spec.prefix.enabled) {
    print_prefix(os, primary);
  }

  // ---- tokens ----
  const double per_round = rounds > 0 ? static_cast<double>(st.accepted_tokens) / rounds : 0.0;
  section(os, "tokens",
          fmt::format("{} rounds, accepted {} of {} verified tokens ({:.1f}%); mean {:.2f} per "
                      "round, {:.2f} per request per round (T = {})",
                      rounds, st.accepted_tokens, st.drafted_tokens,
                      st.drafted_tokens > 0 ? 100.0 * st.accepted_tokens / st.drafted_tokens : 0.0,
                      per_round, per_round / spec.requests, spec.flags.num_draft_tokens));

  // ---- latency ----
  const bool cuda = spec.device.is_cuda();
  const char* clock = !cuda ? "host steady_clock; the host kernels are synchronous"
                      : spec.cuda_graph
                          ? "cudaEvents on the stream around one CUDA graph replay (inputs + "
                            "verify of every layer), then the eager upload and commit"
                          : "cudaEvents on the stream around every call, eager launches, so "
                            "launch gaps count";
  section(os, "latency", fmt::format("per round, over {} rounds ({})", rounds, clock));
  if (spec.cuda_graph) {
    more(os, fmt::format("inputs + verify, all {} layers (graph replay): {}", layers,
                         mmm(over_rounds(st.rounds,
                                         [](const RoundRecord& r) { return r.verify_total_ms; }))));
  } else {
    std::vector<double> per_layer;
    for (const RoundRecord& r : st.rounds) {
      per_layer.insert(per_layer.end(), r.verify_ms.begin(), r.verify_ms.end());
    }
    MeanMinMax layer_stats;
    if (!per_layer.empty()) {
      layer_stats.min = *std::min_element(per_layer.begin(), per_layer.end());
      layer_stats.max = *std::max_element(per_layer.begin(), per_layer.end());
      for (double v : per_layer) {
        layer_stats.mean += v;
      }
      layer_stats.mean /= static_cast<double>(per_layer.size());
    }
    more(os, fmt::format(
                 "inputs, all {} layers ({} generator): {}", layers, cuda ? "device" : "host",
                 mmm(over_rounds(st.rounds, [](const RoundRecord& r) { return r.inputs_ms; }))));
    more(os, fmt::format("verify, one layer (B={}, T={}): {}", spec.requests,
                         spec.flags.num_draft_tokens, mmm(layer_stats)));
    more(os, fmt::format("verify, all {} layers:        {}", layers,
                         mmm(over_rounds(st.rounds,
                                         [](const RoundRecord& r) { return r.verify_total_ms; }))));
  }
  more(os,
       fmt::format("accepted-lengths upload:     {}",
                   mmm(over_rounds(st.rounds, [](const RoundRecord& r) { return r.upload_ms; }))));
  more(os,
       fmt::format("commit, all {} layers:        {}", layers,
                   mmm(over_rounds(st.rounds, [](const RoundRecord& r) { return r.commit_ms; }))));
  more(os,
       fmt::format("round on the {}, first to last mark: {}", cuda ? "GPU (cudaEvents)" : "host",
                   mmm(over_rounds(st.rounds, [](const RoundRecord& r) { return r.device_ms; }))));
  more(os,
       fmt::format("round (host wall, round upload .. commit done): {}",
                   mmm(over_rounds(st.rounds, [](const RoundRecord& r) { return r.wall_ms; }))));
  more(os, spec.prompt_len == 0
               ? std::string("prefill: none (--prompt-len 0: every request starts from zero state)")
               : fmt::format("prefill: {} prompt tokens x {} layers through extend in {}",
                             int64_t{spec.requests} * spec.prompt_len, layers, ms(st.prefill_ms)));

  // ---- dispatch ----
  int64_t fused = 0, unfused = 0;
  for (const DecisionCount& c : st.decisions) {
    (c.fused ? fused : unfused) += c.calls;
  }
  section(os, "dispatch",
          fmt::format("{} layer verifies: {} fused, {} unfused", fused + unfused, fused, unfused));
  if (spec.cuda_graph) {
    const DispatchStats ds = backend.stats();
    more(os, fmt::format("(one CUDA graph: the backend's stats count its {} captured verify calls; "
                         "each of the {} replays repeats them)",
                         ds.fused_calls + ds.unfused_calls, rounds));
  }
  for (const DecisionCount& c : st.decisions) {
    more(os, fmt::format("{:>6} x {}", c.calls, c.text));
  }

  // ---- memory ----
  const PoolMemoryReport& mem = backend.memory_report();
  section(os, "memory",
          fmt::format("state pool ({} mode, {} layers): {} total; {} slot{} x {} + {} scratch "
                      "row{} x {}",
                      mem.ring_mode ? "ring" : "snapshot", layers, mib(mem.total_bytes), mem.slots,
                      mem.slots == 1 ? "" : "s", mib(mem.bytes_per_slot), mem.rows,
                      mem.rows == 1 ? "" : "s", mib(mem.bytes_per_row)));
  more(os, fmt::format("snapshot mode would take {}, ring mode {}",
                       mib(mem.snapshot_mode_total_bytes), mib(mem.ring_mode_total_bytes)));
  const int64_t saved = mem.ring_mode_savings_bytes();
  more(os, saved >= 0 ? fmt::format("ring mode saves {} ({:.1f}% of snapshot mode){}", mib(saved),
                                    mem.snapshot_mode_total_bytes > 0
                                        ? 100.0 * saved / mem.snapshot_mode_total_bytes
                                        : 0.0,
                                    mem.ring_mode ? "" : " (this run: snapshot mode)")
                      : fmt::format("ring mode costs {} more than snapshot mode here (S >> R*T/L)",
                                    mib(-saved)));

  // ---- checks ----
  bool all_passed = true;
  if (checks.empty()) {
    section(os, "check", "none (--check off)");
  }
  for (const CheckOutcome& c : checks) {
    all_passed = all_passed && c.passed();
    section(os, "check", fmt::format("{}: {}", c.name, c.passed() ? "PASS" : "FAIL"));
    more(os, fmt::format("compared: {}; rule: {}; took {:.1f} s (reference run {:.1f} s, states "
                         "read and compared on the host {:.1f} s)",
                         c.coverage, rule_text(c.rule), c.run_seconds + c.compare_seconds,
                         c.run_seconds, c.compare_seconds));
    for (const DecisionCount& d : c.reference_decisions) {
      more(os, fmt::format("reference run dispatch: {} x {}", d.calls, d.text));
    }
    print_diff(os, "ssm_state", c.ssm, c.rule);
    print_diff(os, "conv_state", c.conv, c.rule);
    for (const std::string& d : c.details) {
      more(os, d);
    }
  }
  double rounds_device_ms = 0.0, rounds_wall_ms = 0.0;
  for (const RoundRecord& r : st.rounds) {
    rounds_device_ms += r.device_ms;
    rounds_wall_ms += r.wall_ms;
  }
  section(os, "time",
          fmt::format("primary run {:.1f} s wall (set-up and prefill included); its {} rounds "
                      "{:.2f} s on the {}, {:.2f} s host wall",
                      ctx.primary_seconds, rounds, rounds_device_ms / 1e3, cuda ? "GPU" : "host",
                      rounds_wall_ms / 1e3));
  for (const CheckOutcome& c : checks) {
    more(os, fmt::format("check {}: reference run {:.1f} s, host compare {:.1f} s", c.name,
                         c.run_seconds, c.compare_seconds));
  }
  more(os, fmt::format("whole demo {:.1f} s", ctx.total_seconds));
  if (checks.empty()) {
    os << "RESULT: NOT CHECKED (--check off)\n";
  } else if (all_passed) {
    os << fmt::format("RESULT: PASS ({} of {} checks)\n", checks.size(), checks.size());
  } else {
    const auto failed = std::count_if(checks.begin(), checks.end(),
                                      [](const CheckOutcome& c) { return !c.passed(); });
    os << fmt::format("RESULT: FAIL ({} of {} checks failed)\n", failed, checks.size());
  }
}

}  // namespace kda::demo
