#include "client/lib/client.h"

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/client_unary_call.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "circuitlab/v1/analysis_service.grpc.pb.h"
#include "circuitlab/v1/experiment_service.grpc.pb.h"
#include "circuitlab/v1/reproduce.grpc.pb.h"
#include "circuitlab/v1/worker_service.grpc.pb.h"
#include "client/lib/channel.h"
#include "server/common/analysis_names.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace circuitlab::client {
namespace {

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

std::string DefaultClientName() {
  const char* user = std::getenv("USER");
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return std::string(user ? user : "user") + "@" + host;
}

}  // namespace

absl::StatusOr<v1::ExperimentSpec> ParseSpecJson(const std::string& json) {
  v1::ExperimentSpec spec;
  google::protobuf::util::JsonParseOptions opts;
  opts.ignore_unknown_fields = false;
  auto status = google::protobuf::util::JsonStringToMessage(json, &spec, opts);
  if (!status.ok()) {
    return absl::InvalidArgumentError("spec is not a valid circuitlab.v1.ExperimentSpec: " +
                                      std::string(status.message()));
  }
  return spec;
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError("cannot read " + path);
  std::string text(max_bytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > max_bytes) {
    return absl::InvalidArgumentError(path + " is larger than " + std::to_string(max_bytes >> 20) +
                                      " MiB; a spec or request file is a few KiB of JSON");
  }
  return text;
}

absl::StatusOr<v1::ExperimentSpec> ReadSpecFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadTextFile(path);
  if (!text.ok()) return text.status();
  auto spec = ParseSpecJson(*text);
  if (!spec.ok()) return absl::InvalidArgumentError(path + ": " + std::string(spec.status().message()));
  return spec;
}

absl::Status ReadJsonFile(const std::string& path, google::protobuf::Message* message) {
  absl::StatusOr<std::string> text = ReadTextFile(path);
  if (!text.ok()) return text.status();
  google::protobuf::util::JsonParseOptions opts;
  opts.ignore_unknown_fields = false;
  auto status = google::protobuf::util::JsonStringToMessage(*text, message, opts);
  if (!status.ok()) {
    return absl::InvalidArgumentError(path + " is not a valid " + message->GetTypeName() + ": " +
                                      std::string(status.message()));
  }
  return absl::OkStatus();
}

std::string ToJson(const google::protobuf::Message& message, bool pretty) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = pretty;
  opts.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(message, &out, opts).ok()) return "{}";
  return out;
}

struct Client::Impl {
  ClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::ExperimentService::Stub> stub;
  std::unique_ptr<v1::AnalysisService::Stub> analysis;
  std::unique_ptr<grpc::health::v1::Health::Stub> health;
  std::unique_ptr<v1::WorkerService::Stub> workers;
  std::unique_ptr<v1::ReproductionService::Stub> reproductions;

  void Prepare(grpc::ClientContext& ctx, bool deadline) const {
    if (deadline) ctx.set_deadline(std::chrono::system_clock::now() + options.timeout);
    if (options.wait_for_ready) ctx.set_wait_for_ready(true);
    if (!options.token.empty()) ctx.AddMetadata("authorization", "Bearer " + options.token);
    ctx.AddMetadata("x-circuitlab-client", options.client_name);
  }

  // One unary call with the deadline and metadata.
  template <typename Stub, typename Req, typename Resp>
  absl::StatusOr<Resp> Call(Stub* s, grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&, Resp*),
                            const Req& req) {
    grpc::ClientContext ctx;
    Prepare(ctx, true);
    Resp resp;
    grpc::Status status = (s->*method)(&ctx, req, &resp);
    if (!status.ok()) return FromGrpc(status);
    return resp;
  }
};

Client::Client(const ClientOptions& options) : impl_(std::make_unique<Impl>()) {
  impl_->options = options;
  if (impl_->options.client_name.empty()) impl_->options.client_name = DefaultClientName();
  impl_->channel = MakeChannel(options);
  impl_->stub = v1::ExperimentService::NewStub(impl_->channel);
  impl_->analysis = v1::AnalysisService::NewStub(impl_->channel);
  impl_->health = grpc::health::v1::Health::NewStub(impl_->channel);
  impl_->workers = v1::WorkerService::NewStub(impl_->channel);
  impl_->reproductions = v1::ReproductionService::NewStub(impl_->channel);
}

Client::~Client() = default;

absl::StatusOr<v1::ListWorkersResponse> Client::ListWorkers() {
  return impl_->Call(impl_->workers.get(), &v1::WorkerService::Stub::ListWorkers, v1::ListWorkersRequest());
}

absl::StatusOr<v1::WhoAmIResponse> Client::WhoAmI() {
  return impl_->Call(impl_->stub.get(), &v1::ExperimentService::Stub::WhoAmI, v1::WhoAmIRequest());
}

absl::StatusOr<v1::Run> Client::SubmitRun(const v1::ExperimentSpec& spec) {
  v1::SubmitRunRequest req;
  *req.mutable_spec() = spec;
  auto resp = impl_->Call(impl_->stub.get(), &v1::ExperimentService::Stub::SubmitRun, req);
  if (!resp.ok()) return resp.status();
  return resp->run();
}

absl::StatusOr<v1::Run> Client::GetRun(const std::string& run_id) {
  v1::GetRunRequest req;
  req.set_run_id(run_id);
  return impl_->Call(impl_->stub.get(), &v1::ExperimentService::Stub::GetRun, req);
}

absl::StatusOr<v1::ListRunsResponse> Client::ListRuns(const v1::ListRunsRequest& request) {
  return impl_->Call(impl_->stub.get(), &v1::ExperimentService::Stub::ListRuns, request);
}

absl::StatusOr<v1::Run> Client::CancelRun(const std::string& run_id) {
  v1::CancelRunRequest req;
  req.set_run_id(run_id);
  return impl_->Call(impl_->stub.get(), &v1::ExperimentService::Stub::CancelRun, req);
}

absl::StatusOr<v1::GetMetricsResponse> Client::GetMetrics(const v1::GetMetricsRequest& request) {
  return impl_->Call(impl_->stub.get(), &v1::ExperimentService::Stub::GetMetrics, request);
}

std::vector<const google::protobuf::MethodDescriptor*> Client::AnalysisMethods() {
  const google::protobuf::ServiceDescriptor* service = AnalysisServiceOf(v1::CancelAnalysisRequest::descriptor()->file());
  std::vector<const google::protobuf::MethodDescriptor*> out;
  for (int i = 0; i < service->method_count(); ++i) out.push_back(service->method(i));
  return out;
}

absl::Status Client::CallAnalysis(const google::protobuf::Message& request, google::protobuf::Message* response) {
  const google::protobuf::MethodDescriptor* method = AnalysisMethodOf(request.GetDescriptor());
  if (method == nullptr) {
    return absl::InvalidArgumentError("no AnalysisService method takes a " + std::string(request.GetTypeName()));
  }
  if (method->output_type() != response->GetDescriptor()) {
    return absl::InvalidArgumentError(std::string(method->name()) + " answers a " +
                                      std::string(method->output_type()->full_name()) + ", not a " +
                                      std::string(response->GetTypeName()));
  }
  // What a generated stub does, by the method's path ("/circuitlab.v1.AnalysisService/GetLogitLens").
  const std::string path = "/" + std::string(method->service()->full_name()) + "/" + std::string(method->name());
  grpc::ClientContext ctx;
  impl_->Prepare(ctx, true);
  return FromGrpc(grpc::internal::BlockingUnaryCall<google::protobuf::Message, google::protobuf::Message,
                                                                    google::protobuf::MessageLite,
                                                                    google::protobuf::MessageLite>(
      impl_->channel.get(), grpc::internal::RpcMethod(path.c_str(), grpc::internal::RpcMethod::NORMAL_RPC), &ctx,
      request, response));
}

absl::StatusOr<v1::CancelAnalysisResponse> Client::CancelAnalysis(const std::string& job_id) {
  v1::CancelAnalysisRequest request;
  request.set_job_id(job_id);
  return impl_->Call(impl_->analysis.get(), &v1::AnalysisService::Stub::CancelAnalysis, request);
}

absl::StatusOr<v1::ListAnalysisJobsResponse> Client::ListAnalysisJobs() {
  return impl_->Call(impl_->analysis.get(), &v1::AnalysisService::Stub::ListAnalysisJobs,
                     v1::ListAnalysisJobsRequest());
}

absl::StatusOr<v1::Sweep> Client::SubmitSweep(const v1::SweepSpec& sweep) {
  v1::SubmitSweepRequest req;
  *req.mutable_sweep() = sweep;
  return impl_->Call(impl_->stub.get(), &v1::ExperimentService::Stub::SubmitSweep, req);
}

absl::StatusOr<v1::ListRecipesResponse> Client::ListRecipes() {
  return impl_->Call(impl_->reproductions.get(), &v1::ReproductionService::Stub::ListRecipes, v1::ListRecipesRequest());
}

absl::StatusOr<v1::Reproduction> Client::StartReproduction(const v1::StartReproductionRequest& request) {
  return impl_->Call(impl_->reproductions.get(), &v1::ReproductionService::Stub::StartReproduction, request);
}

absl::StatusOr<v1::Reproduction> Client::GetReproduction(const std::string& reproduction_id) {
  v1::GetReproductionRequest req;
  req.set_reproduction_id(reproduction_id);
  return impl_->Call(impl_->reproductions.get(), &v1::ReproductionService::Stub::GetReproduction, req);
}

absl::StatusOr<v1::ListReproductionsResponse> Client::ListReproductions(const v1::ListReproductionsRequest& request) {
  return impl_->Call(impl_->reproductions.get(), &v1::ReproductionService::Stub::ListReproductions, request);
}

absl::StatusOr<v1::Reproduction> Client::CancelReproduction(const std::string& reproduction_id) {
  v1::CancelReproductionRequest req;
  req.set_reproduction_id(reproduction_id);
  return impl_->Call(impl_->reproductions.get(), &v1::ReproductionService::Stub::CancelReproduction, req);
}

absl::StatusOr<v1::Sweep> Client::GetSweep(const std::string& sweep_id) {
  v1::GetSweepRequest req;
  req.set_sweep_id(sweep_id);
  return impl_->Call(impl_->stub.get(), &v1::ExperimentService::Stub::GetSweep, req);
}

absl::StatusOr<v1::Sweep> Client::CancelSweep(const std::string& sweep_id) {
  v1::CancelSweepRequest req;
  req.set_sweep_id(sweep_id);
  return impl_->Call(impl_->stub.get(), &v1::ExperimentService::Stub::CancelSweep, req);
}

absl::StatusOr<v1::DeleteRunResponse> Client::DeleteRun(const std::string& run_id) {
  v1::DeleteRunRequest req;
  req.set_run_id(run_id);
  return impl_->Call(impl_->stub.get(), &v1::ExperimentService::Stub::DeleteRun, req);
}

absl::StatusOr<v1::DeleteSweepResponse> Client::DeleteSweep(const std::string& sweep_id) {
  v1::DeleteSweepRequest req;
  req.set_sweep_id(sweep_id);
  return impl_->Call(impl_->stub.get(), &v1::ExperimentService::Stub::DeleteSweep, req);
}

absl::StatusOr<v1::GetSweepSummaryResponse> Client::GetSweepSummary(const v1::GetSweepSummaryRequest& request) {
  return impl_->Call(impl_->stub.get(), &v1::ExperimentService::Stub::GetSweepSummary, request);
}

absl::Status Client::Health(const std::string& service) {
  grpc::ClientContext ctx;
  impl_->Prepare(ctx, true);
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status s = impl_->health->Check(&ctx, req, &resp);
  if (!s.ok()) return FromGrpc(s);
  if (resp.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    return absl::UnavailableError("server is not serving (shutting down)");
  }
  return absl::OkStatus();
}

absl::Status Client::Watch(const v1::WatchRunRequest& request,
                           const std::function<void(const v1::RunEvent&)>& on_event, const std::atomic<bool>& stop,
                           std::chrono::milliseconds reconnect_for) {
  v1::WatchRunRequest req = request;
  auto give_up_at = std::chrono::steady_clock::now() + reconnect_for;
  while (true) {
    grpc::ClientContext ctx;
    impl_->Prepare(ctx, false);
    std::mutex mu;
    std::condition_variable finished;
    bool done = false;
    // Cancels the stream when `stop` is set (e.g. Ctrl-C), never the run;
    // checks every 50 ms, and leaves at once when the stream ends.
    std::thread canceller([&] {
      std::unique_lock<std::mutex> lock(mu);
      while (!done) {
        if (stop.load()) {
          ctx.TryCancel();
          return;
        }
        finished.wait_for(lock, std::chrono::milliseconds(50));
      }
    });
    auto reader = impl_->stub->WatchRun(&ctx, req);
    v1::RunEvent ev;
    bool got_any = false;
    while (reader->Read(&ev)) {
      got_any = true;
      req.set_after_sequence(ev.sequence());
      req.set_epoch(ev.epoch());
      on_event(ev);
    }
    grpc::Status s = reader->Finish();
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
    }
    finished.notify_all();
    canceller.join();
    if (stop.load()) return absl::CancelledError("stopped watching");
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE) return FromGrpc(s);
    if (got_any) give_up_at = std::chrono::steady_clock::now() + reconnect_for;
    if (std::chrono::steady_clock::now() >= give_up_at) return FromGrpc(s);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

}  // namespace circuitlab::client
