// Model families (SCIENCE.md B.1, B.2): everything the engine does
// differently for a run's model. `imir` is the block model on the synthetic
// tasks (coordinates, circuits, labels, the theorems); `latent` the decoder
// on a DICE, MARKOV or DYCK latent task (task vectors, hook-point
// interventions); `regression` the decoder on continuous-token regression
// (E2). A family says which trainer a run trains with, what it records
// beside its metrics and its evaluation metric names. Which analyses it
// answers, and how, is the analysis table's (analysis/registry.h: each
// analysis registers itself for the families it serves); an analysis a
// family lacks is FailedPrecondition naming the family and what it has. `FamilyOf` is the one place the engine
// tells models apart; one file per family (imir.cc, latent.cc,
// regression.cc; the two decoder families share decoder_family.h).
// Engine-private (includes LibTorch).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "server/engine/train/run_loop.h"
#include "server/engine/train/trainer_base.h"

namespace circuitlab::engine {

class ModelFamily {
 public:
  virtual ~ModelFamily() = default;
  virtual std::string_view name() const = 0;

  // The trainer of an ensemble, one member per resolved spec (one spec:
  // MembersOf; several: PackableTogether), not yet evaluated or restored.
  virtual std::unique_ptr<TrainerBase> MakeTrainer(std::vector<v1::ExperimentSpec> members,
                                                   torch::Device device) const = 0;
  // What `trainer` (made by MakeTrainer) records beside its metrics; null
  // when nothing.
  virtual std::unique_ptr<StepRecorder> MakeRecorder(const v1::ExperimentSpec& resolved,
                                                     const TrainerBase& trainer) const {
    return nullptr;
  }
  // Every evaluation metric a run of `resolved` reports ("eval/<set>/<name>").
  virtual std::vector<std::string> EvalMetricNames(const v1::ExperimentSpec& resolved) const = 0;

  // FailedPrecondition: `analysis` is not one of this family's (naming the
  // ones it has, from the analysis table).
  absl::Status Lacks(std::string_view analysis) const;
};

// The family of a resolved spec's model and task.
const ModelFamily& FamilyOf(const v1::ExperimentSpec& spec);

// The three families (families/imir.cc, latent.cc, regression.cc).
const ModelFamily& ImirFamily();
const ModelFamily& LatentFamily();
const ModelFamily& RegressionFamily();

}  // namespace circuitlab::engine
