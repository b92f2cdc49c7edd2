// CheckInvariance (SCIENCE.md C.6, E.2 as corrected by G.5) on an IMIR
// spec: the in-span ladder, the must-fail controls and the SGD corollary,
// each judged by G.5's rule.
#include "server/common/seeds.h"
#include "server/engine/analysis/imir_analyses.h"
#include "server/engine/analysis/imir_eval.h"
#include "server/engine/manifold/invariance.h"
#include "server/engine/setup/imir_setup.h"
#include "server/engine/analysis/registry.h"

namespace circuitlab::engine {
namespace {

// SCIENCE.md G.5: in span when every matrix's plateau <= 1e-3 and slope in
// [-1.2, -0.8]; a control fails as it must when some plateau >= 0.01.
bool Passed(const std::string& name, const InvarianceResult& r) {
  if (name != "in_span") return r.max_matrix_plateau() >= 0.01;
  for (size_t i = 1; i < r.series.size(); ++i) {
    const InvarianceSeries& s = r.series[i];
    if (!(s.plateau <= 1e-3) || !(s.slope >= -1.2 && s.slope <= -0.8)) return false;
  }
  return true;
}

void AddCheck(const std::string& name, const InvarianceResult& r, v1::CheckInvarianceResponse& out) {
  v1::InvarianceCheck* c = out.add_checks();
  c->set_name(name);
  c->set_max_matrix_plateau(r.max_matrix_plateau());
  c->set_passed(Passed(name, r));
  for (const InvarianceSeries& s : r.series) {
    v1::InvarianceSeries* o = c->add_series();
    o->set_matrix(s.matrix);
    o->mutable_off_fraction()->Add(s.off_fraction.begin(), s.off_fraction.end());
    o->set_plateau(s.plateau);
    o->set_slope(s.slope);
  }
}

}  // namespace

absl::StatusOr<v1::CheckInvarianceResponse> ImirInvariance(const v1::ExperimentSpec& spec,
                                                           const v1::CheckInvarianceRequest& request,
                                                           const AnalysisProgress& progress,
                                                           const CancelToken* cancel) {
  at::set_num_threads(1);
  if (request.sample_sizes().empty()) {
    return absl::InvalidArgumentError("CheckInvariance needs its canonical request (sample_sizes)");
  }
  const std::unique_ptr<BlockTask> task = MakeBlockTask(spec, PoolSeedOf(spec.seed()));
  const auto& m = spec.model().imir();
  const TaskSymmetry sym = task->Symmetry();
  const Selection selection = SelectionOf(request.selection());
  const Basis span = BuildBasis(sym, m.num_layers(), m.num_heads(), selection);
  struct Check {
    std::string name;
    Basis basis;
    double noise;
  };
  std::vector<Check> checks = {{"in_span", span, 0.0}};
  if (request.controls()) {
    checks.push_back({"control_off_span", span, 0.3});
    if (std::any_of(sym.partner.begin(), sym.partner.end(), [](int p) { return p >= 0; })) {
      TaskSymmetry without = sym;  // claims the fixed pairs are exchangeable
      std::fill(without.partner.begin(), without.partner.end(), -1);
      checks.push_back({"control_no_relation", BuildBasis(without, m.num_layers(), m.num_heads(), selection), 0.0});
    }
  }
  // Each ladder is one stage, the SGD corollary one more.
  const double stages = static_cast<double>(checks.size()) + (request.sgd_corollary() ? 1.0 : 0.0);
  bool stopped = false;
  auto stage = [&](double index) {
    return [&, index](int64_t done, int64_t total) {
      if (progress) progress((index + static_cast<double>(done) / static_cast<double>(total)) / stages);
      stopped = cancel != nullptr && cancel->stop_requested();
      return !stopped;
    };
  };
  v1::CheckInvarianceResponse out;
  out.mutable_sample_sizes()->Add(request.sample_sizes().begin(), request.sample_sizes().end());
  for (size_t i = 0; i < checks.size(); ++i) {
    InvarianceConfig ic;
    ic.layers = m.num_layers();
    ic.heads = m.num_heads();
    ic.sample_sizes.assign(request.sample_sizes().begin(), request.sample_sizes().end());
    ic.coordinate_std = request.coordinate_std();
    ic.off_manifold_noise = checks[i].noise;
    ic.seed = request.seed();
    const InvarianceResult r =
        CheckInvariance(*task, checks[i].basis, checks[i].basis, ic, stage(static_cast<double>(i)));
    if (stopped) return absl::CancelledError("invariance check stopped");
    AddCheck(checks[i].name, r, out);
  }
  if (request.sgd_corollary()) {
    SgdCorollaryConfig sc;
    sc.layers = m.num_layers();
    sc.heads = m.num_heads();
    sc.coordinate_std = request.coordinate_std();
    sc.seed = request.seed();
    const std::vector<SgdCorollaryPoint> sgd = SgdCorollary(*task, span, sc, stage(stages - 1.0));
    if (stopped) return absl::CancelledError("invariance check stopped");
    for (const SgdCorollaryPoint& p : sgd) {
      v1::SgdCorollaryPoint* o = out.add_sgd();
      o->set_batch_size(static_cast<uint64_t>(p.batch_size));
      o->set_rho(p.rho);
      o->set_rho_symmetrised(p.rho_symmetrised);
    }
    out.set_sgd_steps(static_cast<uint64_t>(sc.steps));
    out.set_sgd_group_elements(static_cast<uint64_t>(sc.group_elements));
    out.set_sgd_learning_rate(sc.learning_rate);
  }
  return out;
}

// The analysis table's entry (analysis/registry.h).
CIRCUITLAB_ENGINE_ANALYSIS("imir", v1::CheckInvarianceRequest, v1::CheckInvarianceResponse,
                           [](const AnalysisInput& in, const v1::CheckInvarianceRequest& r, const AnalysisProgress& progress, const CancelToken* cancel) { return ImirInvariance(in.spec, r, progress, cancel); });

}  // namespace circuitlab::engine
