#include "server/scheduler/analysis_core.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <string>

#include "server/common/seeds.h"
#include "server/common/status_macros.h"
#include "server/scheduler/scheduler.h"

namespace circuitlab::scheduler {
namespace {

constexpr uint32_t kDefaultPoints = 10000;
constexpr int kMaxNames = 4096;
constexpr int kMaxLadder = 12;
constexpr uint64_t kMinSamples = 16, kMaxSamples = 1 << 22;
const std::vector<uint64_t> kDefaultLadder = {256, 1024, 4096, 16384, 65536, 262144};

// SCIENCE.md G.5: in span when every matrix's plateau <= 1e-3 and slope in
// [-1.2, -0.8]; a control fails as it must when some plateau >= 0.01.
bool Passed(const engine::InvarianceCheckReport& c) {
  if (c.name != "in_span") return c.max_matrix_plateau() >= 0.01;
  for (size_t i = 1; i < c.series.size(); ++i) {
    const auto& s = c.series[i];
    if (!(s.plateau <= 1e-3) || !(s.slope >= -1.2 && s.slope <= -0.8)) return false;
  }
  return true;
}

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

AnalysisCore::AnalysisCore(store::Store* store, engine::Analyzer* analyzer, int max_jobs, engine::EngineLimits limits)
    : store_(store), analyzer_(analyzer), max_jobs_(max_jobs), limits_(limits) {
  worker_ = std::thread([this] { WorkerLoop(); });
}

AnalysisCore::~AnalysisCore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (auto& [key, job] : jobs_) job->cancel.Request(StopReason::kCancel);
  }
  cv_.notify_all();
  worker_.join();
}

absl::StatusOr<v1::CheckInvarianceResponse> AnalysisCore::CheckInvariance(const v1::CheckInvarianceRequest& request) {
  int64_t id = store::Store::kNoRun;
  if (request.has_spec()) {
    if (!request.run_id().empty()) return absl::InvalidArgumentError("give run_id or spec, not both");
  } else {
    CL_ASSIGN_OR_RETURN(id, ParseRunId(request.run_id()));
  }
  CL_RETURN_IF_ERROR(CheckSelection(request.selection()));
  if (request.sample_sizes_size() > kMaxLadder) {
    return absl::InvalidArgumentError("sample_sizes must have at most " + std::to_string(kMaxLadder) +
                                      " entries, got " + std::to_string(request.sample_sizes_size()));
  }
  for (int i = 0; i < request.sample_sizes_size(); ++i) {
    const uint64_t n = request.sample_sizes(i);
    if (n < kMinSamples || n > kMaxSamples) {
      return absl::InvalidArgumentError("sample_sizes[" + std::to_string(i) + "] must be in [" +
                                        std::to_string(kMinSamples) + ", " + std::to_string(kMaxSamples) +
                                        "], got " + std::to_string(n));
    }
    if (i > 0 && n <= request.sample_sizes(i - 1)) {
      return absl::InvalidArgumentError("sample_sizes must be strictly increasing, got " + std::to_string(n) +
                                        " after " + std::to_string(request.sample_sizes(i - 1)));
    }
  }
  if (!(request.coordinate_std() >= 0 && request.coordinate_std() <= 100)) {
    return absl::InvalidArgumentError("coordinate_std must be in (0, 100] (0 means 1), got " +
                                      std::to_string(request.coordinate_std()));
  }
  v1::ExperimentSpec spec;
  v1::CheckInvarianceRequest canonical;  // defaults resolved, force dropped
  if (request.has_spec()) {
    spec = request.spec();
    if (absl::Status s = engine::ResolveSpec(limits_, &spec); !s.ok()) {
      return absl::Status(s.code(), "spec: " + std::string(s.message()));
    }
    *canonical.mutable_spec() = spec;
  } else {
    CL_ASSIGN_OR_RETURN(store::RunRow row, store_->GetRun(id));
    if (!spec.ParseFromString(row.spec)) {
      return absl::DataLossError("stored spec of " + request.run_id() + " does not parse");
    }
    canonical.set_run_id(FormatRunId(id));
  }
  canonical.set_selection(request.selection() == v1::BASIS_SELECTION_PAPER ? v1::BASIS_SELECTION_PAPER
                                                                           : v1::BASIS_SELECTION_COMPLETE);
  if (request.sample_sizes_size() == 0) {
    canonical.mutable_sample_sizes()->Add(kDefaultLadder.begin(), kDefaultLadder.end());
  } else {
    *canonical.mutable_sample_sizes() = request.sample_sizes();
  }
  canonical.set_coordinate_std(request.coordinate_std() == 0 ? 1.0 : request.coordinate_std());
  canonical.set_seed(request.seed() == 0 ? spec.seed() : request.seed());
  canonical.set_controls(request.controls());
  canonical.set_sgd_corollary(request.sgd_corollary());
  const std::string key = canonical.SerializeAsString();
  const int64_t hash = static_cast<int64_t>(HashPurpose(key) >> 1);

  if (!request.force()) {
    CL_ASSIGN_OR_RETURN(std::optional<std::string> stored, store_->GetAnalysis(id, "invariance", hash));
    v1::CheckInvarianceResponse resp;
    if (stored && resp.ParseFromString(*stored)) {
      resp.set_from_store(true);
      return resp;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find({id, hash});
  if (it != jobs_.end()) {
    const bool retry = it->second->status.state() == v1::CheckInvarianceResponse::STATE_FAILED && request.force();
    if (!retry) return it->second->status;
    jobs_.erase(it);
  }
  if (static_cast<int>(jobs_.size()) >= max_jobs_) {
    return absl::ResourceExhaustedError("too many analysis jobs queued (" + std::to_string(jobs_.size()) +
                                        "); ask again later");
  }
  auto job = std::make_shared<Job>();
  job->run_id = id;
  job->hash = hash;
  job->key = key;
  job->spec = std::move(spec);
  job->request.selection = ToSelection(canonical.selection());
  job->request.sample_sizes.assign(canonical.sample_sizes().begin(), canonical.sample_sizes().end());
  job->request.coordinate_std = canonical.coordinate_std();
  job->request.seed = canonical.seed();
  job->request.controls = canonical.controls();
  job->request.sgd_corollary = canonical.sgd_corollary();
  job->status.set_state(v1::CheckInvarianceResponse::STATE_QUEUED);
  jobs_[{id, hash}] = job;
  queue_.push_back(job);
  cv_.notify_all();
  return job->status;
}

void AnalysisCore::WorkerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    std::shared_ptr<Job> job = queue_.front();
    queue_.pop_front();
    job->status.set_state(v1::CheckInvarianceResponse::STATE_RUNNING);
    lock.unlock();
    RunJob(*job);
    lock.lock();
  }
}

void AnalysisCore::RunJob(Job& job) {
  auto progress = [&](double fraction) {
    std::lock_guard<std::mutex> lock(mu_);
    job.status.set_progress(fraction);
  };
  absl::StatusOr<engine::InvarianceReport> report =
      analyzer_->CheckInvariance(job.spec, job.request, progress, &job.cancel);
  v1::CheckInvarianceResponse done;
  if (report.ok()) {
    done.set_state(v1::CheckInvarianceResponse::STATE_DONE);
    done.set_progress(1.0);
    done.mutable_sample_sizes()->Add(report->sample_sizes.begin(), report->sample_sizes.end());
    for (const engine::InvarianceCheckReport& c : report->checks) {
      v1::InvarianceCheck* out = done.add_checks();
      out->set_name(c.name);
      out->set_max_matrix_plateau(c.max_matrix_plateau());
      out->set_passed(Passed(c));
      for (const engine::InvarianceSeriesReport& s : c.series) {
        v1::InvarianceSeries* o = out->add_series();
        o->set_matrix(s.matrix);
        o->mutable_off_fraction()->Add(s.off_fraction.begin(), s.off_fraction.end());
        o->set_plateau(s.plateau);
        o->set_slope(s.slope);
      }
    }
    for (const engine::SgdCorollaryReport& p : report->sgd) {
      v1::SgdCorollaryPoint* o = done.add_sgd();
      o->set_batch_size(static_cast<uint64_t>(p.batch_size));
      o->set_rho(p.rho);
      o->set_rho_symmetrised(p.rho_symmetrised);
    }
    if (!report->sgd.empty()) {
      done.set_sgd_steps(static_cast<uint64_t>(report->sgd_steps));
      done.set_sgd_group_elements(static_cast<uint64_t>(report->sgd_group_elements));
      done.set_sgd_learning_rate(report->sgd_learning_rate);
    }
    // Stored first, then forgotten: later requests find it in the store.
    absl::Status stored = store_->PutAnalysis(job.run_id, "invariance", job.hash, job.key, done.SerializeAsString());
    if (!stored.ok()) {
      done.Clear();
      done.set_state(v1::CheckInvarianceResponse::STATE_FAILED);
      done.set_error("cannot store the result: " + stored.ToString());
    }
  } else {
    done.set_state(v1::CheckInvarianceResponse::STATE_FAILED);
    done.set_error(report.status().ToString());
    spdlog::warn("invariance check of {} failed: {}", job.run_id == store::Store::kNoRun ? "a spec" : FormatRunId(job.run_id),
                 report.status().ToString());
  }
  std::lock_guard<std::mutex> lock(mu_);
  job.status = done;
  if (done.state() == v1::CheckInvarianceResponse::STATE_DONE) jobs_.erase({job.run_id, job.hash});
}

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
    FillCoordinate(ToCoordinateRow(d), p.values[d.index], resp.add_coordinates());
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
