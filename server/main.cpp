// circuitlab-server: flags -> store, engine, scheduler, gRPC server; then wait
// for SIGINT/SIGTERM and drain. The only file that knows every concrete type.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "server/common/clock.h"
#include "server/common/logging.h"
#include "server/engine/engine.h"
#include "server/rpc/server.h"
#include "server/scheduler/analysis_core.h"
#include "server/scheduler/scheduler.h"
#include "server/scheduler/slurm.h"
#include "server/scheduler/workers.h"
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
  std::string tokens_file;
  circuitlab::rpc::TlsFiles tls;
  bool insecure_plaintext = false;
  bool private_runs = false;
  std::string audit_log;
  std::string health_listen;
  circuitlab::rpc::HttpOptions http{.listen = "127.0.0.1:8080"};
  bool http_given = false;
  uint64_t audit_log_max_mb = 64;
  int max_watches_per_client = 256;
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
  bool cuda_deterministic = true;
  // Remote workers (README "Scaling out").
  std::string executor = "local";
  int remote_slots = 0;  // 0: workers 64, slurm max-workers x worker-slots
  int lease_timeout_s = 60;
  int heartbeat_s = 10;
  int max_lost_leases = 5;
  circuitlab::scheduler::BrokerOptions broker;
  int quarantine_s = 600;
  circuitlab::scheduler::SlurmOptions slurm;
  int slurm_poll_s = 5;
};

// The remote executors' flags (README "Scaling out").
void DefineRemoteFlags(CLI::App& app, Flags& f) {
  const char* g = "Remote workers";
  app.add_option("--executor", f.executor,
                 "Where runs train: local (this process's --cpu-slots/CUDA slots), workers (circuitlab-worker "
                 "processes that dial this server: by hand, a Kubernetes Job), slurm (as workers, started as Slurm "
                 "pilot jobs sized to the queue)")
      ->capture_default_str()
      ->check(CLI::IsMember({"local", "workers", "slurm"}))
      ->group(g);
  app.add_option("--remote-slots", f.remote_slots,
                 "Runs training on remote workers at once (default: 64 with workers; with slurm "
                 "--slurm-max-workers x --slurm-worker-slots)")
      ->check(CLI::Range(1, 100000))
      ->group(g);
  app.add_option("--lease-timeout-seconds", f.lease_timeout_s,
                 "A worker silent this long loses its runs (they resume from their newest checkpoint elsewhere)")
      ->capture_default_str()
      ->check(CLI::Range(2, 86400))
      ->group(g);
  app.add_option("--max-lost-leases", f.max_lost_leases,
                 "A run whose worker went away while it trained (crashed or was killed after reporting on it) this "
                 "many times fails instead of being queued again; a worker that went silent or never reported is "
                 "charged itself (--worker-quarantine-after)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000))
      ->group(g);
  app.add_option("--max-worker-sessions-per-principal", f.broker.max_sessions_per_principal,
                 "Worker sessions one principal (token) may have connected")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096))
      ->group(g);
  app.add_option("--max-worker-slots-per-principal", f.broker.max_slots_per_principal,
                 "Worker slots one principal's sessions may register together")
      ->capture_default_str()
      ->check(CLI::Range(1, 262144))
      ->group(g);
  app.add_option("--worker-quarantine-after", f.broker.quarantine_after,
                 "A principal whose workers lose this many leases by going silent (or away before reporting) within "
                 "--worker-quarantine-seconds gets no new sessions or leases for that long")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000))
      ->group(g);
  app.add_option("--worker-quarantine-seconds", f.quarantine_s, "How long a worker principal's quarantine lasts")
      ->capture_default_str()
      ->check(CLI::Range(1, 86400))
      ->group(g);
  app.add_option("--heartbeat-seconds", f.heartbeat_s, "How often workers say they are alive")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600))
      ->group(g);
  auto& s = f.slurm;
  app.add_option("--slurm-max-workers", s.max_workers, "Most pilot jobs at once")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000))
      ->group(g);
  app.add_option("--slurm-worker-slots", s.worker_slots,
                 "Runs one pilot trains at once (its --cpus-per-task "
                 "is this x --threads-per-run)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64))
      ->group(g);
  app.add_option("--slurm-partition", s.partition, "sbatch --partition")->group(g);
  app.add_option("--slurm-account", s.account, "sbatch --account")->group(g);
  app.add_option("--slurm-qos", s.qos, "sbatch --qos")->group(g);
  app.add_option("--slurm-time", s.time,
                 "sbatch --time of a pilot (e.g. 4:00:00); a pilot near its end is "
                 "signalled (USR2, 120 s before) and hands its runs back")
      ->group(g);
  app.add_option("--slurm-gpus-per-node", s.gpus_per_node,
                 "sbatch --gpus-per-node (e.g. 1, a100:1); the pilots "
                 "then train on cuda:0 (untested here: no GPU Slurm)")
      ->group(g);
  app.add_option("--slurm-extra", s.extra_lines,
                 "A line for the pilot script, right after its shebang "
                 "(repeatable), e.g. '#SBATCH --constraint=skylake' or 'module load gcc'")
      ->group(g);
  app.add_option("--slurm-job-name", s.job_name,
                 "The pilots' job name (the pool finds its pilots by it, also "
                 "after a restart)")
      ->capture_default_str()
      ->group(g);
  app.add_option("--slurm-log-dir", s.log_dir,
                 "Where pilots write their output (<name>-<jobid>.out; default "
                 "<data>/slurm-logs; must be writable from the nodes)")
      ->group(g);
  app.add_option("--slurm-poll-seconds", f.slurm_poll_s, "One squeue (and sacct for pilots that left) per cycle")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600))
      ->group(g);
  app.add_option("--slurm-idle-exit", s.idle_exit_seconds, "A pilot with nothing to train exits after this long")
      ->capture_default_str()
      ->check(CLI::Range(1, 86400))
      ->group(g);
  app.add_flag("--slurm-cancel-on-exit", s.cancel_on_exit,
               "Stop the pilots when the server stops (default: they finish handing back their runs, reconnect to "
               "the next server, or exit when idle)")
      ->group(g);
  app.add_option("--worker-binary", s.worker_binary,
                 "circuitlab-worker as the nodes see it (default: beside this "
                 "server's binary)")
      ->group(g);
  app.add_option("--worker-server", s.server_address,
                 "The address pilots dial (default --listen, 0.0.0.0 "
                 "replaced by this host's name)")
      ->group(g);
  app.add_option("--worker-token-file", s.token_file,
                 "The token file pilots present (a principal with the worker "
                 "role; readable on the nodes)")
      ->group(g);
  app.add_option("--worker-ca-cert", s.ca_cert, "The CA of this server's certificate, as the nodes see it")->group(g);
}

// The lease broker (and with --executor slurm, the pilot pool) for the
// remote executors; nullptr with --executor local.
absl::Status SetUpRemote(Flags& f, circuitlab::scheduler::SchedulerOptions& opts, circuitlab::engine::Executor* local,
                         std::unique_ptr<circuitlab::scheduler::WorkerBroker>& broker) {
  if (f.executor == "local") return absl::OkStatus();
  circuitlab::scheduler::BrokerOptions b = f.broker;
  b.quarantine = std::chrono::seconds(f.quarantine_s);
  b.heartbeat = std::chrono::seconds(f.heartbeat_s);
  b.lease_timeout = std::chrono::seconds(f.lease_timeout_s);
  b.version = CIRCUITLAB_VERSION;
  b.max_message_bytes = f.max_request_bytes;
  broker = std::make_unique<circuitlab::scheduler::WorkerBroker>(b, local, circuitlab::Clock::Real());
  opts.remote = broker.get();
  opts.max_lost_leases = f.max_lost_leases;
  opts.remote_slots = f.remote_slots > 0      ? f.remote_slots
                      : f.executor == "slurm" ? f.slurm.max_workers * f.slurm.worker_slots
                                              : 64;
  auto& s = f.slurm;
  s.intra_op_threads = f.threads_per_run;
  s.poll = std::chrono::seconds(f.slurm_poll_s);
  if (s.log_dir.empty()) s.log_dir = (std::filesystem::absolute(f.data_dir) / "slurm-logs").string();
  if (s.worker_binary.empty()) {
    // Installed: beside this binary; in a build tree: build/worker/.
    const std::filesystem::path here = std::filesystem::read_symlink("/proc/self/exe").parent_path();
    for (const auto& p : {here / "circuitlab-worker", here.parent_path() / "worker" / "circuitlab-worker"}) {
      if (std::filesystem::exists(p)) {
        s.worker_binary = p.string();
        break;
      }
    }
    if (s.worker_binary.empty() && f.executor == "slurm") {
      return absl::InvalidArgumentError("no circuitlab-worker beside this server (" + here.string() +
                                        "); pass --worker-binary as the nodes see it");
    }
  }
  if (s.server_address.empty()) {
    s.server_address = f.listen;
    if (s.server_address.rfind("0.0.0.0:", 0) == 0 || s.server_address.rfind("[::]:", 0) == 0) {
      char host[256] = {};
      gethostname(host, sizeof host - 1);
      s.server_address = std::string(host) + s.server_address.substr(s.server_address.rfind(':'));
    }
  }
  s.tls = f.tls.enabled();
  if (f.executor == "slurm") {
    std::error_code ec;
    std::filesystem::create_directories(s.log_dir, ec);
    if (ec) return absl::InvalidArgumentError("--slurm-log-dir " + s.log_dir + ": " + ec.message());
    if (!f.tokens_file.empty() || !f.token_file.empty()) {
      if (s.token_file.empty()) {
        return absl::InvalidArgumentError(
            "--executor slurm on a server with tokens needs --worker-token-file "
            "(a principal with the worker role: scripts/add-principal.sh NAME worker)");
      }
    }
  }
  return absl::OkStatus();
}

// Every flag, with its help, default and range.
void DefineFlags(CLI::App& app, Flags& f) {
  app.add_option("--data", f.data_dir, "Data directory (SQLite database, checkpoints)")->capture_default_str();
  app.add_option("--listen", f.listen, "Address to listen on; port 0 picks a free port (printed at start)")
      ->capture_default_str();
  app.add_option("--auth-tokens-file", f.tokens_file,
                 "Principals, one per line: 'name role sha256:<hex of the token> [max_queued=N] [max_analyses=N] "
                 "[max_watches=N] [max_sweep_runs=N]'; roles admin, user, reader. Re-read on SIGHUP. "
                 "scripts/add-principal.sh makes a token and its line")
      ->check(CLI::ExistingFile);
  app.add_option("--auth-token-file", f.token_file,
                 "Older form: a file whose first line is one bearer token, the principal 'admin'")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-cert", f.tls.cert, "PEM certificate (chain) of this server; with --tls-key turns TLS on")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-key", f.tls.key, "PEM private key of --tls-cert")->check(CLI::ExistingFile);
  app.add_option("--tls-client-ca", f.tls.client_ca,
                 "PEM CA bundle: clients must present a certificate it signed (mutual TLS)")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-reload-seconds", f.tls.reload_seconds,
                 "How often the TLS files are re-read: replaced certificates apply to new connections without a "
                 "restart")
      ->capture_default_str()
      ->check(CLI::Range(1u, 86400u));
  app.add_flag("--insecure-plaintext", f.insecure_plaintext,
               "Allow listening beyond loopback without TLS (tokens are still required; they and all data then "
               "cross the network in clear)");
  app.add_option("--health-listen", f.health_listen,
                 "Also serve grpc.health.v1 alone, plaintext and without a token, on this address (for probes "
                 "that cannot speak TLS, e.g. Kubernetes gRPC probes); no data is served there");
  app.add_option("--http", f.http.listen,
                 "HOST:PORT of the HTTP port: the dashboard, the read-only JSON API (/api/v1), run event streams, "
                 "/metrics (Prometheus), /healthz and /readyz. Same TLS, tokens and loopback rules as --listen. "
                 "'' turns it off; when the default port is taken the server runs without it (with a warning)")
      ->capture_default_str()
      ->each([&f](const std::string&) { f.http_given = true; });
  app.add_option("--http-threads", f.http.threads,
                 "HTTP connections served at once, each on a pooled thread (event streams included)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--http-max-per-peer", f.http.max_per_peer,
                 "HTTP requests in progress from one address; more are answered 429")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--http-max-streams", f.http.max_streams,
                 "Open run event streams (Server-Sent Events) at once; more are answered 503")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
  app.add_flag("--private-runs", f.private_runs,
               "A user sees only its own runs, sweeps and analysis jobs (admins and readers see all)");
  app.add_option("--audit-log", f.audit_log,
                 "Append one JSON line per state-changing call (time, principal, peer, method, target, outcome) "
                 "to this file; rotated at --audit-log-max-mb, 5 old files kept");
  app.add_option("--audit-log-max-mb", f.audit_log_max_mb, "Size at which the audit log rotates")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 20));
  app.add_option("--cpu-slots", f.cpu_slots, "Runs trained at once on CPU (one worker per slot)")
      ->capture_default_str()
      ->check(CLI::Range(0, 256));
  app.add_option("--threads-per-run", f.threads_per_run, "LibTorch/BLAS threads per run")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_flag("--cuda,!--no-cuda", f.use_cuda, "Use the CUDA devices LibTorch reports (default on)");
  app.add_flag("--cuda-deterministic,!--no-cuda-deterministic", f.cuda_deterministic,
               "Deterministic CUDA kernels: a run repeats bit-for-bit on the same GPU and software (default on;\n"
               "off is somewhat faster)");
  app.add_option("--max-queued-runs", f.max_queued, "Queued runs accepted before RESOURCE_EXHAUSTED")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  app.add_option("--max-ensemble", f.max_ensemble,
                 "Most members of one sweep that differ only in their seed trained as one ensemble job (1 = off; "
                 "default 8 when CUDA devices are used, else 1: CPU slots already run runs in parallel)")
      ->check(CLI::Range(1, 64));
  app.add_option("--max-sweep-runs", f.max_sweep_runs,
                 "Most runs one sweep may expand to (tokens-file max_sweep_runs= overrides per principal)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_option("--max-queued-per-client", f.max_queued_per_client,
                 "Queued runs per principal (a tokens-file max_queued= overrides it for one principal)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  app.add_option("--max-watchers", f.max_watchers, "Open WatchRun streams, all principals together")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  app.add_option("--max-watches-per-client", f.max_watches_per_client,
                 "Open WatchRun streams per principal (tokens-file max_watches= overrides)")
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
                 "Queued + running analysis jobs of one principal (tokens-file max_analyses= overrides)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_option("--analysis-memory-mb", f.analysis_memory_mb,
                 "Memory (estimated) the running analysis jobs may hold together; a job waits until it fits, one "
                 "larger than this alone is refused")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{16}, uint64_t{1} << 24));
  DefineRemoteFlags(app, f);
  app.add_option("--log-level", f.log_level, "trace|debug|info|warn|error|off")->capture_default_str();
  app.set_version_flag("--version", "circuitlab-server 0.1.0");
}

}  // namespace

// The start-up lines: what serves where, for people (the log) and for
// scripts and tests that start us on port 0 (stdout).
void AnnounceServing(const Flags& flags, circuitlab::scheduler::Scheduler& scheduler,
                     const circuitlab::rpc::Authenticator& auth, const circuitlab::rpc::GrpcServer& server) {
  std::string slots;
  for (const std::string& s : scheduler.device_slots()) slots += (slots.empty() ? "" : ",") + s;
  spdlog::info("circuitlab-server listening on {} (port {}, {}), data {}, devices [{}], {} analysis worker(s)",
               flags.listen, server.port(),
               flags.tls.enabled() ? (flags.tls.client_ca.empty() ? "TLS" : "mutual TLS") : "plaintext", flags.data_dir,
               slots, flags.jobs.workers);
  if (auth.open()) {
    spdlog::info("no tokens configured: every caller is the principal 'local' (admin); loopback only");
  } else {
    spdlog::info("{} principal(s) from {}", auth.principal_count(),
                 flags.tokens_file.empty() ? flags.token_file : flags.tokens_file);
  }
  if (flags.insecure_plaintext && !flags.tls.enabled() && !circuitlab::rpc::IsLoopbackAddress(flags.listen)) {
    spdlog::warn("--insecure-plaintext: listening on {} without TLS; tokens and data cross the network in clear",
                 flags.listen);
  }
  if (server.health_port() > 0) {
    spdlog::info("health alone (plaintext, no token) on {} (port {})", flags.health_listen, server.health_port());
  }
  if (server.http_port() > 0) {
    spdlog::info("dashboard: {}  (JSON API {}api/v1, Prometheus {}metrics)", server.http_url(),
                 server.http_url(), server.http_url());
  }
  // Machine-readable lines for scripts and tests that start us on port 0:
  // the gRPC port first, then the HTTP port when there is one.
  std::printf("listening port=%d\n", server.port());
  if (server.http_port() > 0) {
    std::printf("http port=%d url=%s\n", server.http_port(), server.http_url().c_str());
  }
  std::fflush(stdout);
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
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  circuitlab::Quotas quotas;
  auto auth = circuitlab::rpc::Authenticator::Create(flags.tokens_file, flags.token_file, &quotas);
  if (!auth.ok()) return Fail("bad tokens", auth.status());
  std::unique_ptr<circuitlab::rpc::AuditLog> audit;
  if (!flags.audit_log.empty()) {
    auto opened = circuitlab::rpc::AuditLog::Open(flags.audit_log, flags.audit_log_max_mb << 20);
    if (!opened.ok()) return Fail("cannot open the audit log", opened.status());
    audit = *std::move(opened);
  }

  circuitlab::engine::ConfigureRuntime(flags.threads_per_run);
  auto store = circuitlab::store::Store::Open(flags.data_dir);
  if (!store.ok()) return Fail("cannot open --data " + flags.data_dir, store.status());

  circuitlab::scheduler::SchedulerOptions opts;
  opts.cpu_slots = flags.cpu_slots;
  const circuitlab::engine::TorchRuntime torch = circuitlab::engine::DescribeTorchRuntime();
  opts.cuda_devices = flags.use_cuda ? torch.cuda_devices : 0;
  if (opts.cuda_devices > 0) circuitlab::engine::ConfigureCuda(flags.cuda_deterministic);
  opts.cuda_memory_bytes = torch.cuda_memory_bytes;
  opts.intra_op_threads = flags.threads_per_run;
  opts.max_queued_runs = flags.max_queued;
  opts.max_queued_per_client = flags.max_queued_per_client;
  opts.max_pack = flags.max_ensemble > 0 ? flags.max_ensemble : (opts.cuda_devices > 0 ? 8 : 1);
  opts.max_watchers = flags.max_watchers;
  opts.max_watchers_per_client = flags.max_watches_per_client;
  opts.quotas = &quotas;
  opts.limits.max_steps = flags.max_steps;
  opts.limits.max_run_memory_bytes = flags.max_run_memory_mb << 20;
  opts.epoch = RandomEpoch();
  std::unique_ptr<circuitlab::engine::Executor> local_executor = circuitlab::engine::MakeTorchExecutor();
  std::unique_ptr<circuitlab::scheduler::WorkerBroker> broker;
  if (absl::Status s = SetUpRemote(flags, opts, local_executor.get(), broker); !s.ok()) return Fail("bad flags", s);
  if (broker) opts.cpu_slots = opts.cuda_devices = 0;  // runs train on the workers
  if (opts.cpu_slots + opts.cuda_devices + opts.remote_slots == 0) {
    return Fail("bad flags", absl::InvalidArgumentError("no device slots: set --cpu-slots >= 1 or use CUDA"));
  }
  circuitlab::engine::Executor* executor =
      broker ? static_cast<circuitlab::engine::Executor*>(broker.get()) : local_executor.get();
  std::unique_ptr<circuitlab::engine::Analyzer> analyzer = circuitlab::engine::MakeTorchAnalyzer();
  circuitlab::scheduler::Scheduler scheduler(opts, store->get(), executor, circuitlab::Clock::Real());
  if (broker) broker->SetWake([&scheduler] { scheduler.Wake(); });
  flags.jobs.memory_budget_bytes = flags.analysis_memory_mb << 20;
  flags.jobs.quotas = &quotas;
  circuitlab::scheduler::AnalysisCore analysis(store->get(), analyzer.get(), flags.jobs, opts.limits);
  scheduler.OnRunsDeleted([&analysis](const std::vector<int64_t>& ids) { analysis.jobs().ForgetRuns(ids); });
  circuitlab::scheduler::SweepCore sweeps(&scheduler, store->get(), &analysis, flags.max_sweep_runs, &quotas);
  if (absl::Status s = scheduler.Start(); !s.ok()) return Fail("cannot start the scheduler", s);
  std::unique_ptr<circuitlab::scheduler::SlurmPool> pool;
  if (flags.executor == "slurm") {
    auto* b = broker.get();
    pool = std::make_unique<circuitlab::scheduler::SlurmPool>(
        flags.slurm, circuitlab::scheduler::RunCommand,
        [&scheduler, b] { return scheduler.QueuedRuns() + b->BusySlots(); });
    if (absl::Status s = pool->Start(); !s.ok()) {
      scheduler.Drain();
      return Fail("cannot use Slurm", s);
    }
  }

  circuitlab::rpc::ServerOptions server_opts;
  server_opts.listen = flags.listen;
  server_opts.max_message_bytes = flags.max_request_bytes;
  server_opts.tls = flags.tls;
  server_opts.insecure_plaintext = flags.insecure_plaintext;
  server_opts.private_runs = flags.private_runs;
  server_opts.health_listen = flags.health_listen;
  server_opts.executor = flags.executor;
  server_opts.http = flags.http;
  server_opts.http.required = flags.http_given;
  server_opts.runtime = {CIRCUITLAB_VERSION, torch.version, torch.cuda_runtime, opts.cuda_devices,
                         scheduler.device_slots()};
  circuitlab::rpc::Telemetry telemetry(
      {&scheduler, &analysis.jobs(), store->get(), broker.get(), CIRCUITLAB_VERSION, flags.executor});
  auto server = circuitlab::rpc::GrpcServer::Start(server_opts, auth->get(), audit.get(), &scheduler, &analysis,
                                                   &sweeps, broker.get(), &telemetry);
  if (!server.ok()) {
    scheduler.Drain();
    return Fail("cannot serve", server.status());
  }
  spdlog::info("{}{}", torch.Describe(),
               torch.cuda_devices > 0 && !flags.use_cuda ? ": not used (--no-cuda)"
               : torch.cuda_devices > 0 && broker       ? ": not used (runs train on remote workers)"
               : !torch.cuda_runtime.empty() && torch.cuda_devices == 0
                   ? ": no CUDA device or driver found, runs train on the CPU slots"
                   : "");
  AnnounceServing(flags, scheduler, **auth, **server);

  int sig = 0;
  while (sigwait(&signals, &sig) == 0 && sig == SIGHUP) {
    if ((*auth)->open()) {
      spdlog::info("SIGHUP: no tokens file to re-read");
    } else if (absl::Status s = (*auth)->Reload(); s.ok()) {
      spdlog::info("SIGHUP: re-read the tokens: {} principal(s); {} open stream(s) of revoked tokens ended",
                   (*auth)->principal_count(), (*server)->RevalidateStreams());
    } else {
      spdlog::error("SIGHUP: the tokens file was not re-read, the principals stay as they were: {}",
                    std::string(s.message()));
    }
  }
  spdlog::info("received {}: draining (running runs checkpoint and resume on the next start)",
               sig == SIGTERM ? "SIGTERM" : "SIGINT");
  (*server)->MarkNotServing();
  analysis.Shutdown();  // queued analyses end at once, running ones at their next forward pass
  scheduler.Drain();    // remote workers checkpoint their runs over their streams, still open
  if (pool) pool->Stop();
  (*server)->Shutdown(std::chrono::seconds(1));
  spdlog::info("stopped cleanly");
  return 0;
}
