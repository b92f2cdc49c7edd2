// Integration tests: the real gRPC server (real engine unless stated) on an
// ephemeral loopback port, driven through the client library.
// Runs: submit, watch, metrics, cancel, limits, auth, reflection, health, drain and restart.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <fstream>

#include "tests/integration/integration_util.h"

namespace circuitlab::testing {
namespace {

TEST(IntegrationTest, SubmitWatchAndQueryMetrics) {
  TempDir dir;
  auto exec = engine::MakeTorchExecutor();
  Server server(dir.path(), exec.get());
  auto c = MakeClient(server.address());
  ASSERT_TRUE(c.Health().ok());

  auto run = c.SubmitRun(TinySpec(60));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->state(), v1::RUN_STATE_QUEUED);
  EXPECT_EQ(run->spec().model().imir().num_layers(), 2u);  // defaults resolved server-side

  std::vector<v1::RunEvent> events;
  std::atomic<bool> stop{false};
  v1::WatchRunRequest req;
  req.set_run_id(run->run_id());
  req.set_include_metrics(true);
  absl::Status s = c.Watch(req, [&](const v1::RunEvent& ev) { events.push_back(ev); }, stop);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_FALSE(events.empty());
  EXPECT_TRUE(events.front().has_snapshot()) << "a stream opens with a snapshot";
  EXPECT_FALSE(events.front().resync());
  ASSERT_TRUE(events.back().has_state());
  EXPECT_EQ(events.back().state().state(), v1::RUN_STATE_SUCCEEDED);
  bool saw_progress = false, saw_metrics = false, saw_running = false;
  uint64_t prev = 0;
  for (const auto& ev : events) {
    saw_progress |= ev.has_progress();
    saw_metrics |= ev.has_metrics();
    saw_running |= ev.has_state() && ev.state().state() == v1::RUN_STATE_RUNNING;
    if (!ev.has_snapshot() && !ev.has_heartbeat()) {
      EXPECT_GT(ev.sequence(), prev) << "sequence numbers increase";
      prev = ev.sequence();
    }
  }
  EXPECT_TRUE(saw_progress);
  EXPECT_TRUE(saw_metrics);

  v1::GetMetricsRequest mreq;
  mreq.set_run_id(run->run_id());
  auto metrics = c.GetMetrics(mreq);
  ASSERT_TRUE(metrics.ok());
  std::map<std::string, v1::MetricSeries> by_name;
  for (const auto& series : metrics->series()) by_name[series.name()] = series;
  ASSERT_TRUE(by_name.count("train/loss"));
  EXPECT_EQ(by_name["train/loss"].steps_size(), 6);  // 10, 20, ..., 60
  EXPECT_EQ(by_name["train/loss"].steps(5), 60u);
  for (const char* name : {"eval/icl_rare/accuracy", "eval/icl_holdout/accuracy", "eval/iwl/accuracy",
                           "eval/conflict/p_icl", "eval/conflict/p_iwl", "eval/conflict/logit_diff",
                           "eval/train_mix/loss"}) {
    ASSERT_TRUE(by_name.count(name)) << name;
    EXPECT_EQ(by_name[name].steps(0), 0u) << "evaluated before training";
  }
  // Downsampling keeps the last point.
  mreq.add_names("train/loss");
  mreq.set_max_points(3);
  metrics = c.GetMetrics(mreq);
  ASSERT_EQ(metrics->series_size(), 1);
  EXPECT_LE(metrics->series(0).steps_size(), 3);
  EXPECT_EQ(metrics->series(0).steps(metrics->series(0).steps_size() - 1), 60u);
  EXPECT_EQ(metrics->series(0).total_points(), 6u);

  auto shown = c.GetRun(run->run_id());
  ASSERT_TRUE(shown.ok());
  EXPECT_EQ(shown->state(), v1::RUN_STATE_SUCCEEDED);
  EXPECT_EQ(shown->progress().step(), 60u);
  EXPECT_EQ(shown->checkpoint_step(), 60u);
  EXPECT_TRUE(shown->progress().latest().count("eval/icl_rare/accuracy"));
  v1::ListRunsRequest list;
  list.add_tags("it");
  list.add_states(v1::RUN_STATE_SUCCEEDED);
  EXPECT_EQ(c.ListRuns(list)->total_size(), 1);
  // Watching an ended run: one snapshot, then the stream ends.
  events.clear();
  ASSERT_TRUE(c.Watch(req, [&](const v1::RunEvent& ev) { events.push_back(ev); }, stop).ok());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].snapshot().state(), v1::RUN_STATE_SUCCEEDED);
}

TEST(IntegrationTest, CancelMidRunAndDroppingAWatchNeverCancels) {
  TempDir dir;
  auto exec = engine::MakeTorchExecutor();
  Server server(dir.path(), exec.get());
  auto c = MakeClient(server.address());
  auto run = c.SubmitRun(TinySpec(1'000'000));
  ASSERT_TRUE(run.ok());
  // A watcher that leaves after a few events.
  std::atomic<bool> stop{false};
  int seen = 0;
  v1::WatchRunRequest req;
  req.set_run_id(run->run_id());
  absl::Status s = c.Watch(req, [&](const v1::RunEvent& ev) {
    if (ev.has_progress() && ++seen >= 2) stop = true;
  }, stop);
  EXPECT_TRUE(absl::IsCancelled(s)) << s;
  auto still = c.GetRun(run->run_id());
  EXPECT_EQ(still->state(), v1::RUN_STATE_RUNNING) << "a dropped watch must not cancel the run";
  EXPECT_GT(still->progress().step(), 0u);

  ASSERT_TRUE(c.CancelRun(run->run_id()).ok());
  EXPECT_EQ(WaitForEnd(c, run->run_id()), v1::RUN_STATE_CANCELLED);
  auto cancelled = c.CancelRun(run->run_id());
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(IntegrationTest, BadRequestsAnswerWithActionableStatuses) {
  TempDir dir;
  testing::FakeExecutor exec;
  Server server(dir.path(), &exec);
  auto c = MakeClient(server.address());

  v1::ExperimentSpec spec = TinySpec();
  spec.mutable_model()->mutable_imir()->set_num_heads(0);
  auto run = c.SubmitRun(spec);
  EXPECT_EQ(run.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(run.status().message(), "model.imir.num_heads must be in [1, 8], got 0");

  spec = TinySpec();
  spec.mutable_data()->set_rare_fraction(-0.1);
  EXPECT_EQ(c.SubmitRun(spec).status().message(), "data.rare_fraction must be in [0, 1], got -0.1");

  EXPECT_EQ(c.GetRun("r404").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c.GetRun("nonsense").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.CancelRun("").status().code(), absl::StatusCode::kInvalidArgument);
  v1::ListRunsRequest list;
  list.set_page_size(-1);
  EXPECT_EQ(c.ListRuns(list).status().code(), absl::StatusCode::kInvalidArgument);
  v1::GetMetricsRequest m;
  m.set_run_id("r1");
  EXPECT_EQ(c.GetMetrics(m).status().code(), absl::StatusCode::kNotFound);

  // Oversized requests are refused by gRPC before they reach memory.
  spec = TinySpec();
  spec.set_name(std::string(5 << 20, 'x'));
  EXPECT_EQ(c.SubmitRun(spec).status().code(), absl::StatusCode::kResourceExhausted);

  std::atomic<bool> stop{false};
  v1::WatchRunRequest w;
  w.set_run_id("r404");
  EXPECT_EQ(c.Watch(w, [](const v1::RunEvent&) {}, stop).code(), absl::StatusCode::kNotFound);
  // None of it left a run behind.
  EXPECT_EQ(c.ListRuns({})->total_size(), 0);
}

TEST(IntegrationTest, QueueLimitIsResourceExhausted) {
  TempDir dir;
  testing::FakeExecutor exec;
  exec.Close();
  scheduler::SchedulerOptions opts;
  opts.max_queued_runs = 2;
  Server server(dir.path(), &exec, opts);
  auto c = MakeClient(server.address());
  ASSERT_TRUE(c.SubmitRun(TinySpec()).ok());  // taken by the worker
  ASSERT_TRUE(WaitFor([&] { return exec.started() == 1; }));
  ASSERT_TRUE(c.SubmitRun(TinySpec()).ok());
  ASSERT_TRUE(c.SubmitRun(TinySpec()).ok());
  auto over = c.SubmitRun(TinySpec());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  exec.Open();
}

TEST(IntegrationTest, WatchResumesAfterTheLastSequenceSeen) {
  TempDir dir;
  testing::FakeExecutor exec;
  exec.step_time = std::chrono::milliseconds(20);
  Server server(dir.path(), &exec);
  auto c = MakeClient(server.address());
  auto run = c.SubmitRun(TinySpec(60));
  ASSERT_TRUE(run.ok());
  std::atomic<bool> stop{false};
  uint64_t last = 0;
  std::string epoch;
  int seen = 0;
  v1::WatchRunRequest req;
  req.set_run_id(run->run_id());
  req.set_include_metrics(true);
  absl::Status first = c.Watch(req, [&](const v1::RunEvent& ev) {
    if (!ev.has_heartbeat()) last = ev.sequence();
    epoch = ev.epoch();
    if (++seen == 5) stop = true;
  }, stop);
  ASSERT_TRUE(absl::IsCancelled(first)) << first;
  ASSERT_GT(last, 0u);
  // Reconnect: the first event continues exactly after the last one seen.
  stop = false;
  req.set_after_sequence(last);
  req.set_epoch(epoch);
  std::vector<v1::RunEvent> rest;
  ASSERT_TRUE(c.Watch(req, [&](const v1::RunEvent& ev) { rest.push_back(ev); }, stop).ok());
  ASSERT_FALSE(rest.empty());
  EXPECT_FALSE(rest.front().has_snapshot());
  EXPECT_EQ(rest.front().sequence(), last + 1);
  EXPECT_EQ(rest.back().state().state(), v1::RUN_STATE_SUCCEEDED);
  // Another epoch (a restarted server) gets a snapshot marked resync.
  req.set_epoch("some-other-server");
  rest.clear();
  ASSERT_TRUE(c.Watch(req, [&](const v1::RunEvent& ev) { rest.push_back(ev); }, stop).ok());
  ASSERT_FALSE(rest.empty());
  EXPECT_TRUE(rest.front().has_snapshot());
}

TEST(IntegrationTest, AuthTokenRequiredWhenConfigured) {
  TempDir dir;
  testing::FakeExecutor exec;
  const std::string token = "0123456789abcdef-secret";
  const std::string token_file = dir.path() + "/token";
  std::ofstream(token_file) << token << "\r\n";
  auto auth = security::Authenticator::Create("", token_file, nullptr);
  ASSERT_TRUE(auth.ok()) << auth.status();
  Server server(dir.path(), &exec, {}, {}, nullptr, auth->get());
  auto anonymous = MakeClient(server.address());
  EXPECT_EQ(anonymous.ListRuns({}).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(anonymous.Health().ok()) << "health checks need no token";
  auto wrong = MakeClient(server.address(), "not-the-token");
  EXPECT_EQ(wrong.SubmitRun(TinySpec()).status().code(), absl::StatusCode::kUnauthenticated);
  auto good = MakeClient(server.address(), token);
  EXPECT_TRUE(good.ListRuns({}).ok());
  EXPECT_EQ(good.WhoAmI()->principal(), "admin") << "--auth-token-file is one admin named admin";

  // Listening beyond loopback without a token is refused.
  app::FrontOptions open;
  open.listen = "0.0.0.0:0";
  EXPECT_FALSE(security::IsLoopbackAddress(open.listen));
  EXPECT_TRUE(security::IsLoopbackAddress("[::1]:5"));
  EXPECT_TRUE(security::IsLoopbackAddress("localhost:5"));
}

// Server reflection answers list_services with our service (what grpcurl
// uses) on a server without tokens.
TEST(IntegrationTest, ServerReflectionListsTheService) {
  TempDir dir;
  testing::FakeExecutor exec;
  Server server(dir.path(), &exec);
  absl::StatusOr<std::string> bytes = ListServicesByReflection(server.address());
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_NE(bytes->find("circuitlab.v1.ExperimentService"), std::string::npos);
  EXPECT_NE(bytes->find("grpc.health.v1.Health"), std::string::npos);
}

TEST(IntegrationTest, HealthReportsNotServingWhileDraining) {
  TempDir dir;
  testing::FakeExecutor exec;
  Server server(dir.path(), &exec);
  auto c = MakeClient(server.address());
  ASSERT_TRUE(c.Health().ok());
  // Each service by its full name too (issue 32 item 10).
  for (const char* service :
       {"circuitlab.v1.ExperimentService", "circuitlab.v1.AnalysisService", "circuitlab.v1.ReproductionService"}) {
    EXPECT_TRUE(c.Health(service).ok()) << service << ": " << c.Health(service);
  }
  EXPECT_EQ(c.Health("circuitlab.v1.NoSuchService").code(), absl::StatusCode::kNotFound);
  // Every registered service answers (issue 51 item 12): WorkerService is
  // registered but NOT_SERVING without remote workers.
  EXPECT_EQ(c.Health("circuitlab.v1.WorkerService").code(), absl::StatusCode::kUnavailable)
      << "not serving without remote workers";
  server.app().MarkNotServing();
  EXPECT_EQ(c.Health().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(c.Health("circuitlab.v1.ExperimentService").code(), absl::StatusCode::kUnavailable);
}

// Drain (SIGTERM's path) checkpoints a running run; the next server resumes it
// and it ends with exactly the final loss of an uninterrupted run.
TEST(IntegrationTest, RestartedServerResumesAndMatchesAnUninterruptedRun) {
  TempDir dir;
  auto exec = engine::MakeTorchExecutor();
  const v1::ExperimentSpec spec = TinySpec(400, 11);
  std::string interrupted;
  {
    Server server(dir.path(), exec.get());
    auto c = MakeClient(server.address());
    auto run = c.SubmitRun(spec);
    ASSERT_TRUE(run.ok());
    interrupted = run->run_id();
    ASSERT_TRUE(WaitFor([&] { return c.GetRun(interrupted)->checkpoint_step() >= 40; }));
  }  // drains: checkpoint + back to QUEUED
  Server server(dir.path(), exec.get());
  auto c = MakeClient(server.address());
  ASSERT_EQ(WaitForEnd(c, interrupted), v1::RUN_STATE_SUCCEEDED);
  auto resumed = c.GetRun(interrupted);
  EXPECT_EQ(resumed->attempts(), 2u);
  auto straight = c.SubmitRun(spec);
  ASSERT_TRUE(straight.ok());
  ASSERT_EQ(WaitForEnd(c, straight->run_id()), v1::RUN_STATE_SUCCEEDED);
  EXPECT_EQ(c.GetRun(straight->run_id())->attempts(), 1u);
  for (const char* name : {"train/loss", "eval/icl_rare/loss", "eval/train_mix/accuracy"}) {
    EXPECT_EQ(FinalValue(c, interrupted, name), FinalValue(c, straight->run_id(), name)) << name;
  }
}

}  // namespace
}  // namespace circuitlab::testing
