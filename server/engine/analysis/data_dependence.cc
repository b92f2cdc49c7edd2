#include "server/engine/analysis/data_dependence.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "server/common/seeds.h"
#include "server/engine/analysis/imir_analyses.h"
#include "server/engine/models/imir_model.h"
#include "server/engine/spec.h"
#include "server/engine/tasks/block_task.h"
#include "server/engine/setup/imir_setup.h"
#include "server/engine/analysis/registry.h"

namespace circuitlab::engine {
namespace {

constexpr const char* kNames[4] = {"alpha", "beta", "gamma", "delta"};

struct Measured {
  double grad[4] = {0, 0, 0, 0};
  double gamma_stderr = 0;
  double closed_form_gamma = 0;
  double identity_max_rel_error = 0;
};

v1::ExperimentSpec SpecAt(const v1::ExperimentSpec& base, const DataDependencePoint& p) {
  v1::ExperimentSpec spec = base;
  auto* d = spec.mutable_data();
  d->Clear();
  d->set_rare_fraction(p.rare_fraction);
  d->set_variability(p.variability);
  d->set_variability_mode(p.variant_mode ? v1::VARIABILITY_MODE_VARIANT : v1::VARIABILITY_MODE_REPAIR);
  d->set_burstiness(static_cast<uint32_t>(p.burstiness));
  // The four canonical coordinates of the paper basis, raw scaling, from zero.
  auto* m = spec.mutable_model()->mutable_imir();
  m->Clear();
  m->set_num_layers(2);
  m->set_num_heads(1);
  m->set_parameterisation(v1::PARAMETERISATION_COORDINATES);
  m->set_coordinate_scaling(v1::COORDINATE_SCALING_RAW);
  m->set_init(v1::INIT_SCHEME_ZERO);
  for (const char* name : kNames) m->add_coordinates(name);
  return spec;
}

Measured Measure(const v1::ExperimentSpec& base, const DataDependencePoint& point, const DataDependenceConfig& cfg,
                 const std::function<bool()>& tick) {
  v1::ExperimentSpec spec = SpecAt(base, point);
  if (absl::Status s = ResolveSpec({}, &spec); !s.ok()) throw std::invalid_argument(std::string(s.message()));
  const std::unique_ptr<BlockTask> task = MakeBlockTask(spec, PoolSeedOf(spec.seed()));
  const TaskSymmetry sym = task->Symmetry();
  const int64_t V = task->vocab_size(), T = task->seq_len();

  const std::unique_ptr<ImirModel> model_ptr = MakeModel(spec, *task, 1, torch::kCPU, /*float64=*/true);
  ImirModel& model = *model_ptr;
  const CoordinateConfig& cc = *model.config().coordinates;
  int32_t ids[4];
  int64_t pos[4];
  for (int i = 0; i < 4; ++i) {
    ids[i] = FindCoordinate(cc.basis, kNames[i]);
    pos[i] = std::find(cc.trained.begin(), cc.trained.end(), ids[i]) - cc.trained.begin();
  }
  for (int i = 0; i < 3; ++i) model.SetRawCoordinate(0, ids[i], point.abg);
  model.SetRawCoordinate(0, ids[3], point.delta);
  const torch::Tensor coef = model.parameters()[0];

  // Closed-form ingredients: which tokens the readout's I covers, C(q).
  std::vector<double> in_i(static_cast<size_t>(V));
  for (int64_t v = 0; v < V; ++v) in_i[v] = sym.heldout[v] ? 0.0 : 1.0;
  const torch::Tensor covered = torch::tensor(in_i, torch::kDouble);
  std::vector<int64_t> partner(sym.partner.begin(), sym.partner.end());
  const torch::Tensor partner_t = torch::tensor(partner, torch::kLong);
  const bool zero_point = point.abg == 0.0;
  // Per sequence at the zero point: sum_v p_v count_v / T - count_y / T.
  auto counted = [&](const Batch& b) {
    const int64_t n = b.tokens.size(0);
    torch::Tensor counts = torch::zeros({n, V}, torch::kDouble);
    counts.scatter_add_(1, b.tokens, torch::ones(b.tokens.sizes(), torch::kDouble));
    counts = counts * covered;
    const torch::Tensor q = b.tokens.select(1, T - 1);
    const torch::Tensor cq = partner_t.index({q});
    torch::Tensor logits = torch::zeros({n, V}, torch::kDouble);
    const torch::Tensor common = cq >= 0;
    logits.index_put_({common.nonzero().squeeze(1), cq.index({common})}, point.delta);
    const torch::Tensor p = torch::softmax(logits, 1);
    return ((p * counts).sum(1) - counts.gather(1, b.target.unsqueeze(1)).squeeze(1)) / static_cast<double>(T);
  };

  Measured out;
  torch::Generator gen =
      at::make_generator<at::CPUGeneratorImpl>(DeriveSeed63(cfg.seed, "data_dependence/data"));
  std::vector<double> chunk_gamma;
  double closed_sum = 0;
  int64_t done = 0;
  bool first = true;
  while (done < cfg.samples) {
    const int64_t count = std::min(cfg.chunk, cfg.samples - done);
    const Batch b = task->Sample(count, SampleMode::kTrain, gen);
    coef.mutable_grad() = torch::Tensor();
    torch::Tensor logits = model.Forward(b.tokens.unsqueeze(0), b.pids.unsqueeze(0))[0];
    torch::nll_loss(torch::log_softmax(logits, -1), b.target, {}, at::Reduction::Sum).backward();
    const torch::Tensor g = coef.grad()[0];
    for (int i = 0; i < 4; ++i) out.grad[i] += g[pos[i]].item<double>();
    chunk_gamma.push_back(g[pos[2]].item<double>() / static_cast<double>(count));
    if (zero_point) {
      const torch::Tensor per = counted(b);
      closed_sum += per.sum().item<double>();
      if (first) {
        // Autograd one sequence at a time against the count.
        const int64_t m = std::min<int64_t>(cfg.identity_sequences, count);
        for (int64_t i = 0; i < m; ++i) {
          coef.mutable_grad() = torch::Tensor();
          torch::Tensor l = model.Forward(b.tokens.narrow(0, i, 1).unsqueeze(0), b.pids.narrow(0, i, 1).unsqueeze(0))[0];
          torch::nll_loss(torch::log_softmax(l, -1), b.target.narrow(0, i, 1), {}, at::Reduction::Sum).backward();
          const double a = coef.grad()[0][pos[2]].item<double>(), c = per[i].item<double>();
          out.identity_max_rel_error =
              std::max(out.identity_max_rel_error, std::abs(a - c) / std::max(1e-300, std::abs(c)));
        }
      }
    }
    first = false;
    done += count;
    if (tick && !tick()) break;
  }
  for (double& g : out.grad) g /= static_cast<double>(done);
  out.closed_form_gamma = zero_point ? closed_sum / static_cast<double>(done) : std::nan("");
  // Standard error from the spread of chunk means (chunks of equal size).
  double mean = 0, var = 0;
  for (double c : chunk_gamma) mean += c / chunk_gamma.size();
  for (double c : chunk_gamma) var += (c - mean) * (c - mean);
  const double k = static_cast<double>(chunk_gamma.size());
  out.gamma_stderr = k > 1 ? std::sqrt(var / (k - 1) / k) : std::nan("");
  return out;
}

}  // namespace

std::vector<DataDependenceRow> CheckDataDependence(const v1::ExperimentSpec& base,
                                                   const std::vector<DataDependencePoint>& points,
                                                   const DataDependenceConfig& cfg,
                                                   const std::function<bool(int64_t, int64_t)>& progress) {
  // References (f_r = 1, f_v = 0) per (mode, b, delta, abg).
  using Key = std::tuple<bool, int64_t, double, double>;
  std::map<Key, DataDependencePoint> refs;
  for (const DataDependencePoint& p : points) {
    DataDependencePoint r = p;
    r.rare_fraction = 1.0;
    r.variability = 0.0;
    refs.emplace(Key{p.variant_mode, p.burstiness, p.delta, p.abg}, r);
  }
  const int64_t chunks = (cfg.samples + cfg.chunk - 1) / cfg.chunk;
  const int64_t total = chunks * static_cast<int64_t>(points.size() + refs.size());
  int64_t done = 0;
  bool stopped = false;
  auto tick = [&] {
    ++done;
    stopped = progress && !progress(done, total);
    return !stopped;
  };
  std::map<Key, Measured> ref_values;
  for (const auto& [key, p] : refs) {
    ref_values[key] = Measure(base, p, cfg, tick);
    if (stopped) return {};
  }
  std::vector<DataDependenceRow> rows;
  for (const DataDependencePoint& p : points) {
    const Measured m = Measure(base, p, cfg, tick);
    if (stopped) return {};
    const Measured& r = ref_values.at(Key{p.variant_mode, p.burstiness, p.delta, p.abg});
    DataDependenceRow row;
    row.point = p;
    for (int i = 0; i < 4; ++i) row.grad[i] = m.grad[i];
    row.gamma_stderr = m.gamma_stderr;
    row.closed_form_gamma = m.closed_form_gamma;
    row.identity_max_rel_error = m.identity_max_rel_error;
    row.phi = p.rare_fraction + (1.0 - p.rare_fraction) * p.variability;
    row.ratio = m.grad[2] / r.grad[2];
    const double nm = std::sqrt(m.grad[0] * m.grad[0] + m.grad[1] * m.grad[1] + m.grad[2] * m.grad[2]);
    const double nr = std::sqrt(r.grad[0] * r.grad[0] + r.grad[1] * r.grad[1] + r.grad[2] * r.grad[2]);
    row.ratio_vector = nm / nr;
    rows.push_back(row);
  }
  return rows;
}

}  // namespace circuitlab::engine

namespace circuitlab::engine {

absl::StatusOr<v1::CheckDataDependenceResponse> ImirDataDependence(const v1::ExperimentSpec& spec,
                                                                   const v1::CheckDataDependenceRequest& request,
                                                                   const AnalysisProgress& progress,
                                                                   const CancelToken* cancel) {
  at::set_num_threads(1);
  if (request.samples() == 0) return absl::InvalidArgumentError("CheckDataDependence needs its canonical request");
  std::vector<DataDependencePoint> points;
  for (const v1::DataPoint& p : request.points()) {
    DataDependencePoint q;
    q.rare_fraction = p.rare_fraction();
    q.variability = p.variability();
    q.variant_mode = p.variability_mode() != v1::VARIABILITY_MODE_REPAIR;
    q.burstiness = std::max<int64_t>(1, p.burstiness());
    q.delta = p.delta_saturated() ? SaturatedDelta(ShapeOf(spec).vocab) : p.delta();
    q.abg = p.abg();
    points.push_back(q);
  }
  DataDependenceConfig config;
  config.samples = static_cast<int64_t>(request.samples());
  // The standard error comes from the spread of chunk means: at least 8 chunks.
  config.chunk = std::min<int64_t>(config.chunk, config.samples / 8);
  config.seed = request.seed();
  bool stopped = false;
  const std::vector<DataDependenceRow> rows =
      CheckDataDependence(spec, points, config, [&](int64_t done, int64_t total) {
        if (progress) progress(static_cast<double>(done) / static_cast<double>(std::max<int64_t>(1, total)));
        stopped = cancel != nullptr && cancel->stop_requested();
        return !stopped;
      });
  if (stopped) return absl::CancelledError("data-dependence check stopped");
  v1::CheckDataDependenceResponse out;
  out.set_samples(request.samples());
  for (size_t i = 0; i < rows.size(); ++i) {
    const DataDependenceRow& r = rows[i];
    v1::DataDependenceRow* o = out.add_rows();
    *o->mutable_point() = request.points(static_cast<int>(i));
    o->mutable_point()->set_delta(r.point.delta);
    o->set_grad_alpha(r.grad[0]);
    o->set_grad_beta(r.grad[1]);
    o->set_grad_gamma(r.grad[2]);
    o->set_grad_delta(r.grad[3]);
    o->set_gamma_stderr(r.gamma_stderr);
    o->set_closed_form_gamma(r.closed_form_gamma);
    o->set_ratio(r.ratio);
    o->set_ratio_vector(r.ratio_vector);
    o->set_phi(r.phi);
    o->set_identity_max_rel_error(r.identity_max_rel_error);
  }
  return out;
}

// The analysis table's entry (analysis/registry.h).
CIRCUITLAB_ENGINE_ANALYSIS("imir", v1::CheckDataDependenceRequest, v1::CheckDataDependenceResponse,
                           [](const AnalysisInput& in, const v1::CheckDataDependenceRequest& r, const AnalysisProgress& progress, const CancelToken* cancel) { return ImirDataDependence(in.spec, r, progress, cancel); });

}  // namespace circuitlab::engine
