// Latent-task generators and Bayes predictors (SCIENCE.md A.2), the decoder
// model with hook points (B.2, D.6), its trainer (AdamW, triangle schedule,
// clipping, ensembles, resume) and the task-vector helpers (D.5).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>

#include "server/engine/analysis/decoder_interventions.h"
#include "server/engine/analysis/task_vectors.h"
#include "server/engine/models/decoder_model.h"
#include "server/engine/spec.h"
#include "server/engine/tasks/latent_task.h"
#include "server/engine/train/batch_split.h"
#include "server/engine/train/latent_trainer.h"
#include "tests/test_util/engine_util.h"

namespace circuitlab::engine {
namespace {

using testing::ResolvedSpec;

v1::LatentTask Latent(const std::string& json) { return ResolvedSpec(json).task().latent(); }

TEST(LatentTaskTest, DiceTokensFollowTheirTask) {
  LatentTaskGenerator task(Latent(R"({"task": {"latent": {"seq_len": 200}}})"), 7);
  torch::Generator gen = MakeGenerator(1);
  torch::Tensor ids = torch::zeros({400}, torch::kLong);  // major 0 only
  LatentBatch b = task.SamplePool(LatentPool::kMajor, ids, gen);
  ASSERT_EQ(b.tokens.sizes(), (std::vector<int64_t>{400, 200}));
  torch::Tensor freq = torch::one_hot(b.tokens.flatten(), 6).to(torch::kDouble).mean(0);
  EXPECT_LT((freq - task.pool(LatentPool::kMajor)[0]).abs().max().item<double>(), 0.01);
  // Pools: three majors on the simplex, distinct from each other.
  torch::Tensor majors = task.pool(LatentPool::kMajor);
  EXPECT_NEAR(majors.sum(-1).sub(1).abs().max().item<double>(), 0.0, 1e-12);
  EXPECT_GT((majors[0] - majors[1]).abs().sum().item<double>(), 0.05);
}

// SCIENCE.md G.9 (3): the authors' near-disjoint majors. Six faces, three
// majors: each holds two faces at (1) / (2 + 4 x 0.005) and the others at
// 0.005 / (2 + 4 x 0.005); the runs cover every face once; the pool seed
// decides the shuffle.
TEST(LatentTaskTest, DisjointMajorsSplitTheFaces) {
  const v1::LatentTask spec = Latent(R"({"task": {"latent": {"major_pool": "MAJOR_POOL_DISJOINT"}}})");
  LatentTaskGenerator task(spec, 7);
  torch::Tensor majors = task.pool(LatentPool::kMajor);
  ASSERT_EQ(majors.sizes(), (std::vector<int64_t>{3, 6}));
  const double hi = 1.0 / (2 + 4 * 0.005), lo = 0.005 / (2 + 4 * 0.005);
  torch::Tensor on = majors > 0.1;
  EXPECT_TRUE(torch::equal(on.sum(0), torch::ones({6}, torch::kLong))) << majors;
  EXPECT_TRUE(torch::equal(on.sum(1), torch::full({3}, 2, torch::kLong))) << majors;
  const torch::Tensor want = torch::where(on, torch::tensor(hi, torch::kDouble), torch::tensor(lo, torch::kDouble));
  EXPECT_NEAR((majors - want).abs().max().item<double>(), 0.0, 1e-12);
  LatentTaskGenerator other(spec, 8);
  EXPECT_FALSE(torch::equal(other.pool(LatentPool::kMajor), majors)) << "another pool seed, another split";
  // Seven faces: runs of 3, 2 and 2; OOD tasks stay Dirichlet draws.
  LatentTaskGenerator seven(
      Latent(R"({"task": {"latent": {"num_states": 7, "major_pool": "MAJOR_POOL_DISJOINT"}}})"), 7);
  EXPECT_TRUE(torch::equal((seven.pool(LatentPool::kMajor) > 0.1).sum(1), torch::tensor({3, 2, 2}, torch::kLong)));
  EXPECT_GT((seven.pool(LatentPool::kOod) > 0.1).sum().item<int64_t>(), 0);
}

// D.5.1 / SCIENCE.md G.9 (6): every (token, task) cell of the token-
// conditioned design draws its own sequences; only x_t is set. (The cells
// shared one set of prefixes across token values before.)
TEST(LatentTaskTest, TokenConditionedCellsDrawTheirOwnPrefixes) {
  LatentTaskGenerator task(Latent(R"({"task": {"latent": {"major_pool": "MAJOR_POOL_DISJOINT"}}})"), 7);
  torch::Generator gen = MakeGenerator(3);
  const int64_t t = 12, B = 5, K = task.num_majors(), V = task.vocab_size();
  torch::Tensor cells = ConditionedTokens(task, t, B, gen);
  ASSERT_EQ(cells.sizes(), (std::vector<int64_t>{V, K * B, t + 1}));
  for (int64_t a = 0; a < V; ++a) {
    EXPECT_TRUE(torch::equal(cells[a].select(1, t), torch::full({K * B}, a, torch::kLong))) << "x_t is the cell's token";
  }
  // Each row's prefix comes from its task: a near-disjoint major puts 99% of
  // its mass on two faces, so most of the row's tokens lie there.
  torch::Tensor on = task.pool(LatentPool::kMajor) > 0.1;  // [K, V]
  torch::Tensor prefix = cells.narrow(2, 0, t);            // [V, K*B, t]
  for (int64_t k = 0; k < K; ++k) {
    torch::Tensor rows = prefix.narrow(1, k * B, B);
    const double inside = on[k].index_select(0, rows.flatten()).to(torch::kDouble).mean().item<double>();
    EXPECT_GT(inside, 0.9) << "major " << k;
  }
  // Different token values, different prefixes in the same (task, draw) slot.
  for (int64_t a = 1; a < V; ++a) EXPECT_FALSE(torch::equal(prefix[0], prefix[a])) << "token " << a;
}

TEST(LatentTaskTest, MarkovTransitionsFollowTheirTask) {
  LatentTaskGenerator task(Latent(R"({"task": {"latent": {"kind": "LATENT_KIND_MARKOV", "seq_len": 300}}})"), 3);
  torch::Generator gen = MakeGenerator(2);
  torch::Tensor tokens = task.SamplePool(LatentPool::kMajor, torch::ones({300}, torch::kLong), gen).tokens;
  torch::Tensor pair = tokens.narrow(1, 0, 299) * 7 + tokens.narrow(1, 1, 299);
  torch::Tensor counts = torch::bincount(pair.flatten(), {}, 49).to(torch::kDouble).view({7, 7});
  torch::Tensor empirical = counts / counts.sum(1, true);
  EXPECT_LT((empirical - task.pool(LatentPool::kMajor)[1]).abs().max().item<double>(), 0.03);
}

TEST(LatentTaskTest, DyckPathsArePlantedInOrder) {
  LatentTaskGenerator task(Latent(R"({"task": {"latent": {"kind": "LATENT_KIND_DYCK"}}})"), 5);
  EXPECT_EQ(task.vocab_size(), 8);
  torch::Tensor paths = task.pool(LatentPool::kOod);
  for (int64_t i = 0; i < paths.size(0); ++i) {
    int64_t height = 0;
    for (int64_t s = 0; s < paths.size(1); ++s) {
      height += paths[i][s].item<int64_t>() == 0 ? 1 : -1;
      ASSERT_GE(height, 0) << "path " << i << " goes below zero at step " << s;
    }
    EXPECT_EQ(height, 0) << "path " << i << " does not return to zero";
  }
  torch::Generator gen = MakeGenerator(3);
  torch::Tensor ids = torch::arange(64, torch::kLong).remainder(3);
  LatentBatch b = task.SamplePool(LatentPool::kMajor, ids, gen);
  for (int64_t i = 0; i < 64; ++i) {
    torch::Tensor planted = b.tokens[i].masked_select(b.mask[i]) - 6;
    torch::Tensor path = task.pool(LatentPool::kMajor)[ids[i].item<int64_t>()];
    ASSERT_LE(planted.size(0), path.size(0));
    EXPECT_TRUE(torch::equal(planted, path.narrow(0, 0, planted.size(0)))) << "sequence " << i;
    // Unmasked positions hold background symbols only.
    EXPECT_LT(b.tokens[i].masked_select(~b.mask[i]).max().item<int64_t>(), 6);
  }
}

TEST(LatentTaskTest, BayesPredictorsAgreeWithTheSlowWay) {
  LatentTaskGenerator task(Latent(R"({"task": {"latent": {"seq_len": 12, "diversity": 2}}})"), 11);
  torch::Generator gen = MakeGenerator(4);
  torch::Tensor tokens = task.SampleTrain(8, gen).tokens;
  // Extrapolation: (n_v + alpha) / (t + 1 + S alpha), by counting.
  torch::Tensor ex = task.Extrapolation(tokens);
  for (int64_t t = 0; t < 12; ++t) {
    torch::Tensor n = torch::one_hot(tokens[0].narrow(0, 0, t + 1), 6).sum(0).to(torch::kDouble);
    EXPECT_LT((ex[0][t] - (n + 1.0) / (t + 1.0 + 6.0)).abs().max().item<double>(), 1e-12);
  }
  // Known pool: posterior by Bayes' rule over 3 majors (0.9) and 4 minors (0.1).
  Predictive kp = task.KnownPool(tokens);
  torch::Tensor tasks = torch::cat({task.pool(LatentPool::kMajor), task.pool(LatentPool::kMinor)});
  torch::Tensor prior = torch::cat({torch::full({3}, 0.9 / 3, torch::kDouble), torch::full({4}, 0.1 / 4, torch::kDouble)});
  torch::Tensor like = prior.clone();
  for (int64_t t = 0; t < 12; ++t) {
    like = like * tasks.select(1, tokens[2][t].item<int64_t>());
    torch::Tensor post = like / like.sum();
    EXPECT_LT((kp.posterior[2][t] - post).abs().max().item<double>(), 1e-10);
    EXPECT_LT((kp.probs[2][t] - torch::matmul(post, tasks)).abs().max().item<double>(), 1e-10);
  }
  // The hybrid with p_common = 1 is retrieval over the majors.
  Predictive h = task.Hybrid(tokens, 1.0 - 1e-15);
  Predictive m = task.Retrieval(tokens, task.pool(LatentPool::kMajor), torch::zeros({3}, torch::kDouble));
  EXPECT_LT((h.probs - m.probs).abs().max().item<double>(), 1e-9);
}

TEST(LatentTaskTest, MarkovBayesIsTheSlowWay) {
  LatentTaskGenerator task(Latent(R"({"task": {"latent": {"kind": "LATENT_KIND_MARKOV", "seq_len": 10}}})"), 2);
  torch::Generator gen = MakeGenerator(5);
  torch::Tensor tokens = task.SampleTrain(4, gen).tokens;
  torch::Tensor majors = task.pool(LatentPool::kMajor);
  Predictive r = task.KnownPool(tokens);
  torch::Tensor like = torch::full({3}, 1.0 / 3, torch::kDouble);
  for (int64_t t = 0; t < 10; ++t) {
    const int64_t x = tokens[1][t].item<int64_t>();
    if (t > 0) like = like * majors.select(1, tokens[1][t - 1].item<int64_t>()).select(1, x);
    torch::Tensor post = like / like.sum();
    torch::Tensor law = torch::matmul(post, majors.select(1, x));
    EXPECT_LT((r.probs[1][t] - law).abs().max().item<double>(), 1e-10) << "t " << t;
  }
  // Extrapolation: counts of transitions out of the current state.
  torch::Tensor ex = task.Extrapolation(tokens);
  const int64_t t = 9, x = tokens[0][t].item<int64_t>();
  torch::Tensor n = torch::zeros({7}, torch::kDouble);
  for (int64_t s = 1; s <= t; ++s) {
    if (tokens[0][s - 1].item<int64_t>() == x) n[tokens[0][s].item<int64_t>()] += 1;
  }
  EXPECT_LT((ex[0][t] - (n + 1) / (n.sum() + 7)).abs().max().item<double>(), 1e-12);
}

v1::ExperimentSpec TinyDecoderSpec(int steps = 30) {
  return ResolvedSpec(R"({"seed": 9, "task": {"latent": {"seq_len": 16, "diversity": 1}},
    "model": {"decoder": {"num_layers": 2, "d_model": 16, "num_heads": 2, "mlp_width": 32}},
    "training": {"steps": )" + std::to_string(steps) + R"(, "learning_rate": 0.01, "grad_clip": 1.0},
    "recording": {"eval_size": 32}})");
}

TEST(EvalMetricNamesTest, CoverWhatTheLatentTrainerRecords) {
  const v1::ExperimentSpec spec = TinyDecoderSpec(2);
  LatentTrainer trainer(spec, {9}, torch::kCPU);
  testing::ExpectEvalMetricsListed(spec, trainer.Evaluate()[0]);
}

TEST(DecoderModelTest, IsCausalAndHooksReplace) {
  const v1::ExperimentSpec spec = TinyDecoderSpec();
  auto model = MakeDecoder(spec, 1, torch::kCPU);
  InitializeDecoder({1}, *model);
  torch::NoGradGuard no_grad;
  torch::Tensor tokens = torch::randint(6, {1, 4, 16}, MakeGenerator(1), torch::kLong);
  torch::Tensor a = model->Forward(tokens);
  ASSERT_EQ(a.sizes(), (std::vector<int64_t>{1, 4, 16, 6}));
  torch::Tensor changed = tokens.clone();
  changed.select(2, 10).fill_(5 - changed[0][0][10].item<int64_t>());
  torch::Tensor b = model->Forward(changed);
  EXPECT_TRUE(torch::allclose(a.narrow(2, 0, 10), b.narrow(2, 0, 10), 1e-6, 1e-6));
  EXPECT_FALSE(torch::allclose(a.narrow(2, 10, 6), b.narrow(2, 10, 6)));
  // Zeroing the last block's output stream leaves only the readout bias.
  std::vector<std::string> seen;
  HookFn zero = [&](const std::string& point, const torch::Tensor& v) -> torch::Tensor {
    seen.push_back(point);
    return point == "L2.post_mlp" ? torch::zeros_like(v) : torch::Tensor();
  };
  torch::Tensor z = model->Forward(tokens, &zero);
  EXPECT_LT(z.abs().max().item<double>(), 1e-6);  // biases start at zero
  const std::vector<std::string> expect = {"embed", "L1.resid_pre", "L1.attn.pattern", "L1.attn.head",
                                           "L1.post_attn", "L1.post_mlp", "L2.resid_pre", "L2.attn.pattern",
                                           "L2.attn.head", "L2.post_attn", "L2.post_mlp", "logits"};
  EXPECT_EQ(seen, expect);
  for (const std::string& p : expect) EXPECT_TRUE(ParseHookPoint(p, 2).ok()) << p;
  EXPECT_EQ(ParseHookPoint("L3.post_mlp", 2).status().code(), absl::StatusCode::kInvalidArgument);
  // Layers count from 1 on every surface: L0 is refused, saying so.
  const absl::Status zero_based = ParseHookPoint("L0.post_mlp", 2).status();
  EXPECT_EQ(zero_based.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(zero_based.message().find("layers count from 1"), std::string::npos) << zero_based;
  EXPECT_EQ(ParseHookPoint("L0.mlp", 2).status().code(), absl::StatusCode::kInvalidArgument);
}

// SCIENCE.md G.9 (1): PyTorch's module defaults (the authors' models) next
// to N(0, 0.02^2). The embedding is N(0, 1); a linear map's weight and bias
// are uniform within 1/sqrt(fan_in) and fill it; LayerNorm starts at 1, 0.
TEST(DecoderModelTest, TorchDefaultInitIsWhatPyTorchsModulesStartAt) {
  v1::ExperimentSpec spec = TinyDecoderSpec();
  spec.mutable_model()->mutable_decoder()->set_init(v1::DECODER_INIT_TORCH_DEFAULT);
  spec.mutable_model()->mutable_decoder()->set_attention_bias(true);
  auto model = MakeDecoder(spec, 1, torch::kCPU);
  InitializeDecoder({1}, *model);
  const int64_t D = spec.model().decoder().d_model(), F = spec.model().decoder().mlp_width();
  std::map<std::string, torch::Tensor> p;
  for (size_t i = 0; i < model->parameters().size(); ++i) p[model->parameter_names()[i]] = model->parameters()[i][0];
  EXPECT_NEAR(p["embed"].std().item<double>(), 1.0, 0.15);
  auto uniform_within = [](const torch::Tensor& t, int64_t fan_in, const std::string& name) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    EXPECT_LE(t.abs().max().item<double>(), bound) << name;
    // A map fills its range (0.8^256 is the chance it would not); a bias is not zero.
    EXPECT_GT(t.abs().max().item<double>(), t.numel() >= 256 ? 0.8 * bound : 0.0) << name;
  };
  uniform_within(p["L0.attn.q"], D, "attn.q");
  uniform_within(p["L0.attn.q.bias"], D, "attn.q.bias");
  uniform_within(p["L0.mlp.fc1.weight"], D, "fc1");
  uniform_within(p["L0.mlp.fc2.weight"], F, "fc2");
  uniform_within(p["L0.mlp.fc2.bias"], F, "fc2.bias");
  uniform_within(p["head.weight"], D, "head");
  uniform_within(p["head.bias"], D, "head.bias");
  EXPECT_TRUE(torch::equal(p["L0.ln1.weight"], torch::ones({D})));
  EXPECT_TRUE(torch::equal(p["L0.ln1.bias"], torch::zeros({D})));
  // The same seed, the same weights; NORMAL keeps its N(0, 0.02^2) and zero biases.
  auto again = MakeDecoder(spec, 1, torch::kCPU);
  InitializeDecoder({1}, *again);
  EXPECT_TRUE(torch::equal(again->parameters()[0], model->parameters()[0]));
  spec.mutable_model()->mutable_decoder()->set_init(v1::DECODER_INIT_NORMAL);
  auto normal = MakeDecoder(spec, 1, torch::kCPU);
  InitializeDecoder({1}, *normal);
  EXPECT_NEAR(normal->parameters()[0].std().item<double>(), 0.02, 0.004);
  for (size_t i = 0; i < normal->parameters().size(); ++i) {
    if (normal->parameter_names()[i] == "head.bias") {
      EXPECT_EQ(normal->parameters()[i].abs().max().item<double>(), 0);
    }
  }
}

TEST(LatentTrainerTest, TriangleSchedule) {
  v1::TrainingSpec t;
  t.set_learning_rate(1e-3);
  t.set_min_learning_rate(1e-5);
  t.set_steps(100);
  t.set_warmup_fraction(0.1);
  t.set_schedule(v1::LR_SCHEDULE_TRIANGLE);
  EXPECT_NEAR(ScheduledLearningRate(t, 10), 1e-3, 1e-15);
  EXPECT_NEAR(ScheduledLearningRate(t, 5), 1e-5 + 0.5 * (1e-3 - 1e-5), 1e-15);
  EXPECT_NEAR(ScheduledLearningRate(t, 100), 1e-5, 1e-15);
  EXPECT_NEAR(ScheduledLearningRate(t, 55), 1e-3 - 0.5 * (1e-3 - 1e-5), 1e-15);
  t.set_schedule(v1::LR_SCHEDULE_CONSTANT);
  EXPECT_EQ(ScheduledLearningRate(t, 5), 1e-3);
}

TEST(LatentTrainerTest, LearnsAndResumesBitForBit) {
  const v1::ExperimentSpec spec = TinyDecoderSpec(40);
  LatentTrainer a(spec, {9}, torch::kCPU);
  const double before = testing::MetricValue(a.Evaluate()[0], "eval/id/loss");
  std::string mid;
  for (int s = 1; s <= 40; ++s) {
    a.Step(false);
    if (s == 20) mid = a.SaveCheckpoint();
  }
  const std::vector<Metric> after = a.Evaluate()[0];
  EXPECT_LT(testing::MetricValue(after, "eval/id/loss"), before - 0.05);
  // The exact Bayes predictor is a floor the model cannot beat by much.
  EXPECT_GT(testing::MetricValue(after, "eval/id/loss"), testing::MetricValue(after, "eval/id/bayes_loss") - 0.05);
  LatentTrainer b(spec, {9}, torch::kCPU);
  ASSERT_TRUE(b.LoadCheckpoint(mid).ok());
  EXPECT_EQ(b.step(), 20);
  while (b.step() < 40) b.Step(false);
  const auto pa = a.model().parameters(), pb = b.model().parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i])) << a.model().parameter_names()[i];
  // Another seed's checkpoint is refused.
  LatentTrainer c(spec, {10}, torch::kCPU);
  EXPECT_EQ(c.LoadCheckpoint(mid).code(), absl::StatusCode::kInvalidArgument);
}

TEST(LatentTrainerTest, EnsembleMembersTrainAsTheirOwnRuns) {
  const v1::ExperimentSpec spec = TinyDecoderSpec(12);
  LatentTrainer pack(spec, {3, 4}, torch::kCPU);
  LatentTrainer alone(spec, {4}, torch::kCPU);
  for (int s = 0; s < 12; ++s) {
    auto mp = pack.Step(true), ma = alone.Step(true);
    EXPECT_NEAR(testing::MetricValue(mp[1], "train/loss"), testing::MetricValue(ma[0], "train/loss"), 1e-5);
    // Clipping is per member: the norms before clipping match too.
    EXPECT_NEAR(testing::MetricValue(mp[1], "train/grad_norm"), testing::MetricValue(ma[0], "train/grad_norm"), 1e-4);
  }
  // The member's own checkpoint resumes as a one-member run.
  LatentTrainer resumed(spec, {4}, torch::kCPU);
  ASSERT_TRUE(resumed.LoadCheckpoint(pack.SaveMemberCheckpoint(1)).ok());
  const auto pr = resumed.model().parameters(), pa = alone.model().parameters();
  for (size_t i = 0; i < pr.size(); ++i) EXPECT_TRUE(torch::allclose(pr[i], pa[i], 1e-5, 1e-6));
}

// Members with their own kappa and p_minor (a diversity sweep) pack and each
// trains as its own run would; a member without minor tasks does not pack
// with them (its evaluation sets differ).
TEST(LatentTrainerTest, MembersWithTheirOwnDiversityTrainAsTheirOwnRuns) {
  v1::ExperimentSpec low = TinyDecoderSpec(8), high = TinyDecoderSpec(8);
  high.mutable_task()->mutable_latent()->set_diversity(4);
  high.mutable_task()->mutable_latent()->set_p_minor(0.5);
  high.set_seed(low.seed() + 1);
  ASSERT_TRUE(PackableTogether(low, high));
  v1::ExperimentSpec none = TinyDecoderSpec(8);
  none.mutable_task()->mutable_latent()->set_diversity(-1);
  EXPECT_FALSE(PackableTogether(low, none));
  LatentTrainer pack({low, high}, torch::kCPU);
  LatentTrainer low_alone(low, {low.seed()}, torch::kCPU), high_alone(high, {high.seed()}, torch::kCPU);
  for (int s = 0; s < 8; ++s) {
    const auto mp = pack.Step(true), ml = low_alone.Step(true), mh = high_alone.Step(true);
    EXPECT_NEAR(testing::MetricValue(mp[0], "train/loss"), testing::MetricValue(ml[0], "train/loss"), 1e-5) << s;
    EXPECT_NEAR(testing::MetricValue(mp[1], "train/loss"), testing::MetricValue(mh[0], "train/loss"), 1e-5) << s;
  }
  const auto ep = pack.Evaluate(), eh = high_alone.Evaluate();
  EXPECT_NEAR(testing::MetricValue(ep[1], "eval/minor/bayes_loss"),
              testing::MetricValue(eh[0], "eval/minor/bayes_loss"), 1e-9);
  EXPECT_EQ(pack.task(0).num_minors(), 2);  // each member drew its own kappa's minor pool
  EXPECT_EQ(pack.task(1).num_minors(), 16);
  LatentTrainer resumed(high, {high.seed()}, torch::kCPU);
  ASSERT_TRUE(resumed.LoadCheckpoint(pack.SaveMemberCheckpoint(1)).ok());
  LatentTrainer wrong(low, {high.seed()}, torch::kCPU);  // high's seed, low's kappa
  EXPECT_EQ(wrong.LoadCheckpoint(pack.SaveMemberCheckpoint(1)).code(), absl::StatusCode::kInvalidArgument);
}

TEST(BatchSplitTest, SlicesCoverTheRowsInOrder) {
  for (int parts : {1, 2, 3, 7}) {
    int64_t next = 0;
    for (int part = 0; part < parts; ++part) {
      const auto [lo, count] = SliceOf(20, parts, part);
      EXPECT_EQ(lo, next);
      EXPECT_GE(count, 20 / parts);
      EXPECT_LE(count, 20 / parts + 1);
      next = lo + count;
    }
    EXPECT_EQ(next, 20);
  }
}

// The batch split over threads (--threads-per-run on a decoder run) is the
// same gradient and the same metrics as one pass, to float rounding, and is
// bit-for-bit repeatable at a given thread count.
TEST(BatchSplitTest, SplitStepsMatchOnePassAndRepeat) {
  const v1::ExperimentSpec spec = TinyDecoderSpec(6);
  std::vector<std::vector<Metric>> one_m, two_m, three_m, again_m;
  auto train = [&](int threads, std::vector<std::vector<Metric>>* metrics) {
    at::set_num_threads(threads);
    auto t = std::make_unique<LatentTrainer>(spec, std::vector<uint64_t>{9, 10}, torch::kCPU);
    EXPECT_EQ(t->parts(), threads);
    for (int s = 0; s < 6; ++s) *metrics = t->Step(true);
    at::set_num_threads(1);
    return t;
  };
  auto one = train(1, &one_m), two = train(2, &two_m), three = train(3, &three_m), again = train(3, &again_m);
  const auto p1 = one->model().parameters(), p2 = two->model().parameters(), p3 = three->model().parameters(),
             pa = again->model().parameters();
  for (size_t i = 0; i < p1.size(); ++i) {
    const std::string name = one->model().parameter_names()[i];
    EXPECT_TRUE(torch::allclose(p1[i], p2[i], 1e-4, 1e-5)) << name;
    EXPECT_TRUE(torch::allclose(p1[i], p3[i], 1e-4, 1e-5)) << name;
    EXPECT_TRUE(torch::equal(p3[i], pa[i])) << name;
  }
  for (const char* m : {"train/loss", "train/accuracy", "train/grad_norm"}) {
    for (size_t e = 0; e < 2; ++e) {
      EXPECT_NEAR(testing::MetricValue(one_m[e], m), testing::MetricValue(two_m[e], m), 1e-5) << m;
      EXPECT_NEAR(testing::MetricValue(one_m[e], m), testing::MetricValue(three_m[e], m), 1e-5) << m;
      EXPECT_EQ(testing::MetricValue(three_m[e], m), testing::MetricValue(again_m[e], m)) << m;
    }
  }
}

TEST(BatchSplitTest, AnErrorOnAPartsThreadIsRethrown) {
  torch::Tensor w = torch::ones({3}, torch::requires_grad());
  auto fails_on_the_last_part = [&](int64_t lo, int64_t count) {
    if (lo + count == 8) throw std::runtime_error("part failed");
    return PartOutput{(w * static_cast<double>(count)).sum().unsqueeze(0), {}};
  };
  EXPECT_THROW(BackwardInParts(3, 8, {w}, fails_on_the_last_part), std::runtime_error);
  at::set_num_threads(1);
}

TEST(TaskVectorMathTest, SimplexProjectionAndAffineWeights) {
  torch::Tensor v = torch::tensor({{0.2, 0.3, 0.5}, {2.0, 0.0, 0.0}, {0.5, 0.5, -3.0}, {-1.0, -1.0, -1.0}},
                                  torch::kDouble);
  torch::Tensor p = ProjectToSimplex(v);
  EXPECT_LT((p.sum(-1) - 1).abs().max().item<double>(), 1e-12);
  EXPECT_GE(p.min().item<double>(), 0.0);
  EXPECT_LT((p[0] - v[0]).abs().max().item<double>(), 1e-12);  // already on the simplex
  EXPECT_LT((p[1] - torch::tensor({1.0, 0.0, 0.0}, torch::kDouble)).abs().max().item<double>(), 1e-12);
  EXPECT_LT((p[3] - 1.0 / 3).abs().max().item<double>(), 1e-12);
  torch::Tensor theta = torch::randn({3, 8}, MakeGenerator(2), torch::kDouble);
  torch::Tensor w = torch::tensor({{0.2, 0.5, 0.3}, {1.5, -0.25, -0.25}}, torch::kDouble);
  torch::Tensor fit = AffineWeights(torch::matmul(w, theta), theta);
  EXPECT_LT((fit - w).abs().max().item<double>(), 1e-9);
}

TEST(TaskVectorMathTest, AdditiveCellsHaveNoInteraction) {
  // h[a, k, b] = nu_a + tau_k + noise: eta2_int ~ 0; pure noise: ratio ~ 1.
  torch::Generator gen = MakeGenerator(3);
  torch::Tensor nu = torch::randn({6, 1, 1, 10}, gen, torch::kDouble);
  torch::Tensor tau = torch::randn({1, 3, 1, 10}, gen, torch::kDouble);
  torch::Tensor h = nu + tau + 0.01 * torch::randn({6, 3, 64, 10}, gen, torch::kDouble);
  CellStats c = TokenConditionedStats(h);
  EXPECT_LT(c.eta2_int, 1e-3);
  EXPECT_LT(c.resid_ratio, 1e-3);
  EXPECT_NEAR(c.eta2_task + c.eta2_token + c.eta2_int, 1.0, 1e-12);
  CellStats noise = TokenConditionedStats(torch::randn({6, 3, 64, 10}, gen, torch::kDouble));
  EXPECT_GT(noise.resid_ratio, 0.95);
}

}  // namespace
}  // namespace circuitlab::engine

namespace circuitlab::engine {
namespace {

using Op = v1::Intervention;

Op Act(Op::Op kind, const std::string& hook) {
  Op op;
  op.set_op(kind);
  op.set_hook(hook);
  return op;
}

void AddVector(Op& op, const std::vector<double>& values) {
  op.add_vectors()->mutable_values()->Add(values.begin(), values.end());
}

TEST(DecoderInterventionTest, HookOpsDoWhatTheySay) {
  const v1::ExperimentSpec spec = TinyDecoderSpec();
  LatentTrainer trainer(spec, {9}, torch::kCPU);
  for (int i = 0; i < 30; ++i) trainer.Step(false);
  const DecoderModel& model = trainer.model();
  const LatentTaskGenerator& task = trainer.task(0);
  auto run = [&](const Op& op) {
    v1::InterveneRequest r;
    *r.add_interventions() = op;
    r.set_n_eval(64);
    r.set_seed(3);
    return InterveneDecoder(model, task, r);
  };
  // Zeroing the last block's stream leaves the readout bias alone: the same
  // loss as any constant prediction with those logits.
  auto zero = run(Act(Op::OP_ZERO, "L2.post_mlp"));
  ASSERT_TRUE(zero.ok()) << zero.status();
  ASSERT_EQ(zero->effects_size(), 3);  // id, ood, minor
  EXPECT_GT(zero->effects(0).kl_clean(), 0.01);
  // Projecting out a basis of the whole space is zeroing; projecting onto it
  // changes nothing.
  Op out = Act(Op::OP_PROJECT_OUT, "L2.post_mlp"), onto = Act(Op::OP_PROJECT_ONTO, "L2.post_mlp");
  for (int i = 0; i < 16; ++i) {
    std::vector<double> e(16, 0.0);
    e[static_cast<size_t>(i)] = 1.0;
    AddVector(out, e);
    AddVector(onto, e);
  }
  auto projected = run(out);
  ASSERT_TRUE(projected.ok()) << projected.status();
  EXPECT_NEAR(projected->effects(0).loss(), zero->effects(0).loss(), 1e-5);
  auto kept = run(onto);
  ASSERT_TRUE(kept.ok());
  EXPECT_NEAR(kept->effects(0).kl_clean(), 0.0, 1e-9);
  EXPECT_NEAR(kept->effects(0).loss(), kept->effects(0).loss_clean(), 1e-6);
  // kl_ref: against the exact Bayes predictor on id, extrapolation elsewhere;
  // a no-op edit leaves it, zeroing the stream moves the model away from it.
  EXPECT_TRUE(kept->effects(0).has_kl_ref());
  EXPECT_EQ(kept->effects(0).ref_name(), "bayes");
  EXPECT_EQ(kept->effects(1).ref_name(), "extrapolation");
  EXPECT_NEAR(kept->effects(0).kl_ref(), kept->effects(0).kl_ref_clean(), 1e-9);
  EXPECT_GT(kept->effects(0).kl_ref_clean(), 0.0);
  EXPECT_GT(zero->effects(0).kl_ref(), zero->effects(0).kl_ref_clean());
  // Causality: editing the last position (which predicts nothing) changes
  // no scored prediction; editing position 5 changes them.
  Op late = Act(Op::OP_ADD, "L1.post_attn");
  AddVector(late, std::vector<double>(16, 3.0));
  late.add_positions(15);
  auto last = run(late);
  ASSERT_TRUE(last.ok());
  EXPECT_NEAR(last->effects(0).kl_clean(), 0.0, 1e-9);
  late.set_positions(0, 5);
  EXPECT_GT(run(late)->effects(0).kl_clean(), 1e-4);
  // Patching from the set itself at every point of a head, mean and
  // resample on the attention pattern: they run and move the output.
  Op patch = Act(Op::OP_PATCH, "L1.attn.head");
  patch.set_head(2);
  Op mean = Act(Op::OP_MEAN, "L2.attn.pattern"), resample = Act(Op::OP_RESAMPLE, "L1.resid_pre");
  resample.set_reference_set("ood");
  for (const Op& op : {patch, mean, resample}) {
    auto r = run(op);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_GT(r->effects(1).kl_clean(), 0.0) << op.hook();
  }
  // Errors name the op and the field.
  Op wide = Act(Op::OP_ADD, "L1.attn.head");
  AddVector(wide, std::vector<double>(16, 1.0));  // head width is 8
  EXPECT_EQ(run(wide).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(run(wide).status().message()).find("interventions[0].vectors[0] has 16 values"),
            std::string::npos);
  EXPECT_EQ(run(Act(Op::OP_ZERO, "L8.post_mlp")).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(run(Act(Op::OP_ADD, "L1.attn.pattern")).status().code(), absl::StatusCode::kInvalidArgument);
  Op weight;
  weight.set_op(Op::OP_ZERO_COORDINATE);
  EXPECT_EQ(run(weight).status().code(), absl::StatusCode::kFailedPrecondition);
  Op set = Act(Op::OP_MEAN, "L1.post_mlp");
  set.set_reference_set("train");
  EXPECT_EQ(run(set).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace circuitlab::engine

namespace circuitlab::engine {
namespace {

// D.6 patch_effect, per-position series and task masks on a token decoder:
// the series average to the set's numbers, a site that predicts nothing has
// no effect, the all-at-once site is OP_PATCH, effects follow their formula.
TEST(DecoderInterventionTest, PatchSweepPerPositionAndMasks) {
  const v1::ExperimentSpec spec = TinyDecoderSpec();
  LatentTrainer trainer(spec, {9}, torch::kCPU);
  for (int i = 0; i < 30; ++i) trainer.Step(false);
  const DecoderModel& model = trainer.model();
  const LatentTaskGenerator& task = trainer.task(0);
  const int64_t T = 16;
  auto request = [] {
    v1::InterveneRequest r;
    r.set_n_eval(64);
    r.set_seed(3);
    r.add_eval_sets("id");
    r.add_logit_diff_tokens(0);
    r.add_logit_diff_tokens(1);
    return r;
  };
  v1::InterveneRequest sweep = request();
  sweep.set_per_position(true);
  v1::PatchSweep* patch = sweep.mutable_patch();
  patch->add_hooks("L1.post_attn");
  patch->add_hooks("L2.attn.head");
  patch->add_positions(3);
  patch->add_positions(15);
  patch->set_reference_set("ood");
  absl::StatusOr<v1::InterveneResponse> r = InterveneDecoder(model, task, sweep);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->effects_size(), 1);
  const v1::InterventionEffect& e = r->effects(0);
  // Per position: every predicting position, averaging to the set's numbers.
  ASSERT_EQ(e.positions_size(), T - 1);
  double loss = 0, acc = 0, ld = 0, kl_ref = 0;
  for (int t = 0; t < e.positions_size(); ++t) {
    const v1::PositionEffect& p = e.positions(t);
    EXPECT_EQ(p.position(), static_cast<uint32_t>(t));
    loss += p.loss_clean() / (T - 1);
    acc += p.accuracy_clean() / (T - 1);
    ld += p.logit_diff_clean() / (T - 1);
    kl_ref += p.kl_ref_clean() / (T - 1);
    EXPECT_NEAR(p.loss(), p.loss_clean(), 1e-12);  // no intervention: intervened = clean
  }
  EXPECT_NEAR(loss, e.loss_clean(), 1e-6);  // the set's loss is summed in float32
  EXPECT_NEAR(acc, e.accuracy_clean(), 1e-9);
  EXPECT_NEAR(ld, e.logit_diff_clean(), 1e-9);
  EXPECT_NEAR(kl_ref, e.kl_ref_clean(), 1e-9);
  // Sites: per hook, positions 3 and 15, then both at once.
  ASSERT_EQ(e.patch_size(), 6);
  EXPECT_EQ(e.patch(0).hook(), "L1.post_attn");
  EXPECT_EQ(e.patch(0).position(), 3);
  EXPECT_EQ(e.patch(1).position(), 15);
  EXPECT_EQ(e.patch(2).position(), -1);
  EXPECT_EQ(e.patch(3).hook(), "L2.attn.head");
  // The source (ood sequences scored on id's next tokens) is far worse.
  EXPECT_GT(e.patch_source_loss(), e.loss_clean());
  for (const v1::PatchSite& site : e.patch()) {
    EXPECT_NEAR(site.effect_loss(), (site.loss() - e.loss_clean()) / (e.patch_source_loss() - e.loss_clean()), 1e-9);
    EXPECT_NEAR(site.effect_logit_diff(),
                (site.logit_diff() - e.logit_diff_clean()) / (e.patch_source_logit_diff() - e.logit_diff_clean()),
                1e-9);
  }
  // Position 15 predicts nothing: no effect. Position 3 moves the loss.
  EXPECT_NEAR(e.patch(1).loss(), e.loss_clean(), 1e-9);
  EXPECT_NEAR(e.patch(1).effect_loss(), 0.0, 1e-9);
  EXPECT_GT(std::abs(e.patch(0).effect_loss()), 1e-4);
  // The all-at-once site is OP_PATCH of both positions from the same source.
  v1::InterveneRequest op = request();
  Op patched = Act(Op::OP_PATCH, "L1.post_attn");
  patched.add_positions(3);
  patched.add_positions(15);
  patched.set_reference_set("ood");
  *op.add_interventions() = patched;
  absl::StatusOr<v1::InterveneResponse> same = InterveneDecoder(model, task, op);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_NEAR(same->effects(0).loss(), e.patch(2).loss(), 1e-9);
  EXPECT_NEAR(same->effects(0).accuracy(), e.patch(2).accuracy(), 1e-12);

  // attention_mass with the task's answer mask: every predicting position,
  // the same as listing queries 0..T-2; not with queries too.
  auto mass = [&](const std::function<void(v1::AttentionMass&)>& fill) {
    v1::InterveneRequest m = request();
    m.mutable_patch()->add_hooks("embed");
    m.mutable_patch()->add_positions(0);
    v1::AttentionMass* a = m.add_attention_mass();
    a->set_pattern("L2.attn.pattern");
    a->add_keys(-1);
    fill(*a);
    return InterveneDecoder(model, task, m);
  };
  auto answer = mass([](v1::AttentionMass& a) { a.set_query_mask(v1::POSITION_MASK_ANSWER); });
  auto listed = mass([&](v1::AttentionMass& a) {
    for (int q = 0; q < T - 1; ++q) a.add_queries(q);
  });
  auto all = mass([](v1::AttentionMass& a) { a.set_query_mask(v1::POSITION_MASK_ALL); });
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_TRUE(listed.ok() && all.ok());
  EXPECT_EQ(answer->effects(0).attention_mass(0).clean(0), listed->effects(0).attention_mass(0).clean(0));
  EXPECT_NE(answer->effects(0).attention_mass(0).clean(0), all->effects(0).attention_mass(0).clean(0));
  // Per query (per_position): the counted queries' series averages to the per-head mass.
  v1::InterveneRequest series = request();
  series.set_per_position(true);
  series.mutable_patch()->add_hooks("embed");
  series.mutable_patch()->add_positions(0);
  v1::AttentionMass* per = series.add_attention_mass();
  per->set_pattern("L2.attn.pattern");
  per->add_keys(-1);
  per->set_query_mask(v1::POSITION_MASK_ANSWER);
  absl::StatusOr<v1::InterveneResponse> by_query = InterveneDecoder(model, task, series);
  ASSERT_TRUE(by_query.ok()) << by_query.status();
  const v1::AttentionMassEffect& m = by_query->effects(0).attention_mass(0);
  ASSERT_EQ(m.queries_size(), T - 2);  // queries 1..T-2 see a previous position; query 0 has none
  EXPECT_EQ(m.queries(0), 1u);
  ASSERT_EQ(m.clean_by_query_size(), 2 * (T - 2));  // two heads
  for (int h = 0; h < 2; ++h) {
    double mean = 0;
    for (int i = 0; i < m.queries_size(); ++i) mean += m.clean_by_query(i * 2 + h) / m.queries_size();
    EXPECT_NEAR(mean, m.clean(h), 1e-12);
  }
  auto both = mass([](v1::AttentionMass& a) {
    a.add_queries(2);
    a.set_query_mask(v1::POSITION_MASK_ANSWER);
  });
  EXPECT_EQ(both.status().code(), absl::StatusCode::kInvalidArgument);

  // Refusals name the field.
  auto refused = [&](const std::function<void(v1::PatchSweep&)>& edit, const std::string& text) {
    v1::InterveneRequest bad = sweep;
    edit(*bad.mutable_patch());
    absl::StatusOr<v1::InterveneResponse> out = InterveneDecoder(model, task, bad);
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(std::string(out.status().message()).find(text), std::string::npos) << out.status();
  };
  refused([](v1::PatchSweep& p) { p.clear_hooks(); }, "patch.hooks must have 1 to 16");
  refused([](v1::PatchSweep& p) { p.set_positions(0, 16); }, "patch.positions[0] must be in [0, 15], got 16");
  refused([](v1::PatchSweep& p) { p.set_mask(v1::POSITION_MASK_ALL); }, "positions or mask, not both");
  refused([](v1::PatchSweep& p) { p.set_hooks(0, "logits"); }, "patch.hooks[0]");
  refused([](v1::PatchSweep& p) { p.set_hooks(1, "L10.post_attn"); }, "patch.hooks[1]");
  refused([](v1::PatchSweep& p) { p.set_reference_set("train"); }, "patch.reference_set");
  refused([](v1::PatchSweep& p) { p.set_head(1); }, "patch.head applies to points with a head axis only");
  refused(
      [](v1::PatchSweep& p) {
        p.set_hooks(0, "L2.attn.head");
        p.set_head(3);
      },
      "patch.head must be in [0, 2]");
}

}  // namespace
}  // namespace circuitlab::engine
