// demo_accept.h: the simulated acceptance of the demo's draft tokens (plain C++).
//
// A real engine samples the verified logits and accepts the longest matching draft prefix;
// the demo draws the accepted length per (round, request) from a seeded distribution
// instead, so every run over the same seed (primary and check runs) commits the same lengths.
#pragma once

#include <cstdint>
#include <string>

namespace kda::demo {

enum class AcceptKind : uint8_t {
  kUniform,    ///< n uniform in [1, T]
  kGeometric,  ///< each draft token accepted with probability p until the first rejection
  kAll,        ///< n = T
  kOne,        ///< n = 1 (only the verified token)
};

struct AcceptSpec {
  AcceptKind kind = AcceptKind::kGeometric;
  double p = 0.7;  ///< kGeometric: per-draft-token acceptance probability in [0, 1]

  /// "uniform", "geometric:0.7", "all", "one".
  std::string describe() const;
};

/// Parses "uniform|geometric:P|all|one" (P in [0, 1]); false on anything else.
bool parse_accept_spec(const std::string& text, AcceptSpec& out);

/// The accepted length n in [1, T] of `request` in `round` (T = tokens per verify; the
/// verified token counts, so n - 1 draft tokens were accepted). Depends only on the arguments.
int accepted_length(const AcceptSpec& spec, uint64_t seed, int round, int request, int T);

}  // namespace kda::demo
