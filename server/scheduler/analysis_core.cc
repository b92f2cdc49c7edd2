#include "server/scheduler/analysis_core.h"

#include "absl/strings/str_join.h"
#include "server/common/status_macros.h"
#include "server/engine/spec.h"
#include "server/scheduler/analysis_table.h"
#include "server/scheduler/scheduler.h"

namespace circuitlab::scheduler {

AnalysisCore::AnalysisCore(store::Store* store, engine::Analyzer* analyzer, AnalysisJobOptions jobs,
                           engine::EngineLimits limits)
    : store_(store), analyzer_(analyzer), limits_(limits), jobs_(store, jobs) {}

absl::StatusOr<std::pair<int64_t, v1::ExperimentSpec>> AnalysisCore::TargetSpec(const std::string& run_id,
                                                                                const v1::ExperimentSpec* spec) {
  if (spec != nullptr) {
    if (!run_id.empty()) return absl::InvalidArgumentError("give run_id or spec, not both");
    v1::ExperimentSpec resolved = *spec;
    if (absl::Status s = engine::ResolveSpec(limits_, &resolved); !s.ok()) {
      return absl::Status(s.code(), "spec: " + std::string(s.message()));
    }
    return std::make_pair(store::Store::kNoRun, std::move(resolved));
  }
  CL_ASSIGN_OR_RETURN(int64_t id, ParseRunId(run_id));
  CL_ASSIGN_OR_RETURN(store::RunRow row, store_->GetRun(id));
  v1::ExperimentSpec stored;
  if (!stored.ParseFromString(row.spec)) return absl::DataLossError("stored spec of " + run_id + " does not parse");
  return std::make_pair(id, std::move(stored));
}

absl::StatusOr<std::unique_ptr<google::protobuf::Message>> AnalysisCore::Run(const google::protobuf::Message& request,
                                                                              const Requester& owner) {
  const AnalysisEntry* entry = FindJobAnalysis(request.GetDescriptor());
  if (entry == nullptr) return absl::UnimplementedError(request.GetDescriptor()->name() + " is not an analysis");
  CL_ASSIGN_OR_RETURN(PlannedJob planned, entry->plan(*this, request));
  AnalysisJobRequest& job = planned.job;
  job.kind = entry->kind;
  job.owner = owner.name;
  job.read_only = owner.read_only;
  // Every analysis request has `bool force` (analysis_service.proto).
  const google::protobuf::FieldDescriptor* force = request.GetDescriptor()->FindFieldByName("force");
  const bool forced = force != nullptr && force->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_BOOL &&
                      request.GetReflection()->GetBool(request, force);
  CL_ASSIGN_OR_RETURN(AnalysisAnswer answer, jobs_.Submit(std::move(job), forced));
  std::unique_ptr<google::protobuf::Message> out(entry->response->New());
  CL_RETURN_IF_ERROR(FillFromAnswer(answer, out.get()));
  if (planned.on_answer && !answer.from_store) planned.on_answer(out.get());
  return out;
}

absl::StatusOr<std::pair<v1::ExperimentSpec, store::Checkpoint>> AnalysisCore::RunCheckpoint(
    int64_t id, uint64_t step, const std::string& run_id) {
  // Beyond int64 a step would wrap to "the newest".
  constexpr uint64_t kMaxStep = uint64_t{1} << 62;
  if (step > kMaxStep) {
    return absl::InvalidArgumentError("step must be in [0, 2^62] (0 = the newest checkpoint), got " +
                                      std::to_string(step));
  }
  CL_ASSIGN_OR_RETURN(store::RunRow row, store_->GetRun(id));
  v1::ExperimentSpec spec;
  if (!spec.ParseFromString(row.spec)) return absl::DataLossError("stored spec of " + run_id + " does not parse");
  CL_ASSIGN_OR_RETURN(std::optional<store::Checkpoint> ckpt,
                      store_->CheckpointAt(id, step == 0 ? -1 : static_cast<int64_t>(step)));
  if (!ckpt) {
    CL_ASSIGN_OR_RETURN(std::vector<int64_t> steps, store_->CheckpointSteps(id));
    const std::string have = absl::StrJoin(steps, ", ");
    return absl::NotFoundError("run " + run_id + " has no checkpoint" +
                               (step == 0 ? std::string() : " at step " + std::to_string(step)) +
                               (have.empty() ? " yet" : " (checkpoints at steps: " + have + ")"));
  }
  return std::make_pair(std::move(spec), std::move(*ckpt));
}

}  // namespace circuitlab::scheduler
