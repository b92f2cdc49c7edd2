// Training of an ensemble of GPT-2-style decoders (SCIENCE.md B.3) on E2,
// in-context linear regression (A.2): squared error of the prediction of
// every y_i at the |- before it, AdamW with the triangle schedule and
// per-member clipping (TrainerBase). Engine-private (includes LibTorch).
//
// Evaluation sets, fixed per member by its seed: "id" (the majors, in turn),
// "ood" (the run's OOD pool, in turn) and, when the run has minors, "minor".
// Each reports, averaged over every point of every sequence:
//   loss            the model's squared error
//   retrieval_loss  squared error of the exact Bayes predictor of the
//                   training mixture (retrieval over the known tasks)
//   ridge_loss      squared error of Bayesian ridge (the Bayes predictor of a
//                   fresh task)
//   bayes_loss      the set's reference: retrieval on id, ridge on ood/minor
//                   (as for the token tasks)
//   to_retrieval, to_ridge  the squared distance of the model's prediction
//                   to each predictor's (which algorithm the model runs)
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "server/engine/models/decoder_model.h"
#include "server/engine/tasks/regression_task.h"
#include "server/engine/train/latent_trainer.h"

namespace circuitlab::engine {

// Batches are x [E, B, n, d] and y [E, B, n] (float32) on the CPU.
class RegressionTrainer
    : public DecoderTrainer<RegressionTaskGenerator, std::pair<torch::Tensor, torch::Tensor>> {
 public:
  RegressionTrainer(const v1::ExperimentSpec& spec, const std::vector<uint64_t>& member_seeds, torch::Device device)
      : RegressionTrainer(MembersOf(spec, member_seeds), device) {}
  // One member per resolved spec (PackableTogether).
  RegressionTrainer(std::vector<v1::ExperimentSpec> members, torch::Device device);

  std::vector<std::vector<Metric>> Step(bool record) override;
  std::vector<std::vector<Metric>> Evaluate() const override;

 private:
  struct EvalSet {
    std::string name;
    torch::Tensor x, y;                   // [E, N, n, d], [E, N, n] (float32, on the device)
    torch::Tensor retrieval, ridge;       // [E, N, n] float64 predictions
    bool reference_is_ridge = false;
  };
  std::vector<EvalSet> eval_sets_;
};

}  // namespace circuitlab::engine
