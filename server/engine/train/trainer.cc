#include "server/engine/train/trainer.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <sstream>
#include <utility>

#include "server/common/seeds.h"
#include "server/engine/manifold/projection.h"
#include "server/engine/spec.h"

namespace circuitlab::engine {

namespace {

Batch Concat(const std::vector<Batch>& parts) {
  auto cat = [&](torch::Tensor Batch::*field) {
    std::vector<torch::Tensor> ts;
    for (const Batch& b : parts) ts.push_back(b.*field);
    return torch::cat(ts, 0);
  };
  Batch out;
  out.tokens = cat(&Batch::tokens);
  out.pids = cat(&Batch::pids);
  out.target = cat(&Batch::target);
  out.alt_target = cat(&Batch::alt_target);
  out.query_kind = cat(&Batch::query_kind);
  out.block_of_token = cat(&Batch::block_of_token);
  if (parts[0].bayes_logp.defined()) out.bayes_logp = cat(&Batch::bayes_logp);
  return out;
}

}  // namespace

EnsembleTrainer::EnsembleTrainer(std::vector<v1::ExperimentSpec> members, torch::Device device)
    : TrainerBase(std::move(members), device), batches_([this](int64_t step) {
        std::vector<Batch> out;
        for (size_t e = 0; e < seeds_.size(); ++e) {
          torch::Generator gen = MakeGenerator(BatchSeedOf(seeds_[e], step));
          out.push_back(tasks_[e]->Sample(spec_.training().batch_size(), SampleMode::kTrain, gen));
        }
        return out;
      }) {
  for (uint64_t seed : seeds_) tasks_.push_back(MakeBlockTask(spec_, PoolSeedOf(seed)));
  // A coordinate model's members share the first's basis (PackKey keeps
  // apart the seeds that draw their own).
  model_ = MakeModel(spec_, *tasks_[0], ensemble(), device_);
  InitializeModel(members_, *model_);
  MakeOptimizer(model_->parameters(), model_->parameter_names());

  const int64_t eval_size = spec_.recording().eval_size();
  for (const EvalSetInfo& info : tasks_[0]->EvalSets()) {
    EvalSet set{info, {}};
    for (size_t e = 0; e < seeds_.size(); ++e) {
      // Drawn in chunks so the generator's per-sequence buffers stay bounded.
      torch::Generator gen = MakeGenerator(EvalSeed(seeds_[e], info.mode));
      std::vector<Batch> chunks;
      for (int64_t done = 0; done < eval_size; done += kEvalChunk) {
        chunks.push_back(tasks_[e]->Sample(std::min(kEvalChunk, eval_size - done), info.mode, gen));
      }
      set.per_member.push_back(Concat(chunks));
    }
    eval_sets_.push_back(std::move(set));
  }
}

torch::Tensor EnsembleTrainer::MemberLoss(const torch::Tensor& logits, const torch::Tensor& target) const {
  if (spec_.training().loss() == v1::LOSS_KIND_MSE) {
    torch::Tensor onehot = torch::zeros_like(logits).scatter_(-1, target.unsqueeze(-1), 1.0);
    return (logits - onehot).pow(2).sum(-1).mean(1);
  }
  return (-torch::log_softmax(logits, -1).gather(-1, target.unsqueeze(-1)).squeeze(-1)).mean(1);
}

EnsembleTrainer::Stacked EnsembleTrainer::Stack(const std::vector<const Batch*>& batches, int64_t begin,
                                                int64_t count) const {
  std::vector<torch::Tensor> tok, pid, tgt, alt, bayes;
  for (const Batch* b : batches) {
    tok.push_back(b->tokens.narrow(0, begin, count));
    pid.push_back(b->pids.narrow(0, begin, count));
    tgt.push_back(b->target.narrow(0, begin, count));
    alt.push_back(b->alt_target.narrow(0, begin, count));
    if (b->bayes_logp.defined()) bayes.push_back(b->bayes_logp.narrow(0, begin, count));
  }
  auto join = [&](const std::vector<torch::Tensor>& parts) { return StackTo(parts, device_); };
  Stacked s{join(tok), join(pid), join(tgt), join(alt), {}};
  if (!bayes.empty()) s.bayes_logp = join(bayes);
  return s;
}

std::vector<std::vector<Metric>> EnsembleTrainer::Step(bool record) {
  const int64_t batch = spec_.training().batch_size();
  const int64_t next = step_ + 1;
  const std::vector<Batch> batches = batches_.Take(next, total_steps());
  std::vector<const Batch*> ptrs;
  for (const Batch& b : batches) ptrs.push_back(&b);
  Stacked s = Stack(ptrs, 0, batch);

  torch::Tensor logits = model_->Forward(s.tokens, s.pids);                      // [E, B, V]
  torch::Tensor member_loss = MemberLoss(logits, s.target);                      // [E]
  ZeroGrad();
  // Members share no parameters, so the gradient of the sum is each member's
  // own gradient. (A coordinate model whose readout has no coordinate
  // computes constant logits: nothing to differentiate.)
  if (member_loss.requires_grad()) member_loss.sum().backward();

  std::vector<std::vector<Metric>> out;
  torch::Tensor sq;
  Update(record ? &sq : nullptr);
  if (record) {
    torch::NoGradGuard no_grad;
    torch::Tensor acc = (logits.argmax(-1) == s.target).to(torch::kDouble).mean(1).cpu();
    torch::Tensor loss = member_loss.detach().to(torch::kDouble).cpu();
    torch::Tensor norm = sq.sqrt().cpu();
    for (int64_t e = 0; e < ensemble(); ++e) {
      out.push_back({{"train/loss", loss[e].item<double>()},
                     {"train/accuracy", acc[e].item<double>()},
                     {"train/grad_norm", norm[e].item<double>()}});
    }
  }
  return out;
}

std::vector<std::vector<Metric>> EnsembleTrainer::Evaluate() const {
  torch::NoGradGuard no_grad;
  std::vector<std::vector<Metric>> out(seeds_.size());
  const auto dopts = torch::TensorOptions().dtype(torch::kDouble).device(device_);
  for (const EvalSet& set : eval_sets_) {
    std::vector<const Batch*> ptrs;
    for (const Batch& b : set.per_member) ptrs.push_back(&b);
    const int64_t total = set.per_member[0].tokens.size(0);
    torch::Tensor correct = torch::zeros({ensemble()}, dopts), loss = torch::zeros({ensemble()}, dopts);
    torch::Tensor p_target = torch::zeros({ensemble()}, dopts), p_alt = torch::zeros({ensemble()}, dopts);
    torch::Tensor logit_diff = torch::zeros({ensemble()}, dopts), alt_correct = torch::zeros({ensemble()}, dopts);
    torch::Tensor bayes_loss = torch::zeros({ensemble()}, dopts), bayes_correct = torch::zeros({ensemble()}, dopts);
    bool has_bayes = false;
    for (int64_t begin = 0; begin < total; begin += kEvalChunk) {
      const int64_t count = std::min(kEvalChunk, total - begin);
      Stacked s = Stack(ptrs, begin, count);
      torch::Tensor logits = model_->Forward(s.tokens, s.pids).to(torch::kDouble);  // [E, b, V]
      torch::Tensor logp = torch::log_softmax(logits, -1);
      torch::Tensor lp_t = logp.gather(-1, s.target.unsqueeze(-1)).squeeze(-1);
      torch::Tensor lp_a = logp.gather(-1, s.alt_target.unsqueeze(-1)).squeeze(-1);
      torch::Tensor argmax = logits.argmax(-1);
      correct += (argmax == s.target).to(torch::kDouble).sum(1);
      alt_correct += (argmax == s.alt_target).to(torch::kDouble).sum(1);
      loss += MemberLoss(logits, s.target) * static_cast<double>(count);
      p_target += lp_t.exp().sum(1);
      p_alt += lp_a.exp().sum(1);
      logit_diff += (logits.gather(-1, s.target.unsqueeze(-1)) - logits.gather(-1, s.alt_target.unsqueeze(-1)))
                        .squeeze(-1)
                        .sum(1);
      if (s.bayes_logp.defined()) {
        has_bayes = true;
        bayes_loss -= s.bayes_logp.gather(-1, s.target.unsqueeze(-1)).squeeze(-1).sum(1);
        bayes_correct += (s.bayes_logp.argmax(-1) == s.target).to(torch::kDouble).sum(1);
      }
    }
    const double inv = 1.0 / static_cast<double>(total);
    auto mean = [&](const torch::Tensor& t) { return (t * inv).cpu(); };
    correct = mean(correct);
    loss = mean(loss);
    p_target = mean(p_target);
    p_alt = mean(p_alt);
    logit_diff = mean(logit_diff);
    alt_correct = mean(alt_correct);
    bayes_loss = mean(bayes_loss);
    bayes_correct = mean(bayes_correct);
    const std::string prefix = "eval/" + set.info.name + "/";
    for (int64_t e = 0; e < ensemble(); ++e) {
      out[e].push_back({prefix + "accuracy", correct[e].item<double>()});
      out[e].push_back({prefix + "loss", loss[e].item<double>()});
      out[e].push_back({prefix + "p_target", p_target[e].item<double>()});
      if (set.info.mode == SampleMode::kConflict) {
        // target = in-context partner x (ICL answer), alt = C(a) (IWL answer).
        out[e].push_back({prefix + "p_icl", p_target[e].item<double>()});
        out[e].push_back({prefix + "p_iwl", p_alt[e].item<double>()});
        out[e].push_back({prefix + "logit_diff", logit_diff[e].item<double>()});
      }
      if (!set.info.alt_name.empty()) {
        out[e].push_back({prefix + set.info.alt_name + "_accuracy", alt_correct[e].item<double>()});
      }
      if (has_bayes) {
        // The Bayes-optimal predictor on the same sequences (a floor for the loss).
        out[e].push_back({prefix + "bayes_loss", bayes_loss[e].item<double>()});
        out[e].push_back({prefix + "bayes_accuracy", bayes_correct[e].item<double>()});
      }
    }
  }
  return out;
}

}  // namespace circuitlab::engine
