// The analysis executor: every analysis that runs model code is a job here,
// never work on an RPC thread.
//
// Life of a job: an analysis module validates its request, resolves it into
// a canonical key and a Work closure, and calls Submit. Submit answers from
// the store (unless forced), reports on the job already queued or running for
// the same (kind, run, key), or queues a new one: admitted when the global and
// per-owner counts of queued + running jobs allow (RESOURCE_EXHAUSTED
// otherwise) and when its memory estimate fits --analysis-memory-mb alone
// (RESOURCE_EXHAUSTED otherwise). A worker takes the oldest queued job once
// its estimate fits next to the running jobs' (else it waits: queued, not
// refused), installs the job's cancel token on its thread
// (server/common/thread_cancel.h), runs it, stores a DONE result in SQLite
// before it forgets the job, and hands the answer to whoever Await()s it.
// FAILED and CANCELLED jobs stay in a bounded list, not counted against the
// limits, until their answer has been given once; then they are forgotten.
//
// Shutdown() cancels queued jobs at once and running jobs at their next
// forward pass, answers every waiter, and joins the workers.
//
// Thread-safety: all methods are thread-safe. Await callbacks run on a
// worker, the timer thread, or the calling thread, never under the lock.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "circuitlab/v1/analysis_service.pb.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "server/common/cancel.h"
#include "server/common/quotas.h"
#include "server/store/store.h"

namespace circuitlab::scheduler {

struct AnalysisJobOptions {
  int workers = 1;                 // jobs running at once
  int max_active = 256;            // queued + running jobs, all clients
  int max_active_per_client = 64;  // queued + running jobs of one owner
  const Quotas* quotas = nullptr;  // per-principal overrides of max_active_per_client (may be null)
  uint64_t memory_budget_bytes = 8ULL << 30;  // running jobs' estimates together
  int max_ended = 256;             // FAILED/CANCELLED answers kept until reported
  // The stored answers of one owner, in bytes (0: no limit); past it, the
  // owner's oldest are deleted as a new one is stored (asked again, they are
  // computed again).
  int64_t max_stored_bytes_per_owner = int64_t{1} << 30;
};

// The work of a job: the serialized DONE response. `progress(fraction)` may
// be called as it goes; `cancel` is also installed on the worker thread.
using AnalysisWork = std::function<absl::StatusOr<std::string>(const std::function<void(double)>& progress,
                                                               const CancelToken* cancel)>;

// Who asks for an analysis: the principal that will own the job, and whether
// it may start one (a `reader` may only read stored answers).
struct Requester {
  Requester(std::string principal = {}, bool only_read = false)  // NOLINT: a name alone is a requester
      : name(std::move(principal)), read_only(only_read) {}
  Requester(const char* principal) : name(principal) {}  // NOLINT
  std::string name;
  bool read_only = false;
};

struct AnalysisJobRequest {
  std::string kind;      // "intervene", "detect_circuit", ...
  int64_t run_id = 0;    // store::Store::kNoRun for a spec sent with the request
  std::string key;       // the canonical request, serialized (stored beside the answer)
  // Hashed after `key` (not stored): a new version of what an answer means
  // keeps the same request from finding answers stored under the old one.
  std::string version;
  std::string owner;     // who asked (per-owner limit)
  bool read_only = false;     // may be answered from the store or a pending job, never start one
  uint64_t memory_bytes = 0;  // estimated peak while it runs
  AnalysisWork work;
};

// What a job has to say.
struct AnalysisAnswer {
  std::optional<std::string> result;  // DONE: the serialized response
  bool from_store = false;            // result read from SQLite, not computed for this request
  v1::AnalysisState state = v1::ANALYSIS_STATE_UNSPECIFIED;
  double progress = 0;
  std::string error;
  absl::Status failure;  // FAILED: the work's status
  std::string job_id;
};

// A job that failed because of its request (an argument out of range, a run
// the analysis does not apply to) answers with that status, as if the request
// had been refused before it was queued; other failures are FAILED answers.
inline bool IsRequestError(const absl::Status& s) {
  return absl::IsInvalidArgument(s) || absl::IsFailedPrecondition(s) || absl::IsNotFound(s) || absl::IsOutOfRange(s);
}

// A response message from an answer: the result when DONE, the request's
// error (IsRequestError), else the state. Any analysis response: its job
// fields (state, progress, error, job_id, from_store) are set by name.
// (CheckInvarianceResponse's own State enum shares AnalysisState's numbers.)
absl::Status FillFromAnswer(const AnalysisAnswer& a, google::protobuf::Message* response);
// A pending answer's state, progress and error set on `response` (its
// other fields kept).
absl::Status UpdatePending(const AnalysisAnswer& a, google::protobuf::Message* response);

template <typename Response>
absl::StatusOr<Response> ResponseFromAnswer(const AnalysisAnswer& a) {
  Response resp;
  if (absl::Status s = FillFromAnswer(a, &resp); !s.ok()) return s;
  return resp;
}

inline bool IsPending(int state) {
  return state == v1::ANALYSIS_STATE_QUEUED || state == v1::ANALYSIS_STATE_RUNNING;
}
// An analysis response whose state is QUEUED or RUNNING; its job_id ("" when
// it has none).
bool IsPendingResponse(const google::protobuf::Message& response);
std::string JobIdOf(const google::protobuf::Message& response);

class AnalysisJobs {
 public:
  // Starts the workers and the timer thread. `store` must outlive this.
  AnalysisJobs(store::Store* store, AnalysisJobOptions options);
  ~AnalysisJobs();  // Shutdown()

  // The stored answer (unless `force`), the state of the job already asked
  // for (a FAILED or CANCELLED one is reported once and forgotten; with
  // `force` it is queued anew), or a new job's QUEUED state.
  // ResourceExhausted beyond the limits, Unavailable after Shutdown.
  absl::StatusOr<AnalysisAnswer> Submit(AnalysisJobRequest request, bool force);

  // Calls `done` once: with the job's final answer if it ends within `wait`,
  // else with its state when `wait` has passed; with nullopt at once when the
  // job is no longer known (it ended meanwhile: ask again).
  void Await(const std::string& job_id, std::chrono::milliseconds wait,
             std::function<void(std::optional<AnalysisAnswer>)> done);

  // NotFound for an unknown or finished job; `may_cancel`'s error (checked
  // under the lock, on the job as it stands) when it refuses.
  absl::StatusOr<v1::AnalysisJob> Cancel(const std::string& job_id,
                                         const std::function<absl::Status(const v1::AnalysisJob&)>& may_cancel = {});
  // The runs are being deleted (issue 32 item 7): their queued jobs end
  // CANCELLED at once, their running ones are cancelled at the next forward
  // pass and store nothing, and none of them is listed or reported again.
  void ForgetRuns(const std::vector<int64_t>& run_ids);
  // The jobs `include` accepts (all when it is empty).
  // The queued + running jobs `owner` may have.
  int ActiveLimitFor(const std::string& owner) const {
    return LimitFor(options_.quotas ? options_.quotas->For(owner).max_analyses : 0, options_.max_active_per_client);
  }
  v1::ListAnalysisJobsResponse List(const std::function<bool(const v1::AnalysisJob&)>& include = {});

  // Cancels everything, answers every waiter, joins the threads. Idempotent.
  void Shutdown();

 private:
  struct Waiter {
    std::chrono::steady_clock::time_point deadline;
    std::function<void(std::optional<AnalysisAnswer>)> done;
  };
  struct Job {
    std::string id;
    AnalysisJobRequest request;
    int64_t hash = 0;
    v1::AnalysisState state = v1::ANALYSIS_STATE_QUEUED;
    double progress = 0;
    std::string error;
    absl::Status failure;
    CancelToken cancel;
    std::vector<uint64_t> waiters;  // ids into waiters_
    std::atomic<bool> run_deleted{false};  // ForgetRuns: store nothing, keep no answer
  };
  using Key = std::tuple<std::string, int64_t, int64_t>;  // (kind, run, hash)
  using Callbacks = std::vector<std::pair<std::function<void(std::optional<AnalysisAnswer>)>, AnalysisAnswer>>;

  static AnalysisAnswer AnswerOf(const Job& job);
  static v1::AnalysisJob Describe(const Job& job);
  static Key KeyOf(const Job& job) { return {job.request.kind, job.request.run_id, job.hash}; }
  absl::Status Admit(const AnalysisJobRequest& request) const;  // requires mu_
  // Ends `job` (FAILED or CANCELLED, or DONE with `result`): waiters get the
  // answer; DONE and answered jobs are forgotten, others kept until reported.
  void EndLocked(const std::shared_ptr<Job>& job, v1::AnalysisState state, const absl::Status& failure,
                 std::optional<std::string> result, Callbacks* out);
  void ForgetLocked(std::shared_ptr<Job> job);
  void WorkerLoop();
  void TimerLoop();
  void Run(const std::shared_ptr<Job>& job);

  store::Store* const store_;
  const AnalysisJobOptions options_;

  std::mutex mu_;
  std::condition_variable work_cv_, timer_cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::map<Key, std::shared_ptr<Job>> jobs_;            // queued, running, ended-unreported
  std::map<std::string, std::shared_ptr<Job>> by_id_;  // the same jobs by id
  std::deque<std::string> ended_;                      // ended-unreported, oldest first
  std::map<std::string, int> active_per_owner_;
  std::map<uint64_t, Waiter> waiters_;
  std::map<uint64_t, std::shared_ptr<Job>> waiter_job_;
  int active_ = 0;  // queued + running
  uint64_t memory_in_use_ = 0;
  uint64_t next_job_ = 1, next_waiter_ = 1;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
  std::thread timer_;
};

}  // namespace circuitlab::scheduler
