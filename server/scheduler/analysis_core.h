// The AnalysisService core: the analysis table's validation-and-
// canonicalisation step (analysis_table.h: one module per analysis) in front
// of one job executor (analysis_jobs.h). Every analysis that runs model code
// is a job there, never work on the calling thread: its module validates the
// request, resolves its defaults into a canonical key (stored answers are
// keyed by its hash), estimates the job's memory, and Run submits it. It answers at once: from the
// store, or with the job's state (QUEUED, RUNNING with progress, FAILED or
// CANCELLED once). The RPC layer may then Await the job briefly.
// GetTrajectory only reads the store.
//
// Thread-safety: all methods are thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "server/common/cancel.h"
#include "circuitlab/v1/analysis_service.pb.h"
#include "google/protobuf/message.h"
#include "server/engine/api.h"
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

  // Any analysis of the table (analysis_table.h): its module validates the
  // request (InvalidArgument naming the field, NotFound for an unknown run
  // or a step without a checkpoint, FailedPrecondition for a run the
  // analysis does not apply to), and the answer is the response type's: from
  // the store, or the job's state. `owner` names the caller (it owns the job
  // it starts, and the per-owner limit counts it); a read-only one gets
  // stored answers only. Unimplemented for a request type with no entry.
  absl::StatusOr<std::unique_ptr<google::protobuf::Message>> Run(const google::protobuf::Message& request,
                                                                 const Requester& owner = {});
  // Run, typed: `Response` must be the request's response type.
  template <typename Response, typename Request>
  absl::StatusOr<Response> Run(const Request& request, const Requester& owner = {}) {
    absl::StatusOr<std::unique_ptr<google::protobuf::Message>> m =
        Run(static_cast<const google::protobuf::Message&>(request), owner);
    if (!m.ok()) return m.status();
    if ((*m)->GetDescriptor() != Response::descriptor()) {
      return absl::InternalError(request.GetDescriptor()->name() + " answers " + (*m)->GetDescriptor()->name());
    }
    Response out;
    out.Swap(static_cast<Response*>(m->get()));
    return out;
  }
  // Coordinates over training, as recorded (a store read, no job).
  absl::StatusOr<v1::GetTrajectoryResponse> GetTrajectory(const v1::GetTrajectoryRequest& request);

  // For the analysis modules (analyses/*.cc): the store, the engine, the
  // limits of specs sent with a request.
  store::Store& store() { return *store_; }
  engine::Analyzer& analyzer() { return *analyzer_; }
  const engine::EngineLimits& limits() const { return limits_; }
  // The spec a request names: a run's stored spec, or a spec sent with it
  // (resolved under the server's limits; run id kNoRun).
  absl::StatusOr<std::pair<int64_t, v1::ExperimentSpec>> TargetSpec(const std::string& run_id,
                                                                    const v1::ExperimentSpec* spec);
  // The stored spec and the checkpoint at `step` (0 = newest) of a run.
  absl::StatusOr<std::pair<v1::ExperimentSpec, store::Checkpoint>> RunCheckpoint(int64_t id, uint64_t step,
                                                                                 const std::string& run_id);

  // The executor: Await, Cancel and List for the RPC layer.
  AnalysisJobs& jobs() { return jobs_; }
  // Cancels every job and stops the executor (SIGTERM). Idempotent.
  void Shutdown() { jobs_.Shutdown(); }

 private:
  store::Store* const store_;
  engine::Analyzer* const analyzer_;
  const engine::EngineLimits limits_;
  AnalysisJobs jobs_;  // last: its workers stop before the rest goes
};

}  // namespace circuitlab::scheduler
