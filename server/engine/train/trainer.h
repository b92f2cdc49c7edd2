// Training of an ensemble of IMIR models on a block-list task. Engine-private
// (includes LibTorch).
//
// Member e of an ensemble is defined by its master seed alone: its task pool,
// training stream, initialisation and evaluation sets derive from it, so
// member e trains exactly as a one-member run with that seed would (the
// ensemble shares tensor ops, not randomness or parameters).
//
// Randomness is counter-based: the batch of step s comes from a generator
// seeded with DeriveSeed(seed, "batch", s). The RNG state a checkpoint needs to
// resume is therefore (seed, step), which it stores with the weights and the
// optimiser state.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "circuitlab/v1/spec.pb.h"
#include "server/engine/engine.h"
#include "server/engine/models/imir_model.h"
#include "server/engine/tasks/block_task.h"

namespace circuitlab::engine {

// A CPU generator seeded with `seed`.
torch::Generator MakeGenerator(uint64_t seed);
// Seed of a member's evaluation set `mode` (the same sequences at every
// checkpoint, and in the circuit analyses).
uint64_t EvalSeed(uint64_t seed, SampleMode mode);

// Seed of a member's fixed task pool (common pairs, Zipf ranks).
uint64_t PoolSeedOf(uint64_t member_seed);

// The spec's model for `task` (FULL or COORDINATES), not initialised;
// float64 for numerical checks (SCIENCE.md 0.3).
std::unique_ptr<ImirModel> MakeModel(const v1::ExperimentSpec& resolved, const BlockTask& task, int64_t ensemble,
                                     torch::Device device, bool float64 = false);

// Initialises every member as the spec says: `init` with the member's init
// seed (DeriveSeed(seed, "init")); COORDINATES with INIT_SCHEME_PROJECTED
// projects the FULL model's NORMAL init of the same seed; then
// initial_coordinates override.
void InitializeModel(const v1::ExperimentSpec& resolved, const std::vector<uint64_t>& member_seeds, ImirModel& model);

// Reads only the weights of a checkpoint into `model` (no optimiser, no
// evaluation sets). InvalidArgument when shapes or format do not match.
absl::Status LoadWeights(const std::string& checkpoint, ImirModel& model);

class EnsembleTrainer {
 public:
  // `spec` must be resolved. One member per seed.
  EnsembleTrainer(const v1::ExperimentSpec& spec, std::vector<uint64_t> member_seeds, torch::Device device);

  // Runs the next step. When `record` is set, returns each member's training
  // metrics of this step (loss, accuracy, gradient norm); else an empty vector.
  std::vector<std::vector<Metric>> Step(bool record);

  // Evaluation metrics of every member on its fixed evaluation sets.
  std::vector<std::vector<Metric>> Evaluate() const;

  // Weights, optimiser state and RNG state (seeds + step).
  std::string SaveCheckpoint() const;
  // Member `member` alone: the checkpoint a one-member trainer with its seed
  // would have written at this step (so a packed run resumes on its own).
  std::string SaveMemberCheckpoint(int64_t member) const;
  // InvalidArgument when the checkpoint belongs to another spec or ensemble.
  absl::Status LoadCheckpoint(const std::string& bytes);

  int64_t step() const { return step_; }
  int64_t total_steps() const { return static_cast<int64_t>(spec_.training().steps()); }
  int64_t ensemble() const { return static_cast<int64_t>(seeds_.size()); }
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
  uint64_t Fingerprint(const std::vector<uint64_t>& seeds) const;
  std::string Archive(const std::vector<uint64_t>& seeds, const std::vector<torch::Tensor>& params,
                      const torch::optim::Optimizer& optimizer) const;
  // Per-member mean loss [E] of logits [E, B, V] against targets [E, B].
  torch::Tensor MemberLoss(const torch::Tensor& logits, const torch::Tensor& target) const;

  v1::ExperimentSpec spec_;
  std::vector<uint64_t> seeds_;
  torch::Device device_;
  std::vector<std::unique_ptr<BlockTask>> tasks_;
  std::unique_ptr<ImirModel> model_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::vector<EvalSet> eval_sets_;
  int64_t step_ = 0;
};

}  // namespace circuitlab::engine
