#include "server/scheduler/scheduler.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>

#include "absl/strings/str_join.h"
#include "server/scheduler/sweeps.h"
#include "tests/test_util/fake_executor.h"
#include "tests/test_util/temp_dir.h"

namespace circuitlab::scheduler {
namespace {

using circuitlab::testing::FakeExecutor;
using circuitlab::testing::TempDir;
using circuitlab::testing::WaitFor;

v1::ExperimentSpec SmallSpec(uint64_t steps = 20, int priority = 0) {
  v1::ExperimentSpec spec;
  spec.mutable_training()->set_steps(steps);
  spec.mutable_resources()->set_priority(priority);
  spec.mutable_recording()->set_eval_size(16);
  return spec;
}

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override { Open(); }

  void Open(SchedulerOptions opts = {}) {
    scheduler_.reset();
    store_.reset();
    auto store = store::Store::Open(dir_.path());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    opts.epoch = "test";
    opts.heartbeat = std::chrono::milliseconds(0);
    scheduler_ = std::make_unique<Scheduler>(std::move(opts), store_.get(), &executor_, &clock_);
  }

  v1::RunState StateOf(const std::string& id) {
    auto run = scheduler_->GetRun(id);
    return run.ok() ? run->state() : v1::RUN_STATE_UNSPECIFIED;
  }

  TempDir dir_;
  FakeClock clock_;
  FakeExecutor executor_;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<Scheduler> scheduler_;
};

TEST(RunIdTest, ParsesAndFormats) {
  EXPECT_EQ(*ParseRunId("r17"), 17);
  EXPECT_EQ(*ParseRunId("17"), 17);
  EXPECT_EQ(FormatRunId(17), "r17");
  for (const char* bad : {"", "r", "rx", "r-1", "r0", "17a", "r99999999999999999999", "r017", "R17", "r+1", " r1",
                          "r1 "}) {
    auto id = ParseRunId(bad);
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(id.status().message().find("run_id"), std::string::npos);
  }
}

TEST_F(SchedulerTest, RunsToCompletionAndStoresEverything) {
  ASSERT_TRUE(scheduler_->Start().ok());
  auto run = scheduler_->Submit(SmallSpec(20), "alice");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->run_id(), "r1");
  EXPECT_EQ(run->spec().training().steps(), 20u);  // resolved spec stored
  ASSERT_TRUE(WaitFor([&] { return StateOf("r1") == v1::RUN_STATE_SUCCEEDED; }));
  auto done = scheduler_->GetRun("r1");
  EXPECT_EQ(done->progress().step(), 20u);
  EXPECT_EQ(done->device(), "cpu:0");
  EXPECT_EQ(done->attempts(), 1u);
  EXPECT_EQ(done->checkpoint_step(), 20u);
  EXPECT_GT(done->finished_at().seconds(), 0);
  EXPECT_DOUBLE_EQ(done->progress().latest().at("train/loss"), 1.0 / 20);

  v1::GetMetricsRequest req;
  req.set_run_id("r1");
  req.add_names("train/step");
  auto metrics = scheduler_->GetMetrics(req);
  ASSERT_TRUE(metrics.ok());
  ASSERT_EQ(metrics->series_size(), 1);
  EXPECT_EQ(metrics->series(0).values_size(), 20);
}

// A client that deletes a run as soon as a watch or a poll shows its end
// must not be refused: the slot lets go of the run a moment after the end
// is recorded, and the delete waits for that (the Python client's test hit
// "winding down" once in CI before). Each round races the slot's clean-up.
TEST_F(SchedulerTest, ADeleteRightAfterTheEndWaitsForTheSlot) {
  ASSERT_TRUE(scheduler_->Start().ok());
  for (int i = 0; i < 40; ++i) {
    auto run = scheduler_->Submit(SmallSpec(1), "alice");
    ASSERT_TRUE(run.ok()) << run.status();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (StateOf(run->run_id()) != v1::RUN_STATE_SUCCEEDED && std::chrono::steady_clock::now() < deadline) {
    }
    absl::StatusOr<v1::DeleteRunResponse> deleted = scheduler_->Delete(run->run_id());
    ASSERT_TRUE(deleted.ok()) << "round " << i << ": " << deleted.status();
  }
  // A run that has not ended is still refused at once.
  executor_.Close();
  auto running = scheduler_->Submit(SmallSpec(5), "alice");
  ASSERT_TRUE(running.ok());
  ASSERT_TRUE(WaitFor([&] { return StateOf(running->run_id()) == v1::RUN_STATE_RUNNING; }));
  EXPECT_EQ(scheduler_->Delete(running->run_id()).status().code(), absl::StatusCode::kFailedPrecondition);
  executor_.Open();
}

TEST_F(SchedulerTest, HigherPriorityRunsFirst) {
  executor_.Close();  // hold the first run so the others queue up
  ASSERT_TRUE(scheduler_->Start().ok());
  auto named = [](const std::string& name, int priority) {
    v1::ExperimentSpec spec = SmallSpec(3, priority);
    spec.set_name(name);
    return spec;
  };
  ASSERT_TRUE(scheduler_->Submit(named("first", 0), "a").ok());
  ASSERT_TRUE(WaitFor([&] { return StateOf("r1") == v1::RUN_STATE_RUNNING; }));
  ASSERT_TRUE(scheduler_->Submit(named("low", 0), "a").ok());
  ASSERT_TRUE(scheduler_->Submit(named("high", 10), "a").ok());
  ASSERT_TRUE(scheduler_->Submit(named("low-later", 0), "a").ok());
  executor_.Open();
  ASSERT_TRUE(WaitFor([&] { return executor_.started() == 4; }));
  EXPECT_EQ(executor_.started_names(), (std::vector<std::string>{"first", "high", "low", "low-later"}));
}

TEST_F(SchedulerTest, CancelQueuedAndRunning) {
  executor_.Close();
  ASSERT_TRUE(scheduler_->Start().ok());
  ASSERT_TRUE(scheduler_->Submit(SmallSpec(100), "a").ok());
  ASSERT_TRUE(WaitFor([&] { return StateOf("r1") == v1::RUN_STATE_RUNNING; }));
  ASSERT_TRUE(scheduler_->Submit(SmallSpec(100), "a").ok());
  auto queued = scheduler_->Cancel("r2");
  ASSERT_TRUE(queued.ok());
  EXPECT_EQ(queued->state(), v1::RUN_STATE_CANCELLED);
  ASSERT_TRUE(scheduler_->Cancel("r1").ok());
  executor_.Open();
  ASSERT_TRUE(WaitFor([&] { return StateOf("r1") == v1::RUN_STATE_CANCELLED; }));
  EXPECT_LT(scheduler_->GetRun("r1")->progress().step(), 100u);
  // Cancelling an ended run is a precondition failure; unknown runs are not found.
  EXPECT_EQ(scheduler_->Cancel("r1").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(scheduler_->Cancel("r99").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(executor_.started(), 1);  // r2 never ran
}

TEST_F(SchedulerTest, EngineFailureMarksTheRunFailedWithTheReason) {
  executor_.fail_with = absl::InternalError("LibTorch error: boom");
  executor_.fail_after = 3;
  ASSERT_TRUE(scheduler_->Start().ok());
  ASSERT_TRUE(scheduler_->Submit(SmallSpec(10), "a").ok());
  ASSERT_TRUE(WaitFor([&] { return StateOf("r1") == v1::RUN_STATE_FAILED; }));
  EXPECT_NE(scheduler_->GetRun("r1")->error().find("boom"), std::string::npos);
}

TEST_F(SchedulerTest, QueueLimitsAnswerResourceExhausted) {
  SchedulerOptions opts;
  opts.max_queued_runs = 3;
  opts.max_queued_per_client = 2;
  Open(opts);
  // Not started: everything stays queued.
  ASSERT_TRUE(scheduler_->Submit(SmallSpec(), "alice").ok());
  ASSERT_TRUE(scheduler_->Submit(SmallSpec(), "alice").ok());
  auto third = scheduler_->Submit(SmallSpec(), "alice");
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("--max-queued-per-client=2"), std::string::npos);
  ASSERT_TRUE(scheduler_->Submit(SmallSpec(), "bob").ok());
  auto full = scheduler_->Submit(SmallSpec(), "carol");
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.status().message().find("--max-queued-runs=3"), std::string::npos);
  // Nothing half-written: exactly three rows exist.
  v1::ListRunsRequest list;
  EXPECT_EQ(scheduler_->ListRuns(list)->total_size(), 3);
  // A sweep that cannot fit is refused before it is expanded (issue 14): the
  // refusal names the queue, not a member.
  SweepCore sweeps(scheduler_.get(), store_.get(), nullptr);
  v1::SweepSpec sweep;
  *sweep.mutable_base() = SmallSpec();
  v1::SweepAxis* axis = sweep.add_axes();
  axis->set_field("seed");
  for (int i = 1; i <= 500; ++i) axis->add_values()->set_number_value(i);
  auto refused = sweeps.Submit(sweep, "dave");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("500 more asked for"), std::string::npos) << refused.status();
  EXPECT_TRUE(scheduler_->CheckQueueRoom(0, "dave").ok());
}

TEST_F(SchedulerTest, PerPrincipalLimitsTakeTheTokensFileOverrides) {
  Quotas quotas;
  quotas.Replace({{"alice", QuotaOverrides{3, 0, 1, 2}}});
  SchedulerOptions opts;
  opts.max_queued_per_client = 1;
  opts.max_watchers_per_client = 2;
  opts.quotas = &quotas;
  Open(opts);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(scheduler_->Submit(SmallSpec(), "alice").ok());
  auto over = scheduler_->Submit(SmallSpec(), "alice");
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("the tokens file's max_queued for alice=3"), std::string::npos)
      << over.status();
  ASSERT_TRUE(scheduler_->Submit(SmallSpec(), "bob").ok());
  EXPECT_NE(scheduler_->Submit(SmallSpec(), "bob").status().message().find("--max-queued-per-client=1"),
            std::string::npos);
  // Watch streams: alice 1 (override), bob 2 (the server's); a closed one frees its place.
  v1::WatchRunRequest watch;
  watch.set_run_id("r1");
  auto first = scheduler_->StartWatch(watch, "alice");
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = scheduler_->StartWatch(watch, "alice");
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(second.status().message().find("max_watches for alice=1"), std::string::npos) << second.status();
  scheduler_->StopWatch(*first);
  auto again = scheduler_->StartWatch(watch, "alice");
  ASSERT_TRUE(again.ok()) << again.status();
  scheduler_->StopWatch(*again);
  auto b1 = scheduler_->StartWatch(watch, "bob"), b2 = scheduler_->StartWatch(watch, "bob");
  ASSERT_TRUE(b1.ok() && b2.ok());
  EXPECT_EQ(scheduler_->StartWatch(watch, "bob").status().code(), absl::StatusCode::kResourceExhausted);
  scheduler_->StopWatch(*b1);
  scheduler_->StopWatch(*b2);
  // Sweep size: alice's override is 2 runs.
  SweepCore sweeps(scheduler_.get(), store_.get(), nullptr, 64, &quotas);
  v1::SweepSpec sweep;
  *sweep.mutable_base() = SmallSpec();
  v1::SweepAxis* axis = sweep.add_axes();
  axis->set_field("seed");
  for (int i = 1; i <= 3; ++i) axis->add_values()->set_number_value(i);
  auto big = sweeps.Submit(sweep, "alice");
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(big.status().message().find("more than 2"), std::string::npos) << big.status();
}

TEST_F(SchedulerTest, BadSpecIsRejectedBeforeAnythingIsStored) {
  v1::ExperimentSpec spec = SmallSpec();
  spec.mutable_task()->mutable_associative_recall()->set_num_blocks(0);
  auto run = scheduler_->Submit(spec, "a");
  EXPECT_EQ(run.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler_->ListRuns({})->total_size(), 0);
}

TEST_F(SchedulerTest, CudaRequestWithoutCudaIsAPreconditionFailure) {
  v1::ExperimentSpec spec = SmallSpec();
  spec.mutable_resources()->set_device(v1::DEVICE_KIND_CUDA);
  EXPECT_EQ(scheduler_->Submit(spec, "a").status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(SchedulerTest, DrainPreemptsAndTheNextStartResumesFromTheCheckpoint) {
  executor_.step_time = std::chrono::milliseconds(5);
  ASSERT_TRUE(scheduler_->Start().ok());
  ASSERT_TRUE(scheduler_->Submit(SmallSpec(400), "a").ok());
  ASSERT_TRUE(WaitFor([&] { return scheduler_->GetRun("r1")->progress().step() >= 20; }));
  scheduler_->Drain();
  auto row = scheduler_->GetRun("r1");
  EXPECT_EQ(row->state(), v1::RUN_STATE_QUEUED);
  const uint64_t checkpoint = row->checkpoint_step();
  EXPECT_GE(checkpoint, 20u);
  EXPECT_EQ(scheduler_->Submit(SmallSpec(), "a").status().code(), absl::StatusCode::kUnavailable);

  executor_.step_time = std::chrono::milliseconds(0);
  Open();
  ASSERT_TRUE(scheduler_->Start().ok());
  ASSERT_TRUE(WaitFor([&] { return StateOf("r1") == v1::RUN_STATE_SUCCEEDED; }));
  EXPECT_EQ(executor_.resumed_from(), static_cast<int64_t>(checkpoint));
  EXPECT_EQ(scheduler_->GetRun("r1")->attempts(), 2u);
}

TEST_F(SchedulerTest, RunsLeftRunningByACrashAreRequeuedAndResumed) {
  // Simulate a crash: a RUNNING row with a checkpoint, and no process behind it.
  ASSERT_TRUE(scheduler_->Submit(SmallSpec(30), "a").ok());
  store::RunTransition t;
  t.state = v1::RUN_STATE_RUNNING;
  ASSERT_TRUE(store_->TransitionRun(1, t).ok());
  ASSERT_TRUE(store_->PutCheckpoint(1, 10, "step=10", 0).ok());
  Open();
  ASSERT_TRUE(scheduler_->Start().ok());
  ASSERT_TRUE(WaitFor([&] { return StateOf("r1") == v1::RUN_STATE_SUCCEEDED; }));
  EXPECT_EQ(executor_.resumed_from(), 10);
}

// Issue 51 item 12: a run's progress never shows less than its checkpoint:
// an engine reports progress every few steps, and a checkpoint written
// between two reports (or a resumed run's, before its first report) showed
// a progress.step behind checkpoint_step.
TEST_F(SchedulerTest, ARunsProgressNeverLagsItsCheckpoint) {
  executor_.step_time = std::chrono::milliseconds(10);
  executor_.progress_every = 7;
  executor_.checkpoint_every = 5;
  ASSERT_TRUE(scheduler_->Start().ok());
  ASSERT_TRUE(scheduler_->Submit(SmallSpec(120), "a").ok());
  int looks = 0, lagging = 0;
  ASSERT_TRUE(WaitFor([&] {
    auto run = scheduler_->GetRun("r1");
    if (run->state() == v1::RUN_STATE_RUNNING) {
      ++looks;
      lagging += run->progress().step() < run->checkpoint_step();
    }
    return run->state() == v1::RUN_STATE_SUCCEEDED;
  }));
  EXPECT_GT(looks, 10);
  EXPECT_EQ(lagging, 0) << "of " << looks << " looks";
}

// Issue 14 item 7: a truncated newest checkpoint (a torn write before a
// crash) no longer fails the run: it resumes from the newest intact one and
// says so.
TEST_F(SchedulerTest, ADamagedNewestCheckpointResumesFromTheNewestIntactOne) {
  ASSERT_TRUE(scheduler_->Submit(SmallSpec(30), "a").ok());
  store::RunTransition t;
  t.state = v1::RUN_STATE_RUNNING;
  ASSERT_TRUE(store_->TransitionRun(1, t).ok());
  ASSERT_TRUE(store_->PutCheckpoint(1, 10, "step=10", 0).ok());
  ASSERT_TRUE(store_->PutCheckpoint(1, 20, "step=20", 0).ok());
  std::ofstream(dir_.path() + "/checkpoints/r1/step-000000000020.ckpt", std::ios::trunc) << "ste";
  Open();
  ASSERT_TRUE(scheduler_->Start().ok());
  ASSERT_TRUE(WaitFor([&] { return StateOf("r1") == v1::RUN_STATE_SUCCEEDED; }));
  EXPECT_EQ(executor_.resumed_from(), 10);
  const std::string warning = scheduler_->GetRun("r1")->warning();
  EXPECT_NE(warning.find("resumed from the checkpoint at step 10, passing over damaged checkpoints (step 20: "),
            std::string::npos)
      << warning;
}

// Issue 14 item 10: a checkpoint that cannot be written (here: a file where
// the run's checkpoint directory should be) is retried with backoff; the run
// goes on once storage is back, and fails only after the last try.
TEST_F(SchedulerTest, CheckpointWriteFaultsAreRetriedBeforeTheRunFails) {
  SchedulerOptions opts;
  opts.checkpoint_retry_delay = std::chrono::milliseconds(20);
  opts.checkpoint_tries = 50;
  Open(opts);
  std::filesystem::create_directories(dir_.path() + "/checkpoints");
  std::ofstream(dir_.path() + "/checkpoints/r1") << "in the way";
  ASSERT_TRUE(scheduler_->Start().ok());
  ASSERT_TRUE(scheduler_->Submit(SmallSpec(20), "a").ok());
  ASSERT_TRUE(WaitFor([&] { return scheduler_->GetRun("r1")->warning().find("not written") != std::string::npos; }));
  EXPECT_EQ(StateOf("r1"), v1::RUN_STATE_RUNNING) << "paused, not failed";
  // Meanwhile the server says it is not ready (/readyz; issue 32 item 10).
  EXPECT_NE(scheduler_->StorageFault().find("r1: "), std::string::npos) << scheduler_->StorageFault();
  std::filesystem::remove(dir_.path() + "/checkpoints/r1");
  ASSERT_TRUE(WaitFor([&] { return StateOf("r1") == v1::RUN_STATE_SUCCEEDED; }));
  EXPECT_EQ(scheduler_->StorageFault(), "");
  EXPECT_NE(scheduler_->GetRun("r1")->warning().find("written after"), std::string::npos);

  // Storage that never comes back: the run fails after the last try, saying why.
  opts.checkpoint_tries = 3;
  Open(opts);
  std::ofstream(dir_.path() + "/checkpoints/r2") << "in the way";
  ASSERT_TRUE(scheduler_->Start().ok());
  ASSERT_TRUE(scheduler_->Submit(SmallSpec(20), "a").ok());
  ASSERT_TRUE(WaitFor([&] { return StateOf("r2") == v1::RUN_STATE_FAILED; }));
  EXPECT_NE(scheduler_->GetRun("r2")->error().find("could not be written after 3 tries"), std::string::npos)
      << scheduler_->GetRun("r2")->error();
  // Clients see the file relative to the data directory (issue 32 item 9).
  EXPECT_NE(scheduler_->GetRun("r2")->error().find("checkpoints/r2"), std::string::npos);
  EXPECT_EQ(scheduler_->GetRun("r2")->error().find(dir_.path()), std::string::npos) << scheduler_->GetRun("r2")->error();
}

// Issue 32 item 10: a run that resumes after a restart shows at least its
// checkpoint's step as progress, not 0, until its first progress report.
TEST_F(SchedulerTest, ProgressNeverLagsTheCheckpoint) {
  executor_.Close();
  ASSERT_TRUE(scheduler_->Submit(SmallSpec(400), "a").ok());
  ASSERT_TRUE(store_->PutCheckpoint(1, 200, "step=200", 2).ok());
  auto run = scheduler_->GetRun("r1");
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->checkpoint_step(), 200u);
  EXPECT_EQ(run->progress().step(), 200u);
  executor_.Open();
}

TEST_F(SchedulerTest, ListValidatesAndPaginates) {
  for (int i = 0; i < 5; ++i) {
    v1::ExperimentSpec spec = SmallSpec();
    if (i % 2 == 0) spec.add_tags("even");
    ASSERT_TRUE(scheduler_->Submit(spec, "a").ok());
  }
  v1::ListRunsRequest req;
  req.set_page_size(2);
  auto page = scheduler_->ListRuns(req);
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->runs_size(), 2);
  EXPECT_EQ(page->runs(0).run_id(), "r5");
  EXPECT_EQ(page->total_size(), 5);
  std::vector<std::string> seen;
  while (true) {
    for (const auto& r : page->runs()) seen.push_back(r.run_id());
    if (page->next_page_token().empty()) break;
    req.set_page_token(page->next_page_token());
    page = scheduler_->ListRuns(req);
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"r5", "r4", "r3", "r2", "r1"}));

  req = v1::ListRunsRequest();
  req.add_tags("even");
  EXPECT_EQ(scheduler_->ListRuns(req)->total_size(), 3);
  req = v1::ListRunsRequest();
  req.set_page_size(5000);
  EXPECT_EQ(scheduler_->ListRuns(req).status().code(), absl::StatusCode::kInvalidArgument);
  req = v1::ListRunsRequest();
  req.set_page_token("garbage");
  EXPECT_EQ(scheduler_->ListRuns(req).status().code(), absl::StatusCode::kInvalidArgument);
  req = v1::ListRunsRequest();
  req.add_states(static_cast<v1::RunState>(99));
  EXPECT_EQ(scheduler_->ListRuns(req).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SchedulerTest, MetricsRequestsAreValidated) {
  ASSERT_TRUE(scheduler_->Submit(SmallSpec(), "a").ok());
  v1::GetMetricsRequest req;
  req.set_run_id("r1");
  req.set_max_points(1'000'000);
  EXPECT_EQ(scheduler_->GetMetrics(req).status().code(), absl::StatusCode::kInvalidArgument);
  req.set_max_points(10);
  req.set_min_step(10);
  req.set_max_step(5);
  EXPECT_EQ(scheduler_->GetMetrics(req).status().code(), absl::StatusCode::kInvalidArgument);
  req.set_run_id("r2");
  req.set_max_step(0);
  EXPECT_EQ(scheduler_->GetMetrics(req).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SchedulerTest, WatchSeesSnapshotStateChangesAndEnd) {
  executor_.Close();
  ASSERT_TRUE(scheduler_->Start().ok());
  ASSERT_TRUE(scheduler_->Submit(SmallSpec(5), "a").ok());
  v1::WatchRunRequest req;
  req.set_run_id("r1");
  auto watch = scheduler_->StartWatch(req);
  ASSERT_TRUE(watch.ok());
  executor_.Open();
  std::vector<v1::RunState> states;
  bool ended = false;
  ASSERT_TRUE(WaitFor([&] {
    for (auto item = watch->subscriber->Next(); item.kind != Subscriber::Kind::kNone;
         item = watch->subscriber->Next()) {
      if (item.kind == Subscriber::Kind::kEnd) return ended = true;
      if (item.kind == Subscriber::Kind::kEvent && item.event.has_state()) states.push_back(item.event.state().state());
    }
    return false;
  }));
  ASSERT_FALSE(states.empty());
  EXPECT_EQ(states.back(), v1::RUN_STATE_SUCCEEDED);
  scheduler_->StopWatch(*watch);
}

}  // namespace
}  // namespace circuitlab::scheduler

namespace circuitlab::scheduler {
namespace {

// A spec whose members pack on a CPU slot: IMIR at batch <= 32 (the cost
// model, SpecFamily::PacksOnCpu).
v1::ExperimentSpec PackableSpec(uint64_t steps) {
  v1::ExperimentSpec spec = SmallSpec(steps);
  spec.mutable_training()->set_batch_size(32);
  return spec;
}

v1::SweepSpec SeedSweep(const v1::ExperimentSpec& base, int seeds) {
  v1::SweepSpec sweep;
  *sweep.mutable_base() = base;
  v1::SweepAxis* axis = sweep.add_axes();
  axis->set_field("seed");
  for (int i = 1; i <= seeds; ++i) axis->add_values()->set_number_value(i);
  return sweep;
}

// Sweep members that differ only in their seed train as one ensemble job;
// each still ends, checkpoints and reports as its own run.
TEST_F(SchedulerTest, SeedMembersOfASweepArePackedIntoOneEnsemble) {
  SweepCore sweeps(scheduler_.get(), store_.get(), nullptr);
  ASSERT_TRUE(sweeps.Submit(SeedSweep(PackableSpec(10), 3), "alice").ok());  // queued before the worker starts
  ASSERT_TRUE(scheduler_->Start().ok());
  ASSERT_TRUE(WaitFor([&] { return sweeps.Get("s1")->done(); }));
  EXPECT_EQ(executor_.pack_sizes(), (std::vector<size_t>{3}));
  for (const char* id : {"r1", "r2", "r3"}) {
    EXPECT_EQ(StateOf(id), v1::RUN_STATE_SUCCEEDED) << id;
    EXPECT_EQ(scheduler_->GetRun(id)->checkpoint_step(), 10u) << id;
  }
  // Each names the others in its detail (Run.packed_with).
  EXPECT_EQ(absl::StrJoin(scheduler_->GetRun("r2")->packed_with(), ","), "r1,r3");
  // Lone runs are never packed, nor another owner's members.
  executor_.Close();
  ASSERT_TRUE(sweeps.Submit(SeedSweep(PackableSpec(10), 1), "alice").ok());
  ASSERT_TRUE(scheduler_->Submit(PackableSpec(10), "alice").ok());
  ASSERT_TRUE(scheduler_->Submit(PackableSpec(10), "alice").ok());
  ASSERT_TRUE(sweeps.Submit(SeedSweep(PackableSpec(10), 1), "bob").ok());
  executor_.Open();
  ASSERT_TRUE(WaitFor([&] { return sweeps.Get("s3")->done() && StateOf("r6") == v1::RUN_STATE_SUCCEEDED; }));
  EXPECT_EQ(executor_.pack_sizes().size(), 1u);
}

// Members of different sweeps of one owner pack when their specs differ only
// in the seed: a reproduction makes one sweep per seed (issue 48).
TEST_F(SchedulerTest, OneOwnersSweepsOfOneSpecPackTogether) {
  SweepCore sweeps(scheduler_.get(), store_.get(), nullptr);
  v1::ExperimentSpec longer = PackableSpec(20);
  ASSERT_TRUE(sweeps.Submit(SeedSweep(PackableSpec(10), 1), "alice").ok());
  ASSERT_TRUE(sweeps.Submit(SeedSweep(PackableSpec(10), 2), "alice").ok());
  ASSERT_TRUE(sweeps.Submit(SeedSweep(longer, 2), "alice").ok());  // another spec: its own pack
  ASSERT_TRUE(scheduler_->Start().ok());
  ASSERT_TRUE(WaitFor([&] { return sweeps.Get("s1")->done() && sweeps.Get("s2")->done() && sweeps.Get("s3")->done(); }));
  EXPECT_EQ(executor_.pack_sizes(), (std::vector<size_t>{3, 2}));
}

// On a CUDA slot a pack holds as many members as 90% of the device's memory
// fits (issue 35); CPU slots are bounded by max_pack alone.
TEST_F(SchedulerTest, PacksOnAGpuFitItsMemory) {
  v1::ExperimentSpec resolved = SmallSpec(5);
  ASSERT_TRUE(engine::ResolveSpec({}, &resolved).ok());  // as the scheduler stores it
  const uint64_t member = engine::EstimateRunMemoryBytes(resolved);
  SchedulerOptions opts;
  opts.cpu_slots = 0;
  opts.cuda_devices = 1;
  opts.cuda_memory_bytes = {static_cast<uint64_t>(2.5 * static_cast<double>(member) / 0.9)};
  Open(std::move(opts));  // moved: a copy of the one-element vector trips GCC 14's -Warray-bounds (false positive)
  SweepCore sweeps(scheduler_.get(), store_.get(), nullptr);
  ASSERT_TRUE(sweeps.Submit(SeedSweep(SmallSpec(5), 5), "alice").ok());
  ASSERT_TRUE(scheduler_->Start().ok());
  ASSERT_TRUE(WaitFor([&] { return sweeps.Get("s1")->done(); }));
  EXPECT_EQ(executor_.pack_sizes(), (std::vector<size_t>{2, 2})) << "two members fit, the fifth trains alone";
  EXPECT_EQ(executor_.started(), 5);
  EXPECT_EQ(scheduler_->GetRun("r5")->device(), "cuda:0");
}

// The cost model (issue 48): a decoder's packed step is slower than its
// members one after another on a CPU (bench/decoder_pack.sh: 0.77-0.95x), so
// CPU slots train decoder members alone; IMIR members pack (the tests above).
TEST_F(SchedulerTest, DecoderMembersTrainAloneOnACpuSlot) {
  v1::ExperimentSpec decoder = SmallSpec(5);
  decoder.clear_task();
  decoder.clear_model();
  decoder.mutable_task()->mutable_latent()->set_seq_len(16);
  decoder.mutable_model()->mutable_decoder()->set_num_layers(1);
  decoder.mutable_model()->mutable_decoder()->set_d_model(16);
  SweepCore sweeps(scheduler_.get(), store_.get(), nullptr);
  absl::StatusOr<v1::Sweep> sweep = sweeps.Submit(SeedSweep(decoder, 3), "alice");
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  ASSERT_TRUE(scheduler_->Start().ok());
  ASSERT_TRUE(WaitFor([&] { return sweeps.Get("s1")->done(); }));
  EXPECT_TRUE(executor_.pack_sizes().empty());
  EXPECT_EQ(executor_.started(), 3);
  EXPECT_EQ(scheduler_->GetRun("r1")->packed_with_size(), 0);
  // Nor IMIR members at batch 256 (0.92x measured): only batch <= 32 pays.
  ASSERT_TRUE(sweeps.Submit(SeedSweep(SmallSpec(5), 3), "alice").ok());
  ASSERT_TRUE(WaitFor([&] { return sweeps.Get("s2")->done(); }));
  EXPECT_TRUE(executor_.pack_sizes().empty());
}

TEST_F(SchedulerTest, PackingCanBeTurnedOff) {
  SchedulerOptions opts;
  opts.max_pack = 1;
  Open(opts);
  SweepCore sweeps(scheduler_.get(), store_.get(), nullptr);
  ASSERT_TRUE(sweeps.Submit(SeedSweep(PackableSpec(5), 3), "alice").ok());
  ASSERT_TRUE(scheduler_->Start().ok());
  ASSERT_TRUE(WaitFor([&] { return sweeps.Get("s1")->done(); }));
  EXPECT_TRUE(executor_.pack_sizes().empty());
  EXPECT_EQ(executor_.started(), 3);
}

// A remote executor whose worker is always lost: the run is queued again
// (resuming) until --max-lost-leases, then fails saying why.
class LosingExecutor : public engine::Executor {
 public:
  absl::StatusOr<engine::TrainOutcome> Train(const engine::TrainRequest&, engine::TrainObserver& observer) override {
    ++calls;
    auto* placed = dynamic_cast<PlacedObserver*>(&observer);
    if (placed == nullptr) return absl::InternalError("not a placed observer");
    placed->OnPlaced("w1 slurm:7@node cpu");
    placed->OnLost("w1 slurm:7@node cpu: connection reset", charged);
    return engine::TrainOutcome{engine::TrainEnd::kPreempted, 0};
  }
  std::atomic<int> calls{0};
  bool charged = true;  // false: the worker was blamed (silent), not the run
};

class AlwaysCapacity : public WorkerCapacity {
 public:
  bool TryAcquire(bool) override { return true; }
  void Release(bool) override {}
};

// Options for a scheduler whose one slot is a remote worker's.
SchedulerOptions RemoteOptions(WorkerCapacity* capacity, int slots = 1) {
  SchedulerOptions opts;
  opts.cpu_slots = 0;
  opts.remote_slots = slots;
  opts.remote = capacity;
  opts.max_lost_leases = 3;
  opts.epoch = "test";
  return opts;
}

TEST_F(SchedulerTest, ARunThatKeepsLosingItsWorkerFailsAfterTheLimit) {
  LosingExecutor losing;
  AlwaysCapacity capacity;
  scheduler_.reset();
  Scheduler s(RemoteOptions(&capacity), store_.get(), &losing, &clock_);
  ASSERT_TRUE(s.Start().ok());
  auto run = s.Submit(SmallSpec(), "me");
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_TRUE(WaitFor([&] {
    auto r = s.GetRun(run->run_id());
    return r.ok() && r->state() == v1::RUN_STATE_FAILED;
  }));
  auto r = s.GetRun(run->run_id());
  EXPECT_EQ(losing.calls, 3);
  EXPECT_EQ(r->attempts(), 3u);
  EXPECT_NE(r->error().find("its worker was lost 3 times (--max-lost-leases); the last: w1 slurm:7@node cpu: "
                            "connection reset"),
            std::string::npos)
      << r->error();
  EXPECT_EQ(r->device(), "w1 slurm:7@node cpu");
  s.Drain();
}

// Issue 32 item 3: leases lost through the worker's fault (silent, or gone
// before reporting) are not charged to the run: it goes back to the queue
// however often that happens.
TEST_F(SchedulerTest, LeasesLostByTheWorkersFaultAreNotChargedToTheRun) {
  LosingExecutor losing;
  losing.charged = false;
  AlwaysCapacity capacity;
  scheduler_.reset();
  Scheduler s(RemoteOptions(&capacity), store_.get(), &losing, &clock_);
  ASSERT_TRUE(s.Start().ok());
  auto run = s.Submit(SmallSpec(), "me");
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_TRUE(WaitFor([&] { return losing.calls.load() >= 8; }));
  EXPECT_NE(s.GetRun(run->run_id())->state(), v1::RUN_STATE_FAILED) << s.GetRun(run->run_id())->error();
  s.Drain();
}

// A run requeued after its worker was lost can start again on another slot
// before the slot that lost it has cleaned up: that slot must not take the
// new attempt's entry with it, or a drain (and a cancel) cannot reach the
// run and the server never stops. The capacity's Release, which the losing
// slot calls before its clean-up, waits here until the second attempt runs.
class LosesOnceThenTrains : public engine::Executor {
 public:
  absl::StatusOr<engine::TrainOutcome> Train(const engine::TrainRequest& req, engine::TrainObserver& observer) override {
    if (++calls == 1) {
      auto* placed = dynamic_cast<PlacedObserver*>(&observer);
      if (placed == nullptr) return absl::InternalError("not a placed observer");
      placed->OnLost("w1: the worker left", /*counts=*/false);
      return engine::TrainOutcome{engine::TrainEnd::kPreempted, 0};
    }
    training = true;
    while (!req.cancel->stop_requested() && !give_up) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return engine::TrainOutcome{engine::TrainEnd::kPreempted, 0};
  }
  std::atomic<int> calls{0};
  std::atomic<bool> training{false}, give_up{false};
};

class ReleaseAfterTheSecondAttempt : public WorkerCapacity {
 public:
  explicit ReleaseAfterTheSecondAttempt(LosesOnceThenTrains* e) : executor_(e) {}
  bool TryAcquire(bool) override { return true; }
  void Release(bool) override {
    for (int i = 0; i < 1000 && !executor_->training; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }

 private:
  LosesOnceThenTrains* executor_;
};

TEST_F(SchedulerTest, ADrainReachesARunRequeuedOntoAnotherSlot) {
  LosesOnceThenTrains executor;
  ReleaseAfterTheSecondAttempt capacity(&executor);
  scheduler_.reset();
  Scheduler s(RemoteOptions(&capacity, 2), store_.get(), &executor, &clock_);
  ASSERT_TRUE(s.Start().ok());
  auto run = s.Submit(SmallSpec(), "me");
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_TRUE(WaitFor([&] { return executor.training.load(); }));
  std::atomic<bool> drained{false};
  std::thread drain([&] {
    s.Drain();
    drained = true;
  });
  const bool ok = WaitFor([&] { return drained.load(); }, std::chrono::seconds(10));
  executor.give_up = true;  // a drain that missed the run ends: the test fails, not hangs
  drain.join();
  EXPECT_TRUE(ok) << "the drain did not reach the second attempt";
  EXPECT_EQ(s.GetRun(run->run_id())->state(), v1::RUN_STATE_QUEUED);
}

// Trains at once, recording each run's device (the slot's torch device).
class DeviceRecorder : public engine::Executor {
 public:
  absl::StatusOr<engine::TrainOutcome> Train(const engine::TrainRequest& req, engine::TrainObserver&) override {
    std::lock_guard<std::mutex> lock(mu);
    devices[req.spec.name()] = req.device;
    return engine::TrainOutcome{engine::TrainEnd::kCompleted, static_cast<int64_t>(req.spec.training().steps())};
  }
  std::mutex mu;
  std::map<std::string, std::string> devices;
};

// Capacity by kind: `gpu_slots` GPU worker slots, CPU ones without end.
class KindCapacity : public WorkerCapacity {
 public:
  bool TryAcquire(bool gpu) override {
    std::lock_guard<std::mutex> lock(mu);
    if (gpu && gpu_held >= gpu_slots) return false;
    gpu_held += gpu;
    return true;
  }
  void Release(bool gpu) override {
    std::lock_guard<std::mutex> lock(mu);
    gpu_held -= gpu;
  }
  std::mutex mu;
  int gpu_slots = 0, gpu_held = 0;
};

// --executor slurm with GPU pilots: a run that asks for CUDA waits for a
// remote GPU slot (a GPU worker), the others train on the CPU workers'.
TEST_F(SchedulerTest, RunsThatAskForCudaTakeRemoteGpuSlots) {
  DeviceRecorder executor;
  KindCapacity capacity;
  scheduler_.reset();
  SchedulerOptions opts = RemoteOptions(&capacity, 2);
  v1::ExperimentSpec gpu_spec = SmallSpec();
  gpu_spec.set_name("on-gpu");
  gpu_spec.mutable_resources()->set_device(v1::DEVICE_KIND_CUDA);
  {
    Scheduler without(opts, store_.get(), &executor, &clock_);
    EXPECT_EQ(without.Submit(gpu_spec, "me").status().code(), absl::StatusCode::kFailedPrecondition)
        << "no GPU workers configured";
  }
  opts.remote_gpu_slots = 1;
  Scheduler s(opts, store_.get(), &executor, &clock_);
  ASSERT_TRUE(s.Start().ok());
  v1::ExperimentSpec any = SmallSpec();
  any.set_name("anywhere");
  auto g = s.Submit(gpu_spec, "me");
  ASSERT_TRUE(g.ok()) << g.status();
  auto a = s.Submit(any, "me");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(WaitFor([&] { return s.GetRun(a->run_id())->state() == v1::RUN_STATE_SUCCEEDED; }));
  EXPECT_EQ(s.QueuedRuns(true), 1) << "no GPU worker yet: the CUDA run waits";
  EXPECT_EQ(s.QueuedRuns(false), 0);
  {
    std::lock_guard<std::mutex> lock(capacity.mu);
    capacity.gpu_slots = 1;  // a GPU pilot registered
  }
  s.Wake();
  ASSERT_TRUE(WaitFor([&] { return s.GetRun(g->run_id())->state() == v1::RUN_STATE_SUCCEEDED; }));
  std::lock_guard<std::mutex> lock(executor.mu);
  EXPECT_EQ(executor.devices["on-gpu"], "cuda:0");
  EXPECT_EQ(executor.devices["anywhere"], "cpu");
}

}  // namespace
}  // namespace circuitlab::scheduler
