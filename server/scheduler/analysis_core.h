// The AnalysisService core: one validation-and-canonicalisation step per
// analysis in front of one job executor (analysis_jobs.h). Every analysis that
// runs model code (ProjectCheckpoint, Intervene, DetectCircuit, LabelRun,
// CheckInvariance, CheckDataDependence, AnalyzeTaskVectors) is a job there,
// never work on the calling thread: a method validates the request, resolves
// its defaults into a canonical key (stored answers are keyed by its hash),
// estimates the job's memory and submits it. It answers at once: from the
// store, or with the job's state (QUEUED, RUNNING with progress, FAILED or
// CANCELLED once). The RPC layer may then Await the job briefly.
// GetTrajectory only reads the store.
//
// Thread-safety: all methods are thread-safe.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "server/common/cancel.h"
#include "circuitlab/v1/analysis_service.pb.h"
#include "server/engine/engine.h"
#include "server/engine/spec.h"
#include "server/scheduler/analysis_jobs.h"
#include "server/store/store.h"

namespace circuitlab::scheduler {

class AnalysisCore {
 public:
  // `store` and `analyzer` must outlive the core. `jobs` sizes the executor
  // and its limits (RESOURCE_EXHAUSTED beyond). `limits` apply to specs sent
  // with a request (as SubmitRun applies them).
  AnalysisCore(store::Store* store, engine::Analyzer* analyzer, AnalysisJobOptions jobs = {},
               engine::EngineLimits limits = {});
  // Shuts the executor down: running jobs are cancelled and not stored.
  ~AnalysisCore() = default;

  // Every method below: `owner` names the caller (it owns the job it starts,
  // and the per-owner limit counts it); a read-only one gets stored answers only.

  // NotFound for an unknown run or a step without a checkpoint.
  absl::StatusOr<v1::ProjectCheckpointResponse> ProjectCheckpoint(const v1::ProjectCheckpointRequest& request,
                                                                  const Requester& owner = {});
  absl::StatusOr<v1::GetTrajectoryResponse> GetTrajectory(const v1::GetTrajectoryRequest& request);
  // Queues, reports on, or answers (from the store) an invariance check.
  absl::StatusOr<v1::CheckInvarianceResponse> CheckInvariance(const v1::CheckInvarianceRequest& request,
                                                              const Requester& owner = {});
  // Likewise circuit detection and run labels.
  absl::StatusOr<v1::DetectCircuitResponse> DetectCircuit(const v1::DetectCircuitRequest& request,
                                                          const Requester& owner = {});
  absl::StatusOr<v1::LabelRunResponse> LabelRun(const v1::LabelRunRequest& request, const Requester& owner = {});
  // Task-vector geometry of a run's checkpoint(s) or a sweep's runs
  // (task_vector_requests.cc). InvalidArgument names the field out of range,
  // FailedPrecondition for a run that is not a latent-task decoder run or has
  // no checkpoint yet, ResourceExhausted when the request would not fit the
  // server's per-run memory limit.
  absl::StatusOr<v1::AnalyzeTaskVectorsResponse> AnalyzeTaskVectors(const v1::AnalyzeTaskVectorsRequest& request,
                                                                    const Requester& owner = {});
  absl::StatusOr<v1::CheckDataDependenceResponse> CheckDataDependence(const v1::CheckDataDependenceRequest& request,
                                                                      const Requester& owner = {});
  // Interventions (forward passes; D.6's hook ops and metrics).
  absl::StatusOr<v1::InterveneResponse> Intervene(const v1::InterveneRequest& request, const Requester& owner = {});

  // The executor: Await, Cancel and List for the RPC layer.
  AnalysisJobs& jobs() { return jobs_; }
  // Cancels every job and stops the executor (SIGTERM). Idempotent.
  void Shutdown() { jobs_.Shutdown(); }

 private:
  // Submits a job (or answers from the store) for a canonical request.
  absl::StatusOr<AnalysisAnswer> Enqueue(const std::string& kind, int64_t run_id, std::string key, bool force,
                                         const Requester& owner, uint64_t memory_bytes, AnalysisWork work);
  // The spec a request names: a run's stored spec, or a spec sent with it
  // (resolved under the server's limits; run id kNoRun).
  absl::StatusOr<std::pair<int64_t, v1::ExperimentSpec>> TargetSpec(const std::string& run_id,
                                                                    const v1::ExperimentSpec* spec);
  // The stored spec and the checkpoint at `step` (0 = newest) of a run.
  absl::StatusOr<std::pair<v1::ExperimentSpec, store::Checkpoint>> RunCheckpoint(int64_t id, uint64_t step,
                                                                                 const std::string& run_id);

  store::Store* const store_;
  engine::Analyzer* const analyzer_;
  const engine::EngineLimits limits_;
  AnalysisJobs jobs_;  // last: its workers stop before the rest goes
};

}  // namespace circuitlab::scheduler
