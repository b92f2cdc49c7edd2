#include "server/rpc/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "server/rpc/analysis_service.h"
#include "server/rpc/experiment_service.h"

namespace circuitlab::rpc {

bool IsLoopbackAddress(const std::string& host_port) {
  std::string host = host_port;
  if (!host.empty() && host[0] == '[') {
    host = host.substr(1, host.find(']') - 1);
  } else if (auto colon = host.rfind(':'); colon != std::string::npos) {
    host.resize(colon);
  }
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(const ServerOptions& options,
                                                              scheduler::Scheduler* experiments,
                                                              scheduler::AnalysisCore* analysis,
                                                              scheduler::SweepCore* sweeps) {
  if (!IsLoopbackAddress(options.listen) && options.auth_token.empty()) {
    return absl::InvalidArgumentError("--listen " + options.listen +
                                      " is not a loopback address: listening beyond this machine requires "
                                      "--auth-token-file");
  }
  std::unique_ptr<GrpcServer> server(new GrpcServer());
  server->experiments_ = std::make_unique<ExperimentServiceImpl>(experiments, sweeps, options.auth_token);
  server->analysis_ = std::make_unique<AnalysisServiceImpl>(analysis, options.auth_token);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &server->port_);
  builder.RegisterService(server->experiments_.get());
  builder.RegisterService(server->analysis_.get());
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError("cannot listen on " + options.listen + " (address in use or invalid)");
  }
  server->server_->GetHealthCheckService()->SetServingStatus(true);
  return server;
}

GrpcServer::~GrpcServer() {
  if (server_) Shutdown(std::chrono::milliseconds(0));
}

void GrpcServer::MarkNotServing() {
  if (server_) server_->GetHealthCheckService()->SetServingStatus(false);
}

void GrpcServer::Shutdown(std::chrono::milliseconds grace) {
  if (!server_) return;
  server_->GetHealthCheckService()->SetServingStatus(false);
  server_->Shutdown(std::chrono::system_clock::now() + grace);
  server_->Wait();
  server_.reset();
}

}  // namespace circuitlab::rpc
