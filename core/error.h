// error.h: the module's one exception type and its checking macros.
//
// Every precondition failure at a public boundary throws kda::Error whose message names the
// argument, what was expected and what came, plus file:line. Macros are `do {} while (0)`
// statements that are active in every build type.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace kda {

/// What kind of failure an Error reports (stable; engines may branch on it).
enum class ErrorCode {
  kInvalidArgument,  ///< a shape, dtype, stride, index or value is outside the contract
  kLifecycle,        ///< calls out of order (commit before every layer verified, ...)
  kUnsupported,      ///< valid request this build/device cannot serve (e.g. no CUDA device)
  kCuda,             ///< a CUDA runtime call failed
  kOutOfMemory,      ///< an allocation or a memory budget failed
  kIo,               ///< a file could not be read or written, or is malformed
  kInternal,         ///< a broken invariant inside the module (a bug)
};

const char* error_code_name(ErrorCode code) noexcept;

/// The module's exception. what() = "[code] message (file:line)".
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message, const char* file, int line);
  ErrorCode code() const noexcept { return code_; }
  /// The message without code and location (for tests and engine logs).
  const std::string& message() const noexcept { return message_; }

 private:
  ErrorCode code_;
  std::string message_;
};

}  // namespace kda

#define KDA_THROW(code, ...) \
  throw ::kda::Error((code), ::fmt::format(__VA_ARGS__), __FILE__, __LINE__)

/// Argument check: throws ErrorCode::kInvalidArgument with a fmt message.
#define KDA_CHECK(cond, ...)                                      \
  do {                                                            \
    if (!(cond)) {                                                \
      KDA_THROW(::kda::ErrorCode::kInvalidArgument, __VA_ARGS__); \
    }                                                             \
  } while (0)

/// Check with an explicit error code.
#define KDA_CHECK_CODE(cond, code, ...) \
  do {                                  \
    if (!(cond)) {                      \
      KDA_THROW((code), __VA_ARGS__);   \
    }                                   \
  } while (0)

/// Unconditional argument failure (e.g. the default of a dispatch switch).
#define KDA_FAIL(...)                                           \
  do {                                                          \
    KDA_THROW(::kda::ErrorCode::kInvalidArgument, __VA_ARGS__); \
  } while (0)
