#include "server/common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace circuitlab {

absl::Status SetupLogging(const std::string& level) {
  const spdlog::level::level_enum lvl = spdlog::level::from_str(level);
  // from_str maps unknown strings to "off"; only accept "off" when asked for.
  if (lvl == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError("--log-level must be one of trace|debug|info|warn|error|off, got '" +
                                      level + "'");
  }
  auto logger = spdlog::stderr_color_mt("circuitlab");
  spdlog::set_default_logger(logger);
  spdlog::set_level(lvl);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %v");
  spdlog::flush_on(spdlog::level::warn);
  return absl::OkStatus();
}

}  // namespace circuitlab
