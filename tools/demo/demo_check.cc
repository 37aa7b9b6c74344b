#include "tools/demo/demo_check.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "tools/demo/demo_parallel.h"

namespace kda::demo {

namespace {

float as_float(float x) { return x; }
float as_float(bf16_t x) { return bf16_to_float(x); }

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}
uint32_t bits_of(bf16_t x) { return x.bits; }

// One (layer, request) state pair's differences.
struct PairStats {
  int64_t elements = 0, differing = 0, non_finite = 0;
  double max_abs = 0.0;
  double rel_l2 = 0.0;  // ||a - ref|| / ||ref|| (0 / 0 = 0)
};

template <typename T>
PairStats pair_stats(const std::vector<T>& a, const std::vector<T>& ref, int layer, int request) {
  KDA_CHECK(a.size() == ref.size(), "compare: state sizes {} vs {} (layer {}, request {})",
            a.size(), ref.size(), layer, request);
  PairStats s;
  double diff2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = as_float(a[i]), y = as_float(ref[i]);
    s.non_finite += !std::isfinite(x) || !std::isfinite(y) ? 1 : 0;
    s.differing += bits_of(a[i]) != bits_of(ref[i]) ? 1 : 0;
    const double e = std::fabs(x - y);
    s.max_abs = e > s.max_abs ? e : s.max_abs;  // a NaN e is counted in non_finite
    diff2 += e * e;
    ref2 += y * y;
  }
  s.elements = static_cast<int64_t>(a.size());
  s.rel_l2 = diff2 == 0.0 ? 0.0 : std::sqrt(diff2) / std::sqrt(ref2);
  return s;
}

// Folds one pair into `d`; pairs are folded in (layer, request) order, so the worst state is
// the first of the largest.
void fold(StateDiff& d, const PairStats& s, int layer, int request) {
  d.non_finite += s.non_finite;
  d.differing += s.differing;
  d.max_abs = s.max_abs > d.max_abs ? s.max_abs : d.max_abs;
  if (s.rel_l2 > d.max_rel_l2 || (std::isnan(s.rel_l2) && !std::isnan(d.max_rel_l2))) {
    d.max_rel_l2 = s.rel_l2;
    d.worst_layer = layer;
    d.worst_request = request;
  }
  ++d.states;
  d.elements += s.elements;
}

const char* mode_name(const EngineFlags& f) {
  return f.replayssm_spec ? "ring mode" : "snapshot mode";
}

}  // namespace

void compare_state(StateDiff& d, const std::vector<float>& a, const std::vector<float>& ref,
                   int layer, int request) {
  fold(d, pair_stats(a, ref, layer, request), layer, request);
}

void compare_state(StateDiff& d, const std::vector<bf16_t>& a, const std::vector<bf16_t>& ref,
                   int layer, int request) {
  fold(d, pair_stats(a, ref, layer, request), layer, request);
}

bool StateDiff::passes(CompareRule rule) const {
  if (states == 0 || non_finite != 0) {
    return false;
  }
  switch (rule) {
    case CompareRule::kBitwise:
      return bitwise();
    case CompareRule::kRelL2:
      return max_rel_l2 <= kStateRelL2Tol;  // false for NaN
  }
  return false;
}

std::string rule_text(CompareRule rule) {
  switch (rule) {
    case CompareRule::kBitwise:
      return "bitwise";
    case CompareRule::kRelL2:
      return fmt::format("relative L2 <= {:g}", kStateRelL2Tol);
  }
  return "?";
}

RunSpec other_mode_spec(const RunSpec& primary, std::string* note) {
  RunSpec s = primary;
  s.flags.replayssm_spec = !primary.flags.replayssm_spec;
  if (!s.flags.replayssm_spec && s.flags.lazy_write_back()) {
    // Snapshot mode commits eagerly: the lazy write-back's flags are ring mode's alone (the
    // committed state is the same by contract §11, which is what the check compares).
    s.flags.deferred_commit = static_cast<int>(DeferredCommit::kOff);
    s.flags.lazy_fold_interval = 0;
  }
  s.label = fmt::format("check ({} {})", device_name(s.device), mode_name(s.flags));
  if (s.flags.replayssm_spec && s.flags.replayssm_cache_len < 2 * s.flags.num_draft_tokens) {
    int L = 2;
    while (L < 2 * s.flags.num_draft_tokens) {
      L *= 2;
    }
    if (note != nullptr) {
      *note = fmt::format(
          "ring-mode check run uses --linear-replayssm-cache-len {} (ring mode needs >= 2T; the "
          "ring length changes no value)",
          L);
    }
    s.flags.replayssm_cache_len = L;
  }
  s.flags.validate();
  return s;
}

RunSpec host_reference_spec(const RunSpec& primary, int layers, int requests) {
  RunSpec s = primary;
  s.device = Device::host();
  s.platform.reset();
  if (layers > 0 && layers < s.model.num_layers) {
    s.model.num_layers = layers;
  }
  if (requests > 0 && requests < s.requests) {
    s.requests = requests;
  }
  s.flags.max_running_requests = s.requests;
  s.cuda_graph = false;
  s.label = fmt::format("check (host {})", mode_name(s.flags));
  return s;
}

CheckOutcome compare_runs(const DemoRun& primary, const DemoRun& reference, CompareRule rule) {
  const RunSpec& p = primary.spec();
  const RunSpec& r = reference.spec();
  const int layers = r.model.num_layers, requests = r.requests;
  KDA_CHECK(layers <= p.model.num_layers && requests <= p.requests && r.rounds == p.rounds &&
                r.seed == p.seed && r.prompt_len == p.prompt_len,
            "compare_runs: reference ({} layers, {} requests) is not a sub-run of the primary "
            "({} layers, {} requests)",
            layers, requests, p.model.num_layers, p.requests);
  CheckOutcome out;
  out.rule = rule;
  out.name = fmt::format("{} {} vs independent {} {} backend", device_name(p.device),
                         mode_name(p.flags), device_name(r.device), mode_name(r.flags));
  const bool all = layers == p.model.num_layers && requests == p.requests;
  out.coverage = all ? fmt::format("all {} layers x {} requests", layers, requests)
                     : fmt::format("layers 0..{} of {} x requests 0..{} of {} (reduced run)",
                                   layers - 1, p.model.num_layers, requests - 1, p.requests);
  out.reference_decisions = reference.stats().decisions;
  // Pair i = (layer i / requests, request i % requests), read and measured in parallel.
  const int64_t pairs = int64_t{layers} * requests;
  std::vector<PairStats> ssm(static_cast<size_t>(pairs)), conv(static_cast<size_t>(pairs));
  parallel_for(pairs, [&](int64_t i) {
    const int l = static_cast<int>(i / requests), n = static_cast<int>(i % requests);
    ssm[static_cast<size_t>(i)] =
        pair_stats(primary.ssm_state(l, n), reference.ssm_state(l, n), l, n);
    conv[static_cast<size_t>(i)] =
        pair_stats(primary.conv_state(l, n), reference.conv_state(l, n), l, n);
  });
  for (int64_t i = 0; i < pairs; ++i) {
    const int l = static_cast<int>(i / requests), n = static_cast<int>(i % requests);
    fold(out.ssm, ssm[static_cast<size_t>(i)], l, n);
    fold(out.conv, conv[static_cast<size_t>(i)], l, n);
  }
  return out;
}

}  // namespace kda::demo
