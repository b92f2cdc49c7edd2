// Process-wide logging set-up (spdlog). Call once from main().
#pragma once

#include <string>

#include "absl/status/status.h"

namespace circuitlab {

// level: trace|debug|info|warn|error|off. InvalidArgument for anything else.
absl::Status SetupLogging(const std::string& level);

}  // namespace circuitlab
