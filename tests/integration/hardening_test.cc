// The RPC boundary against hostile bytes (issue 14): a payload that does not
// parse, a string field with invalid UTF-8, fields this server does not
// know, control characters in names, and long client strings in errors. Sent
// raw through a generic stub, as a hostile client would.
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/byte_buffer.h>

#include "tests/integration/integration_util.h"

namespace circuitlab::testing {
namespace {

class HardeningTest : public ::testing::Test {
 protected:
  HardeningTest()
      : server_(dir_.path(), &exec_),
        channel_(grpc::CreateChannel(server_.address(), grpc::InsecureChannelCredentials())),
        stub_(channel_) {}

  // `bytes` sent as the request of `method`; the call's status.
  grpc::Status Call(const std::string& method, const std::string& bytes, grpc::ByteBuffer* reply = nullptr) {
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1), response;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    grpc::Status status;
    stub_.UnaryCall(&ctx, method, grpc::StubOptions(), &request, reply ? reply : &response, [&](grpc::Status s) {
      std::lock_guard<std::mutex> lock(mu);
      status = std::move(s);
      done = true;
      cv.notify_all();
    });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    return status;
  }

  TempDir dir_;
  FakeExecutor exec_;
  Server server_;
  std::shared_ptr<grpc::Channel> channel_;
  grpc::GenericStub stub_;
};

const std::vector<std::string> kUnaryMethods = {
    "/circuitlab.v1.ExperimentService/SubmitRun",        "/circuitlab.v1.ExperimentService/GetRun",
    "/circuitlab.v1.ExperimentService/ListRuns",         "/circuitlab.v1.ExperimentService/CancelRun",
    "/circuitlab.v1.ExperimentService/GetMetrics",       "/circuitlab.v1.ExperimentService/SubmitSweep",
    "/circuitlab.v1.ExperimentService/GetSweep",         "/circuitlab.v1.ExperimentService/CancelSweep",
    "/circuitlab.v1.ExperimentService/GetSweepSummary",  "/circuitlab.v1.AnalysisService/ProjectCheckpoint",
    "/circuitlab.v1.AnalysisService/GetTrajectory",      "/circuitlab.v1.AnalysisService/CheckInvariance",
    "/circuitlab.v1.AnalysisService/DetectCircuit",      "/circuitlab.v1.AnalysisService/Intervene",
    "/circuitlab.v1.AnalysisService/CheckDataDependence", "/circuitlab.v1.AnalysisService/AnalyzeTaskVectors",
    "/circuitlab.v1.AnalysisService/LabelRun",           "/circuitlab.v1.AnalysisService/CancelAnalysis",
    "/circuitlab.v1.AnalysisService/ListAnalysisJobs"};

// Today's main answered these UNIMPLEMENTED with an empty message.
TEST_F(HardeningTest, MalformedPayloadsAreInvalidArgumentNamingTheMessage) {
  // A length-delimited field 1 announcing 50 bytes, then 3: truncated.
  const std::string truncated = std::string("\x0a\x32", 2) + "abc";
  for (const std::string& method : kUnaryMethods) {
    const grpc::Status s = Call(method, truncated);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method << ": " << s.error_message();
    EXPECT_NE(s.error_message().find("is not a valid circuitlab.v1."), std::string::npos) << s.error_message();
  }
  // GetRun's run_id (field 1, a string) holding invalid UTF-8.
  const grpc::Status utf8 = Call("/circuitlab.v1.ExperimentService/GetRun", std::string("\x0a\x02\xff\xfe", 4));
  EXPECT_EQ(utf8.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(utf8.error_message().find("invalid UTF-8"), std::string::npos) << utf8.error_message();
}

TEST_F(HardeningTest, UnknownFieldsAreRefusedNotStored) {
  // SubmitRun{spec{training{field 99: varint 7}}}: 0a(spec) len [3a(training) len [98 06 07]].
  const std::string training = std::string("\x98\x06\x07", 3);
  const std::string spec = std::string("\x3a", 1) + static_cast<char>(training.size()) + training;
  const std::string request = std::string("\x0a", 1) + static_cast<char>(spec.size()) + spec;
  v1::SubmitRunRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(request));
  ASSERT_TRUE(parsed.spec().has_training());
  const grpc::Status s = Call("/circuitlab.v1.ExperimentService/SubmitRun", request);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(s.error_message(), "the request holds field 99 of spec.training, unknown to this server's "
                               "circuitlab.v1.SubmitRunRequest (a newer client? upgrade the server)");
  client::Client c = MakeClient(server_.address());
  EXPECT_EQ(c.ListRuns(v1::ListRunsRequest())->runs_size(), 0) << "nothing was stored";
  // WatchRun parses its request too.
  const grpc::Status watch = Call("/circuitlab.v1.ExperimentService/WatchRun", std::string("\x0a\x32", 2));
  EXPECT_EQ(watch.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << watch.error_message();
}

TEST_F(HardeningTest, ClientStringsAreClippedAndNamesHoldNoControlCharacters) {
  client::Client c = MakeClient(server_.address());
  // A 100 KB run id: the answer quotes 200 characters of it, not 100 KB
  // (above ~8 KB gRPC would refuse the trailing metadata altogether).
  auto huge = c.GetRun("r" + std::string(100000, 'x'));
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LE(huge.status().message().size(), 300u) << huge.status().message().substr(0, 400);
  EXPECT_NE(huge.status().message().find("…"), absl::string_view::npos);
  // A name that would forge a log line and a tag with an escape sequence.
  v1::ExperimentSpec spec = TinySpec();
  spec.set_name("ok\n[error] forged line");
  auto forged = c.SubmitRun(spec);
  EXPECT_EQ(forged.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(forged.status().message().find("ok\\n[error]"), absl::string_view::npos) << forged.status().message();
  spec = TinySpec();
  spec.add_tags("a\x1b[31m");
  auto tag = c.SubmitRun(spec);
  EXPECT_EQ(tag.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(tag.status().message().find("a\\x1b[31m"), absl::string_view::npos) << tag.status().message();
  // Unicode controls too (issue 32 item 8): a C1 CSI (U+009B) and a
  // right-to-left override (U+202E), refused and quoted escaped.
  for (const auto& [name, shown] : {std::pair<std::string, std::string>{"run\u009b31m", "run\\u009b31m"},
                                    {"gpj\u202eexe.run", "gpj\\u202eexe.run"}}) {
    spec = TinySpec();
    spec.set_name(name);
    auto refused = c.SubmitRun(spec);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << shown;
    EXPECT_NE(refused.status().message().find(shown), absl::string_view::npos) << refused.status().message();
  }
  spec = TinySpec();
  spec.set_name("naïve Straße 名前");  // printable UTF-8 stays allowed
  EXPECT_TRUE(c.SubmitRun(spec).ok());
}

// Issue 14 item 6: a stop_metric naming no metric of the task is refused at
// submission (it used to train, then FAIL at the first evaluation).
TEST(StopMetricTest, AStopMetricTheTaskDoesNotRecordIsRefusedAtSubmission) {
  TempDir dir;
  auto exec = engine::MakeTorchExecutor();
  Server server(dir.path(), exec.get());
  client::Client c = MakeClient(server.address());
  v1::ExperimentSpec spec = TinySpec();
  spec.mutable_training()->set_stop_metric("eval/icl_rare/acuracy");
  spec.mutable_training()->set_stop_at(0.9);
  auto typo = c.SubmitRun(spec);
  EXPECT_EQ(typo.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(typo.status().message().find("training.stop_metric 'eval/icl_rare/acuracy' is not an evaluation metric"),
            absl::string_view::npos)
      << typo.status();
  EXPECT_NE(typo.status().message().find("eval/icl_rare/accuracy"), absl::string_view::npos);
  spec.mutable_training()->set_stop_metric("eval/icl_rare/accuracy");
  EXPECT_TRUE(c.SubmitRun(spec).ok());
}

}  // namespace
}  // namespace circuitlab::testing
