// The gRPC front end: ExperimentService and AnalysisService over the cores,
// plus the standard health service and server reflection. Handlers are thin
// adapters: authenticate, check access, call the core, convert the status
// (one place: ToGrpcStatus).
//
// Transport: TLS with --tls-cert/--tls-key (tls.h); on a loopback address
// without them, gRPC's local credentials (plaintext on the wire, but the
// peer must be on this machine). Listening beyond loopback requires tokens
// and TLS; --insecure-plaintext waives TLS (never tokens), with a warning.
// Health answers without a token (container and Kubernetes probes);
// reflection needs one whenever tokens are configured.
//
// Beside it, on --http, the HTTP front end (http_gateway.h: JSON, events, the
// dashboard, /metrics) over the same cores and Security, under the same
// loopback/TLS/token rules, with the same certificate.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/rpc/audit.h"
#include "server/rpc/auth.h"
#include "server/rpc/http_gateway.h"
#include "server/rpc/telemetry.h"
#include "server/rpc/tls.h"
#include "server/scheduler/analysis_core.h"
#include "server/scheduler/scheduler.h"
#include "server/scheduler/sweeps.h"
#include "server/scheduler/workers.h"

namespace grpc {
class CallbackGenericService;
class Server;
class Service;
}  // namespace grpc

namespace circuitlab::rpc {

class Security;

struct ServerOptions {
  std::string listen = "127.0.0.1:50051";   // host:port; port 0 picks a free one
  int max_message_bytes = 4 << 20;          // largest request accepted
  TlsFiles tls;                             // no cert = plaintext
  bool insecure_plaintext = false;          // allow plaintext beyond loopback
  bool private_runs = false;                // users read only their own runs
  // A second, plaintext port serving only grpc.health.v1 (no data, no
  // token), for probes that cannot speak TLS (Kubernetes' gRPC probes).
  // Empty = none.
  std::string health_listen;
  std::string executor = "local";  // where runs train (ListWorkers says so)
  HttpOptions http;                // http.listen empty = no HTTP port
  // What WhoAmI reports the server runs on (v1::ServerInfo's fields).
  struct Runtime {
    std::string version, torch_version, cuda_runtime;
    int cuda_devices = 0;
    std::vector<std::string> device_slots;
  } runtime;
};

// True for 127.0.0.0/8, ::1 and "localhost" listen addresses.
bool IsLoopbackAddress(const std::string& host_port);

class GrpcServer {
 public:
  // Binds and starts serving. InvalidArgument for a non-loopback address
  // without tokens, or without TLS unless insecure_plaintext, and for TLS
  // files that do not load; Unavailable when the address cannot be bound.
  // Every pointer must outlive the server; `audit` may be null, and so may
  // `workers` (then WorkerService is not served: no remote executor).
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(const ServerOptions& options, const Authenticator* auth,
                                                           AuditLog* audit, scheduler::Scheduler* experiments,
                                                           scheduler::AnalysisCore* analysis,
                                                           scheduler::SweepCore* sweeps,
                                                           scheduler::WorkerBroker* workers = nullptr,
                                                           Telemetry* telemetry = nullptr);
  ~GrpcServer();

  // The port actually bound (useful with port 0); the health port's (0 = none).
  int port() const { return port_; }
  int health_port() const { return health_port_; }
  // The HTTP port and the dashboard's URL (0 and "" without --http).
  int http_port() const { return http_ ? http_->port() : 0; }
  std::string http_url() const { return http_ ? http_->url() : ""; }
  // Health checks answer NOT_SERVING from now on (calls still work).
  void MarkNotServing();
  // After the tokens were re-read: ends the streams (gRPC, HTTP, workers)
  // whose token no longer names the same principal and role; how many.
  int RevalidateStreams() { return security_->RevalidateStreams(); }
  // Health goes NOT_SERVING; new calls are refused; in-flight calls get
  // `grace` to finish, then are cancelled.
  void Shutdown(std::chrono::milliseconds grace);

 private:
  GrpcServer() = default;
  std::unique_ptr<Security> security_;
  std::unique_ptr<grpc::Service> experiments_;
  std::unique_ptr<grpc::Service> analysis_;
  std::unique_ptr<grpc::Service> workers_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::CallbackGenericService> nothing_else_;  // the health port's other methods
  std::unique_ptr<grpc::Server> health_server_;                 // --health-listen
  std::unique_ptr<HttpGateway> http_;                           // --http
  int port_ = 0;
  int health_port_ = 0;
};

}  // namespace circuitlab::rpc
