// demo_prefix.h: the demo's prefix-cache scheme (--prefix-cache, contract §9) as pure functions
// of the flags, so that the driver (which copies and tracks states) and the prefix check (which
// recomputes them) agree on every group, copy and track position. Plain C++; no device.
//
// Scheme: request m belongs to group m / G (G = --prefix-group) and sits at position m % G in
// it; position 0 is the group's leader. The first P prompt tokens (P = --prefix-len) of every
// request of a group are the leader's (demo_generate.h: shared_rows). Prefill: the leaders
// extend their whole prompt and track the state after prompt token P-1 into one cache slot per
// group (ExtendTrack); then each follower starts from copy_slot(cache slot, its slot) and
// extends only its own prompt_len - P tokens. Decode: a request whose committed length crosses
// a multiple of I (I = --track-interval) in a round tracks the accepted step at which it
// reaches the last such multiple (CommitTrack; SGLang's mamba_steps_to_track), into a fresh
// slot, so every tracked state survives until the check reads it.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "tools/demo/demo_accept.h"

namespace kda::demo {

/// A deliberate error in the prefix-cache path (tests: the prefix check must catch each).
enum class PrefixFault : uint8_t {
  kNone,
  kPrefixTrackStep,  ///< the leaders' ExtendTrack step is P-2 (needs P >= 2)
  kCopySource,       ///< followers copy the next group's cache slot (needs 2 or more groups)
  kDecodeTrackStep,  ///< the first decode track with step k >= 1 tracks step k-1
};

struct PrefixSpec {
  bool enabled = false;
  int shared_len = 1;       ///< P: shared prompt tokens per group, 1..prompt_len
  int group_size = 2;       ///< G: requests per group (the last group may be smaller)
  int track_interval = 16;  ///< I: decode tracks at committed lengths that are multiples of I
  PrefixFault fault = PrefixFault::kNone;
};

/// Groups of `requests` requests: ceil(requests / G).
inline int prefix_groups(const PrefixSpec& s, int requests) {
  return (requests + s.group_size - 1) / s.group_size;
}
inline int group_of(const PrefixSpec& s, int request) { return request / s.group_size; }

/// The decode track step of a request whose committed length goes from `seq_pre` to
/// seq_pre + accepted in one round: k such that the state after accepted step k has committed
/// floor(seq_post / I) * I tokens, when that crosses a multiple of I; else -1. 0 <= k < accepted.
inline int32_t decode_track_step(int64_t seq_pre, int accepted, int interval) {
  const int64_t seq_post = seq_pre + accepted;
  if (seq_pre / interval == seq_post / interval) {
    return -1;
  }
  return static_cast<int32_t>(seq_post / interval * interval - seq_pre - 1);
}

/// Decode tracks of a whole run (every round's accepted lengths are a function of the seed):
/// the number of track slots the driver allocates.
int64_t count_decode_tracks(const PrefixSpec& s, const AcceptSpec& accept, uint64_t seed,
                            int requests, int rounds, int prompt_len, int T);

enum class PrefixEventKind : uint8_t {
  kPrefixTrack,  ///< a leader's ExtendTrack: the state after the shared prefix, in a cache slot
  kCopy,         ///< a follower's slot right after copy_slot (before its own suffix)
  kDecodeTrack,  ///< a CommitTrack: the state after an accepted step, in a track slot
};
const char* prefix_event_name(PrefixEventKind k);

/// One state the prefix cache produced, and what it must equal: the state of `request` after
/// the first `tokens` tokens of its history (its prompt, then each round's accepted tokens).
struct PrefixEvent {
  PrefixEventKind kind = PrefixEventKind::kPrefixTrack;
  int request = 0;
  int round = -1;      ///< decode round; -1 = prefill
  int64_t tokens = 0;  ///< the intended position, also when a planted fault writes another
  int slot = -1;       ///< the pool slot holding it; kCopy: -1 (held below)
  /// kCopy: per layer, the follower's states read right after the copy (the slot moves on).
  std::vector<std::vector<float>> ssm;
  std::vector<std::vector<bf16_t>> conv;
};

}  // namespace kda::demo
