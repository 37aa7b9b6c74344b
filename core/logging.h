// logging.h: the module's spdlog logger "kda" (stderr, default level info).
//
// Per-layer paths log at debug at most; pool sizing at info. Engines may replace the sink by
// registering their own logger named "kda" before first use.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <string_view>

namespace kda {

/// The shared logger; created on first use. Thread-safe.
spdlog::logger& logger();

/// Sets the level by name: trace, debug, info, warn, error, critical, off. Throws on others.
void set_log_level(std::string_view level);

}  // namespace kda
