#include "server/scheduler/analysis_core.h"

#include "circuitlab/v1/experiment_service.pb.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>

#include "tests/test_util/fake_analyzer.h"
#include "tests/test_util/temp_dir.h"

namespace circuitlab::scheduler {
namespace {

using circuitlab::testing::TempDir;
using circuitlab::testing::WaitFor;
using State = v1::CheckInvarianceResponse;

// An analyzer whose invariance check waits at a gate and reports progress.
class FakeAnalyzer : public testing::UnimplementedAnalyzer {
 public:
  FakeAnalyzer() {
    On<v1::CheckInvarianceRequest, v1::CheckInvarianceResponse>(
        [this](const engine::AnalysisInput&, const v1::CheckInvarianceRequest& request, const Progress& progress,
               const CancelToken* cancel) { return Check(request, progress, cancel); });
  }
  absl::StatusOr<v1::CheckInvarianceResponse> Check(const v1::CheckInvarianceRequest& request,
                                                    const Progress& progress, const CancelToken* cancel) {
    calls++;
    progress(0.5);
    std::unique_lock<std::mutex> lock(mu);
    // Polls the cancel token as the real analyzer does between chunks
    // (nobody notifies this condition variable on cancel).
    while (!cv.wait_for(lock, std::chrono::milliseconds(5), [&] { return open || (cancel && cancel->stop_requested()); })) {
    }
    if (cancel && cancel->stop_requested()) return absl::CancelledError("stopped");
    if (!fail.ok()) return fail;
    v1::CheckInvarianceResponse r;
    *r.mutable_sample_sizes() = request.sample_sizes();  // the canonical request's ladder
    v1::InvarianceCheck* in = r.add_checks();
    in->set_name("in_span");
    in->set_passed(true);
    return r;
  }
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu);
      open = true;
    }
    cv.notify_all();
  }
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  absl::Status fail = absl::OkStatus();
  std::atomic<int> calls{0};
};

class AnalysisCoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = store::Store::Open(dir_.path());
    ASSERT_TRUE(store.ok());
    store_ = std::move(*store);
    store::NewRun run;
    run.name = "r";
    run.spec = v1::ExperimentSpec().SerializeAsString();
    run.spec_json = "{}";
    run.state = v1::RUN_STATE_SUCCEEDED;
    ASSERT_TRUE(store_->InsertRun(run).ok());
  }
  v1::CheckInvarianceRequest Request() {
    v1::CheckInvarianceRequest req;
    req.set_run_id("r1");
    req.add_sample_sizes(256);
    req.add_sample_sizes(1024);
    return req;
  }
  TempDir dir_;
  std::unique_ptr<store::Store> store_;
  FakeAnalyzer analyzer_;
};

TEST_F(AnalysisCoreTest, QueuedThenRunningThenStored) {
  AnalysisCore core(store_.get(), &analyzer_);
  auto first = core.Run<v1::CheckInvarianceResponse>(Request());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->state() == State::STATE_QUEUED || first->state() == State::STATE_RUNNING);
  ASSERT_TRUE(WaitFor([&] { return core.Run<v1::CheckInvarianceResponse>(Request())->progress() == 0.5; }));
  EXPECT_EQ(core.Run<v1::CheckInvarianceResponse>(Request())->state(), State::STATE_RUNNING);
  analyzer_.Open();
  ASSERT_TRUE(WaitFor([&] { return core.Run<v1::CheckInvarianceResponse>(Request())->state() == State::STATE_DONE; }));
  auto done = core.Run<v1::CheckInvarianceResponse>(Request());
  EXPECT_TRUE(done->from_store());
  ASSERT_EQ(done->checks_size(), 1);
  EXPECT_TRUE(done->checks(0).passed());
  EXPECT_EQ(done->sample_sizes_size(), 2);
  EXPECT_EQ(analyzer_.calls.load(), 1) << "asking again never recomputes";
  // Defaults resolve to the same canonical request: the seed 0 means the run's.
  auto same = Request();
  same.set_seed(0);
  EXPECT_TRUE(core.Run<v1::CheckInvarianceResponse>(same)->from_store());
  // force recomputes. (The finished job may linger for a moment after its
  // result is stored; a forced request meanwhile joins that job, so ask
  // until a new one has run.)
  auto forced = Request();
  forced.set_force(true);
  ASSERT_TRUE(WaitFor([&] {
    auto r = core.Run<v1::CheckInvarianceResponse>(forced);
    EXPECT_TRUE(r.ok()) << r.status();
    return analyzer_.calls.load() >= 2;
  }));
}

TEST_F(AnalysisCoreTest, FailuresAreReportedAndRetriedWithForce) {
  analyzer_.fail = absl::InternalError("boom");
  analyzer_.Open();
  AnalysisCore core(store_.get(), &analyzer_);
  ASSERT_TRUE(core.Run<v1::CheckInvarianceResponse>(Request()).ok());
  // The failure is reported once, with its error, then forgotten.
  v1::CheckInvarianceResponse failed;
  ASSERT_TRUE(WaitFor([&] {
    failed = *core.Run<v1::CheckInvarianceResponse>(Request());
    return failed.state() == State::STATE_FAILED;
  }));
  EXPECT_NE(failed.error().find("boom"), std::string::npos);
  analyzer_.fail = absl::OkStatus();
  auto retry = Request();
  retry.set_force(true);
  ASSERT_TRUE(core.Run<v1::CheckInvarianceResponse>(retry).ok());
  ASSERT_TRUE(WaitFor([&] { return core.Run<v1::CheckInvarianceResponse>(Request())->state() == State::STATE_DONE; }));
}

// A spec sent with the request meets the server's limits, as SubmitRun's do.
TEST_F(AnalysisCoreTest, SpecRequestsMeetTheServerLimits) {
  engine::EngineLimits limits;
  limits.max_steps = 10;
  AnalysisCore core(store_.get(), &analyzer_, AnalysisJobOptions{}, limits);
  v1::CheckInvarianceRequest req;
  req.mutable_spec()->mutable_training()->set_steps(100);
  auto r = core.Run<v1::CheckInvarianceResponse>(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(std::string(r.status().message()).rfind("spec: training.steps must be at most this server's", 0), 0u)
      << r.status();
  req.mutable_spec()->mutable_training()->set_steps(10);
  EXPECT_TRUE(core.Run<v1::CheckInvarianceResponse>(req).ok());
  analyzer_.Open();
}

TEST_F(AnalysisCoreTest, RequestsAreValidatedAndJobsBounded) {
  AnalysisJobOptions one;
  one.max_active = 1;
  AnalysisCore core(store_.get(), &analyzer_, one);
  auto bad = Request();
  bad.add_sample_sizes(512);  // not increasing
  EXPECT_EQ(core.Run<v1::CheckInvarianceResponse>(bad).status().message(), "sample_sizes must be strictly increasing, got 512 after 1024");
  bad = Request();
  bad.set_coordinate_std(-1);
  EXPECT_EQ(core.Run<v1::CheckInvarianceResponse>(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = Request();
  bad.set_sample_sizes(0, 3);
  EXPECT_EQ(core.Run<v1::CheckInvarianceResponse>(bad).status().message(), "sample_sizes[0] must be in [16, 4194304], got 3");
  bad = Request();
  bad.set_run_id("r9");
  EXPECT_EQ(core.Run<v1::CheckInvarianceResponse>(bad).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(core.Run<v1::CheckInvarianceResponse>(Request()).ok());
  auto other = Request();
  other.set_seed(5);
  EXPECT_EQ(core.Run<v1::CheckInvarianceResponse>(other).status().code(), absl::StatusCode::kResourceExhausted);
  // Destroying the core cancels the running job instead of waiting for it.
}

}  // namespace
}  // namespace circuitlab::scheduler
