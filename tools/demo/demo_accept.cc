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

}  // namespace kda::demo
