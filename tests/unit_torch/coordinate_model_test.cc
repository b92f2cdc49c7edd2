// The COORDINATES parameterisation (SCIENCE.md B.1, G.5): the block-sparse
// forward computes exactly what the dense model with the materialised weights
// computes; unit-norm coordinate SGD is dense SGD projected onto the span;
// initialisation, named subsets and checkpoints behave as the spec says.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include "client/lib/client.h"
#include "tests/test_util/engine_util.h"
#include "server/engine/manifold/projection.h"
#include "server/engine/spec.h"
#include "server/engine/train/trainer.h"

namespace circuitlab::engine {
namespace {

v1::ExperimentSpec Recall(int layers, int heads, const std::string& model_extra) {
  return testing::ResolvedSpec(R"({"task": {"associative_recall": {"num_common": 8, "num_rare": 24, "num_heldout": 4,
                  "num_blocks": 4, "num_positions": 12}},
                  "model": {"imir": {"num_layers": )" +
                               std::to_string(layers) + R"(, "num_heads": )" + std::to_string(heads) +
                               R"(, "parameterisation": "PARAMETERISATION_COORDINATES", "init_std": 0.5)" +
                               model_extra + R"(}},
                  "training": {"batch_size": 16, "steps": 10, "learning_rate": 0.5},
                  "recording": {"eval_size": 16}})");
}

// A FULL model holding the coordinate model's materialised weights.
std::unique_ptr<ImirModel> DenseTwin(const ImirModel& coords) {
  ImirModelConfig cfg = coords.config();
  cfg.coordinates = nullptr;
  auto dense = std::make_unique<ImirModel>(cfg, coords.ensemble(), torch::kCPU);
  torch::NoGradGuard no_grad;
  for (int64_t e = 0; e < coords.ensemble(); ++e) {
    std::vector<torch::Tensor> kq;
    for (int64_t l = 0; l < cfg.layers; ++l) kq.push_back(coords.kq(l)[e]);
    dense->AssignDense(e, kq, coords.readout()[e]);
  }
  return dense;
}

struct Shape {
  int layers, heads;
  std::string extra;
};

class SparseForwardTest : public ::testing::TestWithParam<Shape> {};

// Scores assembled per block pair, skipped heads and blocks: the same logits
// as the dense forward (last position and every position), for the full
// paper basis, the complete basis and the four-coordinate ticket.
TEST_P(SparseForwardTest, MatchesTheDenseForward) {
  const Shape shape = GetParam();
  const v1::ExperimentSpec spec = Recall(shape.layers, shape.heads, shape.extra);
  EnsembleTrainer trainer(spec, {3, 4}, torch::kCPU);
  ASSERT_TRUE(trainer.model().coordinate_model());
  // The same coefficients under a forced block-sparse forward.
  ImirModelConfig cfg = trainer.model().config();
  auto cc = std::make_shared<CoordinateConfig>(*cfg.coordinates);
  cc->forward = CoordinateConfig::Forward::kSparse;
  cfg.coordinates = cc;
  ImirModel model(cfg, 2, torch::kCPU);
  {
    torch::NoGradGuard no_grad;
    model.parameters()[0].copy_(trainer.model().parameters()[0]);
  }
  ASSERT_TRUE(model.sparse_forward());
  const std::unique_ptr<ImirModel> dense = DenseTwin(model);
  torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const Batch b = trainer.task(0).Sample(32, SampleMode::kTrain, gen);
  const torch::Tensor tok = torch::stack({b.tokens, b.tokens}), pid = torch::stack({b.pids, b.pids});
  torch::NoGradGuard no_grad;
  for (bool all : {false, true}) {
    const torch::Tensor sparse = model.Forward(tok, pid, all), full = dense->Forward(tok, pid, all);
    const torch::Tensor chosen = trainer.model().Forward(tok, pid, all);  // whichever the model picked
    EXPECT_LT((chosen - full).abs().max().item<double>(), 1e-4 * (1 + full.abs().max().item<double>()));
    ASSERT_EQ(sparse.sizes(), full.sizes());
    EXPECT_LT((sparse - full).abs().max().item<double>(), 1e-4 * (1 + full.abs().max().item<double>()))
        << "all_positions " << all;
    EXPECT_GT(full.abs().max().item<double>(), 1e-3);  // not trivially zero
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, SparseForwardTest,
                         ::testing::Values(Shape{2, 1, ""}, Shape{3, 1, ""}, Shape{2, 2, ""},
                                           Shape{2, 1, R"(, "coordinate_basis": "BASIS_SELECTION_COMPLETE")"},
                                           Shape{3, 1, R"(, "coordinates": ["L1H1:[∅→∅]:S_1",
                                                 "L3H1:[(0,1,0)→(1,0,0)]:I_t", "OUT:[(0,0,1)]:I"])"},
                                           Shape{2, 1, R"(, "coordinates": ["alpha", "beta", "gamma", "delta"])"}));

// G.5: with unit-norm coordinates one SGD step moves W by -lr P_S(grad W);
// with raw coordinates element i moves ||B_i||^2 times as far.
TEST(CoordinateModelTest, UnitNormSgdIsProjectedDenseSgd) {
  for (bool unit : {true, false}) {
    const v1::ExperimentSpec spec =
        Recall(2, 1, unit ? "" : R"(, "coordinate_scaling": "COORDINATE_SCALING_RAW")");
    EnsembleTrainer trainer(spec, {5}, torch::kCPU);
    const ImirModel& model = trainer.model();
    const Basis& basis = model.config().coordinates->basis;
    const Projector projector(basis);
    const Projection before = Project(projector, model, 0);
    // The dense gradient at the same weights, on the batch the trainer draws.
    std::unique_ptr<ImirModel> dense = DenseTwin(model);
    trainer.Step(false);
    const Projection after = Project(projector, model, 0);
    // A FULL model at the same weights takes its first step on the same batch
    // (batches depend on seed and step only).
    v1::ExperimentSpec full_spec = spec;
    full_spec.mutable_model()->mutable_imir()->set_parameterisation(v1::PARAMETERISATION_FULL);
    full_spec.mutable_model()->mutable_imir()->clear_coordinate_scaling();
    full_spec.mutable_model()->mutable_imir()->clear_coordinate_basis();
    EnsembleTrainer dense_trainer(full_spec, {5}, torch::kCPU);
    {
      torch::NoGradGuard no_grad;
      std::vector<torch::Tensor> kq;
      for (int64_t l = 0; l < 2; ++l) kq.push_back(dense->kq(l)[0]);
      const_cast<ImirModel&>(dense_trainer.model()).AssignDense(0, kq, dense->readout()[0]);
    }
    dense_trainer.Step(false);  // plain SGD: W' = W - lr grad
    const Projection dense_after = Project(projector, dense_trainer.model(), 0);
    const double lr = spec.training().learning_rate();
    // float32 weights: compare against the largest step.
    double max_diff = 0, scale = 0;
    for (const CoordinateDef& c : basis.coords) {
      const double coord_step = after.values[c.index] - before.values[c.index];
      const double dense_step = dense_after.values[c.index] - before.values[c.index];  // -lr <g,B>/||B||^2
      const double expected = unit ? dense_step : dense_step * c.norm * c.norm;
      max_diff = std::max(max_diff, std::abs(coord_step - expected));
      scale = std::max(scale, std::abs(expected));
    }
    EXPECT_GT(scale, 1e-4);
    EXPECT_LT(max_diff, 1e-3 * scale) << (unit ? "unit-norm" : "raw") << " scaling, lr " << lr;
  }
}

// INIT_SCHEME_PROJECTED starts at the projection of the FULL model's init of
// the same seed; initial_coordinates override named coordinates (raw values).
TEST(CoordinateModelTest, ProjectedAndGivenInitialisation) {
  const v1::ExperimentSpec spec = Recall(2, 1, R"(, "init": "INIT_SCHEME_PROJECTED",
      "initial_coordinates": {"gamma": 2.5, "L1H1:[∅→∅]:S_1": -1.25})");
  EnsembleTrainer trainer(spec, {9}, torch::kCPU);
  const Basis& basis = trainer.model().config().coordinates->basis;
  const Projection got = Project(trainer.model(), 0, basis);

  v1::ExperimentSpec full_spec = spec;
  auto* m = full_spec.mutable_model()->mutable_imir();
  m->set_parameterisation(v1::PARAMETERISATION_FULL);
  m->set_init(v1::INIT_SCHEME_NORMAL);
  m->clear_initial_coordinates();
  m->clear_coordinate_basis();
  m->clear_coordinate_scaling();
  EnsembleTrainer dense(full_spec, {9}, torch::kCPU);
  const Projection want = Project(dense.model(), 0, basis);
  for (const CoordinateDef& c : basis.coords) {
    double expected = want.values[c.index];
    if (c.canonical == "gamma") expected = 2.5;
    if (c.label == "L1H1:[∅→∅]:S_1") expected = -1.25;
    EXPECT_NEAR(got.values[c.index], expected, 1e-5 + 1e-4 * std::abs(expected)) << c.label;
  }
  EXPECT_GT(std::abs(want.values[0]), 1e-6);  // the dense init does project somewhere
}

// Members whose initial coordinates differ (the phase diagram's axes) pack
// (PackableTogether) and each trains as its own run would: the same losses,
// the same weights, and a member checkpoint that resumes alone under its own
// spec and no other. Seeds pack too where they do not draw the basis (no
// common pairs, as in the phase diagram).
TEST(CoordinateModelTest, MembersWithTheirOwnInitialCoordinatesTrainAsTheirOwnRuns) {
  const auto spec = [](uint64_t seed, const std::string& coords) {
    return testing::ResolvedSpec(R"({"seed": )" + std::to_string(seed) + R"(, "task": {"associative_recall":
        {"num_common": 0, "num_rare": 24, "num_heldout": 4, "num_blocks": 4, "num_positions": 12}},
        "model": {"imir": {"num_layers": 2, "num_heads": 1, "parameterisation": "PARAMETERISATION_COORDINATES",
        "init": "INIT_SCHEME_ZERO", "initial_coordinates": {)" + coords + R"(}}},
        "training": {"batch_size": 16, "steps": 10, "learning_rate": 0.5}, "recording": {"eval_size": 16}})");
  };
  const v1::ExperimentSpec a = spec(1, R"("L1H1:[∅→∅]:S_1": 1.5)"), b = spec(2, R"("L1H1:[∅→∅]:S_1": -2)"),
                           c = spec(1, R"("gamma": 3)");
  ASSERT_TRUE(PackableTogether(a, b));
  ASSERT_TRUE(PackableTogether(a, c));
  EnsembleTrainer pack({a, b, c}, torch::kCPU);
  std::vector<std::unique_ptr<EnsembleTrainer>> alone;
  for (const v1::ExperimentSpec* m : {&a, &b, &c}) {
    alone.push_back(std::make_unique<EnsembleTrainer>(*m, std::vector<uint64_t>{m->seed()}, torch::kCPU));
  }
  for (int step = 1; step <= 6; ++step) {
    const auto joint = pack.Step(true);
    for (size_t e = 0; e < alone.size(); ++e) {
      const auto own = alone[e]->Step(true);
      EXPECT_NEAR(testing::MetricValue(joint[e], "train/loss"), testing::MetricValue(own[0], "train/loss"), 1e-6)
          << "member " << e << " step " << step;
    }
  }
  for (size_t e = 0; e < alone.size(); ++e) {
    const auto jp = pack.model().parameters(), op = alone[e]->model().parameters();
    for (size_t i = 0; i < jp.size(); ++i) EXPECT_TRUE(torch::allclose(jp[i][e], op[i][0], 1e-5, 1e-6)) << e;
  }
  // The members did start apart: their losses differ.
  const auto eval = pack.Evaluate();
  EXPECT_NE(testing::MetricValue(eval[0], "eval/icl_rare/loss"), testing::MetricValue(eval[2], "eval/icl_rare/loss"));
  EnsembleTrainer resumed(c, {c.seed()}, torch::kCPU);
  EXPECT_EQ(resumed.LoadCheckpoint(pack.SaveMemberCheckpoint(0)).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(resumed.LoadCheckpoint(pack.SaveMemberCheckpoint(2)).ok());
  EXPECT_TRUE(torch::equal(resumed.model().parameters()[0], alone[2]->model().parameters()[0]));
  // The whole pack's checkpoint is its own: a pack of other settings refuses it.
  EnsembleTrainer other({a, b, a}, torch::kCPU);
  EXPECT_EQ(other.LoadCheckpoint(pack.SaveCheckpoint()).code(), absl::StatusCode::kInvalidArgument);
  EnsembleTrainer same({a, b, c}, torch::kCPU);
  EXPECT_TRUE(same.LoadCheckpoint(pack.SaveCheckpoint()).ok());
}

// Associative recall draws its common pairs from the seed, and with them the
// C relation of the basis: coordinate models of two such seeds never pack
// (the first member's basis would be the other's), FULL models do, and the
// executor refuses such a pack.
TEST(CoordinateModelTest, SeedsThatDrawTheBasisDoNotPack) {
  const v1::ExperimentSpec a = Recall(2, 1, "");
  v1::ExperimentSpec b = a;
  b.set_seed(a.seed() + 1);
  EXPECT_FALSE(PackableTogether(a, b));
  v1::ExperimentSpec c = Recall(2, 1, R"(, "initial_coordinates": {"gamma": 3})");
  EXPECT_TRUE(PackableTogether(a, c));  // one seed, one basis
  std::vector<TrainRequest> requests(2);
  requests[0].spec = a;
  requests[1].spec = b;
  EXPECT_EQ(MakeTorchExecutor()->TrainPack(requests, {nullptr, nullptr})[0].status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::ExperimentSpec full = testing::ResolvedSpec(R"({"task": {"associative_recall": {"num_common": 8}}})");
  v1::ExperimentSpec full2 = full;
  full2.set_seed(full.seed() + 1);
  EXPECT_TRUE(PackableTogether(full, full2));
}

// A named subset trains only those coordinates; the rest of W stays zero and
// the checkpoint resumes bit-identically.
TEST(CoordinateModelTest, TicketTrainsOnlyItsCoordinatesAndResumes) {
  const v1::ExperimentSpec spec = Recall(2, 1, R"(, "coordinates": ["alpha", "beta", "gamma", "delta"])");
  EnsembleTrainer a(spec, {2}, torch::kCPU);
  ASSERT_EQ(a.model().parameters()[0].size(1), 4);
  for (int i = 0; i < 5; ++i) a.Step(false);
  const std::string ckpt = a.SaveCheckpoint();
  EnsembleTrainer b(spec, {2}, torch::kCPU);
  ASSERT_TRUE(b.LoadCheckpoint(ckpt).ok());
  for (int i = 0; i < 5; ++i) {
    a.Step(false);
    b.Step(false);
  }
  EXPECT_TRUE(torch::equal(a.model().parameters()[0], b.model().parameters()[0]));
  const Basis paper = BuildBasis(a.task(0).Symmetry(), 2, 1, Selection::kPaper);
  const Projection p = Project(a.model(), 0, paper);
  EXPECT_LT(p.rho(), 1e-6);  // nothing off the four elements
  for (const CoordinateDef& c : paper.coords) {
    if (c.canonical.empty()) {
      EXPECT_EQ(p.values[c.index], 0.0) << c.label;
    } else {
      EXPECT_NE(p.values[c.index], 0.0) << c.label;
    }
  }
}

}  // namespace
}  // namespace circuitlab::engine
