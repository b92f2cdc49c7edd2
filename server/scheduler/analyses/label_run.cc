// LabelRun: ICL vs IWL (D.2) and the winning layer pair (D.3) at every stored
// checkpoint of a run, as an analysis job.
#include "server/scheduler/analysis_core.h"
#include "server/scheduler/analysis_table.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"
#include "server/scheduler/analyses/analysis_util.h"
#include "server/scheduler/scheduler.h"

namespace circuitlab::scheduler {

namespace {

absl::StatusOr<AnalysisPlan<v1::LabelRunResponse>> PlanLabelRun(AnalysisCore& core, const v1::LabelRunRequest& request) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseRunId(request.run_id()));
  CL_RETURN_IF_ERROR(CheckEvalSize(request.n_eval(), kMinEval, "n_eval"));
  CL_ASSIGN_OR_RETURN(store::RunRow row, core.store().GetRun(id));
  v1::ExperimentSpec spec;
  if (!spec.ParseFromString(row.spec)) return absl::DataLossError("stored spec of " + request.run_id() + " does not parse");
  CL_RETURN_IF_ERROR(NeedsCoordinates(spec, "LabelRun"));
  CL_ASSIGN_OR_RETURN(std::vector<int64_t> steps, core.store().CheckpointSteps(id));
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
  AnalysisPlan<v1::LabelRunResponse> plan;
  plan.run_id = id;
  plan.key = std::move(key);
  plan.memory_bytes = JobMemory(spec, 0);
  plan.work = [store = &core.store(), analyzer = &core.analyzer(), spec, id, steps, canonical](
                  const std::function<void(double)>& progress,
                  const CancelToken* cancel) -> absl::StatusOr<v1::LabelRunResponse> {
    engine::AnalysisInput input{spec, {}, {}};
    for (int64_t s : steps) {
      CL_ASSIGN_OR_RETURN(std::optional<store::Checkpoint> c, store->CheckpointAt(id, s));
      if (c) input.checkpoints.emplace_back(s, std::move(c->bytes));
    }
    return engine::Analyze<v1::LabelRunResponse>(*analyzer, input, canonical, progress, cancel);
  };
  return plan;
}

}  // namespace

CIRCUITLAB_JOB_ANALYSIS("label_run", v1::LabelRunRequest, v1::LabelRunResponse, PlanLabelRun);

}  // namespace circuitlab::scheduler
