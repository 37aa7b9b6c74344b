// error_message.h: the message of the kda::Error a call throws, for the tests of argument errors.
#pragma once

#include <catch2/catch.hpp>

#include <functional>
#include <string>

#include "core/error.h"

namespace kda::testing {

/// Message of the kda::Error (kInvalidArgument) `f` throws; fails the test if it throws none or
/// another code.
inline std::string error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kInvalidArgument);
    return e.message();
  }
  FAIL("no kda::Error thrown");
  return {};
}

}  // namespace kda::testing
