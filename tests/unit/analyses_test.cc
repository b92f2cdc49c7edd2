// Each scheduler/analyses/<name>.cc against a recording fake analyzer: the
// canonical request the engine is handed (every default resolved, seed 0 =
// the run's), validation errors that name the field, and the DONE answer
// with its job fields, stored and served again. The analyses themselves are
// tested in unit_torch and science.
#include <gtest/gtest.h>

#include <mutex>

#include "circuitlab/v1/experiment_service.pb.h"
#include "server/engine/spec.h"
#include "server/scheduler/analysis_core.h"
#include "server/scheduler/analysis_table.h"
#include "server/store/store.h"
#include "tests/test_util/fake_analyzer.h"
#include "tests/test_util/temp_dir.h"

namespace circuitlab::scheduler {
namespace {

using circuitlab::testing::TempDir;
using circuitlab::testing::WaitFor;

// Records the request of every call and answers a canned response.
class RecordingAnalyzer : public testing::UnimplementedAnalyzer {
 public:
  using Input = engine::AnalysisInput;
  RecordingAnalyzer() {
    On<v1::ProjectCheckpointRequest, v1::ProjectCheckpointResponse>(
        [this](const Input& in, const v1::ProjectCheckpointRequest& r, const Progress&, const CancelToken*) {
          Record(r, in.checkpoint());
          v1::ProjectCheckpointResponse out;
          out.set_rho(0.25);
          return out;
        });
    On<v1::DetectCircuitRequest, v1::DetectCircuitResponse>(
        [this](const Input& in, const v1::DetectCircuitRequest& r, const Progress&, const CancelToken*) {
          Record(r, in.checkpoint());
          v1::DetectCircuitResponse out;
          out.set_template_name("induction_head");
          return out;
        });
    On<v1::InterveneRequest, v1::InterveneResponse>(
        [this](const Input& in, const v1::InterveneRequest& r, const Progress&, const CancelToken*) {
          Record(r, in.checkpoint());
          std::lock_guard<std::mutex> lock(mu);
          swap_sources = in.sources;
          v1::InterveneResponse out;
          out.add_effects()->set_eval_set("icl_rare");
          return out;
        });
    On<v1::LabelRunRequest, v1::LabelRunResponse>(
        [this](const Input& in, const v1::LabelRunRequest& r, const Progress&, const CancelToken*) {
          Record(r, in.checkpoint());
          std::lock_guard<std::mutex> lock(mu);
          label_steps.clear();
          for (const auto& [step, bytes] : in.checkpoints) label_steps.push_back(step);
          v1::LabelRunResponse out;
          out.set_label("ICL_ONLY");
          return out;
        });
    On<v1::CheckDataDependenceRequest, v1::CheckDataDependenceResponse>(
        [this](const Input&, const v1::CheckDataDependenceRequest& r, const Progress&, const CancelToken*) {
          Record(r, "");
          return v1::CheckDataDependenceResponse();
        });
    On<v1::AnalyzeTaskVectorsRequest, v1::AnalyzeTaskVectorsResponse>(
        [this](const Input& in, const v1::AnalyzeTaskVectorsRequest& r, const Progress&, const CancelToken*) {
          Record(r, in.checkpoint());
          v1::AnalyzeTaskVectorsResponse out;
          v1::TaskVectorValue* v = out.add_values();
          v->set_name("p0/resid_ratio");
          v->set_value(0.1);
          return out;
        });
    On<v1::GetAttentionPatternsRequest, v1::GetAttentionPatternsResponse>(
        [this](const Input& in, const v1::GetAttentionPatternsRequest& r, const Progress&, const CancelToken*) {
          Record(r, in.checkpoint());
          v1::GetAttentionPatternsResponse out;
          out.set_eval_set("icl_rare");
          out.add_patterns()->set_name("L1H1");
          return out;
        });
  }

  // The last request handed to the engine, as `M`, and its checkpoint bytes.
  template <typename M>
  M Last() {
    std::lock_guard<std::mutex> lock(mu);
    M m;
    EXPECT_TRUE(m.ParseFromString(last));
    return m;
  }
  std::string LastCheckpoint() {
    std::lock_guard<std::mutex> lock(mu);
    return last_checkpoint;
  }
  int calls() {
    std::lock_guard<std::mutex> lock(mu);
    return count;
  }

  std::mutex mu;
  std::string last, last_checkpoint;
  int count = 0;
  std::map<int, engine::StoredCheckpoint> swap_sources;
  std::vector<int64_t> label_steps;

 private:
  void Record(const google::protobuf::Message& m, const std::string& ckpt) {
    std::lock_guard<std::mutex> lock(mu);
    last = m.SerializeAsString();
    last_checkpoint = ckpt;
    ++count;
  }
};

v1::ExperimentSpec Resolved(v1::ExperimentSpec spec) {
  EXPECT_TRUE(engine::ResolveSpec({}, &spec).ok());
  return spec;
}

class AnalysesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = store::Store::Open(dir_.path());
    ASSERT_TRUE(store.ok());
    store_ = std::move(*store);
    v1::ExperimentSpec imir;
    imir.set_seed(7);
    imir_ = AddRun(Resolved(imir), {100, 200});  // r1
    v1::ExperimentSpec latent;
    latent.set_seed(9);
    latent.mutable_task()->mutable_latent()->set_kind(v1::LATENT_KIND_DICE);
    latent.mutable_model()->mutable_decoder();
    decoder_ = AddRun(Resolved(latent), {50});  // r2
    core_ = std::make_unique<AnalysisCore>(store_.get(), &analyzer_);
  }

  int64_t AddRun(const v1::ExperimentSpec& spec, const std::vector<int64_t>& steps) {
    store::NewRun run;
    run.name = "run";
    run.spec = spec.SerializeAsString();
    run.spec_json = "{}";
    run.state = v1::RUN_STATE_SUCCEEDED;
    auto id = store_->InsertRun(run);
    EXPECT_TRUE(id.ok());
    for (int64_t s : steps) EXPECT_TRUE(store_->PutCheckpoint(*id, s, "ckpt@" + std::to_string(s), 0).ok());
    EXPECT_TRUE(store_->Flush().ok());
    return *id;
  }

  // Asks until the answer is DONE.
  template <typename Resp, typename Req>
  Resp Done(const Req& req) {
    Resp last;
    EXPECT_TRUE(WaitFor([&] {
      absl::StatusOr<Resp> r = core_->Run<Resp>(req, "");
      EXPECT_TRUE(r.ok()) << r.status();
      if (r.ok()) last = *r;
      return r.ok() && last.state() == v1::ANALYSIS_STATE_DONE;
    }));
    return last;
  }

  TempDir dir_;
  std::unique_ptr<store::Store> store_;
  RecordingAnalyzer analyzer_;
  std::unique_ptr<AnalysisCore> core_;
  int64_t imir_ = 0, decoder_ = 0;
};

TEST_F(AnalysesTest, ProjectCheckpointResolvesStepAndSelection) {
  v1::ProjectCheckpointRequest req;
  req.set_run_id("r1");
  const v1::ProjectCheckpointResponse done = Done<v1::ProjectCheckpointResponse>(req);
  EXPECT_EQ(done.run_id(), "r1");
  EXPECT_EQ(done.step(), 200u);  // the newest checkpoint
  EXPECT_DOUBLE_EQ(done.rho(), 0.25);
  const auto seen = analyzer_.Last<v1::ProjectCheckpointRequest>();
  EXPECT_EQ(seen.selection(), v1::BASIS_SELECTION_PAPER);
  EXPECT_EQ(seen.step(), 200u);
  EXPECT_EQ(analyzer_.LastCheckpoint(), "ckpt@200");
  EXPECT_TRUE(core_->Run<v1::ProjectCheckpointResponse>(req)->from_store());
  req.set_run_id("r2");
  EXPECT_EQ(core_->Run<v1::ProjectCheckpointResponse>(req).status().code(), absl::StatusCode::kFailedPrecondition);
  // A step beyond int64 once wrapped to "the newest" (issue 14 item 6).
  req.set_run_id("r1");
  req.set_step(uint64_t{1} << 63);
  EXPECT_EQ(core_->Run<v1::ProjectCheckpointResponse>(req).status().message(),
            "step must be in [0, 2^62] (0 = the newest checkpoint), got 9223372036854775808");
}

TEST_F(AnalysesTest, DetectCircuitHandsTheEngineEveryDefault) {
  v1::DetectCircuitRequest req;
  req.set_run_id("r1");
  req.set_step(100);
  const v1::DetectCircuitResponse done = Done<v1::DetectCircuitResponse>(req);
  EXPECT_EQ(done.step(), 100u);
  EXPECT_EQ(done.metric(), "accuracy");
  EXPECT_EQ(done.template_name(), "induction_head");
  const auto seen = analyzer_.Last<v1::DetectCircuitRequest>();
  EXPECT_EQ(seen.n_eval(), 2048u);
  EXPECT_EQ(seen.metric(), "accuracy");
  EXPECT_DOUBLE_EQ(seen.tolerance(), 0.01);
  EXPECT_EQ(seen.order(), "magnitude_asc");
  EXPECT_DOUBLE_EQ(seen.prepass_eps(), 1e-3);
  EXPECT_EQ(seen.max_passes(), 3u);
  EXPECT_EQ(seen.max_evals(), 5000u);
  EXPECT_EQ(seen.seed(), 7u);  // the run's
  EXPECT_FALSE(seen.force());
  // The loss metric has its own default tolerance.
  req.set_metric("loss");
  Done<v1::DetectCircuitResponse>(req);
  EXPECT_DOUBLE_EQ(analyzer_.Last<v1::DetectCircuitRequest>().tolerance(), 0.02);
  req.set_metric("bogus");
  EXPECT_EQ(core_->Run<v1::DetectCircuitResponse>(req).status().message(), "metric must be accuracy, loss or p_target, got 'bogus'");
  req.set_metric("");
  req.set_order("random");
  EXPECT_NE(core_->Run<v1::DetectCircuitResponse>(req).status().message().find("order must be"), absl::string_view::npos);
}

TEST_F(AnalysesTest, InterveneValidatesOpsAndLoadsSwapSources) {
  v1::InterveneRequest req;
  req.set_run_id("r1");
  v1::Intervention* zero = req.add_interventions();
  zero->set_op(v1::Intervention::OP_ZERO_COORDINATE);
  zero->add_coordinates("beta");
  v1::Intervention* swap = req.add_interventions();
  swap->set_op(v1::Intervention::OP_SWAP_COORDINATES);
  swap->set_source_run_id("r1");
  swap->set_source_step(100);
  const v1::InterveneResponse done = Done<v1::InterveneResponse>(req);
  EXPECT_EQ(done.run_id(), "r1");
  EXPECT_EQ(done.step(), 200u);
  ASSERT_EQ(done.effects_size(), 1);
  const auto seen = analyzer_.Last<v1::InterveneRequest>();
  EXPECT_EQ(seen.n_eval(), 2048u);
  EXPECT_EQ(seen.seed(), 7u);
  EXPECT_EQ(seen.interventions(1).source_run_id(), "r1");
  {
    std::lock_guard<std::mutex> lock(analyzer_.mu);
    ASSERT_EQ(analyzer_.swap_sources.size(), 1u);
    EXPECT_EQ(analyzer_.swap_sources.at(1).bytes, "ckpt@100");  // by intervention index
  }
  v1::InterveneRequest bad = req;
  bad.mutable_interventions(0)->set_op(v1::Intervention::OP_UNSPECIFIED);
  EXPECT_NE(core_->Run<v1::InterveneResponse>(bad).status().message().find("interventions[0].op must be"), absl::string_view::npos);
  bad = req;
  bad.mutable_interventions(0)->set_scale(std::nan(""));
  EXPECT_NE(core_->Run<v1::InterveneResponse>(bad).status().message().find("interventions[0]: scale and value must be finite"),
            absl::string_view::npos);
  // A decoder run takes hook-point ops only.
  bad = req;
  bad.set_run_id("r2");
  bad.mutable_interventions()->RemoveLast();
  EXPECT_EQ(core_->Run<v1::InterveneResponse>(bad).status().code(), absl::StatusCode::kFailedPrecondition);
  bad.mutable_interventions(0)->set_op(v1::Intervention::OP_ADD);
  bad.mutable_interventions(0)->add_weights(-1);
  EXPECT_NE(core_->Run<v1::InterveneResponse>(bad).status().message().find("interventions[0].weights must be finite and non-negative"),
            absl::string_view::npos);
}

TEST_F(AnalysesTest, InterveneTakesAPatchSweepAloneAndBoundsIt) {
  v1::InterveneRequest req;
  req.set_run_id("r1");
  req.mutable_patch()->add_hooks("L1.H1.out");
  Done<v1::InterveneResponse>(req);  // a sweep without interventions is a request
  EXPECT_EQ(analyzer_.Last<v1::InterveneRequest>().patch().hooks(0), "L1.H1.out");
  v1::InterveneRequest bad;
  bad.set_run_id("r1");
  EXPECT_NE(core_->Run<v1::InterveneResponse>(bad).status().message().find("(or give a patch sweep)"), absl::string_view::npos);
  // 16 hooks x (1024 positions + 1) x n_eval 2048 is far beyond the bound.
  bad = req;
  for (int i = 0; i < 15; ++i) bad.mutable_patch()->add_hooks("L1.attn");
  for (uint32_t p = 0; p < 1024; ++p) bad.mutable_patch()->add_positions(p % 8);
  const absl::Status big = core_->Run<v1::InterveneResponse>(bad).status();
  EXPECT_EQ(big.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(big.message().find("16 hooks x 1025 sites each x n_eval 2048"), absl::string_view::npos) << big;
  bad.mutable_patch()->add_hooks("L2.attn");
  EXPECT_EQ(core_->Run<v1::InterveneResponse>(bad).status().message(), "patch.hooks must have 1 to 16 entries, got 17");
}

TEST_F(AnalysesTest, LabelRunLabelsEveryCheckpointInOrder) {
  v1::LabelRunRequest req;
  req.set_run_id("r1");
  const v1::LabelRunResponse done = Done<v1::LabelRunResponse>(req);
  EXPECT_EQ(done.label(), "ICL_ONLY");
  EXPECT_EQ(analyzer_.Last<v1::LabelRunRequest>().n_eval(), 1024u);
  std::lock_guard<std::mutex> lock(analyzer_.mu);
  EXPECT_EQ(analyzer_.label_steps, (std::vector<int64_t>{100, 200}));
}

TEST_F(AnalysesTest, DataDependenceFillsTheDefaultGrid) {
  v1::ExperimentSpec spec;
  spec.mutable_task()->mutable_associative_recall()->set_num_common(8);
  v1::CheckDataDependenceRequest req;
  *req.mutable_spec() = spec;
  Done<v1::CheckDataDependenceResponse>(req);
  const auto seen = analyzer_.Last<v1::CheckDataDependenceRequest>();
  EXPECT_EQ(seen.samples(), 65536u);
  EXPECT_GE(seen.points_size(), 8);  // E.6's grid in both modes, then E.7's burstiness
  for (const v1::DataPoint& p : seen.points()) {
    EXPECT_GE(p.burstiness(), 1u);
    EXPECT_NE(p.variability_mode(), v1::VARIABILITY_MODE_UNSPECIFIED);
  }
  req.add_points()->set_rare_fraction(2);
  EXPECT_EQ(core_->Run<v1::CheckDataDependenceResponse>(req).status().message(),
            "points[0].rare_fraction must be in [0, 1], got 2.000000");
}

TEST_F(AnalysesTest, TaskVectorsResolveAnalysesAndTagValues) {
  v1::AnalyzeTaskVectorsRequest req;
  req.set_run_id("r2");
  const v1::AnalyzeTaskVectorsResponse done = Done<v1::AnalyzeTaskVectorsResponse>(req);
  ASSERT_EQ(done.values_size(), 1);
  EXPECT_EQ(done.values(0).run_id(), "r2");
  EXPECT_EQ(done.values(0).step(), 50u);
  const auto seen = analyzer_.Last<v1::AnalyzeTaskVectorsRequest>();
  EXPECT_EQ(std::vector<std::string>(seen.analyses().begin(), seen.analyses().end()),
            (std::vector<std::string>{"p0", "p1", "p2", "p3", "steering", "ood_r2", "kl", "dissociation"}));
  EXPECT_EQ(seen.seed(), 9u);
  EXPECT_EQ(seen.hook(), "post_mlp");
  EXPECT_EQ(seen.samples_per_cell(), 128u);
  EXPECT_DOUBLE_EQ(seen.p_common(), 0.9);
  req.set_run_id("r1");
  EXPECT_EQ(core_->Run<v1::AnalyzeTaskVectorsResponse>(req).status().code(), absl::StatusCode::kFailedPrecondition);
  req.set_run_id("r2");
  req.add_analyses("p9");
  EXPECT_NE(core_->Run<v1::AnalyzeTaskVectorsResponse>(req).status().message().find("analyses[0] must be one of"),
            absl::string_view::npos);
}

// The analysis table's newest entry: defaults resolved, indices sorted and
// unique, bounds named; which heads exist is the engine's to say.
TEST_F(AnalysesTest, AttentionPatternsResolveTheRequest) {
  v1::GetAttentionPatternsRequest req;
  req.set_run_id("r1");
  req.add_layers(2);
  req.add_layers(1);
  req.add_layers(2);
  const v1::GetAttentionPatternsResponse done = Done<v1::GetAttentionPatternsResponse>(req);
  EXPECT_EQ(done.run_id(), "r1");
  EXPECT_EQ(done.step(), 200u);
  EXPECT_EQ(done.patterns(0).name(), "L1H1");
  EXPECT_EQ(analyzer_.LastCheckpoint(), "ckpt@200");
  const auto seen = analyzer_.Last<v1::GetAttentionPatternsRequest>();
  EXPECT_EQ(seen.sequences(), 4u);
  EXPECT_EQ(seen.seed(), 7u);
  EXPECT_EQ(std::vector<uint32_t>(seen.layers().begin(), seen.layers().end()), (std::vector<uint32_t>{1, 2}));
  EXPECT_TRUE(core_->Run<v1::GetAttentionPatternsResponse>(req)->from_store());
  req.set_sequences(17);
  EXPECT_EQ(core_->Run<v1::GetAttentionPatternsResponse>(req).status().message(),
            "sequences must be in [1, 16] (0 = 4), got 17");
  req.set_sequences(0);
  req.add_heads(65);
  EXPECT_EQ(core_->Run<v1::GetAttentionPatternsResponse>(req).status().message(),
            "heads[0] must be in [1, 64] (layers and heads count from 1), got 65");
  req.set_heads(0, 0);
  EXPECT_EQ(core_->Run<v1::GetAttentionPatternsResponse>(req).status().message(),
            "heads[0] must be in [1, 64] (layers and heads count from 1), got 0");
  req.clear_heads();
  req.set_step(150);
  EXPECT_EQ(core_->Run<v1::GetAttentionPatternsResponse>(req).status().code(), absl::StatusCode::kNotFound);
}

// Every AnalysisService method that runs model code has an entry, with the
// RPC's own response type (the RPC layer also checks this at start-up).
TEST(AnalysisTableTest, EveryJobAnalysisHasItsEntry) {
  const auto* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName("circuitlab.v1.AnalysisService");
  ASSERT_NE(service, nullptr);
  int entries = 0;
  for (int i = 0; i < service->method_count(); ++i) {
    const google::protobuf::MethodDescriptor* m = service->method(i);
    const AnalysisEntry* e = FindJobAnalysis(m->input_type());
    if (m->name() == "GetTrajectory" || m->name() == "CancelAnalysis" || m->name() == "ListAnalysisJobs") {
      EXPECT_EQ(e, nullptr) << m->name();
      continue;
    }
    ASSERT_NE(e, nullptr) << m->name() << " has no analysis table entry";
    EXPECT_EQ(e->response->GetDescriptor(), m->output_type()) << m->name();
    ++entries;
  }
  EXPECT_EQ(entries, static_cast<int>(JobAnalyses().size()));
  EXPECT_GE(entries, 8);
}

}  // namespace
}  // namespace circuitlab::scheduler
