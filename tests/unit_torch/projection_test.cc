#include "server/engine/manifold/projection.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <map>

#include "server/engine/tasks/assoc_recall.h"

namespace circuitlab::engine {
namespace {

AssocRecallConfig Config(bool absolute = false) {
  AssocRecallConfig c;
  c.num_common = 8;
  c.num_rare = 24;
  c.num_heldout = 8;
  c.num_blocks = 6;
  c.num_positions = 16;
  c.absolute_positions = absolute;
  c.rare_fraction = 1.0;
  return c;
}

std::vector<double> RandomValues(size_t n, uint64_t seed) {
  torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  torch::Tensor v = torch::randn({static_cast<int64_t>(n)}, gen, torch::kDouble);
  return std::vector<double>(v.data_ptr<double>(), v.data_ptr<double>() + n);
}

class ProjectionTest : public ::testing::TestWithParam<Selection> {};

// A model that lies in the span projects back onto exactly its coefficients,
// with zero residual.
TEST_P(ProjectionTest, PointsOfTheSpanProjectOntoThemselves) {
  AssocRecallTask task(Config(), 1);
  for (int64_t layers : {1, 2, 3}) {
    ImirModel model(DenseConfig(task.vocab_size(), task.num_positions(), layers, 2), 2, torch::kCPU);
    Basis basis = BuildBasis(task.Symmetry(), layers, 2, GetParam());
    Projection p;
    p.values = RandomValues(basis.coords.size(), 7);
    LoadProjected(basis, p, model, 1);
    Projection back = Project(model, 1, basis);
    ASSERT_EQ(back.values.size(), p.values.size());
    for (size_t i = 0; i < p.values.size(); ++i) {
      ASSERT_NEAR(back.values[i], p.values[i], 1e-5) << basis.coords[i].label;  // float32 weights
    }
    EXPECT_LT(back.rho(), 1e-3) << layers << " layers";
    // Member 0 was untouched (zeros): projection is per member.
    EXPECT_EQ(Project(model, 0, basis).rho(), 0.0);
  }
}

INSTANTIATE_TEST_SUITE_P(Sets, ProjectionTest, ::testing::Values(Selection::kPaper, Selection::kComplete));

TEST(ProjectionTest, RandomWeightsAreMostlyOffTheManifold) {
  AssocRecallTask task(Config(), 1);
  ImirModel model(DenseConfig(task.vocab_size(), task.num_positions(), 2, 1, false, 0.01), 1, torch::kCPU);
  model.Initialize({3});
  const double complete = Project(model, 0, BuildBasis(task.Symmetry(), 2, 1, Selection::kComplete)).rho();
  const double paper = Project(model, 0, BuildBasis(task.Symmetry(), 2, 1, Selection::kPaper)).rho();
  EXPECT_GT(complete, 0.95);
  EXPECT_GT(paper, complete);  // a subspace of the commutant leaves more outside
  EXPECT_LT(paper, 1.0);
}

// The canonical induction head written in basis coordinates (alpha, beta,
// gamma of C.5) solves recall: the basis lines up with the model's blocks.
TEST(ProjectionTest, InductionHeadFromCanonicalCoordinatesSolvesRecall) {
  AssocRecallTask task(Config(/*absolute=*/true), 2);
  Basis basis = BuildBasis(task.Symmetry(), 2, 1, Selection::kPaper);
  Projection p;
  p.values.assign(basis.coords.size(), 0.0);
  std::map<std::string, int> found;
  for (const auto& c : basis.coords) {
    if (c.canonical == "alpha" || c.canonical == "beta" || c.canonical == "gamma") {
      p.values[c.index] = 30.0;
      found[c.canonical]++;
    }
  }
  ASSERT_EQ(found.size(), 3u);
  ImirModel model(DenseConfig(task.vocab_size(), task.num_positions(), 2, 1, true), 1, torch::kCPU);
  LoadProjected(basis, p, model, 0);
  torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
  Batch b = task.Sample(512, SampleMode::kIclRare, gen);
  torch::NoGradGuard no_grad;
  torch::Tensor logits = model.Forward(b.tokens.unsqueeze(0), b.pids.unsqueeze(0))[0];
  EXPECT_GE((logits.argmax(-1) == b.target).to(torch::kDouble).mean().item<double>(), 0.99);
  // And it projects back onto exactly those three coordinates.
  Projection back = Project(model, 0, basis);
  for (const auto& c : basis.coords) EXPECT_NEAR(back.values[c.index], p.values[c.index], 1e-5) << c.label;
}

}  // namespace
}  // namespace circuitlab::engine
