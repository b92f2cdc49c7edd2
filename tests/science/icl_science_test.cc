// Science tests: the papers' qualitative claims on CPU-sized configurations,
// fixed seeds, margins from measured runs (see the README's science table).
// Each trains three seeds at once through the ensemble dimension.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "client/lib/client.h"
#include "tests/test_util/engine_util.h"
#include "server/engine/manifold/invariance.h"
#include "server/engine/manifold/projection.h"
#include "server/engine/spec.h"
#include "server/engine/tasks/assoc_recall.h"
#include "server/engine/train/trainer.h"

namespace circuitlab::engine {
namespace {

v1::ExperimentSpec Spec(const std::string& json) { return testing::ResolvedSpec(json); }

double ValueOf(const std::vector<Metric>& ms, const std::string& name) { return testing::MetricValue(ms, name); }

struct Trace {
  std::vector<int64_t> first_step_icl90;        // per member, -1 = never
  std::vector<std::vector<Metric>> final_eval;  // per member
};

// Trains every member for the spec's steps, evaluating every `eval_every`.
Trace Train(const v1::ExperimentSpec& spec, const std::vector<uint64_t>& seeds, int64_t eval_every) {
  EnsembleTrainer trainer(spec, seeds, torch::kCPU);
  Trace trace;
  trace.first_step_icl90.assign(seeds.size(), -1);
  while (trainer.step() < trainer.total_steps()) {
    trainer.Step(false);
    if (trainer.step() % eval_every != 0 && trainer.step() != trainer.total_steps()) continue;
    auto eval = trainer.Evaluate();
    for (size_t e = 0; e < seeds.size(); ++e) {
      if (trace.first_step_icl90[e] < 0 && ValueOf(eval[e], "eval/icl_rare/accuracy") >= 0.9) {
        trace.first_step_icl90[e] = trainer.step();
      }
    }
    trace.final_eval = eval;
  }
  return trace;
}

// SCIENCE.md E.3/G.2/G.5: the 2-layer full-parameter IMIR model learns
// rare-only associative recall, i.e. forms an induction head (measured:
// icl_rare >= 0.9 at step 300 for seeds 1, 2, 3 with SGD lr 8). Budget 600.
// The dense one-hot model does not extend the circuit to held-out tokens
// (their rows get no gradient; measured accuracy 0.0).
TEST(ScienceTest, TwoLayerModelLearnsRareOnlyRecallInContext) {
  const v1::ExperimentSpec spec = Spec(R"({
    "task": {"associative_recall": {"num_common": 0, "num_rare": 24, "num_heldout": 8, "num_blocks": 6,
                                    "num_positions": 16}},
    "data": {"rare_fraction": 1.0},
    "model": {"imir": {"num_layers": 2, "num_heads": 1, "init_std": 0.01}},
    "training": {"optimizer": "OPTIMIZER_KIND_SGD", "learning_rate": 8.0, "batch_size": 256, "steps": 600},
    "recording": {"eval_size": 2048}
  })");
  const Trace t = Train(spec, {1, 2, 3}, 25);
  for (size_t e = 0; e < 3; ++e) {
    std::printf("seed %zu: icl_rare >= 0.9 at step %lld, final icl_rare %.4f, icl_holdout %.4f\n", e + 1,
                static_cast<long long>(t.first_step_icl90[e]), ValueOf(t.final_eval[e], "eval/icl_rare/accuracy"),
                ValueOf(t.final_eval[e], "eval/icl_holdout/accuracy"));
    EXPECT_GT(t.first_step_icl90[e], 0) << "seed " << e + 1 << " never reached icl_rare 0.9 in 600 steps";
    EXPECT_GE(ValueOf(t.final_eval[e], "eval/icl_rare/accuracy"), 0.9);
    EXPECT_LE(ValueOf(t.final_eval[e], "eval/icl_holdout/accuracy"), 0.1);
  }
}

// SCIENCE.md A.1.1/D.2: with half the queries common (fixed pairs) and half
// rare, both circuits form: the induction head answers rare queries (ICL) and
// the readout stores the pairs (IWL). On the conflict set (context pairs the
// query with another common token) the in-weights answer wins.
// Measured (seeds 1-3, 600 steps): icl_rare 0.975-0.976, iwl 1.000,
// conflict p_iwl 0.996 vs p_icl 0.000.
TEST(ScienceTest, MixedDataGrowsBothCircuitsAndWeightsWinConflicts) {
  const v1::ExperimentSpec spec = Spec(R"({
    "task": {"associative_recall": {"num_common": 8, "num_rare": 24, "num_heldout": 8, "num_blocks": 6,
                                    "num_positions": 16}},
    "data": {"rare_fraction": 0.5},
    "model": {"imir": {"num_layers": 2, "num_heads": 1, "init_std": 0.01}},
    "training": {"optimizer": "OPTIMIZER_KIND_SGD", "learning_rate": 8.0, "batch_size": 256, "steps": 600},
    "recording": {"eval_size": 2048}
  })");
  const Trace t = Train(spec, {1, 2, 3}, 100);
  for (size_t e = 0; e < 3; ++e) {
    const auto& ev = t.final_eval[e];
    std::printf("seed %zu: icl_rare %.4f iwl %.4f conflict p_icl %.4f p_iwl %.4f logit_diff %.3f\n", e + 1,
                ValueOf(ev, "eval/icl_rare/accuracy"), ValueOf(ev, "eval/iwl/accuracy"),
                ValueOf(ev, "eval/conflict/p_icl"), ValueOf(ev, "eval/conflict/p_iwl"),
                ValueOf(ev, "eval/conflict/logit_diff"));
    EXPECT_GE(ValueOf(ev, "eval/icl_rare/accuracy"), 0.9);
    EXPECT_GE(ValueOf(ev, "eval/iwl/accuracy"), 0.95);
    EXPECT_GT(ValueOf(ev, "eval/conflict/p_iwl"), ValueOf(ev, "eval/conflict/p_icl") + 0.5);
  }
}

// SCIENCE.md E.3 is decided by its recipe (examples/reproduce/E.3.json) in
// reproduction_science_test.cc.

void PrintLadder(const char* what, const InvarianceResult& r) {
  for (const InvarianceSeries& s : r.series) {
    std::printf("%-22s %-5s 1-f:", what, s.matrix.c_str());
    for (double v : s.off_fraction) std::printf(" %.2e", v);
    std::printf("  plateau %.2e slope %.3f\n", s.plateau, s.slope);
  }
}

// The small recall task of the gradient checks: V_r 16, no held-out tokens,
// n 4, P 16.
AssocRecallConfig GradientCheckTask(int64_t common, double rare_fraction) {
  AssocRecallConfig cfg;
  cfg.num_common = common;
  cfg.num_rare = 16;
  cfg.num_heldout = 0;
  cfg.num_blocks = 4;
  cfg.num_positions = 16;
  cfg.rare_fraction = rare_fraction;
  return cfg;
}

// SCIENCE.md E.2 (C.6, G.5) is decided by its recipe
// (examples/reproduce/E.2.json) in reproduction_science_test.cc: at a point
// of the complete span the off-span fraction of the expected gradient falls
// like 1/N to a plateau <= 1e-3 in every matrix, and the off-span control
// fails as it must. What a recipe cannot express is here: control (b), a
// span built for a symmetry the data does not have (fixed pairs treated as
// exchangeable, i.e. without C), must fail too (measured plateau 0.92,
// asserted >= 0.01); and the paper span's plateau is reported (0.93: large
// with un-centred one-hots, as G.5 says).
TEST(ScienceTest, ASpanWithoutTheRelationLosesTheGradient) {
  const AssocRecallConfig cfg = GradientCheckTask(/*common=*/0, /*rare_fraction=*/1.0);
  AssocRecallTask task(cfg, 1);
  InvarianceConfig short_ladder;  // the controls plateau early
  short_ladder.sample_sizes = {256, 1024, 4096, 16384, 65536};
  const Basis paper = BuildBasis(task.Symmetry(), 2, 1, Selection::kPaper);
  const InvarianceResult paper_span = CheckInvariance(task, paper, paper, short_ladder);
  PrintLadder("paper (reported)", paper_span);

  AssocRecallConfig fixed = cfg;
  fixed.num_common = 8;
  fixed.rare_fraction = 0.0;  // every pair is one of the fixed pairs
  AssocRecallTask fixed_task(fixed, 1);
  TaskSymmetry wrong = fixed_task.Symmetry();
  std::fill(wrong.partner.begin(), wrong.partner.end(), -1);  // claims the pairs are exchangeable
  const Basis broken = BuildBasis(wrong, 2, 1, Selection::kComplete);
  const InvarianceResult control_b = CheckInvariance(fixed_task, broken, broken, short_ladder);
  PrintLadder("control b (no C)", control_b);
  EXPECT_GE(control_b.max_matrix_plateau(), 0.01);
}

// SCIENCE.md C.6 item 7 (the SGD corollary): plain SGD from a point of the
// complete span leaves it only through minibatch noise, so rho after a fixed
// number of steps shrinks ~2x per 4x batch; averaging each minibatch
// gradient over random elements of the task's symmetry group (tokens
// relabelled within their classes, ids shifted) removes most of that noise.
// Measured (20 steps, lr 0.5, 8 group elements): rho 5.19e-3 / 2.51e-3 /
// 1.22e-3 at batch 64 / 256 / 1024 (ratios 2.07, 2.05); symmetrised 0.37-0.45
// of plain. Asserted: ratios in [1.5, 2.7], symmetrised < 0.6 x plain.
TEST(ScienceTest, SgdFromTheSpanLeavesItOnlyThroughNoise) {
  const AssocRecallConfig cfg = GradientCheckTask(/*common=*/8, /*rare_fraction=*/0.5);
  AssocRecallTask task(cfg, 1);
  const Basis complete = BuildBasis(task.Symmetry(), 2, 1, Selection::kComplete);
  SgdCorollaryConfig sc;
  const std::vector<SgdCorollaryPoint> points = SgdCorollary(task, complete, sc);
  ASSERT_EQ(points.size(), 3u);
  for (const SgdCorollaryPoint& p : points) {
    std::printf("batch %4lld: rho %.3e symmetrised %.3e\n", static_cast<long long>(p.batch_size), p.rho,
                p.rho_symmetrised);
  }
  for (size_t i = 1; i < points.size(); ++i) {
    const double ratio = points[i - 1].rho / points[i].rho;
    EXPECT_GE(ratio, 1.5) << "4x batch";
    EXPECT_LE(ratio, 2.7) << "4x batch";
  }
  for (const SgdCorollaryPoint& p : points) EXPECT_LT(p.rho_symmetrised, 0.6 * p.rho);
}

}  // namespace
}  // namespace circuitlab::engine
