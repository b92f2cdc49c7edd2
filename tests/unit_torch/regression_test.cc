// E2, in-context linear regression (SCIENCE.md A.2): the generator, its
// Bayes predictors against the slow way, the GPT-2-style model of B.3
// (mapsto layout, causality), its trainer and the continuous-token analyses.
#include <gtest/gtest.h>

#include <cmath>

#include "server/engine/analysis/decoder_interventions.h"
#include "server/engine/analysis/regression_vectors.h"
#include "server/engine/models/decoder_model.h"
#include "server/engine/spec.h"
#include "server/engine/tasks/regression_task.h"
#include "server/engine/train/latent_trainer.h"
#include "server/engine/train/regression_trainer.h"
#include "tests/test_util/engine_util.h"

namespace circuitlab::engine {
namespace {

using testing::ResolvedSpec;

const auto kF64 = torch::TensorOptions().dtype(torch::kDouble);

v1::ExperimentSpec RegressionSpec(int steps = 30, int points = 8) {
  return ResolvedSpec(R"({"seed": 5, "task": {"latent": {"kind": "LATENT_KIND_REGRESSION", "dim": 3,
      "num_points": )" + std::to_string(points) + R"(, "diversity": 2}},
    "model": {"decoder": {"num_layers": 2, "d_model": 16, "num_heads": 2, "mlp_width": 32}},
    "training": {"steps": )" + std::to_string(steps) + R"(, "learning_rate": 0.01},
    "recording": {"eval_size": 32}})");
}

TEST(EvalMetricNamesTest, CoverWhatTheRegressionTrainerRecords) {
  const v1::ExperimentSpec spec = RegressionSpec(2);
  RegressionTrainer trainer(spec, {5}, torch::kCPU);
  testing::ExpectEvalMetricsListed(spec, trainer.Evaluate()[0]);
}

TEST(RegressionTaskTest, PointsFollowTheirWeights) {
  const v1::ExperimentSpec spec = RegressionSpec(30, 128);
  RegressionTaskGenerator task(spec.task().latent(), 3);
  EXPECT_EQ(task.pool(LatentPool::kMajor).sizes(), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(task.pool(LatentPool::kMinor).size(0), 4);
  torch::Generator gen = MakeGenerator(1);
  RegressionBatch b = task.SamplePool(LatentPool::kMajor, torch::tensor({1}, torch::kLong), gen);
  // OLS over 128 points recovers w within a few noise standard errors.
  torch::Tensor X = b.x[0], w = task.pool(LatentPool::kMajor)[1];
  torch::Tensor fit = torch::matmul(torch::linalg_pinv(X), b.y[0]);
  EXPECT_LT((fit - w).abs().max().item<double>(), 0.2);
  torch::Tensor resid = b.y[0] - torch::matmul(X, w);
  EXPECT_NEAR(resid.std().item<double>(), 0.5, 0.08);
  // The pools are a function of the pool seed alone.
  RegressionTaskGenerator again(spec.task().latent(), 3), other(spec.task().latent(), 4);
  EXPECT_TRUE(torch::equal(again.pool(LatentPool::kOod), task.pool(LatentPool::kOod)));
  EXPECT_FALSE(torch::equal(other.pool(LatentPool::kMajor), task.pool(LatentPool::kMajor)));
}

TEST(RegressionTaskTest, BayesPredictorsAreTheSlowWay) {
  const v1::ExperimentSpec spec = RegressionSpec();
  RegressionTaskGenerator task(spec.task().latent(), 7);
  torch::Generator gen = MakeGenerator(2);
  RegressionBatch b = task.SampleTrain(6, gen);
  const double s2 = 0.25;
  torch::Tensor var;
  torch::Tensor ridge = task.Ridge(b.x, b.y, &var);
  RegressionPrediction kp = task.KnownPool(b.x, b.y);
  torch::Tensor tasks = torch::cat({task.pool(LatentPool::kMajor), task.pool(LatentPool::kMinor)});
  torch::Tensor prior = torch::cat({torch::full({3}, 0.9 / 3, kF64), torch::full({4}, 0.1 / 4, kF64)});
  for (int64_t s = 0; s < 6; ++s) {
    for (int64_t i = 0; i < 8; ++i) {
      // Ridge: (X^T X + sigma^2 I)^-1 X^T y over the points before i.
      torch::Tensor X = b.x[s].narrow(0, 0, i), y = b.y[s].narrow(0, 0, i), xi = b.x[s][i];
      torch::Tensor A = torch::matmul(X.t(), X) + s2 * torch::eye(3, kF64);
      torch::Tensor w = torch::matmul(torch::inverse(A), torch::matmul(X.t(), y));
      EXPECT_NEAR(ridge[s][i].item<double>(), torch::dot(w, xi).item<double>(), 1e-10);
      EXPECT_NEAR(var[s][i].item<double>(), s2 + s2 * torch::dot(xi, torch::matmul(torch::inverse(A), xi)).item<double>(),
                  1e-10);
      // Known pool: Bayes' rule with the Gaussian likelihood of the points before i.
      torch::Tensor resid = y.unsqueeze(0) - torch::matmul(tasks, X.t());  // [7, i]
      torch::Tensor post = prior * torch::exp(-0.5 * resid.pow(2).sum(1) / s2);
      post = post / post.sum();
      EXPECT_LT((kp.posterior[s][i] - post).abs().max().item<double>(), 1e-10);
      EXPECT_NEAR(kp.mean[s][i].item<double>(), torch::dot(post, torch::matmul(tasks, xi)).item<double>(), 1e-10);
    }
  }
  // Hybrid: p_common -> 1 is retrieval over the majors; the new component's
  // weight follows the multivariate normal marginal y ~ N(0, X X^T + s2 I).
  RegressionPrediction near_one = task.Hybrid(b.x, b.y, 1.0 - 1e-15);
  RegressionPrediction majors = task.Retrieval(b.x, b.y, task.pool(LatentPool::kMajor), torch::zeros({3}, kF64));
  EXPECT_LT((near_one.mean - majors.mean).abs().max().item<double>(), 1e-8);
  RegressionPrediction h = task.Hybrid(b.x, b.y, 0.5);
  const int64_t i = 6;
  torch::Tensor X = b.x[0].narrow(0, 0, i), y = b.y[0].narrow(0, 0, i);
  torch::Tensor C = torch::matmul(X, X.t()) + s2 * torch::eye(i, kF64);
  const double log_new = -0.5 * (torch::dot(y, torch::matmul(torch::inverse(C), y)).item<double>() +
                                 torch::logdet(C).item<double>() + i * std::log(2 * M_PI));
  torch::Tensor resid = y.unsqueeze(0) - torch::matmul(task.pool(LatentPool::kMajor), X.t());
  torch::Tensor log_major = -0.5 * resid.pow(2).sum(1) / s2 - 0.5 * i * std::log(2 * M_PI * s2) + std::log(0.5 / 3);
  torch::Tensor all = torch::cat({log_major, torch::tensor({log_new + std::log(0.5)}, kF64)});
  EXPECT_LT((h.posterior[0][i] - torch::softmax(all, 0)).abs().max().item<double>(), 1e-9);
}

TEST(RegressionModelTest, MapstoLayoutAndCausality) {
  const v1::ExperimentSpec spec = RegressionSpec();
  EXPECT_EQ(spec.task().latent().seq_len(), 24u);
  EXPECT_EQ(spec.model().decoder().activation(), v1::ACTIVATION_GELU);
  EXPECT_TRUE(spec.model().decoder().attention_bias());
  EXPECT_TRUE(spec.model().decoder().final_layernorm());
  auto model = MakeDecoder(spec, 1, torch::kCPU);
  InitializeDecoder({1}, *model);
  const std::vector<std::string> names = model->parameter_names();
  for (const char* n : {"read_in", "pad", "L0.attn.q.bias", "L1.attn.o.bias", "ln_f.weight", "head.weight"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  }
  EXPECT_EQ(std::find(names.begin(), names.end(), "head.bias"), names.end());
  int64_t count = 0;
  for (const torch::Tensor& p : model->parameters()) count += p.numel();
  EXPECT_EQ(count, ParameterCount(spec));

  torch::NoGradGuard no_grad;
  torch::Generator gen = MakeGenerator(3);
  torch::Tensor x = torch::randn({1, 2, 8, 3}, gen), y = torch::randn({1, 2, 8}, gen);
  torch::Tensor in = model->MapstoInputs(x, y);
  ASSERT_EQ(in.sizes(), (std::vector<int64_t>{1, 2, 24, 4}));
  EXPECT_TRUE(torch::equal(in[0][1][9].narrow(0, 0, 3), x[0][1][3]));  // x_3 at 3*3
  EXPECT_EQ(in[0][1][9][3].item<float>(), 0.0f);
  EXPECT_TRUE(torch::equal(in[0][1][10], model->parameters()[1][0]));  // the pad at 3*3 + 1
  EXPECT_EQ(in[0][1][11][3].item<float>(), y[0][1][3].item<float>());  // y_3 at 3*3 + 2
  std::vector<std::string> seen;
  HookFn watch = [&](const std::string& point, const torch::Tensor&) -> torch::Tensor {
    seen.push_back(point);
    return {};
  };
  torch::Tensor out = model->Forward(in, &watch);
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{1, 2, 24, 1}));
  ASSERT_GE(seen.size(), 2u);  // B.3's final LayerNorm is a hook point before the output
  EXPECT_EQ(seen[seen.size() - 2], "final_ln");
  EXPECT_EQ(seen.back(), "logits");
  EXPECT_TRUE(ParseHookPoint("final_ln", 2, /*final_ln=*/true).ok());
  EXPECT_EQ(ParseHookPoint("final_ln", 2).status().code(), absl::StatusCode::kInvalidArgument);
  torch::Tensor a = DecoderModel::Predictions(out);
  ASSERT_EQ(a.sizes(), (std::vector<int64_t>{1, 2, 8}));
  // y_3 is not seen by its own prediction, only by the later ones.
  torch::Tensor y2 = y.clone();
  y2[0][0][3] += 5.0;
  torch::Tensor b = DecoderModel::Predictions(model->Forward(model->MapstoInputs(x, y2)));
  EXPECT_TRUE(torch::allclose(a.narrow(2, 0, 4), b.narrow(2, 0, 4), 1e-6, 1e-6));
  EXPECT_FALSE(torch::allclose(a.narrow(2, 4, 4), b.narrow(2, 4, 4)));
}

TEST(RegressionTrainerTest, LearnsResumesAndPacks) {
  const v1::ExperimentSpec spec = RegressionSpec(150);
  EXPECT_EQ(spec.training().loss(), v1::LOSS_KIND_MSE);
  RegressionTrainer a(spec, {9}, torch::kCPU);
  const double before = testing::MetricValue(a.Evaluate()[0], "eval/id/loss");
  std::string mid;
  for (int s = 1; s <= 150; ++s) {
    a.Step(false);
    if (s == 75) mid = a.SaveCheckpoint();
  }
  const std::vector<Metric> after = a.Evaluate()[0];
  EXPECT_LT(testing::MetricValue(after, "eval/id/loss"), 0.85 * before);  // measured 0.70
  // The exact Bayes predictor is a floor (up to sampling noise of 32 x 8 points).
  EXPECT_GT(testing::MetricValue(after, "eval/id/loss"), 0.8 * testing::MetricValue(after, "eval/id/bayes_loss"));
  EXPECT_EQ(testing::MetricValue(after, "eval/ood/bayes_loss"), testing::MetricValue(after, "eval/ood/ridge_loss"));
  for (const char* m : {"eval/minor/loss", "eval/id/to_ridge", "eval/ood/to_retrieval"}) {
    EXPECT_GE(testing::MetricValue(after, m), 0.0) << m;
  }
  RegressionTrainer b(spec, {9}, torch::kCPU);
  ASSERT_TRUE(b.LoadCheckpoint(mid).ok());
  while (b.step() < 150) b.Step(false);
  const auto pa = a.model().parameters(), pb = b.model().parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i])) << a.model().parameter_names()[i];
  // A packed member trains as its own run.
  RegressionTrainer pack(spec, {3, 9}, torch::kCPU), alone(spec, {9}, torch::kCPU);
  for (int s = 0; s < 5; ++s) {
    auto mp = pack.Step(true), ma = alone.Step(true);
    EXPECT_NEAR(testing::MetricValue(mp[1], "train/loss"), testing::MetricValue(ma[0], "train/loss"), 1e-5);
    EXPECT_NEAR(testing::MetricValue(mp[1], "train/grad_norm"), testing::MetricValue(ma[0], "train/grad_norm"), 1e-4);
  }
}

TEST(RegressionAnalysesTest, RowsAndRefusals) {
  const v1::ExperimentSpec spec = RegressionSpec(20);
  RegressionTrainer trainer(spec, {5}, torch::kCPU);
  for (int s = 0; s < 20; ++s) trainer.Step(false);
  for (torch::Tensor p : trainer.model().parameters()) p.requires_grad_(false);
  v1::AnalyzeTaskVectorsRequest r = testing::TaskVectorDefaults();
  for (const char* a : {"p0", "p2", "p3", "steering", "ood_r2", "kl"}) r.add_analyses(a);
  r.set_samples_per_cell(32);
  r.set_p3_samples(32);
  r.set_steering_est_samples(32);
  r.set_steering_samples(64);
  r.set_ood_tasks(4);
  r.set_ood_samples(4);
  r.set_kl_samples(32);
  absl::StatusOr<v1::AnalyzeTaskVectorsResponse> rep =
      RunRegressionAnalyses(trainer.model(), trainer.task(0), r, {}, nullptr);
  ASSERT_TRUE(rep.ok()) << rep.status();
  std::map<std::string, double> seen;
  for (const v1::TaskVectorValue& row : rep->values()) seen[row.name()] = row.value();
  for (const char* n : {"p0/resid_ratio", "p0/task_only_ratio", "steering/rmse_base", "steering/rmse_inj",
                        "steering/rmse_mode", "ood_r2/code", "kl/exact", "kl/extrap", "kl/ood_log10_ratio",
                        "p2/r2_additive_mean", "p2/r2_task_mean", "p3/r_mean_min", "p3/r_mean/task2"}) {
    EXPECT_TRUE(seen.count(n)) << n;
  }
  EXPECT_GE(seen["p0/resid_ratio"], 0.0);
  EXPECT_LE(seen["p0/resid_ratio"], seen["p0/task_only_ratio"] + 1e-12);  // the slope only explains more
  r.add_analyses("p1");                                                   // two-way ANOVA needs token cells
  EXPECT_EQ(RunRegressionAnalyses(trainer.model(), trainer.task(0), r, {}, nullptr).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // Intervene: a projection onto the whole space changes nothing; editing
  // the last point's |- moves only its own prediction; kl_ref of the clean
  // model is its squared distance to the set's Bayes predictor.
  auto run = [&](const v1::Intervention& op) {
    v1::InterveneRequest req;
    *req.add_interventions() = op;
    req.set_n_eval(64);
    req.set_seed(1);
    return InterveneRegression(trainer.model(), trainer.task(0), req);
  };
  v1::Intervention onto;
  onto.set_op(v1::Intervention::OP_PROJECT_ONTO);
  onto.set_hook("L1.post_attn");
  for (int i = 0; i < 16; ++i) {
    v1::HookVector* e = onto.add_vectors();
    for (int j = 0; j < 16; ++j) e->add_values(i == j ? 1.0 : 0.0);
  }
  auto kept = run(onto);
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_EQ(kept->effects_size(), 3);  // id, ood, minor
  EXPECT_NEAR(kept->effects(0).kl_clean(), 0.0, 1e-10);
  EXPECT_NEAR(kept->effects(0).loss(), kept->effects(0).loss_clean(), 1e-9);
  EXPECT_GT(kept->effects(1).kl_ref_clean(), 0.0);
  v1::Intervention add;
  add.set_op(v1::Intervention::OP_ADD);
  add.set_hook("L2.post_mlp");
  v1::HookVector* v = add.add_vectors();
  for (int j = 0; j < 16; ++j) v->add_values(2.0);
  add.add_positions(22);  // the |- of the last point
  auto last = run(add);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_GT(last->effects(0).kl_clean(), 0.0);
  add.set_positions(0, 23);  // y of the last point predicts nothing
  EXPECT_NEAR(run(add)->effects(0).kl_clean(), 0.0, 1e-12);

  // Per position: the |- positions 1, 4, ..., 22 (where y_i is predicted),
  // averaging to the set's squared error; the answer mask is those queries;
  // a patch sweep over the answer positions, scored against this set's y.
  v1::InterveneRequest req;
  req.set_n_eval(64);
  req.set_seed(1);
  req.add_eval_sets("id");
  req.set_per_position(true);
  req.mutable_patch()->add_hooks("L1.post_attn");
  req.mutable_patch()->set_mask(v1::POSITION_MASK_ANSWER);
  v1::AttentionMass* mass = req.add_attention_mass();
  mass->set_pattern("L2.attn.pattern");
  mass->add_keys(-1);
  mass->set_query_mask(v1::POSITION_MASK_ANSWER);
  v1::AttentionMass* listed = req.add_attention_mass();
  *listed = *mass;
  listed->clear_query_mask();
  for (int q = 1; q < 24; q += 3) listed->add_queries(q);
  absl::StatusOr<v1::InterveneResponse> series = InterveneRegression(trainer.model(), trainer.task(0), req);
  ASSERT_TRUE(series.ok()) << series.status();
  const v1::InterventionEffect& e = series->effects(0);
  ASSERT_EQ(e.positions_size(), 8);
  double loss = 0;
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(e.positions(i).position(), static_cast<uint32_t>(3 * i + 1));
    loss += e.positions(i).loss_clean() / 8;
  }
  EXPECT_NEAR(loss, e.loss_clean(), 1e-9);
  EXPECT_EQ(e.attention_mass(0).clean(0), e.attention_mass(1).clean(0));
  ASSERT_EQ(e.patch_size(), 9);  // 8 answer positions, then all at once
  EXPECT_EQ(e.patch(8).position(), -1);
  for (const v1::PatchSite& site : e.patch()) {
    EXPECT_NEAR(site.effect_loss(), (site.loss() - e.loss_clean()) / (e.patch_source_loss() - e.loss_clean()), 1e-9);
  }
  // Every site moves the loss (measured effects 0.084-0.156 alone: layer 0's
  // output at one |- reaches later predictions through attention), and
  // patching every |- at once carries nearly the whole gap (0.986).
  for (int i = 0; i < 8; ++i) EXPECT_GT(e.patch(i).effect_loss(), 0.05) << "position " << e.patch(i).position();
  EXPECT_GT(e.patch(8).effect_loss(), 0.9);
}

}  // namespace
}  // namespace circuitlab::engine
