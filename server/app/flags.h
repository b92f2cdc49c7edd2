// circuitlab-server's flags: every one with its help, default and range
// (CLI11), written straight into the ServerOptions they set; the few kept in
// user units (MB, seconds) are converted by FinishFlags.
#pragma once

#include <cstdint>
#include <string>

#include "server/app/server.h"

namespace CLI {
class App;
}

namespace circuitlab::app {

struct ServerFlags {
  ServerFlags() {
    server.fronts.http.listen = "127.0.0.1:8080";
    server.scheduler.max_pack = 0;  // --max-ensemble unset: 8 with CUDA devices, else 1
  }
  ServerOptions server;
  std::string log_level = "info";
  std::string backup_dir;  // --backup: copy --data there and exit
  // In the units the flags use; FinishFlags converts them.
  bool http_given = false;  // --http was passed (a busy port is then an error)
  uint64_t audit_log_max_mb = 64;
  uint64_t max_run_memory_mb = 4096;
  uint64_t analysis_memory_mb = scheduler::AnalysisJobOptions().memory_budget_bytes >> 20;
  uint64_t max_stored_analyses_mb = scheduler::AnalysisJobOptions().max_stored_bytes_per_owner >> 20;
  int lease_timeout_s = 60;
  int heartbeat_s = 10;
  int quarantine_s = 600;
  int slurm_poll_s = 5;
};

// Every flag of circuitlab-server, grouped as --help shows them.
void DefineFlags(CLI::App& app, ServerFlags& f);
// After parsing: the unit conversions into f.server.
void FinishFlags(ServerFlags& f);

}  // namespace circuitlab::app
