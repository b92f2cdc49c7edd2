// DetectCircuit: automatic circuit detection (SCIENCE.md D.1) on a stored
// checkpoint; validation, canonical request, the job.
#include "server/scheduler/analysis_core.h"

#include "server/common/status_macros.h"
#include "server/scheduler/analyses/analysis_util.h"
#include "server/scheduler/scheduler.h"

namespace circuitlab::scheduler {

absl::StatusOr<v1::DetectCircuitResponse> AnalysisCore::DetectCircuit(
    const v1::DetectCircuitRequest& request, const std::string& client) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseRunId(request.run_id()));
  CL_RETURN_IF_ERROR(CheckSelection(request.selection()));
  CL_RETURN_IF_ERROR(CheckEvalSize(request.n_eval(), kMinEval, "n_eval"));
  engine::DetectRequest d;
  const std::string metric = request.metric().empty() ? "accuracy" : request.metric();
  if (metric == "accuracy") {
    d.metric = engine::CircuitMetric::kAccuracy;
  } else if (metric == "loss") {
    d.metric = engine::CircuitMetric::kLoss;
  } else if (metric == "p_target") {
    d.metric = engine::CircuitMetric::kPTarget;
  } else {
    return absl::InvalidArgumentError("metric must be accuracy, loss or p_target, got '" + request.metric() + "'");
  }
  const double max_tol = d.metric == engine::CircuitMetric::kLoss ? 10.0 : 1.0;
  if (!(request.tolerance() >= 0 && request.tolerance() <= max_tol)) {
    return absl::InvalidArgumentError("tolerance must be in [0, " + std::to_string(static_cast<int>(max_tol)) +
                                      "] for metric " + metric + " (0 = default), got " +
                                      std::to_string(request.tolerance()));
  }
  const std::string order = request.order().empty() ? "magnitude_asc" : request.order();
  if (order == "magnitude_asc") {
    d.order = engine::DetectRequest::Order::kMagnitudeAsc;
  } else if (order == "effect_asc") {
    d.order = engine::DetectRequest::Order::kEffectAsc;
  } else if (order == "label") {
    d.order = engine::DetectRequest::Order::kLabel;
  } else {
    return absl::InvalidArgumentError("order must be magnitude_asc, effect_asc or label, got '" + request.order() + "'");
  }
  if (!(request.prepass_eps() >= 0 && request.prepass_eps() < 1)) {
    return absl::InvalidArgumentError("prepass_eps must be in [0, 1) (0 = default), got " +
                                      std::to_string(request.prepass_eps()));
  }
  if (request.max_passes() > 20) {
    return absl::InvalidArgumentError("max_passes must be in [1, 20] (0 = default), got " +
                                      std::to_string(request.max_passes()));
  }
  if (request.max_evals() > 100000) {
    return absl::InvalidArgumentError("max_evals must be in [1, 100000] (0 = default), got " +
                                      std::to_string(request.max_evals()));
  }
  CL_ASSIGN_OR_RETURN(auto found, RunCheckpoint(id, request.step(), request.run_id()));
  CL_RETURN_IF_ERROR(NeedsImir(found.first, "DetectCircuit"));
  const v1::ExperimentSpec& spec = found.first;
  // The canonical request: every default resolved, force dropped.
  v1::DetectCircuitRequest canonical;
  canonical.set_run_id(FormatRunId(id));
  canonical.set_step(static_cast<uint64_t>(found.second.step));
  canonical.set_eval_set(request.eval_set());
  canonical.set_n_eval(request.n_eval() == 0 ? 2048 : request.n_eval());
  canonical.set_metric(metric);
  canonical.set_tolerance(request.tolerance() != 0 ? request.tolerance()
                                                   : d.metric == engine::CircuitMetric::kLoss ? 0.02 : 0.01);
  canonical.set_order(order);
  canonical.set_prepass_eps(request.prepass_eps() == 0 ? 1e-3 : request.prepass_eps());
  canonical.set_max_passes(request.max_passes() == 0 ? 3 : request.max_passes());
  canonical.set_selection(request.selection() == v1::BASIS_SELECTION_COMPLETE ? v1::BASIS_SELECTION_COMPLETE
                                                                              : v1::BASIS_SELECTION_PAPER);
  canonical.set_max_evals(request.max_evals() == 0 ? 5000 : request.max_evals());
  canonical.set_seed(request.seed() == 0 ? spec.seed() : request.seed());
  if (d.order == engine::DetectRequest::Order::kEffectAsc) {
    // effect_asc spends O(K^2) evaluations: D.1 allows it for K <= 200.
    const auto& m = spec.model().imir();
    const size_t k = m.parameterisation() == v1::PARAMETERISATION_COORDINATES
                         ? engine::CoordinateBasisOf(spec).coords.size()
                         : engine::BuildBasis(engine::DeclaredSymmetry(spec), m.num_layers(), m.num_heads(),
                                              ToSelection(canonical.selection()))
                               .coords.size();
    if (k > 200) {
      return absl::InvalidArgumentError("order effect_asc is for at most 200 coordinates; this basis has " +
                                        std::to_string(k) + " (use magnitude_asc)");
    }
  }
  d.eval_set = canonical.eval_set();
  d.n_eval = canonical.n_eval();
  d.tolerance = canonical.tolerance();
  d.prepass_eps = canonical.prepass_eps();
  d.max_passes = static_cast<int>(canonical.max_passes());
  d.selection = ToSelection(canonical.selection());
  d.max_evals = canonical.max_evals();
  d.seed = canonical.seed();
  AnalysisWork work = [this, spec, bytes = std::move(found.second.bytes), d, canonical](
                  const std::function<void(double)>& progress, const CancelToken* cancel) -> absl::StatusOr<std::string> {
    CL_ASSIGN_OR_RETURN(engine::DetectReport r, analyzer_->DetectCircuit(spec, bytes, d, progress, cancel));
    v1::DetectCircuitResponse done;
    done.set_state(v1::ANALYSIS_STATE_DONE);
    done.set_progress(1.0);
    done.set_step(canonical.step());
    done.set_metric(canonical.metric());
    done.set_eval_set(r.eval_set);
    done.set_m_dense(r.m_dense);
    done.set_m_ref(r.m_ref);
    done.set_m_circuit(r.m_circuit);
    done.set_projection_not_faithful(r.projection_not_faithful);
    for (const engine::CircuitMember& m : r.circuit) {
      v1::CircuitCoordinate* o = done.add_circuit();
      FillCoordinate(ToCoordinateRow(m.def), m.value, o->mutable_coordinate());
      o->set_role(m.role);
      o->set_necessity(m.necessity);
      o->mutable_irrelevant_mass_delta()->Add(m.irrelevant_mass_delta.begin(), m.irrelevant_mass_delta.end());
    }
    done.set_candidates(static_cast<uint32_t>(r.candidates));
    done.set_evaluations(static_cast<uint32_t>(r.evaluations));
    done.set_budget_exhausted(r.budget_exhausted);
    done.set_template_name(r.template_name);
    for (int l : r.template_layers) done.add_template_layers(static_cast<uint32_t>(l));
    for (const auto& e : r.template_elements) {
      v1::TemplateElement* o = done.add_template_elements();
      o->set_label(e.label);
      o->set_canonical(e.canonical);
      o->set_found(e.found);
    }
    done.mutable_irrelevant_mass()->Add(r.irrelevant_mass.begin(), r.irrelevant_mass.end());
    return done.SerializeAsString();
  };
  CL_ASSIGN_OR_RETURN(AnalysisAnswer a, Enqueue("detect_circuit", id, canonical.SerializeAsString(), request.force(),
                                                 client, JobMemory(spec, 0), std::move(work)));
  return ResponseFromAnswer<v1::DetectCircuitResponse>(a);
}

}  // namespace circuitlab::scheduler
