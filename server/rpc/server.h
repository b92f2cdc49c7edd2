// The gRPC front end: ExperimentService, AnalysisService and WorkerService
// over the cores, plus the standard health service and server reflection.
// Handlers are thin adapters: authenticate, check access, call the core,
// convert the status (one place: ToGrpcStatus).
//
// Transport: TLS with the files of GrpcOptions::tls (watched: replaced
// certificates apply to new connections); on a loopback address without
// them, gRPC's local credentials (plaintext on the wire, but the peer must be
// on this machine); elsewhere plaintext, which only an --insecure-plaintext
// server reaches (app::Server checks the listen rules before this starts).
// Health answers without a token (container and Kubernetes probes);
// reflection needs one whenever tokens are configured.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/remote/workers.h"
#include "server/reproduce/reproductions.h"
#include "server/rpc/service_util.h"
#include "server/scheduler/analysis_core.h"
#include "server/scheduler/scheduler.h"
#include "server/scheduler/sweeps.h"
#include "server/security/security.h"
#include "server/security/tls.h"
#include "server/telemetry/telemetry.h"

namespace grpc {
class CallbackGenericService;
class Server;
class Service;
}  // namespace grpc

namespace circuitlab::rpc {

struct GrpcOptions {
  std::string listen = "127.0.0.1:50051";  // host:port; port 0 picks a free one
  int max_message_bytes = 4 << 20;         // largest request accepted
  security::TlsFiles tls;                  // no cert = no TLS
  // A second, plaintext port serving only grpc.health.v1 (no data, no
  // token), for probes that cannot speak TLS (Kubernetes' gRPC probes).
  // Empty = none.
  std::string health_listen;
  std::string executor = "local";  // where runs train (ListWorkers says so)
};

// What the services call. Every pointer must outlive the server; `workers`
// is null on --executor local (WorkerService then refuses sessions) and
// `telemetry` may be null (calls are then not counted).
struct GrpcCores {
  const security::Security* security = nullptr;
  const security::Authenticator* auth = nullptr;  // guards reflection
  scheduler::Scheduler* runs = nullptr;
  scheduler::AnalysisCore* analysis = nullptr;
  scheduler::SweepCore* sweeps = nullptr;
  remote::WorkerBroker* workers = nullptr;
  telemetry::Telemetry* telemetry = nullptr;
  reproduce::ReproductionCore* reproductions = nullptr;  // null: ReproductionService is not served
};

class GrpcServer {
 public:
  // Binds and starts serving; Unavailable when an address cannot be bound.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(const GrpcOptions& options, GrpcCores cores);
  ~GrpcServer();

  // The port actually bound (useful with port 0); the health port's (0 = none).
  int port() const { return port_; }
  int health_port() const { return health_port_; }
  // Health checks answer NOT_SERVING from now on (calls still work).
  void MarkNotServing();
  // Health goes NOT_SERVING; new calls are refused; in-flight calls get
  // `grace` to finish, then are cancelled.
  void Shutdown(std::chrono::milliseconds grace);

 private:
  GrpcServer() = default;
  // Before the services and the server: destroyed after them (the server's
  // shutdown waits for the calls it runs).
  std::unique_ptr<SlowCalls> slow_;
  std::unique_ptr<grpc::Service> experiments_;
  std::unique_ptr<grpc::Service> analysis_;
  std::unique_ptr<grpc::Service> workers_;
  std::unique_ptr<grpc::Service> reproductions_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::CallbackGenericService> nothing_else_;  // the health port's other methods
  std::unique_ptr<grpc::Server> health_server_;                 // --health-listen
  int port_ = 0;
  int health_port_ = 0;
};

}  // namespace circuitlab::rpc
