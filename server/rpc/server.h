// The gRPC front end: ExperimentService over the scheduler, plus the standard
// health service and server reflection. Handlers are thin adapters: check
// auth, call the core, convert the status (one place: ToGrpcStatus).
//
// Listening beyond loopback requires an auth token: every call must then carry
// `authorization: Bearer <token>` (health checks and reflection excepted).
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/scheduler/analysis_core.h"
#include "server/scheduler/scheduler.h"
#include "server/scheduler/sweeps.h"

namespace grpc {
class Server;
class Service;
}  // namespace grpc

namespace circuitlab::rpc {

struct ServerOptions {
  std::string listen = "127.0.0.1:50051";  // host:port; port 0 picks a free one
  std::string auth_token;                   // empty = no auth (loopback only)
  int max_message_bytes = 4 << 20;          // largest request accepted
};

// True for 127.0.0.0/8, ::1 and "localhost" listen addresses.
bool IsLoopbackAddress(const std::string& host_port);

class GrpcServer {
 public:
  // Binds and starts serving. InvalidArgument for a non-loopback address
  // without a token; Unavailable when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(const ServerOptions& options,
                                                           scheduler::Scheduler* experiments,
                                                           scheduler::AnalysisCore* analysis,
                                                           scheduler::SweepCore* sweeps);
  ~GrpcServer();

  // The port actually bound (useful with port 0).
  int port() const { return port_; }
  // Health checks answer NOT_SERVING from now on (calls still work).
  void MarkNotServing();
  // Health goes NOT_SERVING; new calls are refused; in-flight calls get
  // `grace` to finish, then are cancelled.
  void Shutdown(std::chrono::milliseconds grace);

 private:
  GrpcServer() = default;
  std::unique_ptr<grpc::Service> experiments_;
  std::unique_ptr<grpc::Service> analysis_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace circuitlab::rpc
