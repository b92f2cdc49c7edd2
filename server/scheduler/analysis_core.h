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
#include <map>
#include <memory>
#include <mutex>
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

 private:
  struct Job {
    int64_t run_id = 0;
    int64_t hash = 0;
    std::string key;  // the canonical request, serialized
    v1::ExperimentSpec spec;
    engine::InvarianceRequest request;
    v1::CheckInvarianceResponse status;  // state, progress, error; the result once DONE
    CancelToken cancel;
  };
  void WorkerLoop();
  void RunJob(Job& job);

  store::Store* const store_;
  engine::Analyzer* const analyzer_;
  const int max_jobs_;
  const engine::EngineLimits limits_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::map<std::pair<int64_t, int64_t>, std::shared_ptr<Job>> jobs_;  // (run, hash): queued, running, failed
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace circuitlab::scheduler
