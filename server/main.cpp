// circuitlab-server: flags -> store, engine, scheduler, gRPC server; then wait
// for SIGINT/SIGTERM and drain. The only file that knows every concrete type.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include "server/common/clock.h"
#include "server/common/logging.h"
#include "server/engine/engine.h"
#include "server/rpc/server.h"
#include "server/scheduler/analysis_core.h"
#include "server/scheduler/scheduler.h"
#include "server/store/store.h"

namespace {

std::string RandomEpoch() {
  std::random_device rd;
  std::ostringstream ss;
  ss << std::hex << rd() << rd();
  return ss.str();
}

int Fail(const std::string& what, const absl::Status& s) {
  spdlog::critical("{}: {}", what, s.ToString());
  std::fprintf(stderr, "circuitlab-server: %s: %s\n", what.c_str(), std::string(s.message()).c_str());
  return 1;
}

struct Flags {
  std::string data_dir = "./data";
  std::string listen = "127.0.0.1:50051";
  std::string token_file;
  std::string log_level = "info";
  int cpu_slots = 1;
  int threads_per_run = 1;
  int max_queued = 1000;
  int max_queued_per_client = 200;
  int max_sweep_runs = 1024;
  int max_ensemble = 0;  // auto: 8 with CUDA devices, else 1
  int max_watchers = 1024;
  uint64_t max_steps = 10'000'000;
  uint64_t max_run_memory_mb = 4096;
  int max_request_bytes = 4 << 20;
  std::string backup_dir;
  circuitlab::scheduler::AnalysisJobOptions jobs;
  uint64_t analysis_memory_mb = circuitlab::scheduler::AnalysisJobOptions().memory_budget_bytes >> 20;
  bool use_cuda = true;
};

// Every flag, with its help, default and range.
void DefineFlags(CLI::App& app, Flags& f) {
  app.add_option("--data", f.data_dir, "Data directory (SQLite database, checkpoints)")->capture_default_str();
  app.add_option("--listen", f.listen, "Address to listen on; port 0 picks a free port (printed at start)")
      ->capture_default_str();
  app.add_option("--auth-token-file", f.token_file,
                 "File whose first line is the bearer token clients must send; required to listen beyond "
                 "loopback")
      ->check(CLI::ExistingFile);
  app.add_option("--cpu-slots", f.cpu_slots, "Runs trained at once on CPU (one worker per slot)")
      ->capture_default_str()
      ->check(CLI::Range(0, 256));
  app.add_option("--threads-per-run", f.threads_per_run, "LibTorch/BLAS threads per run")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_flag("--cuda,!--no-cuda", f.use_cuda, "Use the CUDA devices LibTorch reports (default on)");
  app.add_option("--max-queued-runs", f.max_queued, "Queued runs accepted before RESOURCE_EXHAUSTED")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  app.add_option("--max-ensemble", f.max_ensemble,
                 "Most members of one sweep that differ only in their seed trained as one ensemble job (1 = off; "
                 "default 8 when CUDA devices are used, else 1: CPU slots already run runs in parallel)")
      ->check(CLI::Range(1, 64));
  app.add_option("--max-sweep-runs", f.max_sweep_runs, "Most runs one sweep may expand to")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_option("--max-queued-per-client", f.max_queued_per_client, "Queued runs per client")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  app.add_option("--max-watchers", f.max_watchers, "Open WatchRun streams before RESOURCE_EXHAUSTED")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  app.add_option("--max-steps", f.max_steps, "Most training steps one run may ask for")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{10'000'000}));
  app.add_option("--max-run-memory-mb", f.max_run_memory_mb, "Most memory (estimated) one run may need")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{16}, uint64_t{1} << 24));
  app.add_option("--backup", f.backup_dir,
                 "Copy the data directory --data into this new directory (a consistent database snapshot, then "
                 "the checkpoint files) and exit; safe while a server runs on --data. Restore: start a server "
                 "with --data set to the copy");
  app.add_option("--max-request-bytes", f.max_request_bytes,
                 "Largest request accepted, in bytes (a larger one is RESOURCE_EXHAUSTED before it is parsed)")
      ->capture_default_str()
      ->check(CLI::Range(1 << 16, 64 << 20));
  app.add_option("--analysis-workers", f.jobs.workers,
                 "Analysis jobs run at once (one thread each, one LibTorch thread; they share the machine's cores "
                 "with the --cpu-slots training workers)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--max-analysis-jobs", f.jobs.max_active, "Queued + running analysis jobs before RESOURCE_EXHAUSTED")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_option("--max-analysis-jobs-per-client", f.jobs.max_active_per_client,
                 "Queued + running analysis jobs of one client")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_option("--analysis-memory-mb", f.analysis_memory_mb,
                 "Memory (estimated) the running analysis jobs may hold together; a job waits until it fits, one "
                 "larger than this alone is refused")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{16}, uint64_t{1} << 24));
  app.add_option("--log-level", f.log_level, "trace|debug|info|warn|error|off")->capture_default_str();
  app.set_version_flag("--version", "circuitlab-server 0.1.0");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "circuitlab-server: a gRPC experiment service for how small transformers learn to reason in context.\n"
      "Owns this machine's devices, schedules training runs, stores runs/metrics/checkpoints in SQLite under\n"
      "--data, and resumes unfinished runs on restart. SIGTERM/SIGINT drain: stop accepting, checkpoint\n"
      "running runs (they resume on the next start), flush, exit 0.\n\n"
      "Examples:\n  circuitlab-server --data ./data --listen 127.0.0.1:50051 --cpu-slots 2\n"
      "  circuitlab-server --data ./data --backup ./backup-2026-12-01   # while the server runs",
      "circuitlab-server"};
  Flags flags;
  DefineFlags(app, flags);
  CLI11_PARSE(app, argc, argv);

  if (absl::Status s = circuitlab::SetupLogging(flags.log_level); !s.ok()) return Fail("bad flag", s);
  if (!flags.backup_dir.empty()) {
    if (absl::Status s = circuitlab::store::Store::Backup(flags.data_dir, flags.backup_dir); !s.ok()) {
      return Fail("backup of " + flags.data_dir + " failed", s);
    }
    spdlog::info("backed up {} into {}", flags.data_dir, flags.backup_dir);
    return 0;
  }

  // Signals go to the sigwait below, never to a worker thread: block them
  // before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::string token;
  if (!flags.token_file.empty()) {
    std::ifstream in(flags.token_file);
    std::getline(in, token);
    // Without the whitespace and CR an editor leaves (clients trim theirs too).
    const size_t begin = token.find_first_not_of(" \t\r"), end = token.find_last_not_of(" \t\r");
    token = begin == std::string::npos ? "" : token.substr(begin, end - begin + 1);
    if (token.size() < 16) {
      return Fail("bad --auth-token-file", absl::InvalidArgumentError("the token must be at least 16 characters"));
    }
  }

  circuitlab::engine::ConfigureRuntime(flags.threads_per_run);
  auto store = circuitlab::store::Store::Open(flags.data_dir);
  if (!store.ok()) return Fail("cannot open --data " + flags.data_dir, store.status());

  circuitlab::scheduler::SchedulerOptions opts;
  opts.cpu_slots = flags.cpu_slots;
  opts.cuda_devices = flags.use_cuda ? circuitlab::engine::CudaDeviceCount() : 0;
  opts.intra_op_threads = flags.threads_per_run;
  opts.max_queued_runs = flags.max_queued;
  opts.max_queued_per_client = flags.max_queued_per_client;
  opts.max_pack = flags.max_ensemble > 0 ? flags.max_ensemble : (opts.cuda_devices > 0 ? 8 : 1);
  opts.max_watchers = flags.max_watchers;
  opts.limits.max_steps = flags.max_steps;
  opts.limits.max_run_memory_bytes = flags.max_run_memory_mb << 20;
  opts.epoch = RandomEpoch();
  if (opts.cpu_slots + opts.cuda_devices == 0) {
    return Fail("bad flags", absl::InvalidArgumentError("no device slots: set --cpu-slots >= 1 or use CUDA"));
  }
  std::unique_ptr<circuitlab::engine::Executor> executor = circuitlab::engine::MakeTorchExecutor();
  std::unique_ptr<circuitlab::engine::Analyzer> analyzer = circuitlab::engine::MakeTorchAnalyzer();
  circuitlab::scheduler::Scheduler scheduler(opts, store->get(), executor.get(), circuitlab::Clock::Real());
  flags.jobs.memory_budget_bytes = flags.analysis_memory_mb << 20;
  circuitlab::scheduler::AnalysisCore analysis(store->get(), analyzer.get(), flags.jobs, opts.limits);
  circuitlab::scheduler::SweepCore sweeps(&scheduler, store->get(), &analysis, flags.max_sweep_runs);
  if (absl::Status s = scheduler.Start(); !s.ok()) return Fail("cannot start the scheduler", s);

  circuitlab::rpc::ServerOptions server_opts;
  server_opts.listen = flags.listen;
  server_opts.auth_token = token;
  server_opts.max_message_bytes = flags.max_request_bytes;
  auto server = circuitlab::rpc::GrpcServer::Start(server_opts, &scheduler, &analysis, &sweeps);
  if (!server.ok()) {
    scheduler.Drain();
    return Fail("cannot serve", server.status());
  }
  std::string slots;
  for (const std::string& s : scheduler.device_slots()) slots += (slots.empty() ? "" : ",") + s;
  spdlog::info("circuitlab-server listening on {} (port {}), data {}, devices [{}], {} analysis worker(s)",
               flags.listen, (*server)->port(), flags.data_dir, slots, flags.jobs.workers);
  // One machine-readable line for scripts and tests that start us on port 0.
  std::printf("listening port=%d\n", (*server)->port());
  std::fflush(stdout);

  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("received {}: draining (running runs checkpoint and resume on the next start)",
               sig == SIGTERM ? "SIGTERM" : "SIGINT");
  (*server)->MarkNotServing();
  analysis.Shutdown();  // queued analyses end at once, running ones at their next forward pass
  scheduler.Drain();
  (*server)->Shutdown(std::chrono::seconds(1));
  spdlog::info("stopped cleanly");
  return 0;
}
