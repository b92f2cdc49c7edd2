// LabelRun: ICL vs IWL (D.2) and the winning layer pair (D.3) at every stored
// checkpoint of a run, as an analysis job.
#include "server/scheduler/analysis_core.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"
#include "server/scheduler/analyses/analysis_util.h"
#include "server/scheduler/scheduler.h"

namespace circuitlab::scheduler {

absl::StatusOr<v1::LabelRunResponse> AnalysisCore::LabelRun(const v1::LabelRunRequest& request,
                                                            const Requester& owner) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseRunId(request.run_id()));
  CL_RETURN_IF_ERROR(CheckEvalSize(request.n_eval(), kMinEval, "n_eval"));
  CL_ASSIGN_OR_RETURN(store::RunRow row, store_->GetRun(id));
  v1::ExperimentSpec spec;
  if (!spec.ParseFromString(row.spec)) return absl::DataLossError("stored spec of " + request.run_id() + " does not parse");
  CL_RETURN_IF_ERROR(NeedsImir(spec, "LabelRun"));
  CL_ASSIGN_OR_RETURN(std::vector<int64_t> steps, store_->CheckpointSteps(id));
  if (steps.empty()) return absl::FailedPreconditionError("run " + request.run_id() + " has no checkpoint yet");
  // The canonical request names the checkpoints it labels, so a run that
  // gains checkpoints is labelled afresh.
  v1::LabelRunRequest canonical;
  canonical.set_run_id(FormatRunId(id));
  canonical.set_n_eval(request.n_eval() == 0 ? 1024 : request.n_eval());
  // The labelling rule's version: labels stored by an earlier rule are
  // recomputed, not served.
  std::string key = canonical.SerializeAsString() + "/pair-paths-2";
  for (int64_t s : steps) absl::StrAppend(&key, "/", s);
  AnalysisWork work = [this, spec, id, steps, canonical](const std::function<void(double)>& progress,
                                                         const CancelToken* cancel) -> absl::StatusOr<std::string> {
    std::vector<std::pair<int64_t, std::string>> checkpoints;
    for (int64_t s : steps) {
      CL_ASSIGN_OR_RETURN(std::optional<store::Checkpoint> c, store_->CheckpointAt(id, s));
      if (c) checkpoints.emplace_back(s, std::move(c->bytes));
    }
    CL_ASSIGN_OR_RETURN(v1::LabelRunResponse done, analyzer_->LabelRun(spec, checkpoints, canonical, progress, cancel));
    done.set_state(v1::ANALYSIS_STATE_DONE);
    done.set_progress(1.0);
    return done.SerializeAsString();
  };
  CL_ASSIGN_OR_RETURN(AnalysisAnswer a,
                      Enqueue("label_run", id, key, request.force(), owner, JobMemory(spec, 0), std::move(work)));
  return ResponseFromAnswer<v1::LabelRunResponse>(a);
}

}  // namespace circuitlab::scheduler
