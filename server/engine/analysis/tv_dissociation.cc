// E.18-E.20 at one layer (D.5.10-D.5.13): the joint probe and the task
// subspace, its removal, the optimised orthogonal direction V_opt against
// random controls, their cross-entropy effects per group, and what V_opt
// encodes. One of the task-vector analyses (task_vectors.cc runs them).
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/common/seeds.h"
#include "server/engine/analysis/task_vectors.h"
#include "server/engine/torch_util.h"
#include "server/engine/setup/decoder_setup.h"

namespace circuitlab::engine {
namespace {

// The mean cross-entropy of the first prediction (of token 1 from token 0):
// the loss before any context, from which the in-context gain is measured.
double FirstCe(const DecoderModel& model, const torch::Tensor& tokens) {
  double total = 0;
  const int64_t N = tokens.size(0);
  for (int64_t b = 0; b < N; b += kTvChunk) {
    torch::Tensor chunk = tokens.narrow(0, b, std::min(kTvChunk, N - b)).unsqueeze(0);
    torch::Tensor logp = torch::log_softmax(model.Forward(chunk).narrow(-2, 0, 1).to(torch::kDouble), -1);
    total -= logp.gather(-1, chunk.narrow(-1, 1, 1).unsqueeze(-1)).sum().item<double>();
  }
  return total / static_cast<double>(N);
}

// Held-out (last 20% of rows) R^2 of an OLS fit of y [N, m] on x [N, f]
// with an intercept.
double HeldOutR2(const torch::Tensor& x, const torch::Tensor& y) {
  const int64_t N = x.size(0), train = (4 * N) / 5;
  torch::Tensor X = torch::cat({x, torch::ones({N, 1}, x.options())}, 1);
  torch::Tensor coef = torch::matmul(torch::linalg_pinv(X.narrow(0, 0, train)), y.narrow(0, 0, train));
  torch::Tensor yv = y.narrow(0, train, N - train), fit = torch::matmul(X.narrow(0, train, N - train), coef);
  const double den = (yv - yv.mean(0)).pow(2).sum().item<double>();
  return den > 0 ? 1.0 - (yv - fit).pow(2).sum().item<double>() / den : 0.0;
}

// V_opt (D.5.12): the direction of `complement` [D, c] whose removal at
// `point` most raises the cross-entropy of the target pool (minors, or the
// OOD tasks `ood_params`); Adam 0.01 on batches of 32, stopped 30 steps after
// the best smoothed CE, the mean of the last 100 iterates. [D, 1].
absl::StatusOr<torch::Tensor> OptimiseVopt(TvRun& run, const torch::Tensor& complement, const torch::Tensor& ood_params,
                                           const std::string& point, int dl, torch::Generator& gen) {
  auto& [model, task, r, rep, row, T, K, V, last, L, layers, positions, est_begin, est_end] = run;
  const bool minor_target = r.opt_target() == "minor" && task.num_minors() > 0;
  torch::Tensor Wv = torch::randn({complement.size(1), 1}, gen, kF64);
  Wv = (Wv / Wv.norm()).requires_grad_(true);
  {
    torch::AutoGradMode grad(true);
    torch::optim::Adam opt({Wv}, torch::optim::AdamOptions(0.01));
    torch::Tensor U = complement.to(torch::kFloat);
    double ema = 0, best = -1e300;
    int since_best = 0;
    std::vector<torch::Tensor> recent;
    int64_t taken = 0;
    for (int64_t step = 0; step < r.opt_steps(); ++step) {
      ++taken;
      torch::Tensor batch =
          minor_target
              ? task.SamplePool(LatentPool::kMinor, torch::randint(task.num_minors(), {32}, gen, kI64), gen).tokens
              : task.SampleFrom(ood_params.index_select(0, torch::randint(30, {32}, gen, kI64)), gen, {}, nullptr);
      torch::Tensor v = torch::matmul(U, Wv.to(torch::kFloat));
      v = v / v.norm();
      torch::Tensor ce = MeanCe(model, batch, point,
                                [&](const torch::Tensor& h) { return h - torch::matmul(torch::matmul(h, v), v.t()); });
      opt.zero_grad();
      (-ce).backward();
      torch::nn::utils::clip_grad_norm_(std::vector<torch::Tensor>{Wv}, 1.0);
      opt.step();
      const double value = ce.item<double>();
      ema = step == 0 ? value : 0.1 * value + 0.9 * ema;
      recent.push_back(Wv.detach().clone());
      if (recent.size() > 100) recent.erase(recent.begin());
      if (ema > best) {
        best = ema;
        since_best = 0;
      } else if (++since_best >= 30) {
        break;
      }
      if (!rep.At(0.1 + 0.6 * static_cast<double>(step + 1) / static_cast<double>(r.opt_steps()))) return Stopped();
    }
    run.row("dissociation/opt_steps", dl, -1, static_cast<double>(taken));
    Wv = torch::stack(recent).mean(0);
  }
  torch::Tensor v_opt = torch::matmul(complement, Wv.detach());
  v_opt = v_opt / v_opt.norm();  // [D, 1]
  return v_opt;
}

// E.20: what V_opt encodes, on OOD sequences: held-out R^2 of the context
// statistics (centred log counts) against the V_opt coordinate, with and
// without the token, against random directions and the task subspace.
void StatsProbe(TvRun& run, const torch::Tensor& v_opt, const torch::Tensor& complement,
                const torch::Tensor& task_basis, int dl, torch::Generator& gen) {
  auto& [model, task, r, rep, row, T, K, V, last, L, layers, positions, est_begin, est_end] = run;
  const int64_t S = task.num_states(), D = model.config().d_model;
  const int64_t Ns = r.stats_samples();
  const int64_t pb = std::min<int64_t>(r.stats_begin(), last), np = last - pb + 1;
  torch::Tensor ood = task.SampleFrom(task.DrawTasks(Ns, gen), gen, {}, nullptr);
  torch::Tensor hs = HiddenStates(model, ood, {dl}, r.dissociation_hook())[0].narrow(1, pb, np).reshape({-1, D});
  torch::Tensor logc = (task.ContextCounts(ood).narrow(1, pb, np).reshape({-1, S}) + 0.5).log();
  torch::Tensor clr = logc - logc.mean(-1, true);
  torch::Tensor token = torch::one_hot(ood.narrow(1, pb, np).reshape({-1}), V).to(torch::kDouble);
  // The position as dummies (the authors' probe has them).
  torch::Tensor position = torch::one_hot(torch::arange(np, kI64).repeat({Ns}), np).to(torch::kDouble);
  row("stats/r2_vopt", dl, -1, HeldOutR2(clr, torch::matmul(hs, v_opt)));
  row("stats/r2_vopt_with_token", dl, -1, HeldOutR2(torch::cat({clr, token}, 1), torch::matmul(hs, v_opt)));
  row("stats/r2_vopt_full", dl, -1, HeldOutR2(torch::cat({clr, token, position}, 1), torch::matmul(hs, v_opt)));
  row("stats/r2_clr_from_vopt", dl, -1, HeldOutR2(torch::matmul(hs, v_opt), clr));
  double random = 0;
  for (int i = 0; i < 5; ++i) {
    torch::Tensor d = OrthonormalColumns(torch::matmul(complement, torch::randn({complement.size(1), 1}, gen, kF64)));
    random += HeldOutR2(clr, torch::matmul(hs, d)) / 5.0;
  }
  row("stats/r2_random", dl, -1, random);
  row("stats/r2_task", dl, -1, HeldOutR2(clr, torch::matmul(hs, task_basis)));  // every task direction
}

// The protected subspace (the task basis, with the tokens' top directions
// under protect = "task_and_tokens") and its orthogonal complement [D, D - p]
// (D.5.12).
torch::Tensor Complement(TvRun& run, const torch::Tensor& w_tok, const torch::Tensor& task_basis, int dl) {
  auto [Uk, Sk, Vhk] = torch::linalg_svd(w_tok, false);
  torch::Tensor energy = Sk.pow(2).cumsum(0) / Sk.pow(2).sum().clamp_min(1e-300);
  const int64_t tok_dims = std::min<int64_t>(Sk.size(0), (energy < 0.9).sum().item<int64_t>() + 1);
  torch::Tensor protect = run.r.protect() == "task_and_tokens"
                              ? OrthonormalColumns(torch::cat({task_basis, Vhk.narrow(0, 0, tok_dims).t()}, 1))
                              : OrthonormalColumns(task_basis);
  const int64_t D = run.model.config().d_model;
  auto [evals, evecs] = torch::linalg_eigh(torch::eye(D, kF64) - torch::matmul(protect, protect.t()));
  run.row("dissociation/protected_dims", dl, -1, static_cast<double>(protect.size(1)));
  return evecs.index({torch::indexing::Slice(), evals > 0.5});
}

// The evaluation groups: E sequences of the majors, of 30 fresh (OOD) tasks
// `ood_params`, and of the minors when the task has them.
std::vector<std::pair<std::string, torch::Tensor>> EvalGroups(const LatentTaskGenerator& task, int64_t E,
                                                              const torch::Tensor& ood_params, torch::Generator& gen) {
  const int64_t K = task.num_majors();
  std::vector<std::pair<std::string, torch::Tensor>> groups = {
      {"major", task.SamplePool(LatentPool::kMajor, torch::arange(E, kI64).remainder(K), gen).tokens},
      {"ood", task.SampleFrom(ood_params.index_select(0, torch::arange(E, kI64).remainder(30)), gen, {}, nullptr)}};
  if (task.num_minors() > 0) {
    groups.emplace_back("minor", task.SamplePool(LatentPool::kMinor,
                                                 torch::randint(task.num_minors(), {E}, gen, kI64), gen).tokens);
  }
  return groups;
}

}  // namespace

// D.5.10-D.5.13 and E.20 at one layer: the joint probe and the task
// subspace, its removal, the optimised orthogonal direction V_opt and random
// controls, their CE effects per group, and what V_opt encodes.
absl::Status Dissociation(TvRun& run) {
  auto& [model, task, r, rep, row, T, K, V, last, L, layers, positions, est_begin, est_end] = run;
  const int dl = r.has_dissociation_layer() ? static_cast<int>(r.dissociation_layer()) - 1 : L - 1;  // from 1 on the wire
  const std::string point = HookName(dl, r.dissociation_hook());
  const int64_t pb = r.has_probe_begin() ? std::min<int64_t>(r.probe_begin(), last) : last / 2;
  const int64_t np = last - pb + 1;
  torch::Generator gen = MakeGenerator(DeriveSeed63(r.seed(), "tv/dissociation"));
  // Only V_opt is optimised: the model's weights take no gradient meanwhile.
  struct Frozen {
    std::vector<torch::Tensor> params;
    std::vector<bool> was;
    ~Frozen() {
      for (size_t i = 0; i < params.size(); ++i) params[i].requires_grad_(was[i]);
    }
  } frozen{model.parameters(), {}};
  for (torch::Tensor& p : frozen.params) {
    frozen.was.push_back(p.requires_grad());
    p.requires_grad_(false);
  }

  // ---- D.5.10 joint probe h_t ~ pi_t W_task + onehot(x_t) W_tok + b ----
  const int64_t N = r.probe_samples();
  torch::Tensor tokens = task.SamplePool(LatentPool::kMajor, torch::arange(N, kI64).remainder(K), gen).tokens;
  torch::Tensor h = HiddenStates(model, tokens, {dl}, r.dissociation_hook())[0].narrow(1, pb, np).reshape(
      {-1, model.config().d_model});
  torch::Tensor post = task.MajorPosterior(tokens).narrow(1, pb, np).reshape({-1, K});
  torch::Tensor onehot = torch::one_hot(tokens.narrow(1, pb, np).reshape({-1}), V).to(torch::kDouble);
  torch::Tensor X = torch::cat({post, onehot}, 1);
  row("dissociation/probe_r2", dl, -1, HeldOutR2(X, h));
  torch::Tensor Xi = torch::cat({X, torch::ones({X.size(0), 1}, X.options())}, 1);
  torch::Tensor coef = torch::matmul(torch::linalg_pinv(Xi), h);  // [K + V + 1, D]
  torch::Tensor w_task = coef.narrow(0, 0, K), w_tok = coef.narrow(0, K, V);
  const int rank =
      r.task_rank() > 0 ? static_cast<int>(r.task_rank()) : static_cast<int>(task.num_minors() > 0 ? K : K - 1);
  auto [Ut, St, Vht] = torch::linalg_svd(w_task, false);
  const int64_t keep = std::min<int64_t>(rank, (St > 1e-6 * St.max().item<double>()).sum().item<int64_t>());
  torch::Tensor task_basis = Vht.narrow(0, 0, std::max<int64_t>(1, keep)).t();  // [D, rank]
  row("dissociation/task_rank", dl, -1, static_cast<double>(task_basis.size(1)));
  if (!rep.At(0.1)) return Stopped();

  const torch::Tensor complement = Complement(run, w_tok, task_basis, dl);

  // ---- evaluation groups: major, OOD (30 fresh tasks), minor ----
  torch::Tensor ood_params = task.DrawTasks(30, gen);
  const std::vector<std::pair<std::string, torch::Tensor>> groups = EvalGroups(task, r.eval_samples(), ood_params, gen);
  auto remove = [](const torch::Tensor& basis) {  // h <- h - h U U^T
    torch::Tensor P = torch::matmul(basis, basis.t()).to(torch::kFloat);
    return [P](const torch::Tensor& v) { return v - torch::matmul(v, P.to(v.scalar_type())); };
  };
  // The in-context gain of each group: the first prediction's loss minus
  // the mean loss (the authors report a removal's effect as its fraction).
  std::vector<double> base, gain;
  for (const auto& [name, toks] : groups) {
    base.push_back(MeanCe(model, toks, point, {}).item<double>());
    gain.push_back(FirstCe(model, toks) - base.back());
  }

  absl::StatusOr<torch::Tensor> optimised = OptimiseVopt(run, complement, ood_params, point, dl, gen);
  if (!optimised.ok()) return optimised.status();
  const torch::Tensor v_opt = *optimised;

  // ---- the table: task removal, V_opt removal, random controls (D.5.13) ----
  auto report = [&](const std::string& what, const std::vector<torch::Tensor>& bases) {
    for (size_t g = 0; g < groups.size(); ++g) {
      double ce = 0;
      for (const torch::Tensor& b : bases) ce += MeanCe(model, groups[g].second, point, remove(b)).item<double>();
      ce /= static_cast<double>(bases.size());
      const std::string p = "dissociation/" + what + "/" + groups[g].first + "/";
      row(p + "ce", dl, -1, ce);
      row(p + "delta", dl, -1, ce - base[g]);
      row(p + "pct", dl, -1, 100.0 * (ce - base[g]) / base[g]);
      row(p + "gain_frac", dl, -1, gain[g] > 0 ? (ce - base[g]) / gain[g] : 0.0);
    }
  };
  for (size_t g = 0; g < groups.size(); ++g) {
    row("dissociation/base/" + groups[g].first + "/ce", dl, -1, base[g]);
    row("dissociation/base/" + groups[g].first + "/gain", dl, -1, gain[g]);
  }
  report("task", {task_basis});
  report("vopt", {v_opt});
  std::vector<torch::Tensor> rand1, rand3;
  for (int i = 0; i < 3; ++i) {
    rand1.push_back(OrthonormalColumns(torch::matmul(complement, torch::randn({complement.size(1), 1}, gen, kF64))));
    rand3.push_back(OrthonormalColumns(torch::matmul(complement, torch::randn({complement.size(1), 3}, gen, kF64))));
  }
  report("random1", rand1);
  report("random3", rand3);
  if (!rep.At(0.85)) return Stopped();

  StatsProbe(run, v_opt, complement, task_basis, dl, gen);
  return absl::OkStatus();
}

}  // namespace circuitlab::engine
