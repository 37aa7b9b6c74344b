// round_tracker.h: the backend's lifecycle state machine (host-side bookkeeping only).
//
//   idle --prepare--> verify round --verify(l) for every layer l, once--> complete
//        --commit--> idle
//   idle --prepare_extend--> extend round --extend(l) for every layer l, once--> idle
//   any round with no layer done yet: prepare/prepare_extend replaces it
//   abort() from anywhere: idle
//
// Each check_* throws kda::Error(kLifecycle) with a message naming the call, the layer and
// the state, and changes nothing; the on_* mutators are called only after the work they
// record succeeded, so a failed call leaves the tracker as it was. Not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kda {

enum class RoundKind : uint8_t {
  kNone,    ///< idle: nothing prepared (or the last round was committed / finished)
  kVerify,  ///< prepared with prepare(): verify each layer, then commit
  kExtend,  ///< prepared with prepare_extend(): extend each layer (commits in place)
};
const char* round_kind_name(RoundKind kind);

class RoundTracker {
 public:
  explicit RoundTracker(int num_layers);

  void check_can_prepare(const char* call) const;
  void check_can_run(RoundKind kind, int layer) const;  ///< verify(layer) / extend(layer)
  void check_can_commit(const char* call) const;
  void check_can_mark_graph_round() const;

  void on_prepared(RoundKind kind);
  /// Marks `layer` done; an extend round whose last layer is done returns to idle.
  void on_layer_done(int layer);
  void on_committed();
  /// Marks every layer verified (a CUDA-graph replay ran them; see KdaAttentionBackend).
  void on_graph_round();
  void abort();

  RoundKind kind() const { return kind_; }
  int num_layers() const { return static_cast<int>(done_.size()); }
  int layers_done() const { return layers_done_; }
  bool layer_done(int layer) const { return done_[static_cast<size_t>(layer)] != 0; }
  bool verify_round_complete() const {
    return kind_ == RoundKind::kVerify && layers_done_ == num_layers();
  }
  /// e.g. "verify round, layers verified: 0, 1 of 4" or "idle".
  std::string describe() const;

 private:
  /// "1, 3, 4 (and 12 more)": the layers with done == want, for messages.
  std::string list_layers(bool want) const;

  RoundKind kind_ = RoundKind::kNone;
  std::vector<uint8_t> done_;  // per layer: 1 once verified / extended in this round
  int layers_done_ = 0;
};

}  // namespace kda
