// What every ensemble trainer shares (IMIR block models and the decoder of
// the latent tasks): the optimiser with its learning-rate schedule and
// per-member gradient clipping, and checkpoints (whole ensemble or one
// member) with the RNG state. Engine-private (includes LibTorch).
//
// Randomness is counter-based: the batch of step s comes from a generator
// seeded with DeriveSeed(seed, "batch", s). The RNG state a checkpoint needs to
// resume is therefore (seed, step), which it stores with the weights and the
// optimiser state.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "circuitlab/v1/spec.pb.h"
#include "server/engine/api.h"
#include "server/engine/setup/checkpoint_io.h"
#include "server/engine/torch_util.h"

namespace circuitlab::engine {

// What a checkpoint records of its spec (task, data, model, training) and
// member seeds, to refuse one that belongs to another run.
uint64_t CheckpointFingerprint(const v1::ExperimentSpec& spec, const std::vector<uint64_t>& seeds);

// The members of a one-spec ensemble: `spec` once per seed, with that seed.
std::vector<v1::ExperimentSpec> MembersOf(const v1::ExperimentSpec& spec, const std::vector<uint64_t>& seeds);

// The learning rate of (1-based) `step` under the spec's schedule.
double ScheduledLearningRate(const v1::TrainingSpec& training, int64_t step);

// Draws the training batch of step s + 1 on a background thread while step
// s trains. A batch is a pure function of (member seeds, step) (counter-based
// randomness, above), so prefetching changes the wall time only: the same
// batches in the same order, resume untouched. `make(step)` must not touch
// the trainer's mutable state. One sampler thread lives as long as the
// prefetcher (a thread per step cost ~50 us, 0.5% of a 10 ms IMIR step); a
// one-slot hand-off, so at most one batch is drawn ahead. An exception
// thrown by `make` reaches the caller of the Take that wanted the batch.
template <typename Batch>
class BatchPrefetcher {
 public:
  explicit BatchPrefetcher(std::function<Batch(int64_t)> make) : make_(std::move(make)) {}
  ~BatchPrefetcher() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (sampler_.joinable()) sampler_.join();
  }
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  // The batch of `step` (the prefetched one when it is that step's), then
  // starts drawing step + 1's unless `step` is the last.
  Batch Take(int64_t step, int64_t last) {
    const auto start = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !busy_; });  // a batch in flight finishes first
    std::optional<Batch> b;
    std::exception_ptr error;
    if (drawn_step_ == step) {
      b = std::move(slot_);
      error = error_;
    }
    drawn_step_ = -1;
    slot_.reset();
    error_ = nullptr;
    if (step < last) {
      if (!sampler_.joinable()) sampler_ = std::thread([this] { Loop(); });
      wanted_step_ = step + 1;
      busy_ = true;
      cv_.notify_all();
    }
    lock.unlock();
    if (error) std::rethrow_exception(error);
    Batch out = b ? std::move(*b) : make_(step);
    waited_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return out;
  }

  // Seconds the callers of Take spent waiting for a batch (a draw still in
  // flight, or one drawn inline): what data generation costs the step.
  // Read it on the thread that calls Take.
  double waited_seconds() const { return waited_; }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || busy_; });
      if (stop_) return;
      const int64_t step = wanted_step_;
      lock.unlock();
      std::optional<Batch> b;
      std::exception_ptr error;
      try {
        b = make_(step);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      slot_ = std::move(b);
      error_ = error;
      drawn_step_ = step;
      busy_ = false;
      cv_.notify_all();
    }
  }

  std::function<Batch(int64_t)> make_;
  double waited_ = 0;  // Take's caller's thread only
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool busy_ = false;  // the sampler is drawing wanted_step_
  int64_t wanted_step_ = -1;
  int64_t drawn_step_ = -1;  // slot_ (or error_) holds this step's batch; -1: empty
  std::optional<Batch> slot_;
  std::exception_ptr error_;
  std::thread sampler_;  // last: joined before the state above goes
};

class TrainerBase {
 public:
  virtual ~TrainerBase() = default;

  // Runs the next step. When `record` is set, returns each member's training
  // metrics of this step (loss, accuracy, gradient norm, learning rate); else
  // an empty vector.
  virtual std::vector<std::vector<Metric>> Step(bool record) = 0;
  // Seconds Step has waited for its training batches so far (data
  // generation not hidden behind the previous step). The training thread's.
  virtual double data_wait_seconds() const = 0;
  // Evaluation metrics of every member on its fixed evaluation sets.
  virtual std::vector<std::vector<Metric>> Evaluate() const = 0;

  // Weights, optimiser state and RNG state (seeds + step).
  std::string SaveCheckpoint() const;
  // Member `member` alone: the checkpoint a one-member trainer with its seed
  // would have written at this step (so a packed run resumes on its own).
  std::string SaveMemberCheckpoint(int64_t member) const;
  // Reads checkpoints of every format and LibTorch release this build
  // supports (torch_compat.h). InvalidArgument when the checkpoint belongs to
  // another spec or ensemble or has an unknown format; DataLoss when LibTorch
  // cannot parse it (the message names both releases).
  absl::Status LoadCheckpoint(const std::string& bytes);

  int64_t step() const { return step_; }
  int64_t total_steps() const { return static_cast<int64_t>(spec_.training().steps()); }
  int64_t ensemble() const { return static_cast<int64_t>(seeds_.size()); }
  // Member e's own resolved spec (its seed, and its own values of the
  // settings a pack lets members differ in: PackKey).
  const v1::ExperimentSpec& member_spec(int64_t e) const { return members_[static_cast<size_t>(e)]; }
  // What a checkpoint holds, for tests that compare a loaded trainer with the
  // one that wrote it.
  const std::vector<torch::Tensor>& parameters() const { return params_; }
  const std::vector<std::string>& parameter_names() const { return names_; }
  const torch::optim::Optimizer& optimizer() const { return *optimizer_; }

 protected:
  // `members`: resolved specs that train as one ensemble (PackableTogether);
  // spec_ is the first, whose shared settings (model shape, training,
  // recording) are every member's.
  TrainerBase(std::vector<v1::ExperimentSpec> members, torch::Device device);
  // Call once the model exists.
  void MakeOptimizer(const std::vector<torch::Tensor>& params, const std::vector<std::string>& names);
  // Before backward.
  void ZeroGrad() { optimizer_->zero_grad(); }
  // After backward: the schedule's rate, per-member clipping, the update;
  // the step counter advances. `grad_sq` (when not null) receives each
  // member's squared gradient norm before clipping [E] (float64).
  void Update(torch::Tensor* grad_sq);
  // Per-member squared gradient norm [E] (float64).
  torch::Tensor GradSquaredNorms() const;

  std::vector<v1::ExperimentSpec> members_;
  v1::ExperimentSpec spec_;
  std::vector<uint64_t> seeds_;
  torch::Device device_;
  int64_t step_ = 0;

 private:
  // The whole ensemble's: CheckpointFingerprint(spec_, seeds_) when the
  // members differ in their seed only, else every member's folded.
  uint64_t EnsembleFingerprint() const;
  // The checkpoint of `params` (named names_) with their optimiser states
  // (null: none yet) at step_.
  std::string Archive(uint64_t fingerprint, const std::vector<uint64_t>& seeds,
                      const std::vector<torch::Tensor>& params,
                      const std::vector<const torch::optim::OptimizerParamState*>& states) const;
  // The optimiser's state of params_[i], or null.
  const torch::optim::OptimizerParamState* StateOf(size_t i) const;
  // Replaces the optimiser's state with the checkpoint's (format 1 or 2).
  // Throws LibTorch's errors on a damaged archive.
  void LoadOptimizerState(torch::serialize::InputArchive& archive, int64_t format);

  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

}  // namespace circuitlab::engine
