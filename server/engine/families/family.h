// Model families (SCIENCE.md B.1, B.2): everything the engine does
// differently for a run's model. `imir` is the block model on the synthetic
// tasks (coordinates, circuits, labels, the theorems); `latent` the decoder
// on a DICE, MARKOV or DYCK latent task (task vectors, hook-point
// interventions); `regression` the decoder on continuous-token regression
// (E2). A family says which trainer a run trains with, what it records
// beside its metrics, its evaluation metric names, and which analyses it
// answers and how: an analysis a family lacks is FailedPrecondition naming
// the family and what it has instead. `FamilyOf` is the one place the engine
// tells models apart; one file per family (imir.cc, latent.cc,
// regression.cc; the two decoder families share decoder_family.h).
// Engine-private (includes LibTorch).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "server/engine/analysis/imir_analyses.h"
#include "server/engine/train/run_loop.h"
#include "server/engine/train/trainer_base.h"

namespace circuitlab::engine {

class ModelFamily {
 public:
  virtual ~ModelFamily() = default;
  virtual std::string_view name() const = 0;
  // The analyses this family has, for the FailedPrecondition of the others.
  virtual std::string_view offers() const = 0;

  // The trainer of a resolved spec's members (one per seed), not yet
  // evaluated or restored.
  virtual std::unique_ptr<TrainerBase> MakeTrainer(const v1::ExperimentSpec& resolved,
                                                   const std::vector<uint64_t>& member_seeds,
                                                   torch::Device device) const = 0;
  // What `trainer` (made by MakeTrainer) records beside its metrics; null
  // when nothing.
  virtual std::unique_ptr<StepRecorder> MakeRecorder(const v1::ExperimentSpec& resolved,
                                                     const TrainerBase& trainer) const {
    return nullptr;
  }
  // Every evaluation metric a run of `resolved` reports ("eval/<set>/<name>").
  virtual std::vector<std::string> EvalMetricNames(const v1::ExperimentSpec& resolved) const = 0;

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

// The three families (families/imir.cc, latent.cc, regression.cc).
const ModelFamily& ImirFamily();
const ModelFamily& LatentFamily();
const ModelFamily& RegressionFamily();

}  // namespace circuitlab::engine
