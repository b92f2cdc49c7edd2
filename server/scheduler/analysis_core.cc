#include "server/scheduler/analysis_core.h"

#include <string>

#include "server/common/seeds.h"
#include "server/common/status_macros.h"
#include "server/scheduler/scheduler.h"

namespace circuitlab::scheduler {
namespace {

constexpr uint32_t kDefaultPoints = 10000;
constexpr int kMaxNames = 4096;

engine::Selection ToSelection(v1::BasisSelection s) {
  return s == v1::BASIS_SELECTION_COMPLETE ? engine::Selection::kComplete : engine::Selection::kPaper;
}

absl::Status CheckSelection(v1::BasisSelection s) {
  if (!v1::BasisSelection_IsValid(s)) {
    return absl::InvalidArgumentError("selection is not a known value: " + std::to_string(s));
  }
  return absl::OkStatus();
}

void FillCoordinate(const store::CoordinateDefRow& d, double value, v1::Coordinate* c) {
  c->set_label(d.label);
  c->set_canonical(d.canonical);
  c->set_matrix(d.matrix);
  c->set_layer(static_cast<uint32_t>(d.layer));
  c->set_head(static_cast<uint32_t>(d.head));
  c->set_block_q(d.block_q);
  c->set_block_k(d.block_k);
  c->set_element(d.element);
  c->set_value(value);
  c->set_magnitude(value * d.norm);
  c->set_gauge(d.gauge);
}

}  // namespace

absl::StatusOr<v1::ProjectCheckpointResponse> AnalysisCore::ProjectCheckpoint(
    const v1::ProjectCheckpointRequest& request) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseRunId(request.run_id()));
  CL_RETURN_IF_ERROR(CheckSelection(request.selection()));
  CL_ASSIGN_OR_RETURN(store::RunRow row, store_->GetRun(id));
  CL_ASSIGN_OR_RETURN(std::optional<store::Checkpoint> ckpt,
                      store_->CheckpointAt(id, request.step() == 0 ? -1 : static_cast<int64_t>(request.step())));
  if (!ckpt) {
    CL_ASSIGN_OR_RETURN(std::vector<int64_t> steps, store_->CheckpointSteps(id));
    std::string have;
    for (int64_t s : steps) have += (have.empty() ? "" : ", ") + std::to_string(s);
    return absl::NotFoundError("run " + request.run_id() + " has no checkpoint" +
                               (request.step() == 0 ? std::string() : " at step " + std::to_string(request.step())) +
                               (have.empty() ? " yet" : " (checkpoints at steps: " + have + ")"));
  }
  // The canonical request: run, the resolved step, the resolved selection.
  v1::ProjectCheckpointRequest canonical;
  canonical.set_run_id(FormatRunId(id));
  canonical.set_step(static_cast<uint64_t>(ckpt->step));
  canonical.set_selection(request.selection() == v1::BASIS_SELECTION_COMPLETE ? v1::BASIS_SELECTION_COMPLETE
                                                                              : v1::BASIS_SELECTION_PAPER);
  const std::string key = canonical.SerializeAsString();
  const int64_t hash = static_cast<int64_t>(HashPurpose(key) >> 1);
  if (!request.force()) {
    CL_ASSIGN_OR_RETURN(std::optional<std::string> stored, store_->GetAnalysis(id, "project", hash));
    v1::ProjectCheckpointResponse resp;
    if (stored && resp.ParseFromString(*stored)) {
      resp.set_from_store(true);
      return resp;
    }
  }
  v1::ExperimentSpec spec;
  if (!spec.ParseFromString(row.spec)) return absl::DataLossError("stored spec of " + request.run_id() + " does not parse");
  CL_ASSIGN_OR_RETURN(engine::CheckpointProjection p,
                      analyzer_->ProjectCheckpoint(spec, ckpt->bytes, ToSelection(canonical.selection())));
  v1::ProjectCheckpointResponse resp;
  resp.set_run_id(canonical.run_id());
  resp.set_step(canonical.step());
  resp.set_selection(canonical.selection());
  for (const engine::CoordinateDef& d : p.basis.coords) {
    store::CoordinateDefRow row_def{0, d.index, d.label, d.canonical, d.matrix, d.layer, d.head, d.block_q,
                                    d.block_k, d.element, d.norm, d.gauge};
    FillCoordinate(row_def, p.values[d.index], resp.add_coordinates());
  }
  resp.set_rho(p.rho);
  for (const auto& [matrix, rho] : p.rho_by_matrix) (*resp.mutable_rho_by_matrix())[matrix] = rho;
  resp.set_rho_complete(p.rho_complete);
  CL_RETURN_IF_ERROR(store_->PutAnalysis(id, "project", hash, key, resp.SerializeAsString()));
  return resp;
}

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
