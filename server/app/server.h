// The whole server as one object: Server::Create builds the store, the
// engine's executors, the scheduler, the analysis and sweep cores, the remote
// executor (worker broker, Slurm pilots), security, telemetry and both fronts
// (gRPC, HTTP) in dependency order; Shutdown and the destructor stop them in
// the one safe order (fronts stop answering, analyses end, runs checkpoint,
// pilots stop, the ports close). The only place that knows every concrete
// type; main.cpp and the integration tests both start servers through it.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/common/quotas.h"
#include "server/common/response_budget.h"
#include "server/engine/api.h"
#include "server/http/http_gateway.h"
#include "server/slurm/pool.h"
#include "server/remote/workers.h"
#include "server/reproduce/reproductions.h"
#include "server/rpc/server.h"
#include "server/scheduler/analysis_core.h"
#include "server/scheduler/scheduler.h"
#include "server/scheduler/sweeps.h"
#include "server/security/audit.h"
#include "server/security/auth.h"
#include "server/security/security.h"
#include "server/store/store.h"
#include "server/telemetry/telemetry.h"

namespace circuitlab::app {

// Where and how the two fronts listen (flags: --listen, --http, --tls-*, ...).
struct FrontOptions {
  std::string listen = "127.0.0.1:50051";  // gRPC; port 0 picks a free one
  int max_message_bytes = 4 << 20;         // largest request accepted (both fronts)
  // Answers being serialized and sent at once, both fronts (ResponseBudget).
  int64_t max_response_bytes = ResponseBudget::kDefaultLimit;
  security::TlsFiles tls;                  // no cert = plaintext (local credentials on loopback)
  bool insecure_plaintext = false;         // allow plaintext beyond loopback
  bool private_runs = false;               // users read only their own runs
  std::string health_listen;               // a plaintext health-only gRPC port; empty = none
  http::HttpOptions http;                  // http.listen empty = no HTTP port
};

// The remote executors (flags: --executor, --slurm-*, --worker-*).
struct RemoteOptions {
  std::string executor = "local";  // local | workers | slurm
  int remote_slots = 0;            // 0: 64 with workers; with slurm max_workers x worker_slots
  int max_lost_leases = 5;
  remote::BrokerOptions broker;
  remote::SlurmOptions slurm;  // empty log_dir / worker_binary / server_address are derived
};

struct ServerOptions {
  std::string data_dir = "./data";
  FrontOptions fronts;
  RemoteOptions remote;
  // Principals: the tokens file (--auth-tokens-file) or the older one-token
  // file; neither = an open, loopback-only server.
  std::string tokens_file, token_file;
  std::string audit_log;  // empty = none
  uint64_t audit_log_max_bytes = 64ULL << 20;
  // The cores. cuda_devices, cuda_memory_bytes, max_pack (when 0), epoch
  // (when empty), quotas (when null) and the remote fields are filled in by
  // Create.
  scheduler::SchedulerOptions scheduler;
  scheduler::AnalysisJobOptions jobs;
  int max_sweep_runs = 1024;
  reproduce::ReproductionOptions reproductions;
  bool use_cuda = true;
  bool cuda_deterministic = true;
  std::string version = "dev";  // what WhoAmI, /metrics and workers see
  // Supplied by tests (null = the real ones, made here): they must outlive
  // the server. An `auth` given here makes the token files unused.
  engine::Executor* executor = nullptr;
  engine::Analyzer* analyzer = nullptr;
  const security::Authenticator* auth = nullptr;
  security::AuditLog* audit = nullptr;
};

class Server {
 public:
  // Checks the options (InvalidArgument naming the flag), opens --data,
  // resumes its unfinished runs and starts serving; Unavailable when a port
  // cannot be bound.
  static absl::StatusOr<std::unique_ptr<Server>> Create(ServerOptions options);
  ~Server();  // Shutdown(0) when not yet shut down

  int port() const { return grpc_->port(); }
  int health_port() const { return grpc_->health_port(); }
  int http_port() const { return http_ ? http_->port() : 0; }
  std::string http_url() const { return http_ ? http_->url() : ""; }
  // What serves where, for people (the log) and for scripts and tests that
  // start the server on port 0 (stdout: "listening port=N", "http port=N").
  void Announce() const;

  // SIGHUP: re-reads the tokens file and ends the open streams (gRPC, HTTP,
  // workers) whose token no longer names the same principal and role.
  void ReloadTokens();
  // Ends the open streams of revoked tokens (after the caller re-read them).
  int RevalidateStreams() { return security_->RevalidateStreams(); }
  // Streams (gRPC watches, HTTP event streams, worker sessions) open now.
  int OpenStreamCount() const { return security_->OpenStreamCount(); }
  // Health and /readyz answer NOT_SERVING from now on (calls still work).
  void MarkNotServing();
  // Drains in order: not serving; queued analyses end, running ones at their
  // next forward pass; running runs checkpoint (remote ones over their still
  // open streams) and resume on the next start; Slurm pilots stop; the HTTP
  // port closes (its event streams first); in-flight gRPC calls get `grace`.
  void Shutdown(std::chrono::milliseconds grace);

  scheduler::Scheduler& scheduler() { return *scheduler_; }
  store::Store& store() { return *store_; }  // for tests and tools

 private:
  Server() = default;
  absl::Status Build(ServerOptions options);
  absl::Status BuildRemote(ServerOptions& options);
  absl::Status Serve(const ServerOptions& options);

  ServerOptions options_;
  engine::TorchRuntime torch_;
  Quotas quotas_;
  std::unique_ptr<security::Authenticator> own_auth_;
  const security::Authenticator* auth_ = nullptr;
  std::unique_ptr<security::AuditLog> own_audit_;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<engine::Executor> local_executor_;
  engine::Executor* local_ = nullptr;  // trains here, or (remote) answers the broker's estimates
  std::unique_ptr<engine::Analyzer> own_analyzer_;
  std::unique_ptr<remote::WorkerBroker> broker_;
  std::unique_ptr<scheduler::Scheduler> scheduler_;
  std::unique_ptr<scheduler::AnalysisCore> analysis_;
  std::unique_ptr<scheduler::SweepCore> sweeps_;
  std::unique_ptr<reproduce::ReproductionCore> reproductions_;
  std::unique_ptr<remote::SlurmPool> pool_;      // CPU pilots
  std::unique_ptr<remote::SlurmPool> gpu_pool_;  // GPU pilots (--slurm-gpus-per-node)
  std::unique_ptr<telemetry::Telemetry> telemetry_;
  std::unique_ptr<security::Directory> directory_;  // security's view of the cores
  std::unique_ptr<security::Security> security_;
  std::unique_ptr<rpc::GrpcServer> grpc_;
  std::unique_ptr<http::HttpGateway> http_;
  bool started_ = false;  // the scheduler runs (Shutdown drains it)
  bool shut_down_ = false;
};

}  // namespace circuitlab::app
