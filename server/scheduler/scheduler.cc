#include "server/scheduler/scheduler.h"

#include <google/protobuf/util/json_util.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"

namespace circuitlab::scheduler {
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
  for (int i = 0; options_.remote != nullptr && i < options_.remote_gpu_slots; ++i) {
    slots_.push_back({"worker-gpu:" + std::to_string(i), true, "cuda:0", false, true});
  }
  for (const Slot& s : slots_) slot_names_.push_back(s.name);
}

Scheduler::~Scheduler() { Drain(); }

Scheduler::Pack Scheduler::PackOf(const store::RunRow& row) const {
  // Only sweep members that never started (so have no checkpoint). Members
  // of different sweeps of one owner pack too: a reproduction makes one sweep
  // per seed, so its seeds of one experiment differ only in their seed.
  if (options_.max_pack <= 1 || row.sweep_id <= 0 || row.attempts > 0) return {};
  v1::ExperimentSpec spec;
  if (!spec.ParseFromString(row.spec)) return {};
  return {absl::StrCat(row.owner, "/", row.priority, "/", row.device_request, "/", engine::PackKey(spec)),
          engine::EstimateRunMemoryBytes(spec), engine::SpecFamilyOf(spec).PacksOnCpu(spec)};
}

int Scheduler::PackRoomLocked(size_t slot, const Queued& q) const {
  const Slot& me = slots_[slot];
  const uint64_t memory = q.memory;
  // A remote slot's device is the worker's: it decides nothing here.
  if (!me.cuda && !me.remote) return q.packs_on_cpu ? options_.max_pack : 1;
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
      queue_[{row.priority, id}] = {row.device_request, row.owner, pack.key, pack.memory, pack.packs_on_cpu};
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
  const bool have_cuda = options_.cuda_devices > 0 || (options_.remote != nullptr && options_.remote_gpu_slots > 0);
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
        as_row.owner = owner;
        as_row.priority = rows[i].priority;
        const Pack pack = PackOf(as_row);
        queue_[{rows[i].priority, inserted->second[i]}] = {rows[i].device_request, owner, pack.key, pack.memory,
                                                             pack.packs_on_cpu};
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

}  // namespace circuitlab::scheduler
