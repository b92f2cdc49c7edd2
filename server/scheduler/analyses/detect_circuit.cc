// DetectCircuit: automatic circuit detection (SCIENCE.md D.1) on a stored
// checkpoint; validation, canonical request, the job.
#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/scheduler/analyses/analysis_util.h"
#include "server/scheduler/analysis_core.h"
#include "server/scheduler/analysis_table.h"
#include "server/scheduler/scheduler.h"

namespace circuitlab::scheduler {

namespace {

absl::StatusOr<AnalysisPlan<v1::DetectCircuitResponse>> PlanDetectCircuit(AnalysisCore& core, const v1::DetectCircuitRequest& request) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseRunId(request.run_id()));
  CL_RETURN_IF_ERROR(CheckSelection(request.selection()));
  CL_RETURN_IF_ERROR(CheckEvalSize(request.n_eval(), kMinEval, "n_eval"));
  const std::string metric = request.metric().empty() ? "accuracy" : request.metric();
  if (metric != "accuracy" && metric != "loss" && metric != "p_target") {
    return absl::InvalidArgumentError("metric must be accuracy, loss or p_target, got " + Quote(request.metric()));
  }
  const double max_tol = metric == "loss" ? 10.0 : 1.0;
  if (!(request.tolerance() >= 0 && request.tolerance() <= max_tol)) {
    return absl::InvalidArgumentError("tolerance must be in [0, " + std::to_string(static_cast<int>(max_tol)) +
                                      "] for metric " + metric + " (0 = default), got " +
                                      std::to_string(request.tolerance()));
  }
  const std::string order = request.order().empty() ? "magnitude_asc" : request.order();
  if (order != "magnitude_asc" && order != "effect_asc" && order != "label") {
    return absl::InvalidArgumentError("order must be magnitude_asc, effect_asc or label, got " +
                                      Quote(request.order()));
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
  CL_ASSIGN_OR_RETURN(auto found, core.RunCheckpoint(id, request.step(), request.run_id()));
  CL_RETURN_IF_ERROR(NeedsCoordinates(found.first, "DetectCircuit"));
  const v1::ExperimentSpec& spec = found.first;
  if (!request.eval_set().empty()) CL_RETURN_IF_ERROR(CheckEvalSet(core.analyzer(), spec, request.eval_set(), "eval_set"));
  // The canonical request: every default resolved, force dropped.
  v1::DetectCircuitRequest canonical;
  canonical.set_run_id(FormatRunId(id));
  canonical.set_step(static_cast<uint64_t>(found.second.step));
  canonical.set_eval_set(request.eval_set());
  canonical.set_n_eval(request.n_eval() == 0 ? 2048 : request.n_eval());
  canonical.set_metric(metric);
  canonical.set_tolerance(request.tolerance() != 0 ? request.tolerance() : metric == "loss" ? 0.02 : 0.01);
  canonical.set_order(order);
  canonical.set_prepass_eps(request.prepass_eps() == 0 ? 1e-3 : request.prepass_eps());
  canonical.set_max_passes(request.max_passes() == 0 ? 3 : request.max_passes());
  canonical.set_selection(request.selection() == v1::BASIS_SELECTION_COMPLETE ? v1::BASIS_SELECTION_COMPLETE
                                                                              : v1::BASIS_SELECTION_PAPER);
  canonical.set_max_evals(request.max_evals() == 0 ? 5000 : request.max_evals());
  canonical.set_seed(request.seed() == 0 ? spec.seed() : request.seed());
  if (order == "effect_asc") {
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
  engine::AnalysisInput input{spec, {{found.second.step, std::move(found.second.bytes)}}, {}};
  return EnginePlan<v1::DetectCircuitResponse>(core.analyzer(), id, canonical, std::move(input), JobMemory(spec, 0),
                                               [canonical](v1::DetectCircuitResponse& done) {
                                                 done.set_step(canonical.step());
                                                 done.set_metric(canonical.metric());
                                               });
}

}  // namespace

CIRCUITLAB_JOB_ANALYSIS("detect_circuit", v1::DetectCircuitRequest, v1::DetectCircuitResponse, PlanDetectCircuit);

}  // namespace circuitlab::scheduler
