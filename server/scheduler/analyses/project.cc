// ProjectCheckpoint: the IMIR coordinates and off-manifold residual of a
// stored checkpoint, as an analysis job.
#include "server/scheduler/analysis_core.h"
#include "server/scheduler/analysis_table.h"

#include "server/common/status_macros.h"
#include "server/scheduler/analyses/analysis_util.h"
#include "server/scheduler/scheduler.h"

namespace circuitlab::scheduler {

namespace {

absl::StatusOr<AnalysisPlan<v1::ProjectCheckpointResponse>> PlanProjectCheckpoint(AnalysisCore& core, const v1::ProjectCheckpointRequest& request) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseRunId(request.run_id()));
  CL_RETURN_IF_ERROR(CheckSelection(request.selection()));
  CL_ASSIGN_OR_RETURN(auto found, core.RunCheckpoint(id, request.step(), request.run_id()));
  CL_RETURN_IF_ERROR(NeedsCoordinates(found.first, "ProjectCheckpoint"));
  // The canonical request: run, the resolved step, the resolved selection.
  v1::ProjectCheckpointRequest canonical;
  canonical.set_run_id(FormatRunId(id));
  canonical.set_step(static_cast<uint64_t>(found.second.step));
  canonical.set_selection(request.selection() == v1::BASIS_SELECTION_COMPLETE ? v1::BASIS_SELECTION_COMPLETE
                                                                              : v1::BASIS_SELECTION_PAPER);
  engine::AnalysisInput input{std::move(found.first), {{found.second.step, std::move(found.second.bytes)}}, {}};
  const uint64_t memory = JobMemory(input.spec, 0);
  return EnginePlan<v1::ProjectCheckpointResponse>(core.analyzer(), id, canonical, std::move(input), memory,
                                                   [canonical](v1::ProjectCheckpointResponse& done) {
                                                     done.set_run_id(canonical.run_id());
                                                     done.set_step(canonical.step());
                                                   });
}

}  // namespace

CIRCUITLAB_JOB_ANALYSIS("project", v1::ProjectCheckpointRequest, v1::ProjectCheckpointResponse, PlanProjectCheckpoint);

}  // namespace circuitlab::scheduler
