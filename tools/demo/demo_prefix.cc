#include "tools/demo/demo_prefix.h"

namespace kda::demo {

int64_t count_decode_tracks(const PrefixSpec& s, const AcceptSpec& accept, uint64_t seed,
                            int requests, int rounds, int prompt_len, int T) {
  if (!s.enabled) {
    return 0;
  }
  int64_t tracks = 0;
  for (int n = 0; n < requests; ++n) {
    int64_t seq = prompt_len;
    for (int r = 0; r < rounds; ++r) {
      const int len = accepted_length(accept, seed, r, n, T);
      tracks += decode_track_step(seq, len, s.track_interval) >= 0 ? 1 : 0;
      seq += len;
    }
  }
  return tracks;
}

const char* prefix_event_name(PrefixEventKind k) {
  switch (k) {
    case PrefixEventKind::kPrefixTrack:
      return "prefix track";
    case PrefixEventKind::kCopy:
      return "copy";
    case PrefixEventKind::kDecodeTrack:
      return "decode track";
  }
  return "?";
}

}  // namespace kda::demo
