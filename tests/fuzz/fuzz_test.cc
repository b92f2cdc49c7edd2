// The fuzz tier (issue 14): a seeded fuzzer sends thousands of mutated
// requests to every RPC of a real circuitlab-server process and checks that
// the boundary holds: no crash (the server answers health checks to the end),
// no UNIMPLEMENTED, UNKNOWN or INTERNAL answer, every error message at most
// 1 KiB, and resident memory growing by at most 50 MB.
//
// Seeds are valid requests built from the shipped examples; each request
// applies 1-4 mutations: wire mutations of the serialized bytes (bit flips,
// byte overwrites, truncation, inserted or repeated or deleted spans, a
// random extra field) or field mutations through reflection (a random scalar
// field set to an extreme: 0, -1, 2^63, NaN, a 10 KB or control-character
// string; a repeated field grown). The seed is fixed (CIRCUITLAB_FUZZ_SEED
// overrides it); failures print the method and the request bytes in hex.
#include <google/protobuf/util/json_util.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/byte_buffer.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <fstream>
#include <limits>
#include <mutex>
#include <random>
#include <sstream>

#include "circuitlab/v1/analysis_service.pb.h"
#include "circuitlab/v1/experiment_service.pb.h"
#include "tests/test_util/process.h"
#include "tests/test_util/temp_dir.h"

namespace circuitlab::testing {
namespace {

namespace pb = google::protobuf;

const std::string kServer = CIRCUITLAB_SERVER_BIN;
const std::string kExamples = CIRCUITLAB_EXAMPLES_DIR;
constexpr int kRequests = 2400;
constexpr int kInFlight = 24;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

template <typename M>
M FromJson(const std::string& json) {
  M m;
  const auto s = pb::util::JsonStringToMessage(json, &m);
  EXPECT_TRUE(s.ok()) << s.message();
  return m;
}

struct Seed {
  std::string method;
  std::unique_ptr<pb::Message> message;
};

// One valid request for every method of both services.
std::vector<Seed> Seeds() {
  std::vector<Seed> seeds;
  auto add = [&](const std::string& service, const std::string& method, std::unique_ptr<pb::Message> m) {
    seeds.push_back({"/circuitlab.v1." + service + "/" + method, std::move(m)});
  };
  auto spec = FromJson<v1::ExperimentSpec>(ReadFile(kExamples + "/induction.json"));
  auto submit = std::make_unique<v1::SubmitRunRequest>();
  *submit->mutable_spec() = spec;
  add("ExperimentService", "SubmitRun", std::move(submit));
  auto sweep = std::make_unique<v1::SubmitSweepRequest>();
  *sweep->mutable_sweep() = FromJson<v1::SweepSpec>(ReadFile(kExamples + "/phase_diagram.json"));
  add("ExperimentService", "SubmitSweep", std::move(sweep));
  auto get = std::make_unique<v1::GetRunRequest>();
  get->set_run_id("r1");
  add("ExperimentService", "GetRun", std::move(get));
  auto list = std::make_unique<v1::ListRunsRequest>();
  list->set_page_size(10);
  list->add_tags("demo");
  add("ExperimentService", "ListRuns", std::move(list));
  auto cancel = std::make_unique<v1::CancelRunRequest>();
  cancel->set_run_id("r2");
  add("ExperimentService", "CancelRun", std::move(cancel));
  auto metrics = std::make_unique<v1::GetMetricsRequest>();
  metrics->set_run_id("r1");
  metrics->add_names("train/loss");
  metrics->set_max_points(50);
  add("ExperimentService", "GetMetrics", std::move(metrics));
  auto get_sweep = std::make_unique<v1::GetSweepRequest>();
  get_sweep->set_sweep_id("s1");
  add("ExperimentService", "GetSweep", std::move(get_sweep));
  auto cancel_sweep = std::make_unique<v1::CancelSweepRequest>();
  cancel_sweep->set_sweep_id("s1");
  add("ExperimentService", "CancelSweep", std::move(cancel_sweep));
  auto summary = std::make_unique<v1::GetSweepSummaryRequest>();
  summary->set_sweep_id("s1");
  summary->add_values("eval/icl_rare/accuracy");
  summary->mutable_pivot()->set_x("a");
  summary->mutable_pivot()->set_y("b");
  summary->mutable_pivot()->set_value("pair");
  add("ExperimentService", "GetSweepSummary", std::move(summary));
  auto del = std::make_unique<v1::DeleteRunRequest>();
  del->set_run_id("r3");
  add("ExperimentService", "DeleteRun", std::move(del));
  auto del_sweep = std::make_unique<v1::DeleteSweepRequest>();
  del_sweep->set_sweep_id("s2");
  add("ExperimentService", "DeleteSweep", std::move(del_sweep));
  auto project = std::make_unique<v1::ProjectCheckpointRequest>();
  project->set_run_id("r1");
  add("AnalysisService", "ProjectCheckpoint", std::move(project));
  auto trajectory = std::make_unique<v1::GetTrajectoryRequest>();
  trajectory->set_run_id("r1");
  add("AnalysisService", "GetTrajectory", std::move(trajectory));
  auto invariance = std::make_unique<v1::CheckInvarianceRequest>();
  invariance->set_run_id("r1");
  invariance->add_sample_sizes(64);
  invariance->add_sample_sizes(256);
  add("AnalysisService", "CheckInvariance", std::move(invariance));
  auto detect = std::make_unique<v1::DetectCircuitRequest>();
  detect->set_run_id("r1");
  detect->set_metric("accuracy");
  add("AnalysisService", "DetectCircuit", std::move(detect));
  auto intervene = std::make_unique<v1::InterveneRequest>(
      FromJson<v1::InterveneRequest>(ReadFile(kExamples + "/intervene_imir_hooks.json")));
  intervene->set_run_id("r1");
  add("AnalysisService", "Intervene", std::move(intervene));
  auto data = std::make_unique<v1::CheckDataDependenceRequest>();
  data->set_run_id("r1");
  data->set_samples(256);
  add("AnalysisService", "CheckDataDependence", std::move(data));
  auto vectors = std::make_unique<v1::AnalyzeTaskVectorsRequest>();
  vectors->set_run_id("r1");
  vectors->add_analyses("p0");
  add("AnalysisService", "AnalyzeTaskVectors", std::move(vectors));
  auto label = std::make_unique<v1::LabelRunRequest>();
  label->set_run_id("r1");
  add("AnalysisService", "LabelRun", std::move(label));
  auto cancel_job = std::make_unique<v1::CancelAnalysisRequest>();
  cancel_job->set_job_id("a1");
  add("AnalysisService", "CancelAnalysis", std::move(cancel_job));
  add("AnalysisService", "ListAnalysisJobs", std::make_unique<v1::ListAnalysisJobsRequest>());
  auto watch = std::make_unique<v1::WatchRunRequest>();
  watch->set_run_id("r1");
  add("ExperimentService", "WatchRun", std::move(watch));
  return seeds;
}

// A random scalar field somewhere in `m` set to an extreme, or a repeated
// field grown (field mutations: what a JSON file can say, and more).
void MutateField(pb::Message* m, std::mt19937_64& gen, int depth = 0) {
  const pb::Descriptor* d = m->GetDescriptor();
  const pb::Reflection* r = m->GetReflection();
  if (d->field_count() == 0) return;
  const pb::FieldDescriptor* f = d->field(static_cast<int>(gen() % d->field_count()));
  if (f->is_map()) return;
  if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
    if (depth > 6) return;
    pb::Message* sub = f->is_repeated() ? (r->FieldSize(*m, f) > 0 && gen() % 2
                                               ? r->MutableRepeatedMessage(m, f, static_cast<int>(gen() % r->FieldSize(*m, f)))
                                               : r->AddMessage(m, f))
                                        : r->MutableMessage(m, f);
    return MutateField(sub, gen, depth + 1);
  }
  const int pick = static_cast<int>(gen() % 6);
  const std::string big(10000, 'x'), control = "a\nb\x1b[31m\x7f";
  const bool rep = f->is_repeated();
  switch (f->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32: {
      const int32_t v[] = {0, -1, std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min(), 7, 1 << 20};
      rep ? r->AddInt32(m, f, v[pick]) : r->SetInt32(m, f, v[pick]);
      break;
    }
    case pb::FieldDescriptor::CPPTYPE_INT64: {
      const int64_t v[] = {0, -1, std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min(), 7, 1LL << 40};
      rep ? r->AddInt64(m, f, v[pick]) : r->SetInt64(m, f, v[pick]);
      break;
    }
    case pb::FieldDescriptor::CPPTYPE_UINT32: {
      const uint32_t v[] = {0, 1, std::numeric_limits<uint32_t>::max(), 1u << 31, 65536, 3};
      rep ? r->AddUInt32(m, f, v[pick]) : r->SetUInt32(m, f, v[pick]);
      break;
    }
    case pb::FieldDescriptor::CPPTYPE_UINT64: {
      const uint64_t v[] = {0, 1, std::numeric_limits<uint64_t>::max(), 1ULL << 63, 1ULL << 40, 3};
      rep ? r->AddUInt64(m, f, v[pick]) : r->SetUInt64(m, f, v[pick]);
      break;
    }
    case pb::FieldDescriptor::CPPTYPE_DOUBLE: {
      const double v[] = {0.0, -1.0, std::nan(""), HUGE_VAL, -HUGE_VAL, 1e300};
      rep ? r->AddDouble(m, f, v[pick]) : r->SetDouble(m, f, v[pick]);
      break;
    }
    case pb::FieldDescriptor::CPPTYPE_FLOAT: {
      const float v[] = {0.0f, -1.0f, std::nanf(""), HUGE_VALF, 1e30f, 2.0f};
      rep ? r->AddFloat(m, f, v[pick]) : r->SetFloat(m, f, v[pick]);
      break;
    }
    case pb::FieldDescriptor::CPPTYPE_BOOL:
      rep ? r->AddBool(m, f, pick % 2) : r->SetBool(m, f, pick % 2);
      break;
    case pb::FieldDescriptor::CPPTYPE_ENUM: {
      const int v[] = {0, 1, 2, 99, -1, 3};
      rep ? r->AddEnumValue(m, f, v[pick]) : r->SetEnumValue(m, f, v[pick]);
      break;
    }
    case pb::FieldDescriptor::CPPTYPE_STRING: {
      const std::string v[] = {"", big, control, "r999999999999999999999", "s-1", "eval/x/y"};
      rep ? r->AddString(m, f, v[pick]) : r->SetString(m, f, v[pick]);
      break;
    }
    default:
      break;
  }
}

// Wire mutations of serialized bytes.
void MutateBytes(std::string& b, std::mt19937_64& gen) {
  const size_t n = b.size();
  switch (gen() % 7) {
    case 0:
      if (n) b[gen() % n] ^= static_cast<char>(1 << (gen() % 8));
      break;
    case 1:
      if (n) b[gen() % n] = static_cast<char>(gen());
      break;
    case 2:
      if (n) b.resize(gen() % n);
      break;
    case 3: {
      std::string junk(1 + gen() % 16, '\0');
      for (char& c : junk) c = static_cast<char>(gen());
      b.insert(n ? gen() % n : 0, junk);
      break;
    }
    case 4:
      if (n > 1) {
        const size_t from = gen() % n, len = 1 + gen() % std::min<size_t>(64, n - from);
        b.insert(gen() % n, b.substr(from, len));
      }
      break;
    case 5:
      if (n > 1) {
        const size_t from = gen() % n;
        b.erase(from, 1 + gen() % std::min<size_t>(32, n - from));
      }
      break;
    default: {  // an extra field: random number and wire type, a small value
      const uint32_t field = 1 + static_cast<uint32_t>(gen() % 200), wire = static_cast<uint32_t>(gen() % 6);
      uint32_t tag = (field << 3) | wire;
      while (tag >= 0x80) {
        b += static_cast<char>((tag & 0x7F) | 0x80);
        tag >>= 7;
      }
      b += static_cast<char>(tag);
      b += wire == 2 ? std::string("\x03" "abc", 4) : std::string("\x05", 1);
      break;
    }
  }
}

int64_t RssKb(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

std::string Hex(const std::string& b) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : b.substr(0, 256)) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

TEST(FuzzTest, MutatedRequestsToEveryRpcNeverBreakTheBoundary) {
  TempDir dir;
  // Runs are validated in full but refused for memory (nothing trains
  // beside the fuzz); few analysis jobs at once.
  ServerProcess server(kServer, dir.path() + "/data",
                       {"--max-run-memory-mb", "16", "--max-analysis-jobs", "4", "--max-queued-runs", "200"});
  ASSERT_TRUE(server.ok());
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  const std::vector<Seed> seeds = Seeds();
  uint64_t seed = 20261201;
  if (const char* s = std::getenv("CIRCUITLAB_FUZZ_SEED")) seed = std::stoull(s);
  std::mt19937_64 gen(seed);

  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0, done = 0;
  std::map<std::string, int> codes;
  std::vector<std::string> failures;
  int64_t rss_after_warmup = -1;
  for (int i = 0; i < kRequests; ++i) {
    const Seed& s = seeds[gen() % seeds.size()];
    std::unique_ptr<pb::Message> m(s.message->New());
    m->CopyFrom(*s.message);
    std::string bytes;
    const int mutations = 1 + static_cast<int>(gen() % 4);
    bool serialized = false;
    for (int k = 0; k < mutations; ++k) {
      if (!serialized && gen() % 2 == 0) {
        MutateField(m.get(), gen);
        continue;
      }
      if (!serialized) {
        bytes = m->SerializeAsString();
        serialized = true;
      }
      MutateBytes(bytes, gen);
    }
    if (!serialized) bytes = m->SerializeAsString();
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return in_flight < kInFlight; });
      ++in_flight;
    }
    struct Call {
      grpc::ClientContext ctx;
      grpc::ByteBuffer request, response;
    };
    auto call = std::make_shared<Call>();
    const bool watch = s.method.find("WatchRun") != std::string::npos;
    call->ctx.set_deadline(std::chrono::system_clock::now() +
                           (watch ? std::chrono::milliseconds(300) : std::chrono::milliseconds(20000)));
    grpc::Slice slice(bytes);
    call->request = grpc::ByteBuffer(&slice, 1);
    const std::string method = s.method;
    stub.UnaryCall(&call->ctx, method, grpc::StubOptions(), &call->request, &call->response,
                   [&, call, method, bytes, watch](grpc::Status st) {
                     std::lock_guard<std::mutex> lock(mu);
                     const grpc::StatusCode c = st.error_code();
                     ++codes[std::to_string(c)];
                     const bool bad_code = c == grpc::StatusCode::UNIMPLEMENTED || c == grpc::StatusCode::UNKNOWN ||
                                           c == grpc::StatusCode::INTERNAL ||
                                           (c == grpc::StatusCode::DEADLINE_EXCEEDED && !watch);
                     if ((bad_code || st.error_message().size() > 1024) && failures.size() < 20) {
                       failures.push_back(method + " -> " + std::to_string(c) + " '" +
                                          st.error_message().substr(0, 300) + "' (" +
                                          std::to_string(st.error_message().size()) + " chars) for " + Hex(bytes));
                     }
                     --in_flight;
                     ++done;
                     cv.notify_all();
                   });
    if (i == 300) rss_after_warmup = RssKb(server.pid());
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return in_flight == 0; });
  }
  const int64_t rss_end = RssKb(server.pid());
  std::string summary;
  for (const auto& [code, n] : codes) summary += " " + code + ":" + std::to_string(n);
  std::printf("%d requests (seed %llu); status codes%s; RSS %lld -> %lld KB\n", done,
              static_cast<unsigned long long>(seed), summary.c_str(), static_cast<long long>(rss_after_warmup),
              static_cast<long long>(rss_end));
  EXPECT_EQ(done, kRequests);
  for (const std::string& f : failures) ADD_FAILURE() << f;
  EXPECT_LE(rss_end - rss_after_warmup, 50 * 1024) << "RSS growth over the run";
  // Still serving.
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ListRunsRequest list;
  std::string list_bytes = list.SerializeAsString();
  grpc::Slice slice(list_bytes);
  grpc::ByteBuffer req(&slice, 1), resp;
  std::mutex m2;
  std::condition_variable cv2;
  bool answered = false;
  grpc::Status last;
  stub.UnaryCall(&ctx, "/circuitlab.v1.ExperimentService/ListRuns", grpc::StubOptions(), &req, &resp,
                 [&](grpc::Status st) {
                   std::lock_guard<std::mutex> lock(m2);
                   last = st;
                   answered = true;
                   cv2.notify_all();
                 });
  {
    std::unique_lock<std::mutex> lock(m2);
    cv2.wait(lock, [&] { return answered; });
  }
  EXPECT_TRUE(last.ok()) << last.error_message();
  EXPECT_EQ(server.Stop(SIGTERM), 0) << "drains and exits 0 after the fuzz";
}

}  // namespace
}  // namespace circuitlab::testing
