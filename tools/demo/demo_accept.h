// demo_accept.h: the simulated acceptance of the demo's draft tokens (plain C++).
//
// A real engine samples the verified logits and accepts the longest matching draft prefix;
// the demo draws the accepted length per (round, request) from a seeded distribution
// instead, so every run over the same seed (primary and check runs) commits the same lengths.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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

/// The demo's draft shape (contract §8): every request T tokens (a chain), its own T_n
/// (ragged), or a tree of T nodes.
enum class DraftShapeKind : uint8_t { kChain, kRagged, kTree };

const char* draft_shape_kind_name(DraftShapeKind k);
/// Parses "chain|ragged|tree"; false on anything else.
bool parse_draft_shape(const std::string& text, DraftShapeKind& out);

/// A ragged request's verify length T_n in [1, T] (uniform). Depends only on the arguments.
int draft_length(uint64_t seed, int round, int request, int T);

/// A random tree of T nodes (node 0 the root, parents before children, at most `topk`
/// children per node) for `request` in `round`: parents[j], -1 for the root.
std::vector<int32_t> draft_tree(uint64_t seed, int round, int request, int T, int topk);

/// The accepted root path of a tree (node indices, root first) whose length follows `spec`
/// as accepted_length does for a chain, clipped to the tree's depth: from the root, each step
/// goes to a (seeded) child.
std::vector<int32_t> accepted_path(const AcceptSpec& spec, uint64_t seed, int round, int request,
                                   const std::vector<int32_t>& parents);

/// The accepted length n in [1, T] of `request` in `round` (T = tokens per verify; the
/// verified token counts, so n - 1 draft tokens were accepted). Depends only on the arguments.
int accepted_length(const AcceptSpec& spec, uint64_t seed, int round, int request, int T);

}  // namespace kda::demo
