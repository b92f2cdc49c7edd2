// ExportWeights: a stored checkpoint's weights as a safetensors file with
// the model's configuration; validation, canonical request, the job. The
// conversion is the engine's (engine/analysis/export_weights.cc).
#include <string>
#include <utility>

#include "server/common/status_macros.h"
#include "server/scheduler/analyses/analysis_util.h"
#include "server/scheduler/analysis_core.h"
#include "server/scheduler/analysis_table.h"
#include "server/scheduler/scheduler.h"

namespace circuitlab::scheduler {
namespace {

absl::StatusOr<AnalysisPlan<v1::ExportWeightsResponse>> PlanExport(AnalysisCore& core,
                                                                   const v1::ExportWeightsRequest& request) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseRunId(request.run_id()));
  CL_ASSIGN_OR_RETURN(auto found, core.RunCheckpoint(id, request.step(), request.run_id()));
  const v1::ExperimentSpec& spec = found.first;
  v1::ExportWeightsRequest canonical;
  canonical.set_run_id(FormatRunId(id));
  canonical.set_step(static_cast<uint64_t>(found.second.step));
  engine::AnalysisInput input{spec, {{found.second.step, std::move(found.second.bytes)}}, {}};
  auto plan = EnginePlan<v1::ExportWeightsResponse>(core.analyzer(), id, canonical, std::move(input),
                                                    JobMemory(spec, 0), [canonical](v1::ExportWeightsResponse& done) {
                                                      done.set_run_id(canonical.run_id());
                                                      done.set_step(canonical.step());
                                                    });
  plan.version = kLayersFromOne;
  return plan;
}

}  // namespace

CIRCUITLAB_JOB_ANALYSIS("export_weights", v1::ExportWeightsRequest, v1::ExportWeightsResponse, PlanExport);

}  // namespace circuitlab::scheduler
