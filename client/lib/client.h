// circuitlab's C++ client library: one channel to a server, typed calls with
// deadlines, spec files read through protobuf's own JSON parser.
//
// Thread-safety: a Client may be shared; each call is independent.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "circuitlab/v1/analysis_service.pb.h"
#include "circuitlab/v1/experiment_service.pb.h"
#include "circuitlab/v1/reproduce.pb.h"
#include "circuitlab/v1/worker_service.pb.h"
#include "client/lib/options.h"

namespace circuitlab::client {

// Parses an ExperimentSpec from protobuf JSON. Unknown fields are an error
// that names the field; InvalidArgument for malformed JSON, NotFound for a
// missing file.
absl::StatusOr<v1::ExperimentSpec> ParseSpecJson(const std::string& json);
absl::StatusOr<v1::ExperimentSpec> ReadSpecFile(const std::string& path);
// A whole file of at most `max_bytes` (InvalidArgument beyond: /dev/zero
// never ends), NotFound when it cannot be opened.
absl::StatusOr<std::string> ReadTextFile(const std::string& path, size_t max_bytes = 4 << 20);

// Reads any message (a sweep, an intervention request) from a protobuf JSON
// file; the error names the file and the field at fault.
absl::Status ReadJsonFile(const std::string& path, google::protobuf::Message* message);

// Protobuf JSON of any message (field names as in the .proto).
std::string ToJson(const google::protobuf::Message& message, bool pretty = true);

class Client {
 public:
  explicit Client(const ClientOptions& options);
  ~Client();

  absl::StatusOr<v1::Run> SubmitRun(const v1::ExperimentSpec& spec);
  absl::StatusOr<v1::Run> GetRun(const std::string& run_id);
  absl::StatusOr<v1::ListRunsResponse> ListRuns(const v1::ListRunsRequest& request);
  absl::StatusOr<v1::Run> CancelRun(const std::string& run_id);
  absl::StatusOr<v1::GetMetricsResponse> GetMetrics(const v1::GetMetricsRequest& request);
  // SERVING -> OK; NOT_SERVING -> Unavailable; unreachable -> the RPC error.
  // grpc.health.v1 for the server as a whole, or for one service by its full
  // name ("circuitlab.v1.ExperimentService"; NotFound for one it lacks).
  absl::Status Health(const std::string& service = "");
  absl::StatusOr<v1::WhoAmIResponse> WhoAmI();
  // The server's executor and the remote workers connected now.
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers();

  // AnalysisService, any method: the one whose request type is `request`'s,
  // found in the service's descriptor, so an analysis added to the proto
  // needs nothing here. InvalidArgument when no method takes that type;
  // else the RPC's status. `response` must be the method's response type.
  absl::Status CallAnalysis(const google::protobuf::Message& request, google::protobuf::Message* response);
  // Typed: client.RunAnalysis<v1::GetLogitLensResponse>(request).
  template <typename Response, typename Request>
  absl::StatusOr<Response> RunAnalysis(const Request& request) {
    Response response;
    if (absl::Status s = CallAnalysis(request, &response); !s.ok()) return s;
    return response;
  }
  // Every AnalysisService method, in the proto's order (server/common/
  // analysis_names.h names each for the fronts).
  static std::vector<const google::protobuf::MethodDescriptor*> AnalysisMethods();
  absl::StatusOr<v1::CancelAnalysisResponse> CancelAnalysis(const std::string& job_id);
  absl::StatusOr<v1::ListAnalysisJobsResponse> ListAnalysisJobs();

  // ReproductionService.
  absl::StatusOr<v1::ListRecipesResponse> ListRecipes();
  absl::StatusOr<v1::Reproduction> StartReproduction(const v1::StartReproductionRequest& request);
  absl::StatusOr<v1::Reproduction> GetReproduction(const std::string& reproduction_id);
  absl::StatusOr<v1::ListReproductionsResponse> ListReproductions(const v1::ListReproductionsRequest& request);
  absl::StatusOr<v1::Reproduction> CancelReproduction(const std::string& reproduction_id);

  // Sweeps.
  absl::StatusOr<v1::Sweep> SubmitSweep(const v1::SweepSpec& sweep);
  absl::StatusOr<v1::Sweep> GetSweep(const std::string& sweep_id);
  absl::StatusOr<v1::Sweep> CancelSweep(const std::string& sweep_id);
  absl::StatusOr<v1::DeleteRunResponse> DeleteRun(const std::string& run_id);
  absl::StatusOr<v1::DeleteSweepResponse> DeleteSweep(const std::string& sweep_id);
  absl::StatusOr<v1::GetSweepSummaryResponse> GetSweepSummary(const v1::GetSweepSummaryRequest& request);

  // Streams a run's events to `on_event` until the run ends (OK), the stream
  // fails, or `stop` becomes true (Cancelled). Reconnects on UNAVAILABLE for up
  // to `reconnect_for`, resuming after the last event seen.
  absl::Status Watch(const v1::WatchRunRequest& request, const std::function<void(const v1::RunEvent&)>& on_event,
                     const std::atomic<bool>& stop,
                     std::chrono::milliseconds reconnect_for = std::chrono::seconds(30));

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace circuitlab::client
