// E2, in-context linear regression (SCIENCE.md A.2, B.3): with few pretraining
// tasks the model retrieves a known weight vector, and as task diversity
// grows it moves towards ridge regression on fresh tasks (the transition of
// Raventos et al. 2023, the E2 lineage SCIENCE.md F names; the E2 form of the
// mode transition E.17). CPU-sized fixtures: d = 3, 12 points, the B.3 model
// at 2 blocks of width 32, 1000 AdamW steps, trained per test process.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>

#include "server/engine/analysis/regression_vectors.h"
#include "server/engine/train/regression_trainer.h"
#include "tests/test_util/engine_util.h"

namespace circuitlab::engine {
namespace {

struct Measured {
  double ood_log_ratio = 0, ood_to_known = 0, ood_to_ridge = 0, ood_loss = 0, ood_ridge_loss = 0;
  double id_to_retrieval = 0, id_to_ridge = 0, mix_log_ratio = 0;
};

double ResponseRow(const v1::AnalyzeTaskVectorsResponse& r, const std::string& name) {
  for (const v1::TaskVectorValue& row : r.values()) {
    if (row.name() == name) return row.value();
  }
  ADD_FAILURE() << "no row " << name;
  return std::nan("");
}

Measured TrainAtDiversity(int diversity, uint64_t seed) {
  at::set_num_threads(1);
  const v1::ExperimentSpec spec = testing::ResolvedSpec(
      R"({"seed": )" + std::to_string(seed) + R"(, "task": {"latent": {"kind": "LATENT_KIND_REGRESSION", "dim": 3,
        "num_points": 12, "p_minor": 0.5, "diversity": )" + std::to_string(diversity) + R"(}},
      "model": {"decoder": {"num_layers": 2, "d_model": 32, "num_heads": 2}},
      "training": {"steps": 1000, "learning_rate": 0.002}, "recording": {"eval_size": 256}})");
  const auto start = std::chrono::steady_clock::now();
  RegressionTrainer trainer(spec, {seed}, torch::kCPU);
  while (trainer.step() < 1000) trainer.Step(false);
  const std::vector<Metric> eval = trainer.Evaluate()[0];
  for (torch::Tensor p : trainer.model().parameters()) p.requires_grad_(false);
  v1::AnalyzeTaskVectorsRequest r = testing::TaskVectorDefaults();
  r.add_analyses("kl");
  r.set_kl_samples(512);
  r.set_seed(seed);
  absl::StatusOr<v1::AnalyzeTaskVectorsResponse> rep =
      RunRegressionAnalyses(trainer.model(), trainer.task(0), r, {}, nullptr);
  EXPECT_TRUE(rep.ok()) << rep.status();
  Measured m;
  if (rep.ok()) {
    m.ood_log_ratio = ResponseRow(*rep, "kl/ood_log10_ratio");
    m.ood_to_known = ResponseRow(*rep, "kl/ood_exact");
    m.ood_to_ridge = ResponseRow(*rep, "kl/ood_ridge");
    m.mix_log_ratio = ResponseRow(*rep, "kl/log10_ratio");
  }
  m.ood_loss = testing::MetricValue(eval, "eval/ood/loss");
  m.ood_ridge_loss = testing::MetricValue(eval, "eval/ood/ridge_loss");
  m.id_to_retrieval = testing::MetricValue(eval, "eval/id/to_retrieval");
  m.id_to_ridge = testing::MetricValue(eval, "eval/id/to_ridge");
  std::cout << "E2 kappa=" << diversity << " seed " << seed << " ("
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
            << " s): fresh tasks: squared distance to the known-pool predictor " << m.ood_to_known << ", to ridge "
            << m.ood_to_ridge << ", log10 ratio " << m.ood_log_ratio << "; OOD loss " << m.ood_loss << " (ridge "
            << m.ood_ridge_loss << "); id to retrieval " << m.id_to_retrieval << ", to ridge " << m.id_to_ridge
            << "; training mixture log10(exact/hybrid) " << m.mix_log_ratio << "\n";
  return m;
}

TEST(RegressionScienceTest, DiversityMovesTheModelFromRetrievalTowardsRidge) {
  // Measured at this tree (log10 ratio, distance to ridge, OOD loss; ridge's
  // own OOD loss is 0.99-1.05):
  //   seed 31: -0.82 -> -0.06, 2.67 -> 2.19 (x0.82), 3.21 -> 3.07 (x0.96)
  //   seed 32: -0.57 -> -0.04, 2.74 -> 2.20 (x0.80), 3.85 -> 3.00 (x0.78)
  //   seed 33: -0.31 -> -0.05, 3.23 -> 2.25 (x0.70), 4.58 -> 3.31 (x0.72)
  // The margins below hold on all three; the test runs seed 31.
  uint64_t seed = 31;  // CIRCUITLAB_E2_SEED measures another
  if (const char* e = std::getenv("CIRCUITLAB_E2_SEED")) seed = std::stoull(e);
  const Measured low = TrainAtDiversity(-1, seed), high = TrainAtDiversity(8, seed);
  // Three majors only: on fresh tasks the model stays with the known
  // weight vectors (the known-pool predictor), far from ridge.
  EXPECT_LT(low.ood_log_ratio, -0.25);
  EXPECT_LT(low.id_to_retrieval, low.id_to_ridge);
  // 256 minors: it moves towards ridge by a wide margin in log distance
  // (the ratio comes within 0.1 of even), its distance to ridge falls and
  // its OOD error with it (at this scale it does not reach ridge's error).
  EXPECT_GE(high.ood_log_ratio - low.ood_log_ratio, 0.2);
  EXPECT_GT(high.ood_log_ratio, -0.1);
  EXPECT_LT(high.ood_to_ridge, 0.9 * low.ood_to_ridge);
  EXPECT_LT(high.ood_loss, 0.98 * low.ood_loss);
}

}  // namespace
}  // namespace circuitlab::engine
