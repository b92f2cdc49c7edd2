#include "server/scheduler/analysis_jobs.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "server/common/seeds.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/common/thread_cancel.h"
#include "server/scheduler/scheduler.h"

namespace circuitlab::scheduler {

AnalysisJobs::AnalysisJobs(store::Store* store, AnalysisJobOptions options) : store_(store), options_(options) {
  for (int i = 0; i < std::max(1, options_.workers); ++i) workers_.emplace_back([this] { WorkerLoop(); });
  timer_ = std::thread([this] { TimerLoop(); });
}

AnalysisJobs::~AnalysisJobs() { Shutdown(); }

namespace {

using Field = google::protobuf::FieldDescriptor;

// The job fields of an analysis response, by name (null when it has none).
struct JobFields {
  const Field* state = nullptr;
  const Field* progress = nullptr;
  const Field* error = nullptr;
  const Field* job_id = nullptr;
  const Field* from_store = nullptr;
};

absl::StatusOr<JobFields> JobFieldsOf(const google::protobuf::Descriptor* d) {
  const auto field = [d](const char* name, Field::CppType type) {
    const Field* f = d->FindFieldByName(name);
    return f != nullptr && f->cpp_type() == type && !f->is_repeated() ? f : nullptr;
  };
  JobFields j{field("state", Field::CPPTYPE_ENUM), field("progress", Field::CPPTYPE_DOUBLE),
              field("error", Field::CPPTYPE_STRING), field("job_id", Field::CPPTYPE_STRING),
              field("from_store", Field::CPPTYPE_BOOL)};
  if (j.state == nullptr || j.progress == nullptr) {
    return absl::InternalError(d->name() + " has no state and progress fields");
  }
  return j;
}

}  // namespace

absl::Status FillFromAnswer(const AnalysisAnswer& a, google::protobuf::Message* response) {
  if (a.state == v1::ANALYSIS_STATE_FAILED && IsRequestError(a.failure)) return a.failure;
  CL_ASSIGN_OR_RETURN(const JobFields j, JobFieldsOf(response->GetDescriptor()));
  const google::protobuf::Reflection* r = response->GetReflection();
  response->Clear();
  if (a.result && response->ParseFromString(*a.result)) {
    if (j.from_store != nullptr) r->SetBool(response, j.from_store, a.from_store);
    r->SetEnumValue(response, j.state, v1::ANALYSIS_STATE_DONE);
    r->SetDouble(response, j.progress, 1.0);
    return absl::OkStatus();
  }
  response->Clear();
  if (j.job_id != nullptr) r->SetString(response, j.job_id, a.job_id);
  return UpdatePending(a, response);
}

absl::Status UpdatePending(const AnalysisAnswer& a, google::protobuf::Message* response) {
  CL_ASSIGN_OR_RETURN(const JobFields j, JobFieldsOf(response->GetDescriptor()));
  const google::protobuf::Reflection* r = response->GetReflection();
  r->SetEnumValue(response, j.state, a.state);
  r->SetDouble(response, j.progress, a.progress);
  if (j.error != nullptr) r->SetString(response, j.error, a.error);
  return absl::OkStatus();
}

bool IsPendingResponse(const google::protobuf::Message& response) {
  absl::StatusOr<JobFields> j = JobFieldsOf(response.GetDescriptor());
  return j.ok() && IsPending(response.GetReflection()->GetEnumValue(response, j->state));
}

std::string JobIdOf(const google::protobuf::Message& response) {
  absl::StatusOr<JobFields> j = JobFieldsOf(response.GetDescriptor());
  return j.ok() && j->job_id != nullptr ? response.GetReflection()->GetString(response, j->job_id) : std::string();
}

AnalysisAnswer AnalysisJobs::AnswerOf(const Job& job) {
  AnalysisAnswer a;
  a.state = job.state;
  a.progress = job.progress;
  a.error = job.error;
  a.failure = job.failure;
  a.job_id = job.id;
  return a;
}

v1::AnalysisJob AnalysisJobs::Describe(const Job& job) {
  v1::AnalysisJob out;
  out.set_job_id(job.id);
  out.set_kind(job.request.kind);
  if (job.request.run_id != store::Store::kNoRun) out.set_run_id(FormatRunId(job.request.run_id));
  out.set_state(job.state);
  out.set_progress(job.progress);
  out.set_owner(job.request.owner);
  out.set_memory_bytes(job.request.memory_bytes);
  out.set_error(job.error);
  return out;
}

absl::Status AnalysisJobs::Admit(const AnalysisJobRequest& request) const {
  if (request.memory_bytes > options_.memory_budget_bytes) {
    return absl::ResourceExhaustedError(request.kind + " needs about " + std::to_string(request.memory_bytes >> 20) +
                                        " MiB, more than the server's analysis memory budget (--analysis-memory-mb " +
                                        std::to_string(options_.memory_budget_bytes >> 20) +
                                        "); ask for fewer samples");
  }
  if (active_ >= options_.max_active) {
    return absl::ResourceExhaustedError("too many analysis jobs queued or running (" + std::to_string(active_) +
                                        "); ask again later");
  }
  if (request.read_only) {
    return absl::PermissionDeniedError("'" + EscapeControl(request.owner) + "' has the reader role: it may read " +
                                       "stored " + request.kind + " answers but not start an analysis");
  }
  const int override_value = options_.quotas ? options_.quotas->For(request.owner).max_analyses : 0;
  const int limit = ActiveLimitFor(request.owner);
  auto it = active_per_owner_.find(request.owner);
  if (it != active_per_owner_.end() && it->second >= limit) {
    return absl::ResourceExhaustedError(
        "'" + EscapeControl(request.owner) + "' has " + std::to_string(it->second) +
        " analysis jobs queued or running (" +
        LimitSource(override_value, request.owner, "max_analyses", "--max-analysis-jobs-per-client") + "=" +
        std::to_string(limit) + "); ask again later");
  }
  return absl::OkStatus();
}

absl::StatusOr<AnalysisAnswer> AnalysisJobs::Submit(AnalysisJobRequest request, bool force) {
  const int64_t hash = static_cast<int64_t>(HashPurpose(request.key + request.version) >> 1);
  if (!force) {
    CL_ASSIGN_OR_RETURN(std::optional<std::string> stored, store_->GetAnalysis(request.run_id, request.kind, hash));
    if (stored) {
      AnalysisAnswer a;
      a.result = std::move(stored);
      a.from_store = true;
      a.state = v1::ANALYSIS_STATE_DONE;
      return a;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return absl::UnavailableError("the server is shutting down");
  if (auto it = jobs_.find({request.kind, request.run_id, hash}); it != jobs_.end()) {
    std::shared_ptr<Job> job = it->second;
    if (IsPending(job->state)) return AnswerOf(*job);
    // Ended and not yet reported: this caller hears it, then it is forgotten.
    ForgetLocked(job);
    if (!force) return AnswerOf(*job);
  }
  CL_RETURN_IF_ERROR(Admit(request));
  auto job = std::make_shared<Job>();
  job->id = "a" + std::to_string(next_job_++);
  job->hash = hash;
  job->request = std::move(request);
  jobs_[KeyOf(*job)] = job;
  by_id_[job->id] = job;
  ++active_;
  ++active_per_owner_[job->request.owner];
  queue_.push_back(job);
  work_cv_.notify_all();
  return AnswerOf(*job);
}

void AnalysisJobs::Await(const std::string& job_id, std::chrono::milliseconds wait,
                         std::function<void(std::optional<AnalysisAnswer>)> done) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = by_id_.find(job_id);
  if (it == by_id_.end() || !IsPending(it->second->state) || wait.count() <= 0) {
    std::optional<AnalysisAnswer> now;
    if (it != by_id_.end()) {
      now = AnswerOf(*it->second);
      if (!IsPending(now->state)) ForgetLocked(it->second);  // reported once
    }
    lock.unlock();
    done(std::move(now));
    return;
  }
  const uint64_t id = next_waiter_++;
  waiters_[id] = Waiter{std::chrono::steady_clock::now() + wait, std::move(done)};
  waiter_job_[id] = it->second;
  it->second->waiters.push_back(id);
  timer_cv_.notify_all();
}

void AnalysisJobs::ForgetLocked(std::shared_ptr<Job> job) {  // a copy: the maps may hold the last reference
  if (auto it = jobs_.find(KeyOf(*job)); it != jobs_.end() && it->second == job) jobs_.erase(it);
  by_id_.erase(job->id);
  std::erase(ended_, job->id);
}

void AnalysisJobs::EndLocked(const std::shared_ptr<Job>& job, v1::AnalysisState state, const absl::Status& failure,
                             std::optional<std::string> result, Callbacks* out) {
  if (IsPending(job->state)) {
    --active_;
    if (--active_per_owner_[job->request.owner] == 0) active_per_owner_.erase(job->request.owner);
  }
  job->state = state;
  job->request.work = nullptr;  // what it held (checkpoints, specs) is not kept with an unreported answer
  job->failure = failure;
  job->error = failure.ok()                            ? ""
               : state == v1::ANALYSIS_STATE_CANCELLED ? std::string(failure.message())
                                                       : failure.ToString();
  if (state == v1::ANALYSIS_STATE_DONE) job->progress = 1.0;
  AnalysisAnswer answer = AnswerOf(*job);
  answer.result = std::move(result);
  for (uint64_t w : job->waiters) {
    auto it = waiters_.find(w);
    if (it == waiters_.end()) continue;
    out->emplace_back(std::move(it->second.done), answer);
    waiters_.erase(it);
    waiter_job_.erase(w);
  }
  const bool reported = !job->waiters.empty();
  job->waiters.clear();
  if (state == v1::ANALYSIS_STATE_DONE || reported) {
    ForgetLocked(job);
    return;
  }
  ended_.push_back(job->id);
  while (static_cast<int>(ended_.size()) > options_.max_ended) {
    auto it = by_id_.find(ended_.front());
    if (it != by_id_.end()) {
      ForgetLocked(it->second);
    } else {
      ended_.pop_front();
    }
  }
}

absl::StatusOr<v1::AnalysisJob> AnalysisJobs::Cancel(
    const std::string& job_id, const std::function<absl::Status(const v1::AnalysisJob&)>& may_cancel) {
  Callbacks callbacks;
  v1::AnalysisJob out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_id_.find(job_id);
    if (it == by_id_.end() || !IsPending(it->second->state)) {
      return absl::NotFoundError("analysis job '" + job_id.substr(0, 64) + "' is not queued or running");
    }
    std::shared_ptr<Job> job = it->second;
    if (may_cancel) CL_RETURN_IF_ERROR(may_cancel(Describe(*job)));
    job->cancel.Request(StopReason::kCancel);
    if (job->state == v1::ANALYSIS_STATE_QUEUED) {
      std::erase(queue_, job);
      EndLocked(job, v1::ANALYSIS_STATE_CANCELLED, absl::CancelledError("cancelled (CancelAnalysis)"), std::nullopt,
                &callbacks);
    }
    out = Describe(*job);
    work_cv_.notify_all();
  }
  for (auto& [done, answer] : callbacks) done(std::move(answer));
  spdlog::info("analysis job {} cancelled ({})", job_id, v1::AnalysisState_Name(out.state()));
  return out;
}

void AnalysisJobs::ForgetRuns(const std::vector<int64_t>& run_ids) {
  Callbacks callbacks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::shared_ptr<Job>> doomed;
    for (const auto& [id, job] : by_id_) {
      if (std::find(run_ids.begin(), run_ids.end(), job->request.run_id) != run_ids.end()) doomed.push_back(job);
    }
    for (const std::shared_ptr<Job>& job : doomed) {
      job->run_deleted = true;
      job->cancel.Request(StopReason::kCancel);
      if (job->state == v1::ANALYSIS_STATE_QUEUED) {
        std::erase(queue_, job);
        EndLocked(job, v1::ANALYSIS_STATE_CANCELLED, absl::CancelledError("cancelled: its run was deleted"),
                  std::nullopt, &callbacks);
      }
      if (!IsPending(job->state)) ForgetLocked(job);  // running ones are forgotten when they stop
    }
    if (!doomed.empty()) work_cv_.notify_all();
  }
  for (auto& [done, answer] : callbacks) done(std::move(answer));
}

v1::ListAnalysisJobsResponse AnalysisJobs::List(const std::function<bool(const v1::AnalysisJob&)>& include) {
  std::lock_guard<std::mutex> lock(mu_);
  v1::ListAnalysisJobsResponse out;
  std::vector<const Job*> pending;
  for (const auto& [id, job] : by_id_) {
    if (IsPending(job->state) && !job->run_deleted) pending.push_back(job.get());
  }
  // Oldest first: ids count up.
  std::sort(pending.begin(), pending.end(), [](const Job* a, const Job* b) {
    return a->id.size() != b->id.size() ? a->id.size() < b->id.size() : a->id < b->id;
  });
  for (const Job* job : pending) {
    v1::AnalysisJob described = Describe(*job);
    if (!include || include(described)) *out.add_jobs() = std::move(described);
  }
  out.set_workers(static_cast<uint32_t>(workers_.size()));
  out.set_memory_in_use_bytes(memory_in_use_);
  out.set_memory_budget_bytes(options_.memory_budget_bytes);
  return out;
}

void AnalysisJobs::WorkerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    // The oldest job runs once its estimate fits next to the running ones'
    // (a job alone always fits: Submit refused any larger than the budget).
    work_cv_.wait(lock, [&] {
      if (stopping_) return true;
      if (queue_.empty()) return false;
      return memory_in_use_ == 0 || memory_in_use_ + queue_.front()->request.memory_bytes <= options_.memory_budget_bytes;
    });
    if (stopping_) return;
    std::shared_ptr<Job> job = queue_.front();
    queue_.pop_front();
    job->state = v1::ANALYSIS_STATE_RUNNING;
    memory_in_use_ += job->request.memory_bytes;
    lock.unlock();
    Run(job);
    lock.lock();
    memory_in_use_ -= job->request.memory_bytes;
    work_cv_.notify_all();
  }
}

void AnalysisJobs::Run(const std::shared_ptr<Job>& job) {
  auto progress = [&](double fraction) {
    std::lock_guard<std::mutex> lock(mu_);
    job->progress = fraction;
  };
  absl::StatusOr<std::string> result = [&] {
    ScopedThreadCancel scope(&job->cancel);
    return job->request.work(progress, &job->cancel);
  }();
  absl::Status status = result.status();
  if (result.ok() && job->run_deleted) status = absl::CancelledError("cancelled: its run was deleted");
  if (status.ok()) {
    // Stored before it is forgotten: later requests find it in the store.
    int evicted = 0;
    status = store_->PutAnalysis(job->request.run_id, job->request.kind, job->hash, job->request.key, *result,
                                 job->request.owner, options_.max_stored_bytes_per_owner, &evicted);
    if (!status.ok()) status = absl::InternalError("cannot store the result: " + status.ToString());
    if (evicted > 0) {
      spdlog::info("analysis job {}: {}'s stored answers past {} MiB: {} of the oldest deleted", job->id,
                   EscapeControl(job->request.owner), options_.max_stored_bytes_per_owner >> 20, evicted);
    }
  }
  const bool cancelled = job->cancel.stop_requested();
  if (!status.ok() && !cancelled) {
    spdlog::log(IsRequestError(status) ? spdlog::level::info : spdlog::level::warn, "analysis job {} ({} of {}) failed: {}", job->id, job->request.kind,
                 job->request.run_id == store::Store::kNoRun ? "a spec" : FormatRunId(job->request.run_id),
                 status.ToString());
  }
  Callbacks callbacks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (status.ok()) {
      EndLocked(job, v1::ANALYSIS_STATE_DONE, absl::OkStatus(), std::move(*result), &callbacks);
    } else if (cancelled) {
      EndLocked(job, v1::ANALYSIS_STATE_CANCELLED,
                absl::CancelledError(job->run_deleted ? "cancelled: its run was deleted"
                                     : job->cancel.reason() == StopReason::kPreempt
                                         ? "cancelled: the server is shutting down"
                                         : "cancelled (CancelAnalysis)"),
                std::nullopt, &callbacks);
    } else {
      EndLocked(job, v1::ANALYSIS_STATE_FAILED, status, std::nullopt, &callbacks);
    }
    if (job->run_deleted) ForgetLocked(job);
  }
  for (auto& [done, answer] : callbacks) done(std::move(answer));
}

void AnalysisJobs::TimerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    auto next = std::chrono::steady_clock::time_point::max();
    for (const auto& [id, w] : waiters_) next = std::min(next, w.deadline);
    if (next == std::chrono::steady_clock::time_point::max()) {
      timer_cv_.wait(lock);
    } else {
      timer_cv_.wait_until(lock, next);
    }
    const auto now = std::chrono::steady_clock::now();
    Callbacks due;
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->second.deadline > now) {
        ++it;
        continue;
      }
      std::shared_ptr<Job> job = waiter_job_[it->first];
      std::erase(job->waiters, it->first);
      due.emplace_back(std::move(it->second.done), AnswerOf(*job));
      waiter_job_.erase(it->first);
      it = waiters_.erase(it);
    }
    lock.unlock();
    for (auto& [done, answer] : due) done(std::move(answer));
    lock.lock();
  }
}

void AnalysisJobs::Shutdown() {
  Callbacks callbacks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    for (const std::shared_ptr<Job>& job : queue_) {
      EndLocked(job, v1::ANALYSIS_STATE_CANCELLED, absl::CancelledError("cancelled: the server is shutting down"),
                std::nullopt, &callbacks);
    }
    queue_.clear();
    for (const auto& [id, job] : by_id_) {
      if (job->state == v1::ANALYSIS_STATE_RUNNING) job->cancel.Request(StopReason::kPreempt);
    }
  }
  work_cv_.notify_all();
  timer_cv_.notify_all();
  for (auto& [done, answer] : callbacks) done(std::move(answer));
  for (std::thread& t : workers_) t.join();  // running jobs end (and answer their waiters) at their next check
  timer_.join();
  // Waiters of jobs that ended without an answer (none should be left).
  std::map<uint64_t, Waiter> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    left.swap(waiters_);
    waiter_job_.clear();
  }
  for (auto& [id, w] : left) w.done(std::nullopt);
}

}  // namespace circuitlab::scheduler
