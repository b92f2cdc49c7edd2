#include "server/engine/train/trainer.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <sstream>

#include "server/common/seeds.h"
#include "server/engine/manifold/projection.h"
#include "server/engine/spec.h"

namespace circuitlab::engine {

torch::Generator MakeGenerator(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

uint64_t EvalSeed(uint64_t seed, SampleMode mode) {
  return DeriveSeed63(seed, "eval", static_cast<uint64_t>(mode));
}

namespace {

constexpr int64_t kCheckpointFormat = 1;

// Seeds of one member, by purpose (SCIENCE.md 0.3).
uint64_t InitSeed(uint64_t seed) { return DeriveSeed63(seed, "init"); }
uint64_t BatchSeed(uint64_t seed, int64_t step) { return DeriveSeed63(seed, "batch", static_cast<uint64_t>(step)); }

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const v1::TrainingSpec& t,
                                                       const std::vector<torch::Tensor>& params) {
  if (t.optimizer() == v1::OPTIMIZER_KIND_ADAM) {
    auto opts = torch::optim::AdamOptions(t.learning_rate())
                    .betas({t.adam_beta1(), t.adam_beta2()})
                    .weight_decay(t.weight_decay());
    return std::make_unique<torch::optim::Adam>(params, opts);
  }
  auto opts = torch::optim::SGDOptions(t.learning_rate()).momentum(t.momentum()).weight_decay(t.weight_decay());
  return std::make_unique<torch::optim::SGD>(params, opts);
}

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

std::unique_ptr<ImirModel> MakeModel(const v1::ExperimentSpec& spec, const BlockTask& task, int64_t ensemble,
                                     torch::Device device, bool float64) {
  const auto& m = spec.model().imir();
  ImirModelConfig cfg;
  cfg.vocab = task.vocab_size();
  cfg.positions = task.num_positions();
  cfg.layers = m.num_layers();
  cfg.heads = m.num_heads();
  cfg.zero_init = m.init() == v1::INIT_SCHEME_ZERO;
  cfg.init_std = m.init_std();
  cfg.float64 = float64;
  if (m.parameterisation() == v1::PARAMETERISATION_COORDINATES) {
    auto cc = std::make_shared<CoordinateConfig>();
    cc->basis = BuildBasis(task.Symmetry(), m.num_layers(), m.num_heads(),
                           m.coordinate_basis() == v1::BASIS_SELECTION_COMPLETE ? Selection::kComplete
                                                                                : Selection::kPaper);
    cc->trained = TrainedCoordinates(spec, cc->basis);
    cc->unit_norm = m.coordinate_scaling() != v1::COORDINATE_SCALING_RAW;
    cfg.coordinates = std::move(cc);
  }
  return std::make_unique<ImirModel>(cfg, ensemble, device);
}

void InitializeModel(const v1::ExperimentSpec& spec, const std::vector<uint64_t>& member_seeds, ImirModel& model) {
  std::vector<uint64_t> init_seeds;
  for (uint64_t seed : member_seeds) init_seeds.push_back(InitSeed(seed));
  const auto& m = spec.model().imir();
  if (!model.coordinate_model()) {
    model.Initialize(init_seeds);
    return;
  }
  if (m.init() == v1::INIT_SCHEME_PROJECTED) {
    // The FULL model's NORMAL init of the same seeds, projected.
    ImirModelConfig full = model.config();
    full.coordinates = nullptr;
    full.zero_init = false;
    ImirModel dense(full, model.ensemble(), torch::kCPU);
    dense.Initialize(init_seeds);
    for (int64_t e = 0; e < model.ensemble(); ++e) {
      std::vector<torch::Tensor> kq;
      for (int64_t l = 0; l < full.layers; ++l) kq.push_back(dense.kq(l)[e].detach());
      model.AssignDense(e, kq, dense.readout()[e].detach());
    }
  } else {
    model.Initialize(init_seeds);
  }
  const Basis& basis = model.config().coordinates->basis;
  for (const auto& [name, value] : m.initial_coordinates()) {
    const int32_t id = FindCoordinate(basis, name);
    if (id < 0) continue;  // ResolveSpec rejected unknown names
    for (int64_t e = 0; e < model.ensemble(); ++e) model.SetRawCoordinate(e, id, value);
  }
}

EnsembleTrainer::EnsembleTrainer(const v1::ExperimentSpec& spec, std::vector<uint64_t> member_seeds,
                                 torch::Device device)
    : spec_(spec), seeds_(std::move(member_seeds)), device_(device) {
  for (uint64_t seed : seeds_) tasks_.push_back(MakeBlockTask(spec_, PoolSeedOf(seed)));
  model_ = MakeModel(spec_, *tasks_[0], ensemble(), device_);
  InitializeModel(spec_, seeds_, *model_);
  optimizer_ = MakeOptimizer(spec_.training(), model_->parameters());

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
  Stacked s{torch::stack(tok).to(device_), torch::stack(pid).to(device_), torch::stack(tgt).to(device_),
            torch::stack(alt).to(device_), {}};
  if (!bayes.empty()) s.bayes_logp = torch::stack(bayes).to(device_);
  return s;
}

std::vector<std::vector<Metric>> EnsembleTrainer::Step(bool record) {
  const int64_t batch = spec_.training().batch_size();
  const int64_t next = step_ + 1;
  std::vector<Batch> batches;
  std::vector<const Batch*> ptrs;
  for (size_t e = 0; e < seeds_.size(); ++e) {
    torch::Generator gen = MakeGenerator(BatchSeed(seeds_[e], next));
    batches.push_back(tasks_[e]->Sample(batch, SampleMode::kTrain, gen));
  }
  for (const Batch& b : batches) ptrs.push_back(&b);
  Stacked s = Stack(ptrs, 0, batch);

  torch::Tensor logits = model_->Forward(s.tokens, s.pids);                      // [E, B, V]
  torch::Tensor member_loss = MemberLoss(logits, s.target);                      // [E]
  optimizer_->zero_grad();
  // Members share no parameters, so the gradient of the sum is each member's
  // own gradient. (A coordinate model whose readout has no coordinate
  // computes constant logits: nothing to differentiate.)
  if (member_loss.requires_grad()) member_loss.sum().backward();

  std::vector<std::vector<Metric>> out;
  if (record) {
    torch::NoGradGuard no_grad;
    torch::Tensor sq = torch::zeros({ensemble()}, torch::TensorOptions().dtype(torch::kDouble).device(device_));
    for (const torch::Tensor& p : model_->parameters()) {
      if (p.grad().defined()) sq += p.grad().to(torch::kDouble).pow(2).flatten(1).sum(1);
    }
    torch::Tensor acc = (logits.argmax(-1) == s.target).to(torch::kDouble).mean(1).cpu();
    torch::Tensor loss = member_loss.detach().to(torch::kDouble).cpu();
    torch::Tensor norm = sq.sqrt().cpu();
    for (int64_t e = 0; e < ensemble(); ++e) {
      out.push_back({{"train/loss", loss[e].item<double>()},
                     {"train/accuracy", acc[e].item<double>()},
                     {"train/grad_norm", norm[e].item<double>()}});
    }
  }
  optimizer_->step();
  step_ = next;
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

uint64_t EnsembleTrainer::Fingerprint(const std::vector<uint64_t>& seeds) const {
  // What determines the trajectory: task, data, model, training and seeds.
  uint64_t h = HashPurpose(spec_.task().SerializeAsString());
  h = Mix64(h ^ HashPurpose(spec_.data().SerializeAsString()));
  h = Mix64(h ^ HashPurpose(spec_.model().SerializeAsString()));
  h = Mix64(h ^ HashPurpose(spec_.training().SerializeAsString()));
  for (uint64_t s : seeds) h = Mix64(h ^ s);
  return h >> 1;
}

std::string EnsembleTrainer::Archive(const std::vector<uint64_t>& seeds, const std::vector<torch::Tensor>& params,
                                     const torch::optim::Optimizer& optimizer) const {
  torch::serialize::OutputArchive archive;
  archive.write("format", torch::tensor(kCheckpointFormat));
  archive.write("fingerprint", torch::tensor(static_cast<int64_t>(Fingerprint(seeds))));
  archive.write("step", torch::tensor(step_));
  std::vector<int64_t> s(seeds.begin(), seeds.end());
  archive.write("rng/member_seeds", torch::tensor(s));
  const auto names = model_->parameter_names();
  for (size_t i = 0; i < params.size(); ++i) archive.write("param/" + names[i], params[i].detach().cpu());
  torch::serialize::OutputArchive opt;
  optimizer.save(opt);
  archive.write("optimizer", opt);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

std::string EnsembleTrainer::SaveCheckpoint() const { return Archive(seeds_, model_->parameters(), *optimizer_); }

std::string EnsembleTrainer::SaveMemberCheckpoint(int64_t member) const {
  if (ensemble() == 1) return SaveCheckpoint();
  // A one-member optimizer over slices of the parameters, its state sliced
  // from the ensemble's: the checkpoint a one-member run would have written.
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> params;
  for (const torch::Tensor& p : model_->parameters()) {
    params.push_back(p.narrow(0, member, 1).detach().clone().requires_grad_(true));
  }
  std::unique_ptr<torch::optim::Optimizer> single = MakeOptimizer(spec_.training(), params);
  const auto key = [](const torch::Tensor& t) { return c10::guts::to_string(t.unsafeGetTensorImpl()); };
  const auto slice = [&](const torch::Tensor& t) { return t.defined() ? t.narrow(0, member, 1).clone() : t; };
  const auto full = model_->parameters();
  for (size_t i = 0; i < full.size(); ++i) {
    auto it = optimizer_->state().find(key(full[i]));
    if (it == optimizer_->state().end()) continue;
    if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) {
      auto st = std::make_unique<torch::optim::AdamParamState>();
      st->step(adam->step());
      st->exp_avg(slice(adam->exp_avg()));
      st->exp_avg_sq(slice(adam->exp_avg_sq()));
      st->max_exp_avg_sq(slice(adam->max_exp_avg_sq()));
      single->state()[key(params[i])] = std::move(st);
    } else if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
      auto st = std::make_unique<torch::optim::SGDParamState>();
      st->momentum_buffer(slice(sgd->momentum_buffer()));
      single->state()[key(params[i])] = std::move(st);
    }
  }
  return Archive({seeds_[static_cast<size_t>(member)]}, params, *single);
}

uint64_t PoolSeedOf(uint64_t member_seed) { return DeriveSeed63(member_seed, "pool"); }

absl::Status LoadWeights(const std::string& checkpoint, ImirModel& model) {
  torch::serialize::InputArchive archive;
  std::istringstream in(checkpoint);
  archive.load_from(in, torch::kCPU);
  torch::Tensor format;
  archive.read("format", format);
  if (format.item<int64_t>() != kCheckpointFormat) {
    return absl::InvalidArgumentError("checkpoint format " + std::to_string(format.item<int64_t>()) +
                                      " is not supported");
  }
  const auto names = model.parameter_names();
  const auto params = model.parameters();
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    torch::Tensor t;
    archive.read("param/" + names[i], t);
    if (!t.sizes().equals(params[i].sizes())) {
      return absl::InvalidArgumentError("checkpoint parameter " + names[i] + " has shape " +
                                        c10::str(t.sizes()) + ", the spec's model " + c10::str(params[i].sizes()));
    }
    params[i].copy_(t);
  }
  return absl::OkStatus();
}

absl::Status EnsembleTrainer::LoadCheckpoint(const std::string& bytes) {
  torch::serialize::InputArchive archive;
  std::istringstream in(bytes);
  archive.load_from(in, device_);
  torch::Tensor format, fingerprint, step;
  archive.read("format", format);
  if (format.item<int64_t>() != kCheckpointFormat) {
    return absl::InvalidArgumentError("checkpoint format " + std::to_string(format.item<int64_t>()) +
                                      " is not supported (expected " + std::to_string(kCheckpointFormat) + ")");
  }
  archive.read("fingerprint", fingerprint);
  if (static_cast<uint64_t>(fingerprint.item<int64_t>()) != Fingerprint(seeds_)) {
    return absl::InvalidArgumentError("checkpoint belongs to a different spec, seed or ensemble");
  }
  archive.read("step", step);
  const auto names = model_->parameter_names();
  const auto params = model_->parameters();
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      torch::Tensor t;
      archive.read("param/" + names[i], t);
      params[i].copy_(t);
    }
  }
  torch::serialize::InputArchive opt;
  archive.read("optimizer", opt);
  optimizer_->load(opt);
  step_ = step.item<int64_t>();
  return absl::OkStatus();
}

}  // namespace circuitlab::engine
