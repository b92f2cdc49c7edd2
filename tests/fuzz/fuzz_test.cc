// The fuzz tier (issue 14): a seeded fuzzer sends thousands of mutated
// requests to every RPC of a real circuitlab-server process and checks that
// the boundary holds: no crash (the server answers health checks to the end),
// no UNIMPLEMENTED, UNKNOWN or INTERNAL answer, every error message at most
// 1 KiB, resident memory growing by at most 50 MB over the run, and its peak
// never more than 256 MB above where it started (issue 51: a monitor reads
// the server's high-water mark every 20 ms and names the requests in flight).
//
// Seeds are valid requests built from the shipped examples; each request
// applies 1-4 mutations: wire mutations of the serialized bytes (bit flips,
// byte overwrites, truncation, inserted or repeated or deleted spans, a
// random extra field) or field mutations through reflection (a random scalar
// field set to an extreme: 0, -1, 2^63, NaN, a 10 KB or control-character
// string; a repeated field grown). The seed is fixed (CIRCUITLAB_FUZZ_SEED
// overrides it); failures print the method and the request bytes in hex.
#include <arpa/inet.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/byte_buffer.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <thread>
#include <fstream>
#include <limits>
#include <mutex>
#include <random>
#include <set>
#include <sstream>

#include "circuitlab/v1/analysis_service.pb.h"
#include "circuitlab/v1/experiment_service.grpc.pb.h"
#include "circuitlab/v1/reproduce.pb.h"
#include "circuitlab/v1/worker_service.grpc.pb.h"
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

// One valid request for every method of the services.
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
  // A patch sweep on the caller's own clean/corrupted prompts.
  auto prompts = std::make_unique<v1::InterveneRequest>();
  prompts->set_run_id("r1");
  prompts->mutable_patch()->add_hooks("L2.H1.out");
  for (const auto& tokens : {std::vector<int64_t>{0, 14, 30, 22, 25, 14}, std::vector<int64_t>{0, 14, 30, 22, 25, 22}}) {
    v1::InputSequence* seq = tokens[5] == 14 ? prompts->mutable_prompts()->add_clean()
                                             : prompts->mutable_prompts()->add_corrupted();
    for (size_t t = 0; t < tokens.size(); ++t) {
      seq->add_tokens(tokens[t]);
      seq->add_positions(static_cast<int64_t>(t));
    }
  }
  prompts->mutable_prompts()->add_answers(30);
  prompts->mutable_prompts()->add_wrong(25);
  add("AnalysisService", "Intervene", std::move(prompts));
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
  add("ExperimentService", "WhoAmI", std::make_unique<v1::WhoAmIRequest>());
  auto attention = std::make_unique<v1::GetAttentionPatternsRequest>();
  attention->set_run_id("r1");
  attention->set_sequences(2);
  attention->add_layers(1);
  add("AnalysisService", "GetAttentionPatterns", std::move(attention));
  auto export_weights = std::make_unique<v1::ExportWeightsRequest>();
  export_weights->set_run_id("r1");
  add("AnalysisService", "ExportWeights", std::move(export_weights));
  auto activations = std::make_unique<v1::GetActivationsRequest>();
  activations->set_run_id("r1");
  for (int b = 0; b < 2; ++b) {
    v1::InputSequence* seq = activations->add_sequences();
    for (int t = 0; t < 6; ++t) {
      seq->add_tokens(4 + t);
      seq->add_positions(t % 2);
    }
  }
  activations->add_hooks("L2.attn");
  activations->add_hooks("logits");
  add("AnalysisService", "GetActivations", std::move(activations));
  auto watch = std::make_unique<v1::WatchRunRequest>();
  watch->set_run_id("r1");
  add("ExperimentService", "WatchRun", std::move(watch));
  // Reproductions: a valid recipe of one's own (two steps of the induction
  // example, one check), so that mutations reach the recipe's validation.
  auto start = std::make_unique<v1::StartReproductionRequest>();
  start->set_scale("ci");
  v1::Recipe* recipe = start->mutable_recipe();
  recipe->set_id("F.1");
  v1::RecipeScale& scale = (*recipe->mutable_scales())["ci"];
  v1::RecipeSweep* sw = scale.add_sweeps();
  sw->set_name("one");
  *sw->mutable_sweep()->mutable_base() = spec;
  sw->mutable_sweep()->mutable_base()->mutable_training()->set_steps(2);
  v1::RecipeCheck* check = scale.add_checks();
  check->set_id("loss");
  check->mutable_value()->mutable_column()->set_sweep("one");
  check->mutable_value()->mutable_column()->set_column("train/loss");
  check->mutable_against()->mutable_constant()->set_number_value(0);
  add("ReproductionService", "StartReproduction", std::move(start));
  // And one with an analysis, selectors, groups and a where (what the path
  // mutations below aim at).
  auto richer = std::make_unique<v1::StartReproductionRequest>();
  *richer = *static_cast<const v1::StartReproductionRequest*>(seeds.back().message.get());
  v1::RecipeScale& rs = (*richer->mutable_recipe()->mutable_scales())["ci"];
  v1::SweepAxis* axis = rs.mutable_sweeps(0)->mutable_sweep()->add_axes();
  axis->set_field("training.learning_rate");
  axis->set_name("lr");
  axis->add_values()->set_number_value(0.001);
  axis->add_values()->set_number_value(0.002);
  v1::RecipeAnalysis* an = rs.add_analyses();
  an->set_name("circuit");
  an->set_sweep("one");
  an->mutable_detect_circuit();
  v1::RecipeCheck* sel = rs.add_checks();
  sel->set_id("selected");
  sel->mutable_value()->mutable_column()->set_sweep("one");
  sel->mutable_value()->mutable_column()->set_column("circuit.circuit.*[layer=1].coordinate.canonical");
  sel->mutable_value()->mutable_column()->set_reduce(v1::ColumnValue::REDUCE_DISTINCT);
  sel->mutable_value()->mutable_column()->add_group_by("lr");
  sel->mutable_value()->mutable_column()->set_across(v1::ColumnValue::REDUCE_MAX);
  (*sel->mutable_value()->mutable_column()->mutable_where())["lr"].set_number_value(0.001);
  sel->mutable_against()->mutable_constant()->set_number_value(1);
  add("ReproductionService", "StartReproduction", std::move(richer));
  auto get_rep = std::make_unique<v1::GetReproductionRequest>();
  get_rep->set_reproduction_id("p1");
  add("ReproductionService", "GetReproduction", std::move(get_rep));
  add("ReproductionService", "ListReproductions", std::make_unique<v1::ListReproductionsRequest>());
  add("ReproductionService", "ListRecipes", std::make_unique<v1::ListRecipesRequest>());
  auto cancel_rep = std::make_unique<v1::CancelReproductionRequest>();
  cancel_rep->set_reproduction_id("p1");
  add("ReproductionService", "CancelReproduction", std::move(cancel_rep));
  // An analysis added later needs no line here: a request naming r1 from
  // its descriptor (the mutations then reach every field).
  std::set<std::string> have;
  for (const Seed& seed : seeds) have.insert(seed.method);
  const pb::ServiceDescriptor* analyses =
      pb::DescriptorPool::generated_pool()->FindServiceByName("circuitlab.v1.AnalysisService");
  for (int k = 0; k < analyses->method_count(); ++k) {
    const pb::MethodDescriptor* m = analyses->method(k);
    if (have.count("/circuitlab.v1.AnalysisService/" + m->name())) continue;
    std::unique_ptr<pb::Message> request(
        pb::MessageFactory::generated_factory()->GetPrototype(m->input_type())->New());
    if (const pb::FieldDescriptor* run = m->input_type()->FindFieldByName("run_id")) {
      request->GetReflection()->SetString(request.get(), run, "r1");
    }
    add("AnalysisService", std::string(m->name()), std::move(request));
  }
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
    pb::Message* sub = f->is_repeated()
                           ? (r->FieldSize(*m, f) > 0 && gen() % 2
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
      const int64_t v[] = {0, -1,       std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min(),
                           7, 1LL << 40};
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

// A recipe's paths and selectors (its checks' columns, axes' fields, where
// keys, group_by, analysis and sweep names) set to hostile ones.
void MutateRecipePaths(v1::StartReproductionRequest* req, std::mt19937_64& gen) {
  static const std::vector<std::string> paths = {
      "a.b.*.#", "circuit.circuit.*.coordinate.canonical", "tv.values[name=p0/resid_ratio,layer=1,position=46].value",
      "*[layer=1].#", "[", "a[", "a[=]", "a[x=1", "a..b", ".", "#", "*.*.*.*.*.*.*.*.*.*.*.*", "series:",
      "trajectory:", "first:train/loss>=", "first:train/loss>=nan", "coord:", "circuit.", ".circuit",
      "x[a=1,a=2,a=3]", std::string(3000, '*'), std::string(2000, '[') + std::string(2000, ']'),
      "circuit.circuit.99999999999999999999", "circuit.circuit.-1", "/model/../x", "training.steps.0.0",
      "model", "", "seed", "one", "\x1b[31m", "a\u202e"};
  auto pick = [&] { return paths[gen() % paths.size()]; };
  if (!req->has_recipe() || req->recipe().scales().empty()) return;
  v1::RecipeScale& scale = req->mutable_recipe()->mutable_scales()->begin()->second;
  switch (gen() % 6) {
    case 0:
      if (scale.checks_size()) {
        scale.mutable_checks(static_cast<int>(gen() % scale.checks_size()))->mutable_value()->mutable_column()->set_column(pick());
      }
      break;
    case 1:
      if (scale.sweeps_size() && scale.sweeps(0).sweep().axes_size()) {
        scale.mutable_sweeps(0)->mutable_sweep()->mutable_axes(0)->set_field(pick());
      }
      break;
    case 2:
      if (scale.checks_size()) {
        (*scale.mutable_checks(0)->mutable_value()->mutable_column()->mutable_where())[pick()].set_string_value(pick());
      }
      break;
    case 3:
      if (scale.checks_size()) scale.mutable_checks(0)->mutable_value()->mutable_column()->add_group_by(pick());
      break;
    case 4:
      if (scale.analyses_size()) scale.mutable_analyses(0)->set_sweep(pick());
      break;
    default:
      if (scale.checks_size()) {
        scale.mutable_checks(0)->mutable_value()->mutable_column()->set_other(pick());
        scale.mutable_checks(0)->mutable_value()->mutable_column()->set_reduce(
            static_cast<v1::ColumnValue::Reduce>(gen() % 13));
      }
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
      b += wire == 2 ? std::string(
                           "\x03"
                           "abc",
                           4)
                     : std::string("\x05", 1);
      break;
    }
  }
}

int64_t StatusKb(pid_t pid, const char* field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stoll(line.substr(std::strlen(field)));
  }
  return -1;
}
int64_t RssKb(pid_t pid) { return StatusKb(pid, "VmRSS:"); }

// Issue 51: the server's peak memory watched while requests run. Every 20 ms
// it reads the high-water mark (VmHWM, reset through clear_refs after each
// reading); a peak more than `limit_kb` above `base_kb` is a failure naming
// the requests in flight then (`in_flight()`, called under no lock of ours).
class PeakGuard {
 public:
  PeakGuard(pid_t pid, int64_t limit_kb, std::function<std::string()> in_flight)
      : pid_(pid), limit_kb_(limit_kb), in_flight_(std::move(in_flight)) {
    base_kb_ = RssKb(pid);
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        std::ofstream("/proc/" + std::to_string(pid_) + "/clear_refs") << "5";
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        const int64_t peak = StatusKb(pid_, "VmHWM:");
        if (peak > worst_kb_.load()) worst_kb_ = peak;
        if (peak - base_kb_ > limit_kb_) {
          std::lock_guard<std::mutex> lock(mu_);
          if (failures_.size() < 5) {
            failures_.push_back("peak RSS " + std::to_string(peak / 1024) + " MB, " +
                                std::to_string((peak - base_kb_) / 1024) + " MB above the start, with in flight: " +
                                in_flight_());
          }
        }
      }
    });
  }
  ~PeakGuard() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  int64_t base_kb() const { return base_kb_; }
  int64_t worst_kb() const { return worst_kb_.load(); }
  std::vector<std::string> failures() {
    std::lock_guard<std::mutex> lock(mu_);
    return failures_;
  }

 private:
  const pid_t pid_;
  const int64_t limit_kb_;
  const std::function<std::string()> in_flight_;
  int64_t base_kb_ = 0;
  std::atomic<int64_t> worst_kb_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<std::string> failures_;
  std::thread thread_;
};

std::string Hex(const std::string& b) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : b.substr(0, 256)) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

// A new RPC gets a seed here, or this fails: every method of the client
// services is fuzzed.
TEST(FuzzTest, EveryRpcHasASeed) {
  std::set<std::string> seeded;
  for (const Seed& s : Seeds()) seeded.insert(s.method);
  for (const char* name :
       {"circuitlab.v1.ExperimentService", "circuitlab.v1.AnalysisService", "circuitlab.v1.ReproductionService"}) {
    const pb::ServiceDescriptor* service = pb::DescriptorPool::generated_pool()->FindServiceByName(name);
    ASSERT_NE(service, nullptr) << name;
    for (int i = 0; i < service->method_count(); ++i) {
      const pb::MethodDescriptor* m = service->method(i);
      EXPECT_TRUE(seeded.count("/circuitlab.v1." + service->name() + "/" + m->name()))
          << service->name() << "." << m->name() << " has no fuzz seed";
    }
  }
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
  std::multiset<std::string> flying;  // methods in flight, for the peak guard (under mu)
  PeakGuard peak(server.pid(), 256 * 1024, [&] {
    std::lock_guard<std::mutex> lock(mu);
    std::map<std::string, int> n;
    for (const std::string& f : flying) ++n[f.substr(f.rfind('/') + 1)];
    std::string out;
    for (const auto& [method, k] : n) out += (out.empty() ? "" : ", ") + method + " x" + std::to_string(k);
    return out;
  });
  for (int i = 0; i < kRequests; ++i) {
    const Seed& s = seeds[gen() % seeds.size()];
    std::unique_ptr<pb::Message> m(s.message->New());
    m->CopyFrom(*s.message);
    if (auto* start = dynamic_cast<v1::StartReproductionRequest*>(m.get()); start != nullptr && gen() % 2 == 0) {
      MutateRecipePaths(start, gen);
    }
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
      flying.insert(s.method);
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
    stub.UnaryCall(
        &call->ctx, method, grpc::StubOptions(), &call->request, &call->response,
        [&, call, method, bytes, watch](grpc::Status st) {
          std::lock_guard<std::mutex> lock(mu);
          const grpc::StatusCode c = st.error_code();
          ++codes[std::to_string(c)];
          const bool bad_code = c == grpc::StatusCode::UNIMPLEMENTED || c == grpc::StatusCode::UNKNOWN ||
                                c == grpc::StatusCode::INTERNAL || (c == grpc::StatusCode::DEADLINE_EXCEEDED && !watch);
          if ((bad_code || st.error_message().size() > 1024) && failures.size() < 20) {
            failures.push_back(method + " -> " + std::to_string(c) + " '" + st.error_message().substr(0, 300) + "' (" +
                               std::to_string(st.error_message().size()) + " chars) for " + Hex(bytes));
          }
          --in_flight;
          flying.erase(flying.find(method));
          ++done;
          cv.notify_all();
        });
    if (i == 300) rss_after_warmup = RssKb(server.pid());
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return in_flight == 0; });
  }
  peak.Stop();
  const int64_t rss_end = RssKb(server.pid());
  std::string summary;
  for (const auto& [code, n] : codes) summary += " " + code + ":" + std::to_string(n);
  std::printf("%d requests (seed %llu); status codes%s; RSS %lld -> %lld KB; highest peak %lld KB (from %lld)\n",
              done, static_cast<unsigned long long>(seed), summary.c_str(), static_cast<long long>(rss_after_warmup),
              static_cast<long long>(rss_end), static_cast<long long>(peak.worst_kb()),
              static_cast<long long>(peak.base_kb()));
  for (const std::string& f : peak.failures()) ADD_FAILURE() << f;
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

// Issue 32: the WorkerService stream, fuzzed. Sessions of a worker token
// send a (mostly valid) Register, then mutated messages of every kind aimed
// at the lease the server hands them (mutated lease ids, sequences, members,
// steps, names, chunk sizes). Each session must end with a status that is
// not UNIMPLEMENTED, UNKNOWN or INTERNAL, messages at most 1 KiB; the server
// keeps serving, its RSS grows by at most 50 MB, and no run fails but by a
// worker's own report.
TEST(FuzzTest, MutatedWorkerSessionsNeverBreakTheBoundary) {
  TempDir dir;
  const std::string tokens = dir.path() + "/tokens.txt";
  ASSERT_EQ(std::system((std::string(CIRCUITLAB_SCRIPTS_DIR) + "/add-principal.sh fuzzer worker " + tokens + " " +
                         dir.path() + " >/dev/null && " + CIRCUITLAB_SCRIPTS_DIR + "/add-principal.sh me admin " +
                         tokens + " " + dir.path() + " >/dev/null")
                            .c_str()),
            0);
  const std::string worker_token = ReadFile(dir.path() + "/fuzzer.token");
  const std::string admin_token = ReadFile(dir.path() + "/me.token");
  ServerProcess server(kServer, dir.path() + "/data",
                       {"--executor", "workers", "--auth-tokens-file", tokens, "--lease-timeout-seconds", "2",
                        "--max-lost-leases", "1000"});
  ASSERT_TRUE(server.ok());
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  auto stub = v1::WorkerService::NewStub(channel);
  auto trim = [](std::string t) {
    while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
    return t;
  };
  // Queued runs for the sessions to lease.
  grpc::GenericStub generic(channel);
  for (int i = 0; i < 3; ++i) {
    v1::SubmitRunRequest submit;
    *submit.mutable_spec() = FromJson<v1::ExperimentSpec>(ReadFile(kExamples + "/induction.json"));
    submit.mutable_spec()->set_seed(100 + i);
    auto unary = v1::ExperimentService::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + trim(admin_token));
    v1::SubmitRunResponse out;
    ASSERT_TRUE(unary->SubmitRun(&ctx, submit, &out).ok());
  }
  uint64_t seed = 20261203;
  if (const char* e = std::getenv("CIRCUITLAB_FUZZ_SEED")) seed = std::stoull(e);
  std::mt19937_64 gen(seed);
  std::map<std::string, int> codes;
  std::vector<std::string> failures;
  int64_t rss_start = RssKb(server.pid());
  constexpr int kSessions = 150;
  for (int i = 0; i < kSessions; ++i) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + trim(worker_token));
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
    auto stream = stub->Session(&ctx);
    v1::WorkerMessage reg;
    reg.mutable_register_()->set_host("fuzz-node");
    reg.mutable_register_()->set_slots(1 + gen() % 2);
    reg.mutable_register_()->set_device("cpu");
    reg.mutable_register_()->set_version("0.1.0");
    if (gen() % 4 == 0) MutateField(&reg, gen);
    stream->Write(reg);
    v1::ServerMessage in;
    uint64_t lease = gen() % 5;
    if (gen() % 3 != 0) {
      // Wait briefly for a lease (or whatever comes first).
      for (int k = 0; k < 3 && stream->Read(&in); ++k) {
        if (in.has_lease()) {
          lease = in.lease().lease_id();
          break;
        }
      }
    }
    const int sends = 1 + static_cast<int>(gen() % 12);
    for (int k = 0; k < sends; ++k) {
      v1::WorkerMessage m;
      switch (gen() % 6) {
        case 0:
          m.mutable_heartbeat();
          break;
        case 1: {
          auto* r = m.mutable_report();
          r->mutable_progress()->set_step(gen() % 2 ? gen() : gen() % 700);
          break;
        }
        case 2: {
          auto* p = m.mutable_report()->mutable_metrics()->add_metrics();
          p->set_step(gen() % 700);
          p->set_name(gen() % 3 ? "train/loss" : std::string("x\x1b[2J\n", 6));
          p->set_value(1.0);
          break;
        }
        case 3: {
          auto* c = m.mutable_report()->mutable_checkpoint();
          c->set_step(gen() % 700);
          c->set_data(std::string(static_cast<size_t>(gen() % 300000), 'c'));
          c->set_last(gen() % 2);
          break;
        }
        case 4:
          m.mutable_lease_end()->add_members()->set_end(static_cast<v1::MemberEnd::End>(gen() % 5));
          break;
        default:
          m.mutable_drain();
          break;
      }
      if (m.has_report()) {
        m.mutable_report()->set_lease_id(gen() % 5 ? lease : gen());
        m.mutable_report()->set_sequence(gen() % 4 ? static_cast<uint64_t>(k + 1) : gen());
        m.mutable_report()->set_member(gen() % 5 ? 0 : static_cast<uint32_t>(gen()));
      } else if (m.has_lease_end()) {
        m.mutable_lease_end()->set_lease_id(lease);
        m.mutable_lease_end()->set_sequence(static_cast<uint64_t>(k + 1));
      }
      if (gen() % 5 == 0) MutateField(&m, gen);
      if (!stream->Write(m)) break;
    }
    stream->WritesDone();
    while (stream->Read(&in)) {
    }
    const grpc::Status st = stream->Finish();
    const grpc::StatusCode c = st.error_code();
    ++codes[std::to_string(c)];
    const bool bad =
        c == grpc::StatusCode::UNIMPLEMENTED || c == grpc::StatusCode::UNKNOWN || c == grpc::StatusCode::INTERNAL;
    if ((bad || st.error_message().size() > 1024) && failures.size() < 20) {
      failures.push_back("session " + std::to_string(i) + " -> " + std::to_string(c) + " '" +
                         st.error_message().substr(0, 300) + "'");
    }
  }
  const int64_t rss_end = RssKb(server.pid());
  std::string summary;
  for (const auto& [code, n] : codes) summary += " " + code + ":" + std::to_string(n);
  std::printf("%d worker sessions (seed %llu); status codes%s; RSS %lld -> %lld KB\n", kSessions,
              static_cast<unsigned long long>(seed), summary.c_str(), static_cast<long long>(rss_start),
              static_cast<long long>(rss_end));
  for (const std::string& f : failures) ADD_FAILURE() << f;
  EXPECT_LE(rss_end - rss_start, 50 * 1024) << "RSS growth over the run";
  // Still serving; none of the queued runs was failed by the fuzzing workers.
  auto unary = v1::ExperimentService::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer " + trim(admin_token));
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ListRunsResponse runs;
  ASSERT_TRUE(unary->ListRuns(&ctx, v1::ListRunsRequest(), &runs).ok());
  // A run may end FAILED only because a worker reported it failed (lease_end
  // END_FAILED: "... (on wN ...)"), never because of what the server made of
  // a worker's junk (a refused upload ends the worker's session instead).
  for (const v1::Run& r : runs.runs()) {
    if (r.state() == v1::RUN_STATE_FAILED) {
      EXPECT_NE(r.error().find("(on w"), std::string::npos) << r.run_id() << ": " << r.error();
    }
  }
  EXPECT_EQ(server.Stop(SIGTERM), 0) << "drains and exits 0 after the fuzz";
}

// Issue 32: the HTTP port, fuzzed: well-formed requests to every route with
// mutated paths, ids, query parameters and headers, and raw malformed bytes.
// No answer may be a 5xx other than 503 (draining, stream cap) or take longer
// than the read timeout allows; error bodies stay under 1 KiB; /healthz still
// answers at the end and the server drains cleanly.
TEST(FuzzTest, MutatedHttpRequestsNeverBreakTheBoundary) {
  TempDir dir;
  ServerProcess server(kServer, dir.path() + "/data", {"--max-run-memory-mb", "16"});
  ASSERT_TRUE(server.ok());
  ASSERT_GT(server.http_port(), 0);
  const int port = server.http_port();
  uint64_t seed = 20261204;
  if (const char* e = std::getenv("CIRCUITLAB_FUZZ_SEED")) seed = std::stoull(e);
  std::mt19937_64 gen(seed);
  const std::vector<std::string> routes = {"/healthz",
                                           "/readyz",
                                           "/metrics",
                                           "/",
                                           "/index.html",
                                           "/api/v1/whoami",
                                           "/api/v1/runs",
                                           "/api/v1/runs/r1",
                                           "/api/v1/runs/r1/metrics",
                                           "/api/v1/runs/r1/events",
                                           "/api/v1/runs/r1/coordinates",
                                           "/api/v1/sweeps/s1",
                                           "/api/v1/sweeps/s1/summary",
                                           "/api/v1/analyses",
                                           "/api/v1/recipes",
                                           "/api/v1/reproductions",
                                           "/api/v1/reproductions/p1",
                                           "/api/v1/runs/r1/interventions",
                                           "/api/v1/runs/r1/interventions/123",
                                           "/api/v1/runs/r1/attention/stored",
                                           "/api/v1/runs/r1/activations",
                                           "/api/v1/runs/r1/export",
                                           "/api/v1/runs/r1/export/weights.safetensors",
                                           "/api/v1/reproductions/p1/report.md"};
  const std::vector<std::string> pieces = {"%00",
                                           "%ff",
                                           "..",
                                           "//",
                                           "?",
                                           "&",
                                           "=",
                                           "r-1",
                                           "r99999999999999999999",
                                           "\x7f",
                                           "%2e%2e",
                                           std::string(3000, 'a'),
                                           "page_size=-1",
                                           "max_points=1000000000",
                                           "values=circuit,pair",
                                           "step=18446744073709551615",
                                           "page_token=p0",
                                           "page_token=1.-9223372036854775808",
                                           "view=REPRODUCTION_VIEW_FULL",
                                           "view=7",
                                           "page_size=51"};
  httplib::Client http("127.0.0.1", port);
  http.set_read_timeout(std::chrono::seconds(5));
  std::map<int, int> statuses;
  std::vector<std::string> failures;
  constexpr int kRequests = 1500;
  std::mutex current_mu;
  std::string current;  // the request in flight, for the peak guard
  PeakGuard peak(server.pid(), 256 * 1024, [&] {
    std::lock_guard<std::mutex> lock(current_mu);
    return current.substr(0, 200);
  });
  for (int i = 0; i < kRequests; ++i) {
    std::string path = routes[gen() % routes.size()];
    const int mutations = static_cast<int>(gen() % 3);
    for (int k = 0; k < mutations; ++k) {
      const std::string& p = pieces[gen() % pieces.size()];
      const size_t at = gen() % (path.size() + 1);
      path.insert(at, gen() % 2 ? p : "?" + p);
    }
    httplib::Headers headers;
    if (gen() % 3 == 0) headers.emplace("Authorization", gen() % 2 ? "Bearer x" : std::string(5000, 'B'));
    if (gen() % 5 == 0) headers.emplace("Last-Event-ID", pieces[gen() % pieces.size()]);
    if (gen() % 7 == 0) headers.emplace("Range", "bytes=" + std::to_string(gen()) + "-");
    {
      std::lock_guard<std::mutex> lock(current_mu);
      current = path;
    }
    // POST bodies: a run of '{' of any length up to past the 64 KiB limit,
    // or a GetActivationsRequest of hostile sizes and values.
    const std::vector<std::string> bodies = {
        R"({"sequences": [{"tokens": [1e30], "positions": [-1]}], "hooks": ["L999.attn"]})",
        R"({"sequences": [{"tokens": [)" + std::string(20000, '7') + R"(]}]})",
        R"({"step": "18446744073709551615", "hooks": [")" + std::string(5000, 'h') + R"("]})"};
    const std::string body = gen() % 3 == 0 ? bodies[gen() % bodies.size()]
                                            : std::string(static_cast<size_t>(gen() % 70000), '{');
    httplib::Result r = gen() % 4 == 0 ? http.Post(path, headers, body, gen() % 2 ? "application/json" : "text/plain")
                                       : http.Get(path, headers);
    if (!r) {
      // httplib refuses some paths itself (bad characters): not the server's doing.
      continue;
    }
    ++statuses[r->status];
    const bool bad = r->status >= 500 && r->status != 503;
    const bool large_error = r->status >= 400 && r->body.size() > 1024;
    if ((bad || large_error) && failures.size() < 20) {
      failures.push_back(std::to_string(r->status) + " for " + path.substr(0, 200) + ": " + r->body.substr(0, 200));
    }
  }
  // Raw malformed bytes on fresh connections, the writing side then shut so
  // that the server sees the whole request: each is answered or closed at
  // once, never held (slow clients are http_test's business).
  constexpr int kRaw = 200;
  for (int i = 0; i < kRaw; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    std::string bytes = "GET /api/v1/runs HTTP/1.1\r\nHost: x\r\n\r\n";
    const int mutations = 1 + static_cast<int>(gen() % 4);
    for (int k = 0; k < mutations; ++k) MutateBytes(bytes, gen);
    ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    ::shutdown(fd, SHUT_WR);
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[512];
    const auto t0 = std::chrono::steady_clock::now();
    while (::recv(fd, buf, sizeof buf, 0) > 0) {
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5)) << "held: " << Hex(bytes);
    ::close(fd);
  }
  std::string summary;
  for (const auto& [status, n] : statuses) summary += " " + std::to_string(status) + ":" + std::to_string(n);
  peak.Stop();
  std::printf("%d HTTP requests + %d raw (seed %llu); statuses%s; highest peak %lld KB (from %lld)\n", kRequests,
              kRaw, static_cast<unsigned long long>(seed), summary.c_str(), static_cast<long long>(peak.worst_kb()),
              static_cast<long long>(peak.base_kb()));
  for (const std::string& f : failures) ADD_FAILURE() << f;
  for (const std::string& f : peak.failures()) ADD_FAILURE() << f;
  auto health = httplib::Client("127.0.0.1", port).Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(server.Stop(SIGTERM), 0) << "drains and exits 0 after the fuzz";
}

}  // namespace
}  // namespace circuitlab::testing
