// ProjectCheckpoint: the IMIR coordinates and off-manifold residual of a
// stored checkpoint, as an analysis job.
#include "server/scheduler/analysis_core.h"

#include "server/common/status_macros.h"
#include "server/scheduler/analyses/analysis_util.h"
#include "server/scheduler/scheduler.h"

namespace circuitlab::scheduler {

absl::StatusOr<v1::ProjectCheckpointResponse> AnalysisCore::ProjectCheckpoint(
    const v1::ProjectCheckpointRequest& request, const Requester& owner) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseRunId(request.run_id()));
  CL_RETURN_IF_ERROR(CheckSelection(request.selection()));
  CL_ASSIGN_OR_RETURN(auto found, RunCheckpoint(id, request.step(), request.run_id()));
  CL_RETURN_IF_ERROR(NeedsImir(found.first, "ProjectCheckpoint"));
  const v1::ExperimentSpec& spec = found.first;
  // The canonical request: run, the resolved step, the resolved selection.
  v1::ProjectCheckpointRequest canonical;
  canonical.set_run_id(FormatRunId(id));
  canonical.set_step(static_cast<uint64_t>(found.second.step));
  canonical.set_selection(request.selection() == v1::BASIS_SELECTION_COMPLETE ? v1::BASIS_SELECTION_COMPLETE
                                                                              : v1::BASIS_SELECTION_PAPER);
  const uint64_t memory = JobMemory(spec, 0);
  AnalysisWork work = [this, spec = std::move(found.first), bytes = std::move(found.second.bytes), canonical](
                          const std::function<void(double)>&, const CancelToken*) -> absl::StatusOr<std::string> {
    CL_ASSIGN_OR_RETURN(v1::ProjectCheckpointResponse resp, analyzer_->ProjectCheckpoint(spec, bytes, canonical));
    resp.set_state(v1::ANALYSIS_STATE_DONE);
    resp.set_progress(1.0);
    resp.set_run_id(canonical.run_id());
    resp.set_step(canonical.step());
    return resp.SerializeAsString();
  };
  CL_ASSIGN_OR_RETURN(AnalysisAnswer a, Enqueue("project", id, canonical.SerializeAsString(), request.force(), owner,
                                                memory, std::move(work)));
  return ResponseFromAnswer<v1::ProjectCheckpointResponse>(a);
}

}  // namespace circuitlab::scheduler
