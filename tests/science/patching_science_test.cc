// Science tests of SCIENCE.md D.6's patch_effect and of D.3's labels on
// models with several heads per layer. Margins from measured runs (README,
// closing notes).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>

#include "server/engine/analysis/imir_analyses.h"
#include "server/engine/spec.h"
#include "server/engine/train/trainer.h"
#include "tests/test_util/engine_util.h"

namespace circuitlab::engine {
namespace {

// examples/induction.json (the README's demo run): imir-2L on associative
// recall with commons, SGD lr 8, batch 256, 600 steps.
std::string TrainedDemo(v1::ExperimentSpec* spec_out) {
  const v1::ExperimentSpec spec = testing::ResolvedSpec(R"({
    "seed": 7,
    "task": {"associative_recall": {"num_common": 8, "num_rare": 24, "num_heldout": 8, "num_blocks": 6,
        "block_length": 2, "position_mode": "POSITION_MODE_BLOCK_OFFSET", "num_positions": 16}},
    "data": {"rare_fraction": 0.5, "variability": 0.0, "zipf_exponent": 0.0, "burstiness": 1},
    "model": {"imir": {"num_layers": 2, "num_heads": 1, "init": "INIT_SCHEME_NORMAL", "init_std": 0.01}},
    "training": {"optimizer": "OPTIMIZER_KIND_SGD", "learning_rate": 8.0, "batch_size": 256, "steps": 600},
    "recording": {"eval_size": 1024}
  })");
  EnsembleTrainer trainer(spec, {spec.seed()}, torch::kCPU);
  while (trainer.step() < trainer.total_steps()) trainer.Step(false);
  *spec_out = spec;
  return trainer.SaveCheckpoint();
}

// D.6 patch_effect on the demo run, icl_rare patched from iwl sequences
// (the README's OP_PATCH figure 0.976 -> 0.091 as a normalised effect).
// Measured (seed 7, n_eval 1024, T 14: blocks (x, y) at 1-2 .. 11-12, the
// query at 13): base accuracy 0.9756, source 0.0000 (iwl sequences scored
// on icl_rare's answers), loss 0.202 / 8.92. L1.H1.out at every position:
// accuracy 0.0908, effect 0.907 (loss effect 0.368); alone, each block's y
// position (2, 4, .., 12) 0.143-0.196, every other position |effect| <=
// 0.006 (the query 0.006). L2.attn: the query row 0.863, every other row
// exactly 0 (the last layer is read at the query only). Asserted with
// margins: the all-at-once effect >= 0.8 (loss >= 0.3); every y position
// >= 0.1, every other <= 0.05; L2.attn's query row >= 0.8, the others
// <= 0.01; the all-at-once site is exactly OP_PATCH.
TEST(PatchingScienceTest, PreviousTokenHeadOutputCarriesInContextRecall) {
  v1::ExperimentSpec spec;
  const std::string ckpt = TrainedDemo(&spec);
  v1::InterveneRequest req;
  req.set_n_eval(1024);
  req.set_seed(spec.seed());
  req.set_selection(v1::BASIS_SELECTION_PAPER);
  req.add_eval_sets("icl_rare");
  req.mutable_patch()->add_hooks("L1.H1.out");
  req.mutable_patch()->add_hooks("L2.attn");
  req.mutable_patch()->set_reference_set("iwl");
  absl::StatusOr<v1::InterveneResponse> r = ImirIntervene(spec, ckpt, req, {});
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::InterventionEffect& e = r->effects(0);
  std::printf("base accuracy %.4f loss %.4f, source accuracy %.4f loss %.4f\n", e.accuracy_clean(), e.loss_clean(),
              e.patch_source_accuracy(), e.patch_source_loss());
  std::map<std::pair<std::string, int>, v1::PatchSite> sites;
  for (const v1::PatchSite& s : e.patch()) {
    std::printf("  %-10s %3d accuracy %.4f effect %.3f  loss %.4f effect %.3f\n", s.hook().c_str(), s.position(),
                s.accuracy(), s.effect_accuracy(), s.loss(), s.effect_loss());
    sites[{s.hook(), s.position()}] = s;
  }
  const int64_t T = static_cast<int64_t>(e.patch_size() / 2) - 1;  // positions swept per hook
  ASSERT_EQ(e.patch_size(), 2 * (T + 1));
  EXPECT_GE(e.accuracy_clean(), 0.9);
  EXPECT_LE(e.patch_source_accuracy(), 0.1);
  const v1::PatchSite& all = sites[{"L1.H1.out", -1}];
  EXPECT_GE(all.effect_accuracy(), 0.8);
  EXPECT_GE(all.effect_loss(), 0.3);
  // The previous-token head matters where it writes "my previous token is x"
  // for the induction head to find: the y of each block.
  auto effect_at = [&](const std::string& hook, int t) { return sites[{hook, t}].effect_accuracy(); };
  for (int t = 0; t < T; ++t) {
    const double effect = effect_at("L1.H1.out", t);
    const bool block_y = t >= 2 && t <= T - 2 && t % 2 == 0;
    if (block_y) {
      EXPECT_GE(effect, 0.1) << "position " << t;
    } else {
      EXPECT_LE(std::abs(effect), 0.05) << "position " << t;
    }
    EXPECT_LE(std::abs(effect_at("L2.attn", t)), t == T - 1 ? 1.0 : 0.01) << "position " << t;
  }
  EXPECT_GE(effect_at("L2.attn", static_cast<int>(T - 1)), 0.8);

  // The all-at-once site is OP_PATCH from the same source sequences.
  v1::InterveneRequest op = req;
  op.clear_patch();
  v1::Intervention* patch = op.add_interventions();
  patch->set_op(v1::Intervention::OP_PATCH);
  patch->set_hook("L1.H1.out");
  patch->set_reference_set("iwl");
  absl::StatusOr<v1::InterveneResponse> same = ImirIntervene(spec, ckpt, op, {});
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->effects(0).accuracy(), all.accuracy());
  EXPECT_NEAR(same->effects(0).loss(), all.loss(), 1e-9);
}

struct TwoHeadRun {
  std::string pair;
  std::map<std::string, double> per_head;
  double icl_rare = 0;
  int64_t stopped = 0;
};

// imir-2L with two heads per layer, a coordinate model over the paper basis
// (unit norm, zero init) seeded with one previous-token -> induction pair
// (prev, match, out = 0.5), on associative recall without commons (V_r 24,
// n 6, P 16); SGD lr 8, batch 64, stopped at icl_rare >= 0.95 (<= 1500).
TwoHeadRun TrainTwoHeads(int64_t prev_head, int64_t induction_head) {
  const std::string h = std::to_string(prev_head), g = std::to_string(induction_head);
  const std::string block = prev_head == 1 ? "(1,0)" : "(2,0)";     // what head h of layer 1 wrote
  const std::string out = induction_head == 1 ? "(0,1)" : "(0,2)";  // what head g of layer 2 wrote
  const v1::ExperimentSpec spec = testing::ResolvedSpec(R"({
    "seed": 1,
    "task": {"associative_recall": {"num_common": 0, "num_rare": 24, "num_heldout": 8, "num_blocks": 6,
        "block_length": 2, "position_mode": "POSITION_MODE_BLOCK_OFFSET", "num_positions": 16}},
    "data": {"rare_fraction": 1.0, "burstiness": 1},
    "model": {"imir": {"num_layers": 2, "num_heads": 2, "parameterisation": "PARAMETERISATION_COORDINATES",
        "coordinate_basis": "BASIS_SELECTION_PAPER", "coordinate_scaling": "COORDINATE_SCALING_UNIT_NORM",
        "init": "INIT_SCHEME_ZERO", "initial_coordinates": {"L1H)" +
                                                        h + R"(:[∅→∅]:S_1": 0.5,
        "L2H)" + g + R"(:[∅→)" + block + R"(]:I_t": 0.5, "OUT:[)" +
                                                        out + R"(]:I": 0.5}}},
    "training": {"optimizer": "OPTIMIZER_KIND_SGD", "learning_rate": 8, "batch_size": 64, "steps": 1500},
    "recording": {"eval_size": 512}
  })");
  EnsembleTrainer trainer(spec, {spec.seed()}, torch::kCPU);
  TwoHeadRun run;
  while (trainer.step() < trainer.total_steps()) {
    trainer.Step(false);
    if (trainer.step() % 10 != 0) continue;
    run.icl_rare = testing::MetricValue(trainer.Evaluate()[0], "eval/icl_rare/accuracy");
    if (run.icl_rare >= 0.95) break;
  }
  run.stopped = trainer.step();
  v1::LabelRunRequest request;
  request.set_n_eval(1024);
  absl::StatusOr<v1::LabelRunResponse> label =
      ImirLabelRun(spec, {{trainer.step(), trainer.SaveCheckpoint()}}, request, {}, nullptr);
  EXPECT_TRUE(label.ok()) << label.status();
  if (!label.ok()) return run;
  run.pair = label->pair();
  const v1::CheckpointLabel& last = label->checkpoints(label->checkpoints_size() - 1);
  run.per_head.insert(last.per_head_ablation().begin(), last.per_head_ablation().end());
  std::printf("seeded L1H%s -> L2H%s: stop %lld icl_rare %.4f pair %s; heads alone:", h.c_str(), g.c_str(),
              static_cast<long long>(run.stopped), run.icl_rare, run.pair.c_str());
  for (const auto& [name, share] : run.per_head) std::printf(" %s %.2f", name.c_str(), share);
  std::printf("\n  pair paths:");
  for (const auto& [name, share] : last.pair_ablation()) std::printf(" %s %.2f", name.c_str(), share);
  std::printf("\n");
  return run;
}

// D.3 over every head: a two-head model seeded with the pair (L1H2, L2H1),
// and its mirror (L1H1, L2H2), learn in-context recall through that pair;
// the label names it by head, and ablating its heads alone removes the
// behaviour while the other layer-1 head does not. (Head 1 alone, as the
// label read before, names neither.) Measured (seed 1): both stop at step
// 150 with icl_rare 0.971 and are labelled by the seeded pair; each head
// alone removes L1H2 0.97, L2H1 0.68, L1H1 0.01, L2H2 0.00 of the accuracy
// above chance (mirrored for the mirror); the pair's path 0.79, the three
// other pairs' <= 0.01. Asserted: the pair's name, its heads >= 0.5 each,
// the other layer-1 head <= 0.2.
TEST(PatchingScienceTest, LabelRunNamesTheHeadPairOfATwoHeadModel) {
  for (const auto& [prev, induction] : {std::pair<int64_t, int64_t>{2, 1}, std::pair<int64_t, int64_t>{1, 2}}) {
    const TwoHeadRun run = TrainTwoHeads(prev, induction);
    const std::string p = "L1H" + std::to_string(prev), g = "L2H" + std::to_string(induction);
    const std::string other = "L1H" + std::to_string(3 - prev);
    ASSERT_GE(run.icl_rare, 0.9) << "inconclusive: the two-head model did not learn in-context recall";
    EXPECT_EQ(run.pair, p + "-" + g);
    EXPECT_GE(run.per_head.at(p), 0.5);
    EXPECT_GE(run.per_head.at(g), 0.5);
    EXPECT_LE(run.per_head.at(other), 0.2);
  }
}

}  // namespace
}  // namespace circuitlab::engine
