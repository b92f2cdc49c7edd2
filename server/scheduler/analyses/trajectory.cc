// GetTrajectory: coordinates over training, as recorded (a store read, no job).
#include "server/scheduler/analysis_core.h"

#include "server/common/status_macros.h"
#include "server/scheduler/analyses/analysis_util.h"
#include "server/scheduler/scheduler.h"

namespace circuitlab::scheduler {
namespace {

constexpr uint32_t kDefaultPoints = 10000;
constexpr int kMaxNames = 4096;

}  // namespace

absl::StatusOr<v1::GetTrajectoryResponse> AnalysisCore::GetTrajectory(const v1::GetTrajectoryRequest& request) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseRunId(request.run_id()));
  CL_RETURN_IF_ERROR(CheckSelection(request.selection()));
  if (request.names_size() > kMaxNames) {
    return absl::InvalidArgumentError("names must have at most " + std::to_string(kMaxNames) + " entries, got " +
                                      std::to_string(request.names_size()));
  }
  CL_RETURN_IF_ERROR(ValidateSeriesRange(request.min_step(), request.max_step(), request.max_points()));
  CL_RETURN_IF_ERROR(store_->GetRun(id).status());
  store::TrajectoryQuery q;
  q.selection = engine::SelectionName(ToSelection(request.selection()));
  q.names.assign(request.names().begin(), request.names().end());
  q.min_step = static_cast<int64_t>(request.min_step());
  q.max_step = static_cast<int64_t>(request.max_step());
  q.max_points = static_cast<int>(request.max_points() == 0 ? kDefaultPoints : request.max_points());
  CL_ASSIGN_OR_RETURN(std::vector<store::CoordinateSeries> series, store_->GetTrajectory(id, q));
  v1::GetTrajectoryResponse out;
  for (const store::CoordinateSeries& s : series) {
    v1::CoordinateSeries* o = out.add_series();
    FillCoordinate(s.def, s.values.empty() ? 0.0 : s.values.back(), o->mutable_coordinate());
    o->mutable_steps()->Add(s.steps.begin(), s.steps.end());
    o->mutable_values()->Add(s.values.begin(), s.values.end());
    o->set_total_points(static_cast<uint64_t>(s.total_points));
  }
  return out;
}

}  // namespace circuitlab::scheduler
