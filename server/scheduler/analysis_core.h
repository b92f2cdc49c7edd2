// The AnalysisService core: projections of stored checkpoints (computed by the
// engine, stored keyed by a hash of the canonical request), coordinate
// trajectories recorded during training, and long analyses (the invariance
// check) run as queued jobs on a worker thread of their own, never in an RPC
// thread: the first request queues the job, the same request asked again
// reports its progress and finally its stored result.
//
// Thread-safety: all methods are thread-safe.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <thread>

#include "absl/status/statusor.h"
#include "server/common/cancel.h"
#include "circuitlab/v1/analysis_service.pb.h"
#include "server/engine/engine.h"
#include "server/engine/spec.h"
#include "server/store/store.h"

namespace circuitlab::scheduler {

class AnalysisCore {
 public:
  // `store` and `analyzer` must outlive the core. `max_jobs` bounds queued
  // plus running jobs (RESOURCE_EXHAUSTED beyond). `limits` apply to specs
  // sent with a request (as SubmitRun applies them).
  AnalysisCore(store::Store* store, engine::Analyzer* analyzer, int max_jobs = 64, engine::EngineLimits limits = {});
  // Stops the worker; a running job is cancelled and not stored.
  ~AnalysisCore();

  // NotFound for an unknown run or a step without a checkpoint.
  absl::StatusOr<v1::ProjectCheckpointResponse> ProjectCheckpoint(const v1::ProjectCheckpointRequest& request);
  absl::StatusOr<v1::GetTrajectoryResponse> GetTrajectory(const v1::GetTrajectoryRequest& request);
  // Queues, reports on, or answers (from the store) an invariance check.
  absl::StatusOr<v1::CheckInvarianceResponse> CheckInvariance(const v1::CheckInvarianceRequest& request);
  // Likewise circuit detection and run labels.
  absl::StatusOr<v1::DetectCircuitResponse> DetectCircuit(const v1::DetectCircuitRequest& request);
  absl::StatusOr<v1::LabelRunResponse> LabelRun(const v1::LabelRunRequest& request);
  // Task-vector geometry of a run's checkpoint(s) or a sweep's runs
  // (task_vector_requests.cc). InvalidArgument names the field out of range,
  // FailedPrecondition for a run that is not a latent-task decoder run or has
  // no checkpoint yet, ResourceExhausted when the request would not fit the
  // server's per-run memory limit.
  absl::StatusOr<v1::AnalyzeTaskVectorsResponse> AnalyzeTaskVectors(const v1::AnalyzeTaskVectorsRequest& request);
  absl::StatusOr<v1::CheckDataDependenceResponse> CheckDataDependence(const v1::CheckDataDependenceRequest& request);
  // Interventions run in the calling thread (forward passes only).
  absl::StatusOr<v1::InterveneResponse> Intervene(const v1::InterveneRequest& request);

 private:
  // The work of a queued analysis: the serialized DONE response.
  using Work = std::function<absl::StatusOr<std::string>(const std::function<void(double)>& progress,
                                                         const CancelToken* cancel)>;
  struct Job {
    std::string kind;  // "invariance", "detect_circuit", "label_run"
    int64_t run_id = 0;
    int64_t hash = 0;
    std::string key;  // the canonical request, serialized
    Work work;
    v1::AnalysisState state = v1::ANALYSIS_STATE_QUEUED;
    double progress = 0;
    std::string error;
    CancelToken cancel;
  };
  // What a queued analysis has to say: its stored result, or its state.
  struct Answer {
    std::optional<std::string> stored;
    v1::AnalysisState state = v1::ANALYSIS_STATE_UNSPECIFIED;
    double progress = 0;
    std::string error;
  };
  // A queued analysis' response: the stored result, or the job's state. (The
  // invariance check's own State enum shares AnalysisState's numbers.)
  template <typename Response>
  static Response FromAnswer(const Answer& a) {
    Response resp;
    if (a.stored && resp.ParseFromString(*a.stored)) {
      resp.set_from_store(true);
      return resp;
    }
    resp.set_state(static_cast<decltype(resp.state())>(a.state));
    resp.set_progress(a.progress);
    resp.set_error(a.error);
    return resp;
  }
  // Answers from the store unless `force`, else reports on or queues the job.
  absl::StatusOr<Answer> Enqueue(const std::string& kind, int64_t run_id, const std::string& key, bool force,
                                 Work work);
  // The spec a request names: a run's stored spec, or a spec sent with it
  // (resolved under the server's limits; run id kNoRun).
  absl::StatusOr<std::pair<int64_t, v1::ExperimentSpec>> TargetSpec(const std::string& run_id,
                                                                    const v1::ExperimentSpec* spec);
  // The stored spec and the checkpoint at `step` (0 = newest) of a run.
  absl::StatusOr<std::pair<v1::ExperimentSpec, store::Checkpoint>> RunCheckpoint(int64_t id, uint64_t step,
                                                                                 const std::string& run_id);
  void WorkerLoop();
  void RunJob(Job& job);

  store::Store* const store_;
  engine::Analyzer* const analyzer_;
  const int max_jobs_;
  const engine::EngineLimits limits_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  // (kind, run, hash): queued, running, failed
  std::map<std::tuple<std::string, int64_t, int64_t>, std::shared_ptr<Job>> jobs_;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace circuitlab::scheduler
