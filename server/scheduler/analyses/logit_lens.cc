// GetLogitLens: each layer's residual stream read out through the model's
// own unembedding at a stored checkpoint; validation, canonical request, the
// job. Which sets the task has is checked here for IMIR tasks and by the
// engine for a decoder's (engine/analysis/logit_lens.cc).
#include <string>
#include <utility>

#include "server/common/status_macros.h"
#include "server/scheduler/analyses/analysis_util.h"
#include "server/scheduler/analysis_core.h"
#include "server/scheduler/analysis_table.h"
#include "server/scheduler/scheduler.h"

namespace circuitlab::scheduler {
namespace {

constexpr uint32_t kMaxSequences = 4096, kDefaultSequences = 256;

absl::StatusOr<AnalysisPlan<v1::GetLogitLensResponse>> PlanLogitLens(AnalysisCore& core,
                                                                     const v1::GetLogitLensRequest& request) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseRunId(request.run_id()));
  if (request.sequences() > kMaxSequences) {
    return absl::InvalidArgumentError("sequences must be in [1, " + std::to_string(kMaxSequences) + "] (0 = " +
                                      std::to_string(kDefaultSequences) + "), got " +
                                      std::to_string(request.sequences()));
  }
  if (request.eval_set().size() > 64) return absl::InvalidArgumentError("eval_set must be at most 64 bytes");
  CL_ASSIGN_OR_RETURN(auto found, core.RunCheckpoint(id, request.step(), request.run_id()));
  const v1::ExperimentSpec& spec = found.first;
  if (!request.eval_set().empty()) CL_RETURN_IF_ERROR(CheckEvalSet(core.analyzer(), spec, request.eval_set(), "eval_set"));
  // The canonical request: every default resolved, force dropped.
  v1::GetLogitLensRequest canonical;
  canonical.set_run_id(FormatRunId(id));
  canonical.set_step(static_cast<uint64_t>(found.second.step));
  canonical.set_eval_set(request.eval_set());
  canonical.set_sequences(request.sequences() == 0 ? kDefaultSequences : request.sequences());
  canonical.set_seed(request.seed() == 0 ? spec.seed() : request.seed());
  engine::AnalysisInput input{spec, {{found.second.step, std::move(found.second.bytes)}}, {}};
  // The engine scores 64 sequences at a time: a training batch's
  // activations (in JobMemory) bound it.
  const auto echo = [canonical](v1::GetLogitLensResponse* answer) {
    answer->set_run_id(canonical.run_id());
    answer->set_step(canonical.step());
    answer->set_sequences(canonical.sequences());
  };
  auto plan = EnginePlan<v1::GetLogitLensResponse>(core.analyzer(), id, canonical, std::move(input),
                                                   JobMemory(spec, 0),
                                                   [echo](v1::GetLogitLensResponse& done) { echo(&done); });
  plan.on_answer = echo;  // a pending answer names the run and step too
  return plan;
}

}  // namespace

CIRCUITLAB_JOB_ANALYSIS("logit_lens", v1::GetLogitLensRequest, v1::GetLogitLensResponse, PlanLogitLens);

}  // namespace circuitlab::scheduler
