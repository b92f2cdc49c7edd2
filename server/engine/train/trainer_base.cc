#include "server/engine/train/trainer_base.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <sstream>

#include "server/common/seeds.h"

namespace circuitlab::engine {
namespace {

constexpr int64_t kCheckpointFormat = 1;

std::unique_ptr<torch::optim::Optimizer> NewOptimizer(const v1::TrainingSpec& t,
                                                      const std::vector<torch::Tensor>& params) {
  switch (t.optimizer()) {
    case v1::OPTIMIZER_KIND_ADAM:
      return std::make_unique<torch::optim::Adam>(
          params, torch::optim::AdamOptions(t.learning_rate())
                      .betas({t.adam_beta1(), t.adam_beta2()})
                      .weight_decay(t.weight_decay()));
    case v1::OPTIMIZER_KIND_ADAMW:
      return std::make_unique<torch::optim::AdamW>(
          params, torch::optim::AdamWOptions(t.learning_rate())
                      .betas({t.adam_beta1(), t.adam_beta2()})
                      .weight_decay(t.weight_decay()));
    default:
      return std::make_unique<torch::optim::SGD>(
          params,
          torch::optim::SGDOptions(t.learning_rate()).momentum(t.momentum()).weight_decay(t.weight_decay()));
  }
}

std::string StateKey(const torch::Tensor& t) { return c10::guts::to_string(t.unsafeGetTensorImpl()); }

// One member's slice of an Adam or AdamW parameter state (same fields).
template <typename State, typename Slice>
std::unique_ptr<State> SliceAdamState(const State& full, const Slice& slice) {
  auto st = std::make_unique<State>();
  st->step(full.step());
  st->exp_avg(slice(full.exp_avg()));
  st->exp_avg_sq(slice(full.exp_avg_sq()));
  st->max_exp_avg_sq(slice(full.max_exp_avg_sq()));
  return st;
}

}  // namespace

uint64_t InitSeedOf(uint64_t seed) { return DeriveSeed63(seed, "init"); }
uint64_t BatchSeedOf(uint64_t seed, int64_t step) { return DeriveSeed63(seed, "batch", static_cast<uint64_t>(step)); }
uint64_t PoolSeedOf(uint64_t member_seed) { return DeriveSeed63(member_seed, "pool"); }

double ScheduledLearningRate(const v1::TrainingSpec& t, int64_t step) {
  if (t.schedule() != v1::LR_SCHEDULE_TRIANGLE) return t.learning_rate();
  const double peak = t.learning_rate(), low = t.min_learning_rate();
  const double total = static_cast<double>(std::max<uint64_t>(1, t.steps()));
  const double warm = std::round(t.warmup_fraction() * total);
  const double s = static_cast<double>(step);
  if (warm > 0 && s <= warm) return low + (peak - low) * s / warm;
  if (total <= warm) return peak;
  return peak - (peak - low) * (s - warm) / (total - warm);
}

TrainerBase::TrainerBase(const v1::ExperimentSpec& spec, std::vector<uint64_t> member_seeds, torch::Device device)
    : spec_(spec), seeds_(std::move(member_seeds)), device_(device) {}

void TrainerBase::MakeOptimizer(const std::vector<torch::Tensor>& params, const std::vector<std::string>& names) {
  params_ = params;
  names_ = names;
  optimizer_ = NewOptimizer(spec_.training(), params_);
}

torch::Tensor TrainerBase::GradSquaredNorms() const {
  torch::Tensor sq = torch::zeros({ensemble()}, torch::TensorOptions().dtype(torch::kDouble).device(device_));
  for (const torch::Tensor& p : params_) {
    if (p.grad().defined()) sq += p.grad().to(torch::kDouble).pow(2).flatten(1).sum(1);
  }
  return sq;
}

void TrainerBase::Update(torch::Tensor* grad_sq) {
  const int64_t next = step_ + 1;
  const auto& t = spec_.training();
  const bool clip = t.grad_clip() > 0;
  if (grad_sq != nullptr || clip) {
    torch::NoGradGuard no_grad;
    torch::Tensor sq = GradSquaredNorms();
    if (grad_sq != nullptr) *grad_sq = sq;
    if (clip) {
      // Per member, as torch.nn.utils.clip_grad_norm_ on a lone model.
      torch::Tensor factor = (t.grad_clip() / (sq.sqrt() + 1e-6)).clamp_max(1.0);
      for (const torch::Tensor& p : params_) {
        if (!p.grad().defined()) continue;
        std::vector<int64_t> shape(static_cast<size_t>(p.dim()), 1);
        shape[0] = ensemble();
        p.grad().mul_(factor.to(p.scalar_type()).view(shape));
      }
    }
  }
  if (t.schedule() == v1::LR_SCHEDULE_TRIANGLE) {
    const double lr = ScheduledLearningRate(t, next);
    for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
  }
  optimizer_->step();
  step_ = next;
}

uint64_t TrainerBase::Fingerprint(const std::vector<uint64_t>& seeds) const {
  // What determines the trajectory: task, data, model, training and seeds.
  uint64_t h = HashPurpose(spec_.task().SerializeAsString());
  h = Mix64(h ^ HashPurpose(spec_.data().SerializeAsString()));
  h = Mix64(h ^ HashPurpose(spec_.model().SerializeAsString()));
  h = Mix64(h ^ HashPurpose(spec_.training().SerializeAsString()));
  for (uint64_t s : seeds) h = Mix64(h ^ s);
  return h >> 1;
}

std::string TrainerBase::Archive(const std::vector<uint64_t>& seeds, const std::vector<torch::Tensor>& params,
                                 const torch::optim::Optimizer& optimizer) const {
  torch::serialize::OutputArchive archive;
  archive.write("format", torch::tensor(kCheckpointFormat));
  archive.write("fingerprint", torch::tensor(static_cast<int64_t>(Fingerprint(seeds))));
  archive.write("step", torch::tensor(step_));
  std::vector<int64_t> s(seeds.begin(), seeds.end());
  archive.write("rng/member_seeds", torch::tensor(s));
  for (size_t i = 0; i < params.size(); ++i) archive.write("param/" + names_[i], params[i].detach().cpu());
  torch::serialize::OutputArchive opt;
  optimizer.save(opt);
  archive.write("optimizer", opt);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

std::string TrainerBase::SaveCheckpoint() const { return Archive(seeds_, params_, *optimizer_); }

std::string TrainerBase::SaveMemberCheckpoint(int64_t member) const {
  if (ensemble() == 1) return SaveCheckpoint();
  // A one-member optimizer over slices of the parameters, its state sliced
  // from the ensemble's: the checkpoint a one-member run would have written.
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> params;
  for (const torch::Tensor& p : params_) params.push_back(p.narrow(0, member, 1).detach().clone().requires_grad_(true));
  std::unique_ptr<torch::optim::Optimizer> single = NewOptimizer(spec_.training(), params);
  const auto slice = [&](const torch::Tensor& t) { return t.defined() ? t.narrow(0, member, 1).clone() : t; };
  for (size_t i = 0; i < params_.size(); ++i) {
    auto it = optimizer_->state().find(StateKey(params_[i]));
    if (it == optimizer_->state().end()) continue;
    if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) {
      single->state()[StateKey(params[i])] = SliceAdamState(*adamw, slice);
    } else if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) {
      single->state()[StateKey(params[i])] = SliceAdamState(*adam, slice);
    } else if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
      auto st = std::make_unique<torch::optim::SGDParamState>();
      st->momentum_buffer(slice(sgd->momentum_buffer()));
      single->state()[StateKey(params[i])] = std::move(st);
    }
  }
  if (spec_.training().schedule() == v1::LR_SCHEDULE_TRIANGLE) {
    for (auto& group : single->param_groups()) group.options().set_lr(optimizer_->param_groups()[0].options().get_lr());
  }
  return Archive({seeds_[static_cast<size_t>(member)]}, params, *single);
}

absl::Status LoadWeights(const std::string& checkpoint, const std::vector<std::string>& names,
                         const std::vector<torch::Tensor>& params) {
  torch::serialize::InputArchive archive;
  std::istringstream in(checkpoint);
  archive.load_from(in, torch::kCPU);
  torch::Tensor format;
  archive.read("format", format);
  if (format.item<int64_t>() != kCheckpointFormat) {
    return absl::InvalidArgumentError("checkpoint format " + std::to_string(format.item<int64_t>()) +
                                      " is not supported");
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    torch::Tensor t;
    if (!archive.try_read("param/" + names[i], t)) {
      return absl::InvalidArgumentError("checkpoint has no parameter " + names[i] + " (it belongs to another model)");
    }
    if (!t.sizes().equals(params[i].sizes())) {
      return absl::InvalidArgumentError("checkpoint parameter " + names[i] + " has shape " + c10::str(t.sizes()) +
                                        ", the spec's model " + c10::str(params[i].sizes()));
    }
    params[i].copy_(t);
  }
  return absl::OkStatus();
}

absl::Status TrainerBase::LoadCheckpoint(const std::string& bytes) {
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
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      torch::Tensor t;
      archive.read("param/" + names_[i], t);
      params_[i].copy_(t);
    }
  }
  torch::serialize::InputArchive opt;
  archive.read("optimizer", opt);
  optimizer_->load(opt);
  step_ = step.item<int64_t>();
  return absl::OkStatus();
}

}  // namespace circuitlab::engine
