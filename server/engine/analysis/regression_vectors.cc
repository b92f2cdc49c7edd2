#include "server/engine/analysis/regression_vectors.h"

#include <algorithm>
#include <cmath>

#include "server/common/seeds.h"
#include "server/engine/analysis/task_vectors.h"
#include "server/engine/torch_util.h"
#include "server/engine/setup/decoder_setup.h"
#include "server/engine/setup/checkpoint_io.h"
#include "server/engine/analysis/decoder_analysis.h"
#include "server/engine/analysis/registry.h"

namespace circuitlab::engine {
namespace {

// Sequences per forward pass (bounds activation memory).
constexpr int64_t kRgChunk = 1024;
// Sequences per chunk of the mixture predictors ([chunk, n, tasks]).
constexpr int64_t kRgBayesChunk = 256;

// The model's predictions [N, n] (float64), in chunks.
torch::Tensor Predict(const DecoderModel& model, const torch::Tensor& x, const torch::Tensor& y) {
  std::vector<torch::Tensor> parts;
  const int64_t N = x.size(0);
  for (int64_t b = 0; b < N; b += kRgChunk) {
    const int64_t n = std::min(kRgChunk, N - b);
    parts.push_back(PredictRegression(model, x.narrow(0, b, n).to(torch::kFloat).unsqueeze(0),
                                      y.narrow(0, b, n).to(torch::kFloat).unsqueeze(0))
                        .squeeze(0)
                        .to(torch::kDouble));
  }
  return torch::cat(parts, 0);
}

// Within-group residual sum of squares of h [B, D] after an OLS fit on
// X [B, f] (with an intercept).
double ResidualSS(const torch::Tensor& h, const torch::Tensor& X) {
  torch::Tensor Xi = torch::cat({torch::ones({X.size(0), 1}, X.options()), X}, 1);
  torch::Tensor fit = torch::matmul(Xi, torch::matmul(torch::linalg_pinv(Xi), h));
  return (h - fit).pow(2).sum().item<double>();
}

// What the analyses of one regression checkpoint share.
struct RgRun {
  RgRun(const DecoderModel& m, const RegressionTaskGenerator& t, const v1::AnalyzeTaskVectorsRequest& request,
        RowFn rows, std::function<bool(double)> advance_fn)
      : model(m),
        task(t),
        r(request),
        row(std::move(rows)),
        advance(std::move(advance_fn)),
        n(t.num_points()),
        K(t.num_majors()),
        d(t.dim()),
        last(n - 1),
        L(static_cast<int>(m.config().layers)) {
    VectorWindow w = VectorWindowOf(r, L, last);  // the estimation window over points
    layers = std::move(w.layers);
    est_begin = w.est_begin;
    est_end = w.est_end;
  }

  // B natural sequences of each major (task k's at rows k*B..) and their
  // states at the |- positions of every requested layer.
  std::pair<RegressionBatch, std::vector<torch::Tensor>> MajorsStates(const char* purpose, int64_t B) const {
    torch::Generator gen = MakeGenerator(DeriveSeed63(r.seed(), purpose));
    RegressionBatch batch = task.SamplePool(LatentPool::kMajor, Repeat(K, B), gen);
    std::vector<torch::Tensor> states = RegressionStates(model, batch.x, batch.y, layers, r.hook());
    return {std::move(batch), std::move(states)};
  }

  const DecoderModel& model;
  const RegressionTaskGenerator& task;
  const v1::AnalyzeTaskVectorsRequest& r;
  const RowFn row;
  const std::function<bool(double)> advance;  // fraction of the current stage; false when cancelled
  const int64_t n, K, d, last;
  const int L;
  std::vector<int> layers;
  int64_t est_begin = 0, est_end = 0;
};

// P0: within each major, is the state a (linear) function of x_i?
absl::Status RegressionP0(RgRun& run) {
  auto& [model, task, r, row, advance, n, K, d, last, L, layers, est_begin, est_end] = run;
  const absl::Status stopped = absl::CancelledError("task-vector analysis stopped");
  auto majors_states = [&run](const char* purpose, int64_t B) { return run.MajorsStates(purpose, B); };
  std::vector<int64_t> points(r.positions().begin(), r.positions().end());
  if (points.empty()) {
    for (int64_t p : {0, 1, 2, 4, 8, 16, 32}) {
      if (p < last) points.push_back(p);
    }
    points.push_back(last);
  }
  for (int64_t& p : points) p = std::min(p, last);
  std::sort(points.begin(), points.end());
  points.erase(std::unique(points.begin(), points.end()), points.end());
  const int64_t B = r.samples_per_cell();
  const auto [batch, states] = majors_states("tv/conditioned", B);
  for (size_t li = 0; li < layers.size(); ++li) {
    for (int64_t i : points) {
      torch::Tensor h = states[li].select(1, i).view({K, B, -1});
      torch::Tensor xi = batch.x.select(1, i).view({K, B, d});
      const double total = (h - h.mean(at::IntArrayRef{0, 1})).pow(2).sum().item<double>();
      double within = 0, task_only = 0;
      for (int64_t k = 0; k < K; ++k) {
        within += ResidualSS(h[k], xi[k]);
        task_only += (h[k] - h[k].mean(0)).pow(2).sum().item<double>();
      }
      row("p0/resid_ratio", layers[li], i, total > 0 ? within / total : 0.0);
      row("p0/task_only_ratio", layers[li], i, total > 0 ? task_only / total : 0.0);
    }
    if (!advance(static_cast<double>(li + 1) / static_cast<double>(layers.size()))) return stopped;
  }
  return absl::OkStatus();
}

// P2 with a linear token model (D.5.5, E2: OLS on x_i replaces the token cells).
absl::Status RegressionP2(RgRun& run) {
  auto& [model, task, r, row, advance, n, K, d, last, L, layers, est_begin, est_end] = run;
  const absl::Status stopped = absl::CancelledError("task-vector analysis stopped");
  auto majors_states = [&run](const char* purpose, int64_t B) { return run.MajorsStates(purpose, B); };
  const int64_t B = r.samples_per_cell();
  const auto [batch, states] = majors_states("tv/p2", B);
  torch::Tensor X = torch::cat({torch::ones({K * B, n, 1}, kF64), batch.x}, -1);  // [K*B, n, d+1]
  for (size_t li = 0; li < layers.size(); ++li) {
    torch::Tensor h = states[li];            // [K*B, n, D]
    torch::Tensor hc = h - h.mean(0, true);  // per-point sample mean removed
    // The token effect: per point, OLS of h_c on [1, x_i] pooled over tasks.
    torch::Tensor coef = torch::matmul(torch::linalg_pinv(X.transpose(0, 1)), hc.transpose(0, 1));  // [n, d+1, D]
    torch::Tensor ht = hc - torch::matmul(X.transpose(0, 1), coef).transpose(0, 1);
    torch::Tensor theta =
        ht.view({K, B, n, -1}).narrow(2, est_begin, est_end - est_begin + 1).mean(at::IntArrayRef{1, 2});
    theta = theta - theta.mean(0);  // [K, D]
    double sum_add = 0, sum_task = 0;
    for (int64_t i = 0; i <= last; ++i) {
      torch::Tensor a = ht.select(1, i), c = hc.select(1, i);  // [K*B, D]
      const double den = c.pow(2).sum().item<double>();
      auto r2 = [&](const torch::Tensor& y) {
        torch::Tensor beta = ProjectToSimplex(AffineWeights(y, theta));
        return den > 0 ? 1.0 - (y - torch::matmul(beta, theta)).pow(2).sum().item<double>() / den : 0.0;
      };
      const double add = r2(a), tsk = r2(c);
      row("p2/r2_additive", layers[li], i, add);
      row("p2/r2_task", layers[li], i, tsk);
      sum_add += add;
      sum_task += tsk;
    }
    row("p2/r2_additive_mean", layers[li], -1, sum_add / static_cast<double>(n));
    row("p2/r2_task_mean", layers[li], -1, sum_task / static_cast<double>(n));
    if (!advance(static_cast<double>(li + 1) / static_cast<double>(layers.size()))) return stopped;
  }
  return absl::OkStatus();
}

// P3: weights on the task vectors vs the posterior from the Gaussian likelihood
// (D.5.6).
absl::Status RegressionP3(RgRun& run) {
  auto& [model, task, r, row, advance, n, K, d, last, L, layers, est_begin, est_end] = run;
  const absl::Status stopped = absl::CancelledError("task-vector analysis stopped");
  auto majors_states = [&run](const char* purpose, int64_t B) { return run.MajorsStates(purpose, B); };
  const int64_t B = r.p3_samples();
  const auto [batch, states] = majors_states("tv/p3", B);
  torch::Tensor alpha = task.MajorPosterior(batch.x, batch.y).view({K, B, n, K});
  for (size_t li = 0; li < layers.size(); ++li) {
    P3Rows(states[li].view({K, B, n, -1}), alpha, est_begin, est_end, layers[li], row);
    if (!advance(static_cast<double>(li + 1) / static_cast<double>(layers.size()))) return stopped;
  }
  return absl::OkStatus();
}

// Steering along the task simplex (D.5.7, E2: RMSE of the prediction).
absl::Status RegressionSteering(RgRun& run) {
  auto& [model, task, r, row, advance, n, K, d, last, L, layers, est_begin, est_end] = run;
  const absl::Status stopped = absl::CancelledError("task-vector analysis stopped");
  // steering_layer counts from 1 on the wire.
  const int sl = r.has_steering_layer() ? static_cast<int>(r.steering_layer()) - 1 : std::min(L - 1, (2 * L) / 3);
  torch::Generator gen = MakeGenerator(DeriveSeed63(r.seed(), "tv/steering"));
  const int64_t Be = r.steering_est_samples();
  RegressionBatch est = task.SamplePool(LatentPool::kMajor, Repeat(K, Be), gen);
  torch::Tensor h = RegressionStates(model, est.x, est.y, {sl}, r.estimation_hook())[0].view({K, Be, n, -1});
  torch::Tensor theta = h.mean(1) - h.mean(at::IntArrayRef{0, 1});  // [K, n, D]
  torch::Tensor mu = h.mean(at::IntArrayRef{0, 1});                 // [n, D]
  const int64_t N = r.steering_samples();
  torch::Tensor true_task = torch::arange(N, torch::kLong).remainder(K);
  RegressionBatch batch = task.SamplePool(LatentPool::kMajor, true_task, gen);
  torch::Tensor alpha = at::_standard_gamma(torch::ones({N, K}, kF64), gen);
  alpha = alpha / alpha.sum(-1, true);
  const int64_t p_begin = r.has_steer_begin() ? std::min<int64_t>(r.steer_begin(), last) : last / 3;
  const int64_t p_end =
      r.has_steer_end() ? std::clamp<int64_t>(r.steer_end(), p_begin, last) : std::max(p_begin, (2 * last) / 3);
  const torch::Tensor& majors = task.pool(LatentPool::kMajor);
  torch::Tensor per_task = torch::matmul(batch.x, majors.t());     // [N, n, K]: x_i.w_k
  torch::Tensor target = (per_task * alpha.unsqueeze(1)).sum(-1);  // [N, n]
  torch::Tensor corner = per_task.gather(2, alpha.argmax(-1).view({N, 1, 1}).expand({N, n, 1})).squeeze(-1);
  torch::Tensor clean = Predict(model, batch.x, batch.y);
  const bool projection = r.steering_subtract() == "projection";
  torch::Tensor theta_bar = theta.narrow(1, p_begin, p_end - p_begin + 1).mean(1);  // [K, D]
  const torch::Tensor span = OrthonormalColumns(theta_bar.t());
  const torch::Tensor Pf = torch::matmul(span, span.t()).to(torch::kFloat);
  torch::Tensor inputs = MemberInputs(model, batch.x, batch.y);  // [N, 3n, d + 1]
  const std::string point = HookName(sl, r.injection_hook());
  double sq_base = 0, sq_inj = 0, sq_mode = 0;
  for (int64_t p = p_begin; p <= p_end; ++p) {
    const int64_t pos = DecoderModel::PredictionPosition(p);
    torch::Tensor tp = theta.select(1, p);  // [K, D]
    torch::Tensor delta = (torch::matmul(alpha, tp) - tp.index_select(0, true_task)).to(torch::kFloat);
    torch::Tensor goal = torch::matmul(alpha, theta_bar).to(torch::kFloat);
    const torch::Tensor mup = mu.select(0, p).to(torch::kFloat);
    std::vector<torch::Tensor> preds;
    for (int64_t b = 0; b < N; b += kRgChunk) {
      const int64_t c = std::min(kRgChunk, N - b);
      HookFn inject = SteeringHook(point, pos, {delta.narrow(0, b, c), goal.narrow(0, b, c), mup, Pf, projection});
      torch::Tensor in = inputs.narrow(0, b, c).narrow(1, 0, pos + 1).unsqueeze(0);
      preds.push_back(model.Forward(in, &inject).squeeze(0).select(1, pos).squeeze(-1).to(torch::kDouble));
    }
    torch::Tensor inj = torch::cat(preds, 0);
    torch::Tensor tg = target.select(1, p);
    sq_base += (clean.select(1, p) - tg).pow(2).mean().item<double>();
    sq_inj += (inj - tg).pow(2).mean().item<double>();
    sq_mode += (corner.select(1, p) - tg).pow(2).mean().item<double>();
    if (!advance(static_cast<double>(p - p_begin + 1) / static_cast<double>(p_end - p_begin + 1))) return stopped;
  }
  const double np = static_cast<double>(p_end - p_begin + 1);
  const double base = std::sqrt(sq_base / np), inj = std::sqrt(sq_inj / np);
  row("steering/rmse_base", sl, -1, base);
  row("steering/rmse_inj", sl, -1, inj);
  row("steering/rmse_mode", sl, -1, std::sqrt(sq_mode / np));
  row("steering/ratio", sl, -1, base > 0 ? inj / base : 0.0);
  return absl::OkStatus();
}

// OOD projection R^2 against the task subspace (D.5.8).
absl::Status RegressionOodR2(RgRun& run) {
  auto& [model, task, r, row, advance, n, K, d, last, L, layers, est_begin, est_end] = run;
  const absl::Status stopped = absl::CancelledError("task-vector analysis stopped");
  torch::Generator gen = MakeGenerator(DeriveSeed63(r.seed(), "tv/ood"));
  const int64_t S = r.ood_samples(), O = r.ood_tasks();
  RegressionBatch maj = task.SamplePool(LatentPool::kMajor, Repeat(K, S), gen);
  RegressionBatch ood = task.SampleFrom(task.DrawTasks(O, gen).repeat_interleave(S, 0), gen);
  std::vector<torch::Tensor> hm = RegressionStates(model, maj.x, maj.y, layers, r.hook());
  std::vector<torch::Tensor> ho = RegressionStates(model, ood.x, ood.y, layers, r.hook());
  for (size_t li = 0; li < layers.size(); ++li) {
    // Per-task means at every point; R^2 over points 0..n-2.
    const OodR2 r2 = OodProjectionR2(hm[li].view({K, S, n, -1}).mean(1), ho[li].view({O, S, n, -1}).mean(1));
    row("ood_r2/code", layers[li], -1, r2.code);
    row("ood_r2/norm", layers[li], -1, r2.norm);
    row("ood_r2/code_q25", layers[li], -1, r2.code_q25);
    row("ood_r2/code_q75", layers[li], -1, r2.code_q75);
    if (!advance(static_cast<double>(li + 1) / static_cast<double>(layers.size()))) return stopped;
  }
  return absl::OkStatus();
}

// Mode transition (D.5.9) with squared distances; and on fresh tasks.
absl::Status RegressionModes(RgRun& run) {
  auto& [model, task, r, row, advance, n, K, d, last, L, layers, est_begin, est_end] = run;
  const absl::Status stopped = absl::CancelledError("task-vector analysis stopped");
  torch::Generator gen = MakeGenerator(DeriveSeed63(r.seed(), "tv/kl"));
  auto distances = [&](const RegressionBatch& b, bool hybrid) {
    torch::Tensor pred = Predict(model, b.x, b.y);
    double exact = 0, other = 0;
    const int64_t N = b.x.size(0);
    for (int64_t s = 0; s < N; s += kRgBayesChunk) {
      const int64_t c = std::min(kRgBayesChunk, N - s);
      torch::Tensor x = b.x.narrow(0, s, c), y = b.y.narrow(0, s, c), pr = pred.narrow(0, s, c);
      exact += (pr - task.KnownPool(x, y).mean).pow(2).sum().item<double>();
      torch::Tensor ref = hybrid ? task.Hybrid(x, y, r.p_common()).mean : task.Ridge(x, y);
      other += (pr - ref).pow(2).sum().item<double>();
    }
    const double cells = static_cast<double>(N * n);
    return std::pair{exact / cells, other / cells};
  };
  auto log_ratio = [](double a, double b) { return std::log10(std::max(a, 1e-300) / std::max(b, 1e-300)); };
  const auto [exact, extrap] = distances(task.SampleTrain(r.kl_samples(), gen), true);
  row("kl/exact", -1, -1, exact);
  row("kl/extrap", -1, -1, extrap);
  row("kl/log10_ratio", -1, -1, log_ratio(exact, extrap));
  if (!advance(0.5)) return stopped;
  // Fresh tasks: does the model retrieve a known task or run ridge?
  const auto [ood_exact, ood_ridge] = distances(task.SampleFrom(task.DrawTasks(r.kl_samples(), gen), gen), false);
  row("kl/ood_exact", -1, -1, ood_exact);
  row("kl/ood_ridge", -1, -1, ood_ridge);
  row("kl/ood_log10_ratio", -1, -1, log_ratio(ood_exact, ood_ridge));
  return absl::OkStatus();
}

}  // namespace

std::vector<torch::Tensor> RegressionStates(const DecoderModel& model, const torch::Tensor& x, const torch::Tensor& y,
                                            const std::vector<int>& layers, const std::string& kind) {
  std::vector<torch::Tensor> states = HiddenStates(model, MemberInputs(model, x, y), layers, kind);
  for (torch::Tensor& s : states) s = s.slice(1, 1, s.size(1), 3).contiguous();  // the |- positions
  return states;
}

absl::StatusOr<v1::AnalyzeTaskVectorsResponse> RunRegressionAnalyses(const DecoderModel& model,
                                                                     const RegressionTaskGenerator& task,
                                                                     const v1::AnalyzeTaskVectorsRequest& r,
                                                                     const std::function<void(double)>& progress,
                                                                     const CancelToken* cancel) {
  torch::NoGradGuard no_grad;
  if (Asked(r, "p1") || Asked(r, "dissociation") || Asked(r, "dyck_p0")) {
    return absl::FailedPreconditionError(
        "LATENT_KIND_REGRESSION runs support p0 (ANCOVA), p2 and p3 (natural states), steering (RMSE), ood_r2 "
        "and kl (squared distances); p1, dissociation and dyck_p0 need a token task");
  }
  const std::vector<std::pair<const char*, absl::Status (*)(RgRun&)>> all = {
      {"p0", RegressionP0},        {"p2", RegressionP2},   {"p3", RegressionP3}, {"steering", RegressionSteering},
      {"ood_r2", RegressionOodR2}, {"kl", RegressionModes}};
  int stages = 0, stage = 0;
  for (const auto& [name, analysis] : all) stages += Asked(r, name) ? 1 : 0;
  auto advance = [&](double fraction) {
    if (progress) progress((stage + std::clamp(fraction, 0.0, 1.0)) / std::max(1, stages));
    return cancel == nullptr || !cancel->stop_requested();
  };
  v1::AnalyzeTaskVectorsResponse report;
  RgRun x(
      model, task, r,
      [&](const std::string& name, int layer, int64_t position, double value) {
        v1::TaskVectorValue* v = report.add_values();
        v->set_name(name);
        v->set_layer(layer < 0 ? -1 : layer + 1);  // layers count from 1 on the wire
        v->set_position(static_cast<int32_t>(position));
        v->set_value(value);
      },
      advance);
  for (const auto& [name, analysis] : all) {
    if (!Asked(r, name)) continue;
    if (absl::Status s = analysis(x); !s.ok()) return s;
    ++stage;
    if (!advance(0.0)) return absl::CancelledError("task-vector analysis stopped");
  }
  return report;
}

// The analysis table's entry (analysis/registry.h).
CIRCUITLAB_ENGINE_ANALYSIS("regression", v1::AnalyzeTaskVectorsRequest, v1::AnalyzeTaskVectorsResponse,
                           TaskVectorAnalysis<RegressionTaskGenerator>(RunRegressionAnalyses));

}  // namespace circuitlab::engine
