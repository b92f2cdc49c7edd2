// circuitlab-server: flags -> app::Server (everything it serves), then wait
// for SIGINT/SIGTERM and drain; SIGHUP re-reads the tokens.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "server/app/flags.h"
#include "server/common/logging.h"

static int Fail(const std::string& what, const absl::Status& s) {
  spdlog::critical("{}: {}", what, s.ToString());
  std::fprintf(stderr, "circuitlab-server: %s: %s\n", what.c_str(), std::string(s.message()).c_str());
  return 1;
}

int main(int argc, char** argv) {
  CLI::App app{
      "circuitlab-server: a gRPC experiment service for how small transformers learn to reason in context.\n"
      "Owns this machine's devices, schedules training runs, stores runs/metrics/checkpoints in SQLite under\n"
      "--data, and resumes unfinished runs on restart. SIGTERM/SIGINT drain: stop accepting, checkpoint\n"
      "running runs (they resume on the next start), flush, exit 0. SIGHUP re-reads --auth-tokens-file.\n\n"
      "Examples:\n  circuitlab-server --data ./data --listen 127.0.0.1:50051 --cpu-slots 2\n"
      "  circuitlab-server --listen 0.0.0.0:50051 --tls-cert certs/server.pem --tls-key certs/server.key \\\n"
      "      --auth-tokens-file tokens.txt --audit-log data/audit.jsonl\n"
      "  circuitlab-server --data ./data --backup ./backup-2026-12-01   # while the server runs",
      "circuitlab-server"};
  circuitlab::app::ServerFlags flags;
  flags.server.version = CIRCUITLAB_VERSION;
  circuitlab::app::DefineFlags(app, flags);
  CLI11_PARSE(app, argc, argv);
  circuitlab::app::FinishFlags(flags);
  if (absl::Status s = circuitlab::SetupLogging(flags.log_level); !s.ok()) return Fail("bad flag", s);
  const std::string& data = flags.server.data_dir;
  if (!flags.backup_dir.empty()) {
    absl::Status s = circuitlab::store::Store::Backup(data, flags.backup_dir);
    if (!s.ok()) return Fail("backup of " + data + " failed", s);
    spdlog::info("backed up {} into {}", data, flags.backup_dir);
    return 0;
  }
  // Signals go to the sigwait below, never to a worker thread: block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&signals, sig);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  auto server = circuitlab::app::Server::Create(flags.server);
  if (!server.ok()) return Fail("cannot start", server.status());
  (*server)->Announce();
  int sig = 0;
  while (sigwait(&signals, &sig) == 0 && sig == SIGHUP) (*server)->ReloadTokens();
  spdlog::info("received {}: draining (running runs checkpoint and resume on the next start)",
               sig == SIGTERM ? "SIGTERM" : "SIGINT");
  (*server)->Shutdown(std::chrono::seconds(1));
  spdlog::info("stopped cleanly");
  return 0;
}
