#include "core/error.h"

namespace kda {

const char* error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid_argument";
    case ErrorCode::kLifecycle:
      return "lifecycle";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kCuda:
      return "cuda";
    case ErrorCode::kOutOfMemory:
      return "out_of_memory";
    case ErrorCode::kIo:
      return "io";
    case ErrorCode::kInternal:
      return "internal";
  }
  return "unknown";
}

namespace {
std::string format_what(ErrorCode code, const std::string& message, const char* file, int line) {
  return fmt::format("[kda:{}] {} ({}:{})", error_code_name(code), message, file, line);
}
}  // namespace

Error::Error(ErrorCode code, const std::string& message, const char* file, int line)
    : std::runtime_error(format_what(code, message, file, line)), code_(code), message_(message) {}

}  // namespace kda
