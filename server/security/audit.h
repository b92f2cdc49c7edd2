// The audit log (--audit-log FILE): one JSON line per state-changing call.
//
//   {"time":"2026-12-02T03:04:05.123456Z","principal":"alice","role":"user",
//    "peer":"ipv4:10.0.0.7:53012","client":"alice@lab1","method":"CancelRun","target":"r17",
//    "outcome":"OK","message":""}
//
// Client strings go through JSON escaping (control characters, quotes and
// invalid UTF-8 cannot forge a line). spdlog's rotating file sink keeps
// --audit-log-max-mb per file and 5 older files (FILE.1 ... FILE.5); every
// line is flushed at once, so a killed server loses none.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace spdlog {
class logger;
}

namespace circuitlab::security {

struct AuditRecord {
  std::string principal;
  std::string role;
  std::string peer;
  std::string client;  // the x-circuitlab-client label the caller sent (not an identity)
  std::string method;  // "SubmitRun", "CancelRun", ...
  std::string target;  // "r17", "s2", "a4" or ""
  absl::Status outcome;
};

class AuditLog {
 public:
  // Opens (creating) `path`. InvalidArgument when it cannot be written.
  static absl::StatusOr<std::unique_ptr<AuditLog>> Open(const std::string& path, size_t max_file_bytes = 64 << 20);
  ~AuditLog();

  void Record(const AuditRecord& record);
  // The JSON line Record writes (without the newline).
  static std::string Format(const AuditRecord& record, int64_t time_us);

 private:
  explicit AuditLog(std::shared_ptr<spdlog::logger> logger) : logger_(std::move(logger)) {}
  std::shared_ptr<spdlog::logger> logger_;
};

}  // namespace circuitlab::security
