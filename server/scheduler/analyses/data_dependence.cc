// CheckDataDependence: Theorems 2 and 3 numerically (SCIENCE.md D.4, E.6,
// E.7) over a grid of data statistics; validation, defaults, the job.
#include "server/scheduler/analysis_core.h"
#include "server/scheduler/analysis_table.h"

#include <cmath>

#include "server/common/status_macros.h"
#include "server/engine/tasks/catalog.h"
#include "server/scheduler/analyses/analysis_util.h"
#include "server/scheduler/scheduler.h"

namespace circuitlab::scheduler {

namespace {

absl::StatusOr<AnalysisPlan<v1::CheckDataDependenceResponse>> PlanCheckDataDependence(AnalysisCore& core, const v1::CheckDataDependenceRequest& request) {
  CL_ASSIGN_OR_RETURN(auto target, core.TargetSpec(request.run_id(), request.has_spec() ? &request.spec() : nullptr));
  const int64_t id = target.first;
  const v1::ExperimentSpec& spec = target.second;
  const bool recall = spec.task().has_associative_recall() || spec.task().kind_case() == v1::TaskSpec::KIND_NOT_SET;
  if (!recall || spec.task().associative_recall().num_common() == 0) {
    return absl::FailedPreconditionError("the data-dependence check needs an associative-recall task with common "
                                         "pairs (task.associative_recall.num_common > 0)");
  }
  if (request.points_size() > 64) {
    return absl::InvalidArgumentError("points must have at most 64 entries, got " +
                                      std::to_string(request.points_size()));
  }
  if (request.samples() != 0 && (request.samples() < 256 || request.samples() > (1u << 20))) {
    return absl::InvalidArgumentError("samples must be in [256, 1048576] (0 = 65536), got " +
                                      std::to_string(request.samples()));
  }
  v1::CheckDataDependenceRequest canonical;
  if (id == store::Store::kNoRun) {
    *canonical.mutable_spec() = spec;
  } else {
    canonical.set_run_id(FormatRunId(id));
  }
  canonical.set_samples(request.samples() == 0 ? 65536 : request.samples());
  canonical.set_seed(request.seed() == 0 ? spec.seed() : request.seed());
  if (request.points_size() == 0) {
    // E.6's grid at delta* in both modes, then E.7's burstiness at f_r = 1.
    for (auto mode : {v1::VARIABILITY_MODE_VARIANT, v1::VARIABILITY_MODE_REPAIR}) {
      for (double fr : {0.5, 0.25}) {
        for (double fv : {0.0, 0.5}) {
          v1::DataPoint* p = canonical.add_points();
          p->set_rare_fraction(fr);
          p->set_variability(fv);
          p->set_variability_mode(mode);
          p->set_burstiness(1);
          p->set_delta_saturated(true);
        }
      }
    }
    for (uint32_t b : {1u, 2u, 4u, 8u}) {
      if (b > spec.task().associative_recall().num_blocks()) break;
      v1::DataPoint* p = canonical.add_points();
      p->set_rare_fraction(1.0);
      p->set_variability_mode(v1::VARIABILITY_MODE_VARIANT);
      p->set_burstiness(b);
    }
  } else {
    *canonical.mutable_points() = request.points();
  }
  const uint32_t blocks = spec.task().associative_recall().num_blocks();
  for (int i = 0; i < canonical.points_size(); ++i) {
    v1::DataPoint* p = canonical.mutable_points(i);
    const std::string field = "points[" + std::to_string(i) + "]";
    if (p->burstiness() == 0) p->set_burstiness(1);
    if (p->variability_mode() == v1::VARIABILITY_MODE_UNSPECIFIED) p->set_variability_mode(v1::VARIABILITY_MODE_VARIANT);
    if (!v1::VariabilityMode_IsValid(p->variability_mode())) {
      return absl::InvalidArgumentError(field + ".variability_mode is not a known value");
    }
    if (!(p->rare_fraction() >= 0 && p->rare_fraction() <= 1)) {
      return absl::InvalidArgumentError(field + ".rare_fraction must be in [0, 1], got " +
                                        std::to_string(p->rare_fraction()));
    }
    if (!(p->variability() >= 0 && p->variability() <= 1)) {
      return absl::InvalidArgumentError(field + ".variability must be in [0, 1], got " +
                                        std::to_string(p->variability()));
    }
    if (p->burstiness() > blocks) {
      return absl::InvalidArgumentError(field + ".burstiness must be in [1, " + std::to_string(blocks) +
                                        "] (task.associative_recall.num_blocks), got " +
                                        std::to_string(p->burstiness()));
    }
    if (!(p->abg() >= 0 && p->abg() <= 10)) {
      return absl::InvalidArgumentError(field + ".abg must be in [0, 10], got " + std::to_string(p->abg()));
    }
    if (!(std::abs(p->delta()) <= 100)) {
      return absl::InvalidArgumentError(field + ".delta must be in [-100, 100], got " + std::to_string(p->delta()));
    }
  }
  return EnginePlan<v1::CheckDataDependenceResponse>(core.analyzer(), id, canonical, {spec, {}, {}},
                                                     JobMemory(spec, 0));
}

}  // namespace

CIRCUITLAB_JOB_ANALYSIS("data_dependence", v1::CheckDataDependenceRequest, v1::CheckDataDependenceResponse, PlanCheckDataDependence);

}  // namespace circuitlab::scheduler
