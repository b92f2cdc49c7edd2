#include "server/scheduler/scheduler.h"

#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/time_util.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>
#include <cctype>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"

namespace circuitlab::scheduler {
namespace {

constexpr int kMaxPageSize = 1000;
constexpr int kDefaultPageSize = 50;
// A ListRuns page ends early (with a next_page_token) once its specs reach
// this size, so one answer stays a few MiB whatever the runs hold.
constexpr int64_t kMaxListBytes = 4 << 20;
constexpr int kMaxMetricNames = 256;
constexpr uint32_t kMaxMetricPoints = 100000;
constexpr uint32_t kDefaultMetricPoints = 10000;
// Points in one GetMetrics answer over all series (~16 bytes each); beyond
// it every series is downsampled further.
constexpr int64_t kMaxPointsPerResponse = 2'000'000;

google::protobuf::Timestamp ToTimestamp(int64_t micros) {
  return google::protobuf::util::TimeUtil::MicrosecondsToTimestamp(micros);
}

std::string StateName(int state) {
  return v1::RunState_IsValid(state) ? v1::RunState_Name(static_cast<v1::RunState>(state)) : std::to_string(state);
}

v1::RunEvent StateEvent(int state, const std::string& device, const std::string& error) {
  v1::RunEvent ev;
  ev.mutable_state()->set_state(static_cast<v1::RunState>(state));
  ev.mutable_state()->set_device(device);
  ev.mutable_state()->set_error(error);
  return ev;
}

}  // namespace

namespace {

absl::StatusOr<int64_t> ParseId(const std::string& text, const std::string& field, char prefix) {
  // One spelling per id but the documented bare number ("17" for r17):
  // a lower-case prefix, digits without sign, space or leading zero.
  std::string digits = text;
  if (!digits.empty() && digits[0] == prefix) digits.erase(0, 1);
  if (digits.empty() || digits.size() > 18 || digits[0] == '0' ||
      !std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return c >= '0' && c <= '9'; })) {
    return absl::InvalidArgumentError(field + " must look like " + prefix + "<number> (e.g. " + prefix + "17), got " +
                                      Quote(text));
  }
  const int64_t id = std::stoll(digits);
  if (id <= 0) return absl::InvalidArgumentError(field + " must be positive, got " + Quote(text));
  return id;
}

}  // namespace

absl::StatusOr<int64_t> ParseRunId(const std::string& text, const std::string& field) {
  return ParseId(text, field, 'r');
}

std::string FormatRunId(int64_t id) { return absl::StrCat("r", id); }

absl::StatusOr<int64_t> ParseSweepId(const std::string& text, const std::string& field) {
  return ParseId(text, field, 's');
}

std::string FormatSweepId(int64_t id) { return absl::StrCat("s", id); }

store::CoordinateDefRow ToCoordinateRow(const engine::CoordinateDef& d) {
  return {0, d.index, d.label, d.canonical, d.matrix, d.layer, d.head, d.block_q, d.block_k, d.element, d.norm, d.gauge};
}

absl::Status ValidateSeriesRange(uint64_t min_step, uint64_t max_step, uint32_t max_points) {
  if (max_points > kMaxMetricPoints) {
    return absl::InvalidArgumentError("max_points must be in [0, " + std::to_string(kMaxMetricPoints) + "], got " +
                                      std::to_string(max_points));
  }
  if (max_step > 0 && max_step < min_step) {
    return absl::InvalidArgumentError("max_step (" + std::to_string(max_step) + ") must be 0 or at least min_step (" +
                                      std::to_string(min_step) + ")");
  }
  constexpr uint64_t kMaxStep = 1ULL << 62;
  if (min_step > kMaxStep || max_step > kMaxStep) {
    return absl::InvalidArgumentError("min_step and max_step must be at most 2^62");
  }
  return absl::OkStatus();
}

// Forwards what a training run produces to the store and to watchers.
class Scheduler::RunObserver : public PlacedObserver {
 public:
  RunObserver(Scheduler* s, int64_t run_id, std::shared_ptr<Active> active, int keep_checkpoints)
      : s_(s), run_id_(run_id), active_(std::move(active)), keep_(keep_checkpoints) {
    std::lock_guard<std::mutex> lock(s_->mu_);
    start_step_ = active_->step;
  }

  int64_t run_id() const override { return run_id_; }
  int64_t start_step() const override { return start_step_; }

  void OnLost(const std::string& why, bool counts) override {
    std::lock_guard<std::mutex> lock(s_->mu_);
    auto& [count, last] = s_->lost_[run_id_];
    if (counts) ++count;
    last = why;
  }

  // A remote worker took the run: Run.device says which.
  void OnPlaced(const std::string& device) override {
    store::RunTransition t;
    t.state = v1::RUN_STATE_RUNNING;
    t.device = device;
    t.from_states = {v1::RUN_STATE_RUNNING};
    if (absl::Status st = s_->Transition(run_id_, t); !st.ok()) {
      spdlog::warn("{}: cannot record its worker: {}", FormatRunId(run_id_), st.ToString());
    }
  }

  void OnMetrics(int64_t step, const std::vector<engine::Metric>& metrics) override {
    std::vector<store::MetricPoint> rows;
    v1::RunEvent ev;
    for (const engine::Metric& m : metrics) {
      rows.push_back({m.name, step, m.value});
      v1::MetricPoint* p = ev.mutable_metrics()->add_points();
      p->set_name(m.name);
      p->set_step(static_cast<uint64_t>(step));
      p->set_value(m.value);
    }
    s_->store_->AppendMetrics(run_id_, std::move(rows));
    {
      std::lock_guard<std::mutex> lock(s_->mu_);
      for (const engine::Metric& m : metrics) active_->latest[m.name] = m.value;
    }
    s_->hub_.Publish(run_id_, std::move(ev));
  }

  void OnProgress(int64_t step, double steps_per_second) override {
    s_->store_->RecordProgress(run_id_, step);
    v1::RunEvent ev;
    v1::Progress* p = ev.mutable_progress();
    {
      std::lock_guard<std::mutex> lock(s_->mu_);
      active_->step = step;
      active_->rate = steps_per_second;
      p->set_step(static_cast<uint64_t>(step));
      p->set_total_steps(static_cast<uint64_t>(active_->total));
      p->set_steps_per_second(steps_per_second);
      if (steps_per_second > 0) p->set_eta_seconds(static_cast<double>(active_->total - step) / steps_per_second);
      p->mutable_latest()->insert(active_->latest.begin(), active_->latest.end());
    }
    s_->hub_.Publish(run_id_, std::move(ev));
  }

  // Storage faults are retried with backoff (SchedulerOptions); the run
  // fails only after the last try, or at once when it is asked to stop.
  absl::Status OnCheckpoint(int64_t step, const std::string& bytes) override {
    const SchedulerOptions& o = s_->options_;
    std::chrono::milliseconds wait = o.checkpoint_retry_delay;
    absl::Status s;
    for (int attempt = 1;; ++attempt) {
      s = s_->store_->PutCheckpoint(run_id_, step, bytes, keep_);
      s_->NoteStorage(run_id_, s);
      if (s.ok()) {
        if (attempt > 1) Warn("checkpoint at step " + std::to_string(step) + " written after " +
                              std::to_string(attempt - 1) + " failed attempt(s)");
        return s;
      }
      if (attempt >= o.checkpoint_tries || active_->cancel.stop_requested()) break;
      Warn("checkpoint at step " + std::to_string(step) + " not written (" + std::string(s.message()) +
           "); try " + std::to_string(attempt + 1) + " of " + std::to_string(o.checkpoint_tries) + " in " +
           std::to_string(wait.count()) + " ms");
      // Waits in short steps so that a cancel or a drain is not held up.
      const auto until = std::chrono::steady_clock::now() + wait;
      while (std::chrono::steady_clock::now() < until && !active_->cancel.stop_requested()) {
        std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(wait, std::chrono::milliseconds(50)));
      }
      wait *= 2;
    }
    return absl::UnavailableError("checkpoint at step " + std::to_string(step) + " could not be written after " +
                                  std::to_string(o.checkpoint_tries) + " tries: " + std::string(s.message()));
  }

  absl::Status OnBasis(const engine::Basis& basis) override {
    std::vector<store::CoordinateDefRow> rows;
    rows.reserve(basis.coords.size());
    for (const engine::CoordinateDef& d : basis.coords) rows.push_back(ToCoordinateRow(d));
    CL_ASSIGN_OR_RETURN(coord_ids_[static_cast<int>(basis.selection)],
                        s_->store_->PutCoordinateDefs(run_id_, engine::SelectionName(basis.selection), rows));
    return absl::OkStatus();
  }

  void OnCoordinates(int64_t step, engine::Selection selection, const std::vector<double>& values) override {
    auto it = coord_ids_.find(static_cast<int>(selection));
    if (it != coord_ids_.end()) s_->store_->AppendCoordinates(run_id_, step, it->second, values);
  }

 private:
  void Warn(const std::string& text) {
    spdlog::warn("{}: {}", FormatRunId(run_id_), text);
    if (absl::Status s = s_->store_->SetRunWarning(run_id_, text); !s.ok()) {
      spdlog::error("{}: cannot record the warning: {}", FormatRunId(run_id_), s.ToString());
    }
  }

  std::map<int, std::vector<int64_t>> coord_ids_;  // by selection
  Scheduler* s_;
  int64_t run_id_;
  std::shared_ptr<Active> active_;
  int keep_;
  int64_t start_step_ = 0;
};

Scheduler::Scheduler(SchedulerOptions options, store::Store* store, engine::Executor* executor, Clock* clock)
    : options_(std::move(options)),
      store_(store),
      executor_(executor),
      clock_(clock),
      hub_(options_.epoch, 1024, options_.heartbeat, static_cast<size_t>(std::max(1, options_.max_watchers))) {
  for (int i = 0; i < options_.cuda_devices; ++i) {
    const uint64_t memory = static_cast<size_t>(i) < options_.cuda_memory_bytes.size()
                                ? options_.cuda_memory_bytes[static_cast<size_t>(i)]
                                : 0;
    slots_.push_back({"cuda:" + std::to_string(i), true, "cuda:" + std::to_string(i), false, false, memory});
  }
  for (int i = 0; i < options_.cpu_slots; ++i) slots_.push_back({"cpu:" + std::to_string(i), false, "cpu"});
  for (int i = 0; options_.remote != nullptr && i < options_.remote_slots; ++i) {
    slots_.push_back({"worker:" + std::to_string(i), false, "cpu", false, true});
  }
  for (const Slot& s : slots_) slot_names_.push_back(s.name);
}

Scheduler::~Scheduler() { Drain(); }

Scheduler::Pack Scheduler::PackOf(const store::RunRow& row) const {
  // Only members of one sweep that never started (so have no checkpoint).
  if (options_.max_pack <= 1 || row.sweep_id <= 0 || row.attempts > 0) return {};
  v1::ExperimentSpec spec;
  if (!spec.ParseFromString(row.spec)) return {};
  return {std::to_string(row.sweep_id) + "/" + std::to_string(row.device_request) + "/" + engine::PackKey(spec),
          engine::EstimateRunMemoryBytes(spec)};
}

int Scheduler::PackRoomLocked(size_t slot, uint64_t memory) const {
  const Slot& me = slots_[slot];
  if (!me.cuda || me.memory == 0 || memory == 0) return options_.max_pack;
  const double fits = 0.9 * static_cast<double>(me.memory) / static_cast<double>(memory);
  return static_cast<int>(std::clamp(fits, 1.0, static_cast<double>(options_.max_pack)));
}

absl::Status Scheduler::Start() {
  // Runs a killed server left RUNNING go back to the queue; they resume from
  // their newest checkpoint when a worker takes them.
  CL_ASSIGN_OR_RETURN(std::vector<int64_t> orphans, store_->RunIdsInState(v1::RUN_STATE_RUNNING));
  for (int64_t id : orphans) {
    store::RunTransition t;
    t.state = v1::RUN_STATE_QUEUED;
    t.from_states = {v1::RUN_STATE_RUNNING};
    CL_RETURN_IF_ERROR(store_->TransitionRun(id, t));
    spdlog::info("recovered {}: re-queued after an unclean stop", FormatRunId(id));
  }
  CL_ASSIGN_OR_RETURN(std::vector<int64_t> queued, store_->RunIdsInState(v1::RUN_STATE_QUEUED));
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t id : queued) {
      CL_ASSIGN_OR_RETURN(store::RunRow row, store_->GetRun(id));
      const Pack pack = PackOf(row);
      queue_[{row.priority, id}] = {row.device_request, row.owner, pack.key, pack.memory};
      ++queued_per_owner_[row.owner];
    }
    started_ = true;
    for (size_t i = 0; i < slots_.size(); ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
  }
  spdlog::info("scheduler: {} device slot(s), {} run(s) queued", slots_.size(), queued.size());
  return absl::OkStatus();
}

void Scheduler::Drain() {
  std::vector<std::thread> workers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_ && workers_.empty()) return;
    draining_ = true;
    for (auto& [id, active] : active_) active->cancel.Request(StopReason::kPreempt);
    workers.swap(workers_);
  }
  work_cv_.notify_all();
  for (std::thread& w : workers) w.join();
  if (absl::Status s = store_->Flush(); !s.ok()) spdlog::error("final flush failed: {}", s.ToString());
}

absl::StatusOr<store::NewRun> Scheduler::PrepareRun(v1::ExperimentSpec spec, const std::string& owner) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_) return absl::UnavailableError("the server is shutting down; submit again after it restarts");
  }
  CL_RETURN_IF_ERROR(engine::ResolveSpec(options_.limits, &spec));
  if (const std::string& metric = spec.training().stop_metric(); !metric.empty()) {
    // Checked now rather than at the run's first evaluation.
    const std::vector<std::string> names = executor_->EvalMetricNames(spec);
    if (!names.empty() && std::find(names.begin(), names.end(), metric) == names.end()) {
      return absl::InvalidArgumentError("training.stop_metric " + Quote(metric) +
                                        " is not an evaluation metric of this task; it records " +
                                        absl::StrJoin(names, ", "));
    }
  }
  const v1::DeviceKind device = spec.resources().device();
  const bool have_cpu = options_.cpu_slots > 0 || (options_.remote != nullptr && options_.remote_slots > 0);
  const bool have_cuda = options_.cuda_devices > 0;
  if ((device == v1::DEVICE_KIND_CUDA && !have_cuda) || (device == v1::DEVICE_KIND_CPU && !have_cpu)) {
    return absl::FailedPreconditionError("resources.device is " + v1::DeviceKind_Name(device) +
                                         " but this server has no such device (slots: " +
                                         std::to_string(slots_.size()) + ")");
  }
  store::NewRun row;
  row.name = spec.name();
  row.spec = spec.SerializeAsString();
  google::protobuf::util::JsonPrintOptions json;
  json.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(spec, &row.spec_json, json).ok()) row.spec_json = "{}";
  row.state = v1::RUN_STATE_QUEUED;
  row.priority = spec.resources().priority();
  row.device_request = device;
  row.total_steps = static_cast<int64_t>(spec.training().steps());
  row.created_at_us = clock_->NowMicros();
  row.tags.assign(spec.tags().begin(), spec.tags().end());
  row.owner = owner;
  return row;
}

absl::Status Scheduler::CheckQueueRoom(int64_t count, const std::string& owner) {
  std::lock_guard<std::mutex> lock(mu_);
  return RoomLocked(static_cast<int>(std::min<int64_t>(count, 1 << 30)), owner);
}

absl::Status Scheduler::Reserve(int count, const std::string& owner) {
  std::lock_guard<std::mutex> lock(mu_);
  CL_RETURN_IF_ERROR(RoomLocked(count, owner));
  reserved_ += count;
  queued_per_owner_[owner] += count;
  return absl::OkStatus();
}

absl::Status Scheduler::RoomLocked(int count, const std::string& owner) {
  const int queued = static_cast<int>(queue_.size()) + reserved_;
  if (queued + count > options_.max_queued_runs) {
    return absl::ResourceExhaustedError(
        "the queue is full: " + std::to_string(queued) + " runs queued" +
        (count > 1 ? " and " + std::to_string(count) + " more asked for" : std::string()) +
        " (server limit --max-queued-runs=" + std::to_string(options_.max_queued_runs) + ")");
  }
  const int override_value = options_.quotas ? options_.quotas->For(owner).max_queued : 0;
  const int limit = LimitFor(override_value, options_.max_queued_per_client);
  if (queued_per_owner_[owner] + count > limit) {
    return absl::ResourceExhaustedError(
        "'" + EscapeControl(owner) + "' already has " + std::to_string(queued_per_owner_[owner]) + " runs queued" +
        (count > 1 ? " and asks for " + std::to_string(count) + " more" : std::string()) + " (" +
        LimitSource(override_value, owner, "max_queued", "--max-queued-per-client") + "=" + std::to_string(limit) +
        ")");
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Run> Scheduler::Submitted(const store::NewRun& row, int64_t id) {
  store::RunRow submitted;
  submitted.id = id;
  submitted.name = row.name;
  submitted.spec = row.spec;
  submitted.state = row.state;
  submitted.priority = row.priority;
  submitted.device_request = row.device_request;
  submitted.created_at_us = row.created_at_us;
  submitted.total_steps = row.total_steps;
  submitted.tags = row.tags;
  submitted.owner = row.owner;
  submitted.sweep_id = row.sweep_id;
  return ToRun(submitted);
}

absl::StatusOr<v1::Run> Scheduler::Submit(v1::ExperimentSpec spec, const std::string& owner) {
  CL_ASSIGN_OR_RETURN(store::NewRun row, PrepareRun(std::move(spec), owner));
  // Reserve the queue place before the insert, so concurrent submissions
  // cannot overshoot the limits; give it back if the insert fails.
  CL_RETURN_IF_ERROR(Reserve(1, owner));
  absl::StatusOr<int64_t> inserted = store_->InsertRun(row);
  {
    std::lock_guard<std::mutex> lock(mu_);
    --reserved_;
    if (inserted.ok()) {
      queue_[{row.priority, *inserted}] = {row.device_request, owner, ""};
    } else {
      --queued_per_owner_[owner];
    }
  }
  if (!inserted.ok()) return inserted.status();
  const int64_t id = *inserted;
  spdlog::info("submitted {} ({}, {} steps) from {}", FormatRunId(id), EscapeControl(row.name), row.total_steps,
               EscapeControl(owner));
  // The answer is the run as submitted (QUEUED), built before a worker can
  // take it.
  absl::StatusOr<v1::Run> run = Submitted(row, id);
  work_cv_.notify_all();
  return run;
}

absl::StatusOr<std::pair<int64_t, std::vector<int64_t>>> Scheduler::SubmitSweep(const store::NewSweep& sweep,
                                                                                std::vector<store::NewRun> rows,
                                                                                const std::string& owner) {
  const int count = static_cast<int>(rows.size());
  CL_RETURN_IF_ERROR(Reserve(count, owner));
  absl::StatusOr<std::pair<int64_t, std::vector<int64_t>>> inserted = store_->InsertSweep(sweep, rows);
  {
    std::lock_guard<std::mutex> lock(mu_);
    reserved_ -= count;
    if (inserted.ok()) {
      for (size_t i = 0; i < rows.size(); ++i) {
        store::RunRow as_row;
        as_row.spec = rows[i].spec;
        as_row.sweep_id = inserted->first;
        as_row.device_request = rows[i].device_request;
        const Pack pack = PackOf(as_row);
        queue_[{rows[i].priority, inserted->second[i]}] = {rows[i].device_request, owner, pack.key, pack.memory};
      }
    } else {
      queued_per_owner_[owner] -= count;
    }
  }
  if (!inserted.ok()) return inserted.status();
  spdlog::info("submitted sweep {} ({}, {} runs) from {}", FormatSweepId(inserted->first), EscapeControl(sweep.name),
               count, EscapeControl(owner));
  work_cv_.notify_all();
  return inserted;
}

void Scheduler::NoteStorage(int64_t run_id, const absl::Status& write) {
  std::lock_guard<std::mutex> lock(mu_);
  if (write.ok()) {
    storage_faults_.erase(run_id);
  } else {
    storage_faults_[run_id] = FormatRunId(run_id) + ": " + std::string(write.message());
  }
}

std::string Scheduler::StorageFault() {
  std::lock_guard<std::mutex> lock(mu_);
  return storage_faults_.empty() ? "" : storage_faults_.begin()->second;
}

absl::StatusOr<v1::Run> Scheduler::ToRun(const store::RunRow& row) {
  v1::Run run;
  run.set_run_id(FormatRunId(row.id));
  run.set_name(row.name);
  if (!run.mutable_spec()->ParseFromString(row.spec)) {
    return absl::DataLossError("stored spec of " + FormatRunId(row.id) + " does not parse");
  }
  run.set_state(static_cast<v1::RunState>(row.state));
  for (const std::string& t : row.tags) run.add_tags(t);
  *run.mutable_created_at() = ToTimestamp(row.created_at_us);
  if (row.started_at_us > 0) *run.mutable_started_at() = ToTimestamp(row.started_at_us);
  if (row.finished_at_us > 0) *run.mutable_finished_at() = ToTimestamp(row.finished_at_us);
  run.set_device(row.device);
  run.set_error(row.error);
  run.set_attempts(static_cast<uint32_t>(row.attempts));
  run.set_checkpoint_step(static_cast<uint64_t>(row.checkpoint_step));
  if (row.sweep_id > 0) run.set_sweep_id(FormatSweepId(row.sweep_id));
  run.set_warning(row.warning);
  run.set_owner(row.owner);
  v1::Progress* p = run.mutable_progress();
  // A run resumed after a restart has reached at least its checkpoint, before
  // its first progress report says so (issue 32 item 10).
  p->set_step(static_cast<uint64_t>(std::max(row.step, row.checkpoint_step)));
  p->set_total_steps(static_cast<uint64_t>(row.total_steps));
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = active_.find(row.id); it != active_.end()) {
    const Active& a = *it->second;
    // A checkpoint written since the last progress report is progress too.
    p->set_step(static_cast<uint64_t>(std::max({a.step, row.step, row.checkpoint_step})));
    p->set_steps_per_second(a.rate);
    if (a.rate > 0) p->set_eta_seconds(static_cast<double>(a.total - a.step) / a.rate);
  }
  return run;
}

absl::StatusOr<v1::Run> Scheduler::GetRun(const std::string& run_id) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseRunId(run_id));
  CL_ASSIGN_OR_RETURN(store::RunRow row, store_->GetRun(id));
  CL_ASSIGN_OR_RETURN(v1::Run run, ToRun(row));
  CL_ASSIGN_OR_RETURN(auto latest, store_->LatestMetrics(id));
  run.mutable_progress()->mutable_latest()->insert(latest.begin(), latest.end());
  return run;
}

int Scheduler::QueueLimitFor(const std::string& owner) const {
  return LimitFor(options_.quotas ? options_.quotas->For(owner).max_queued : 0, options_.max_queued_per_client);
}

int Scheduler::WatchLimitFor(const std::string& owner) const {
  return LimitFor(options_.quotas ? options_.quotas->For(owner).max_watches : 0, options_.max_watchers_per_client);
}

absl::StatusOr<std::string> Scheduler::OwnerOf(const std::string& run_id) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseRunId(run_id));
  CL_ASSIGN_OR_RETURN(store::RunRow row, store_->GetRun(id));
  return row.owner;
}

absl::StatusOr<v1::ListRunsResponse> Scheduler::ListRuns(const v1::ListRunsRequest& request,
                                                         std::optional<std::string> owner) {
  if (request.page_size() < 0 || request.page_size() > kMaxPageSize) {
    return absl::InvalidArgumentError("page_size must be in [0, " + std::to_string(kMaxPageSize) + "], got " +
                                      std::to_string(request.page_size()));
  }
  store::RunFilter filter;
  filter.limit = request.page_size() == 0 ? kDefaultPageSize : request.page_size();
  filter.max_bytes = kMaxListBytes;
  for (int s : request.states()) {
    if (!v1::RunState_IsValid(s) || s == v1::RUN_STATE_UNSPECIFIED) {
      return absl::InvalidArgumentError("states contains an unknown run state: " + std::to_string(s));
    }
    filter.states.push_back(s);
  }
  if (request.tags_size() > 32) {
    return absl::InvalidArgumentError("tags must have at most 32 entries, got " + std::to_string(request.tags_size()));
  }
  filter.tags.assign(request.tags().begin(), request.tags().end());
  if (!request.sweep_id().empty()) {
    CL_ASSIGN_OR_RETURN(filter.sweep_id, ParseSweepId(request.sweep_id()));
  }
  if (!request.page_token().empty()) {
    CL_ASSIGN_OR_RETURN(filter.before_id, ParseRunId(request.page_token(), "page_token"));
  }
  filter.owner = std::move(owner);
  CL_ASSIGN_OR_RETURN(store::RunPage page, store_->ListRuns(filter));
  v1::ListRunsResponse out;
  out.set_total_size(page.total);
  for (const store::RunRow& row : page.runs) {
    CL_ASSIGN_OR_RETURN(*out.add_runs(), ToRun(row));
  }
  if ((page.cut || static_cast<int>(page.runs.size()) == filter.limit) && page.runs.back().id > 1) {
    // Another page exists only if some matching run has a smaller id.
    store::RunFilter probe = filter;
    probe.before_id = page.runs.back().id;
    probe.limit = 1;
    CL_ASSIGN_OR_RETURN(store::RunPage next, store_->ListRuns(probe));
    if (!next.runs.empty()) out.set_next_page_token(FormatRunId(page.runs.back().id));
  }
  return out;
}

constexpr std::chrono::seconds kWindDownWait{10};

absl::StatusOr<int64_t> Scheduler::DeleteRuns(const std::vector<int64_t>& ids, int64_t sweep_id) {
  for (int64_t id : ids) {
    bool active = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      active = active_.count(id) > 0;
    }
    if (!active) continue;
    CL_ASSIGN_OR_RETURN(store::RunRow row, store_->GetRun(id));
    if (!IsFinal(row.state)) {
      return absl::FailedPreconditionError("run " + FormatRunId(id) +
                                           " has not ended; cancel it first (circuitlab cancel " + FormatRunId(id) +
                                           ")");
    }
    // Its end is recorded (a watcher has seen it) and its slot is letting go
    // of it: a delete right after the end waits for that, briefly, instead of
    // refusing. (A pack member that stopped early is held until its pack
    // ends, which may take longer.)
    std::unique_lock<std::mutex> lock(mu_);
    if (!work_cv_.wait_for(lock, kWindDownWait, [&] { return active_.count(id) == 0; })) {
      return absl::FailedPreconditionError("run " + FormatRunId(id) +
                                           " has ended but its slot still holds it (a pack still training); try "
                                           "again in a moment");
    }
  }
  CL_ASSIGN_OR_RETURN(int64_t freed,
                      store_->DeleteRuns(ids, {v1::RUN_STATE_SUCCEEDED, v1::RUN_STATE_FAILED, v1::RUN_STATE_CANCELLED},
                                         sweep_id));
  spdlog::info("deleted {} run(s){}, {} checkpoint bytes freed", ids.size(),
               sweep_id > 0 ? " and sweep " + FormatSweepId(sweep_id) : "", freed);
  std::function<void(const std::vector<int64_t>&)> deleted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    deleted = on_deleted_;
  }
  if (deleted) deleted(ids);
  return freed;
}

absl::StatusOr<v1::DeleteRunResponse> Scheduler::Delete(const std::string& run_id) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseRunId(run_id));
  CL_ASSIGN_OR_RETURN(store::RunRow row, store_->GetRun(id));
  if (row.sweep_id > 0) {
    return absl::FailedPreconditionError("run " + run_id + " belongs to sweep " + FormatSweepId(row.sweep_id) +
                                         "; delete the sweep (circuitlab rm " + FormatSweepId(row.sweep_id) + ")");
  }
  CL_ASSIGN_OR_RETURN(int64_t freed, DeleteRuns({id}));
  v1::DeleteRunResponse out;
  out.set_run_id(FormatRunId(id));
  out.set_freed_bytes(static_cast<uint64_t>(freed));
  return out;
}

absl::StatusOr<v1::Run> Scheduler::Cancel(const std::string& run_id) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseRunId(run_id));
  CL_ASSIGN_OR_RETURN(store::RunRow row, store_->GetRun(id));
  // A run whose end is recorded has ended, even while its worker is still
  // winding down (it is then still in active_).
  if (IsFinal(row.state)) {
    return absl::FailedPreconditionError("run " + run_id + " already ended (" + StateName(row.state) + ")");
  }
  bool was_queued = false;
  {
    std::unique_lock<std::mutex> lock(mu_);
    auto q = queue_.find({row.priority, id});
    if (q != queue_.end()) {
      --queued_per_owner_[q->second.owner];
      queue_.erase(q);
      was_queued = true;
    } else if (auto a = active_.find(id); a != active_.end()) {
      // The worker stops at the next step and records CANCELLED; RPC threads
      // never wait for it.
      a->second->cancel.Request(StopReason::kCancel);
    } else if (row.state == v1::RUN_STATE_QUEUED) {
      was_queued = true;  // queued but not in memory: re-queued by a drain
    }
  }
  if (was_queued) {
    store::RunTransition t;
    t.state = v1::RUN_STATE_CANCELLED;
    t.finished_at_us = clock_->NowMicros();
    t.from_states = {v1::RUN_STATE_QUEUED};
    CL_RETURN_IF_ERROR(Transition(id, t));
  }
  return GetRun(run_id);
}

absl::StatusOr<v1::GetMetricsResponse> Scheduler::GetMetrics(const v1::GetMetricsRequest& request) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseRunId(request.run_id()));
  if (request.names_size() > kMaxMetricNames) {
    return absl::InvalidArgumentError("names must have at most " + std::to_string(kMaxMetricNames) +
                                      " entries, got " + std::to_string(request.names_size()));
  }
  CL_RETURN_IF_ERROR(ValidateSeriesRange(request.min_step(), request.max_step(), request.max_points()));
  CL_RETURN_IF_ERROR(store_->GetRun(id).status());
  store::MetricQuery q;
  q.names.assign(request.names().begin(), request.names().end());
  q.min_step = static_cast<int64_t>(request.min_step());
  q.max_step = static_cast<int64_t>(request.max_step());
  q.max_points = static_cast<int>(request.max_points() == 0 ? kDefaultMetricPoints : request.max_points());
  q.max_total_points = kMaxPointsPerResponse;
  CL_ASSIGN_OR_RETURN(std::vector<store::MetricSeries> series, store_->GetMetrics(id, q));
  v1::GetMetricsResponse out;
  for (store::MetricSeries& s : series) {
    v1::MetricSeries* o = out.add_series();
    o->set_name(s.name);
    o->mutable_steps()->Add(s.steps.begin(), s.steps.end());
    o->mutable_values()->Add(s.values.begin(), s.values.end());
    o->set_total_points(static_cast<uint64_t>(s.total_points));
  }
  return out;
}

absl::StatusOr<Watch> Scheduler::StartWatch(const v1::WatchRunRequest& request, const std::string& owner) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseRunId(request.run_id()));
  CL_RETURN_IF_ERROR(store_->GetRun(id).status());
  Watch w;
  w.run_id = id;
  w.owner = owner;
  {
    const int override_value = options_.quotas ? options_.quotas->For(owner).max_watches : 0;
    const int limit = LimitFor(override_value, options_.max_watchers_per_client);
    std::lock_guard<std::mutex> lock(mu_);
    if (watches_per_owner_[owner] >= limit) {
      return absl::ResourceExhaustedError(
          "'" + EscapeControl(owner) + "' already has " + std::to_string(watches_per_owner_[owner]) +
          " open watch streams (" + LimitSource(override_value, owner, "max_watches", "--max-watches-per-client") +
          "=" + std::to_string(limit) + "); close some and retry");
    }
    ++watches_per_owner_[owner];
  }
  w.subscriber = hub_.Subscribe(id, request.after_sequence(), request.epoch(), request.include_metrics());
  if (w.subscriber == nullptr) {
    ReleaseWatch(owner);
    return absl::ResourceExhaustedError("too many open watch streams (server limit --max-watchers=" +
                                        std::to_string(options_.max_watchers) + "); close some and retry");
  }
  return w;
}

void Scheduler::ReleaseWatch(const std::string& owner) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = watches_per_owner_.find(owner); it != watches_per_owner_.end() && --it->second <= 0) {
    watches_per_owner_.erase(it);
  }
}

void Scheduler::StopWatch(const Watch& watch) {
  hub_.Unsubscribe(watch.run_id, watch.subscriber);
  ReleaseWatch(watch.owner);
}

absl::StatusOr<v1::RunEvent> Scheduler::Snapshot(int64_t run_id, uint64_t sequence, bool resync) {
  v1::RunEvent ev;
  CL_ASSIGN_OR_RETURN(*ev.mutable_snapshot(), GetRun(FormatRunId(run_id)));
  ev.set_sequence(sequence);
  ev.set_epoch(hub_.epoch());
  ev.set_resync(resync);
  return ev;
}

absl::Status Scheduler::Transition(int64_t run_id, const store::RunTransition& t) {
  CL_RETURN_IF_ERROR(store_->TransitionRun(run_id, t));
  // Persisted first, announced second.
  hub_.Publish(run_id, StateEvent(t.state, t.device.value_or(""), t.error.value_or("")));
  if (IsFinal(t.state)) {
    hub_.Close(run_id);
    std::lock_guard<std::mutex> lock(mu_);
    ++finished_[t.state];
  }
  return absl::OkStatus();
}

std::map<int, uint64_t> Scheduler::FinishedRuns() {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_;
}

int Scheduler::OpenWatches() {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const auto& [owner, count] : watches_per_owner_) n += count;
  return n;
}

int64_t Scheduler::PickLocked(size_t slot) {
  const Slot& me = slots_[slot];
  const bool idle_cuda = std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.cuda && !s.busy; });
  for (const auto& [key, q] : queue_) {
    const bool fits = q.device_request == v1::DEVICE_KIND_CPU    ? !me.cuda
                      : q.device_request == v1::DEVICE_KIND_CUDA ? me.cuda
                                                                 : (me.cuda || !idle_cuda);
    if (!fits) continue;
    // A remote slot holds a free worker slot before it takes the run.
    if (me.remote && !options_.remote->TryAcquire()) return 0;
    return key.id;
  }
  return 0;
}

void Scheduler::Wake() {
  { std::lock_guard<std::mutex> lock(mu_); }
  work_cv_.notify_all();
}

int Scheduler::QueuedRuns() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(queue_.size());
}

void Scheduler::WorkerLoop(size_t slot) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    int64_t id = 0;
    work_cv_.wait(lock, [&] { return draining_ || (id = PickLocked(slot)) != 0; });
    if (draining_) return;
    auto it = std::find_if(queue_.begin(), queue_.end(), [&](const auto& e) { return e.first.id == id; });
    const std::string pack = it->second.pack;
    const int room = PackRoomLocked(slot, it->second.memory);
    std::vector<int64_t> ids = {id};
    --queued_per_owner_[it->second.owner];
    queue_.erase(it);
    // Queued members of the same sweep that differ only in their seed train
    // with it as one ensemble (as many as the slot's device memory holds).
    for (auto q = queue_.begin(); !pack.empty() && q != queue_.end() && static_cast<int>(ids.size()) < room;) {
      if (q->second.pack != pack) {
        ++q;
        continue;
      }
      ids.push_back(q->first.id);
      --queued_per_owner_[q->second.owner];
      q = queue_.erase(q);
    }
    std::vector<std::shared_ptr<Active>> mine;
    for (int64_t m : ids) mine.push_back(active_[m] = std::make_shared<Active>());
    slots_[slot].busy = true;
    lock.unlock();
    Execute(slot, ids);
    if (slots_[slot].remote) options_.remote->Release();
    lock.lock();
    // A run requeued inside Execute (its worker was lost) may already run
    // again on another slot under a new entry: only ours is removed.
    for (size_t i = 0; i < ids.size(); ++i) {
      if (auto it = active_.find(ids[i]); it != active_.end() && it->second == mine[i]) active_.erase(it);
    }
    slots_[slot].busy = false;
    work_cv_.notify_all();  // a run waiting for "any" device may now fit elsewhere
  }
}

std::optional<engine::TrainRequest> Scheduler::StartRun(const Slot& dev, int64_t id, Active& active) {
  absl::StatusOr<store::RunRow> row = store_->GetRun(id);
  if (!row.ok()) {
    FailRun(id, row.status());
    return std::nullopt;
  }
  engine::TrainRequest request;
  if (!request.spec.ParseFromString(row->spec)) {
    FailRun(id, absl::DataLossError("stored spec does not parse"));
    return std::nullopt;
  }
  store::RunTransition running;
  running.state = v1::RUN_STATE_RUNNING;
  running.device = dev.name;
  running.started_at_us = clock_->NowMicros();
  running.increment_attempts = true;
  running.from_states = {v1::RUN_STATE_QUEUED};
  if (absl::Status s = Transition(id, running); !s.ok()) {
    spdlog::error("{} could not start: {}", FormatRunId(id), s.ToString());
    return std::nullopt;
  }
  // A damaged newest checkpoint (a torn write, a bad disk) is passed over
  // for the newest intact one, or step 0; the run says so (Run.warning).
  std::vector<std::string> skipped;
  absl::StatusOr<std::optional<store::Checkpoint>> ckpt = store_->LatestIntactCheckpoint(id, &skipped);
  if (!ckpt.ok()) {
    FailRun(id, ckpt.status());
    return std::nullopt;
  }
  if (!skipped.empty()) {
    const std::string warning =
        "resumed from " + (*ckpt ? "the checkpoint at step " + std::to_string((*ckpt)->step) : std::string("step 0")) +
        ", passing over damaged checkpoints (" + absl::StrJoin(skipped, "; ") + ")";
    spdlog::warn("{}: {}", FormatRunId(id), warning);
    if (absl::Status s = store_->SetRunWarning(id, warning); !s.ok()) {
      spdlog::error("{}: cannot record the warning: {}", FormatRunId(id), s.ToString());
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    active.total = row->total_steps;
    active.step = *ckpt ? (*ckpt)->step : 0;
  }
  if (*ckpt) {
    spdlog::info("{} resumes from its checkpoint at step {}", FormatRunId(id), (*ckpt)->step);
    request.resume_from = std::move((*ckpt)->bytes);
  }
  request.device = dev.torch_device;
  request.cancel = &active.cancel;
  request.intra_op_threads = options_.intra_op_threads;
  return request;
}

void Scheduler::Execute(size_t slot, const std::vector<int64_t>& ids) {
  const Slot& dev = slots_[slot];
  std::vector<int64_t> members;
  std::vector<engine::TrainRequest> requests;
  std::vector<std::unique_ptr<RunObserver>> observers;
  for (int64_t id : ids) {
    std::shared_ptr<Active> active;
    {
      std::lock_guard<std::mutex> lock(mu_);
      active = active_[id];
    }
    std::optional<engine::TrainRequest> request = StartRun(dev, id, *active);
    if (!request) continue;
    observers.push_back(std::make_unique<RunObserver>(this, id, active,
                                                      static_cast<int>(request->spec.recording().keep_checkpoints())));
    requests.push_back(std::move(*request));
    members.push_back(id);
  }
  if (members.empty()) return;
  if (members.size() == 1) {
    spdlog::info("{} running on {}", FormatRunId(members[0]), dev.name);
    Finish(members[0], executor_->Train(requests[0], *observers[0]));
    return;
  }
  std::string names;
  for (int64_t id : members) names += (names.empty() ? "" : ",") + FormatRunId(id);
  spdlog::info("{} run(s) packed as one ensemble on {}: {}", members.size(), dev.name, names);
  std::vector<engine::TrainObserver*> raw;
  for (auto& o : observers) raw.push_back(o.get());
  const std::vector<absl::StatusOr<engine::TrainOutcome>> outcomes = executor_->TrainPack(requests, raw);
  for (size_t i = 0; i < members.size(); ++i) {
    Finish(members[i], i < outcomes.size() ? outcomes[i]
                                           : absl::StatusOr<engine::TrainOutcome>(
                                                 absl::InternalError("the executor answered for fewer runs")));
  }
}

void Scheduler::FailRun(int64_t id, const absl::Status& why) {
  spdlog::error("{} failed: {}", FormatRunId(id), why.ToString());
  store::RunTransition t;
  t.state = v1::RUN_STATE_FAILED;
  t.error = why.ToString();
  t.finished_at_us = clock_->NowMicros();
  if (absl::Status s = Transition(id, t); !s.ok()) spdlog::error("cannot record failure: {}", s.ToString());
}

void Scheduler::Finish(int64_t id, const absl::StatusOr<engine::TrainOutcome>& outcome) {
  std::pair<int, std::string> lost;
  {
    std::lock_guard<std::mutex> lock(mu_);
    storage_faults_.erase(id);  // this attempt writes no more
    if (auto it = lost_.find(id); it != lost_.end()) {
      lost = it->second;
      const bool again = outcome.ok() && outcome->end == engine::TrainEnd::kPreempted;
      if (!again || lost.first >= options_.max_lost_leases) lost_.erase(it);
    }
  }
  if (outcome.ok() && outcome->end == engine::TrainEnd::kPreempted && lost.first >= options_.max_lost_leases) {
    return FailRun(id, absl::UnavailableError("its worker was lost " + std::to_string(lost.first) +
                                              " times (--max-lost-leases); the last: " + lost.second));
  }
  if (!outcome.ok()) return FailRun(id, outcome.status());
  store::RunTransition end;
  switch (outcome->end) {
    case engine::TrainEnd::kCompleted:
      end.state = v1::RUN_STATE_SUCCEEDED;
      break;
    case engine::TrainEnd::kCancelled:
      end.state = v1::RUN_STATE_CANCELLED;
      break;
    case engine::TrainEnd::kPreempted:
      end.state = v1::RUN_STATE_QUEUED;  // resumes on the next start
      break;
  }
  if (IsFinal(end.state)) end.finished_at_us = clock_->NowMicros();
  end.from_states = {v1::RUN_STATE_RUNNING};
  store_->RecordProgress(id, outcome->last_step);  // committed with the transition below
  if (absl::Status s = Transition(id, end); !s.ok()) {
    spdlog::error("{}: cannot record the end of the run: {}", FormatRunId(id), s.ToString());
    return;
  }
  spdlog::info("{} {} at step {}", FormatRunId(id), StateName(end.state), outcome->last_step);
  if (end.state == v1::RUN_STATE_QUEUED) Requeue(id);
}

void Scheduler::Requeue(int64_t id) {
  absl::StatusOr<store::RunRow> row = store_->GetRun(id);
  if (!row.ok()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_) return;  // the next start loads it
    queue_[{row->priority, id}] = {row->device_request, row->owner, ""};
    ++queued_per_owner_[row->owner];
  }
  spdlog::info("{} queued again; it resumes from its newest checkpoint", FormatRunId(id));
  work_cv_.notify_all();
}

}  // namespace circuitlab::scheduler
