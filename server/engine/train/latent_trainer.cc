#include "server/engine/train/latent_trainer.h"

#include "server/common/seeds.h"
#include "server/engine/models/decoder_kernels.h"
#include "server/engine/spec.h"

namespace circuitlab::engine {
namespace {

// Sequences per chunk when the Bayes predictors of an evaluation set are
// computed (the known-pool posterior is [chunk, T, tasks]).
constexpr int64_t kLatentEvalBayesChunk = 64;

// log q(x_{t+1}) of a predictor's laws [N, T, V] at the realised tokens, [N, T-1].
torch::Tensor NextLogProb(const torch::Tensor& probs, const torch::Tensor& tokens) {
  const int64_t T = tokens.size(1);
  torch::Tensor next = tokens.narrow(1, 1, T - 1).unsqueeze(-1);
  return probs.narrow(1, 0, T - 1).gather(-1, next).squeeze(-1).clamp_min(1e-300).log();
}

}  // namespace

std::vector<std::vector<Metric>> DecoderTrainMetrics(const torch::Tensor& member_loss, const torch::Tensor& sq,
                                                     double lr,
                                                     const std::vector<std::pair<const char*, torch::Tensor>>& extra) {
  const torch::Tensor loss = member_loss.detach().to(torch::kDouble).cpu(), norm = sq.sqrt().cpu();
  std::vector<std::vector<Metric>> out;
  for (int64_t e = 0; e < loss.size(0); ++e) {
    std::vector<Metric> m = {{"train/loss", loss[e].item<double>()}};
    for (const auto& [name, values] : extra) m.push_back({name, values[e].item<double>()});
    m.push_back({"train/grad_norm", norm[e].item<double>()});
    m.push_back({"train/lr", lr});
    out.push_back(std::move(m));
  }
  return out;
}

LatentTrainer::LatentTrainer(std::vector<v1::ExperimentSpec> members, torch::Device device)
    : DecoderTrainer(std::move(members), device, [this](int64_t step) {
        std::vector<torch::Tensor> toks;
        for (size_t e = 0; e < seeds_.size(); ++e) {
          torch::Generator gen = MakeGenerator(BatchSeedOf(seeds_[e], step));
          toks.push_back(tasks_[e]->SampleTrain(spec_.training().batch_size(), gen).tokens);
        }
        return PinFor(torch::stack(toks), device_);
      }) {
  const int64_t n = spec_.recording().eval_size();
  const std::vector<LatentEvalSetDef> defs = LatentEvalSets(tasks_[0]->num_minors() > 0);
  for (size_t i = 0; i < defs.size(); ++i) {
    EvalSet set{defs[i].name, {}, {}};
    for (size_t e = 0; e < seeds_.size(); ++e) {
      const LatentTaskGenerator& task = *tasks_[e];
      torch::Generator gen = MakeGenerator(LatentEvalSeed(seeds_[e], static_cast<int>(i)));
      const int64_t pool_size = task.pool(defs[i].pool).size(0);
      torch::Tensor ids = torch::arange(n, torch::kLong).remainder(pool_size);
      torch::Tensor tokens = task.SamplePool(defs[i].pool, ids, gen).tokens;
      set.tokens.push_back(tokens);
      if (!task.has_bayes()) {
        set.bayes.emplace_back();
        continue;
      }
      std::vector<torch::Tensor> parts;
      for (int64_t b = 0; b < n; b += kLatentEvalBayesChunk) {
        torch::Tensor chunk = tokens.narrow(0, b, std::min(kLatentEvalBayesChunk, n - b));
        torch::Tensor probs =
            defs[i].pool == LatentPool::kMajor ? task.KnownPool(chunk).probs : task.Extrapolation(chunk);
        parts.push_back(NextLogProb(probs, chunk));
      }
      set.bayes.push_back(torch::cat(parts, 0));
    }
    eval_sets_.push_back(std::move(set));
  }
}

std::vector<std::vector<Metric>> LatentTrainer::Step(bool record) {
  const int64_t next = step_ + 1;
  torch::Tensor tokens = Upload(batches_.Take(next, total_steps()), device_);  // [E, B, T]
  return TrainStep(tokens.size(1), next, record, [&](int64_t lo, int64_t count) {
    torch::Tensor part = tokens.narrow(1, lo, count);
    torch::Tensor logits = model_->Forward(part);             // [E, b, T, V]
    PartOutput out{NextTokenLoss(logits, part).mean(1), {}};  // [E]
    if (record) {
      torch::NoGradGuard no_grad;
      const int64_t T = part.size(2);
      torch::Tensor hit = logits.narrow(2, 0, T - 1).argmax(-1) == part.narrow(2, 1, T - 1);
      out.extra.push_back({"train/accuracy", hit.to(torch::kDouble).flatten(1).mean(1)});
    }
    return out;
  });
}

std::vector<std::vector<Metric>> LatentTrainer::Evaluate() const {
  torch::NoGradGuard no_grad;
  std::vector<std::vector<Metric>> out(seeds_.size());
  for (const EvalSet& set : eval_sets_) {
    const int64_t n = set.tokens[0].size(0), T = set.tokens[0].size(1);
    torch::Tensor loss = torch::zeros({ensemble()}, torch::kDouble), acc = torch::zeros({ensemble()}, torch::kDouble);
    for (int64_t b = 0; b < n; b += kLatentEvalChunk) {
      const int64_t count = std::min(kLatentEvalChunk, n - b);
      std::vector<torch::Tensor> parts;
      for (const torch::Tensor& t : set.tokens) parts.push_back(t.narrow(0, b, count));
      torch::Tensor tokens = torch::stack(parts).to(device_);
      torch::Tensor logits = model_->Forward(tokens);
      loss += NextTokenLoss(logits, tokens).to(torch::kDouble).sum(1).cpu();
      acc +=
          (logits.narrow(2, 0, T - 1).argmax(-1) == tokens.narrow(2, 1, T - 1)).to(torch::kDouble).mean(2).sum(1).cpu();
    }
    const std::string prefix = "eval/" + set.name + "/";
    for (int64_t e = 0; e < ensemble(); ++e) {
      out[e].push_back({prefix + "loss", loss[e].item<double>() / static_cast<double>(n)});
      out[e].push_back({prefix + "accuracy", acc[e].item<double>() / static_cast<double>(n)});
      if (set.bayes[static_cast<size_t>(e)].defined()) {
        out[e].push_back({prefix + "bayes_loss", -set.bayes[static_cast<size_t>(e)].mean().item<double>()});
      }
    }
  }
  return out;
}

}  // namespace circuitlab::engine
