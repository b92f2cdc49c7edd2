#include "server/app/server.h"

#include <malloc.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <sstream>

#include "server/common/clock.h"
#include "server/common/status_macros.h"

namespace circuitlab::app {
namespace {

// Security's questions answered by the cores: a run's or a sweep's owner,
// and the limits each core applies to a principal.
class CoreDirectory : public security::Directory {
 public:
  CoreDirectory(scheduler::Scheduler* runs, scheduler::SweepCore* sweeps, scheduler::AnalysisJobs* jobs)
      : runs_(runs), sweeps_(sweeps), jobs_(jobs) {}
  absl::StatusOr<std::string> RunOwner(const std::string& id) const override { return runs_->OwnerOf(id); }
  absl::StatusOr<std::string> SweepOwner(const std::string& id) const override { return sweeps_->OwnerOf(id); }
  QuotaOverrides LimitsFor(const std::string& principal) const override {
    return {runs_->QueueLimitFor(principal), jobs_->ActiveLimitFor(principal), runs_->WatchLimitFor(principal),
            sweeps_->MaxRunsFor(principal)};
  }

 private:
  scheduler::Scheduler* const runs_;
  scheduler::SweepCore* const sweeps_;
  scheduler::AnalysisJobs* const jobs_;
};

std::string RandomEpoch() {
  std::random_device rd;
  std::ostringstream ss;
  ss << std::hex << rd() << rd();
  return ss.str();
}

// `s` with `what` before its message (OK stays OK).
absl::Status Annotate(const absl::Status& s, const std::string& what) {
  return s.ok() ? s : absl::Status(s.code(), what + ": " + std::string(s.message()));
}

// The listen rules of both fronts and the TLS files, before anything opens.
absl::Status CheckFronts(const FrontOptions& f, const security::Authenticator& auth) {
  const bool tls = f.tls.enabled();
  CL_RETURN_IF_ERROR(security::CheckListenAddress("--listen", f.listen, auth.open(), tls, f.insecure_plaintext));
  if (!f.http.listen.empty()) {
    CL_RETURN_IF_ERROR(security::CheckListenAddress("--http", f.http.listen, auth.open(), tls, f.insecure_plaintext));
  }
  if (tls) CL_RETURN_IF_ERROR(security::CheckTlsFiles(f.tls));
  if (!f.tls.client_ca.empty() && !tls) {
    return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
  }
  return absl::OkStatus();
}

// The pilots' defaults that depend on where this server runs.
absl::Status CompleteSlurmOptions(const ServerOptions& o, remote::SlurmOptions& s) {
  s.intra_op_threads = o.scheduler.intra_op_threads;
  if (s.log_dir.empty()) s.log_dir = (std::filesystem::absolute(o.data_dir) / "slurm-logs").string();
  if (s.worker_binary.empty()) {
    // Installed: beside this binary; in a build tree: build/worker/.
    const std::filesystem::path here = std::filesystem::read_symlink("/proc/self/exe").parent_path();
    for (const auto& p : {here / "circuitlab-worker", here.parent_path() / "worker" / "circuitlab-worker"}) {
      if (std::filesystem::exists(p)) {
        s.worker_binary = p.string();
        break;
      }
    }
    if (s.worker_binary.empty() && o.remote.executor == "slurm") {
      return absl::InvalidArgumentError("no circuitlab-worker beside this server (" + here.string() +
                                        "); pass --worker-binary as the nodes see it");
    }
  }
  if (s.server_address.empty()) {
    s.server_address = o.fronts.listen;
    if (s.server_address.rfind("0.0.0.0:", 0) == 0 || s.server_address.rfind("[::]:", 0) == 0) {
      char host[256] = {};
      gethostname(host, sizeof host - 1);
      s.server_address = std::string(host) + s.server_address.substr(s.server_address.rfind(':'));
    }
  }
  s.tls = o.fronts.tls.enabled();
  if (o.remote.executor != "slurm") return absl::OkStatus();
  std::error_code ec;
  std::filesystem::create_directories(s.log_dir, ec);
  if (ec) return absl::InvalidArgumentError("--slurm-log-dir " + s.log_dir + ": " + ec.message());
  if ((!o.tokens_file.empty() || !o.token_file.empty()) && s.token_file.empty()) {
    return absl::InvalidArgumentError(
        "--executor slurm on a server with tokens needs --worker-token-file "
        "(a principal with the worker role: scripts/add-principal.sh NAME worker)");
  }
  return absl::OkStatus();
}

// glibc's malloc, tuned once per process for a server that answers large
// buffers from many threads (issue 51 item 2). By default every thread that
// allocates gets an arena of its own (up to 8 per core), and glibc gives
// back little of a thread arena once it has grown: every HTTP pool thread
// that once answered a stored attention answer of 50 MB kept ~48 MB of it
// (malloc_trim does not trim a thread arena's top), so a few GETs on
// different threads held hundreds of MB. Two arenas (what MALLOC_ARENA_MAX=2
// gives; the environment variable still wins when set) keep that to one
// answer's worth: measured by HttpTest.ALargeStoredAnswerCostsAtMostThreeTimesItsSize.
void TuneMalloc() {
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr) ::mallopt(M_ARENA_MAX, 2);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Create(ServerOptions options) {
  TuneMalloc();
  ResponseBudget::Process().SetLimit(options.fronts.max_response_bytes);
  std::unique_ptr<Server> server(new Server());
  if (absl::Status s = server->Build(std::move(options)); !s.ok()) {
    server->Shutdown(std::chrono::milliseconds(0));
    return s;
  }
  return server;
}

absl::Status Server::Build(ServerOptions o) {
  if (o.auth != nullptr) {
    auth_ = o.auth;
  } else {
    absl::StatusOr<std::unique_ptr<security::Authenticator>> auth =
        security::Authenticator::Create(o.tokens_file, o.token_file, &quotas_);
    CL_RETURN_IF_ERROR(Annotate(auth.status(), "bad tokens"));
    own_auth_ = *std::move(auth);
    auth_ = own_auth_.get();
  }
  CL_RETURN_IF_ERROR(CheckFronts(o.fronts, *auth_));
  if (o.audit == nullptr && !o.audit_log.empty()) {
    absl::StatusOr<std::unique_ptr<security::AuditLog>> audit =
        security::AuditLog::Open(o.audit_log, o.audit_log_max_bytes);
    CL_RETURN_IF_ERROR(Annotate(audit.status(), "cannot open the audit log"));
    own_audit_ = *std::move(audit);
    o.audit = own_audit_.get();
  }
  engine::ConfigureRuntime(o.scheduler.intra_op_threads);
  absl::StatusOr<std::unique_ptr<store::Store>> store = store::Store::Open(o.data_dir);
  CL_RETURN_IF_ERROR(Annotate(store.status(), "cannot open --data " + o.data_dir));
  store_ = *std::move(store);

  scheduler::SchedulerOptions& opts = o.scheduler;
  torch_ = engine::DescribeTorchRuntime();
  opts.cuda_devices = o.use_cuda ? torch_.cuda_devices : 0;
  if (opts.cuda_devices > 0) engine::ConfigureCuda(o.cuda_deterministic);
  opts.cuda_memory_bytes = torch_.cuda_memory_bytes;
  if (opts.max_pack <= 0) opts.max_pack = opts.cuda_devices > 0 ? 8 : 1;
  if (opts.epoch.empty()) opts.epoch = RandomEpoch();
  if (opts.quotas == nullptr) opts.quotas = &quotas_;
  if (o.jobs.quotas == nullptr) o.jobs.quotas = opts.quotas;
  local_ = o.executor;
  if (local_ == nullptr) {
    local_executor_ = engine::MakeTorchExecutor();
    local_ = local_executor_.get();
  }
  CL_RETURN_IF_ERROR(BuildRemote(o));
  if (opts.cpu_slots + opts.cuda_devices + opts.remote_slots == 0) {
    return absl::InvalidArgumentError("no device slots: set --cpu-slots >= 1 or use CUDA");
  }
  engine::Executor* executor = broker_ ? broker_.get() : local_;
  engine::Analyzer* analyzer = o.analyzer;
  if (analyzer == nullptr) {
    own_analyzer_ = engine::MakeTorchAnalyzer();
    analyzer = own_analyzer_.get();
  }
  scheduler_ = std::make_unique<scheduler::Scheduler>(opts, store_.get(), executor, Clock::Real());
  if (broker_) broker_->SetWake([s = scheduler_.get()] { s->Wake(); });
  analysis_ = std::make_unique<scheduler::AnalysisCore>(store_.get(), analyzer, o.jobs, opts.limits);
  scheduler_->OnRunsDeleted([a = analysis_.get()](const std::vector<int64_t>& ids) { a->jobs().ForgetRuns(ids); });
  sweeps_ = std::make_unique<scheduler::SweepCore>(scheduler_.get(), store_.get(), analysis_.get(), o.max_sweep_runs,
                                                   opts.quotas);
  CL_RETURN_IF_ERROR(Annotate(scheduler_->Start(), "cannot start the scheduler"));
  started_ = true;
  reproductions_ = std::make_unique<reproduce::ReproductionCore>(store_.get(), scheduler_.get(), sweeps_.get(),
                                                                 analysis_.get(), o.reproductions);
  reproductions_->Start();  // resumes the unfinished ones
  if (o.remote.executor == "slurm") {
    // CPU pilots for the runs that do not ask for CUDA; with
    // --slurm-gpus-per-node, GPU pilots (job name <name>-gpu) for those that do.
    remote::WorkerBroker* b = broker_.get();
    auto demand = [s = scheduler_.get(), b](bool gpu) {
      return [=] { return s->QueuedRuns(gpu) + b->BusySlots(gpu); };
    };
    remote::SlurmOptions cpu = o.remote.slurm;
    cpu.gpus_per_node.clear();
    pool_ = std::make_unique<remote::SlurmPool>(cpu, remote::RunCommand, demand(false));
    CL_RETURN_IF_ERROR(Annotate(pool_->Start(), "cannot use Slurm"));
    if (!o.remote.slurm.gpus_per_node.empty()) {
      remote::SlurmOptions gpu = o.remote.slurm;
      gpu.job_name += "-gpu";
      // A node-sized GPU pilot would hold every GPU of its node and train
      // on the first: GPU pilots are sized by what they ask for instead.
      if (gpu.worker_slots == 0) gpu.worker_slots = 1;
      gpu_pool_ = std::make_unique<remote::SlurmPool>(gpu, remote::RunCommand, demand(true));
      CL_RETURN_IF_ERROR(Annotate(gpu_pool_->Start(), "cannot use Slurm"));
    }
  }
  options_ = o;
  return Serve(o);
}

absl::Status Server::BuildRemote(ServerOptions& o) {
  if (o.remote.executor == "local") return absl::OkStatus();
  remote::BrokerOptions b = o.remote.broker;
  b.version = o.version;
  b.by_device = o.remote.executor == "slurm" && !o.remote.slurm.gpus_per_node.empty();
  b.max_message_bytes = o.fronts.max_message_bytes;
  broker_ = std::make_unique<remote::WorkerBroker>(b, local_, Clock::Real());
  scheduler::SchedulerOptions& opts = o.scheduler;
  opts.remote = broker_.get();
  opts.max_lost_leases = o.remote.max_lost_leases;
  opts.remote_slots = o.remote.remote_slots > 0      ? o.remote.remote_slots
                      : o.remote.executor == "slurm"
                          ? o.remote.slurm.max_workers * (o.remote.slurm.worker_slots > 0
                                                              ? o.remote.slurm.worker_slots
                                                              : remote::SlurmOptions::kMaxWorkerSlots)
                                                     : 64;
  // GPU pilots' slots, for the runs that ask for CUDA (a GPU pilot has
  // --slurm-worker-slots of them, 1 when that is 0).
  opts.remote_gpu_slots = b.by_device ? o.remote.slurm.max_workers * std::max(1, o.remote.slurm.worker_slots) : 0;
  opts.cpu_slots = opts.cuda_devices = 0;  // runs train on the workers
  return CompleteSlurmOptions(o, o.remote.slurm);
}

absl::Status Server::Serve(const ServerOptions& o) {
  const FrontOptions& f = o.fronts;
  telemetry_ = std::make_unique<telemetry::Telemetry>(
      telemetry::TelemetrySources{scheduler_.get(), &analysis_->jobs(), broker_.get(), o.version, o.remote.executor});
  security::SecurityOptions sec;
  sec.private_runs = f.private_runs;
  if (!f.tls.enabled() && !security::IsLoopbackAddress(f.listen)) {
    sec.plaintext_warning = "this server listens on " + f.listen +
                            " without TLS (--insecure-plaintext): tokens and data cross the network in clear";
  }
  v1::ServerInfo& info = sec.server_info;
  info.set_version(o.version);
  info.set_torch_version(torch_.version);
  info.set_cuda_runtime(torch_.cuda_runtime);
  info.set_cuda_devices(static_cast<uint32_t>(o.scheduler.cuda_devices));
  for (const std::string& slot : scheduler_->device_slots()) info.add_device_slots(slot);
  directory_ = std::make_unique<CoreDirectory>(scheduler_.get(), sweeps_.get(), &analysis_->jobs());
  security_ = std::make_unique<security::Security>(auth_, o.audit, directory_.get(), std::move(sec));

  rpc::GrpcOptions g{f.listen, f.max_message_bytes, f.tls, f.health_listen, o.remote.executor};
  CL_ASSIGN_OR_RETURN(
      grpc_, rpc::GrpcServer::Start(g, {security_.get(), auth_, scheduler_.get(), analysis_.get(), sweeps_.get(),
                                        broker_.get(), telemetry_.get(), reproductions_.get()}));
  if (f.http.listen.empty()) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<http::HttpGateway>> gateway = http::HttpGateway::Start(
      f.http, f.tls,
      {security_.get(), scheduler_.get(), sweeps_.get(), analysis_.get(), telemetry_.get(), reproductions_.get()});
  if (gateway.ok()) {
    http_ = std::move(*gateway);
  } else if (absl::IsUnavailable(gateway.status()) && !f.http.required) {
    spdlog::warn("no dashboard/HTTP port: {} (pass --http HOST:PORT to choose another, --http '' for none)",
                 std::string(gateway.status().message()));
  } else {
    return gateway.status();
  }
  return absl::OkStatus();
}

Server::~Server() {
  if (!shut_down_) Shutdown(std::chrono::milliseconds(0));
}

void Server::Announce() const {
  const ServerOptions& o = options_;
  std::string slots;
  for (const std::string& s : scheduler_->device_slots()) slots += (slots.empty() ? "" : ",") + s;
  spdlog::info("{}{}", torch_.Describe(),
               torch_.cuda_devices > 0 && !o.use_cuda ? ": not used (--no-cuda)"
               : torch_.cuda_devices > 0 && broker_   ? ": not used (runs train on remote workers)"
               : !torch_.cuda_runtime.empty() && torch_.cuda_devices == 0
                   ? ": no CUDA device or driver found, runs train on the CPU slots"
                   : "");
  const security::TlsFiles& tls = o.fronts.tls;
  spdlog::info("circuitlab-server listening on {} (port {}, {}), data {}, devices [{}], {} analysis worker(s)",
               o.fronts.listen, port(), tls.enabled() ? (tls.client_ca.empty() ? "TLS" : "mutual TLS") : "plaintext",
               o.data_dir, slots, o.jobs.workers);
  if (auth_->open()) {
    spdlog::info("no tokens configured: every caller is the principal 'local' (admin); loopback only");
  } else {
    spdlog::info("{} principal(s) from {}", auth_->principal_count(),
                 o.tokens_file.empty() ? o.token_file : o.tokens_file);
  }
  if (!security_->plaintext_warning().empty()) spdlog::warn("{}", security_->plaintext_warning());
  if (health_port() > 0) {
    spdlog::info("health alone (plaintext, no token) on {} (port {})", o.fronts.health_listen, health_port());
  }
  if (http_port() > 0) {
    spdlog::info("dashboard: {}  (JSON API {}api/v1, Prometheus {}metrics)", http_url(), http_url(), http_url());
  }
  // Machine-readable lines for scripts and tests that start us on port 0:
  // the gRPC port first, then the HTTP port when there is one.
  std::printf("listening port=%d\n", port());
  if (http_port() > 0) std::printf("http port=%d url=%s\n", http_port(), http_url().c_str());
  std::fflush(stdout);
}

void Server::ReloadTokens() {
  if (auth_->open() || own_auth_ == nullptr) {
    spdlog::info("SIGHUP: no tokens file to re-read");
  } else if (absl::Status s = own_auth_->Reload(); s.ok()) {
    spdlog::info("SIGHUP: re-read the tokens: {} principal(s); {} open stream(s) of revoked tokens ended",
                 auth_->principal_count(), RevalidateStreams());
  } else {
    spdlog::error("SIGHUP: the tokens file was not re-read, the principals stay as they were: {}",
                  std::string(s.message()));
  }
}

void Server::MarkNotServing() {
  if (http_) http_->MarkNotReady();
  if (grpc_) grpc_->MarkNotServing();
}

void Server::Shutdown(std::chrono::milliseconds grace) {
  if (shut_down_) return;
  shut_down_ = true;
  MarkNotServing();
  if (reproductions_) reproductions_->Shutdown();  // stays stored; resumes at the next start
  if (analysis_) analysis_->Shutdown();  // queued analyses end at once, running ones at their next forward pass
  if (started_) scheduler_->Drain();     // remote workers checkpoint their runs over their streams, still open
  if (pool_) pool_->Stop();
  if (gpu_pool_) gpu_pool_->Stop();
  if (http_) http_->Shutdown();  // its event streams end first
  if (grpc_) grpc_->Shutdown(grace);
}

}  // namespace circuitlab::app
