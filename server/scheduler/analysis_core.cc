#include "server/scheduler/analysis_core.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <string>

#include "server/common/seeds.h"
#include "server/common/status_macros.h"
#include "server/engine/spec.h"
#include "server/engine/tasks/catalog.h"
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

// The IMIR analyses (coordinates, circuits, invariance) need the IMIR block
// model; latent-task runs have AnalyzeTaskVectors.
absl::Status NeedsImir(const v1::ExperimentSpec& spec, const std::string& what) {
  if (spec.model().kind_case() != v1::ModelSpec::kDecoder) return absl::OkStatus();
  return absl::FailedPreconditionError(what + " needs an IMIR model (model.imir); this run trains model.decoder on "
                                       "task.latent: ask AnalyzeTaskVectors (circuitlab task-vectors)");
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

absl::StatusOr<v1::CheckInvarianceResponse> AnalysisCore::CheckInvariance(const v1::CheckInvarianceRequest& request) {
  if (request.has_spec() && !request.run_id().empty()) {
    return absl::InvalidArgumentError("give run_id or spec, not both");
  }
  if (!request.has_spec()) CL_RETURN_IF_ERROR(ParseRunId(request.run_id()).status());
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
  CL_ASSIGN_OR_RETURN(auto target, TargetSpec(request.run_id(), request.has_spec() ? &request.spec() : nullptr));
  const int64_t id = target.first;
  v1::ExperimentSpec spec = std::move(target.second);
  CL_RETURN_IF_ERROR(NeedsImir(spec, "CheckInvariance"));
  v1::CheckInvarianceRequest canonical;  // defaults resolved, force dropped
  if (id == store::Store::kNoRun) {
    *canonical.mutable_spec() = spec;
  } else {
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
  engine::InvarianceRequest ir;
  ir.selection = ToSelection(canonical.selection());
  ir.sample_sizes.assign(canonical.sample_sizes().begin(), canonical.sample_sizes().end());
  ir.coordinate_std = canonical.coordinate_std();
  ir.seed = canonical.seed();
  ir.controls = canonical.controls();
  ir.sgd_corollary = canonical.sgd_corollary();
  Work work = [this, spec = std::move(spec), ir](const std::function<void(double)>& progress,
                                                 const CancelToken* cancel) -> absl::StatusOr<std::string> {
    CL_ASSIGN_OR_RETURN(engine::InvarianceReport report, analyzer_->CheckInvariance(spec, ir, progress, cancel));
    v1::CheckInvarianceResponse done;
    done.set_state(v1::CheckInvarianceResponse::STATE_DONE);
    done.set_progress(1.0);
    done.mutable_sample_sizes()->Add(report.sample_sizes.begin(), report.sample_sizes.end());
    for (const engine::InvarianceCheckReport& c : report.checks) {
      v1::InvarianceCheck* out = done.add_checks();
      out->set_name(c.name);
      out->set_max_matrix_plateau(c.max_matrix_plateau());
      out->set_passed(Passed(c));
      for (const engine::InvarianceSeriesReport& sr : c.series) {
        v1::InvarianceSeries* o = out->add_series();
        o->set_matrix(sr.matrix);
        o->mutable_off_fraction()->Add(sr.off_fraction.begin(), sr.off_fraction.end());
        o->set_plateau(sr.plateau);
        o->set_slope(sr.slope);
      }
    }
    for (const engine::SgdCorollaryReport& p : report.sgd) {
      v1::SgdCorollaryPoint* o = done.add_sgd();
      o->set_batch_size(static_cast<uint64_t>(p.batch_size));
      o->set_rho(p.rho);
      o->set_rho_symmetrised(p.rho_symmetrised);
    }
    if (!report.sgd.empty()) {
      done.set_sgd_steps(static_cast<uint64_t>(report.sgd_steps));
      done.set_sgd_group_elements(static_cast<uint64_t>(report.sgd_group_elements));
      done.set_sgd_learning_rate(report.sgd_learning_rate);
    }
    return done.SerializeAsString();
  };
  CL_ASSIGN_OR_RETURN(Answer a, Enqueue("invariance", id, canonical.SerializeAsString(), request.force(), std::move(work)));
  return FromAnswer<v1::CheckInvarianceResponse>(a);
}

absl::StatusOr<AnalysisCore::Answer> AnalysisCore::Enqueue(const std::string& kind, int64_t run_id,
                                                           const std::string& key, bool force, Work work) {
  const int64_t hash = static_cast<int64_t>(HashPurpose(key) >> 1);
  Answer answer;
  if (!force) {
    CL_ASSIGN_OR_RETURN(answer.stored, store_->GetAnalysis(run_id, kind, hash));
    if (answer.stored) return answer;
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find({kind, run_id, hash});
  if (it != jobs_.end()) {
    const Job& job = *it->second;
    const bool retry = job.state == v1::ANALYSIS_STATE_FAILED && force;
    if (!retry) {
      answer.state = job.state;
      answer.progress = job.progress;
      answer.error = job.error;
      return answer;
    }
    jobs_.erase(it);
  }
  if (static_cast<int>(jobs_.size()) >= max_jobs_) {
    return absl::ResourceExhaustedError("too many analysis jobs queued (" + std::to_string(jobs_.size()) +
                                        "); ask again later");
  }
  auto job = std::make_shared<Job>();
  job->kind = kind;
  job->run_id = run_id;
  job->hash = hash;
  job->key = key;
  job->work = std::move(work);
  jobs_[{kind, run_id, hash}] = job;
  queue_.push_back(job);
  cv_.notify_all();
  answer.state = v1::ANALYSIS_STATE_QUEUED;
  return answer;
}

void AnalysisCore::WorkerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    std::shared_ptr<Job> job = queue_.front();
    queue_.pop_front();
    job->state = v1::ANALYSIS_STATE_RUNNING;
    lock.unlock();
    RunJob(*job);
    lock.lock();
  }
}

void AnalysisCore::RunJob(Job& job) {
  auto progress = [&](double fraction) {
    std::lock_guard<std::mutex> lock(mu_);
    job.progress = fraction;
  };
  absl::StatusOr<std::string> result = job.work(progress, &job.cancel);
  absl::Status status = result.status();
  if (result.ok()) {
    // Stored first, then forgotten: later requests find it in the store.
    status = store_->PutAnalysis(job.run_id, job.kind, job.hash, job.key, *result);
    if (!status.ok()) status = absl::InternalError("cannot store the result: " + status.ToString());
  }
  if (!status.ok()) {
    spdlog::warn("{} of {} failed: {}", job.kind,
                 job.run_id == store::Store::kNoRun ? "a spec" : FormatRunId(job.run_id), status.ToString());
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (status.ok()) {
    jobs_.erase({job.kind, job.run_id, job.hash});
  } else {
    job.state = v1::ANALYSIS_STATE_FAILED;
    job.error = status.ToString();
  }
}

absl::StatusOr<std::pair<v1::ExperimentSpec, store::Checkpoint>> AnalysisCore::RunCheckpoint(
    int64_t id, uint64_t step, const std::string& run_id) {
  CL_ASSIGN_OR_RETURN(store::RunRow row, store_->GetRun(id));
  v1::ExperimentSpec spec;
  if (!spec.ParseFromString(row.spec)) return absl::DataLossError("stored spec of " + run_id + " does not parse");
  CL_ASSIGN_OR_RETURN(std::optional<store::Checkpoint> ckpt,
                      store_->CheckpointAt(id, step == 0 ? -1 : static_cast<int64_t>(step)));
  if (!ckpt) {
    CL_ASSIGN_OR_RETURN(std::vector<int64_t> steps, store_->CheckpointSteps(id));
    std::string have;
    for (int64_t s : steps) have += (have.empty() ? "" : ", ") + std::to_string(s);
    return absl::NotFoundError("run " + run_id + " has no checkpoint" +
                               (step == 0 ? std::string() : " at step " + std::to_string(step)) +
                               (have.empty() ? " yet" : " (checkpoints at steps: " + have + ")"));
  }
  return std::make_pair(std::move(spec), std::move(*ckpt));
}

absl::StatusOr<v1::ProjectCheckpointResponse> AnalysisCore::ProjectCheckpoint(
    const v1::ProjectCheckpointRequest& request) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseRunId(request.run_id()));
  CL_RETURN_IF_ERROR(CheckSelection(request.selection()));
  CL_ASSIGN_OR_RETURN(auto found, RunCheckpoint(id, request.step(), request.run_id()));
  CL_RETURN_IF_ERROR(NeedsImir(found.first, "ProjectCheckpoint"));
  const v1::ExperimentSpec& spec = found.first;
  const store::Checkpoint* ckpt = &found.second;
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

namespace circuitlab::scheduler {
namespace {

constexpr uint32_t kMinEval = 64, kMaxEval = 16384;
constexpr int kMaxInterventions = 64;

absl::Status CheckEvalSize(uint32_t n, uint32_t min, const std::string& field) {
  if (n != 0 && (n < min || n > kMaxEval)) {
    return absl::InvalidArgumentError(field + " must be in [" + std::to_string(min) + ", " + std::to_string(kMaxEval) +
                                      "] (0 = default), got " + std::to_string(n));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::DetectCircuitResponse> AnalysisCore::DetectCircuit(const v1::DetectCircuitRequest& request) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseRunId(request.run_id()));
  CL_RETURN_IF_ERROR(CheckSelection(request.selection()));
  CL_RETURN_IF_ERROR(CheckEvalSize(request.n_eval(), kMinEval, "n_eval"));
  engine::DetectRequest d;
  const std::string metric = request.metric().empty() ? "accuracy" : request.metric();
  if (metric == "accuracy") {
    d.metric = engine::CircuitMetric::kAccuracy;
  } else if (metric == "loss") {
    d.metric = engine::CircuitMetric::kLoss;
  } else if (metric == "p_target") {
    d.metric = engine::CircuitMetric::kPTarget;
  } else {
    return absl::InvalidArgumentError("metric must be accuracy, loss or p_target, got '" + request.metric() + "'");
  }
  const double max_tol = d.metric == engine::CircuitMetric::kLoss ? 10.0 : 1.0;
  if (!(request.tolerance() >= 0 && request.tolerance() <= max_tol)) {
    return absl::InvalidArgumentError("tolerance must be in [0, " + std::to_string(static_cast<int>(max_tol)) +
                                      "] for metric " + metric + " (0 = default), got " +
                                      std::to_string(request.tolerance()));
  }
  const std::string order = request.order().empty() ? "magnitude_asc" : request.order();
  if (order == "magnitude_asc") {
    d.order = engine::DetectRequest::Order::kMagnitudeAsc;
  } else if (order == "effect_asc") {
    d.order = engine::DetectRequest::Order::kEffectAsc;
  } else if (order == "label") {
    d.order = engine::DetectRequest::Order::kLabel;
  } else {
    return absl::InvalidArgumentError("order must be magnitude_asc, effect_asc or label, got '" + request.order() + "'");
  }
  if (!(request.prepass_eps() >= 0 && request.prepass_eps() < 1)) {
    return absl::InvalidArgumentError("prepass_eps must be in [0, 1) (0 = default), got " +
                                      std::to_string(request.prepass_eps()));
  }
  if (request.max_passes() > 20) {
    return absl::InvalidArgumentError("max_passes must be in [1, 20] (0 = default), got " +
                                      std::to_string(request.max_passes()));
  }
  if (request.max_evals() > 100000) {
    return absl::InvalidArgumentError("max_evals must be in [1, 100000] (0 = default), got " +
                                      std::to_string(request.max_evals()));
  }
  CL_ASSIGN_OR_RETURN(auto found, RunCheckpoint(id, request.step(), request.run_id()));
  CL_RETURN_IF_ERROR(NeedsImir(found.first, "DetectCircuit"));
  const v1::ExperimentSpec& spec = found.first;
  // The canonical request: every default resolved, force dropped.
  v1::DetectCircuitRequest canonical;
  canonical.set_run_id(FormatRunId(id));
  canonical.set_step(static_cast<uint64_t>(found.second.step));
  canonical.set_eval_set(request.eval_set());
  canonical.set_n_eval(request.n_eval() == 0 ? 2048 : request.n_eval());
  canonical.set_metric(metric);
  canonical.set_tolerance(request.tolerance() != 0 ? request.tolerance()
                                                   : d.metric == engine::CircuitMetric::kLoss ? 0.02 : 0.01);
  canonical.set_order(order);
  canonical.set_prepass_eps(request.prepass_eps() == 0 ? 1e-3 : request.prepass_eps());
  canonical.set_max_passes(request.max_passes() == 0 ? 3 : request.max_passes());
  canonical.set_selection(request.selection() == v1::BASIS_SELECTION_COMPLETE ? v1::BASIS_SELECTION_COMPLETE
                                                                              : v1::BASIS_SELECTION_PAPER);
  canonical.set_max_evals(request.max_evals() == 0 ? 5000 : request.max_evals());
  canonical.set_seed(request.seed() == 0 ? spec.seed() : request.seed());
  if (d.order == engine::DetectRequest::Order::kEffectAsc) {
    // effect_asc spends O(K^2) evaluations: D.1 allows it for K <= 200.
    const auto& m = spec.model().imir();
    const size_t k = m.parameterisation() == v1::PARAMETERISATION_COORDINATES
                         ? engine::CoordinateBasisOf(spec).coords.size()
                         : engine::BuildBasis(engine::DeclaredSymmetry(spec), m.num_layers(), m.num_heads(),
                                              ToSelection(canonical.selection()))
                               .coords.size();
    if (k > 200) {
      return absl::InvalidArgumentError("order effect_asc is for at most 200 coordinates; this basis has " +
                                        std::to_string(k) + " (use magnitude_asc)");
    }
  }
  d.eval_set = canonical.eval_set();
  d.n_eval = canonical.n_eval();
  d.tolerance = canonical.tolerance();
  d.prepass_eps = canonical.prepass_eps();
  d.max_passes = static_cast<int>(canonical.max_passes());
  d.selection = ToSelection(canonical.selection());
  d.max_evals = canonical.max_evals();
  d.seed = canonical.seed();
  Work work = [this, spec, bytes = std::move(found.second.bytes), d, canonical](
                  const std::function<void(double)>& progress, const CancelToken* cancel) -> absl::StatusOr<std::string> {
    CL_ASSIGN_OR_RETURN(engine::DetectReport r, analyzer_->DetectCircuit(spec, bytes, d, progress, cancel));
    v1::DetectCircuitResponse done;
    done.set_state(v1::ANALYSIS_STATE_DONE);
    done.set_progress(1.0);
    done.set_step(canonical.step());
    done.set_metric(canonical.metric());
    done.set_eval_set(r.eval_set);
    done.set_m_dense(r.m_dense);
    done.set_m_ref(r.m_ref);
    done.set_m_circuit(r.m_circuit);
    done.set_projection_not_faithful(r.projection_not_faithful);
    for (const engine::CircuitMember& m : r.circuit) {
      v1::CircuitCoordinate* o = done.add_circuit();
      FillCoordinate(ToCoordinateRow(m.def), m.value, o->mutable_coordinate());
      o->set_role(m.role);
      o->set_necessity(m.necessity);
      o->mutable_irrelevant_mass_delta()->Add(m.irrelevant_mass_delta.begin(), m.irrelevant_mass_delta.end());
    }
    done.set_candidates(static_cast<uint32_t>(r.candidates));
    done.set_evaluations(static_cast<uint32_t>(r.evaluations));
    done.set_budget_exhausted(r.budget_exhausted);
    done.set_template_name(r.template_name);
    for (int l : r.template_layers) done.add_template_layers(static_cast<uint32_t>(l));
    for (const auto& e : r.template_elements) {
      v1::TemplateElement* o = done.add_template_elements();
      o->set_label(e.label);
      o->set_canonical(e.canonical);
      o->set_found(e.found);
    }
    done.mutable_irrelevant_mass()->Add(r.irrelevant_mass.begin(), r.irrelevant_mass.end());
    return done.SerializeAsString();
  };
  CL_ASSIGN_OR_RETURN(Answer a,
                      Enqueue("detect_circuit", id, canonical.SerializeAsString(), request.force(), std::move(work)));
  return FromAnswer<v1::DetectCircuitResponse>(a);
}

absl::StatusOr<v1::LabelRunResponse> AnalysisCore::LabelRun(const v1::LabelRunRequest& request) {
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
  std::string key = canonical.SerializeAsString() + "/pair-paths-1";
  for (int64_t s : steps) key += "/" + std::to_string(s);
  engine::LabelRequest lr;
  lr.n_eval = canonical.n_eval();
  lr.seed = spec.seed();
  Work work = [this, spec, id, steps, lr](const std::function<void(double)>& progress,
                                          const CancelToken* cancel) -> absl::StatusOr<std::string> {
    std::vector<std::pair<int64_t, std::string>> checkpoints;
    for (int64_t s : steps) {
      CL_ASSIGN_OR_RETURN(std::optional<store::Checkpoint> c, store_->CheckpointAt(id, s));
      if (c) checkpoints.emplace_back(s, std::move(c->bytes));
    }
    CL_ASSIGN_OR_RETURN(engine::LabelReport r, analyzer_->LabelRun(spec, checkpoints, lr, progress, cancel));
    v1::LabelRunResponse done;
    done.set_state(v1::ANALYSIS_STATE_DONE);
    done.set_progress(1.0);
    for (const engine::CheckpointLabelReport& c : r.checkpoints) {
      v1::CheckpointLabel* o = done.add_checkpoints();
      o->set_step(static_cast<uint64_t>(c.step));
      o->set_icl_set(c.icl_set);
      o->set_icl_accuracy(c.icl_accuracy);
      o->set_iwl_accuracy(c.iwl_accuracy);
      o->set_icl(c.icl);
      o->set_iwl(c.iwl);
      o->set_coords_icl(c.coords_icl);
      o->set_coords_iwl(c.coords_iwl);
      o->set_consistent(c.consistent);
      o->set_conflict_logit_diff(c.conflict_logit_diff);
      o->set_label(c.label);
      o->set_pair(c.pair);
      for (const auto& [name, s] : c.pair_scores) (*o->mutable_pair_scores())[name] = s;
      o->mutable_head_ablation()->Add(c.head_ablation.begin(), c.head_ablation.end());
      for (const auto& [name, s] : c.pair_ablation) (*o->mutable_pair_ablation())[name] = s;
    }
    done.set_label(r.label);
    done.set_pair(r.pair);
    done.set_pair_predicted(r.pair_predicted);
    return done.SerializeAsString();
  };
  CL_ASSIGN_OR_RETURN(Answer a, Enqueue("label_run", id, key, request.force(), std::move(work)));
  return FromAnswer<v1::LabelRunResponse>(a);
}

absl::StatusOr<v1::InterveneResponse> AnalysisCore::Intervene(const v1::InterveneRequest& request) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseRunId(request.run_id()));
  CL_RETURN_IF_ERROR(CheckSelection(request.selection()));
  CL_RETURN_IF_ERROR(CheckEvalSize(request.n_eval(), 16, "n_eval"));
  if (request.interventions_size() == 0 || request.interventions_size() > kMaxInterventions) {
    return absl::InvalidArgumentError("interventions must have 1 to " + std::to_string(kMaxInterventions) +
                                      " entries, got " + std::to_string(request.interventions_size()));
  }
  if (request.eval_sets_size() > 16) {
    return absl::InvalidArgumentError("eval_sets must have at most 16 entries, got " +
                                      std::to_string(request.eval_sets_size()));
  }
  CL_ASSIGN_OR_RETURN(auto found, RunCheckpoint(id, request.step(), request.run_id()));
  const v1::ExperimentSpec& spec = found.first;
  const bool decoder = spec.model().kind_case() == v1::ModelSpec::kDecoder;
  v1::InterveneRequest canonical = request;
  canonical.set_run_id(FormatRunId(id));
  canonical.set_step(static_cast<uint64_t>(found.second.step));
  canonical.set_n_eval(request.n_eval() == 0 ? 2048 : request.n_eval());
  canonical.set_seed(request.seed() == 0 ? spec.seed() : request.seed());
  canonical.set_selection(request.selection() == v1::BASIS_SELECTION_COMPLETE ? v1::BASIS_SELECTION_COMPLETE
                                                                              : v1::BASIS_SELECTION_PAPER);
  canonical.set_force(false);
  engine::InterveneRequest ir;
  ir.eval_sets.assign(request.eval_sets().begin(), request.eval_sets().end());
  ir.n_eval = canonical.n_eval();
  ir.seed = canonical.seed();
  ir.selection = ToSelection(canonical.selection());
  for (int i = 0; i < request.interventions_size(); ++i) {
    v1::Intervention* in = canonical.mutable_interventions(i);
    const std::string field = "interventions[" + std::to_string(i) + "]";
    if (in->coordinates_size() > 4096) {
      return absl::InvalidArgumentError(field + ".coordinates must have at most 4096 entries");
    }
    engine::InterventionOp op;
    op.coordinates.assign(in->coordinates().begin(), in->coordinates().end());
    op.scale = in->scale();
    op.value = in->value();
    op.layer = static_cast<int>(in->layer());
    op.head = in->head() == 0 ? 1 : static_cast<int>(in->head());
    if (!std::isfinite(op.scale) || !std::isfinite(op.value) || std::abs(op.scale) > 1e6 ||
        std::abs(op.value) > 1e6) {
      return absl::InvalidArgumentError(field + ": scale and value must be finite and in [-1e6, 1e6]");
    }
    const bool activation = in->op() >= v1::Intervention::OP_ZERO && in->op() <= v1::Intervention::OP_REPLACE_CONVEX;
    if (decoder && !activation && v1::Intervention::Op_IsValid(in->op()) &&
        in->op() != v1::Intervention::OP_UNSPECIFIED) {
      return absl::FailedPreconditionError(field + ": " + v1::Intervention::Op_Name(in->op()) +
                                           " edits IMIR weights; this decoder run takes the hook-point ops "
                                           "OP_ZERO .. OP_REPLACE_CONVEX");
    }
    if (activation) {
      op.hook = in->hook();
      op.head = static_cast<int>(in->head());
      op.positions.assign(in->positions().begin(), in->positions().end());
      op.reference_set = in->reference_set();
      op.centre = in->centre();
      if (in->weights_size() > 16) return absl::InvalidArgumentError(field + ".weights: at most 16 (one per major)");
      for (double w : in->weights()) {
        if (!std::isfinite(w) || w < 0) {
          return absl::InvalidArgumentError(field + ".weights must be finite and non-negative");
        }
      }
      op.weights.assign(in->weights().begin(), in->weights().end());
      op.subtract = in->subtract();
      if (in->vectors_size() > 64 || in->positions_size() > 1024) {
        return absl::InvalidArgumentError(field + ": at most 64 vectors and 1024 positions");
      }
      for (const v1::HookVector& v : in->vectors()) {
        if (v.values_size() > 4096) return absl::InvalidArgumentError(field + ".vectors: at most 4096 values each");
        op.vectors.emplace_back(v.values().begin(), v.values().end());
      }
      // Reference activations are kept whole: n_eval x T x width floats
      // (an attention pattern: T x heads).
      const uint64_t T = engine::ShapeOf(spec).seq_len;
      const uint64_t heads = decoder ? spec.model().decoder().num_heads() : spec.model().imir().num_heads();
      const uint64_t need = 4ULL * canonical.n_eval() * T *
                            std::max<uint64_t>(static_cast<uint64_t>(engine::ResidualWidth(spec)), T * heads);
      if (need > limits_.max_run_memory_bytes) {
        return absl::ResourceExhaustedError(field + ": the reference activations need about " +
                                            std::to_string(need >> 20) + " MiB, more than --max-run-memory-mb; "
                                            "lower n_eval");
      }
    }
    switch (in->op()) {
      case v1::Intervention::OP_ZERO: op.kind = engine::InterventionOp::Kind::kActZero; break;
      case v1::Intervention::OP_MEAN: op.kind = engine::InterventionOp::Kind::kActMean; break;
      case v1::Intervention::OP_RESAMPLE: op.kind = engine::InterventionOp::Kind::kActResample; break;
      case v1::Intervention::OP_PROJECT_OUT: op.kind = engine::InterventionOp::Kind::kActProjectOut; break;
      case v1::Intervention::OP_PROJECT_ONTO: op.kind = engine::InterventionOp::Kind::kActProjectOnto; break;
      case v1::Intervention::OP_ADD: op.kind = engine::InterventionOp::Kind::kActAdd; break;
      case v1::Intervention::OP_PATCH: op.kind = engine::InterventionOp::Kind::kActPatch; break;
      case v1::Intervention::OP_REPLACE_CONVEX: op.kind = engine::InterventionOp::Kind::kActReplaceConvex; break;
      case v1::Intervention::OP_ZERO_COORDINATE: op.kind = engine::InterventionOp::Kind::kZero; break;
      case v1::Intervention::OP_SCALE_COORDINATE: op.kind = engine::InterventionOp::Kind::kScale; break;
      case v1::Intervention::OP_SET_COORDINATE: op.kind = engine::InterventionOp::Kind::kSet; break;
      case v1::Intervention::OP_ABLATE_HEAD: op.kind = engine::InterventionOp::Kind::kAblateHead; break;
      case v1::Intervention::OP_KEEP_ONLY: op.kind = engine::InterventionOp::Kind::kKeepOnly; break;
      case v1::Intervention::OP_SWAP_COORDINATES: {
        op.kind = engine::InterventionOp::Kind::kSwap;
        CL_ASSIGN_OR_RETURN(int64_t source, ParseRunId(in->source_run_id(), field + ".source_run_id"));
        CL_ASSIGN_OR_RETURN(auto src, RunCheckpoint(source, in->source_step(), in->source_run_id()));
        CL_RETURN_IF_ERROR(NeedsImir(src.first, "Intervene (swap)"));
        in->set_source_run_id(FormatRunId(source));
        in->set_source_step(static_cast<uint64_t>(src.second.step));
        op.source_spec = std::move(src.first);
        op.source_checkpoint = std::move(src.second.bytes);
        break;
      }
      default:
        return absl::InvalidArgumentError(field + ".op must be one of the Intervention.Op values (got " +
                                          std::to_string(in->op()) + ")");
    }
    ir.ops.push_back(std::move(op));
  }
  if (request.attention_mass_size() > 16) {
    return absl::InvalidArgumentError("attention_mass must have at most 16 entries, got " +
                                      std::to_string(request.attention_mass_size()));
  }
  for (const v1::AttentionMass& a : request.attention_mass()) {
    // Keys and queries beyond T are refused by the engine, naming the field.
    if (a.keys_size() > 4096 || a.queries_size() > 4096) {
      return absl::InvalidArgumentError("attention_mass: at most 4096 keys and queries each");
    }
    ir.attention_mass.push_back({a.pattern(), {a.keys().begin(), a.keys().end()},
                                 {a.queries().begin(), a.queries().end()}});
  }
  if (request.logit_diff_tokens_size() > 2) {  // bounded before copying; the engine checks the pair
    return absl::InvalidArgumentError("logit_diff_tokens must be empty or two token ids (t1, t2), got " +
                                      std::to_string(request.logit_diff_tokens_size()));
  }
  ir.logit_diff_tokens.assign(request.logit_diff_tokens().begin(), request.logit_diff_tokens().end());
  const std::string key = canonical.SerializeAsString();
  const int64_t hash = static_cast<int64_t>(HashPurpose(key) >> 1);
  if (!request.force()) {
    CL_ASSIGN_OR_RETURN(std::optional<std::string> stored, store_->GetAnalysis(id, "intervene", hash));
    v1::InterveneResponse resp;
    if (stored && resp.ParseFromString(*stored)) {
      resp.set_from_store(true);
      return resp;
    }
  }
  CL_ASSIGN_OR_RETURN(engine::InterveneReport r, analyzer_->Intervene(spec, found.second.bytes, ir));
  v1::InterveneResponse resp;
  resp.set_run_id(canonical.run_id());
  resp.set_step(canonical.step());
  for (const engine::EffectReport& e : r.effects) {
    v1::InterventionEffect* o = resp.add_effects();
    o->set_eval_set(e.eval_set);
    o->set_loss_clean(e.loss_clean);
    o->set_loss(e.loss);
    o->set_accuracy_clean(e.accuracy_clean);
    o->set_accuracy(e.accuracy);
    o->set_kl_clean(e.kl_clean);
    o->set_has_logit_diff(e.has_logit_diff);
    o->set_logit_diff_clean(e.logit_diff_clean);
    o->set_logit_diff(e.logit_diff);
    o->set_alt_name(e.alt_name);
    o->set_has_kl_ref(e.has_kl_ref);
    o->set_ref_name(e.ref_name);
    o->set_kl_ref_clean(e.kl_ref_clean);
    o->set_kl_ref(e.kl_ref);
    for (const engine::EffectReport::Mass& m : e.attention_mass) {
      v1::AttentionMassEffect* a = o->add_attention_mass();
      a->set_pattern(m.pattern);
      a->mutable_clean()->Add(m.clean.begin(), m.clean.end());
      a->mutable_intervened()->Add(m.intervened.begin(), m.intervened.end());
    }
  }
  for (const engine::InterveneReport::Edited& e : r.edited) {
    FillCoordinate(ToCoordinateRow(e.def), e.after, resp.add_edited());
    resp.add_edited_before(e.before);
  }
  CL_RETURN_IF_ERROR(store_->PutAnalysis(id, "intervene", hash, key, resp.SerializeAsString()));
  return resp;
}

absl::StatusOr<v1::CheckDataDependenceResponse> AnalysisCore::CheckDataDependence(
    const v1::CheckDataDependenceRequest& request) {
  CL_ASSIGN_OR_RETURN(auto target, TargetSpec(request.run_id(), request.has_spec() ? &request.spec() : nullptr));
  const int64_t id = target.first;
  const v1::ExperimentSpec& spec = target.second;
  const bool recall = spec.task().has_associative_recall() || spec.task().kind_case() == v1::TaskSpec::KIND_NOT_SET;
  if (!recall || spec.task().associative_recall().num_common() == 0) {
    return absl::FailedPreconditionError("the data-dependence check needs an associative-recall task with common "
                                         "pairs (task.associative_recall.num_common > 0)");
  }
  if (request.points_size() > 64) {
    return absl::InvalidArgumentError("points must have at most 64 entries, got " +
                                      std::to_string(request.points_size()));
  }
  if (request.samples() != 0 && (request.samples() < 256 || request.samples() > (1u << 20))) {
    return absl::InvalidArgumentError("samples must be in [256, 1048576] (0 = 65536), got " +
                                      std::to_string(request.samples()));
  }
  v1::CheckDataDependenceRequest canonical;
  if (id == store::Store::kNoRun) {
    *canonical.mutable_spec() = spec;
  } else {
    canonical.set_run_id(FormatRunId(id));
  }
  canonical.set_samples(request.samples() == 0 ? 65536 : request.samples());
  canonical.set_seed(request.seed() == 0 ? spec.seed() : request.seed());
  if (request.points_size() == 0) {
    // E.6's grid at delta* in both modes, then E.7's burstiness at f_r = 1.
    for (auto mode : {v1::VARIABILITY_MODE_VARIANT, v1::VARIABILITY_MODE_REPAIR}) {
      for (double fr : {0.5, 0.25}) {
        for (double fv : {0.0, 0.5}) {
          v1::DataPoint* p = canonical.add_points();
          p->set_rare_fraction(fr);
          p->set_variability(fv);
          p->set_variability_mode(mode);
          p->set_burstiness(1);
          p->set_delta_saturated(true);
        }
      }
    }
    for (uint32_t b : {1u, 2u, 4u, 8u}) {
      if (b > spec.task().associative_recall().num_blocks()) break;
      v1::DataPoint* p = canonical.add_points();
      p->set_rare_fraction(1.0);
      p->set_variability_mode(v1::VARIABILITY_MODE_VARIANT);
      p->set_burstiness(b);
    }
  } else {
    *canonical.mutable_points() = request.points();
  }
  const uint32_t blocks = spec.task().associative_recall().num_blocks();
  std::vector<engine::DataDependencePoint> points;
  for (int i = 0; i < canonical.points_size(); ++i) {
    v1::DataPoint* p = canonical.mutable_points(i);
    const std::string field = "points[" + std::to_string(i) + "]";
    if (p->burstiness() == 0) p->set_burstiness(1);
    if (p->variability_mode() == v1::VARIABILITY_MODE_UNSPECIFIED) p->set_variability_mode(v1::VARIABILITY_MODE_VARIANT);
    if (!v1::VariabilityMode_IsValid(p->variability_mode())) {
      return absl::InvalidArgumentError(field + ".variability_mode is not a known value");
    }
    if (!(p->rare_fraction() >= 0 && p->rare_fraction() <= 1)) {
      return absl::InvalidArgumentError(field + ".rare_fraction must be in [0, 1], got " +
                                        std::to_string(p->rare_fraction()));
    }
    if (!(p->variability() >= 0 && p->variability() <= 1)) {
      return absl::InvalidArgumentError(field + ".variability must be in [0, 1], got " +
                                        std::to_string(p->variability()));
    }
    if (p->burstiness() > blocks) {
      return absl::InvalidArgumentError(field + ".burstiness must be in [1, " + std::to_string(blocks) +
                                        "] (task.associative_recall.num_blocks), got " +
                                        std::to_string(p->burstiness()));
    }
    if (!(p->abg() >= 0 && p->abg() <= 10)) {
      return absl::InvalidArgumentError(field + ".abg must be in [0, 10], got " + std::to_string(p->abg()));
    }
    if (!(std::abs(p->delta()) <= 100)) {
      return absl::InvalidArgumentError(field + ".delta must be in [-100, 100], got " + std::to_string(p->delta()));
    }
    engine::DataDependencePoint q;
    q.rare_fraction = p->rare_fraction();
    q.variability = p->variability();
    q.variant_mode = p->variability_mode() == v1::VARIABILITY_MODE_VARIANT;
    q.burstiness = p->burstiness();
    q.delta = p->delta_saturated() ? engine::SaturatedDelta(engine::ShapeOf(spec).vocab) : p->delta();
    q.abg = p->abg();
    points.push_back(q);
  }
  engine::DataDependenceConfig config;
  config.samples = static_cast<int64_t>(canonical.samples());
  // The standard error comes from the spread of chunk means: at least 8 chunks.
  config.chunk = std::min<int64_t>(config.chunk, config.samples / 8);
  config.seed = canonical.seed();
  Work work = [this, spec, points, config, canonical](const std::function<void(double)>& progress,
                                                      const CancelToken* cancel) -> absl::StatusOr<std::string> {
    CL_ASSIGN_OR_RETURN(std::vector<engine::DataDependenceRow> rows,
                        analyzer_->CheckDataDependence(spec, points, config, progress, cancel));
    v1::CheckDataDependenceResponse done;
    done.set_state(v1::ANALYSIS_STATE_DONE);
    done.set_progress(1.0);
    done.set_samples(canonical.samples());
    for (size_t i = 0; i < rows.size(); ++i) {
      const engine::DataDependenceRow& r = rows[i];
      v1::DataDependenceRow* o = done.add_rows();
      *o->mutable_point() = canonical.points(static_cast<int>(i));
      o->mutable_point()->set_delta(r.point.delta);
      o->set_grad_alpha(r.grad[0]);
      o->set_grad_beta(r.grad[1]);
      o->set_grad_gamma(r.grad[2]);
      o->set_grad_delta(r.grad[3]);
      o->set_gamma_stderr(r.gamma_stderr);
      o->set_closed_form_gamma(r.closed_form_gamma);
      o->set_ratio(r.ratio);
      o->set_ratio_vector(r.ratio_vector);
      o->set_phi(r.phi);
      o->set_identity_max_rel_error(r.identity_max_rel_error);
    }
    return done.SerializeAsString();
  };
  CL_ASSIGN_OR_RETURN(Answer a,
                      Enqueue("data_dependence", id, canonical.SerializeAsString(), request.force(), std::move(work)));
  return FromAnswer<v1::CheckDataDependenceResponse>(a);
}

}  // namespace circuitlab::scheduler
