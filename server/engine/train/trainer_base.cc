#include "server/engine/train/trainer_base.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <sstream>
#include <utility>

#include "server/common/seeds.h"
#include "server/engine/torch_compat.h"

namespace circuitlab::engine {
namespace {


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

// An empty per-parameter state of the spec's optimiser, to deserialize into.
std::unique_ptr<torch::optim::OptimizerParamState> NewParamState(const v1::TrainingSpec& t) {
  switch (t.optimizer()) {
    case v1::OPTIMIZER_KIND_ADAM:
      return std::make_unique<torch::optim::AdamParamState>();
    case v1::OPTIMIZER_KIND_ADAMW:
      return std::make_unique<torch::optim::AdamWParamState>();
    default:
      return std::make_unique<torch::optim::SGDParamState>();
  }
}

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

std::vector<v1::ExperimentSpec> MembersOf(const v1::ExperimentSpec& spec, const std::vector<uint64_t>& seeds) {
  std::vector<v1::ExperimentSpec> members(seeds.size(), spec);
  for (size_t e = 0; e < seeds.size(); ++e) members[e].set_seed(seeds[e]);
  return members;
}

TrainerBase::TrainerBase(std::vector<v1::ExperimentSpec> members, torch::Device device)
    : members_(std::move(members)), spec_(members_.at(0)), device_(device) {
  for (const v1::ExperimentSpec& m : members_) seeds_.push_back(m.seed());
}

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

uint64_t CheckpointFingerprint(const v1::ExperimentSpec& spec, const std::vector<uint64_t>& seeds) {
  // What determines the trajectory: task, data, model, training and seeds.
  uint64_t h = HashPurpose(spec.task().SerializeAsString());
  h = Mix64(h ^ HashPurpose(spec.data().SerializeAsString()));
  h = Mix64(h ^ HashPurpose(spec.model().SerializeAsString()));
  h = Mix64(h ^ HashPurpose(spec.training().SerializeAsString()));
  for (uint64_t s : seeds) h = Mix64(h ^ s);
  return h >> 1;
}

uint64_t TrainerBase::EnsembleFingerprint() const {
  const uint64_t shared = CheckpointFingerprint(spec_, {});
  const bool seeds_only = std::all_of(members_.begin(), members_.end(), [&](const v1::ExperimentSpec& m) {
    return CheckpointFingerprint(m, {}) == shared;
  });
  // What every ensemble wrote before a pack's members could differ in more.
  if (seeds_only) return CheckpointFingerprint(spec_, seeds_);
  uint64_t h = shared;
  for (const v1::ExperimentSpec& m : members_) h = Mix64(h ^ CheckpointFingerprint(m, {m.seed()}));
  return h >> 1;
}

absl::Status CheckCheckpoint(const v1::ExperimentSpec& spec, int64_t step, const std::string& bytes) {
  torch::serialize::InputArchive archive;
  int64_t format = 0;
  if (absl::Status s = OpenArchive(bytes, torch::kCPU, archive, format); !s.ok()) return s;
  return ReadGuarded(archive, [&]() -> absl::Status {
    torch::Tensor fingerprint, at;
    archive.read("fingerprint", fingerprint);
    if (static_cast<uint64_t>(fingerprint.item<int64_t>()) != CheckpointFingerprint(spec, {spec.seed()})) {
      return absl::InvalidArgumentError("the checkpoint belongs to a different spec or seed");
    }
    archive.read("step", at);
    if (at.item<int64_t>() != step) {
      return absl::InvalidArgumentError("the checkpoint is of step " + std::to_string(at.item<int64_t>()) +
                                        ", not " + std::to_string(step));
    }
    return absl::OkStatus();
  });
}

std::string TrainerBase::Archive(uint64_t fingerprint, const std::vector<uint64_t>& seeds,
                                 const std::vector<torch::Tensor>& params,
                                 const std::vector<const torch::optim::OptimizerParamState*>& states) const {
  torch::serialize::OutputArchive archive;
  archive.write("format", torch::tensor(kCheckpointFormat));
  archive.write("torch_version", c10::IValue(TorchVersion()));
  archive.write("fingerprint", torch::tensor(static_cast<int64_t>(fingerprint)));
  archive.write("step", torch::tensor(step_));
  std::vector<int64_t> s(seeds.begin(), seeds.end());
  archive.write("rng/member_seeds", torch::tensor(s));
  for (size_t i = 0; i < params.size(); ++i) {
    archive.write("param/" + names_[i], params[i].detach().cpu());
    if (states[i] == nullptr) continue;  // no step yet, or plain SGD
    torch::serialize::OutputArchive state(archive.compilation_unit());
    states[i]->serialize(state);
    archive.write("optim/" + names_[i], state);
  }
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

const torch::optim::OptimizerParamState* TrainerBase::StateOf(size_t i) const {
  auto it = optimizer_->state().find(StateKeyOf(params_[i]));
  return it == optimizer_->state().end() ? nullptr : it->second.get();
}

std::string TrainerBase::SaveCheckpoint() const {
  std::vector<const torch::optim::OptimizerParamState*> states;
  for (size_t i = 0; i < params_.size(); ++i) states.push_back(StateOf(i));
  return Archive(EnsembleFingerprint(), seeds_, params_, states);
}

std::string TrainerBase::SaveMemberCheckpoint(int64_t member) const {
  if (ensemble() == 1) return SaveCheckpoint();
  // Slices of the parameters and of their optimiser state: the checkpoint a
  // one-member run would have written.
  torch::NoGradGuard no_grad;
  const auto slice = [&](const torch::Tensor& t) { return t.defined() ? t.narrow(0, member, 1).clone() : t; };
  std::vector<torch::Tensor> params;
  std::vector<std::unique_ptr<torch::optim::OptimizerParamState>> owned;
  std::vector<const torch::optim::OptimizerParamState*> states;
  for (size_t i = 0; i < params_.size(); ++i) {
    params.push_back(slice(params_[i].detach()));
    const torch::optim::OptimizerParamState* full = StateOf(i);
    if (const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(full)) {
      owned.push_back(SliceAdamState(*adamw, slice));
    } else if (const auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(full)) {
      owned.push_back(SliceAdamState(*adam, slice));
    } else if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(full)) {
      auto st = std::make_unique<torch::optim::SGDParamState>();
      st->momentum_buffer(slice(sgd->momentum_buffer()));
      owned.push_back(std::move(st));
    } else {
      owned.push_back(nullptr);
    }
    states.push_back(owned.back().get());
  }
  const v1::ExperimentSpec& own = member_spec(member);
  return Archive(CheckpointFingerprint(own, {own.seed()}), {own.seed()}, params, states);
}

absl::Status TrainerBase::LoadCheckpoint(const std::string& bytes) {
  torch::serialize::InputArchive archive;
  int64_t format = 0;
  if (absl::Status s = OpenArchive(bytes, device_, archive, format); !s.ok()) return s;
  return ReadGuarded(archive, [&]() -> absl::Status {
    torch::Tensor fingerprint, step;
    archive.read("fingerprint", fingerprint);
    if (static_cast<uint64_t>(fingerprint.item<int64_t>()) != EnsembleFingerprint()) {
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
    LoadOptimizerState(archive, format);
    step_ = step.item<int64_t>();
    return absl::OkStatus();
  });
}

void TrainerBase::LoadOptimizerState(torch::serialize::InputArchive& archive, int64_t format) {
  // Format 1 ("optimizer" as LibTorch saves it): the "state" sub-archive's
  // keys are the ones the parameter group lists ("param_groups" >
  // "param_groups/0" > "params/i"), in the order of params_ (one group, made
  // from params_).
  torch::serialize::InputArchive v1_states, v1_group;
  if (format == 1) {
    torch::serialize::InputArchive opt, groups;
    archive.read("optimizer", opt);
    opt.read("state", v1_states);
    opt.read("param_groups", groups);
    groups.read("param_groups/0", v1_group);
  }
  auto& states = optimizer_->state();
  states.clear();
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::serialize::InputArchive saved;
    bool found;
    if (format == 1) {
      c10::IValue key;
      v1_group.read("params/" + std::to_string(i), key);
      found = v1_states.try_read(key.toStringRef(), saved);
    } else {
      found = archive.try_read("optim/" + names_[i], saved);
    }
    if (!found) continue;
    std::unique_ptr<torch::optim::OptimizerParamState> state = NewParamState(spec_.training());
    state->serialize(saved);
    states[StateKeyOf(params_[i])] = std::move(state);
  }
}

}  // namespace circuitlab::engine
