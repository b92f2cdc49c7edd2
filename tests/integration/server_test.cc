// Integration tests: the real gRPC server (real engine unless stated) on an
// ephemeral loopback port, driven through the client library.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <map>
#include <set>
#include <thread>

#include "client/lib/client.h"
#include "server/common/thread_cancel.h"
#include "server/engine/engine.h"
#include "server/rpc/server.h"
#include "server/scheduler/analysis_core.h"
#include "server/scheduler/scheduler.h"
#include "server/store/store.h"
#include "tests/test_util/fake_executor.h"
#include "tests/test_util/temp_dir.h"

namespace circuitlab {
namespace {

using testing::TempDir;
using testing::WaitFor;

// A tiny but real experiment: trains in well under a second per 100 steps.
v1::ExperimentSpec TinySpec(uint64_t steps = 60, uint64_t seed = 3) {
  auto spec = client::ParseSpecJson(R"({
    "name": "tiny", "seed": 3, "tags": ["it"],
    "task": {"associative_recall": {"num_common": 4, "num_rare": 12, "num_heldout": 4,
                                    "num_blocks": 4, "num_positions": 8}},
    "training": {"learning_rate": 4.0, "batch_size": 32},
    "recording": {"metrics_every": 10, "eval_every": 20, "eval_size": 64, "checkpoint_every": 20}
  })");
  EXPECT_TRUE(spec.ok()) << spec.status();
  spec->mutable_training()->set_steps(steps);
  spec->set_seed(seed);
  return *spec;
}

class Server {
 public:
  Server(const std::string& dir, engine::Executor* executor, scheduler::SchedulerOptions opts = {},
         rpc::ServerOptions server_opts = {}, engine::Analyzer* analyzer = nullptr) {
    auto store = store::Store::Open(dir);
    EXPECT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    opts.epoch = "epoch-" + std::to_string(reinterpret_cast<uintptr_t>(this));
    opts.heartbeat = std::chrono::milliseconds(200);
    scheduler_ = std::make_unique<scheduler::Scheduler>(opts, store_.get(), executor, Clock::Real());
    analysis_ = std::make_unique<scheduler::AnalysisCore>(store_.get(), analyzer ? analyzer : analyzer_.get());
    EXPECT_TRUE(scheduler_->Start().ok());
    server_opts.listen = "127.0.0.1:0";
    sweeps_ = std::make_unique<scheduler::SweepCore>(scheduler_.get(), store_.get(), analysis_.get(), 64);
    auto server = rpc::GrpcServer::Start(server_opts, scheduler_.get(), analysis_.get(), sweeps_.get());
    EXPECT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  ~Server() {
    server_->MarkNotServing();
    analysis_->Shutdown();
    scheduler_->Drain();
    server_->Shutdown(std::chrono::milliseconds(200));
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(server_->port()); }
  rpc::GrpcServer& grpc() { return *server_; }

 private:
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<engine::Analyzer> analyzer_ = engine::MakeTorchAnalyzer();
  std::unique_ptr<scheduler::Scheduler> scheduler_;
  std::unique_ptr<scheduler::AnalysisCore> analysis_;
  std::unique_ptr<scheduler::SweepCore> sweeps_;
  std::unique_ptr<rpc::GrpcServer> server_;
};

client::Client MakeClient(const std::string& address, const std::string& token = "") {
  client::ClientOptions opts;
  opts.server = address;
  opts.timeout = std::chrono::seconds(10);
  opts.token = token;
  return client::Client(opts);
}

// An analysis call, asked again while its job is pending (the server holds
// each call up to ~2 s, so a quick job answers in one); force only the first time.
template <typename Request, typename Response>
absl::StatusOr<Response> Analysis(client::Client& c,
                                  absl::StatusOr<Response> (client::Client::*call)(const Request&), Request req) {
  absl::StatusOr<Response> r = (c.*call)(req);
  req.set_force(false);
  for (int i = 0; i < 120 && r.ok() && scheduler::IsPending(r->state()); ++i) r = (c.*call)(req);
  return r;
}

v1::RunState WaitForEnd(client::Client& c, const std::string& id) {
  v1::RunState state = v1::RUN_STATE_UNSPECIFIED;
  WaitFor(
      [&] {
        auto run = c.GetRun(id);
        state = run.ok() ? run->state() : state;
        return state == v1::RUN_STATE_SUCCEEDED || state == v1::RUN_STATE_FAILED || state == v1::RUN_STATE_CANCELLED;
      },
      std::chrono::seconds(60));
  return state;
}

double FinalValue(client::Client& c, const std::string& id, const std::string& name) {
  v1::GetMetricsRequest req;
  req.set_run_id(id);
  req.add_names(name);
  auto m = c.GetMetrics(req);
  if (!m.ok() || m->series_size() != 1 || m->series(0).values_size() == 0) {
    ADD_FAILURE() << "no series " << name << " for " << id;
    return NAN;
  }
  return m->series(0).values(m->series(0).values_size() - 1);
}

// A sweep of `base` over these seeds.
v1::SweepSpec SeedSweep(const v1::ExperimentSpec& base, std::initializer_list<int> seeds) {
  v1::SweepSpec sweep;
  *sweep.mutable_base() = base;
  v1::SweepAxis* axis = sweep.add_axes();
  axis->set_field("seed");
  for (int s : seeds) axis->add_values()->set_number_value(s);
  return sweep;
}

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

// Coordinates recorded during training and the projection of the final
// checkpoint agree; a second projection comes from the store.
TEST(IntegrationTest, CoordinatesOverTrainingAndCheckpointProjection) {
  TempDir dir;
  auto exec = engine::MakeTorchExecutor();
  Server server(dir.path(), exec.get());
  auto c = MakeClient(server.address());
  v1::ExperimentSpec spec = TinySpec(60);
  spec.mutable_recording()->set_coordinates_every(20);
  spec.mutable_recording()->set_complete_coordinates(true);
  auto run = c.SubmitRun(spec);
  ASSERT_TRUE(run.ok());
  ASSERT_EQ(WaitForEnd(c, run->run_id()), v1::RUN_STATE_SUCCEEDED);

  v1::GetTrajectoryRequest traj;
  traj.set_run_id(run->run_id());
  traj.add_names("alpha");
  traj.add_names("beta");
  traj.add_names("gamma");
  traj.add_names("delta");
  auto t = c.GetTrajectory(traj);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->series_size(), 4);
  EXPECT_EQ(t->series(0).coordinate().label(), "L1H1:[∅→∅]:S_1");
  EXPECT_EQ(t->series(0).steps_size(), 4);  // steps 0, 20, 40, 60
  EXPECT_EQ(t->series(0).steps(3), 60u);
  traj.clear_names();
  EXPECT_EQ(c.GetTrajectory(traj)->series_size(), 28);  // 4 + 16 + 8 with the relation C
  traj.set_selection(v1::BASIS_SELECTION_COMPLETE);
  auto complete = c.GetTrajectory(traj);
  EXPECT_GT(complete->series_size(), 100);

  v1::ProjectCheckpointRequest proj;
  proj.set_run_id(run->run_id());
  auto p = Analysis(c, &client::Client::ProjectCheckpoint, proj);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->step(), 60u);
  EXPECT_FALSE(p->from_store());
  ASSERT_EQ(p->coordinates_size(), 28);
  for (int i = 0; i < 4; ++i) {
    const auto& s = t->series(i);
    const std::string& label = s.coordinate().label();
    for (const auto& coord : p->coordinates()) {
      if (coord.label() == label) {
        EXPECT_NEAR(coord.value(), s.values(s.values_size() - 1), 1e-9) << label;
      }
    }
  }
  EXPECT_GT(p->rho(), p->rho_complete()) << "the paper set is a subspace of the complete set";
  v1::GetMetricsRequest m;
  m.set_run_id(run->run_id());
  m.add_names("manifold/rho");
  auto rho = c.GetMetrics(m);
  ASSERT_EQ(rho->series_size(), 1);
  EXPECT_NEAR(rho->series(0).values(rho->series(0).values_size() - 1), p->rho_complete(), 1e-9);

  auto again = Analysis(c, &client::Client::ProjectCheckpoint, proj);
  EXPECT_TRUE(again->from_store());
  EXPECT_EQ(again->rho(), p->rho());
  proj.set_force(true);
  EXPECT_FALSE(Analysis(c, &client::Client::ProjectCheckpoint, proj)->from_store());
  proj.set_step(13);
  auto missing = Analysis(c, &client::Client::ProjectCheckpoint, proj);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("checkpoints at steps: 20, 40, 60"), std::string::npos)
      << missing.status();
  proj.set_step(0);
  proj.set_selection(static_cast<v1::BasisSelection>(9));
  EXPECT_EQ(Analysis(c, &client::Client::ProjectCheckpoint, proj).status().code(), absl::StatusCode::kInvalidArgument);
  traj.set_max_step(5);
  traj.set_min_step(10);
  EXPECT_EQ(c.GetTrajectory(traj).status().code(), absl::StatusCode::kInvalidArgument);
  traj.set_run_id("r77");
  traj.set_max_step(0);
  EXPECT_EQ(c.GetTrajectory(traj).status().code(), absl::StatusCode::kNotFound);
}

// The invariance check runs as an analysis job: the first call waits up to
// ~2 s and answers DONE (computed for it) or QUEUED/RUNNING; then DONE with
// the ladder, then answered from the store.
TEST(IntegrationTest, InvarianceCheckIsAQueuedStoredJob) {
  TempDir dir;
  testing::FakeExecutor exec;
  Server server(dir.path(), &exec);
  auto c = MakeClient(server.address());
  ASSERT_TRUE(c.SubmitRun(TinySpec(60)).ok());
  v1::CheckInvarianceRequest req;
  req.set_run_id("r1");
  req.add_sample_sizes(256);
  req.add_sample_sizes(1024);
  req.add_sample_sizes(4096);
  req.set_controls(true);
  auto first = c.CheckInvariance(req);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->from_store());
  EXPECT_NE(first->state(), v1::CheckInvarianceResponse::STATE_FAILED);
  if (first->state() != v1::CheckInvarianceResponse::STATE_DONE) {
    EXPECT_FALSE(first->job_id().empty());
  }
  absl::StatusOr<v1::CheckInvarianceResponse> r;
  ASSERT_TRUE(WaitFor([&] {
    r = c.CheckInvariance(req);
    return r.ok() && r->state() == v1::CheckInvarianceResponse::STATE_DONE;
  }, std::chrono::seconds(120)));
  ASSERT_EQ(r->checks_size(), 3);  // in_span + both controls (the tiny task has common pairs)
  EXPECT_EQ(r->checks(0).name(), "in_span");
  EXPECT_EQ(r->checks(2).name(), "control_no_relation");
  for (const auto& check : r->checks()) {
    ASSERT_EQ(check.series_size(), 4) << check.name();  // all, L1H1, L2H1, OUT
    EXPECT_EQ(check.series(0).off_fraction_size(), 3);
  }
  // The span keeps the gradient far better than a point off it.
  EXPECT_LT(r->checks(0).series(0).off_fraction(2), r->checks(1).series(0).off_fraction(2));
  const v1::CheckInvarianceResponse by_run = *r;
  EXPECT_TRUE(c.CheckInvariance(req)->from_store());
  req.set_run_id("r2");
  EXPECT_EQ(c.CheckInvariance(req).status().code(), absl::StatusCode::kNotFound);

  // A spec alone (no run): validated like SubmitRun, stored, answered again.
  req.clear_run_id();
  req.set_controls(false);
  *req.mutable_spec() = TinySpec(60);
  ASSERT_TRUE(WaitFor([&] {
    r = c.CheckInvariance(req);
    return r.ok() && r->state() == v1::CheckInvarianceResponse::STATE_DONE;
  }, std::chrono::seconds(120))) << r.status();
  ASSERT_EQ(r->checks_size(), 1);
  // The same task, model and seed as r1: the same ladder, value for value.
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r->checks(0).series(0).off_fraction(i), by_run.checks(0).series(0).off_fraction(i));
  }
  EXPECT_TRUE(c.CheckInvariance(req)->from_store());
  req.set_run_id("r1");
  EXPECT_EQ(c.CheckInvariance(req).status().code(), absl::StatusCode::kInvalidArgument);  // both
  req.clear_run_id();
  req.mutable_spec()->mutable_model()->mutable_imir()->set_num_layers(9);
  auto bad = c.CheckInvariance(req);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "spec: model.imir.num_layers must be in [1, 6], got 9");
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
  rpc::ServerOptions opts;
  opts.auth_token = "0123456789abcdef-secret";
  Server server(dir.path(), &exec, {}, opts);
  auto anonymous = MakeClient(server.address());
  EXPECT_EQ(anonymous.ListRuns({}).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(anonymous.Health().ok()) << "health checks need no token";
  auto wrong = MakeClient(server.address(), "not-the-token");
  EXPECT_EQ(wrong.SubmitRun(TinySpec()).status().code(), absl::StatusCode::kUnauthenticated);
  auto good = MakeClient(server.address(), opts.auth_token);
  EXPECT_TRUE(good.ListRuns({}).ok());

  // Listening beyond loopback without a token is refused.
  rpc::ServerOptions open;
  open.listen = "0.0.0.0:0";
  EXPECT_FALSE(rpc::IsLoopbackAddress(open.listen));
  EXPECT_TRUE(rpc::IsLoopbackAddress("[::1]:5"));
  EXPECT_TRUE(rpc::IsLoopbackAddress("localhost:5"));
}

// Server reflection answers list_services with our service (what grpcurl
// uses). Debian ships no reflection stubs, so this speaks the protocol with a
// generic stub and hand-encoded bytes: ServerReflectionRequest{list_services:""}
// is field 7, length-delimited, empty.
TEST(IntegrationTest, ServerReflectionListsTheService) {
  TempDir dir;
  testing::FakeExecutor exec;
  Server server(dir.path(), &exec);
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto call = stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  auto await = [&](intptr_t want) {
    void* tag = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(reinterpret_cast<intptr_t>(tag), want);
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(await(1));
  grpc::Slice request(std::string("\x3a\x00", 2));
  grpc::ByteBuffer buffer(&request, 1);
  call->Write(buffer, reinterpret_cast<void*>(2));
  ASSERT_TRUE(await(2));
  call->WritesDone(reinterpret_cast<void*>(3));
  ASSERT_TRUE(await(3));
  grpc::ByteBuffer response;
  call->Read(&response, reinterpret_cast<void*>(4));
  ASSERT_TRUE(await(4));
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_NE(bytes.find("circuitlab.v1.ExperimentService"), std::string::npos);
  EXPECT_NE(bytes.find("grpc.health.v1.Health"), std::string::npos);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  await(5);
  EXPECT_TRUE(status.ok()) << status.error_message();
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
}

TEST(IntegrationTest, HealthReportsNotServingWhileDraining) {
  TempDir dir;
  testing::FakeExecutor exec;
  Server server(dir.path(), &exec);
  auto c = MakeClient(server.address());
  ASSERT_TRUE(c.Health().ok());
  server.grpc().MarkNotServing();
  EXPECT_EQ(c.Health().code(), absl::StatusCode::kUnavailable);
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


TEST(IntegrationTest, SweepExpandsFiltersPivotsAndCancels) {
  TempDir dir;
  auto exec = engine::MakeTorchExecutor();
  scheduler::SchedulerOptions opts;
  opts.cpu_slots = 2;
  Server server(dir.path(), exec.get(), opts);
  auto c = MakeClient(server.address());
  v1::SweepSpec sweep;
  sweep.set_name("lr-by-seed");
  *sweep.mutable_base() = TinySpec(40);
  v1::SweepAxis* lr = sweep.add_axes();
  lr->set_field("training.learning_rate");
  lr->set_name("lr");
  lr->add_values()->set_number_value(0.5);
  lr->add_values()->set_number_value(4);
  v1::SweepAxis* seed = sweep.add_axes();
  seed->set_field("seed");
  seed->add_values()->set_number_value(1);
  seed->add_values()->set_number_value(2);
  auto sw = c.SubmitSweep(sweep);
  ASSERT_TRUE(sw.ok()) << sw.status();
  EXPECT_EQ(sw->sweep_id(), "s1");
  ASSERT_EQ(sw->run_ids_size(), 4);
  for (const std::string& id : sw->run_ids()) EXPECT_EQ(WaitForEnd(c, id), v1::RUN_STATE_SUCCEEDED);
  auto run = c.GetRun("r3");
  EXPECT_EQ(run->sweep_id(), "s1");
  EXPECT_DOUBLE_EQ(run->spec().training().learning_rate(), 4.0);
  EXPECT_EQ(run->spec().seed(), 1u);
  EXPECT_TRUE(c.GetSweep("s1")->done());

  v1::GetSweepSummaryRequest req;
  req.set_sweep_id("s1");
  req.add_values("eval/icl_rare/accuracy");
  req.add_values("first:eval/icl_rare/accuracy>=0");
  req.add_values("circuit");
  req.mutable_pivot()->set_x("lr");
  req.mutable_pivot()->set_y("seed");
  req.mutable_pivot()->set_value("eval/icl_rare/accuracy");
  absl::StatusOr<v1::GetSweepSummaryResponse> s;
  // The circuit labels are computed on demand: pending until they are done.
  ASSERT_TRUE(WaitFor([&] {
    s = c.GetSweepSummary(req);
    return s.ok() && s->pending() == 0;
  }, std::chrono::seconds(120))) << s.status();
  ASSERT_EQ(s->rows_size(), 4);
  EXPECT_EQ(s->axes(0), "lr");
  EXPECT_EQ(s->axes(1), "seed");
  for (const v1::SweepRow& r : s->rows()) {
    EXPECT_EQ(r.values(0).number_value(), FinalValue(c, r.run_id(), "eval/icl_rare/accuracy"));
    EXPECT_EQ(r.values(1).number_value(), 0);  // the first evaluation (step 0) already reaches >= 0
    EXPECT_FALSE(r.values(2).string_value().empty());
  }
  // The pivot: 2 x 2 cells, each the one run with those values.
  ASSERT_EQ(s->pivot().cells_size(), 4);
  EXPECT_EQ(s->pivot().x_values(1).number_value(), 4);
  EXPECT_EQ(s->pivot().cells(1).number_value(), s->rows(2).values(0).number_value());  // seed 1, lr 4 = r3
  {
    // A pivot fetches the column it pivots when `values` did not name it
    // (`sweep-summary s1 --pivot lr seed --value circuit`).
    v1::GetSweepSummaryRequest only_pivot;
    only_pivot.set_sweep_id("s1");
    only_pivot.mutable_pivot()->set_x("lr");
    only_pivot.mutable_pivot()->set_y("seed");
    only_pivot.mutable_pivot()->set_value("circuit");
    auto p = c.GetSweepSummary(only_pivot);
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_EQ(p->pivot().cells_size(), 4);
    EXPECT_EQ(p->pivot().cells(1).string_value(), s->rows(2).values(2).string_value());
    only_pivot.mutable_pivot()->set_value("first:bad");
    auto bad = c.GetSweepSummary(only_pivot);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(bad.status().message().find("pivot.value"), std::string::npos) << bad.status();
  }
  req.clear_pivot();
  req.add_filters("lr>=1");
  req.add_filters("state=succeeded");
  req.add_filters("first:eval/icl_rare/accuracy>=0=0");  // the operator is the rightmost one
  s = c.GetSweepSummary(req);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->rows_size(), 2);
  EXPECT_EQ(s->rows(0).run_id(), "r3");
  req.clear_filters();
  req.add_filters("no_such>1");
  EXPECT_EQ(c.GetSweepSummary(req).status().code(), absl::StatusCode::kInvalidArgument);
  v1::ListRunsRequest list;
  list.set_sweep_id("s1");
  EXPECT_EQ(c.ListRuns(list)->total_size(), 4);

  // A member that fails validation queues nothing; cancelling cancels all.
  v1::SweepSpec bad = sweep;
  bad.mutable_axes(0)->add_values()->set_number_value(-1);
  auto rejected = c.SubmitSweep(bad);
  EXPECT_EQ(rejected.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(rejected.status().message().find("training.learning_rate"), std::string::npos) << rejected.status();
  EXPECT_EQ(c.ListRuns({})->total_size(), 4);
  *sweep.mutable_base() = TinySpec(200000);
  auto long_sweep = c.SubmitSweep(sweep);
  ASSERT_TRUE(long_sweep.ok()) << long_sweep.status();
  auto cancelled = c.CancelSweep(long_sweep->sweep_id());
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  for (const std::string& id : long_sweep->run_ids()) EXPECT_EQ(WaitForEnd(c, id), v1::RUN_STATE_CANCELLED);
  EXPECT_EQ(c.GetSweep("s9").status().code(), absl::StatusCode::kNotFound);
}

TEST(IntegrationTest, DetectInterveneAndLabelAgreeOnACoordinateModel) {
  TempDir dir;
  auto exec = engine::MakeTorchExecutor();
  Server server(dir.path(), exec.get());
  auto c = MakeClient(server.address());
  v1::ExperimentSpec spec = TinySpec(150);
  spec.mutable_model()->mutable_imir()->set_parameterisation(v1::PARAMETERISATION_COORDINATES);
  spec.mutable_model()->mutable_imir()->set_coordinate_scaling(v1::COORDINATE_SCALING_RAW);
  ASSERT_TRUE(c.SubmitRun(spec).ok());
  ASSERT_EQ(WaitForEnd(c, "r1"), v1::RUN_STATE_SUCCEEDED);

  v1::DetectCircuitRequest dreq;
  dreq.set_run_id("r1");
  dreq.set_n_eval(512);
  absl::StatusOr<v1::DetectCircuitResponse> d;
  ASSERT_TRUE(WaitFor([&] {
    d = c.DetectCircuit(dreq);
    return d.ok() && (d->state() == v1::ANALYSIS_STATE_DONE || d->state() == v1::ANALYSIS_STATE_FAILED);
  }, std::chrono::seconds(120))) << d.status();
  ASSERT_EQ(d->state(), v1::ANALYSIS_STATE_DONE) << d->error();
  EXPECT_EQ(d->eval_set(), "icl_rare");
  // A coordinate model is its own projection.
  EXPECT_NEAR(d->m_dense(), d->m_ref(), 1e-12);
  EXPECT_FALSE(d->projection_not_faithful());
  // The greedy ablation keeps the metric within the tolerance, with fewer coordinates.
  EXPECT_GE(d->m_circuit(), d->m_ref() - 0.01);
  EXPECT_LT(d->circuit_size(), static_cast<int>(d->candidates()));
  EXPECT_GT(d->evaluations(), 0u);
  for (const auto& m : d->circuit()) EXPECT_FALSE(m.role().empty());
  EXPECT_TRUE(c.DetectCircuit(dreq)->from_store());

  // Keeping only K* reproduces m_circuit on the same sequences.
  v1::InterveneRequest ireq;
  ireq.set_run_id("r1");
  ireq.set_n_eval(512);
  ireq.add_eval_sets("icl_rare");
  v1::Intervention* keep = ireq.add_interventions();
  keep->set_op(v1::Intervention::OP_KEEP_ONLY);
  for (const auto& m : d->circuit()) keep->add_coordinates(m.coordinate().label());
  auto iv = Analysis(c, &client::Client::Intervene, ireq);
  ASSERT_TRUE(iv.ok()) << iv.status();
  ASSERT_EQ(iv->effects_size(), 1);
  EXPECT_DOUBLE_EQ(iv->effects(0).accuracy(), d->m_circuit());
  EXPECT_DOUBLE_EQ(iv->effects(0).accuracy_clean(), d->m_ref());
  // Scaling by 1 changes nothing; ablating the last head changes the model.
  ireq.clear_interventions();
  v1::Intervention* same = ireq.add_interventions();
  same->set_op(v1::Intervention::OP_SCALE_COORDINATE);
  same->set_scale(1.0);
  same->add_coordinates("gamma");
  iv = Analysis(c, &client::Client::Intervene, ireq);
  ASSERT_TRUE(iv.ok()) << iv.status();
  EXPECT_NEAR(iv->effects(0).kl_clean(), 0.0, 1e-12);
  ireq.clear_interventions();
  v1::Intervention* head = ireq.add_interventions();
  head->set_op(v1::Intervention::OP_ABLATE_HEAD);
  head->set_layer(2);
  ireq.clear_eval_sets();
  iv = Analysis(c, &client::Client::Intervene, ireq);
  ASSERT_TRUE(iv.ok()) << iv.status();
  EXPECT_GE(iv->effects_size(), 4);  // every evaluation set of the task
  EXPECT_GT(iv->effects(0).kl_clean(), 1e-6);
  head->set_layer(3);
  auto bad = Analysis(c, &client::Client::Intervene, ireq);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "interventions[0].layer must be in [1, 2], got 3");
  head->set_op(v1::Intervention::OP_ZERO_COORDINATE);
  head->add_coordinates("no_such");
  EXPECT_EQ(Analysis(c, &client::Client::Intervene, ireq).status().code(), absl::StatusCode::kInvalidArgument);

  // D.6 hook-point ops on the block model: zeroing the last head's output
  // at the query is ablating that head; patching every position of X_2 from
  // another set gives that set's answers; the mean attention is a real edit.
  auto effect = [&](const std::vector<v1::Intervention>& ops, const std::string& set) {
    v1::InterveneRequest r;
    r.set_run_id("r1");
    r.set_n_eval(512);
    r.add_eval_sets(set);
    for (const auto& op : ops) *r.add_interventions() = op;
    auto out = Analysis(c, &client::Client::Intervene, r);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? out->effects(0) : v1::InterventionEffect();
  };
  v1::Intervention ablate;
  ablate.set_op(v1::Intervention::OP_ABLATE_HEAD);
  ablate.set_layer(2);
  v1::Intervention zero_out;
  zero_out.set_op(v1::Intervention::OP_ZERO);
  zero_out.set_hook("L2.H1.out");
  const v1::InterventionEffect by_weights = effect({ablate}, "icl_rare"), by_hook = effect({zero_out}, "icl_rare");
  EXPECT_NEAR(by_hook.loss(), by_weights.loss(), 1e-5);
  EXPECT_NEAR(by_hook.accuracy(), by_weights.accuracy(), 1e-12);
  EXPECT_GT(by_hook.kl_clean(), 1e-6);
  v1::Intervention keep_mean;
  keep_mean.set_op(v1::Intervention::OP_MEAN);
  keep_mean.set_hook("L1.attn");
  keep_mean.add_positions(3);
  EXPECT_GT(effect({keep_mean}, "icl_rare").kl_clean(), 0.0);
  // D.6 attention_mass: the query's mass on the previous position at layer 1
  // (clean, then with layer 1's pattern zeroed), and position 0 on itself
  // (the only key it sees: exactly 1).
  {
    v1::InterveneRequest r;
    r.set_run_id("r1");
    r.set_n_eval(256);
    r.add_eval_sets("icl_rare");
    v1::Intervention zero_attn;
    zero_attn.set_op(v1::Intervention::OP_ZERO);
    zero_attn.set_hook("L1.attn");
    *r.add_interventions() = zero_attn;
    v1::AttentionMass* prev = r.add_attention_mass();
    prev->set_pattern("L1.attn");
    prev->add_keys(-1);
    v1::AttentionMass* self = r.add_attention_mass();
    self->set_pattern("L2.attn");
    self->add_keys(0);
    self->add_queries(0);
    auto out = Analysis(c, &client::Client::Intervene, r);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->effects(0).attention_mass_size(), 2);
    const v1::AttentionMassEffect& m = out->effects(0).attention_mass(0);
    EXPECT_EQ(m.pattern(), "L1.attn");
    ASSERT_EQ(m.clean_size(), 1);
    EXPECT_GT(m.clean(0), 0.0);
    EXPECT_LT(m.clean(0), 1.0);
    EXPECT_EQ(m.intervened(0), 0.0);  // the zeroed pattern
    EXPECT_NEAR(out->effects(0).attention_mass(1).clean(0), 1.0, 1e-6);
    EXPECT_NEAR(out->effects(0).attention_mass(1).intervened(0), 1.0, 1e-6);
    // D.6 logit_diff for a chosen pair replaces the task's: antisymmetric in
    // the pair, refused beyond the vocabulary.
    r.add_logit_diff_tokens(5);  // a common token and a rare one
    r.add_logit_diff_tokens(10);
    auto forward = Analysis(c, &client::Client::Intervene, r);
    r.set_logit_diff_tokens(0, 10);
    r.set_logit_diff_tokens(1, 5);
    auto backward = Analysis(c, &client::Client::Intervene, r);
    ASSERT_TRUE(forward.ok() && backward.ok()) << forward.status() << backward.status();
    EXPECT_TRUE(forward->effects(0).has_logit_diff());
    EXPECT_EQ(forward->effects(0).alt_name(), "tokens 5-10");
    EXPECT_NEAR(forward->effects(0).logit_diff(), -backward->effects(0).logit_diff(), 1e-9);
    EXPECT_NEAR(forward->effects(0).logit_diff_clean(), -backward->effects(0).logit_diff_clean(), 1e-9);
    EXPECT_NE(forward->effects(0).logit_diff(), forward->effects(0).logit_diff_clean());
    r.set_logit_diff_tokens(1, 100000);
    EXPECT_EQ(Analysis(c, &client::Client::Intervene, r).status().code(), absl::StatusCode::kInvalidArgument);
    r.add_logit_diff_tokens(3);
    EXPECT_EQ(Analysis(c, &client::Client::Intervene, r).status().code(), absl::StatusCode::kInvalidArgument);
    r.clear_logit_diff_tokens();
    prev->set_pattern("L1.resid");
    auto refused = Analysis(c, &client::Client::Intervene, r);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find("attention_mass[0].pattern"), std::string::npos) << refused.status();
    prev->set_pattern("L1.attn");
    prev->set_keys(0, 100000);
    refused = Analysis(c, &client::Client::Intervene, r);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find("attention_mass[0].keys[0] must be in"), std::string::npos)
        << refused.status();
  }
  v1::Intervention bad_hook = zero_out;
  bad_hook.set_hook("L3.resid");
  ireq.clear_interventions();
  *ireq.add_interventions() = bad_hook;
  auto refused = Analysis(c, &client::Client::Intervene, ireq);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("L{l}.H{h}.out"), std::string::npos) << refused.status();
  bad_hook.set_hook("L2.resid");
  bad_hook.set_op(v1::Intervention::OP_ADD);
  bad_hook.add_vectors()->add_values(1.0);
  *ireq.mutable_interventions(0) = bad_hook;
  refused = Analysis(c, &client::Client::Intervene, ireq);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("has width"), std::string::npos) << refused.status();
  bad_hook.clear_vectors();
  bad_hook.set_op(v1::Intervention::OP_REPLACE_CONVEX);  // an IMIR run has no task vectors
  *ireq.mutable_interventions(0) = bad_hook;
  EXPECT_EQ(Analysis(c, &client::Client::Intervene, ireq).status().code(), absl::StatusCode::kFailedPrecondition);

  v1::LabelRunRequest lreq;
  lreq.set_run_id("r1");
  lreq.set_n_eval(256);
  absl::StatusOr<v1::LabelRunResponse> l;
  ASSERT_TRUE(WaitFor([&] {
    l = c.LabelRun(lreq);
    return l.ok() && (l->state() == v1::ANALYSIS_STATE_DONE || l->state() == v1::ANALYSIS_STATE_FAILED);
  }, std::chrono::seconds(120))) << l.status();
  ASSERT_EQ(l->state(), v1::ANALYSIS_STATE_DONE) << l->error();
  ASSERT_GE(l->checkpoints_size(), 1);
  EXPECT_EQ(l->label(), l->checkpoints(l->checkpoints_size() - 1).label());
  EXPECT_EQ(l->checkpoints(0).head_ablation_size(), 2);
  // A 2-layer model has one candidate pair; its path is tried whenever the
  // accuracy stands (a pair label other than NONE).
  const v1::CheckpointLabel& last = l->checkpoints(l->checkpoints_size() - 1);
  EXPECT_EQ(last.pair_ablation_size(), last.pair() == "NONE" ? 0 : 1) << last.pair();
  if (last.pair() != "NONE") {
    ASSERT_TRUE(last.pair_ablation().contains("1-2"));
    EXPECT_EQ(last.pair() == "1-2", last.pair_ablation().at("1-2") >= 0.5) << last.pair();
  }
  dreq.set_metric("median");
  EXPECT_EQ(c.DetectCircuit(dreq).status().code(), absl::StatusCode::kInvalidArgument);
}


TEST(IntegrationTest, EarlyStopAndDataDependenceCheck) {
  TempDir dir;
  auto exec = engine::MakeTorchExecutor();
  Server server(dir.path(), exec.get());
  auto c = MakeClient(server.address());
  // Early stop: the run ends SUCCEEDED at the first evaluation reaching the threshold.
  v1::ExperimentSpec spec = TinySpec(400);
  spec.mutable_training()->set_stop_metric("eval/iwl/accuracy");
  spec.mutable_training()->set_stop_at(-1.0);  // reached at the first evaluation
  ASSERT_TRUE(c.SubmitRun(spec).ok());
  ASSERT_EQ(WaitForEnd(c, "r1"), v1::RUN_STATE_SUCCEEDED);
  auto run = c.GetRun("r1");
  EXPECT_EQ(run->progress().step(), spec.recording().eval_every());
  EXPECT_EQ(run->checkpoint_step(), spec.recording().eval_every());
  spec.mutable_training()->set_stop_metric("eval/no_such_set/accuracy");
  ASSERT_TRUE(c.SubmitRun(spec).ok());
  ASSERT_EQ(WaitForEnd(c, "r2"), v1::RUN_STATE_FAILED);
  EXPECT_NE(c.GetRun("r2")->error().find("not an evaluation metric"), std::string::npos) << c.GetRun("r2")->error();
  spec.mutable_training()->set_stop_metric("train/loss");
  EXPECT_EQ(c.SubmitRun(spec).status().code(), absl::StatusCode::kInvalidArgument);

  // The data-dependence check on r1's task: the zero-point identities and
  // E.7's exact burstiness law hold at any sample size.
  v1::CheckDataDependenceRequest req;
  req.set_run_id("r1");
  req.set_samples(512);
  for (uint32_t b : {1u, 2u}) {
    v1::DataPoint* p = req.add_points();
    p->set_rare_fraction(1.0);
    p->set_burstiness(b);
  }
  v1::DataPoint* half = req.add_points();
  half->set_rare_fraction(0.5);
  half->set_delta_saturated(true);
  absl::StatusOr<v1::CheckDataDependenceResponse> r;
  ASSERT_TRUE(WaitFor([&] {
    r = c.CheckDataDependence(req);
    return r.ok() && (r->state() == v1::ANALYSIS_STATE_DONE || r->state() == v1::ANALYSIS_STATE_FAILED);
  }, std::chrono::seconds(120))) << r.status();
  ASSERT_EQ(r->state(), v1::ANALYSIS_STATE_DONE) << r->error();
  ASSERT_EQ(r->rows_size(), 3);
  for (const auto& row : r->rows()) {
    EXPECT_LT(row.identity_max_rel_error(), 1e-9);
    EXPECT_GT(row.gamma_stderr(), 0);  // defined even for few samples (chunk means)
  }
  EXPECT_DOUBLE_EQ(r->rows(0).ratio(), 1.0);  // f_r = 1 is its own reference
  EXPECT_NEAR(r->rows(1).grad_gamma(), r->rows(1).closed_form_gamma(), 1e-9);
  EXPECT_GT(r->rows(2).point().delta(), 1.0);  // delta* resolved
  EXPECT_DOUBLE_EQ(r->rows(2).phi(), 0.5);
  EXPECT_TRUE(c.CheckDataDependence(req)->from_store());
  req.mutable_points(0)->set_burstiness(99);
  auto bad = c.CheckDataDependence(req);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("points[0].burstiness must be in [1, 4]"), std::string::npos) << bad.status();
  req.clear_run_id();
  *req.mutable_spec() = TinySpec(60);
  req.mutable_spec()->mutable_task()->mutable_associative_recall()->set_num_common(0);
  req.mutable_spec()->mutable_data()->set_rare_fraction(1.0);
  auto no_commons = c.CheckDataDependence(req);
  EXPECT_EQ(no_commons.status().code(), absl::StatusCode::kFailedPrecondition) << no_commons.status();
}


// Seed members of a sweep train as one ensemble, yet each run matches the
// same spec trained alone, and its checkpoint is its own.
TEST(IntegrationTest, PackedSweepMembersMatchRunsTrainedAlone) {
  TempDir dir;
  auto exec = engine::MakeTorchExecutor();
  Server server(dir.path(), exec.get());
  auto c = MakeClient(server.address());
  const v1::SweepSpec sweep = SeedSweep(TinySpec(60), {1, 2, 3});
  auto sw = c.SubmitSweep(sweep);
  ASSERT_TRUE(sw.ok()) << sw.status();
  for (const std::string& id : sw->run_ids()) ASSERT_EQ(WaitForEnd(c, id), v1::RUN_STATE_SUCCEEDED);
  ASSERT_TRUE(c.SubmitRun(TinySpec(60, 2)).ok());
  ASSERT_EQ(WaitForEnd(c, "r4"), v1::RUN_STATE_SUCCEEDED);
  for (const char* name : {"eval/icl_rare/loss", "train/loss"}) {
    EXPECT_NEAR(FinalValue(c, "r2", name), FinalValue(c, "r4", name), 1e-5) << name;
  }
  EXPECT_NE(FinalValue(c, "r1", "eval/icl_rare/loss"), FinalValue(c, "r2", "eval/icl_rare/loss"));
  EXPECT_EQ(c.GetRun("r2")->attempts(), 1u);
  // Each member's checkpoint is a one-member checkpoint of its own spec.
  v1::ProjectCheckpointRequest p;
  p.set_run_id("r2");
  auto packed = Analysis(c, &client::Client::ProjectCheckpoint, p);
  ASSERT_TRUE(packed.ok()) << packed.status();
  p.set_run_id("r4");
  auto alone = Analysis(c, &client::Client::ProjectCheckpoint, p);
  ASSERT_TRUE(alone.ok()) << alone.status();
  ASSERT_EQ(packed->coordinates_size(), alone->coordinates_size());
  for (int i = 0; i < packed->coordinates_size(); ++i) {
    EXPECT_NEAR(packed->coordinates(i).value(), alone->coordinates(i).value(), 1e-5);
  }
}


// A drained pack checkpoints every member; after a restart each resumes
// alone from its own checkpoint and ends like a run trained alone.
TEST(IntegrationTest, DrainedPackMembersResumeAlone) {
  TempDir dir;
  auto exec = engine::MakeTorchExecutor();
  const v1::SweepSpec sweep = SeedSweep(TinySpec(400), {5, 6});
  {
    Server server(dir.path(), exec.get());
    auto c = MakeClient(server.address());
    ASSERT_TRUE(c.SubmitSweep(sweep).ok());
    ASSERT_TRUE(WaitFor([&] { return c.GetRun("r2")->checkpoint_step() >= 40; }));
  }  // drains: every member checkpoints and goes back to QUEUED
  Server server(dir.path(), exec.get());
  auto c = MakeClient(server.address());
  for (const char* id : {"r1", "r2"}) {
    ASSERT_EQ(WaitForEnd(c, id), v1::RUN_STATE_SUCCEEDED) << id;
    EXPECT_EQ(c.GetRun(id)->attempts(), 2u) << id;
  }
  ASSERT_TRUE(c.SubmitRun(TinySpec(400, 6)).ok());
  ASSERT_EQ(WaitForEnd(c, "r3"), v1::RUN_STATE_SUCCEEDED);
  for (const char* name : {"train/loss", "eval/icl_rare/loss"}) {
    EXPECT_NEAR(FinalValue(c, "r2", name), FinalValue(c, "r3", name), 1e-4) << name;
  }
}


// Packed members stop early on their own: each at the step it would alone.
TEST(IntegrationTest, PackedMembersStopEarlyAtTheirOwnSteps) {
  TempDir dir;
  auto exec = engine::MakeTorchExecutor();
  Server server(dir.path(), exec.get());
  auto c = MakeClient(server.address());
  v1::ExperimentSpec base = TinySpec(400);
  // Measured: seeds 1, 2, 3 reach icl_rare >= 0.25 at steps 245, 240, 245
  // (5, 6: 180, 235), so the members end at different steps.
  base.mutable_training()->set_stop_metric("eval/icl_rare/accuracy");
  base.mutable_training()->set_stop_at(0.25);
  base.mutable_recording()->set_eval_every(5);
  const v1::SweepSpec sweep = SeedSweep(base, {1, 2, 5});
  auto sw = c.SubmitSweep(sweep);
  ASSERT_TRUE(sw.ok()) << sw.status();
  std::vector<uint64_t> packed_steps;
  for (const std::string& id : sw->run_ids()) {
    ASSERT_EQ(WaitForEnd(c, id), v1::RUN_STATE_SUCCEEDED);
    packed_steps.push_back(c.GetRun(id)->progress().step());
  }
  EXPECT_NE(packed_steps[0], packed_steps[2]);  // not one stop for all
  const uint64_t seed_of[] = {1, 2, 5};
  for (size_t i = 0; i < 3; ++i) {
    v1::ExperimentSpec alone = base;
    alone.set_seed(seed_of[i]);
    auto run = c.SubmitRun(alone);
    ASSERT_TRUE(run.ok());
    ASSERT_EQ(WaitForEnd(c, run->run_id()), v1::RUN_STATE_SUCCEEDED);
    EXPECT_EQ(c.GetRun(run->run_id())->progress().step(), packed_steps[i]) << "seed " << seed_of[i];
    EXPECT_EQ(c.GetRun(run->run_id())->checkpoint_step(), packed_steps[i]);
    EXPECT_LT(packed_steps[i], 400u);
  }
}

}  // namespace
}  // namespace circuitlab

namespace circuitlab {
namespace {

// A latent-task run on the decoder, small enough for seconds.
v1::ExperimentSpec TinyLatentSpec(int diversity) {
  auto spec = client::ParseSpecJson(R"({
    "name": "tiny-dice", "seed": 5,
    "task": {"latent": {"kind": "LATENT_KIND_DICE", "seq_len": 16, "diversity": )" + std::to_string(diversity) + R"(}},
    "model": {"decoder": {"num_layers": 2, "d_model": 16, "num_heads": 2}},
    "training": {"steps": 60, "learning_rate": 0.005},
    "recording": {"eval_every": 20, "eval_size": 32, "checkpoint_every": 20}
  })");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

v1::AnalyzeTaskVectorsResponse WaitTaskVectors(client::Client& c, v1::AnalyzeTaskVectorsRequest req) {
  absl::StatusOr<v1::AnalyzeTaskVectorsResponse> r;
  EXPECT_TRUE(WaitFor(
      [&] {
        r = c.AnalyzeTaskVectors(req);
        return !r.ok() || r->state() == v1::ANALYSIS_STATE_DONE || r->state() == v1::ANALYSIS_STATE_FAILED;
      },
      std::chrono::seconds(120)));
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : v1::AnalyzeTaskVectorsResponse{};
}

TEST(IntegrationTest, TaskVectorsOfARunItsTrainingAndASweep) {
  TempDir dir;
  auto exec = engine::MakeTorchExecutor();
  scheduler::SchedulerOptions opts;
  opts.cpu_slots = 2;
  Server server(dir.path(), exec.get(), opts);
  auto c = MakeClient(server.address());
  auto run = c.SubmitRun(TinyLatentSpec(-1));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(run->spec().model().has_decoder());
  EXPECT_EQ(run->spec().training().optimizer(), v1::OPTIMIZER_KIND_ADAMW);  // latent defaults
  EXPECT_EQ(run->spec().training().schedule(), v1::LR_SCHEDULE_TRIANGLE);
  ASSERT_EQ(WaitForEnd(c, run->run_id()), v1::RUN_STATE_SUCCEEDED);
  EXPECT_LT(FinalValue(c, run->run_id(), "eval/id/loss"), std::log(6.0));
  EXPECT_GT(FinalValue(c, run->run_id(), "eval/id/bayes_loss"), 0.5);

  v1::AnalyzeTaskVectorsRequest req;
  req.set_run_id(run->run_id());
  req.add_analyses("p0");
  req.add_analyses("p3");
  req.add_analyses("ood_r2");
  req.add_analyses("steering");
  req.set_samples_per_cell(16);
  req.set_p3_samples(32);
  req.set_steering_samples(64);
  req.set_steering_est_samples(32);
  req.add_analyses("dissociation");
  req.set_probe_samples(64);
  req.set_eval_samples(16);
  req.set_opt_steps(5);
  req.set_stats_samples(16);
  auto first = c.AnalyzeTaskVectors(req);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_NE(first->state(), v1::ANALYSIS_STATE_FAILED);
  v1::AnalyzeTaskVectorsResponse done = WaitTaskVectors(c, req);
  ASSERT_EQ(done.state(), v1::ANALYSIS_STATE_DONE) << done.error();
  EXPECT_EQ(done.request().hook(), "post_mlp");
  EXPECT_EQ(done.request().seed(), 5u);  // the run's seed
  std::map<std::string, int> names;
  for (const auto& v : done.values()) {
    ++names[v.name()];
    EXPECT_EQ(v.run_id(), run->run_id());
    EXPECT_EQ(v.step(), 60u);
    EXPECT_TRUE(std::isfinite(v.value())) << v.name();
  }
  EXPECT_EQ(names["p0/resid_ratio"], 2 * 4);  // 2 layers x positions 2, 4, 8 and T-2 = 14
  EXPECT_EQ(names["ood_r2/code"], 2);
  EXPECT_EQ(names["steering/kl_inj"], 1);
  EXPECT_EQ(names["p3/r_mean/task2"], 2);
  EXPECT_EQ(names.count("kl/exact"), 0u);  // not asked
  EXPECT_EQ(names["dissociation/vopt/ood/pct"], 1);  // no minor tasks: major and ood groups
  EXPECT_EQ(names.count("dissociation/vopt/minor/pct"), 0u);
  EXPECT_EQ(names["stats/r2_vopt"], 1);
  EXPECT_EQ(done.request().opt_target(), "minor");  // falls back to OOD without minors
  // Asked again: the stored answer.
  auto again = c.AnalyzeTaskVectors(req);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->from_store());
  EXPECT_EQ(again->values_size(), done.values_size());

  // Over training: every stored checkpoint (20, 40, 60).
  v1::AnalyzeTaskVectorsRequest over;
  over.set_run_id(run->run_id());
  over.set_all_checkpoints(true);
  over.add_analyses("ood_r2");
  over.add_layers(1);
  v1::AnalyzeTaskVectorsResponse training = WaitTaskVectors(c, over);
  ASSERT_EQ(training.state(), v1::ANALYSIS_STATE_DONE) << training.error();
  std::set<uint64_t> steps;
  for (const auto& v : training.values()) steps.insert(v.step());
  EXPECT_EQ(steps, (std::set<uint64_t>{20, 40, 60}));

  // Errors name the field and the allowed range.
  v1::AnalyzeTaskVectorsRequest bad = req;
  bad.add_layers(7);
  EXPECT_EQ(c.AnalyzeTaskVectors(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = req;
  bad.set_samples_per_cell(100000);
  auto too_many = c.AnalyzeTaskVectors(bad);
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.status().message().find("samples_per_cell must be in [8, 4096]"), std::string::npos);
  bad = req;
  bad.add_analyses("dyck_p0");  // a DICE run
  EXPECT_EQ(c.AnalyzeTaskVectors(bad).status().code(), absl::StatusCode::kFailedPrecondition);
  bad = req;
  bad.set_opt_target("majors");
  EXPECT_EQ(c.AnalyzeTaskVectors(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = req;
  bad.set_sweep_id("s1");
  EXPECT_EQ(c.AnalyzeTaskVectors(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = req;
  bad.set_step(7);
  EXPECT_EQ(c.AnalyzeTaskVectors(bad).status().code(), absl::StatusCode::kNotFound);
  // Hook-point interventions (D.6) on the decoder run, answered at once.
  v1::InterveneRequest patch;
  patch.set_run_id(run->run_id());
  patch.set_n_eval(64);
  patch.add_eval_sets("id");
  v1::Intervention* op = patch.add_interventions();
  op->set_op(v1::Intervention::OP_PATCH);
  op->set_hook("L1.post_attn");
  op->set_reference_set("ood");
  auto patched = Analysis(c, &client::Client::Intervene, patch);
  ASSERT_TRUE(patched.ok()) << patched.status();
  ASSERT_EQ(patched->effects_size(), 1);
  EXPECT_GT(patched->effects(0).kl_clean(), 0.0);
  EXPECT_GT(patched->effects(0).loss(), patched->effects(0).loss_clean());
  EXPECT_TRUE(patched->effects(0).has_kl_ref());
  EXPECT_EQ(patched->effects(0).ref_name(), "bayes");
  // attention_mass on the token decoder: every position's mass on the
  // previous one at layer 1, then with that pattern zeroed.
  v1::InterveneRequest massed = patch;
  massed.mutable_interventions(0)->set_op(v1::Intervention::OP_ZERO);
  massed.mutable_interventions(0)->set_hook("L1.attn.pattern");
  massed.mutable_interventions(0)->clear_reference_set();
  v1::AttentionMass* previous = massed.add_attention_mass();
  previous->set_pattern("L1.attn.pattern");
  previous->add_keys(-1);
  auto mass = Analysis(c, &client::Client::Intervene, massed);
  ASSERT_TRUE(mass.ok()) << mass.status();
  const v1::AttentionMassEffect& on_previous = mass->effects(0).attention_mass(0);
  ASSERT_EQ(on_previous.clean_size(), 2);
  EXPECT_GT(on_previous.clean(0), 0.0);
  EXPECT_LT(on_previous.clean(0), 1.0);
  EXPECT_EQ(on_previous.intervened(0), 0.0);
  EXPECT_EQ(on_previous.intervened(1), 0.0);
  // D.6 logit_diff for a token pair at every predicting position.
  massed.add_logit_diff_tokens(0);
  massed.add_logit_diff_tokens(1);
  auto zero_one = Analysis(c, &client::Client::Intervene, massed);
  massed.set_logit_diff_tokens(0, 1);
  massed.set_logit_diff_tokens(1, 0);
  auto one_zero = Analysis(c, &client::Client::Intervene, massed);
  ASSERT_TRUE(zero_one.ok() && one_zero.ok()) << zero_one.status() << one_zero.status();
  EXPECT_TRUE(zero_one->effects(0).has_logit_diff());
  EXPECT_EQ(zero_one->effects(0).alt_name(), "tokens 0-1");
  EXPECT_NEAR(zero_one->effects(0).logit_diff(), -one_zero->effects(0).logit_diff(), 1e-9);
  EXPECT_NE(zero_one->effects(0).logit_diff(), zero_one->effects(0).logit_diff_clean());
  massed.clear_logit_diff_tokens();
  previous->add_queries(0);  // position 0 has no previous position
  previous->set_keys(0, -1);
  mass = Analysis(c, &client::Client::Intervene, massed);
  EXPECT_EQ(mass.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mass.status().message().find("no query sees any of the keys"), std::string::npos) << mass.status();
  // Steering as an op (D.6 replace_convex): kl_ref against the mixture law.
  v1::InterveneRequest steer = patch;
  steer.clear_interventions();
  v1::Intervention* convex = steer.add_interventions();
  convex->set_op(v1::Intervention::OP_REPLACE_CONVEX);
  convex->set_hook("L1.post_attn");
  for (uint32_t p : {6u, 7u, 8u}) convex->add_positions(p);
  for (double w : {0.2, 0.3, 0.5}) convex->add_weights(w);
  auto steered = Analysis(c, &client::Client::Intervene, steer);
  ASSERT_TRUE(steered.ok()) << steered.status();
  EXPECT_EQ(steered->effects(0).ref_name(), "mixture");
  EXPECT_GT(steered->effects(0).kl_clean(), 0.0);
  convex->add_weights(0.1);  // four weights for three majors
  auto four = Analysis(c, &client::Client::Intervene, steer);
  EXPECT_EQ(four.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(four.status().message().find("one entry per major task (3)"), std::string::npos) << four.status();
  convex->clear_weights();
  steer.clear_eval_sets();
  steer.add_eval_sets("ood");  // true_task needs the majors
  EXPECT_EQ(Analysis(c, &client::Client::Intervene, steer).status().code(), absl::StatusCode::kInvalidArgument);
  convex->set_subtract("projection");
  auto projected = Analysis(c, &client::Client::Intervene, steer);
  ASSERT_TRUE(projected.ok()) << projected.status();
  EXPECT_EQ(projected->effects(0).eval_set(), "ood");
  op->set_hook("L9.post_attn");
  EXPECT_EQ(Analysis(c, &client::Client::Intervene, patch).status().code(), absl::StatusCode::kInvalidArgument);
  op->set_hook("L1.post_attn");
  op->set_op(v1::Intervention::OP_ZERO_COORDINATE);
  EXPECT_EQ(Analysis(c, &client::Client::Intervene, patch).status().code(), absl::StatusCode::kFailedPrecondition);
  // IMIR analyses refuse a decoder run, and task vectors an IMIR run.
  v1::DetectCircuitRequest detect;
  detect.set_run_id(run->run_id());
  EXPECT_EQ(c.DetectCircuit(detect).status().code(), absl::StatusCode::kFailedPrecondition);
  auto imir = c.SubmitRun(TinySpec(20));
  ASSERT_TRUE(imir.ok());
  ASSERT_EQ(WaitForEnd(c, imir->run_id()), v1::RUN_STATE_SUCCEEDED);
  v1::AnalyzeTaskVectorsRequest wrong;
  wrong.set_run_id(imir->run_id());
  EXPECT_EQ(c.AnalyzeTaskVectors(wrong).status().code(), absl::StatusCode::kFailedPrecondition);

  // A diversity sweep, analysed along kappa.
  v1::SweepSpec sweep;
  *sweep.mutable_base() = TinyLatentSpec(-1);
  v1::SweepAxis* axis = sweep.add_axes();
  axis->set_field("task.latent.diversity");
  axis->set_name("kappa");
  axis->add_values()->set_number_value(-1);
  axis->add_values()->set_number_value(4);
  auto sw = c.SubmitSweep(sweep);
  ASSERT_TRUE(sw.ok()) << sw.status();
  for (const std::string& id : sw->run_ids()) ASSERT_EQ(WaitForEnd(c, id), v1::RUN_STATE_SUCCEEDED);
  v1::AnalyzeTaskVectorsRequest along;
  along.set_sweep_id(sw->sweep_id());
  along.add_analyses("ood_r2");
  along.add_analyses("kl");
  v1::AnalyzeTaskVectorsResponse by_kappa = WaitTaskVectors(c, along);
  ASSERT_EQ(by_kappa.state(), v1::ANALYSIS_STATE_DONE) << by_kappa.error();
  std::map<std::string, std::string> swept;
  for (const auto& v : by_kappa.values()) {
    if (v.name() == "kl/log10_ratio") swept[v.run_id()] = v.sweep_values();
  }
  ASSERT_EQ(swept.size(), 2u);
  EXPECT_NE(swept[sw->run_ids(1)].find("4"), std::string::npos) << swept[sw->run_ids(1)];
}

TEST(IntegrationTest, RegressionRunTrainsAndAnswersItsAnalyses) {
  TempDir dir;
  auto exec = engine::MakeTorchExecutor();
  Server server(dir.path(), exec.get(), {});
  auto c = MakeClient(server.address());
  auto spec = client::ParseSpecJson(R"({
    "name": "tiny-e2", "seed": 8,
    "task": {"latent": {"kind": "LATENT_KIND_REGRESSION", "dim": 3, "num_points": 8, "diversity": 2}},
    "model": {"decoder": {"num_layers": 2, "d_model": 16, "num_heads": 2}},
    "training": {"steps": 40, "learning_rate": 0.005},
    "recording": {"eval_every": 20, "eval_size": 32, "checkpoint_every": 20}
  })");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto run = c.SubmitRun(*spec);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->spec().training().loss(), v1::LOSS_KIND_MSE);  // E2 defaults
  EXPECT_TRUE(run->spec().model().decoder().final_layernorm());
  ASSERT_EQ(WaitForEnd(c, run->run_id()), v1::RUN_STATE_SUCCEEDED);
  EXPECT_GT(FinalValue(c, run->run_id(), "eval/ood/ridge_loss"), 0.2);  // sigma^2 = 0.25 is the floor
  EXPECT_GT(FinalValue(c, run->run_id(), "eval/minor/to_retrieval"), 0.0);

  v1::AnalyzeTaskVectorsRequest req;  // the REGRESSION default: p0, p2, p3, steering, ood_r2, kl
  req.set_run_id(run->run_id());
  req.set_samples_per_cell(16);
  req.set_p3_samples(16);
  req.set_steering_samples(32);
  req.set_steering_est_samples(16);
  req.set_kl_samples(32);
  v1::AnalyzeTaskVectorsResponse done = WaitTaskVectors(c, req);
  ASSERT_EQ(done.state(), v1::ANALYSIS_STATE_DONE) << done.error();
  std::map<std::string, int> names;
  for (const auto& v : done.values()) {
    ++names[v.name()];
    EXPECT_TRUE(std::isfinite(v.value())) << v.name();
  }
  EXPECT_EQ(names["p0/resid_ratio"], 2 * 5);  // 2 layers x points 0, 1, 2, 4 and 7
  EXPECT_EQ(names["steering/rmse_inj"], 1);
  EXPECT_EQ(names["ood_r2/code"], 2);
  EXPECT_EQ(names["kl/ood_log10_ratio"], 1);
  EXPECT_EQ(names["p3/r_mean_min"], 2);
  EXPECT_EQ(names["p2/r2_task"], 2 * 8);  // every point
  EXPECT_EQ(names.count("p1/eta2_int"), 0u);
  // Positions are points; token-only analyses refuse the run.
  v1::AnalyzeTaskVectorsRequest bad = req;
  bad.add_positions(8);
  auto far = c.AnalyzeTaskVectors(bad);
  EXPECT_EQ(far.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(far.status().message().find("points 0 to 7"), std::string::npos) << far.status();
  bad = req;
  bad.add_analyses("p1");
  EXPECT_EQ(c.AnalyzeTaskVectors(bad).status().code(), absl::StatusCode::kFailedPrecondition);
  // Hook ops on the B.3 model: squared-error effects against the set's
  // Bayes predictor; steering as an op is for token tasks.
  v1::InterveneRequest iv;
  iv.set_run_id(run->run_id());
  iv.set_n_eval(64);
  iv.add_eval_sets("id");
  iv.add_eval_sets("ood");
  v1::Intervention* op = iv.add_interventions();
  op->set_op(v1::Intervention::OP_ZERO);
  op->set_hook("L1.post_attn");
  auto zeroed = Analysis(c, &client::Client::Intervene, iv);
  ASSERT_TRUE(zeroed.ok()) << zeroed.status();
  ASSERT_EQ(zeroed->effects_size(), 2);
  EXPECT_EQ(zeroed->effects(0).ref_name(), "bayes");
  EXPECT_EQ(zeroed->effects(1).ref_name(), "ridge");
  EXPECT_GT(zeroed->effects(0).kl_clean(), 0.0);  // the prediction moved
  EXPECT_NE(zeroed->effects(0).loss(), zeroed->effects(0).loss_clean());
  op->set_op(v1::Intervention::OP_REPLACE_CONVEX);
  EXPECT_EQ(Analysis(c, &client::Client::Intervene, iv).status().code(), absl::StatusCode::kFailedPrecondition);
  // Attention mass on a decoder: every query's mass on position 0, per
  // head, and position 0 on itself (exactly 1).
  op->set_op(v1::Intervention::OP_ZERO);
  v1::AttentionMass* first = iv.add_attention_mass();
  first->set_pattern("L0.attn.pattern");
  first->add_keys(0);
  v1::AttentionMass* self = iv.add_attention_mass();
  self->set_pattern("L1.attn.pattern");
  self->add_keys(0);
  self->add_queries(0);
  auto massed = Analysis(c, &client::Client::Intervene, iv);
  ASSERT_TRUE(massed.ok()) << massed.status();
  ASSERT_EQ(massed->effects(0).attention_mass_size(), 2);
  const v1::AttentionMassEffect& m0 = massed->effects(0).attention_mass(0);
  ASSERT_EQ(m0.clean_size(), 2);  // heads
  EXPECT_GT(m0.clean(0), 0.0);
  EXPECT_LT(m0.clean(0), 1.0);
  EXPECT_NEAR(m0.intervened(0), m0.clean(0), 1e-6);  // the edit is after layer 0's attention
  EXPECT_NEAR(massed->effects(0).attention_mass(1).clean(1), 1.0, 1e-6);
  iv.clear_attention_mass();
  iv.add_logit_diff_tokens(0);
  iv.add_logit_diff_tokens(1);
  EXPECT_EQ(Analysis(c, &client::Client::Intervene, iv).status().code(), absl::StatusCode::kFailedPrecondition);  // no logits
  iv.clear_logit_diff_tokens();
  op->set_op(v1::Intervention::OP_ZERO);
  op->add_positions(24);  // 8 points: positions 0..23
  EXPECT_EQ(Analysis(c, &client::Client::Intervene, iv).status().code(), absl::StatusCode::kInvalidArgument);
}

// Interventions that cannot finish until they are cancelled (the executor
// installs the job's token on its worker thread, as for the real engine).
class GatedAnalyzer : public engine::Analyzer {
 public:
  absl::StatusOr<engine::CheckpointProjection> ProjectCheckpoint(const v1::ExperimentSpec&, const std::string&,
                                                                 engine::Selection) override {
    return absl::UnimplementedError("not in this fake");
  }
  absl::StatusOr<engine::InvarianceReport> CheckInvariance(const v1::ExperimentSpec&, const engine::InvarianceRequest&,
                                                           const std::function<void(double)>&,
                                                           const CancelToken*) override {
    return absl::UnimplementedError("not in this fake");
  }
  absl::StatusOr<engine::DetectReport> DetectCircuit(const v1::ExperimentSpec&, const std::string&,
                                                     const engine::DetectRequest&, const std::function<void(double)>&,
                                                     const CancelToken*) override {
    return absl::UnimplementedError("not in this fake");
  }
  absl::StatusOr<engine::InterveneReport> Intervene(const v1::ExperimentSpec&, const std::string&,
                                                    const engine::InterveneRequest&) override {
    ++started;
    while (!ThreadCancelToken()->stop_requested()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return absl::CancelledError("stopped");
  }
  absl::StatusOr<std::vector<engine::DataDependenceRow>> CheckDataDependence(
      const v1::ExperimentSpec&, const std::vector<engine::DataDependencePoint>&, const engine::DataDependenceConfig&,
      const std::function<void(double)>&, const CancelToken*) override {
    return absl::UnimplementedError("not in this fake");
  }
  absl::StatusOr<engine::LabelReport> LabelRun(const v1::ExperimentSpec&,
                                               const std::vector<std::pair<int64_t, std::string>>&,
                                               const engine::LabelRequest&, const std::function<void(double)>&,
                                               const CancelToken*) override {
    return absl::UnimplementedError("not in this fake");
  }
  std::atomic<int> started{0};
};

// Issue 13: no handler runs model code. With the analysis worker held by a
// job that cannot finish and seven more queued, every read still answers
// (functional: the analyses cannot end before the reads do), each analysis
// call answers QUEUED/RUNNING with a job id after its brief wait, the jobs are
// listed, and CancelAnalysis ends them.
TEST(IntegrationTest, ReadsAnswerWhileAnalysesRunAndJobsCanBeCancelled) {
  TempDir dir;
  auto exec = engine::MakeTorchExecutor();
  GatedAnalyzer analyzer;
  Server server(dir.path(), exec.get(), {}, {}, &analyzer);
  auto c = MakeClient(server.address());
  auto run = c.SubmitRun(TinySpec(40));
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(WaitForEnd(c, run->run_id()), v1::RUN_STATE_SUCCEEDED);

  constexpr int kJobs = 8;
  std::atomic<int> pending{0};
  std::vector<std::thread> callers;
  for (int i = 0; i < kJobs; ++i) {
    callers.emplace_back([&, i] {
      auto own = MakeClient(server.address());
      v1::InterveneRequest req;
      req.set_run_id(run->run_id());
      req.set_seed(static_cast<uint64_t>(i + 1));  // eight distinct jobs
      req.add_interventions()->set_op(v1::Intervention::OP_ABLATE_HEAD);
      req.mutable_interventions(0)->set_layer(1);
      auto r = own.Intervene(req);
      if (r.ok() && scheduler::IsPending(r->state()) && !r->job_id().empty()) ++pending;
    });
  }
  ASSERT_TRUE(WaitFor([&] {
    auto list = c.ListAnalysisJobs();
    return list.ok() && list->jobs_size() == kJobs;
  }));
  for (int i = 0; i < 20; ++i) {
    auto r = c.GetRun(run->run_id());
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(c.ListRuns({}).ok());
  }
  auto list = c.ListAnalysisJobs();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->jobs_size(), kJobs) << "no analysis can have finished";
  EXPECT_EQ(list->jobs(0).state(), v1::ANALYSIS_STATE_RUNNING);
  EXPECT_EQ(list->jobs(0).kind(), "intervene");
  EXPECT_EQ(list->jobs(0).run_id(), run->run_id());
  EXPECT_EQ(list->jobs(1).state(), v1::ANALYSIS_STATE_QUEUED);
  EXPECT_EQ(list->workers(), 1u);
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(pending.load(), kJobs);
  EXPECT_EQ(analyzer.started.load(), 1);

  for (const v1::AnalysisJob& job : list->jobs()) {
    auto cancelled = c.CancelAnalysis(job.job_id());
    ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  }
  ASSERT_TRUE(WaitFor([&] { return c.ListAnalysisJobs()->jobs_size() == 0; }));
  EXPECT_EQ(c.CancelAnalysis(list->jobs(0).job_id()).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace circuitlab
