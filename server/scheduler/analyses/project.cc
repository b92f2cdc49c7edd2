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
  CL_RETURN_IF_ERROR(NeedsImir(found.first, "ProjectCheckpoint"));
  const v1::ExperimentSpec& spec = found.first;
  // The canonical request: run, the resolved step, the resolved selection.
  v1::ProjectCheckpointRequest canonical;
  canonical.set_run_id(FormatRunId(id));
  canonical.set_step(static_cast<uint64_t>(found.second.step));
  canonical.set_selection(request.selection() == v1::BASIS_SELECTION_COMPLETE ? v1::BASIS_SELECTION_COMPLETE
                                                                              : v1::BASIS_SELECTION_PAPER);
  AnalysisPlan<v1::ProjectCheckpointResponse> plan;
  plan.run_id = id;
  plan.key = canonical.SerializeAsString();
  plan.memory_bytes = JobMemory(spec, 0);
  engine::AnalysisInput input{std::move(found.first), {{found.second.step, std::move(found.second.bytes)}}, {}};
  plan.work = [analyzer = &core.analyzer(), input = std::move(input), canonical](
                  const std::function<void(double)>& progress,
                  const CancelToken* cancel) -> absl::StatusOr<v1::ProjectCheckpointResponse> {
    CL_ASSIGN_OR_RETURN(v1::ProjectCheckpointResponse done,
                        engine::Analyze<v1::ProjectCheckpointResponse>(*analyzer, input, canonical, progress, cancel));
    done.set_run_id(canonical.run_id());
    done.set_step(canonical.step());
    return done;
  };
  return plan;
}

}  // namespace

CIRCUITLAB_JOB_ANALYSIS("project", v1::ProjectCheckpointRequest, v1::ProjectCheckpointResponse, PlanProjectCheckpoint);

}  // namespace circuitlab::scheduler
