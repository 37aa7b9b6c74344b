#include "tools/demo/demo_accept.h"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "tools/demo/demo_random.h"

namespace kda::demo {

std::string AcceptSpec::describe() const {
  switch (kind) {
    case AcceptKind::kUniform:
      return "uniform";
    case AcceptKind::kGeometric:
      return fmt::format("geometric:{:g}", p);
    case AcceptKind::kAll:
      return "all";
    case AcceptKind::kOne:
      return "one";
  }
  return "?";
}

bool parse_accept_spec(const std::string& text, AcceptSpec& out) {
  if (text == "uniform" || text == "all" || text == "one") {
    out.kind = text == "uniform" ? AcceptKind::kUniform
                                 : (text == "all" ? AcceptKind::kAll : AcceptKind::kOne);
    return true;
  }
  const std::string prefix = "geometric:";
  if (text.compare(0, prefix.size(), prefix) != 0 || text.size() == prefix.size()) {
    return false;
  }
  const char* begin = text.c_str() + prefix.size();
  char* end = nullptr;
  errno = 0;
  const double p = std::strtod(begin, &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(p) || p < 0.0 || p > 1.0) {
    return false;
  }
  out.kind = AcceptKind::kGeometric;
  out.p = p;
  return true;
}

int accepted_length(const AcceptSpec& spec, uint64_t seed, int round, int request, int T) {
  const uint64_t key = stream_key(seed, StreamTag::kAccept, Phase::kVerify, round, 0, request);
  switch (spec.kind) {
    case AcceptKind::kUniform: {
      const int n = 1 + static_cast<int>(uniform01(key, 0) * T);
      return n > T ? T : n;
    }
    case AcceptKind::kGeometric: {
      int n = 1;  // the verified token is always kept
      while (n < T && uniform01(key, static_cast<uint64_t>(n)) < spec.p) {
        ++n;
      }
      return n;
    }
    case AcceptKind::kAll:
      return T;
    case AcceptKind::kOne:
      return 1;
  }
  return 1;
}

const char* draft_shape_kind_name(DraftShapeKind k) {
  switch (k) {
    case DraftShapeKind::kChain:
      return "chain";
    case DraftShapeKind::kRagged:
      return "ragged";
    case DraftShapeKind::kTree:
      return "tree";
  }
  return "?";
}

bool parse_draft_shape(const std::string& text, DraftShapeKind& out) {
  for (const DraftShapeKind k :
       {DraftShapeKind::kChain, DraftShapeKind::kRagged, DraftShapeKind::kTree}) {
    if (text == draft_shape_kind_name(k)) {
      out = k;
      return true;
    }
  }
  return false;
}

int draft_length(uint64_t seed, int round, int request, int T) {
  const uint64_t key = stream_key(seed, StreamTag::kDraftShape, Phase::kVerify, round, 0, request);
  const int n = 1 + static_cast<int>(uniform01(key, 0) * T);
  return n > T ? T : n;
}

std::vector<int32_t> draft_tree(uint64_t seed, int round, int request, int T, int topk) {
  const uint64_t key = stream_key(seed, StreamTag::kDraftShape, Phase::kVerify, round, 1, request);
  std::vector<int32_t> parents(static_cast<size_t>(T), -1);
  std::vector<int> children(static_cast<size_t>(T), 0);
  for (int j = 1; j < T; ++j) {
    // A uniform parent among the earlier nodes with room for a child (node 0 .. j-1; at
    // least one has room: j - 1 nodes have at most j - 1 children among them besides the root's).
    int p = static_cast<int>(uniform01(key, static_cast<uint64_t>(j)) * j);
    p = p >= j ? j - 1 : p;
    while (children[static_cast<size_t>(p)] >= topk) {
      p = (p + 1) % j;
    }
    ++children[static_cast<size_t>(p)];
    parents[static_cast<size_t>(j)] = p;
  }
  return parents;
}

std::vector<int32_t> accepted_path(const AcceptSpec& spec, uint64_t seed, int round, int request,
                                   const std::vector<int32_t>& parents) {
  const int T = static_cast<int>(parents.size());
  const int want = accepted_length(spec, seed, round, request, T);
  const uint64_t key = stream_key(seed, StreamTag::kDraftShape, Phase::kVerify, round, 2, request);
  std::vector<int32_t> path = {0};
  while (static_cast<int>(path.size()) < want) {
    std::vector<int32_t> kids;
    for (int j = 1; j < T; ++j) {
      if (parents[static_cast<size_t>(j)] == path.back()) {
        kids.push_back(j);
      }
    }
    if (kids.empty()) {
      break;  // a leaf: the tree is shallower than the drawn length
    }
    const size_t pick = static_cast<size_t>(uniform01(key, path.size()) * kids.size());
    path.push_back(kids[pick < kids.size() ? pick : kids.size() - 1]);
  }
  return path;
}

}  // namespace kda::demo
