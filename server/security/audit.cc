#include "server/security/audit.h"

#include <spdlog/sinks/rotating_file_sink.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"

namespace circuitlab::security {

absl::StatusOr<std::unique_ptr<AuditLog>> AuditLog::Open(const std::string& path, size_t max_file_bytes) {
  try {
    auto sink = std::make_shared<spdlog::sinks::rotating_file_sink_mt>(path, max_file_bytes, 5);
    auto logger = std::make_shared<spdlog::logger>("audit", std::move(sink));
    logger->set_pattern("%v");
    logger->set_level(spdlog::level::info);
    logger->flush_on(spdlog::level::info);
    return std::unique_ptr<AuditLog>(new AuditLog(std::move(logger)));
  } catch (const spdlog::spdlog_ex& e) {
    return absl::InvalidArgumentError("--audit-log " + path + ": " + e.what());
  }
}

AuditLog::~AuditLog() = default;

std::string AuditLog::Format(const AuditRecord& r, int64_t time_us) {
  const std::time_t seconds = static_cast<std::time_t>(time_us / 1000000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char stamp[64];
  std::snprintf(stamp, sizeof stamp, "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(time_us % 1000000));
  nlohmann::ordered_json line = {
      {"time", stamp},
      {"principal", r.principal},
      {"role", r.role},
      {"peer", r.peer},
      {"client", r.client},
      {"method", r.method},
      {"target", r.target},
      {"outcome", r.outcome.ok() ? "OK" : absl::StatusCodeToString(r.outcome.code())},
      {"message", std::string(r.outcome.message().substr(0, 300))},
  };
  // Invalid UTF-8 from a client becomes U+FFFD rather than an exception.
  return line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void AuditLog::Record(const AuditRecord& record) {
  const int64_t now_us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  logger_->info(Format(record, now_us));
}

}  // namespace circuitlab::security
