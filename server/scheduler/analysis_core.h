// The AnalysisService core: projections of stored checkpoints (computed by the
// engine, stored keyed by a hash of the canonical request) and coordinate
// trajectories recorded during training.
//
// Thread-safety: all methods are thread-safe.
#pragma once

#include "absl/status/statusor.h"
#include "circuitlab/v1/analysis_service.pb.h"
#include "server/engine/engine.h"
#include "server/store/store.h"

namespace circuitlab::scheduler {

class AnalysisCore {
 public:
  // `store` and `analyzer` must outlive the core.
  AnalysisCore(store::Store* store, engine::Analyzer* analyzer) : store_(store), analyzer_(analyzer) {}

  // NotFound for an unknown run or a step without a checkpoint.
  absl::StatusOr<v1::ProjectCheckpointResponse> ProjectCheckpoint(const v1::ProjectCheckpointRequest& request);
  absl::StatusOr<v1::GetTrajectoryResponse> GetTrajectory(const v1::GetTrajectoryRequest& request);

 private:
  store::Store* const store_;
  engine::Analyzer* const analyzer_;
};

}  // namespace circuitlab::scheduler
