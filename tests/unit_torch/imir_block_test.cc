// The hand-written block kernel (server/engine/models/imir_block.h) against
// the ATen reference forward: the same last-position logits and the same
// first-order gradients, for one to three layers, one or two heads, several
// ensemble members, float32 and float64, FULL and COORDINATES models.
#include "server/engine/models/imir_block.h"

#include <gtest/gtest.h>

#include "server/engine/models/imir_model.h"
#include "server/engine/spec.h"
#include "server/engine/tasks/assoc_recall.h"
#include "server/engine/torch_util.h"
#include "server/engine/train/trainer.h"
#include "tests/test_util/engine_util.h"

namespace circuitlab::engine {
namespace {

struct KernelShape {
  int layers, heads, ensemble;
  bool float64;
};

// Largest absolute difference relative to the reference's largest entry.
double RelativeGap(const torch::Tensor& got, const torch::Tensor& want) {
  return (got - want).abs().max().item<double>() / (1e-12 + want.abs().max().item<double>());
}

// Logits of both models on the same stacked batches, and the gradients of a
// fixed random weighting of them (every logit's gradient path is used).
void ExpectSameLogitsAndGradients(ImirModel& fast, ImirModel& ref, const BlockTask& task, double tol) {
  const int64_t E = fast.ensemble();
  std::vector<torch::Tensor> tok, pid;
  for (int64_t e = 0; e < E; ++e) {
    auto gen = MakeGenerator(11 + static_cast<uint64_t>(e));
    Batch b = task.Sample(12, SampleMode::kTrain, gen);
    tok.push_back(b.tokens);
    pid.push_back(b.pids);
  }
  const torch::Tensor tokens = torch::stack(tok), pids = torch::stack(pid);
  const torch::Tensor f = fast.Forward(tokens, pids), r = ref.Forward(tokens, pids);
  ASSERT_EQ(f.sizes(), r.sizes());
  EXPECT_GT(r.abs().max().item<double>(), 1e-3);  // not trivially zero
  EXPECT_LT(RelativeGap(f, r), tol);
  auto gen = MakeGenerator(5);
  const torch::Tensor weight = torch::randn(r.sizes(), gen, torch::TensorOptions().dtype(r.scalar_type()));
  (f * weight).sum().backward();
  (r * weight).sum().backward();
  const std::vector<torch::Tensor> fp = fast.parameters(), rp = ref.parameters();
  const std::vector<std::string> names = fast.parameter_names();
  for (size_t i = 0; i < fp.size(); ++i) {
    ASSERT_TRUE(fp[i].grad().defined()) << names[i];
    EXPECT_GT(rp[i].grad().abs().max().item<double>(), 1e-4) << names[i];
    EXPECT_LT(RelativeGap(fp[i].grad(), rp[i].grad()), tol) << names[i];
  }
}

class BlockKernelTest : public ::testing::TestWithParam<KernelShape> {};

TEST_P(BlockKernelTest, FullModelMatchesTheReferenceForward) {
  const KernelShape s = GetParam();
  AssocRecallConfig tc;
  tc.num_common = 4;
  tc.num_rare = 12;
  tc.num_heldout = 4;
  tc.num_blocks = 5;
  tc.num_positions = 12;
  tc.rare_fraction = 0.5;
  AssocRecallTask task(tc, 1);
  ImirModelConfig cfg = DenseConfig(task.vocab_size(), task.num_positions(), s.layers, s.heads, false, 0.5);
  cfg.float64 = s.float64;
  ImirModelConfig ref_cfg = cfg;
  ref_cfg.reference_forward = true;
  ImirModel fast(cfg, s.ensemble, torch::kCPU), ref(ref_cfg, s.ensemble, torch::kCPU);
  std::vector<uint64_t> seeds;
  for (int e = 0; e < s.ensemble; ++e) seeds.push_back(3 + static_cast<uint64_t>(e));
  fast.Initialize(seeds);
  ref.Initialize(seeds);
  ExpectSameLogitsAndGradients(fast, ref, task, s.float64 ? 1e-12 : 2e-5);
}

INSTANTIATE_TEST_SUITE_P(Shapes, BlockKernelTest,
                         ::testing::Values(KernelShape{1, 1, 1, true}, KernelShape{2, 1, 1, true},
                                           KernelShape{2, 2, 2, true}, KernelShape{3, 1, 2, true},
                                           KernelShape{3, 2, 1, true}, KernelShape{2, 1, 2, false},
                                           KernelShape{3, 2, 2, false}));

// A COORDINATES model on the materialised matrices: the kernel's gradients
// reach the coefficients through the gather.
TEST(BlockKernelCoordinatesTest, CoefficientGradientsMatchTheReferenceForward) {
  const v1::ExperimentSpec spec = testing::ResolvedSpec(R"({"task": {"associative_recall": {"num_common": 8,
      "num_rare": 24, "num_heldout": 4, "num_blocks": 4, "num_positions": 12}},
      "model": {"imir": {"num_layers": 3, "num_heads": 1, "parameterisation": "PARAMETERISATION_COORDINATES",
                         "coordinate_basis": "BASIS_SELECTION_COMPLETE", "init_std": 0.5}},
      "training": {"batch_size": 16, "steps": 10}, "recording": {"eval_size": 16}})");
  EnsembleTrainer trainer(spec, {3, 4}, torch::kCPU);
  ImirModelConfig cfg = trainer.model().config();
  auto cc = std::make_shared<CoordinateConfig>(*cfg.coordinates);
  cc->forward = CoordinateConfig::Forward::kDense;
  cfg.coordinates = cc;
  ImirModelConfig ref_cfg = cfg;
  ref_cfg.reference_forward = true;
  ImirModel fast(cfg, 2, torch::kCPU), ref(ref_cfg, 2, torch::kCPU);
  {
    torch::NoGradGuard no_grad;
    fast.parameters()[0].copy_(trainer.model().parameters()[0]);
    ref.parameters()[0].copy_(trainer.model().parameters()[0]);
  }
  ASSERT_FALSE(fast.sparse_forward());
  ExpectSameLogitsAndGradients(fast, ref, trainer.task(0), 2e-5);
}

// Ids outside the one-hot range are refused, not read past W.
TEST(BlockKernelIdsTest, RefusesIdsOutsideTheOneHotRange) {
  ImirModel model(DenseConfig(/*vocab=*/6, /*positions=*/4, 2, 1), 1, torch::kCPU);
  model.Initialize({1});
  const torch::Tensor ok = torch::zeros({1, 2, 3}, torch::kLong);
  torch::NoGradGuard no_grad;
  EXPECT_NO_THROW(model.Forward(ok, ok));
  EXPECT_THROW(model.Forward(ok + 6, ok), c10::Error);
  EXPECT_THROW(model.Forward(ok, ok + 4), c10::Error);
  EXPECT_THROW(model.Forward(ok - 1, ok), c10::Error);
}

}  // namespace
}  // namespace circuitlab::engine
