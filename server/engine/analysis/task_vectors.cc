#include "server/engine/analysis/task_vectors.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "server/common/seeds.h"
#include "server/engine/torch_util.h"
#include "server/engine/setup/decoder_setup.h"
#include "server/engine/setup/checkpoint_io.h"
#include "server/engine/analysis/decoder_analysis.h"
#include "server/engine/analysis/registry.h"

namespace circuitlab::engine {

double Pearson(const torch::Tensor& a, const torch::Tensor& b) {
  torch::Tensor x = a - a.mean(), y = b - b.mean();
  const double den = std::sqrt((x * x).sum().item<double>() * (y * y).sum().item<double>());
  return den > 0 ? (x * y).sum().item<double>() / den : 0.0;
}



absl::Status Stopped() { return absl::CancelledError("task-vector analysis stopped"); }



torch::Tensor ConditionedTokens(const LatentTaskGenerator& task, int64_t t, int64_t B, torch::Generator& gen) {
  const int64_t K = task.num_majors(), V = task.vocab_size();
  torch::Tensor all = task.SamplePool(LatentPool::kMajor, Repeat(K, B).repeat({V}), gen)
                          .tokens.narrow(1, 0, t + 1)
                          .reshape({V, K * B, t + 1})
                          .clone();
  all.select(2, t).copy_(torch::arange(V, kI64).unsqueeze(1).expand({V, K * B}));
  return all;
}

std::vector<torch::Tensor> ConditionedAt(const DecoderModel& model, const LatentTaskGenerator& task, int64_t t,
                                         int64_t B, const std::vector<int>& layers, const std::string& kind,
                                         torch::Generator& gen) {
  const int64_t K = task.num_majors(), V = task.vocab_size();
  torch::Tensor all = ConditionedTokens(task, t, B, gen);
  std::vector<torch::Tensor> states = HiddenStates(model, all.view({V * K * B, t + 1}), layers, kind, t);
  for (torch::Tensor& s : states) s = s.view({V, K, B, -1});
  return states;
}

// KL(p || q) summed over the last dim, from log p and q.
torch::Tensor KlFromLogP(const torch::Tensor& logp, const torch::Tensor& q) {
  return (logp.exp() * (logp - q.clamp_min(1e-300).log())).sum(-1);
}


// Mean next-token cross-entropy over every position of `tokens` [N, T], with
// `edit` applied to the stream at hook `point` (none when `edit` is empty).
// Differentiable when autograd is on.
torch::Tensor MeanCe(const DecoderModel& model, const torch::Tensor& tokens, const std::string& point,
                     const std::function<torch::Tensor(const torch::Tensor&)>& edit) {
  torch::Tensor total;
  const int64_t N = tokens.size(0);
  for (int64_t b = 0; b < N; b += kTvChunk) {
    torch::Tensor chunk = tokens.narrow(0, b, std::min(kTvChunk, N - b)).unsqueeze(0);
    HookFn hook = [&](const std::string& name, const torch::Tensor& v) -> torch::Tensor {
      return edit && name == point ? edit(v) : torch::Tensor();
    };
    torch::Tensor loss = NextTokenLoss(model.Forward(chunk, edit ? &hook : nullptr), chunk).sum();
    total = total.defined() ? total + loss : loss;
  }
  return total / static_cast<double>(N);
}


bool Asked(const v1::AnalyzeTaskVectorsRequest& request, std::string_view analysis) {
  return std::find(request.analyses().begin(), request.analyses().end(), analysis) != request.analyses().end();
}

torch::Tensor ProjectToSimplex(const torch::Tensor& v) {
  const int64_t K = v.size(-1);
  torch::Tensor u = std::get<0>(v.sort(-1, /*descending=*/true));
  torch::Tensor css = u.cumsum(-1) - 1.0;
  torch::Tensor ind = torch::arange(1, K + 1, v.options());
  torch::Tensor rho = (u - css / ind > 0).sum(-1, true).clamp_min(1);  // the true entries form a prefix
  torch::Tensor theta = css.gather(-1, rho - 1) / rho.to(v.scalar_type());
  return (v - theta).clamp_min(0.0);
}

torch::Tensor AffineWeights(const torch::Tensor& y, const torch::Tensor& theta) {
  const int64_t K = theta.size(0);
  // Bordered normal equations [G 1; 1^T 0] [b; l] = [theta y; 1].
  torch::Tensor A = torch::zeros({K + 1, K + 1}, y.options());
  A.narrow(0, 0, K).narrow(1, 0, K).copy_(torch::matmul(theta, theta.t()));
  A.narrow(0, 0, K).select(1, K).fill_(1.0);
  A.select(0, K).narrow(0, 0, K).fill_(1.0);
  torch::Tensor rhs = torch::cat({torch::matmul(y, theta.t()), torch::ones({y.size(0), 1}, y.options())}, 1);
  return torch::matmul(rhs, torch::linalg_pinv(A).t()).narrow(1, 0, K);
}

std::vector<torch::Tensor> HiddenStates(const DecoderModel& model, const torch::Tensor& tokens,
                                        const std::vector<int>& layers, const std::string& kind, int64_t at) {
  torch::NoGradGuard no_grad;
  std::map<std::string, size_t> want;
  for (size_t i = 0; i < layers.size(); ++i) want[HookName(layers[i], kind)] = i;
  const int upto = *std::max_element(layers.begin(), layers.end());
  std::vector<std::vector<torch::Tensor>> parts(layers.size());
  const int64_t N = tokens.size(0);
  for (int64_t b = 0; b < N; b += kTvChunk) {
    torch::Tensor chunk = tokens.narrow(0, b, std::min(kTvChunk, N - b)).unsqueeze(0);
    HookFn capture = [&](const std::string& point, const torch::Tensor& v) -> torch::Tensor {
      auto it = want.find(point);
      if (it != want.end()) {
        torch::Tensor h = v.squeeze(0);
        parts[it->second].push_back((at >= 0 ? h.select(1, at) : h).to(torch::kDouble));
      }
      return {};
    };
    model.Forward(chunk, &capture, upto);
  }
  std::vector<torch::Tensor> out;
  for (auto& p : parts) out.push_back(torch::cat(p, 0));
  return out;
}

// The hook name of 0-based `layer` (hook names count layers from 1).
std::string HookName(int layer, const std::string& kind) { return absl::StrCat("L", layer + 1, ".", kind); }

torch::Tensor Repeat(int64_t n, int64_t times) { return torch::arange(n, kI64).repeat_interleave(times); }

HookFn SteeringHook(std::string point, int64_t pos, SteeringEdit edit) {
  return [point = std::move(point), pos, edit = std::move(edit)](const std::string& name,
                                                                  const torch::Tensor& v) -> torch::Tensor {
    if (name != point) return {};
    torch::Tensor out = v.clone();
    torch::Tensor h = out.select(2, pos);  // [1, n, D]
    if (edit.projection) {
      h.copy_(h - torch::matmul(h - edit.mu, edit.projector) + edit.goal.unsqueeze(0));
    } else {
      h.add_(edit.delta.unsqueeze(0).to(v.scalar_type()));
    }
    return out;
  };
}

torch::Tensor OrthonormalColumns(const torch::Tensor& m) {
  auto [U, S, Vh] = torch::linalg_svd(m, /*full_matrices=*/false);
  const double cut = 1e-6 * S.max().item<double>();
  return U.narrow(1, 0, std::max<int64_t>(1, (S > cut).sum().item<int64_t>()));
}

OodR2 OodProjectionR2(const torch::Tensor& m, const torch::Tensor& o) {
  const int64_t K = m.size(0), last = m.size(1) - 1;
  torch::Tensor mu = m.mean(0);                                        // [P, D]
  torch::Tensor R = m.select(1, last) - mu.select(0, last);            // [K, D]
  torch::Tensor X = R.narrow(0, 0, K - 1).t();                         // [D, K-1]
  torch::Tensor P = torch::matmul(X, torch::linalg_pinv(X));           // [D, D]
  // All positions but the last (D.5.8 block (0, -1)).
  torch::Tensor y = (o - mu).narrow(1, 0, std::max<int64_t>(1, last));  // [O, P', D]
  torch::Tensor fit = torch::matmul(y, P);                             // P symmetric
  torch::Tensor resid = (y - fit).pow(2).sum(-1);
  torch::Tensor centred = (y - y.mean(-1, true)).pow(2).sum(-1);
  torch::Tensor code = (1.0 - resid / centred.clamp_min(1e-300)).clamp(0.0, 1.0).mean(1);  // [O]
  torch::Tensor norm = (fit.pow(2).sum(-1) / y.pow(2).sum(-1).clamp_min(1e-300)).mean(1);
  return {code.mean().item<double>(), norm.mean().item<double>(), torch::quantile(code, 0.25).item<double>(),
          torch::quantile(code, 0.75).item<double>()};
}

void P3Rows(const torch::Tensor& h, const torch::Tensor& alpha_all, int64_t est_begin, int64_t est_end, int l,
            const RowFn& row) {
  const int64_t K = h.size(0), B = h.size(1), P = h.size(2), last = P - 1;
  torch::Tensor mu = h.mean(at::IntArrayRef{0, 1});  // [P, D]
  torch::Tensor theta = (h.narrow(2, est_begin, est_end - est_begin + 1) - mu.narrow(0, est_begin, est_end - est_begin + 1))
                            .mean(at::IntArrayRef{1, 2});  // [K, D]
  theta = theta - theta.mean(0);
  torch::Tensor Vt = theta.narrow(0, 0, K - 1);                                                // [K-1, D]
  torch::Tensor solve = torch::matmul(Vt.t(), torch::linalg_pinv(torch::matmul(Vt, Vt.t())));  // [D, K-1]
  double r_min = 1.0;
  for (int64_t j = 0; j < K; ++j) {
    torch::Tensor hc = h[j] - mu;                    // [B, P, D]
    torch::Tensor gamma = torch::matmul(hc, solve);  // [B, P, K-1]
    torch::Tensor bK = (1.0 - gamma.sum(-1, true)) / static_cast<double>(K);
    torch::Tensor beta = torch::cat({gamma + bK, bK}, -1);
    torch::Tensor lambda = ProjectToSimplex(beta.reshape({-1, K})).view({B, P, K});
    torch::Tensor alpha = alpha_all[j];                     // [B, P, K]
    torch::Tensor mb = lambda.mean(0), ma = alpha.mean(0);  // [P, K]
    const std::string tag = "/task" + std::to_string(j);
    const double r_mean = Pearson(mb.select(1, j), ma.select(1, j));
    r_min = std::min(r_min, r_mean);
    row("p3/r_mean" + tag, l, -1, r_mean);
    row("p3/r_std" + tag, l, -1, Pearson(lambda.std(0).select(1, j), alpha.std(0).select(1, j)));
    const int64_t from = std::min<int64_t>(4, last);
    row("p3/l1" + tag, l, -1, (mb - ma).abs().sum(-1).narrow(0, from, last + 1 - from).mean().item<double>());
    torch::Tensor lam = lambda.clamp_min(1e-6);
    lam = lam / lam.sum(-1, true);
    row("p3/kl" + tag, l, -1, (alpha * (alpha.clamp_min(1e-300).log() - lam.log())).sum(-1).mean().item<double>());
    for (int64_t t = 0; t <= last; ++t) {
      row("p3/beta" + tag, l, t, mb[t][j].item<double>());
      row("p3/alpha" + tag, l, t, ma[t][j].item<double>());
    }
  }
  row("p3/r_mean_min", l, -1, r_min);
}

CellStats TokenConditionedStats(const torch::Tensor& h) {
  const double S = static_cast<double>(h.size(0)), K = static_cast<double>(h.size(1)), B = static_cast<double>(h.size(2));
  CellStats c;
  torch::Tensor g = h.mean(at::IntArrayRef{0, 1, 2});
  const double ss_total = (h - g).pow(2).sum().item<double>();
  torch::Tensor m = h.mean(2);  // [S, K, D]
  const double ss_within = (h - m.unsqueeze(2)).pow(2).sum().item<double>();
  c.resid_ratio = ss_total > 0 ? ss_within / ss_total : 0.0;
  c.mse_within = ss_within / (S * K * B);
  torch::Tensor mk = m.mean(0), ma = m.mean(1), mg = m.mean(at::IntArrayRef{0, 1});
  torch::Tensor tau = mk - mg, nu = ma - mg;
  torch::Tensor iota = m - mk.unsqueeze(0) - ma.unsqueeze(1) + mg;
  const double ss_task = S * tau.pow(2).sum().item<double>();
  const double ss_token = K * nu.pow(2).sum().item<double>();
  const double ss_int = iota.pow(2).sum().item<double>();
  const double tot = ss_task + ss_token + ss_int;
  if (tot > 0) {
    c.eta2_task = ss_task / tot;
    c.eta2_token = ss_token / tot;
    c.eta2_int = ss_int / tot;
  }
  c.sep_r2 = 1.0 - c.eta2_int;
  return c;
}

// P0, P1, P2 (D.5.1-D.5.5): token-conditioned states.
absl::Status Conditioned(TvRun& run) {
  auto& [model, task, r, rep, row, T, K, V, last, L, layers, positions, est_begin, est_end] = run;
  torch::Generator gen = MakeGenerator(DeriveSeed63(r.seed(), "tv/conditioned"));
  // P2 evaluates every position 0..T-2 (G.4); P0/P1 only the chosen ones.
  std::vector<int64_t> need = positions;
  if (Asked(r, "p2")) {
    need.clear();
    for (int64_t t = 0; t <= last; ++t) need.push_back(t);
  }
  std::map<int64_t, std::vector<torch::Tensor>> at;  // position -> per layer [V, K, B, D]
  for (size_t i = 0; i < need.size(); ++i) {
    at[need[i]] = ConditionedAt(model, task, need[i], r.samples_per_cell(), layers, r.hook(), gen);
    if (!rep.At(0.9 * static_cast<double>(i + 1) / static_cast<double>(need.size()))) return Stopped();
  }
  for (size_t li = 0; li < layers.size(); ++li) {
    const int l = layers[li];
    for (int64_t t : positions) {
      const CellStats c = TokenConditionedStats(at[t][li]);
      if (Asked(r, "p0")) row("p0/resid_ratio", l, t, c.resid_ratio);
      if (Asked(r, "p1")) {
        row("p1/eta2_task", l, t, c.eta2_task);
        row("p1/eta2_token", l, t, c.eta2_token);
        row("p1/eta2_int", l, t, c.eta2_int);
        row("p1/sep_r2", l, t, c.sep_r2);
        row("p1/mse_within", l, t, c.mse_within);
      }
    }
    if (!Asked(r, "p2")) continue;
    // Estimation (D.5.5): centred cell means averaged over the window.
    torch::Tensor M;
    for (int64_t t = est_begin; t <= est_end; ++t) {
      torch::Tensor m = at[t][li].mean(2);  // [V, K, D]
      m = m - m.mean(at::IntArrayRef{0, 1});
      M = M.defined() ? M + m : m;
    }
    M = M / static_cast<double>(est_end - est_begin + 1);
    torch::Tensor theta = M.mean(0) - M.mean(at::IntArrayRef{0, 1});  // [K, D]
    torch::Tensor nu = M.mean(1) - M.mean(at::IntArrayRef{0, 1});     // [V, D]
    double sum_add = 0, sum_task = 0;
    int64_t count = 0;
    const int64_t from = std::min<int64_t>(8, last);
    for (int64_t t = 0; t <= last; ++t) {
      torch::Tensor h = at[t][li];
      const int64_t B = h.size(2);
      torch::Tensor hc = h.reshape({-1, h.size(3)});
      hc = hc - hc.mean(0);
      torch::Tensor token = Repeat(V, K * B);
      torch::Tensor ht = hc - nu.index_select(0, token);
      const double den = hc.pow(2).sum().item<double>();
      auto r2 = [&](const torch::Tensor& y) {
        torch::Tensor beta = ProjectToSimplex(AffineWeights(y, theta));
        return den > 0 ? 1.0 - (y - torch::matmul(beta, theta)).pow(2).sum().item<double>() / den : 0.0;
      };
      const double add = r2(ht), tsk = r2(hc);
      row("p2/r2_additive", l, t, add);
      row("p2/r2_task", l, t, tsk);
      if (t >= from) {
        sum_add += add;
        sum_task += tsk;
        ++count;
      }
    }
    // Means over positions 8..T-2 (E.13, G.4).
    row("p2/r2_additive_mean", l, -1, sum_add / static_cast<double>(std::max<int64_t>(1, count)));
    row("p2/r2_task_mean", l, -1, sum_task / static_cast<double>(std::max<int64_t>(1, count)));
  }
  return absl::OkStatus();
}

// P3 (D.5.6): weights on the task vectors vs the Bayesian posterior.
absl::Status P3(TvRun& run) {
  auto& [model, task, r, rep, row, T, K, V, last, L, layers, positions, est_begin, est_end] = run;
  torch::Generator gen = MakeGenerator(DeriveSeed63(r.seed(), "tv/p3"));
  const int64_t B = r.p3_samples();
  torch::Tensor tokens = task.SamplePool(LatentPool::kMajor, Repeat(K, B), gen).tokens;  // [K*B, T]
  std::vector<torch::Tensor> states = HiddenStates(model, tokens, layers, r.hook());
  torch::Tensor alpha_all = task.MajorPosterior(tokens).view({K, B, T, K});
  for (size_t li = 0; li < layers.size(); ++li) {
    P3Rows(states[li].view({K, B, T, -1}).narrow(2, 0, last + 1), alpha_all.narrow(2, 0, last + 1), est_begin, est_end,
           layers[li], row);
    if (!rep.At(static_cast<double>(li + 1) / static_cast<double>(layers.size()))) return Stopped();
  }
  return absl::OkStatus();
}

// Steering along the task simplex (D.5.7; E1 variant: true task removed, or
// E3's projection).
absl::Status Steering(TvRun& run) {
  auto& [model, task, r, rep, row, T, K, V, last, L, layers, positions, est_begin, est_end] = run;
  const int sl = r.has_steering_layer() ? static_cast<int>(r.steering_layer()) - 1 : L - 1;  // from 1 on the wire
  torch::Generator gen = MakeGenerator(DeriveSeed63(r.seed(), "tv/steering"));
  const int64_t Be = r.steering_est_samples();
  torch::Tensor est = task.SamplePool(LatentPool::kMajor, Repeat(K, Be), gen).tokens;
  torch::Tensor h = HiddenStates(model, est, {sl}, r.estimation_hook())[0].view({K, Be, T, -1});
  torch::Tensor theta = h.mean(1) - h.mean(at::IntArrayRef{0, 1});  // [K, T, D], per position
  const int64_t N = r.steering_samples();
  torch::Tensor true_task = torch::arange(N, kI64).remainder(K);
  torch::Tensor tokens = task.SamplePool(LatentPool::kMajor, true_task, gen).tokens;
  torch::Tensor alpha = at::_standard_gamma(torch::ones({N, K}, kF64), gen);
  alpha = alpha / alpha.sum(-1, true);
  const int64_t p_begin = r.has_steer_begin() ? std::min<int64_t>(r.steer_begin(), last) : last / 3;
  const int64_t p_end =
      r.has_steer_end() ? std::clamp<int64_t>(r.steer_end(), p_begin, last) : std::max(p_begin, (2 * last) / 3);
  const torch::Tensor& majors = task.pool(LatentPool::kMajor);
  // Mixture and corner laws at every position.
  torch::Tensor q = task.MixLaws(tokens, alpha.unsqueeze(1).expand({N, T, K}), majors);  // [N, T, V]
  torch::Tensor corner = torch::one_hot(alpha.argmax(-1), K).to(torch::kDouble);
  torch::Tensor mode = task.MixLaws(tokens, corner.unsqueeze(1).expand({N, T, K}), majors);
  std::vector<torch::Tensor> clean_parts;
  for (int64_t b = 0; b < N; b += kTvChunk) {
    clean_parts.push_back(model.Forward(tokens.narrow(0, b, std::min(kTvChunk, N - b)).unsqueeze(0)).squeeze(0));
  }
  torch::Tensor clean = torch::log_softmax(torch::cat(clean_parts, 0).to(torch::kDouble), -1);
  torch::Tensor kl_base = torch::zeros({N}, kF64), kl_inj = torch::zeros({N}, kF64), kl_mode = torch::zeros({N}, kF64);
  const std::string point = HookName(sl, r.injection_hook());
  // The E3 variant replaces the task component instead: task vectors
  // averaged over the evaluation window, P the projector onto their span,
  // mu_p the per-position mean of the estimation states.
  const bool projection = r.steering_subtract() == "projection";
  torch::Tensor theta_bar = theta.narrow(1, p_begin, p_end - p_begin + 1).mean(1);  // [K, D]
  const torch::Tensor span = OrthonormalColumns(theta_bar.t());
  torch::Tensor P = torch::matmul(span, span.t());
  torch::Tensor mu = h.mean(at::IntArrayRef{0, 1});  // [T, D]
  for (int64_t p = p_begin; p <= p_end; ++p) {
    // h_p <- h_p - theta_{k*}(p) + sum_j alpha_j theta_j(p), at position p only
    // (projection: h_p <- h_p - (h_p - mu_p) P + sum_j alpha_j theta_bar_j).
    torch::Tensor tp = theta.select(1, p);                                                               // [K, D]
    torch::Tensor delta = (torch::matmul(alpha, tp) - tp.index_select(0, true_task)).to(torch::kFloat);  // [N, D]
    torch::Tensor target = torch::matmul(alpha, theta_bar).to(torch::kFloat);                            // [N, D]
    const torch::Tensor Pf = P.to(torch::kFloat), mup = mu.select(0, p).to(torch::kFloat);
    std::vector<torch::Tensor> logits;
    for (int64_t b = 0; b < N; b += kTvChunk) {
      const int64_t n = std::min(kTvChunk, N - b);
      HookFn inject = SteeringHook(point, p, {delta.narrow(0, b, n), target.narrow(0, b, n), mup, Pf, projection});
      torch::Tensor lg = model.Forward(tokens.narrow(0, b, n).narrow(1, 0, p + 1).unsqueeze(0), &inject);
      logits.push_back(lg.squeeze(0).select(1, p));
    }
    torch::Tensor inj = torch::log_softmax(torch::cat(logits, 0).to(torch::kDouble), -1);
    torch::Tensor qp = q.select(1, p);
    kl_base += KlFromLogP(clean.select(1, p), qp);
    kl_inj += KlFromLogP(inj, qp);
    kl_mode += KlFromLogP(mode.select(1, p).clamp_min(1e-300).log(), qp);
    if (!rep.At(static_cast<double>(p - p_begin + 1) / static_cast<double>(p_end - p_begin + 1))) return Stopped();
  }
  const double n_pos = static_cast<double>(p_end - p_begin + 1);
  const double base = kl_base.mean().item<double>() / n_pos, inj = kl_inj.mean().item<double>() / n_pos;
  row("steering/kl_base", sl, -1, base);
  row("steering/kl_inj", sl, -1, inj);
  row("steering/kl_mode", sl, -1, kl_mode.mean().item<double>() / n_pos);
  row("steering/ratio", sl, -1, base > 0 ? inj / base : 0.0);
  return absl::OkStatus();
}

// OOD projection R^2 against the task subspace (D.5.8).
absl::Status OodR2Rows(TvRun& run) {
  auto& [model, task, r, rep, row, T, K, V, last, L, layers, positions, est_begin, est_end] = run;
  torch::Generator gen = MakeGenerator(DeriveSeed63(r.seed(), "tv/ood"));
  const int64_t n = r.ood_samples(), O = r.ood_tasks();
  torch::Tensor maj = task.SamplePool(LatentPool::kMajor, Repeat(K, n), gen).tokens;
  torch::Tensor ood_tasks = task.DrawTasks(O, gen).repeat_interleave(n, 0);
  torch::Tensor ood = task.SampleFrom(ood_tasks, gen, {}, nullptr);
  std::vector<torch::Tensor> hm = HiddenStates(model, maj, layers, r.hook());
  std::vector<torch::Tensor> ho = HiddenStates(model, ood, layers, r.hook());
  for (size_t li = 0; li < layers.size(); ++li) {
    const int l = layers[li];
    const OodR2 r2 = OodProjectionR2(hm[li].view({K, n, T, -1}).mean(1).narrow(1, 0, last + 1),
                                     ho[li].view({O, n, T, -1}).mean(1).narrow(1, 0, last + 1));
    row("ood_r2/code", l, -1, r2.code);
    row("ood_r2/norm", l, -1, r2.norm);
    row("ood_r2/code_q25", l, -1, r2.code_q25);
    row("ood_r2/code_q75", l, -1, r2.code_q75);
    if (!rep.At(static_cast<double>(li + 1) / static_cast<double>(layers.size()))) return Stopped();
  }
  return absl::OkStatus();
}

// Mode transition: KL to the two Bayes predictors (D.5.9).
absl::Status ModeKl(TvRun& run) {
  auto& [model, task, r, rep, row, T, K, V, last, L, layers, positions, est_begin, est_end] = run;
  torch::Generator gen = MakeGenerator(DeriveSeed63(r.seed(), "tv/kl"));
  torch::Tensor tokens = task.SampleTrain(r.kl_samples(), gen).tokens;
  double exact = 0, extrap = 0;
  const int64_t N = tokens.size(0);
  for (int64_t b = 0; b < N; b += kTvBayesChunk) {
    torch::Tensor chunk = tokens.narrow(0, b, std::min(kTvBayesChunk, N - b));
    torch::Tensor logp =
        torch::log_softmax(model.Forward(chunk.unsqueeze(0)).squeeze(0).to(torch::kDouble), -1).narrow(1, 0, last + 1);
    exact += KlFromLogP(logp, task.KnownPool(chunk).probs.narrow(1, 0, last + 1)).sum().item<double>();
    extrap += KlFromLogP(logp, task.Hybrid(chunk, r.p_common()).probs.narrow(1, 0, last + 1)).sum().item<double>();
    if (!rep.At(static_cast<double>(b + chunk.size(0)) / static_cast<double>(N))) return Stopped();
  }
  const double cells = static_cast<double>(N * (last + 1));
  exact /= cells;
  extrap /= cells;
  row("kl/exact", -1, -1, exact);
  row("kl/extrap", -1, -1, extrap);
  row("kl/log10_ratio", -1, -1, std::log10(std::max(exact, 1e-300) / std::max(extrap, 1e-300)));
  return absl::OkStatus();
}

// E4: P0 fails when the state must keep the whole prefix (D.5.14).
absl::Status DyckP0(TvRun& run) {
  auto& [model, task, r, rep, row, T, K, V, last, L, layers, positions, est_begin, est_end] = run;
  torch::Generator gen = MakeGenerator(DeriveSeed63(r.seed(), "tv/dyck"));
  const int64_t B = r.samples_per_cell(), minors = std::min<int64_t>(32, task.num_minors());
  torch::Tensor paths = task.pool(LatentPool::kMajor);
  if (minors > 0) paths = torch::cat({paths, task.pool(LatentPool::kMinor).narrow(0, 0, minors)}, 0);
  const int64_t Kt = paths.size(0), steps = paths.size(1);
  torch::Tensor task_of = Repeat(Kt, B);
  // Per mask and layer: ratios at every planted index common to all masks.
  std::vector<std::vector<torch::Tensor>> last_k(layers.size()), full(layers.size());
  int64_t common = steps;
  for (int64_t m = 0; m < r.dyck_masks(); ++m) {
    torch::Tensor mask = task.DrawMask(gen);
    torch::Tensor planted = mask.nonzero().flatten().narrow(0, 0, std::min<int64_t>(steps, mask.sum().item<int64_t>()));
    common = std::min<int64_t>(common, planted.size(0));
    torch::Tensor tokens = task.SampleFrom(paths.index_select(0, task_of), gen, mask, nullptr);
    std::vector<torch::Tensor> states = HiddenStates(model, tokens, layers, r.hook());
    for (size_t li = 0; li < layers.size(); ++li) {
      std::vector<double> lk, fp;
      for (int64_t j = 0; j < planted.size(0); ++j) {
        torch::Tensor h = states[li].select(1, planted[j].item<int64_t>());  // [Kt*B, D]
        // Cell of the last dyck_prefix planted symbols, as a binary number.
        torch::Tensor code = torch::zeros({Kt}, kI64);
        for (int64_t q = std::max<int64_t>(0, j - r.dyck_prefix() + 1); q <= j; ++q)
          code = code * 2 + paths.select(1, q);
        auto ratio = [&](const torch::Tensor& cell) {  // cell per sequence
          const int64_t cells = cell.max().item<int64_t>() + 1;
          torch::Tensor sums = torch::zeros({cells, h.size(1)}, kF64).index_add_(0, cell, h);
          torch::Tensor counts = torch::zeros({cells}, kF64).index_add_(0, cell, torch::ones({h.size(0)}, kF64));
          torch::Tensor means = sums / counts.clamp_min(1).unsqueeze(1);
          const double within = (h - means.index_select(0, cell)).pow(2).sum().item<double>();
          const double total = (h - h.mean(0)).pow(2).sum().item<double>();
          return total > 0 ? within / total : 0.0;
        };
        lk.push_back(ratio(code.index_select(0, task_of)));
        fp.push_back(ratio(task_of));
      }
      last_k[li].push_back(torch::tensor(lk, kF64));
      full[li].push_back(torch::tensor(fp, kF64));
    }
    if (!rep.At(static_cast<double>(m + 1) / static_cast<double>(r.dyck_masks()))) return Stopped();
  }
  if (common == 0) {
    return absl::FailedPreconditionError("dyck_p0: one of the " + std::to_string(r.dyck_masks()) +
                                         " planting masks selected no position of the " + std::to_string(T) +
                                         " (the run's repeat_prob is too small for its seq_len)");
  }
  for (size_t li = 0; li < layers.size(); ++li) {
    torch::Tensor a = torch::zeros({common}, kF64), b = torch::zeros({common}, kF64);
    for (size_t m = 0; m < last_k[li].size(); ++m) {
      a += last_k[li][m].narrow(0, 0, common);
      b += full[li][m].narrow(0, 0, common);
    }
    a /= static_cast<double>(last_k[li].size());
    b /= static_cast<double>(full[li].size());
    for (int64_t j = 0; j < common; ++j) {
      row("dyck/resid_ratio_last_k", layers[li], j, a[j].item<double>());
      row("dyck/resid_ratio_prefix", layers[li], j, b[j].item<double>());
    }
    // The last five planted indices every mask reaches (G.4).
    const int64_t tail = std::min<int64_t>(5, common);
    row("dyck/last_k_tail_mean", layers[li], -1, a.narrow(0, common - tail, tail).mean().item<double>());
    row("dyck/prefix_tail_mean", layers[li], -1, b.narrow(0, common - tail, tail).mean().item<double>());
    row("dyck/common_positions", layers[li], -1, static_cast<double>(common));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::AnalyzeTaskVectorsResponse> RunTaskVectorAnalyses(const DecoderModel& model,
                                                                     const LatentTaskGenerator& task,
                                                                     const v1::AnalyzeTaskVectorsRequest& r,
                                                                     const std::function<void(double)>& progress,
                                                                     const CancelToken* cancel) {
  torch::NoGradGuard no_grad;
  const bool p0 = Asked(r, "p0"), p1 = Asked(r, "p1"), p2 = Asked(r, "p2"), p3 = Asked(r, "p3"),
             steering = Asked(r, "steering"), ood_r2 = Asked(r, "ood_r2"), kl = Asked(r, "kl"),
             dissociation = Asked(r, "dissociation"), dyck_p0 = Asked(r, "dyck_p0");
  if (!task.has_bayes() && (p0 || p1 || p2 || p3 || steering || kl || dissociation)) {
    return absl::FailedPreconditionError(
        "P0-P3, steering, the mode transition and the dissociation need a DICE or MARKOV task; this run's "
        "LATENT_KIND_DYCK supports ood_r2 and dyck_p0 (D.5.14)");
  }
  if (dyck_p0 && task.kind() != v1::LATENT_KIND_DYCK) {
    return absl::FailedPreconditionError("dyck_p0 (D.5.14) needs a LATENT_KIND_DYCK task");
  }
  const int stages = (p0 || p1 || p2 ? 1 : 0) + (p3 ? 1 : 0) + (steering ? 1 : 0) + (ood_r2 ? 1 : 0) + (kl ? 1 : 0) +
                     (dissociation ? 1 : 0) + (dyck_p0 ? 1 : 0);
  Reporter rep(progress, cancel, stages);
  v1::AnalyzeTaskVectorsResponse report;
  TvRun x(model, task, r, rep, [&](const std::string& name, int layer, int64_t position, double value) {
    v1::TaskVectorValue* v = report.add_values();
    v->set_name(name);
    v->set_layer(layer < 0 ? -1 : layer + 1);  // layers count from 1 on the wire
    v->set_position(static_cast<int32_t>(position));
    v->set_value(value);
  });
  const std::vector<std::pair<bool, absl::Status (*)(TvRun&)>> analyses = {
      {p0 || p1 || p2, Conditioned}, {p3, P3},         {steering, Steering}, {ood_r2, OodR2Rows}, {kl, ModeKl},
      {dissociation, Dissociation},  {dyck_p0, DyckP0}};
  for (const auto& [asked, analysis] : analyses) {
    if (!asked) continue;
    if (absl::Status s = analysis(x); !s.ok()) return s;
    if (!rep.NextStage()) return Stopped();
  }
  return report;
}

// The analysis table's entry (analysis/registry.h).
CIRCUITLAB_ENGINE_ANALYSIS("latent", v1::AnalyzeTaskVectorsRequest, v1::AnalyzeTaskVectorsResponse,
                           TaskVectorAnalysis<LatentTaskGenerator>(RunTaskVectorAnalyses));

}  // namespace circuitlab::engine
