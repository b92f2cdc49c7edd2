// Model families (SCIENCE.md B.1, B.2): which analyses a run's model answers
// and how. `imir` is the block model on the synthetic tasks (coordinates,
// circuits, labels, the theorems); `latent` the decoder on a DICE, MARKOV or
// DYCK latent task (task vectors, hook-point interventions); `regression`
// the decoder on continuous-token regression (E2). The one place the engine
// tells models apart: an analysis a family lacks is FailedPrecondition
// naming the family and what it has instead. Engine-private.
#pragma once

#include <string>
#include <string_view>

#include "server/engine/analysis/imir_analyses.h"

namespace circuitlab::engine {

class ModelFamily {
 public:
  virtual ~ModelFamily() = default;
  virtual std::string_view name() const = 0;
  // The analyses this family has, for the FailedPrecondition of the others.
  virtual std::string_view offers() const = 0;

  virtual absl::StatusOr<v1::ProjectCheckpointResponse> ProjectCheckpoint(
      const v1::ExperimentSpec& spec, const std::string& checkpoint,
      const v1::ProjectCheckpointRequest& request) const {
    return Lacks("ProjectCheckpoint");
  }
  virtual absl::StatusOr<v1::CheckInvarianceResponse> CheckInvariance(const v1::ExperimentSpec& spec,
                                                                      const v1::CheckInvarianceRequest& request,
                                                                      const AnalysisProgress& progress,
                                                                      const CancelToken* cancel) const {
    return Lacks("CheckInvariance");
  }
  virtual absl::StatusOr<v1::DetectCircuitResponse> DetectCircuit(const v1::ExperimentSpec& spec,
                                                                  const std::string& checkpoint,
                                                                  const v1::DetectCircuitRequest& request,
                                                                  const AnalysisProgress& progress,
                                                                  const CancelToken* cancel) const {
    return Lacks("DetectCircuit");
  }
  virtual absl::StatusOr<v1::InterveneResponse> Intervene(const v1::ExperimentSpec& spec, const std::string& checkpoint,
                                                          const v1::InterveneRequest& request,
                                                          const std::map<int, StoredCheckpoint>& swap_sources) const {
    return Lacks("Intervene");
  }
  virtual absl::StatusOr<v1::CheckDataDependenceResponse> CheckDataDependence(
      const v1::ExperimentSpec& spec, const v1::CheckDataDependenceRequest& request, const AnalysisProgress& progress,
      const CancelToken* cancel) const {
    return Lacks("CheckDataDependence");
  }
  virtual absl::StatusOr<v1::AnalyzeTaskVectorsResponse> AnalyzeTaskVectors(
      const v1::ExperimentSpec& spec, const std::string& checkpoint, const v1::AnalyzeTaskVectorsRequest& request,
      const AnalysisProgress& progress, const CancelToken* cancel) const {
    return Lacks("AnalyzeTaskVectors");
  }
  virtual absl::StatusOr<v1::LabelRunResponse> LabelRun(const v1::ExperimentSpec& spec,
                                                        const std::vector<std::pair<int64_t, std::string>>& checkpoints,
                                                        const v1::LabelRunRequest& request,
                                                        const AnalysisProgress& progress,
                                                        const CancelToken* cancel) const {
    return Lacks("LabelRun");
  }

 protected:
  absl::Status Lacks(std::string_view analysis) const;
};

// The family of a resolved spec's model and task.
const ModelFamily& FamilyOf(const v1::ExperimentSpec& spec);

}  // namespace circuitlab::engine
