// GetAttentionPatterns: each head's attention probabilities on a few
// sequences of an evaluation set at a stored checkpoint; validation,
// canonical request, the job. Which heads exist and which sets the task has
// is the engine's to check (engine/analysis/attention.cc).
#include <set>
#include <string>
#include <utility>

#include "server/common/status_macros.h"
#include "server/scheduler/analyses/analysis_util.h"
#include "server/scheduler/analysis_core.h"
#include "server/scheduler/analysis_table.h"
#include "server/scheduler/scheduler.h"

namespace circuitlab::scheduler {
namespace {

constexpr uint32_t kMaxSequences = 16;
constexpr int kMaxIndices = 64;

absl::Status CheckIndices(const google::protobuf::RepeatedField<uint32_t>& v, const std::string& field) {
  if (v.size() > kMaxIndices) {
    return absl::InvalidArgumentError(field + " must have at most " + std::to_string(kMaxIndices) + " entries, got " +
                                      std::to_string(v.size()));
  }
  for (int i = 0; i < v.size(); ++i) {
    if (v[i] < 1 || v[i] > kMaxIndices) {
      return absl::InvalidArgumentError(field + "[" + std::to_string(i) + "] must be in [1, " +
                                        std::to_string(kMaxIndices) + "] (layers and heads count from 1), got " +
                                        std::to_string(v[i]));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<AnalysisPlan<v1::GetAttentionPatternsResponse>> PlanAttention(
    AnalysisCore& core, const v1::GetAttentionPatternsRequest& request) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseRunId(request.run_id()));
  if (request.sequences() > kMaxSequences) {
    return absl::InvalidArgumentError("sequences must be in [1, " + std::to_string(kMaxSequences) + "] (0 = 4), got " +
                                      std::to_string(request.sequences()));
  }
  CL_RETURN_IF_ERROR(CheckIndices(request.layers(), "layers"));
  CL_RETURN_IF_ERROR(CheckIndices(request.heads(), "heads"));
  if (request.eval_set().size() > 64) return absl::InvalidArgumentError("eval_set must be at most 64 bytes");
  CL_ASSIGN_OR_RETURN(auto found, core.RunCheckpoint(id, request.step(), request.run_id()));
  const v1::ExperimentSpec& spec = found.first;
  if (!request.eval_set().empty()) CL_RETURN_IF_ERROR(CheckEvalSet(core.analyzer(), spec, request.eval_set(), "eval_set"));
  // The canonical request: every default resolved, the indices sorted and
  // unique, force dropped.
  v1::GetAttentionPatternsRequest canonical;
  canonical.set_run_id(FormatRunId(id));
  canonical.set_step(static_cast<uint64_t>(found.second.step));
  canonical.set_eval_set(request.eval_set());
  canonical.set_sequences(request.sequences() == 0 ? 4 : request.sequences());
  for (auto [in, out] : {std::pair{&request.layers(), canonical.mutable_layers()},
                         std::pair{&request.heads(), canonical.mutable_heads()}}) {
    std::set<uint32_t> unique(in->begin(), in->end());
    out->Add(unique.begin(), unique.end());
  }
  canonical.set_seed(request.seed() == 0 ? spec.seed() : request.seed());
  engine::AnalysisInput input{spec, {{found.second.step, std::move(found.second.bytes)}}, {}};
  // A training batch's activations (in JobMemory) hold more than 16
  // sequences' patterns.
  auto plan =
      EnginePlan<v1::GetAttentionPatternsResponse>(core.analyzer(), id, canonical, std::move(input), JobMemory(spec, 0),
                                                   [canonical](v1::GetAttentionPatternsResponse& done) {
                                                     done.set_run_id(canonical.run_id());
                                                     done.set_step(canonical.step());
                                                   });
  plan.version = kLayersFromOne;
  return plan;
}

}  // namespace

CIRCUITLAB_JOB_ANALYSIS("attention", v1::GetAttentionPatternsRequest, v1::GetAttentionPatternsResponse, PlanAttention);

}  // namespace circuitlab::scheduler
