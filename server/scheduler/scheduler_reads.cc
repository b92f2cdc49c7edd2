// The scheduler's reads and edits of runs: a run as the API shows it, pages of
// runs, deletion, cancellation, metric series, watches and state transitions.
#include "server/scheduler/scheduler.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"

#include <google/protobuf/util/time_util.h>

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
  for (absl::string_view other : absl::StrSplit(row.packed_with, ',', absl::SkipEmpty())) {
    run.add_packed_with(std::string(other));
  }
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

}  // namespace circuitlab::scheduler
