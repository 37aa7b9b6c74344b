#include "core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include "core/error.h"

namespace kda {

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> instance = [] {
    if (auto existing = spdlog::get("kda")) {
      return existing;
    }
    auto l = spdlog::stderr_color_mt("kda");
    l->set_level(spdlog::level::info);
    l->set_pattern("[%H:%M:%S.%e] [kda] [%^%l%$] %v");
    return l;
  }();
  return *instance;
}

void set_log_level(std::string_view level) {
  const auto lv = spdlog::level::from_str(std::string(level));
  // from_str maps unknown names to `off`; only accept "off" when it was asked for.
  KDA_CHECK(lv != spdlog::level::off || level == "off",
            "log level: expected one of trace, debug, info, warn, error, critical, off; got '{}'",
            level);
  logger().set_level(lv);
}

}  // namespace kda
