#include "server/scheduler/analysis_jobs.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>

#include "server/common/thread_cancel.h"
#include "tests/test_util/temp_dir.h"

namespace circuitlab::scheduler {
namespace {

using circuitlab::testing::TempDir;
using circuitlab::testing::WaitFor;
using std::chrono::milliseconds;

// Work that blocks until its gate opens or it is cancelled (polling the token
// the executor installs on the worker thread, as the models' forward passes do).
struct Gate {
  std::atomic<bool> open{false};
  std::atomic<int> started{0};
  AnalysisWork Work(std::string result = "done", absl::Status fail = absl::OkStatus()) {
    return [this, result, fail](const std::function<void(double)>& progress,
                                const CancelToken*) -> absl::StatusOr<std::string> {
      started++;
      progress(0.25);
      while (!open.load()) {
        try {
          ThrowIfThreadCancelled();
        } catch (const ThreadCancelled&) {
          return absl::CancelledError("stopped");
        }
        std::this_thread::sleep_for(milliseconds(2));
      }
      if (!fail.ok()) return fail;
      return result;
    };
  }
};

class AnalysisJobsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = store::Store::Open(dir_.path());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  static AnalysisJobRequest Job(const std::string& key, AnalysisWork work, const std::string& client = "c",
                                uint64_t memory = 1) {
    AnalysisJobRequest r;
    r.kind = "test";
    r.run_id = store::Store::kNoRun;
    r.key = key;
    r.owner = client;
    r.memory_bytes = memory;
    r.work = std::move(work);
    return r;
  }
  // The job's answer once it is no longer pending (asking reports it).
  static AnalysisAnswer Settled(AnalysisJobs& jobs, const std::string& key, Gate& gate) {
    AnalysisAnswer a;
    EXPECT_TRUE(WaitFor([&] {
      auto r = jobs.Submit(Job(key, gate.Work()), false);
      a = r.ok() ? *r : AnalysisAnswer();
      return r.ok() && !IsPending(a.state);
    }));
    return a;
  }
  TempDir dir_;
  std::unique_ptr<store::Store> store_;
};

TEST_F(AnalysisJobsTest, DoneIsStoredAndAnsweredFromTheStore) {
  AnalysisJobs jobs(store_.get(), {});
  Gate gate;
  auto first = jobs.Submit(Job("k", gate.Work("result")), false);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->state, v1::ANALYSIS_STATE_QUEUED);
  EXPECT_EQ(first->job_id, "a1");
  ASSERT_TRUE(WaitFor([&] { return jobs.Submit(Job("k", gate.Work()), false)->progress == 0.25; }));
  EXPECT_EQ(jobs.Submit(Job("k", gate.Work()), false)->state, v1::ANALYSIS_STATE_RUNNING);
  gate.open = true;
  AnalysisAnswer done = Settled(jobs, "k", gate);
  EXPECT_EQ(done.state, v1::ANALYSIS_STATE_DONE);
  EXPECT_TRUE(done.from_store);
  EXPECT_EQ(*done.result, "result");
  EXPECT_EQ(gate.started.load(), 1) << "asking again never recomputes";
}

// Issue 51 item 7: a job's stored answer is charged to its owner; past the
// owner's quota the oldest of theirs go (here 3 of 2 KB answers fit 5 KB).
TEST_F(AnalysisJobsTest, StoredAnswersCountAgainstTheirOwnersQuota) {
  store::NewRun run;
  run.name = "quota";
  run.spec = "spec";
  run.spec_json = "{}";
  run.state = 1;
  run.owner = "ana";
  const int64_t id = *store_->InsertRun(run);
  AnalysisJobOptions o;
  o.max_stored_bytes_per_owner = 5000;
  AnalysisJobs jobs(store_.get(), o);
  Gate gate;
  gate.open = true;
  for (int i = 0; i < 4; ++i) {
    AnalysisJobRequest r = Job("k" + std::to_string(i), gate.Work(std::string(2000, 'x')), "ana");
    r.run_id = id;
    ASSERT_TRUE(jobs.Submit(std::move(r), false).ok());
    ASSERT_TRUE(WaitFor([&] { return jobs.Submit([&] {
                                  AnalysisJobRequest again = Job("k" + std::to_string(i), gate.Work(), "ana");
                                  again.run_id = id;
                                  return again;
                                }(), false)->from_store; }));
  }
  EXPECT_LE(*store_->StoredAnalysisBytes("ana"), 5000);
  EXPECT_GT(*store_->StoredAnalysisBytes("ana"), 4000) << "two answers of 2,002 bytes stay";
  EXPECT_EQ(store_->ListAnalyses(id, "test", 10)->size(), 2u);
}

TEST_F(AnalysisJobsTest, AwaitAnswersTheResultOrTheStateAtTheDeadline) {
  AnalysisJobs jobs(store_.get(), {});
  Gate gate;
  auto first = jobs.Submit(Job("k", gate.Work("result")), false);
  ASSERT_TRUE(first.ok());
  std::promise<std::optional<AnalysisAnswer>> timed_out;
  jobs.Await(first->job_id, milliseconds(50), [&](std::optional<AnalysisAnswer> a) { timed_out.set_value(a); });
  std::optional<AnalysisAnswer> late = timed_out.get_future().get();
  ASSERT_TRUE(late.has_value());
  EXPECT_TRUE(IsPending(late->state));
  EXPECT_FALSE(late->result.has_value());

  std::promise<std::optional<AnalysisAnswer>> finished;
  jobs.Await(first->job_id, std::chrono::seconds(30), [&](std::optional<AnalysisAnswer> a) { finished.set_value(a); });
  gate.open = true;
  std::optional<AnalysisAnswer> done = finished.get_future().get();
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->state, v1::ANALYSIS_STATE_DONE);
  EXPECT_FALSE(done->from_store) << "computed for this request";
  EXPECT_EQ(*done->result, "result");
  // A job that is gone answers nullopt at once (the caller asks again).
  std::promise<std::optional<AnalysisAnswer>> gone;
  jobs.Await(first->job_id, std::chrono::seconds(30), [&](std::optional<AnalysisAnswer> a) { gone.set_value(a); });
  EXPECT_FALSE(gone.get_future().get().has_value());
}

// The "done means": 200 failed analyses in a row, then a valid one runs.
TEST_F(AnalysisJobsTest, FailedJobsNeverFillTheTable) {
  AnalysisJobOptions options;
  options.max_active = 4;
  options.max_ended = 16;
  AnalysisJobs jobs(store_.get(), options);
  Gate gate;
  gate.open = true;
  for (int i = 0; i < 200; ++i) {
    auto r = jobs.Submit(Job("bad" + std::to_string(i), gate.Work("", absl::InvalidArgumentError("no such set"))),
                         false);
    ASSERT_TRUE(r.ok()) << i << ": " << r.status();
    ASSERT_TRUE(WaitFor([&] { return jobs.List().jobs_size() == 0; })) << i;
  }
  auto valid = jobs.Submit(Job("good", gate.Work("ok")), false);
  ASSERT_TRUE(valid.ok()) << valid.status();
  EXPECT_EQ(Settled(jobs, "good", gate).state, v1::ANALYSIS_STATE_DONE);
}

TEST_F(AnalysisJobsTest, AFailureIsReportedOnceThenForgotten) {
  AnalysisJobs jobs(store_.get(), {});
  Gate gate;
  gate.open = true;
  ASSERT_TRUE(jobs.Submit(Job("k", gate.Work("", absl::InternalError("boom"))), false).ok());
  AnalysisAnswer failed = Settled(jobs, "k", gate);
  EXPECT_EQ(failed.state, v1::ANALYSIS_STATE_FAILED);
  EXPECT_NE(failed.error.find("boom"), std::string::npos);
  // Asked again, it is a new job (this time the work succeeds).
  auto again = jobs.Submit(Job("k", gate.Work("fine")), false);
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->job_id, failed.job_id);
  EXPECT_EQ(Settled(jobs, "k", gate).state, v1::ANALYSIS_STATE_DONE);
}

TEST_F(AnalysisJobsTest, CancelQueuedAndRunningJobs) {
  AnalysisJobs jobs(store_.get(), {});  // one worker
  Gate gate;
  auto running = jobs.Submit(Job("run", gate.Work()), false);
  auto queued = jobs.Submit(Job("wait", gate.Work()), false);
  ASSERT_TRUE(running.ok() && queued.ok());
  ASSERT_TRUE(WaitFor([&] { return gate.started.load() == 1; }));
  auto q = jobs.Cancel(queued->job_id);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->state(), v1::ANALYSIS_STATE_CANCELLED);
  auto r = jobs.Cancel(running->job_id);
  ASSERT_TRUE(r.ok()) << r.status();
  AnalysisAnswer stopped = Settled(jobs, "run", gate);
  EXPECT_EQ(stopped.state, v1::ANALYSIS_STATE_CANCELLED);
  EXPECT_EQ(gate.started.load(), 1) << "the cancelled queued job never ran";
  EXPECT_EQ(jobs.Cancel(running->job_id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(jobs.Cancel("a999").status().code(), absl::StatusCode::kNotFound);
}

// Issue 32 item 7: deleting a run ends its jobs (queued at once, running at
// their next forward pass) and they are neither listed nor stored after.
TEST_F(AnalysisJobsTest, DeletedRunsLoseTheirJobs) {
  AnalysisJobs jobs(store_.get(), {});  // one worker
  Gate gate;
  auto job_of = [&](const std::string& key, int64_t run) {
    AnalysisJobRequest r = Job(key, gate.Work());
    r.run_id = run;
    return r;
  };
  auto running = jobs.Submit(job_of("intervene", 7), false);
  auto queued = jobs.Submit(job_of("label", 7), false);
  auto other = jobs.Submit(job_of("label", 8), false);
  ASSERT_TRUE(running.ok() && queued.ok() && other.ok());
  ASSERT_TRUE(WaitFor([&] { return gate.started.load() == 1; }));
  EXPECT_EQ(jobs.List().jobs_size(), 3);
  jobs.ForgetRuns({7});
  auto listed = jobs.List();
  ASSERT_EQ(listed.jobs_size(), 1) << listed.DebugString();
  EXPECT_EQ(listed.jobs(0).job_id(), other->job_id);
  // The running one stops at its next poll; run 8's job then runs.
  ASSERT_TRUE(WaitFor([&] { return gate.started.load() == 2; }));
  EXPECT_EQ(jobs.Cancel(running->job_id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(jobs.Cancel(queued->job_id).status().code(), absl::StatusCode::kNotFound);
  gate.open = true;
  ASSERT_TRUE(WaitFor([&] { return jobs.List().jobs_size() == 0; }));
}

TEST_F(AnalysisJobsTest, LimitsCountQueuedAndRunningPerClientAndInAll) {
  AnalysisJobOptions options;
  options.max_active = 3;
  options.max_active_per_client = 2;
  AnalysisJobs jobs(store_.get(), options);
  Gate gate;
  ASSERT_TRUE(jobs.Submit(Job("1", gate.Work(), "alice"), false).ok());
  ASSERT_TRUE(jobs.Submit(Job("2", gate.Work(), "alice"), false).ok());
  auto third = jobs.Submit(Job("3", gate.Work(), "alice"), false);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("--max-analysis-jobs-per-client=2"), std::string::npos) << third.status();
  ASSERT_TRUE(jobs.Submit(Job("4", gate.Work(), "bob"), false).ok());
  EXPECT_EQ(jobs.Submit(Job("5", gate.Work(), "carol"), false).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Asking about a job already queued costs nothing.
  EXPECT_TRUE(jobs.Submit(Job("1", gate.Work(), "alice"), false).ok());
  gate.open = true;
  ASSERT_TRUE(WaitFor([&] { return jobs.List().jobs_size() == 0; }));
  EXPECT_TRUE(jobs.Submit(Job("3", gate.Work(), "alice"), false).ok());
}

TEST_F(AnalysisJobsTest, PerPrincipalOverridesAndReadersOnlyRead) {
  Quotas quotas;
  quotas.Replace({{"alice", QuotaOverrides{0, 3, 0, 0}}});
  AnalysisJobOptions options;
  options.max_active_per_client = 1;
  options.quotas = &quotas;
  AnalysisJobs jobs(store_.get(), options);
  Gate gate;
  for (const char* key : {"1", "2", "3"}) ASSERT_TRUE(jobs.Submit(Job(key, gate.Work(), "alice"), false).ok());
  auto fourth = jobs.Submit(Job("4", gate.Work(), "alice"), false);
  EXPECT_EQ(fourth.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(fourth.status().message().find("max_analyses for alice=3"), std::string::npos) << fourth.status();
  ASSERT_TRUE(jobs.Submit(Job("5", gate.Work(), "bob"), false).ok());
  EXPECT_EQ(jobs.Submit(Job("6", gate.Work(), "bob"), false).status().code(), absl::StatusCode::kResourceExhausted);
  // A reader joins a pending job and reads a stored answer, never starts one.
  AnalysisJobRequest reader = Job("1", gate.Work(), "carol");
  reader.read_only = true;
  EXPECT_TRUE(jobs.Submit(reader, false).ok()) << "joining a pending job is a read";
  reader = Job("7", gate.Work(), "carol");
  reader.read_only = true;
  auto refused = jobs.Submit(reader, false);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(refused.status().message().find("reader role"), std::string::npos) << refused.status();
  gate.open = true;
  ASSERT_TRUE(WaitFor([&] { return jobs.List().jobs_size() == 0; }));
  reader = Job("1", gate.Work(), "carol");
  reader.read_only = true;
  auto stored = jobs.Submit(reader, false);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_TRUE(stored->from_store);
  reader.read_only = true;
  EXPECT_EQ(jobs.Submit(reader, /*force=*/true).status().code(), absl::StatusCode::kPermissionDenied)
      << "forcing a recomputation starts a job";
}

TEST_F(AnalysisJobsTest, MemoryAdmissionQueuesWhatDoesNotFitAndRefusesWhatNeverFits) {
  AnalysisJobOptions options;
  options.workers = 2;
  options.memory_budget_bytes = 100;
  AnalysisJobs jobs(store_.get(), options);
  Gate gate;
  auto huge = jobs.Submit(Job("huge", gate.Work(), "c", 101), false);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(huge.status().message().find("--analysis-memory-mb"), std::string::npos) << huge.status();
  ASSERT_TRUE(jobs.Submit(Job("a", gate.Work(), "c", 60), false).ok());
  ASSERT_TRUE(jobs.Submit(Job("b", gate.Work(), "c", 60), false).ok());
  ASSERT_TRUE(WaitFor([&] { return gate.started.load() == 1; }));
  std::this_thread::sleep_for(milliseconds(50));
  // Two workers, but the second job does not fit next to the first: it waits.
  EXPECT_EQ(gate.started.load(), 1);
  v1::ListAnalysisJobsResponse list = jobs.List();
  ASSERT_EQ(list.jobs_size(), 2);
  EXPECT_EQ(list.jobs(0).state(), v1::ANALYSIS_STATE_RUNNING);
  EXPECT_EQ(list.jobs(1).state(), v1::ANALYSIS_STATE_QUEUED);
  EXPECT_EQ(list.memory_in_use_bytes(), 60u);
  gate.open = true;
  EXPECT_EQ(Settled(jobs, "b", gate).state, v1::ANALYSIS_STATE_DONE);
}

TEST_F(AnalysisJobsTest, ShutdownCancelsRunningWorkAndAnswersEveryWaiter) {
  AnalysisJobs jobs(store_.get(), {});
  Gate gate;  // never opened: only cancellation ends this work
  auto running = jobs.Submit(Job("run", gate.Work()), false);
  auto queued = jobs.Submit(Job("wait", gate.Work()), false);
  ASSERT_TRUE(running.ok() && queued.ok());
  ASSERT_TRUE(WaitFor([&] { return gate.started.load() == 1; }));
  std::promise<std::optional<AnalysisAnswer>> a, b;
  jobs.Await(running->job_id, std::chrono::hours(1), [&](std::optional<AnalysisAnswer> x) { a.set_value(x); });
  jobs.Await(queued->job_id, std::chrono::hours(1), [&](std::optional<AnalysisAnswer> x) { b.set_value(x); });
  jobs.Shutdown();  // returns: the running work stopped at its next check
  EXPECT_EQ(a.get_future().get()->state, v1::ANALYSIS_STATE_CANCELLED);
  EXPECT_EQ(b.get_future().get()->state, v1::ANALYSIS_STATE_CANCELLED);
  EXPECT_EQ(jobs.Submit(Job("new", gate.Work()), false).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace circuitlab::scheduler
