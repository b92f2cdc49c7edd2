// Integration tests: the real gRPC server (real engine unless stated) on an
// ephemeral loopback port, driven through the client library.
// Latent-task runs on the decoder: task-vector analyses (a run, its training, a
// sweep) and an E2 regression run end to end.
#include <gtest/gtest.h>

#include "tests/integration/integration_util.h"

namespace circuitlab::testing {
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

// Every pattern is causal and row-stochastic, one per (layer, head,
// sequence) asked, T x T over the sequence's T tokens.
void ExpectPatterns(const v1::GetAttentionPatternsResponse& r, int layers, int heads, int sequences) {
  ASSERT_EQ(r.state(), v1::ANALYSIS_STATE_DONE) << r.error();
  ASSERT_EQ(r.sequences_size(), sequences);
  ASSERT_EQ(r.patterns_size(), layers * heads * sequences);
  for (const v1::AttentionPattern& p : r.patterns()) {
    const uint32_t T = p.size();
    ASSERT_EQ(r.sequences(static_cast<int>(p.sequence())).tokens_size(), static_cast<int>(T));
    ASSERT_EQ(p.weights_size(), static_cast<int>(T * T)) << p.name();
    for (uint32_t q = 0; q < T; ++q) {
      double row = 0;
      for (uint32_t k = 0; k < T; ++k) {
        const float w = p.weights(static_cast<int>(q * T + k));
        if (k > q) {
          EXPECT_EQ(w, 0.0f) << p.name() << " q " << q << " k " << k;
        }
        row += w;
      }
      EXPECT_NEAR(row, 1.0, 1e-4) << p.name() << " q " << q;
    }
  }
}

v1::AnalyzeTaskVectorsResponse WaitTaskVectors(client::Client& c, v1::AnalyzeTaskVectorsRequest req) {
  absl::StatusOr<v1::AnalyzeTaskVectorsResponse> r;
  EXPECT_TRUE(WaitFor(
      [&] {
        r = c.RunAnalysis<v1::AnalyzeTaskVectorsResponse>(req);
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
  auto first = c.RunAnalysis<v1::AnalyzeTaskVectorsResponse>(req);
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
  auto again = c.RunAnalysis<v1::AnalyzeTaskVectorsResponse>(req);
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
  EXPECT_EQ(c.RunAnalysis<v1::AnalyzeTaskVectorsResponse>(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = req;
  bad.set_samples_per_cell(100000);
  auto too_many = c.RunAnalysis<v1::AnalyzeTaskVectorsResponse>(bad);
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.status().message().find("samples_per_cell must be in [8, 4096]"), std::string::npos);
  bad = req;
  bad.add_analyses("dyck_p0");  // a DICE run
  EXPECT_EQ(c.RunAnalysis<v1::AnalyzeTaskVectorsResponse>(bad).status().code(), absl::StatusCode::kFailedPrecondition);
  bad = req;
  bad.set_opt_target("majors");
  EXPECT_EQ(c.RunAnalysis<v1::AnalyzeTaskVectorsResponse>(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = req;
  bad.set_sweep_id("s1");
  EXPECT_EQ(c.RunAnalysis<v1::AnalyzeTaskVectorsResponse>(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = req;
  bad.set_step(7);
  EXPECT_EQ(c.RunAnalysis<v1::AnalyzeTaskVectorsResponse>(bad).status().code(), absl::StatusCode::kNotFound);
  // Hook-point interventions (D.6) on the decoder run, answered at once.
  v1::InterveneRequest patch;
  patch.set_run_id(run->run_id());
  patch.set_n_eval(64);
  patch.add_eval_sets("id");
  v1::Intervention* op = patch.add_interventions();
  op->set_op(v1::Intervention::OP_PATCH);
  op->set_hook("L2.post_attn");
  op->set_reference_set("ood");
  auto patched = Analysis<v1::InterveneResponse>(c, patch);
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
  massed.mutable_interventions(0)->set_hook("L2.attn.pattern");
  massed.mutable_interventions(0)->clear_reference_set();
  v1::AttentionMass* previous = massed.add_attention_mass();
  previous->set_pattern("L2.attn.pattern");
  previous->add_keys(-1);
  auto mass = Analysis<v1::InterveneResponse>(c, massed);
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
  auto zero_one = Analysis<v1::InterveneResponse>(c, massed);
  massed.set_logit_diff_tokens(0, 1);
  massed.set_logit_diff_tokens(1, 0);
  auto one_zero = Analysis<v1::InterveneResponse>(c, massed);
  ASSERT_TRUE(zero_one.ok() && one_zero.ok()) << zero_one.status() << one_zero.status();
  EXPECT_TRUE(zero_one->effects(0).has_logit_diff());
  EXPECT_EQ(zero_one->effects(0).alt_name(), "tokens 0-1");
  EXPECT_NEAR(zero_one->effects(0).logit_diff(), -one_zero->effects(0).logit_diff(), 1e-9);
  EXPECT_NE(zero_one->effects(0).logit_diff(), zero_one->effects(0).logit_diff_clean());
  massed.clear_logit_diff_tokens();
  previous->add_queries(0);  // position 0 has no previous position
  previous->set_keys(0, -1);
  mass = Analysis<v1::InterveneResponse>(c, massed);
  EXPECT_EQ(mass.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mass.status().message().find("no query sees any of the keys"), std::string::npos) << mass.status();
  // Steering as an op (D.6 replace_convex): kl_ref against the mixture law.
  v1::InterveneRequest steer = patch;
  steer.clear_interventions();
  v1::Intervention* convex = steer.add_interventions();
  convex->set_op(v1::Intervention::OP_REPLACE_CONVEX);
  convex->set_hook("L2.post_attn");
  for (uint32_t p : {6u, 7u, 8u}) convex->add_positions(p);
  for (double w : {0.2, 0.3, 0.5}) convex->add_weights(w);
  auto steered = Analysis<v1::InterveneResponse>(c, steer);
  ASSERT_TRUE(steered.ok()) << steered.status();
  EXPECT_EQ(steered->effects(0).ref_name(), "mixture");
  EXPECT_GT(steered->effects(0).kl_clean(), 0.0);
  convex->add_weights(0.1);  // four weights for three majors
  auto four = Analysis<v1::InterveneResponse>(c, steer);
  EXPECT_EQ(four.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(four.status().message().find("one entry per major task (3)"), std::string::npos) << four.status();
  convex->clear_weights();
  steer.clear_eval_sets();
  steer.add_eval_sets("ood");  // true_task needs the majors
  EXPECT_EQ(Analysis<v1::InterveneResponse>(c, steer).status().code(), absl::StatusCode::kInvalidArgument);
  convex->set_subtract("projection");
  auto projected = Analysis<v1::InterveneResponse>(c, steer);
  ASSERT_TRUE(projected.ok()) << projected.status();
  EXPECT_EQ(projected->effects(0).eval_set(), "ood");
  op->set_hook("L10.post_attn");
  EXPECT_EQ(Analysis<v1::InterveneResponse>(c, patch).status().code(), absl::StatusCode::kInvalidArgument);
  op->set_hook("L2.post_attn");
  op->set_op(v1::Intervention::OP_ZERO_COORDINATE);
  EXPECT_EQ(Analysis<v1::InterveneResponse>(c, patch).status().code(), absl::StatusCode::kFailedPrecondition);
  // IMIR analyses refuse a decoder run, and task vectors an IMIR run.
  v1::DetectCircuitRequest detect;
  detect.set_run_id(run->run_id());
  EXPECT_EQ(c.RunAnalysis<v1::DetectCircuitResponse>(detect).status().code(), absl::StatusCode::kFailedPrecondition);
  auto imir = c.SubmitRun(TinySpec(20));
  ASSERT_TRUE(imir.ok());
  ASSERT_EQ(WaitForEnd(c, imir->run_id()), v1::RUN_STATE_SUCCEEDED);
  v1::AnalyzeTaskVectorsRequest wrong;
  wrong.set_run_id(imir->run_id());
  EXPECT_EQ(c.RunAnalysis<v1::AnalyzeTaskVectorsResponse>(wrong).status().code(), absl::StatusCode::kFailedPrecondition);

  // Attention patterns of both families; heads are named as each model does.
  v1::GetAttentionPatternsRequest att;
  att.set_run_id(imir->run_id());
  att.set_sequences(2);
  auto imir_att = Analysis<v1::GetAttentionPatternsResponse>(c, att);
  ASSERT_TRUE(imir_att.ok()) << imir_att.status();
  const auto& im = imir->spec().model().imir();
  ExpectPatterns(*imir_att, static_cast<int>(im.num_layers()), static_cast<int>(im.num_heads()), 2);
  EXPECT_EQ(imir_att->patterns(0).name(), "L1H1");
  EXPECT_EQ(imir_att->eval_set(), "icl_rare");
  att.set_run_id(run->run_id());
  att.add_layers(2);  // layers and heads count from 1: the second block
  auto dec_att = Analysis<v1::GetAttentionPatternsResponse>(c, att);
  ASSERT_TRUE(dec_att.ok()) << dec_att.status();
  ExpectPatterns(*dec_att, 1, 2, 2);
  EXPECT_EQ(dec_att->patterns(0).name(), "L2H1");
  EXPECT_EQ(dec_att->patterns(0).layer(), 2u);
  EXPECT_EQ(dec_att->patterns(0).head(), 1u);
  EXPECT_EQ(dec_att->patterns(0).size(), 16u);
  att.add_layers(3);  // the model has layers 1 and 2
  auto far = Analysis<v1::GetAttentionPatternsResponse>(c, att);
  EXPECT_EQ(far.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(far.status().message().find("layers must be in [1, 2]"), std::string::npos) << far.status();

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
  auto far = c.RunAnalysis<v1::AnalyzeTaskVectorsResponse>(bad);
  EXPECT_EQ(far.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(far.status().message().find("points 0 to 7"), std::string::npos) << far.status();
  bad = req;
  bad.add_analyses("p1");
  EXPECT_EQ(c.RunAnalysis<v1::AnalyzeTaskVectorsResponse>(bad).status().code(), absl::StatusCode::kFailedPrecondition);
  // An analysis the family lacks names the ones it has (the engine's table).
  v1::GetAttentionPatternsRequest att;
  att.set_run_id(run->run_id());
  auto lacks = Analysis<v1::GetAttentionPatternsResponse>(c, att);
  EXPECT_EQ(lacks.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(lacks.status().message().find("regression model family; it has AnalyzeTaskVectors, ExportWeights and Intervene"),
            std::string::npos)
      << lacks.status();
  // Hook ops on the B.3 model: squared-error effects against the set's
  // Bayes predictor; steering as an op is for token tasks.
  v1::InterveneRequest iv;
  iv.set_run_id(run->run_id());
  iv.set_n_eval(64);
  iv.add_eval_sets("id");
  iv.add_eval_sets("ood");
  v1::Intervention* op = iv.add_interventions();
  op->set_op(v1::Intervention::OP_ZERO);
  op->set_hook("L2.post_attn");
  auto zeroed = Analysis<v1::InterveneResponse>(c, iv);
  ASSERT_TRUE(zeroed.ok()) << zeroed.status();
  ASSERT_EQ(zeroed->effects_size(), 2);
  EXPECT_EQ(zeroed->effects(0).ref_name(), "bayes");
  EXPECT_EQ(zeroed->effects(1).ref_name(), "ridge");
  EXPECT_GT(zeroed->effects(0).kl_clean(), 0.0);  // the prediction moved
  EXPECT_NE(zeroed->effects(0).loss(), zeroed->effects(0).loss_clean());
  op->set_op(v1::Intervention::OP_REPLACE_CONVEX);
  EXPECT_EQ(Analysis<v1::InterveneResponse>(c, iv).status().code(), absl::StatusCode::kFailedPrecondition);
  // Attention mass on a decoder: every query's mass on position 0, per
  // head, and position 0 on itself (exactly 1).
  op->set_op(v1::Intervention::OP_ZERO);
  v1::AttentionMass* first = iv.add_attention_mass();
  first->set_pattern("L1.attn.pattern");
  first->add_keys(0);
  v1::AttentionMass* self = iv.add_attention_mass();
  self->set_pattern("L2.attn.pattern");
  self->add_keys(0);
  self->add_queries(0);
  auto massed = Analysis<v1::InterveneResponse>(c, iv);
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
  EXPECT_EQ(Analysis<v1::InterveneResponse>(c, iv).status().code(), absl::StatusCode::kFailedPrecondition);  // no logits
  iv.clear_logit_diff_tokens();
  op->set_op(v1::Intervention::OP_ZERO);
  op->add_positions(24);  // 8 points: positions 0..23
  EXPECT_EQ(Analysis<v1::InterveneResponse>(c, iv).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace circuitlab::testing
