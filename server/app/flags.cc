#include "server/app/flags.h"

#include <CLI/CLI.hpp>

namespace circuitlab::app {
namespace {

// The remote executors' flags (docs/howto/scale-out.md).
void DefineRemoteFlags(CLI::App& app, ServerFlags& f) {
  const char* g = "Remote workers";
  app.add_option("--executor", f.server.remote.executor,
                 "Where runs train: local (this process's --cpu-slots/CUDA slots), workers (circuitlab-worker "
                 "processes that dial this server: by hand, a Kubernetes Job), slurm (as workers, started as Slurm "
                 "pilot jobs sized to the queue)")
      ->capture_default_str()
      ->check(CLI::IsMember({"local", "workers", "slurm"}))
      ->group(g);
  app.add_option("--remote-slots", f.server.remote.remote_slots,
                 "Runs training on remote workers at once (default: 64 with workers; with slurm "
                 "--slurm-max-workers x --slurm-worker-slots, x 64 when 0)")
      ->check(CLI::Range(1, 100000))
      ->group(g);
  app.add_option("--lease-timeout-seconds", f.lease_timeout_s,
                 "A worker silent this long loses its runs (they resume from their newest checkpoint elsewhere)")
      ->capture_default_str()
      ->check(CLI::Range(2, 86400))
      ->group(g);
  app.add_option("--max-lost-leases", f.server.remote.max_lost_leases,
                 "A run whose worker went away while it trained (crashed or was killed after reporting on it) this "
                 "many times fails instead of being queued again; a worker that went silent or never reported is "
                 "charged itself (--worker-quarantine-after)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000))
      ->group(g);
  app.add_option("--max-worker-sessions-per-principal", f.server.remote.broker.max_sessions_per_principal,
                 "Worker sessions one principal (token) may have connected")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096))
      ->group(g);
  app.add_option("--max-worker-slots-per-principal", f.server.remote.broker.max_slots_per_principal,
                 "Worker slots one principal's sessions may register together")
      ->capture_default_str()
      ->check(CLI::Range(1, 262144))
      ->group(g);
  app.add_option("--worker-quarantine-after", f.server.remote.broker.quarantine_after,
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
}

// The Slurm pilot pool's flags (--executor slurm; docs/howto/scale-out.md).
void DefineSlurmFlags(CLI::App& app, ServerFlags& f) {
  const char* g = "Slurm pilots";
  auto& s = f.server.remote.slurm;
  app.add_option("--slurm-max-workers", s.max_workers, "Most pilot jobs at once")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000))
      ->group(g);
  app.add_option("--slurm-worker-slots", s.worker_slots,
                 "Runs one pilot trains at once (its --cpus-per-task is this x --threads-per-run); 0 sizes "
                 "each pilot by its node: a whole node (--exclusive), its CPUs / --threads-per-run slots")
      ->capture_default_str()
      ->check(CLI::Range(0, remote::SlurmOptions::kMaxWorkerSlots))
      ->group(g);
  app.add_option("--slurm-partition", s.partition, "sbatch --partition")->group(g);
  app.add_option("--slurm-account", s.account, "sbatch --account")->group(g);
  app.add_option("--slurm-qos", s.qos, "sbatch --qos")->group(g);
  app.add_option("--slurm-time", s.time,
                 "sbatch --time of a pilot (e.g. 4:00:00); a pilot near its end is "
                 "signalled (USR2, 120 s before) and hands its runs back")
      ->group(g);
  app.add_option("--slurm-gpus-per-node", s.gpus_per_node,
                 "GPU pilots for the runs whose spec asks for CUDA (resources.device), with sbatch --gpus-per-node "
                 "(e.g. 1, a100:1; Slurm's --gres=gpu:N) and job name <--slurm-job-name>-gpu; they train on cuda:0, "
                 "the first GPU Slurm gave them. Other runs keep to CPU pilots. (Placement tested on fake GPUs; "
                 "training on GPUs untested here)")
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

// Who may connect and how: tokens, TLS, the health port, private runs, the audit log.
void DefineAccessFlags(CLI::App& app, ServerFlags& f) {
  const char* g = "Access and TLS";
  app.add_option("--auth-tokens-file", f.server.tokens_file,
                 "Principals, one per line: 'name role sha256:<hex of the token> [max_queued=N] [max_analyses=N] "
                 "[max_watches=N] [max_sweep_runs=N]'; roles admin, user, reader. Re-read on SIGHUP. "
                 "scripts/add-principal.sh makes a token and its line")
      ->check(CLI::ExistingFile)
      ->group(g);
  app.add_option("--auth-token-file", f.server.token_file,
                 "Older form: a file whose first line is one bearer token, the principal 'admin'")
      ->check(CLI::ExistingFile)
      ->group(g);
  app.add_option("--tls-cert", f.server.fronts.tls.cert,
                 "PEM certificate (chain) of this server; with --tls-key turns TLS on")
      ->check(CLI::ExistingFile)
      ->group(g);
  app.add_option("--tls-key", f.server.fronts.tls.key, "PEM private key of --tls-cert")
      ->check(CLI::ExistingFile)
      ->group(g);
  app.add_option("--tls-client-ca", f.server.fronts.tls.client_ca,
                 "PEM CA bundle: clients must present a certificate it signed (mutual TLS)")
      ->check(CLI::ExistingFile)
      ->group(g);
  app.add_option("--tls-reload-seconds", f.server.fronts.tls.reload_seconds,
                 "How often the TLS files are re-read: replaced certificates apply to new connections without a "
                 "restart")
      ->capture_default_str()
      ->check(CLI::Range(1u, 86400u))
      ->group(g);
  app.add_flag("--insecure-plaintext", f.server.fronts.insecure_plaintext,
               "Allow listening beyond loopback without TLS (tokens are still required; they and all data then "
               "cross the network in clear)")
      ->group(g);
  app.add_option("--health-listen", f.server.fronts.health_listen,
                 "Also serve grpc.health.v1 alone, plaintext and without a token, on this address (for probes "
                 "that cannot speak TLS, e.g. Kubernetes gRPC probes); no data is served there")
      ->group(g);
  app.add_flag("--private-runs", f.server.fronts.private_runs,
               "A user sees only its own runs, sweeps and analysis jobs (admins and readers see all)")
      ->group(g);
  app.add_option("--audit-log", f.server.audit_log,
                 "Append one JSON line per state-changing call (time, principal, peer, method, target, outcome) "
                 "to this file; rotated at --audit-log-max-mb, 5 old files kept")
      ->group(g);
  app.add_option("--audit-log-max-mb", f.audit_log_max_mb, "Size at which the audit log rotates")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 20))
      ->group(g);
}

// The HTTP port (dashboard, JSON API, event streams, /metrics).
void DefineHttpFlags(CLI::App& app, ServerFlags& f) {
  const char* g = "HTTP";
  app.add_option("--http", f.server.fronts.http.listen,
                 "HOST:PORT of the HTTP port: the dashboard, the JSON API (/api/v1: reads, and the dashboard's one "
                 "write, POST interventions), run event streams, /metrics (Prometheus), /healthz and /readyz. Same "
                 "TLS, tokens and loopback rules as --listen. "
                 "'' turns it off; when the default port is taken the server runs without it (with a warning)")
      ->capture_default_str()
      ->each([&f](const std::string&) { f.http_given = true; })
      ->group(g);
  app.add_option("--http-threads", f.server.fronts.http.threads,
                 "HTTP connections served at once, each on a pooled thread (event streams included)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096))
      ->group(g);
  app.add_option("--http-max-per-peer", f.server.fronts.http.max_per_peer,
                 "HTTP connections and requests in progress from one address, those still sending their headers "
                 "included (at most half of --http-threads applies); more are answered 429 and closed")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096))
      ->group(g);
  app.add_option("--http-max-streams", f.server.fronts.http.max_streams,
                 "Open run event streams (Server-Sent Events) at once; more are answered 503")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024))
      ->group(g);
}

// Where and how runs train on this machine.
void DefineTrainingFlags(CLI::App& app, ServerFlags& f) {
  const char* g = "Training";
  app.add_option("--cpu-slots", f.server.scheduler.cpu_slots, "Runs trained at once on CPU (one worker per slot)")
      ->capture_default_str()
      ->check(CLI::Range(0, 256))
      ->group(g);
  app.add_option("--threads-per-run", f.server.scheduler.intra_op_threads,
                 "Threads per run: an IMIR run's LibTorch and OpenBLAS threads; a decoder run splits each "
                 "training batch over them (one LibTorch and one OpenBLAS thread each)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256))
      ->group(g);
  app.add_flag("--cuda,!--no-cuda", f.server.use_cuda, "Use the CUDA devices LibTorch reports (default on)")->group(g);
  app.add_flag("--cuda-deterministic,!--no-cuda-deterministic", f.server.cuda_deterministic,
               "Deterministic CUDA kernels: a run repeats bit-for-bit on the same GPU and software (default on;\n"
               "off is somewhat faster)")
      ->group(g);
  app.add_option("--max-ensemble", f.server.scheduler.max_pack,
                 "Most sweep members (of one owner, differing only in what a pack allows: the seed, IMIR initial "
                 "coordinates, the decoders' kappa and p_minor) trained as one ensemble job "
                 "(1 = off; default 8 when CUDA devices are used, else 1: CPU slots already run runs in parallel). "
                 "On a CPU slot only IMIR members at batch <= 32 pack: other packed steps are slower there than "
                 "their members one after another (bench/RESULTS.md)")
      ->check(CLI::Range(1, 64))
      ->group(g);
}

// What protects the server: queues, sizes, memory (docs/reference/limits.md).
void DefineLimitFlags(CLI::App& app, ServerFlags& f) {
  const char* g = "Limits";
  app.add_option("--max-queued-runs", f.server.scheduler.max_queued_runs,
                 "Queued runs accepted before RESOURCE_EXHAUSTED")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000))
      ->group(g);
  app.add_option("--max-sweep-runs", f.server.max_sweep_runs,
                 "Most runs one sweep may expand to (tokens-file max_sweep_runs= overrides per principal)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000))
      ->group(g);
  app.add_option("--max-queued-per-client", f.server.scheduler.max_queued_per_client,
                 "Queued runs per principal (a tokens-file max_queued= overrides it for one principal)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000))
      ->group(g);
  app.add_option("--max-watchers", f.server.scheduler.max_watchers, "Open WatchRun streams, all principals together")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000))
      ->group(g);
  app.add_option("--max-watches-per-client", f.server.scheduler.max_watchers_per_client,
                 "Open WatchRun streams per principal (tokens-file max_watches= overrides)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000))
      ->group(g);
  app.add_option("--max-steps", f.server.scheduler.limits.max_steps, "Most training steps one run may ask for")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{10'000'000}))
      ->group(g);
  app.add_option("--max-run-memory-mb", f.max_run_memory_mb, "Most memory (estimated) one run may need")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{16}, uint64_t{1} << 24))
      ->group(g);
  app.add_option("--max-request-bytes", f.server.fronts.max_message_bytes,
                 "Largest request accepted, in bytes (a larger one is RESOURCE_EXHAUSTED before it is parsed)")
      ->capture_default_str()
      ->check(CLI::Range(1 << 16, 64 << 20))
      ->group(g);
  app.add_option("--max-response-bytes", f.server.fronts.max_response_bytes,
                 "Bytes of answers being serialized and sent at once over gRPC and HTTP (HTTP counts an answer as "
                 "three times its protobuf size); an answer that does not fit is RESOURCE_EXHAUSTED (429) naming the "
                 "numbers")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{64} << 20, int64_t{1} << 40))
      ->group(g);
}

// The analysis jobs: how many at once, their memory, the stored answers.
void DefineAnalysisFlags(CLI::App& app, ServerFlags& f) {
  const char* g = "Analyses";
  app.add_option("--analysis-workers", f.server.jobs.workers,
                 "Analysis jobs run at once (one thread each, one LibTorch thread; they share the machine's cores "
                 "with the --cpu-slots training workers)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64))
      ->group(g);
  app.add_option("--max-analysis-jobs", f.server.jobs.max_active,
                 "Queued + running analysis jobs before RESOURCE_EXHAUSTED")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000))
      ->group(g);
  app.add_option("--max-analysis-jobs-per-client", f.server.jobs.max_active_per_client,
                 "Queued + running analysis jobs of one principal (tokens-file max_analyses= overrides)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000))
      ->group(g);
  app.add_option("--analysis-memory-mb", f.analysis_memory_mb,
                 "Memory (estimated) the running analysis jobs may hold together; a job waits until it fits, one "
                 "larger than this alone is refused")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{16}, uint64_t{1} << 24))
      ->group(g);
  app.add_option("--max-stored-analyses-mb", f.max_stored_analyses_mb,
                 "Stored analysis answers of one principal; past it, storing a new answer deletes that principal's "
                 "oldest (asked again, they are computed again); 0 = no limit")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 30))
      ->group(g);
}

}  // namespace

void DefineFlags(CLI::App& app, ServerFlags& f) {
  app.add_option("--data", f.server.data_dir, "Data directory (SQLite database, checkpoints)")->capture_default_str();
  app.add_option("--listen", f.server.fronts.listen,
                 "Address to listen on; port 0 picks a free port (printed at start)")
      ->capture_default_str();
  app.add_option("--backup", f.backup_dir,
                 "Copy the data directory --data into this new directory (a consistent database snapshot, then "
                 "the checkpoint files) and exit; safe while a server runs on --data. Restore: start a server "
                 "with --data set to the copy");
  DefineAccessFlags(app, f);
  DefineHttpFlags(app, f);
  DefineTrainingFlags(app, f);
  DefineLimitFlags(app, f);
  DefineAnalysisFlags(app, f);
  DefineRemoteFlags(app, f);
  DefineSlurmFlags(app, f);
  app.add_option("--log-level", f.log_level, "trace|debug|info|warn|error|off")->capture_default_str();
  app.set_version_flag("--version", "circuitlab-server " + f.server.version);
}

void FinishFlags(ServerFlags& f) {
  ServerOptions& o = f.server;
  o.fronts.http.required = f.http_given;
  o.audit_log_max_bytes = f.audit_log_max_mb << 20;
  o.scheduler.limits.max_run_memory_bytes = f.max_run_memory_mb << 20;
  o.jobs.memory_budget_bytes = f.analysis_memory_mb << 20;
  o.jobs.max_stored_bytes_per_owner = static_cast<int64_t>(f.max_stored_analyses_mb << 20);
  remote::BrokerOptions& b = o.remote.broker;
  b.quarantine = std::chrono::seconds(f.quarantine_s);
  b.heartbeat = std::chrono::seconds(f.heartbeat_s);
  b.lease_timeout = std::chrono::seconds(f.lease_timeout_s);
  o.remote.slurm.poll = std::chrono::seconds(f.slurm_poll_s);
}

}  // namespace circuitlab::app
