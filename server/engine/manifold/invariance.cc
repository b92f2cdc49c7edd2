#include "server/engine/manifold/invariance.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "server/common/seeds.h"
#include "server/engine/manifold/projection.h"
#include "server/engine/models/imir_model.h"

namespace circuitlab::engine {
namespace {

// Only points with 1 - f_N <= this are in the asymptotic regime
// a/N + b (below it the Monte-Carlo noise no longer dominates the total).
constexpr double kAsymptotic = 0.1;

// Fits y = a/N + b over the asymptotic points by least squares weighted by
// 1/y^2 (relative errors: the ladder spans orders of magnitude); returns
// max(b, 0). With fewer than two such points the smallest y observed stands
// in (an upper bound on the plateau the ladder could show).
double FitPlateau(const std::vector<int64_t>& n, const std::vector<double>& y) {
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  int points = 0;
  for (size_t i = 0; i < n.size(); ++i) {
    if (!(y[i] > 0 && y[i] <= kAsymptotic)) continue;
    ++points;
    const double w = 1.0 / (y[i] * y[i]), x = 1.0 / static_cast<double>(n[i]);
    sw += w;
    sx += w * x;
    sy += w * y[i];
    sxx += w * x * x;
    sxy += w * x * y[i];
  }
  const double det = sw * sxx - sx * sx;
  if (points < 2 || det <= 0) return y.empty() ? 0.0 : *std::min_element(y.begin(), y.end());
  const double b = (sxx * sy - sx * sxy) / det;
  return std::max(0.0, b);
}

double FitSlope(const std::vector<int64_t>& n, const std::vector<double>& y) {
  double k = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < n.size(); ++i) {
    if (!(y[i] > 0 && y[i] <= kAsymptotic)) continue;
    const double x = std::log(static_cast<double>(n[i])), ly = std::log(y[i]);
    k += 1;
    sx += x;
    sy += ly;
    sxx += x * x;
    sxy += x * ly;
  }
  if (k < 2) return std::numeric_limits<double>::quiet_NaN();
  return (k * sxy - sx * sy) / (k * sxx - sx * sx);
}

// A float64 FULL model at a random point of `basis`'s span: raw coordinates
// i.i.d. N(0, s^2) drawn from `gen`.
std::unique_ptr<ImirModel> ModelInSpan(const BlockTask& task, const Basis& basis, int64_t layers, int64_t heads,
                                       double s, torch::Generator& gen) {
  ImirModelConfig mc = DenseConfig(task.vocab_size(), task.num_positions(), layers, heads, /*zero_init=*/true);
  mc.float64 = true;
  auto model = std::make_unique<ImirModel>(mc, 1, torch::kCPU);
  torch::Tensor coords = torch::randn({static_cast<int64_t>(basis.coords.size())}, gen, torch::kDouble).mul_(s);
  Projection point;
  point.values.assign(coords.data_ptr<double>(), coords.data_ptr<double>() + coords.numel());
  LoadProjected(Projector(basis), point, *model, 0);
  return model;
}

}  // namespace

Batch ApplyRandomSymmetry(const Batch& batch, const TaskSymmetry& sym, torch::Generator& gen) {
  const int64_t V = sym.vocab();
  std::vector<int64_t> image(static_cast<size_t>(V));
  for (int64_t t = 0; t < V; ++t) image[t] = t;
  const int classes = static_cast<int>(sym.class_names.size());
  for (int c = 0; c < classes; ++c) {
    std::vector<int64_t> members, firsts;  // firsts: one member of each fixed pair
    bool paired = true;
    for (int64_t t = 0; t < V; ++t) {
      if (sym.token_class[t] != c) continue;
      members.push_back(t);
      const int p = sym.partner[t];
      if (p < 0 || sym.token_class[p] != c) paired = false;
      if (p > t) firsts.push_back(t);
    }
    if (members.size() < 2) continue;
    if (paired) {
      // Permute the pairs and flip each with probability 1/2: C is kept.
      const torch::Tensor order = torch::randperm(static_cast<int64_t>(firsts.size()), gen, torch::kLong);
      const torch::Tensor flip = torch::rand({static_cast<int64_t>(firsts.size())}, gen, torch::kDouble) < 0.5;
      for (size_t i = 0; i < firsts.size(); ++i) {
        int64_t a = firsts[static_cast<size_t>(order[i].item<int64_t>())], b = sym.partner[a];
        if (flip[i].item<bool>()) std::swap(a, b);
        image[firsts[i]] = a;
        image[sym.partner[firsts[i]]] = b;
      }
    } else if (std::all_of(members.begin(), members.end(), [&](int64_t t) { return sym.partner[t] < 0; })) {
      const torch::Tensor order = torch::randperm(static_cast<int64_t>(members.size()), gen, torch::kLong);
      for (size_t i = 0; i < members.size(); ++i) image[members[i]] = members[order[i].item<int64_t>()];
    }
  }
  const torch::Tensor map = torch::tensor(image, torch::kLong);
  Batch out = batch;
  out.tokens = map.index({batch.tokens});
  out.target = map.index({batch.target});
  out.alt_target = map.index({batch.alt_target});
  if (sym.cyclic_positions && sym.positions > 0) {
    const int64_t shift = torch::randint(0, sym.positions, {1}, gen, torch::kLong).item<int64_t>();
    out.pids = (batch.pids + shift).remainder(sym.positions);
  }
  return out;
}

std::vector<SgdCorollaryPoint> SgdCorollary(const BlockTask& task, const Basis& basis, const SgdCorollaryConfig& cfg,
                                            const std::function<bool(int64_t, int64_t)>& progress) {
  const TaskSymmetry sym = task.Symmetry();
  const Projector projector(basis);
  std::vector<SgdCorollaryPoint> out;
  const int64_t total = 2 * cfg.steps * static_cast<int64_t>(cfg.batch_sizes.size());
  int64_t done = 0;
  for (int64_t batch : cfg.batch_sizes) {
    SgdCorollaryPoint point;
    point.batch_size = batch;
    for (bool symmetrised : {false, true}) {
      torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(DeriveSeed63(cfg.seed, "invariance/point"));
      const std::unique_ptr<ImirModel> model_ptr =
          ModelInSpan(task, basis, cfg.layers, cfg.heads, cfg.coordinate_std, gen);
      ImirModel& model = *model_ptr;
      // The same data stream for both variants.
      torch::Generator data = at::make_generator<at::CPUGeneratorImpl>(DeriveSeed63(cfg.seed, "invariance/sgd", batch));
      torch::Generator group = at::make_generator<at::CPUGeneratorImpl>(DeriveSeed63(cfg.seed, "invariance/group", batch));
      torch::optim::SGD opt(model.parameters(), torch::optim::SGDOptions(cfg.learning_rate));
      for (int64_t step = 0; step < cfg.steps; ++step) {
        const Batch b = task.Sample(batch, SampleMode::kTrain, data);
        opt.zero_grad();
        const int64_t copies = symmetrised ? cfg.group_elements : 1;
        for (int64_t r = 0; r < copies; ++r) {
          const Batch g = symmetrised ? ApplyRandomSymmetry(b, sym, group) : b;
          torch::Tensor logits = model.Forward(g.tokens.unsqueeze(0), g.pids.unsqueeze(0))[0];
          torch::Tensor loss = torch::nll_loss(torch::log_softmax(logits, -1), g.target) / static_cast<double>(copies);
          loss.backward();
        }
        opt.step();
        ++done;
        if (progress && !progress(done, total)) return out;
      }
      const double rho = Project(projector, model, 0).rho();
      (symmetrised ? point.rho_symmetrised : point.rho) = rho;
    }
    out.push_back(point);
  }
  return out;
}

InvarianceResult CheckInvariance(const BlockTask& task, const Basis& point_basis, const Basis& check_basis,
                                 const InvarianceConfig& cfg, const std::function<bool(int64_t, int64_t)>& progress) {
  // The point: raw coordinates N(0, s^2) on the point basis, plus optional
  // relative noise off the span.
  torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(DeriveSeed63(cfg.seed, "invariance/point"));
  const std::unique_ptr<ImirModel> model_ptr =
      ModelInSpan(task, point_basis, cfg.layers, cfg.heads, cfg.coordinate_std, gen);
  ImirModel& model = *model_ptr;
  if (cfg.off_manifold_noise > 0) {
    torch::NoGradGuard no_grad;
    for (const torch::Tensor& p : model.parameters()) {
      torch::Tensor noise = torch::randn(p.sizes(), gen, torch::kDouble);
      const double scale = cfg.off_manifold_noise * p.norm().item<double>() / std::max(1e-300, noise.norm().item<double>());
      p.add_(noise * scale);
    }
  }

  const Projector check(check_basis);
  const int64_t total = cfg.sample_sizes.back();
  std::vector<torch::Tensor> grad_sum;
  for (const torch::Tensor& p : model.parameters()) grad_sum.push_back(torch::zeros_like(p));
  InvarianceResult result;
  result.sample_sizes = cfg.sample_sizes;
  std::vector<std::vector<double>> off;  // [series][ladder point]
  size_t next = 0;
  int64_t done = 0;
  torch::Generator data = at::make_generator<at::CPUGeneratorImpl>(DeriveSeed63(cfg.seed, "invariance/data"));
  while (done < total) {
    // Chunks end exactly on ladder points so each snapshot is a prefix mean.
    const int64_t count = std::min(cfg.chunk, cfg.sample_sizes[next] - done);
    Batch b = task.Sample(count, SampleMode::kTrain, data);
    torch::Tensor logits = model.Forward(b.tokens.unsqueeze(0), b.pids.unsqueeze(0))[0];
    torch::Tensor loss = torch::nll_loss(torch::log_softmax(logits, -1), b.target, {}, at::Reduction::Sum);
    for (const torch::Tensor& p : model.parameters()) p.mutable_grad() = torch::Tensor();
    loss.backward();
    const auto params = model.parameters();
    for (size_t i = 0; i < params.size(); ++i) grad_sum[i].add_(params[i].grad());
    done += count;
    if (progress && !progress(done, total)) return result;
    if (done == cfg.sample_sizes[next]) {
      std::vector<torch::Tensor> kq(grad_sum.begin(), grad_sum.end() - 1);
      const Projection g = check.ProjectTensors(kq, grad_sum.back());  // the mean's fraction = the sum's
      if (off.empty()) off.resize(g.matrices.size() + 1);
      double tot = 0, on = 0;
      for (size_t m = 0; m < g.matrices.size(); ++m) {
        tot += g.matrices[m].total_sq;
        on += g.matrices[m].on_sq;
        off[m + 1].push_back(g.matrices[m].total_sq > 0 ? 1.0 - g.matrices[m].on_sq / g.matrices[m].total_sq : 0.0);
      }
      off[0].push_back(tot > 0 ? 1.0 - on / tot : 0.0);
      if (result.series.empty()) {
        result.series.push_back({"all", {}, 0, 0});
        for (const MatrixNorms& m : g.matrices) result.series.push_back({m.matrix, {}, 0, 0});
      }
      ++next;
    }
  }
  for (size_t s = 0; s < result.series.size(); ++s) {
    result.series[s].off_fraction = off[s];
    result.series[s].plateau = FitPlateau(cfg.sample_sizes, off[s]);
    result.series[s].slope = FitSlope(cfg.sample_sizes, off[s]);
  }
  return result;
}

}  // namespace circuitlab::engine
