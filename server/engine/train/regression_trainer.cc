#include "server/engine/train/regression_trainer.h"

#include "server/engine/spec.h"
#include "server/engine/train/latent_trainer.h"

namespace circuitlab::engine {
namespace {

// Sequences per chunk of the known-pool predictor of an evaluation set.
constexpr int64_t kRegressionEvalBayesChunk = 64;

}  // namespace

RegressionTrainer::RegressionTrainer(std::vector<v1::ExperimentSpec> members, torch::Device device)
    : DecoderTrainer(std::move(members), device, [this](int64_t step) {
        std::vector<torch::Tensor> xs, ys;
        for (size_t e = 0; e < seeds_.size(); ++e) {
          torch::Generator gen = MakeGenerator(BatchSeedOf(seeds_[e], step));
          RegressionBatch b = tasks_[e]->SampleTrain(spec_.training().batch_size(), gen);
          xs.push_back(b.x);
          ys.push_back(b.y);
        }
        return std::pair{PinFor(torch::stack(xs).to(torch::kFloat), device_),
                         PinFor(torch::stack(ys).to(torch::kFloat), device_)};
      }) {
  const int64_t n = spec_.recording().eval_size();
  const std::vector<LatentEvalSetDef> defs = LatentEvalSets(tasks_[0]->num_minors() > 0);
  for (size_t i = 0; i < defs.size(); ++i) {
    EvalSet set;
    set.name = defs[i].name;
    set.reference_is_ridge = defs[i].pool != LatentPool::kMajor;
    std::vector<torch::Tensor> xs, ys, retrieval, ridge;
    for (size_t e = 0; e < seeds_.size(); ++e) {
      const RegressionTaskGenerator& task = *tasks_[e];
      torch::Generator gen = MakeGenerator(LatentEvalSeed(seeds_[e], static_cast<int>(i)));
      const int64_t pool_size = task.pool(defs[i].pool).size(0);
      RegressionBatch b = task.SamplePool(defs[i].pool, torch::arange(n, torch::kLong).remainder(pool_size), gen);
      xs.push_back(b.x);
      ys.push_back(b.y);
      std::vector<torch::Tensor> parts;  // the known-pool posterior is [chunk, n, tasks]
      for (int64_t s = 0; s < n; s += kRegressionEvalBayesChunk) {
        const int64_t c = std::min(kRegressionEvalBayesChunk, n - s);
        parts.push_back(task.KnownPool(b.x.narrow(0, s, c), b.y.narrow(0, s, c)).mean);
      }
      retrieval.push_back(torch::cat(parts, 0));
      ridge.push_back(task.Ridge(b.x, b.y));
    }
    set.x = torch::stack(xs).to(torch::kFloat).to(device_);
    set.y = torch::stack(ys).to(torch::kFloat).to(device_);
    set.retrieval = torch::stack(retrieval);
    set.ridge = torch::stack(ridge);
    eval_sets_.push_back(std::move(set));
  }
}

std::vector<std::vector<Metric>> RegressionTrainer::Step(bool record) {
  const int64_t next = step_ + 1;
  const auto [xs, ys] = batches_.Take(next, total_steps());
  torch::Tensor x = Upload(xs, device_);  // [E, B, n, d]
  torch::Tensor y = Upload(ys, device_);  // [E, B, n]
  return TrainStep(x.size(1), next, record, [&](int64_t lo, int64_t count) {
    torch::Tensor xp = x.narrow(1, lo, count), yp = y.narrow(1, lo, count);
    torch::Tensor pred = PredictRegression(*model_, xp, yp);
    return PartOutput{(pred - yp).pow(2).mean(at::IntArrayRef{1, 2}), {}};  // [E]
  });
}

std::vector<std::vector<Metric>> RegressionTrainer::Evaluate() const {
  torch::NoGradGuard no_grad;
  std::vector<std::vector<Metric>> out(seeds_.size());
  for (const EvalSet& set : eval_sets_) {
    const int64_t N = set.x.size(1);
    std::vector<torch::Tensor> parts;
    for (int64_t b = 0; b < N; b += kLatentEvalChunk) {
      const int64_t count = std::min(kLatentEvalChunk, N - b);
      parts.push_back(PredictRegression(*model_, set.x.narrow(1, b, count), set.y.narrow(1, b, count))
                          .to(torch::kDouble)
                          .cpu());
    }
    torch::Tensor pred = torch::cat(parts, 1);  // [E, N, n]
    torch::Tensor y = set.y.to(torch::kDouble).cpu();
    auto mse = [](const torch::Tensor& a, const torch::Tensor& b) { return (a - b).pow(2).mean(at::IntArrayRef{1, 2}); };
    const torch::Tensor loss = mse(pred, y), retrieval = mse(set.retrieval, y), ridge = mse(set.ridge, y);
    const torch::Tensor to_retrieval = mse(pred, set.retrieval), to_ridge = mse(pred, set.ridge);
    const std::string prefix = "eval/" + set.name + "/";
    for (int64_t e = 0; e < ensemble(); ++e) {
      const double ref = (set.reference_is_ridge ? ridge : retrieval)[e].item<double>();
      out[e].push_back({prefix + "loss", loss[e].item<double>()});
      out[e].push_back({prefix + "bayes_loss", ref});
      out[e].push_back({prefix + "retrieval_loss", retrieval[e].item<double>()});
      out[e].push_back({prefix + "ridge_loss", ridge[e].item<double>()});
      out[e].push_back({prefix + "to_retrieval", to_retrieval[e].item<double>()});
      out[e].push_back({prefix + "to_ridge", to_ridge[e].item<double>()});
    }
  }
  return out;
}

}  // namespace circuitlab::engine
