#include "backend/round_tracker.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace kda {

namespace {
constexpr int kMaxListedLayers = 8;  // keep messages short for 60-layer models

const char* done_verb(RoundKind kind) {
  return kind == RoundKind::kExtend ? "extended" : "verified";
}
}  // namespace

const char* round_kind_name(RoundKind kind) {
  switch (kind) {
    case RoundKind::kNone:
      return "idle";
    case RoundKind::kVerify:
      return "verify";
    case RoundKind::kExtend:
      return "extend";
  }
  return "?";
}

RoundTracker::RoundTracker(int num_layers) : done_(static_cast<size_t>(num_layers), 0) {}

std::string RoundTracker::list_layers(bool want) const {
  std::string s;
  int listed = 0, more = 0;
  for (int l = 0; l < num_layers(); ++l) {
    if (layer_done(l) != want) {
      continue;
    }
    if (listed == kMaxListedLayers) {
      ++more;
      continue;
    }
    s += listed++ ? fmt::format(", {}", l) : std::to_string(l);
  }
  if (more > 0) {
    s += fmt::format(" (and {} more)", more);
  }
  return s.empty() ? "none" : s;
}

std::string RoundTracker::describe() const {
  if (kind_ == RoundKind::kNone) {
    return "idle";
  }
  return fmt::format("{} round, {} of {} layers {} ({})", round_kind_name(kind_), layers_done_,
                     num_layers(), done_verb(kind_), list_layers(true));
}

void RoundTracker::check_can_prepare(const char* call) const {
  if (kind_ == RoundKind::kNone || layers_done_ == 0) {
    return;
  }
  if (kind_ == RoundKind::kVerify) {
    KDA_THROW(ErrorCode::kLifecycle,
              "{}: the verify round in progress is not committed ({}); call commit() after "
              "every layer is verified, or abort_round() to drop it",
              call, describe());
  }
  KDA_THROW(ErrorCode::kLifecycle,
            "{}: the extend round in progress is unfinished ({}); extend layers {} too, or "
            "abort_round()",
            call, describe(), list_layers(false));
}

void RoundTracker::check_can_run(RoundKind kind, int layer) const {
  const char* call = round_kind_name(kind);
  if (kind_ == RoundKind::kNone) {
    KDA_THROW(ErrorCode::kLifecycle, "{}(layer {}): no batch prepared (call {} first)", call, layer,
              kind == RoundKind::kVerify ? "prepare()" : "prepare_extend()");
  }
  if (kind_ != kind) {
    KDA_THROW(ErrorCode::kLifecycle,
              "{}(layer {}): the prepared batch is for {} (mixing extend and verify in one "
              "round is not allowed; prepare a new batch after this round)",
              call, layer,
              kind_ == RoundKind::kVerify ? "verify (prepare)" : "extend (prepare_extend)");
  }
  if (layer_done(layer)) {
    KDA_THROW(ErrorCode::kLifecycle, "{}(layer {}): layer {} was already {} in this round ({}){}",
              call, layer, layer, done_verb(kind), describe(),
              kind == RoundKind::kVerify ? "; commit() before verifying it again" : "");
  }
}

void RoundTracker::check_can_commit(const char* call) const {
  if (kind_ == RoundKind::kExtend) {
    KDA_THROW(ErrorCode::kLifecycle,
              "{}: the current round is an extend round (extend commits in place; {})", call,
              describe());
  }
  if (kind_ == RoundKind::kNone) {
    KDA_THROW(ErrorCode::kLifecycle,
              "{}: no verify round to commit (call prepare() and verify every layer first)", call);
  }
  if (layers_done_ != num_layers()) {
    KDA_THROW(ErrorCode::kLifecycle,
              "{}: only {} of {} layers verified (missing layers {}); verify every layer "
              "first",
              call, layers_done_, num_layers(), list_layers(false));
  }
}

void RoundTracker::check_can_mark_graph_round() const {
  if (kind_ != RoundKind::kVerify || layers_done_ != 0) {
    KDA_THROW(ErrorCode::kLifecycle,
              "record_graph_verify_round: needs a freshly prepared verify batch with no layer "
              "verified yet, state is {}",
              describe());
  }
}

void RoundTracker::on_prepared(RoundKind kind) {
  kind_ = kind;
  std::fill(done_.begin(), done_.end(), 0);
  layers_done_ = 0;
}

void RoundTracker::on_layer_done(int layer) {
  done_[static_cast<size_t>(layer)] = 1;
  ++layers_done_;
  if (kind_ == RoundKind::kExtend && layers_done_ == num_layers()) {
    on_prepared(RoundKind::kNone);  // extend committed every layer in place
  }
}

void RoundTracker::on_committed() { on_prepared(RoundKind::kNone); }

void RoundTracker::on_graph_round() {
  std::fill(done_.begin(), done_.end(), 1);
  layers_done_ = num_layers();
}

void RoundTracker::abort() { on_prepared(RoundKind::kNone); }

}  // namespace kda
