#include "server/engine/tasks/latent_task.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "server/common/seeds.h"
#include "server/engine/torch_util.h"

namespace circuitlab::engine {
namespace {

// Rows ~ Dirichlet(alpha 1_S) for every leading index of `shape` (last dim S).
torch::Tensor Dirichlet(std::vector<int64_t> shape, double alpha, torch::Generator& gen) {
  torch::Tensor g = at::_standard_gamma(torch::full(shape, alpha, kF64), gen);
  // Gamma draws of small alpha can underflow to 0 in a whole row; keep laws proper.
  g = g.clamp_min(1e-300);
  return g / g.sum(-1, true);
}

// Uniform Dyck paths of 2n steps (Arnold-Sleep): with r unmatched ups and k
// steps left, the next step is down with probability r (k + r + 2) / (2k (r + 1)).
torch::Tensor DyckPaths(int64_t count, int64_t n, torch::Generator& gen) {
  torch::Tensor path = torch::zeros({count, 2 * n}, kI64);
  torch::Tensor r = torch::zeros({count}, kF64);
  for (int64_t step = 0; step < 2 * n; ++step) {
    const double k = static_cast<double>(2 * n - step);
    torch::Tensor p_down = r * (k + r + 2.0) / (2.0 * k * (r + 1.0));
    torch::Tensor down = torch::rand({count}, gen, kF64) < p_down;
    path.select(1, step).copy_(down.to(torch::kLong));
    r = r + torch::where(down, -1.0, 1.0);
  }
  return path;
}

// log Gamma-ratio sum of a Dirichlet-multinomial: log B(alpha + n) - log B(alpha)
// over the last dim of counts.
torch::Tensor LogDirMult(const torch::Tensor& counts, double alpha) {
  const int64_t S = counts.size(-1);
  const double sa = alpha * static_cast<double>(S);
  return std::lgamma(sa) - torch::lgamma(sa + counts.sum(-1)) + (torch::lgamma(counts + alpha) - std::lgamma(alpha)).sum(-1);
}

// MAJOR_POOL_DISJOINT: the S faces shuffled, split into n runs as even as
// possible (the first S mod n one longer); weight 1 on a major's run and
// 0.005 elsewhere, normalised [n, S].
torch::Tensor DisjointMajors(int64_t n, int64_t S, torch::Generator& gen) {
  constexpr double kOutside = 0.005;
  const torch::Tensor perm = torch::randperm(S, gen, kI64);
  torch::Tensor w = torch::full({n, S}, kOutside, kF64);
  for (int64_t i = 0, start = 0; i < n; ++i) {
    const int64_t size = S / n + (i < S % n ? 1 : 0);
    w[i].index_fill_(0, perm.slice(0, start, start + size), 1.0);
    start += size;
  }
  return w / w.sum(-1, true);
}

}  // namespace

LatentTaskGenerator::LatentTaskGenerator(const v1::LatentTask& spec, uint64_t pool_seed)
    : spec_(spec),
      kind_(spec.kind()),
      states_(spec.num_states()),
      vocab_(spec.num_states() + (spec.kind() == v1::LATENT_KIND_DYCK ? 2 : 0)),
      seq_len_(spec.seq_len()),
      has_minors_(spec.diversity() >= 0) {
  torch::Generator gen = MakeGenerator(pool_seed);
  if (kind_ == v1::LATENT_KIND_DYCK) background_ = Dirichlet({states_}, 1.0, gen);
  majors_ = kind_ == v1::LATENT_KIND_DICE && spec.major_pool() == v1::MAJOR_POOL_DISJOINT
                ? DisjointMajors(spec.num_majors(), states_, gen)
                : DrawTasks(spec.num_majors(), gen);
  // kappa = -1: the pool holds one minor task that is never sampled (p_minor 0).
  minors_ = DrawTasks(has_minors_ ? int64_t{1} << spec.diversity() : 1, gen);
  torch::Generator ood = MakeGenerator(DeriveSeed63(pool_seed, "ood"));
  ood_ = DrawTasks(spec.num_ood(), ood);
}

const torch::Tensor& LatentTaskGenerator::pool(LatentPool p) const {
  switch (p) {
    case LatentPool::kMinor: return minors_;
    case LatentPool::kOod: return ood_;
    default: return majors_;
  }
}

torch::Tensor LatentTaskGenerator::DrawTasks(int64_t n, torch::Generator& gen) const {
  const double a = spec_.dirichlet_alpha();
  switch (kind_) {
    case v1::LATENT_KIND_MARKOV: return Dirichlet({n, states_, states_}, a, gen);
    case v1::LATENT_KIND_DYCK: return DyckPaths(n, spec_.dyck_length(), gen);
    default: return Dirichlet({n, states_}, a, gen);
  }
}

torch::Tensor LatentTaskGenerator::DrawMask(torch::Generator& gen) const {
  return torch::rand({seq_len_}, gen, kF64) < spec_.repeat_prob();
}

torch::Tensor LatentTaskGenerator::SampleFrom(const torch::Tensor& params, torch::Generator& gen,
                                              const torch::Tensor& shared_mask, torch::Tensor* mask_out) const {
  const int64_t B = params.size(0), T = seq_len_;
  if (kind_ == v1::LATENT_KIND_DICE) return torch::multinomial(params, T, /*replacement=*/true, gen);
  if (kind_ == v1::LATENT_KIND_MARKOV) {
    torch::Tensor tokens = torch::empty({B, T}, kI64);
    torch::Tensor x = torch::randint(states_, {B}, gen, kI64);
    tokens.select(1, 0).copy_(x);
    const torch::Tensor rows = torch::arange(B, kI64);
    for (int64_t t = 1; t < T; ++t) {
      torch::Tensor law = params.index({rows, x});  // [B, S]
      x = torch::multinomial(law, 1, true, gen).squeeze(1);
      tokens.select(1, t).copy_(x);
    }
    return tokens;
  }
  // DYCK: background i.i.d., then the path written in order at the masked positions.
  torch::Tensor tokens = torch::multinomial(background_.unsqueeze(0).expand({B, states_}), T, true, gen);
  torch::Tensor mask = shared_mask.defined() ? shared_mask.to(torch::kBool).unsqueeze(0).expand({B, T}).clone()
                                             : torch::rand({B, T}, gen, kF64) < spec_.repeat_prob();
  const int64_t L = params.size(1);
  torch::Tensor rank = mask.to(torch::kLong).cumsum(1) - 1;  // index of the path symbol written there
  mask = mask & (rank < L);
  torch::Tensor symbol = params.gather(1, rank.clamp(0, L - 1)) + states_;
  tokens = torch::where(mask, symbol, tokens);
  if (mask_out != nullptr) *mask_out = mask;
  return tokens;
}

LatentBatch LatentTaskGenerator::SamplePool(LatentPool pool_kind, const torch::Tensor& task_ids,
                                            torch::Generator& gen, const torch::Tensor& shared_mask) const {
  LatentBatch b;
  b.task = task_ids.to(torch::kLong);
  b.pool = torch::full({task_ids.size(0)}, static_cast<int64_t>(pool_kind), kI64);
  b.tokens = SampleFrom(pool(pool_kind).index_select(0, b.task), gen, shared_mask,
                        kind_ == v1::LATENT_KIND_DYCK ? &b.mask : nullptr);
  return b;
}

LatentBatch LatentTaskGenerator::SampleTrain(int64_t batch, torch::Generator& gen) const {
  torch::Tensor minor = torch::rand({batch}, gen, kF64) < p_minor();
  torch::Tensor major_id = torch::randint(num_majors(), {batch}, gen, kI64);
  torch::Tensor minor_id = torch::randint(minors_.size(0), {batch}, gen, kI64);
  torch::Tensor major_params = majors_.index_select(0, major_id);
  torch::Tensor minor_params = minors_.index_select(0, minor_id);
  const std::vector<int64_t> view = [&] {
    std::vector<int64_t> v(static_cast<size_t>(major_params.dim()), 1);
    v[0] = batch;
    return v;
  }();
  LatentBatch b;
  b.pool = minor.to(torch::kLong) * static_cast<int64_t>(LatentPool::kMinor);
  b.task = torch::where(minor, minor_id, major_id);
  b.tokens = SampleFrom(torch::where(minor.view(view), minor_params, major_params), gen, {},
                        kind_ == v1::LATENT_KIND_DYCK ? &b.mask : nullptr);
  return b;
}

torch::Tensor LatentTaskGenerator::MixLaws(const torch::Tensor& tokens, const torch::Tensor& weights,
                                           const torch::Tensor& tasks) const {
  const int64_t K = tasks.size(0);
  if (kind_ == v1::LATENT_KIND_DICE) return torch::matmul(weights, tasks);  // [B, T, K] x [K, S]
  // MARKOV: sum_k w_k T_k[x_t, :], one state at a time (never [B, T, K, S]).
  torch::Tensor out = torch::zeros({tokens.size(0), tokens.size(1), states_}, kF64);
  for (int64_t s = 0; s < states_; ++s) {
    torch::Tensor at = (tokens == s).unsqueeze(-1).to(torch::kDouble);
    out += at * torch::matmul(weights, tasks.select(1, s).reshape({K, states_}));
  }
  return out;
}

torch::Tensor LatentTaskGenerator::CumulativeLogLik(const torch::Tensor& tokens, const torch::Tensor& tasks) const {
  torch::Tensor logt = tasks.clamp_min(1e-300).log();
  if (kind_ == v1::LATENT_KIND_DICE) {
    return logt.t().index_select(0, tokens.flatten()).view({tokens.size(0), tokens.size(1), -1}).cumsum(1);
  }
  // MARKOV: the first state is uniform under every task (no evidence).
  const int64_t B = tokens.size(0), T = tokens.size(1), K = tasks.size(0);
  torch::Tensor ll = torch::zeros({B, T, K}, kF64);
  if (T > 1) {
    torch::Tensor pair = tokens.narrow(1, 0, T - 1) * states_ + tokens.narrow(1, 1, T - 1);  // [B, T-1]
    torch::Tensor flat = logt.view({K, states_ * states_}).t();                               // [S*S, K]
    ll.narrow(1, 1, T - 1).copy_(flat.index_select(0, pair.flatten()).view({B, T - 1, K}));
  }
  return ll.cumsum(1);
}

torch::Tensor LatentTaskGenerator::LogMarginalNew(const torch::Tensor& tokens) const {
  const double a = spec_.dirichlet_alpha();
  torch::Tensor onehot = torch::one_hot(tokens, states_).to(torch::kDouble);  // [B, T, S]
  if (kind_ == v1::LATENT_KIND_DICE) return LogDirMult(onehot.cumsum(1), a);
  const int64_t B = tokens.size(0), T = tokens.size(1);
  torch::Tensor counts = torch::zeros({B, T, states_ * states_}, kF64);
  if (T > 1) {
    torch::Tensor pair = tokens.narrow(1, 0, T - 1) * states_ + tokens.narrow(1, 1, T - 1);
    counts.narrow(1, 1, T - 1).copy_(torch::one_hot(pair, states_ * states_).to(torch::kDouble));
  }
  return LogDirMult(counts.cumsum(1).view({B, T, states_, states_}), a).sum(-1);
}

torch::Tensor LatentTaskGenerator::ContextCounts(const torch::Tensor& tokens) const {
  torch::Tensor onehot = torch::one_hot(tokens, states_).to(torch::kDouble);
  if (kind_ == v1::LATENT_KIND_DICE) return onehot.cumsum(1);
  // MARKOV: transition counts out of x_t up to t, row x_t.
  const int64_t B = tokens.size(0), T = tokens.size(1);
  torch::Tensor counts = torch::zeros({B, T, states_, states_}, kF64);
  if (T > 1) {
    // transitions (x_{s-1} -> x_s) for s <= t
    torch::Tensor from = onehot.narrow(1, 0, T - 1).unsqueeze(-1);  // [B, T-1, S, 1]
    torch::Tensor to = onehot.narrow(1, 1, T - 1).unsqueeze(-2);    // [B, T-1, 1, S]
    counts.narrow(1, 1, T - 1).copy_(from * to);
  }
  counts = counts.cumsum(1);
  return (counts * onehot.unsqueeze(-1)).sum(2);  // [B, T, S]: row x_t
}

torch::Tensor LatentTaskGenerator::Extrapolation(const torch::Tensor& tokens) const {
  const double a = spec_.dirichlet_alpha();
  torch::Tensor counts = ContextCounts(tokens);
  return (counts + a) / (counts.sum(-1, true) + a * static_cast<double>(states_));
}

Predictive LatentTaskGenerator::Mixture(const torch::Tensor& tokens, const torch::Tensor& tasks,
                                        const torch::Tensor& log_prior, bool with_new, double log_prior_new) const {
  torch::Tensor logpost = CumulativeLogLik(tokens, tasks) + log_prior.view({1, 1, -1});
  if (with_new) logpost = torch::cat({logpost, (LogMarginalNew(tokens) + log_prior_new).unsqueeze(-1)}, -1);
  Predictive p;
  p.posterior = torch::softmax(logpost, -1);
  const int64_t K = tasks.size(0);
  p.probs = MixLaws(tokens, p.posterior.narrow(-1, 0, K), tasks);
  if (with_new) p.probs += p.posterior.narrow(-1, K, 1) * Extrapolation(tokens);
  return p;
}

Predictive LatentTaskGenerator::Retrieval(const torch::Tensor& tokens, const torch::Tensor& tasks,
                                          const torch::Tensor& log_prior) const {
  return Mixture(tokens, tasks, log_prior, false, 0.0);
}

Predictive LatentTaskGenerator::Hybrid(const torch::Tensor& tokens, double p_common) const {
  const double K = static_cast<double>(num_majors());
  torch::Tensor prior = torch::full({num_majors()}, std::log(p_common / K), kF64);
  return Mixture(tokens, majors_, prior, true, std::log1p(-p_common));
}

Predictive LatentTaskGenerator::KnownPool(const torch::Tensor& tokens) const {
  const double pm = p_minor();
  if (pm <= 0.0) return Retrieval(tokens, majors_, torch::full({num_majors()}, -std::log(num_majors()), kF64));
  torch::Tensor tasks = torch::cat({majors_, minors_}, 0);
  torch::Tensor prior = torch::cat({torch::full({num_majors()}, std::log((1.0 - pm) / num_majors()), kF64),
                                    torch::full({minors_.size(0)}, std::log(pm / minors_.size(0)), kF64)});
  return Retrieval(tokens, tasks, prior);
}

torch::Tensor LatentTaskGenerator::MajorPosterior(const torch::Tensor& tokens) const {
  return torch::softmax(CumulativeLogLik(tokens, majors_), -1);
}

}  // namespace circuitlab::engine
