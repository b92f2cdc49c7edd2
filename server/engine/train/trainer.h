// Training of an ensemble of IMIR models on a block-list task. Engine-private
// (includes LibTorch).
//
// Member e of an ensemble is defined by its master seed (and its own
// initial_coordinates): its task pool, training stream, initialisation and
// evaluation sets derive from them, so member e trains exactly as a
// one-member run of its spec would (the ensemble shares tensor ops, not
// randomness or parameters). Checkpoints,
// the optimiser and the RNG convention come from TrainerBase.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "circuitlab/v1/spec.pb.h"
#include "server/engine/api.h"
#include "server/engine/models/imir_factory.h"
#include "server/engine/models/imir_model.h"
#include "server/engine/tasks/block_task.h"
#include "server/engine/setup/imir_setup.h"
#include "server/engine/train/trainer_base.h"

namespace circuitlab::engine {

class EnsembleTrainer : public TrainerBase {
 public:
  // `spec` must be resolved. One member per seed.
  EnsembleTrainer(const v1::ExperimentSpec& spec, const std::vector<uint64_t>& member_seeds, torch::Device device)
      : EnsembleTrainer(MembersOf(spec, member_seeds), device) {}
  // One member per resolved spec (PackableTogether: they may differ in their
  // seed and initial_coordinates).
  EnsembleTrainer(std::vector<v1::ExperimentSpec> members, torch::Device device);

  std::vector<std::vector<Metric>> Step(bool record) override;
  double data_wait_seconds() const override { return batches_.waited_seconds(); }
  std::vector<std::vector<Metric>> Evaluate() const override;

  const ImirModel& model() const { return *model_; }
  const BlockTask& task(int64_t member) const { return *tasks_[member]; }

 private:
  struct EvalSet {
    EvalSetInfo info;
    std::vector<Batch> per_member;  // fixed by each member's eval seed
  };

  // Stacks one batch per member into [E, B, ...] tensors on the device.
  struct Stacked {
    torch::Tensor tokens, pids, target, alt_target, bayes_logp;
  };
  Stacked Stack(const std::vector<const Batch*>& batches, int64_t begin, int64_t count) const;
  // Per-member mean loss [E] of logits [E, B, V] against targets [E, B].
  torch::Tensor MemberLoss(const torch::Tensor& logits, const torch::Tensor& target) const;

  std::vector<std::unique_ptr<BlockTask>> tasks_;
  std::unique_ptr<ImirModel> model_;
  std::vector<EvalSet> eval_sets_;
  BatchPrefetcher<std::vector<Batch>> batches_;  // last: stops before tasks_ go
};

}  // namespace circuitlab::engine
