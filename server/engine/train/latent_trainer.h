// Training of an ensemble of decoder transformers (SCIENCE.md B.2) on a
// latent task (A.2): next-token cross-entropy on every position, AdamW with
// the triangle schedule and per-member clipping (TrainerBase). Engine-private
// (includes LibTorch).
//
// Evaluation sets, fixed per member by its seed: "id" (the majors, in turn),
// "ood" (the run's OOD pool, in turn) and, when the run has minors, "minor".
// Each reports loss and accuracy over every position; DICE and MARKOV also
// report bayes_loss, the loss of the reference predictor on the same
// sequences (id: the exact Bayes predictor of the training mixture; ood and
// minor: the Dirichlet extrapolation predictor, the Bayes predictor of a
// fresh task).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "server/common/seeds.h"
#include "server/engine/models/decoder_model.h"
#include "server/engine/tasks/latent_task.h"
#include "server/engine/setup/decoder_setup.h"
#include "server/engine/train/batch_split.h"
#include "server/engine/train/trainer_base.h"

namespace circuitlab::engine {

// Per member of a recorded decoder step: train/loss (of `member_loss` [E]),
// the `extra` metrics ([E] each), train/grad_norm (from the squared norms
// `sq` that TrainerBase::Update filled) and train/lr.
std::vector<std::vector<Metric>> DecoderTrainMetrics(
    const torch::Tensor& member_loss, const torch::Tensor& sq, double lr,
    const std::vector<std::pair<const char*, torch::Tensor>>& extra);

// What the trainers of both decoder families (token and regression tasks)
// share: one task generator per member, made from the member's own task
// settings (a pack's members may differ in them: PackKey) with its pools
// drawn from the member's pool seed; the spec's decoder initialised from the members' init seeds;
// the optimiser over the decoder's named parameters; the training batches
// (`Batch`, drawn by `sample` one step ahead); the training metrics.
template <class Task, class Batch>
class DecoderTrainer : public TrainerBase {
 public:
  DecoderTrainer(std::vector<v1::ExperimentSpec> members, torch::Device device, std::function<Batch(int64_t)> sample)
      : TrainerBase(std::move(members), device), batches_(std::move(sample)) {
    for (const v1::ExperimentSpec& m : members_) {
      tasks_.push_back(std::make_unique<Task>(m.task().latent(), PoolSeedOf(m.seed())));
    }
    model_ = MakeDecoder(spec_, ensemble(), device_);
    InitializeDecoder(seeds_, *model_);
    MakeOptimizer(model_->parameters(), model_->parameter_names());
    // The threads the engine gave this run (--threads-per-run) split the
    // batch on the CPU; LibTorch's pool and OpenBLAS's (process-wide) then
    // stay at one thread while it trains, so that the parts do not
    // oversubscribe the cores.
    if (device_.is_cpu() && at::get_num_threads() > 1) {
      parts_ = at::get_num_threads();
      at::set_num_threads(1);
      single_blas_.emplace(parts_);
    }
  }
  // Threads a training step's batch is split over (batch_split.h).
  int parts() const { return parts_; }

  const DecoderModel& model() const { return *model_; }
  const Task& task(int64_t member) const { return *tasks_[static_cast<size_t>(member)]; }
  double data_wait_seconds() const override { return batches_.waited_seconds(); }

 protected:
  // Training step `step` on a batch of `rows` rows: `loss_of(lo, count)`
  // gives the members' mean loss over rows [lo, lo + count) and, when
  // `record`, the extra metrics there; the rows are split over the run's
  // threads (BackwardInParts). Then the optimiser's update and, when
  // `record`, the step's metrics (DecoderTrainMetrics).
  std::vector<std::vector<Metric>> TrainStep(int64_t rows, int64_t step, bool record, const PartLoss& loss_of) {
    ZeroGrad();
    PartOutput out = BackwardInParts(parts_, rows, model_->parameters(), loss_of);
    torch::Tensor sq;
    const double lr = ScheduledLearningRate(spec_.training(), step);
    Update(record ? &sq : nullptr);
    if (!record) return {};
    torch::NoGradGuard no_grad;
    for (auto& [name, value] : out.extra) value = value.cpu();
    return DecoderTrainMetrics(out.loss, sq, lr, out.extra);
  }

  std::vector<std::unique_ptr<Task>> tasks_;
  std::unique_ptr<DecoderModel> model_;
  int parts_ = 1;
  std::optional<BlasSingleThreaded> single_blas_;
  BatchPrefetcher<Batch> batches_;  // declared last: its sampler stops before tasks_ go
};

// Batches are [E, B, T] tokens on the CPU.
class LatentTrainer : public DecoderTrainer<LatentTaskGenerator, torch::Tensor> {
 public:
  LatentTrainer(const v1::ExperimentSpec& spec, const std::vector<uint64_t>& member_seeds, torch::Device device)
      : LatentTrainer(MembersOf(spec, member_seeds), device) {}
  // One member per resolved spec (PackableTogether).
  LatentTrainer(std::vector<v1::ExperimentSpec> members, torch::Device device);

  std::vector<std::vector<Metric>> Step(bool record) override;
  std::vector<std::vector<Metric>> Evaluate() const override;

 private:
  struct EvalSet {
    std::string name;
    std::vector<torch::Tensor> tokens;  // per member [N, T]
    std::vector<torch::Tensor> bayes;   // per member [N, T-1] log-prob of the next token, or undefined
  };
  std::vector<EvalSet> eval_sets_;
};

}  // namespace circuitlab::engine
