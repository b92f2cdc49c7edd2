// The latent-task generators of the task-vector paper (SCIENCE.md A.2: E1
// biased dice, E3 Markov-chain mixtures, E4 planted Dyck) and their Bayes
// predictors. Engine-private (includes LibTorch).
//
// A task's parameters are one tensor row per task:
//   DICE    [n, S]      face probabilities
//   MARKOV  [n, S, S]   transition matrices (rows sum to 1)
//   DYCK    [n, 2L]     the path, 0 = up, 1 = down (tokens S and S+1)
// The major and minor pools are drawn once from the pool seed; the OOD pool
// from DeriveSeed(pool seed, "ood"). Every other draw comes from the
// torch::Generator passed in, so a batch is a pure function of both.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "circuitlab/v1/spec.pb.h"

namespace circuitlab::engine {

enum class LatentPool { kMajor = 0, kMinor = 1, kOod = 2 };

struct LatentBatch {
  torch::Tensor tokens;  // [B, T] int64
  torch::Tensor pool;    // [B] int64 (LatentPool)
  torch::Tensor task;    // [B] int64: index into that pool
  torch::Tensor mask;    // DYCK: [B, T] bool, the positions that carry a path symbol; else undefined
};

// The laws a Bayes predictor gives x_{t+1} after x_0..x_t, for every t.
struct Predictive {
  torch::Tensor probs;      // [B, T, V] float64
  torch::Tensor posterior;  // [B, T, K(+1)] float64 over the components (retrieval and hybrid)
};

class LatentTaskGenerator {
 public:
  // `spec` resolved.
  LatentTaskGenerator(const v1::LatentTask& spec, uint64_t pool_seed);

  // Training mixture: a minor task with probability p_minor (when the run has
  // minors), else a uniformly chosen major.
  LatentBatch SampleTrain(int64_t batch, torch::Generator& gen) const;
  // One sequence per entry of `task_ids` [B] from `pool`. DYCK: `shared_mask`
  // [T] bool, when defined, is every sequence's planting mask.
  LatentBatch SamplePool(LatentPool pool, const torch::Tensor& task_ids, torch::Generator& gen,
                         const torch::Tensor& shared_mask = {}) const;
  // Sequences of the tasks whose parameters are `params` (one row per
  // sequence).
  torch::Tensor SampleFrom(const torch::Tensor& params, torch::Generator& gen, const torch::Tensor& shared_mask,
                           torch::Tensor* mask_out) const;
  // `n` fresh tasks from the prior.
  torch::Tensor DrawTasks(int64_t n, torch::Generator& gen) const;
  // A planting mask [T] (DYCK).
  torch::Tensor DrawMask(torch::Generator& gen) const;

  // Retrieval over `tasks` (DICE, MARKOV) with log prior `log_prior` [K].
  Predictive Retrieval(const torch::Tensor& tokens, const torch::Tensor& tasks, const torch::Tensor& log_prior) const;
  // The in-context statistic the extrapolation predictor reads [B, T, S]:
  // counts of each state among x_0..x_t (DICE) or of the transitions out of
  // x_t seen so far (MARKOV).
  torch::Tensor ContextCounts(const torch::Tensor& tokens) const;
  // Extrapolation: Dirichlet-categorical (DICE) or per-row Dirichlet counts
  // (MARKOV) posterior predictive.
  torch::Tensor Extrapolation(const torch::Tensor& tokens) const;
  // The "known majors + Dirichlet-new" hybrid of A.2: p_common spread over
  // the majors, 1 - p_common on one new task with the prior's marginal
  // likelihood. posterior's last column is the new component.
  Predictive Hybrid(const torch::Tensor& tokens, double p_common) const;
  // The exact Bayes predictor of the training mixture (majors share
  // 1 - p_minor, minors p_minor).
  Predictive KnownPool(const torch::Tensor& tokens) const;
  // Posterior over the majors with a uniform prior [B, T, K].
  torch::Tensor MajorPosterior(const torch::Tensor& tokens) const;
  // sum_k weights[b, t, k] * (task k's law of x_{t+1} given x_t), [B, T, V],
  // for `tasks` of this kind (DICE, MARKOV).
  torch::Tensor MixLaws(const torch::Tensor& tokens, const torch::Tensor& weights, const torch::Tensor& tasks) const;
  // Whether this kind has Bayes predictors (DICE and MARKOV).
  bool has_bayes() const { return kind_ != v1::LATENT_KIND_DYCK; }

  const torch::Tensor& pool(LatentPool p) const;
  int64_t num_majors() const { return majors_.size(0); }
  int64_t num_minors() const { return has_minors_ ? minors_.size(0) : 0; }
  int64_t vocab_size() const { return vocab_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t num_states() const { return states_; }
  v1::LatentKind kind() const { return kind_; }
  double p_minor() const { return has_minors_ ? spec_.p_minor() : 0.0; }

 private:
  // Log-likelihood of x_0..x_t under each task, [B, T, K] (cumulative).
  torch::Tensor CumulativeLogLik(const torch::Tensor& tokens, const torch::Tensor& tasks) const;
  // Log marginal likelihood of x_0..x_t under the prior, [B, T].
  torch::Tensor LogMarginalNew(const torch::Tensor& tokens) const;
  Predictive Mixture(const torch::Tensor& tokens, const torch::Tensor& tasks, const torch::Tensor& log_prior,
                     bool with_new, double log_prior_new) const;

  v1::LatentTask spec_;
  v1::LatentKind kind_;
  int64_t states_, vocab_, seq_len_;
  bool has_minors_;
  torch::Tensor majors_, minors_, ood_, background_;
};

}  // namespace circuitlab::engine
