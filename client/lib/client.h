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

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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

  // AnalysisService.
  absl::StatusOr<v1::ProjectCheckpointResponse> ProjectCheckpoint(const v1::ProjectCheckpointRequest& request);
  absl::StatusOr<v1::GetTrajectoryResponse> GetTrajectory(const v1::GetTrajectoryRequest& request);
  absl::StatusOr<v1::CheckInvarianceResponse> CheckInvariance(const v1::CheckInvarianceRequest& request);
  absl::StatusOr<v1::DetectCircuitResponse> DetectCircuit(const v1::DetectCircuitRequest& request);
  absl::StatusOr<v1::InterveneResponse> Intervene(const v1::InterveneRequest& request);
  absl::StatusOr<v1::LabelRunResponse> LabelRun(const v1::LabelRunRequest& request);
  absl::StatusOr<v1::CheckDataDependenceResponse> CheckDataDependence(const v1::CheckDataDependenceRequest& request);
  absl::StatusOr<v1::AnalyzeTaskVectorsResponse> AnalyzeTaskVectors(const v1::AnalyzeTaskVectorsRequest& request);
  absl::StatusOr<v1::GetAttentionPatternsResponse> GetAttentionPatterns(const v1::GetAttentionPatternsRequest& request);
  absl::StatusOr<v1::ExportWeightsResponse> ExportWeights(const v1::ExportWeightsRequest& request);
  absl::StatusOr<v1::GetActivationsResponse> GetActivations(const v1::GetActivationsRequest& request);
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
