#include "server/rpc/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <grpcpp/support/server_interceptor.h>
#include <spdlog/spdlog.h>

#include "server/rpc/analysis_service.h"
#include "server/rpc/experiment_service.h"
#include "server/rpc/reproduction_service.h"
#include "server/rpc/service_util.h"
#include "server/rpc/worker_service.h"

namespace circuitlab::rpc {

namespace {

// StartReproduction and SubmitSweep at once (SlowCalls), and how many may wait.
constexpr int kSlowCallThreads = 2;
constexpr size_t kMaxSlowCallsWaiting = 64;

bool IsReflectionPath(std::string_view path) { return path.rfind("/grpc.reflection.", 0) == 0; }

// Runs on the transport for every call on a TLS or local port, before any
// handler: refuses reflection without a valid token. (The services check
// tokens themselves; health stays open.)
class ReflectionGuard final : public grpc::AuthMetadataProcessor {
 public:
  explicit ReflectionGuard(const security::Authenticator* auth) : auth_(auth) {}
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& md, grpc::AuthContext*, OutputMetadata*, OutputMetadata*) override {
    auto path = md.find(":path");
    if (path == md.end() || !IsReflectionPath(std::string_view(path->second.data(), path->second.size()))) {
      return grpc::Status::OK;
    }
    auto token = md.find("authorization");
    absl::StatusOr<security::Principal> who = auth_->Resolve(
        token == md.end() ? std::string_view() : std::string_view(token->second.data(), token->second.size()));
    return who.ok() ? grpc::Status::OK : ToGrpcStatus(who.status());
  }

 private:
  const security::Authenticator* const auth_;
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

// Server credentials that watch `files` (security::CheckTlsFiles them first).
std::shared_ptr<grpc::ServerCredentials> TlsServerCredentials(const security::TlsFiles& files) {
  namespace ex = grpc::experimental;
  std::shared_ptr<ex::CertificateProviderInterface> provider =
      files.client_ca.empty()
          ? std::make_shared<ex::FileWatcherCertificateProvider>(files.key, files.cert, files.reload_seconds)
          : std::make_shared<ex::FileWatcherCertificateProvider>(files.key, files.cert, files.client_ca,
                                                                 files.reload_seconds);
  ex::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (files.client_ca.empty()) {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return ex::TlsServerCredentials(options);
}

// Counts every call by (service, method, code) and times unary ones.
class CountingInterceptor final : public grpc::experimental::Interceptor {
 public:
  CountingInterceptor(telemetry::Telemetry* telemetry, grpc::experimental::ServerRpcInfo* info)
      : telemetry_(telemetry),
        method_(info->method() ? info->method() : ""),
        unary_(info->type() == grpc::experimental::ServerRpcInfo::Type::UNARY),
        started_(std::chrono::steady_clock::now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
      telemetry_->ObserveRpc(method_, methods->GetSendStatus().error_code(), seconds, unary_);
    }
    methods->Proceed();
  }

 private:
  telemetry::Telemetry* const telemetry_;
  const std::string method_;
  const bool unary_;
  const std::chrono::steady_clock::time_point started_;
};

class CountingFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CountingFactory(telemetry::Telemetry* telemetry) : telemetry_(telemetry) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    return new CountingInterceptor(telemetry_, info);
  }

 private:
  telemetry::Telemetry* const telemetry_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(const GrpcOptions& options, GrpcCores cores) {
  const bool loopback = security::IsLoopbackAddress(options.listen);
  const bool tls = options.tls.enabled();
  const bool plaintext_beyond_loopback = !loopback && !tls;
  const security::Authenticator* auth = cores.auth;
  std::unique_ptr<GrpcServer> server(new GrpcServer());
  server->slow_ = std::make_unique<SlowCalls>(kSlowCallThreads, kMaxSlowCallsWaiting);
  server->experiments_ =
      std::make_unique<ExperimentServiceImpl>(cores.runs, cores.sweeps, cores.security, server->slow_.get());
  server->analysis_ = std::make_unique<AnalysisServiceImpl>(cores.analysis, cores.security);
  if (cores.reproductions != nullptr) {
    server->reproductions_ =
        std::make_unique<ReproductionServiceImpl>(cores.reproductions, cores.security, server->slow_.get());
  }
  server->workers_ = std::make_unique<WorkerServiceImpl>(cores.workers, cores.runs, options.executor, cores.security);
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
  if (server->reproductions_) builder.RegisterService(server->reproductions_.get());
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  if (cores.telemetry != nullptr) {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
    interceptors.push_back(std::make_unique<CountingFactory>(cores.telemetry));
    builder.experimental().SetInterceptorCreators(std::move(interceptors));
  }
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError("cannot listen on " + options.listen + " (address in use or invalid)");
  }
  // Health answers for the server as a whole ("") and for each service by
  // its full name, as gRPC's health convention has clients ask (issue 32 item
  // 10); draining turns all of them NOT_SERVING.
  // Every registered service answers (issue 51 item 12): WorkerService is
  // NOT_SERVING on a server without remote workers (its calls are refused).
  std::vector<std::pair<std::string, bool>> services = {{v1::ExperimentService::service_full_name(), true},
                                                        {v1::AnalysisService::service_full_name(), true},
                                                        {v1::WorkerService::service_full_name(), cores.workers != nullptr}};
  if (server->reproductions_) services.emplace_back(v1::ReproductionService::service_full_name(), true);
  auto serving = [&services](grpc::Server& s) {
    // The overall status first: SetServingStatus(bool) sets every service's.
    s.GetHealthCheckService()->SetServingStatus(true);
    for (const auto& [name, up] : services) s.GetHealthCheckService()->SetServingStatus(name, up);
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
  return server;
}

GrpcServer::~GrpcServer() {
  if (server_) Shutdown(std::chrono::milliseconds(0));
}

void GrpcServer::MarkNotServing() {
  if (server_) server_->GetHealthCheckService()->SetServingStatus(false);
  if (health_server_) health_server_->GetHealthCheckService()->SetServingStatus(false);
}

void GrpcServer::Shutdown(std::chrono::milliseconds grace) {
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
