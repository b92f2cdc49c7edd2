// E2 of the task-vector paper (SCIENCE.md A.2): in-context linear regression
// with continuous tokens, its task pools and its Bayes predictors.
// Engine-private (includes LibTorch).
//
// A task is a weight vector w in R^d (one row of [n, d]); a sequence holds
// num_points pairs x_i ~ N(0, I_d), y_i = w.x_i + eps_i, eps_i ~ N(0, sigma^2).
// Pools as for the token tasks (LatentTaskGenerator): majors and minors from
// the pool seed, every w ~ N(0, I_d), the OOD pool from DeriveSeed(pool seed,
// "ood"); every other draw from the torch::Generator passed in.
//
// Every predictor predicts y_i from (x_j, y_j)_{j < i} and x_i, for every i.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "circuitlab/v1/spec.pb.h"
#include "server/engine/tasks/latent_task.h"

namespace circuitlab::engine {

struct RegressionBatch {
  torch::Tensor x;     // [B, n, d] float64
  torch::Tensor y;     // [B, n] float64
  torch::Tensor pool;  // [B] int64 (LatentPool)
  torch::Tensor task;  // [B] int64: index into that pool
};

// A predictor's answer for every point: the predictive mean of y_i, and for
// the mixtures the posterior over the components before y_i is seen.
struct RegressionPrediction {
  torch::Tensor mean;       // [B, n] float64
  torch::Tensor posterior;  // [B, n, K(+1)] float64 (retrieval, hybrid)
};

class RegressionTaskGenerator {
 public:
  // `spec` resolved, kind LATENT_KIND_REGRESSION.
  RegressionTaskGenerator(const v1::LatentTask& spec, uint64_t pool_seed);

  // A minor task with probability p_minor (when the run has minors), else a
  // uniformly chosen major.
  RegressionBatch SampleTrain(int64_t batch, torch::Generator& gen) const;
  // One sequence per entry of `task_ids` [B] from `pool`.
  RegressionBatch SamplePool(LatentPool pool, const torch::Tensor& task_ids, torch::Generator& gen) const;
  // Sequences of the weight vectors `w` [B, d] (one per sequence).
  RegressionBatch SampleFrom(const torch::Tensor& w, torch::Generator& gen) const;
  // `n` fresh tasks from the prior N(0, I_d), [n, d].
  torch::Tensor DrawTasks(int64_t n, torch::Generator& gen) const;

  // Retrieval: the posterior over `tasks` [K, d] (log prior [K]) from the
  // Gaussian likelihood N(y_j | w_k.x_j, sigma^2); mean sum_k a_ik w_k.x_i.
  RegressionPrediction Retrieval(const torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& tasks,
                                 const torch::Tensor& log_prior) const;
  // Extrapolation: Bayesian ridge, the posterior mean of a fresh task,
  // w_i = (X^T X + sigma^2 I)^-1 X^T y over the points before i. `var`, when
  // given, receives the predictive variance sigma^2 + sigma^2 x_i^T (X^T X +
  // sigma^2 I)^-1 x_i.
  torch::Tensor Ridge(const torch::Tensor& x, const torch::Tensor& y, torch::Tensor* var = nullptr) const;
  // The "known majors + new task" hybrid of A.2: p_common over the majors,
  // 1 - p_common on a fresh task (ridge, with its marginal likelihood).
  // posterior's last column is the new component.
  RegressionPrediction Hybrid(const torch::Tensor& x, const torch::Tensor& y, double p_common) const;
  // The exact Bayes predictor of the training mixture.
  RegressionPrediction KnownPool(const torch::Tensor& x, const torch::Tensor& y) const;
  // Posterior over the majors with a uniform prior [B, n, K].
  torch::Tensor MajorPosterior(const torch::Tensor& x, const torch::Tensor& y) const;
  // sum_k weights[b, i, k] * w_k.x_i for `tasks` [K, d], [B, n].
  static torch::Tensor MixPredictions(const torch::Tensor& x, const torch::Tensor& weights, const torch::Tensor& tasks);

  const torch::Tensor& pool(LatentPool p) const;
  int64_t num_majors() const { return majors_.size(0); }
  int64_t num_minors() const { return has_minors_ ? minors_.size(0) : 0; }
  int64_t dim() const { return dim_; }
  int64_t num_points() const { return points_; }
  double noise_std() const { return sigma_; }
  double p_minor() const { return has_minors_ ? spec_.p_minor() : 0.0; }

 private:
  // sum_{j < i} log N(y_j | w_k.x_j, sigma^2), [B, n, K].
  torch::Tensor PriorLogLik(const torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& tasks) const;
  RegressionPrediction Mixture(const torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& tasks,
                               const torch::Tensor& log_prior, bool with_new, double log_prior_new) const;

  v1::LatentTask spec_;
  int64_t dim_, points_;
  double sigma_;
  bool has_minors_;
  torch::Tensor majors_, minors_, ood_;
};

}  // namespace circuitlab::engine
