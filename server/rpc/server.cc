#include "server/rpc/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/security/server_credentials.h>
#include <spdlog/spdlog.h>

#include "server/rpc/analysis_service.h"
#include "server/rpc/experiment_service.h"
#include "server/rpc/security.h"
#include "server/rpc/service_util.h"
#include "server/rpc/worker_service.h"

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

namespace {

bool IsReflectionPath(std::string_view path) { return path.rfind("/grpc.reflection.", 0) == 0; }

// Runs on the transport for every call on a TLS or local port, before any
// handler: refuses reflection without a valid token. (The services check
// tokens themselves; health stays open.)
class ReflectionGuard final : public grpc::AuthMetadataProcessor {
 public:
  explicit ReflectionGuard(const Authenticator* auth) : auth_(auth) {}
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& md, grpc::AuthContext*, OutputMetadata*, OutputMetadata*) override {
    auto path = md.find(":path");
    if (path == md.end() || !IsReflectionPath(std::string_view(path->second.data(), path->second.size()))) {
      return grpc::Status::OK;
    }
    auto token = md.find("authorization");
    absl::StatusOr<Principal> who = auth_->Resolve(
        token == md.end() ? std::string_view() : std::string_view(token->second.data(), token->second.size()));
    return who.ok() ? grpc::Status::OK : ToGrpcStatus(who.status());
  }

 private:
  const Authenticator* const auth_;
};

// Server reflection on this builder, or not. Linking gRPC's reflection
// library registers its plugin for every builder of the process (a static
// initializer); this option keeps exactly one, or removes it.
class ReflectionOption final : public grpc::ServerBuilderOption {
 public:
  explicit ReflectionOption(bool serve) : serve_(serve) {}
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    grpc::reflection::ProtoServerReflectionPlugin probe;
    const std::string name = probe.name();
    std::erase_if(*plugins, [&](const std::unique_ptr<grpc::ServerBuilderPlugin>& p) { return p->name() == name; });
    if (serve_) plugins->push_back(std::make_unique<grpc::reflection::ProtoServerReflectionPlugin>());
  }

 private:
  const bool serve_;
};

// The health-only port's one service besides health: every other method is
// UNIMPLEMENTED. (A gRPC server needs one callback service to poll its
// completion queue; the built-in health service alone is not one.)
class NothingElse final : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    class Refuse : public grpc::ServerGenericBidiReactor {
     public:
      Refuse() { Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "this port serves grpc.health.v1 only")); }
      void OnDone() override { delete this; }
    };
    return new Refuse();
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(const ServerOptions& options, const Authenticator* auth,
                                                              AuditLog* audit, scheduler::Scheduler* experiments,
                                                              scheduler::AnalysisCore* analysis,
                                                              scheduler::SweepCore* sweeps,
                                                              scheduler::WorkerBroker* workers, Telemetry* telemetry) {
  const bool loopback = IsLoopbackAddress(options.listen);
  const bool tls = options.tls.enabled();
  if (!loopback && auth->open()) {
    return absl::InvalidArgumentError("--listen " + options.listen +
                                      " is not a loopback address: listening beyond this machine requires "
                                      "--auth-tokens-file (or --auth-token-file)");
  }
  if (!loopback && !tls && !options.insecure_plaintext) {
    return absl::InvalidArgumentError("--listen " + options.listen +
                                      " is not a loopback address: listening beyond this machine requires TLS "
                                      "(--tls-cert FILE --tls-key FILE; scripts/dev-certs.sh makes test ones), or "
                                      "--insecure-plaintext to send tokens and data in clear");
  }
  if (!options.http.listen.empty() && !IsLoopbackAddress(options.http.listen)) {
    if (auth->open()) {
      return absl::InvalidArgumentError("--http " + options.http.listen +
                                        " is not a loopback address: serving the dashboard and API beyond this "
                                        "machine requires --auth-tokens-file (or --auth-token-file)");
    }
    if (!tls && !options.insecure_plaintext) {
      return absl::InvalidArgumentError("--http " + options.http.listen +
                                        " is not a loopback address: it requires TLS (--tls-cert/--tls-key, used "
                                        "for HTTPS too), or --insecure-plaintext");
    }
  }
  if (tls) CL_RETURN_IF_ERROR(CheckTlsFiles(options.tls));
  if (!options.tls.client_ca.empty() && !tls) {
    return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
  }
  const bool plaintext_beyond_loopback = !loopback && !tls;
  SecurityOptions security;
  security.private_runs = options.private_runs;
  if (plaintext_beyond_loopback) {
    security.plaintext_warning = "this server listens on " + options.listen +
                                 " without TLS (--insecure-plaintext): tokens and data cross the network in clear";
  }

  v1::ServerInfo& info = security.server_info;
  info.set_version(options.runtime.version);
  info.set_torch_version(options.runtime.torch_version);
  info.set_cuda_runtime(options.runtime.cuda_runtime);
  info.set_cuda_devices(static_cast<uint32_t>(options.runtime.cuda_devices));
  for (const std::string& slot : options.runtime.device_slots) info.add_device_slots(slot);

  std::unique_ptr<GrpcServer> server(new GrpcServer());
  server->security_ = std::make_unique<Security>(auth, audit, experiments, sweeps, &analysis->jobs(), security);
  server->experiments_ = std::make_unique<ExperimentServiceImpl>(experiments, sweeps, server->security_.get());
  server->analysis_ = std::make_unique<AnalysisServiceImpl>(analysis, server->security_.get());
  server->workers_ =
      std::make_unique<WorkerServiceImpl>(workers, experiments, options.executor, server->security_.get());
  grpc::EnableDefaultHealthCheckService(true);

  std::shared_ptr<grpc::ServerCredentials> credentials = tls ? TlsServerCredentials(options.tls)
                                                         : loopback
                                                             ? grpc::experimental::LocalServerCredentials(LOCAL_TCP)
                                                             : grpc::InsecureServerCredentials();
  // Reflection is guarded on the transport; a plaintext port beyond loopback
  // has no such hook, so there it is served only on an open server (which
  // cannot listen there) - i.e. never.
  if (!auth->open() && !plaintext_beyond_loopback) {
    credentials->SetAuthMetadataProcessor(std::make_shared<ReflectionGuard>(auth));
  }
  grpc::ServerBuilder builder;
  builder.SetOption(std::make_unique<ReflectionOption>(auth->open() || !plaintext_beyond_loopback));
  builder.AddListeningPort(options.listen, credentials, &server->port_);
  builder.RegisterService(server->experiments_.get());
  builder.RegisterService(server->analysis_.get());
  builder.RegisterService(server->workers_.get());
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  if (telemetry != nullptr) {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
    interceptors.push_back(telemetry->InterceptorFactory());
    builder.experimental().SetInterceptorCreators(std::move(interceptors));
  }
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError("cannot listen on " + options.listen + " (address in use or invalid)");
  }
  // Health answers for the server as a whole ("") and for each service by
  // its full name, as gRPC's health convention has clients ask (issue 32 item
  // 10); draining turns all of them NOT_SERVING.
  std::vector<std::string> services = {v1::ExperimentService::service_full_name(),
                                       v1::AnalysisService::service_full_name()};
  if (workers != nullptr) services.push_back(v1::WorkerService::service_full_name());
  auto serving = [&services](grpc::Server& s) {
    for (const std::string& name : services) s.GetHealthCheckService()->SetServingStatus(name, true);
    s.GetHealthCheckService()->SetServingStatus(true);
  };
  serving(*server->server_);
  if (!options.health_listen.empty()) {
    grpc::ServerBuilder health;
    health.SetOption(std::make_unique<ReflectionOption>(false));
    server->nothing_else_ = std::make_unique<NothingElse>();
    health.RegisterCallbackGenericService(server->nothing_else_.get());
    health.AddListeningPort(options.health_listen, grpc::InsecureServerCredentials(), &server->health_port_);
    server->health_server_ = health.BuildAndStart();
    if (server->health_server_ == nullptr || server->health_port_ == 0) {
      return absl::UnavailableError("cannot listen on --health-listen " + options.health_listen +
                                    " (address in use or invalid)");
    }
    serving(*server->health_server_);
  }
  if (!options.http.listen.empty()) {
    absl::StatusOr<std::unique_ptr<HttpGateway>> http = HttpGateway::Start(
        options.http, options.tls, {server->security_.get(), experiments, sweeps, analysis, telemetry});
    if (http.ok()) {
      server->http_ = std::move(*http);
    } else if (absl::IsUnavailable(http.status()) && !options.http.required) {
      spdlog::warn("no dashboard/HTTP port: {} (pass --http HOST:PORT to choose another, --http '' for none)",
                   std::string(http.status().message()));
    } else {
      return http.status();
    }
  }
  return server;
}

GrpcServer::~GrpcServer() {
  if (server_) Shutdown(std::chrono::milliseconds(0));
}

void GrpcServer::MarkNotServing() {
  if (http_) http_->MarkNotReady();
  if (server_) server_->GetHealthCheckService()->SetServingStatus(false);
  if (health_server_) health_server_->GetHealthCheckService()->SetServingStatus(false);
}

void GrpcServer::Shutdown(std::chrono::milliseconds grace) {
  if (http_) {
    http_->Shutdown();  // its event streams end first
    http_.reset();
  }
  if (!server_) return;
  server_->GetHealthCheckService()->SetServingStatus(false);
  if (health_server_) {
    health_server_->GetHealthCheckService()->SetServingStatus(false);
    health_server_->Shutdown(std::chrono::system_clock::now());
    health_server_->Wait();
    health_server_.reset();
  }
  server_->Shutdown(std::chrono::system_clock::now() + grace);
  server_->Wait();
  server_.reset();
}

}  // namespace circuitlab::rpc
