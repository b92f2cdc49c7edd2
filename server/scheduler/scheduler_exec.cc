// Running runs: the device slots' worker loops, placing a queued run (packs
// of members on one slot), the observer that forwards a run's progress to the
// store and its watchers, and the end of a run (finished, failed, requeued).
#include "server/scheduler/scheduler.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
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
#include "server/common/status_macros.h"
#include "server/common/text.h"


namespace circuitlab::scheduler {

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

int64_t Scheduler::PickLocked(size_t slot) {
  const Slot& me = slots_[slot];
  // A remote GPU slot waits for a GPU worker: "idle" says nothing there.
  const bool idle_cuda =
      std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.cuda && !s.busy && !s.remote; });
  for (const auto& [key, q] : queue_) {
    const bool fits = me.remote && me.cuda                     ? q.device_request == v1::DEVICE_KIND_CUDA
                      : q.device_request == v1::DEVICE_KIND_CPU  ? !me.cuda
                      : q.device_request == v1::DEVICE_KIND_CUDA ? me.cuda
                                                                 : (me.cuda || !idle_cuda);
    if (!fits) continue;
    // A remote slot holds a free worker slot before it takes the run.
    if (me.remote && !options_.remote->TryAcquire(me.cuda)) return 0;
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

int Scheduler::QueuedRuns(bool cuda) {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(std::count_if(queue_.begin(), queue_.end(), [&](const auto& e) {
    return (e.second.device_request == v1::DEVICE_KIND_CUDA) == cuda;
  }));
}

void Scheduler::WorkerLoop(size_t slot) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    int64_t id = 0;
    work_cv_.wait(lock, [&] { return draining_ || (id = PickLocked(slot)) != 0; });
    if (draining_) return;
    auto it = std::find_if(queue_.begin(), queue_.end(), [&](const auto& e) { return e.first.id == id; });
    const std::string pack = it->second.pack;
    const int room = PackRoomLocked(slot, it->second);
    std::vector<int64_t> ids = {id};
    --queued_per_owner_[it->second.owner];
    queue_.erase(it);
    // Queued members of its pack key (engine::PackKey: the same spec but for
    // the seed and the settings a pack lets its members differ in) train
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
    if (slots_[slot].remote) options_.remote->Release(slots_[slot].cuda);
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
  running.packed_with = "";  // Execute names the pack once its members started
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
  // Each member's detail names the others (Run.packed_with).
  for (int64_t id : members) {
    std::string others;
    for (int64_t o : members) {
      if (o != id) absl::StrAppend(&others, others.empty() ? "" : ",", FormatRunId(o));
    }
    store::RunTransition packed;
    packed.state = v1::RUN_STATE_RUNNING;
    packed.packed_with = std::move(others);
    packed.from_states = {v1::RUN_STATE_RUNNING};
    // Detail, not a state change: stored, not announced to watchers.
    if (absl::Status s = store_->TransitionRun(id, packed); !s.ok()) {
      spdlog::warn("{}: {}", FormatRunId(id), s.ToString());
    }
  }
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
