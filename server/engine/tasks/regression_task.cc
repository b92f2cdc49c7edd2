#include "server/engine/tasks/regression_task.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "server/common/seeds.h"
#include "server/engine/torch_util.h"

namespace circuitlab::engine {
namespace {

// log N(y | mean, var), elementwise.
torch::Tensor LogNormal(const torch::Tensor& y, const torch::Tensor& mean, const torch::Tensor& var) {
  return -0.5 * ((y - mean).pow(2) / var + var.log() + std::log(2.0 * M_PI));
}

// Sum over j < i of v[:, j, ...] along dim 1 (an exclusive prefix sum).
torch::Tensor ExclusiveCumsum(const torch::Tensor& v) {
  return v.cumsum(1) - v;
}

}  // namespace

RegressionTaskGenerator::RegressionTaskGenerator(const v1::LatentTask& spec, uint64_t pool_seed)
    : spec_(spec),
      dim_(spec.dim()),
      points_(spec.num_points()),
      sigma_(spec.noise_std()),
      has_minors_(spec.diversity() >= 0) {
  torch::Generator gen = MakeGenerator(pool_seed);
  majors_ = DrawTasks(spec.num_majors(), gen);
  // kappa = -1: one minor task that is never sampled (p_minor 0).
  minors_ = DrawTasks(has_minors_ ? int64_t{1} << spec.diversity() : 1, gen);
  torch::Generator ood = MakeGenerator(DeriveSeed63(pool_seed, "ood"));
  ood_ = DrawTasks(spec.num_ood(), ood);
}

const torch::Tensor& RegressionTaskGenerator::pool(LatentPool p) const {
  switch (p) {
    case LatentPool::kMinor: return minors_;
    case LatentPool::kOod: return ood_;
    default: return majors_;
  }
}

torch::Tensor RegressionTaskGenerator::DrawTasks(int64_t n, torch::Generator& gen) const {
  return torch::randn({n, dim_}, gen, kF64);
}

RegressionBatch RegressionTaskGenerator::SampleFrom(const torch::Tensor& w, torch::Generator& gen) const {
  const int64_t B = w.size(0);
  RegressionBatch b;
  b.x = torch::randn({B, points_, dim_}, gen, kF64);
  b.y = torch::matmul(b.x, w.unsqueeze(-1)).squeeze(-1) + sigma_ * torch::randn({B, points_}, gen, kF64);
  return b;
}

RegressionBatch RegressionTaskGenerator::SamplePool(LatentPool pool_kind, const torch::Tensor& task_ids,
                                                    torch::Generator& gen) const {
  RegressionBatch b = SampleFrom(pool(pool_kind).index_select(0, task_ids.to(torch::kLong)), gen);
  b.task = task_ids.to(torch::kLong);
  b.pool = torch::full({task_ids.size(0)}, static_cast<int64_t>(pool_kind), kI64);
  return b;
}

RegressionBatch RegressionTaskGenerator::SampleTrain(int64_t batch, torch::Generator& gen) const {
  torch::Tensor minor = torch::rand({batch}, gen, kF64) < p_minor();
  torch::Tensor major_id = torch::randint(num_majors(), {batch}, gen, kI64);
  torch::Tensor minor_id = torch::randint(minors_.size(0), {batch}, gen, kI64);
  torch::Tensor w = torch::where(minor.unsqueeze(1), minors_.index_select(0, minor_id), majors_.index_select(0, major_id));
  RegressionBatch b = SampleFrom(w, gen);
  b.pool = minor.to(torch::kLong) * static_cast<int64_t>(LatentPool::kMinor);
  b.task = torch::where(minor, minor_id, major_id);
  return b;
}

torch::Tensor RegressionTaskGenerator::MixPredictions(const torch::Tensor& x, const torch::Tensor& weights,
                                                      const torch::Tensor& tasks) {
  torch::Tensor per_task = torch::matmul(x, tasks.t());  // [B, n, K]
  return (weights * per_task).sum(-1);
}

torch::Tensor RegressionTaskGenerator::PriorLogLik(const torch::Tensor& x, const torch::Tensor& y,
                                                   const torch::Tensor& tasks) const {
  torch::Tensor per_task = torch::matmul(x, tasks.t());  // [B, n, K]
  torch::Tensor var = torch::full({1}, sigma_ * sigma_, kF64);
  return ExclusiveCumsum(LogNormal(y.unsqueeze(-1), per_task, var));
}

torch::Tensor RegressionTaskGenerator::Ridge(const torch::Tensor& x, const torch::Tensor& y, torch::Tensor* var) const {
  const int64_t B = x.size(0), n = x.size(1), d = x.size(2);
  const double s2 = sigma_ * sigma_;
  // A = X^T X + sigma^2 I and b = X^T y over the points seen so far.
  torch::Tensor A = (s2 * torch::eye(d, kF64)).unsqueeze(0).repeat({B, 1, 1});
  torch::Tensor rhs = torch::zeros({B, d}, kF64);
  torch::Tensor mean = torch::empty({B, n}, kF64), v = torch::empty({B, n}, kF64);
  for (int64_t i = 0; i < n; ++i) {
    torch::Tensor xi = x.select(1, i);  // [B, d]
    torch::Tensor sol = torch::linalg_solve(A, torch::stack({rhs, xi}, -1));  // [B, d, 2]
    mean.select(1, i).copy_((sol.select(-1, 0) * xi).sum(-1));
    v.select(1, i).copy_(s2 + s2 * (sol.select(-1, 1) * xi).sum(-1));
    A = A + xi.unsqueeze(-1) * xi.unsqueeze(-2);
    rhs = rhs + y.select(1, i).unsqueeze(-1) * xi;
  }
  if (var != nullptr) *var = v;
  return mean;
}

RegressionPrediction RegressionTaskGenerator::Mixture(const torch::Tensor& x, const torch::Tensor& y,
                                                      const torch::Tensor& tasks, const torch::Tensor& log_prior,
                                                      bool with_new, double log_prior_new) const {
  torch::Tensor logpost = PriorLogLik(x, y, tasks) + log_prior.view({1, 1, -1});
  torch::Tensor ridge;
  if (with_new) {
    torch::Tensor var;
    ridge = Ridge(x, y, &var);
    // The new task's marginal likelihood of the points before i, by the chain rule.
    torch::Tensor marginal = ExclusiveCumsum(LogNormal(y, ridge, var));
    logpost = torch::cat({logpost, (marginal + log_prior_new).unsqueeze(-1)}, -1);
  }
  RegressionPrediction p;
  p.posterior = torch::softmax(logpost, -1);
  const int64_t K = tasks.size(0);
  p.mean = MixPredictions(x, p.posterior.narrow(-1, 0, K), tasks);
  if (with_new) p.mean += p.posterior.select(-1, K) * ridge;
  return p;
}

RegressionPrediction RegressionTaskGenerator::Retrieval(const torch::Tensor& x, const torch::Tensor& y,
                                                        const torch::Tensor& tasks,
                                                        const torch::Tensor& log_prior) const {
  return Mixture(x, y, tasks, log_prior, false, 0.0);
}

RegressionPrediction RegressionTaskGenerator::Hybrid(const torch::Tensor& x, const torch::Tensor& y,
                                                     double p_common) const {
  const double K = static_cast<double>(num_majors());
  torch::Tensor prior = torch::full({num_majors()}, std::log(p_common / K), kF64);
  return Mixture(x, y, majors_, prior, true, std::log1p(-p_common));
}

RegressionPrediction RegressionTaskGenerator::KnownPool(const torch::Tensor& x, const torch::Tensor& y) const {
  const double pm = p_minor();
  const double K = static_cast<double>(num_majors());
  if (pm <= 0.0) return Retrieval(x, y, majors_, torch::full({num_majors()}, -std::log(K), kF64));
  torch::Tensor tasks = torch::cat({majors_, minors_}, 0);
  torch::Tensor prior = torch::cat({torch::full({num_majors()}, std::log((1.0 - pm) / K), kF64),
                                    torch::full({minors_.size(0)}, std::log(pm / minors_.size(0)), kF64)});
  return Retrieval(x, y, tasks, prior);
}

torch::Tensor RegressionTaskGenerator::MajorPosterior(const torch::Tensor& x, const torch::Tensor& y) const {
  return torch::softmax(PriorLogLik(x, y, majors_), -1);
}

}  // namespace circuitlab::engine
