// The task-vector paper's claims (SCIENCE.md E.11-E.17 with G.4's gates) on
// CPU-sized TV-micro fixtures: E1 biased dice, 2 pre-LN blocks, trained once
// per test binary and reused. Every geometry statistic is also computed on
// the untrained model of the same seed, the negative control G.4 asks for
// (those statistics partly measure the estimator, not learning).
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>

#include "server/engine/analysis/decoder_interventions.h"
#include "server/engine/analysis/task_vectors.h"
#include "server/engine/train/latent_trainer.h"
#include "tests/test_util/engine_util.h"

namespace circuitlab::engine {
namespace {

// TV-micro (SCIENCE.md E, G.4): E1 with S = 6, 3 majors, 48 tokens, AdamW
// 2e-3 with 10% warm-up and linear decay, batch 32.
v1::ExperimentSpec MicroSpec(int diversity, int d_model, int steps, const std::string& kind) {
  return testing::ResolvedSpec(R"({"seed": 10086, "task": {"latent": {"kind": ")" + kind + R"(", "diversity": )" +
                               std::to_string(diversity) + R"(}},
    "model": {"decoder": {"num_layers": 2, "d_model": )" + std::to_string(d_model) + R"(, "num_heads": 2}},
    "training": {"steps": )" + std::to_string(steps) + R"(, "learning_rate": 0.002, "weight_decay": 0.0001},
    "recording": {"eval_size": 128}})");
}

struct Fixture {
  v1::ExperimentSpec spec;
  std::unique_ptr<LatentTrainer> trained;
  std::unique_ptr<LatentTrainer> untrained;
  std::string early;  // checkpoint at 10% of training
  double seconds = 0;
};

// Trained once per (diversity, d_model, steps) and kept for the binary.
// `kind` is a C string: with a std::string parameter, every call with a
// literal passes a temporary, and GCC 14's -Wdangling-reference then assumes
// the returned reference may point into it.
const Fixture& GetFixture(int diversity, int d_model, int steps, const char* kind = "LATENT_KIND_DICE") {
  static std::map<std::tuple<int, int, int, std::string>, std::unique_ptr<Fixture>> cache;
  auto& slot = cache[{diversity, d_model, steps, kind}];
  if (!slot) {
    at::set_num_threads(1);
    slot = std::make_unique<Fixture>();
    slot->spec = MicroSpec(diversity, d_model, steps, kind);
    const auto start = std::chrono::steady_clock::now();
    slot->trained = std::make_unique<LatentTrainer>(slot->spec, std::vector<uint64_t>{10086}, torch::kCPU);
    while (slot->trained->step() < steps) {
      slot->trained->Step(false);
      if (slot->trained->step() == steps / 10) slot->early = slot->trained->SaveCheckpoint();
    }
    slot->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    slot->untrained = std::make_unique<LatentTrainer>(slot->spec, std::vector<uint64_t>{10086}, torch::kCPU);
    const auto eval = slot->trained->Evaluate()[0];
    std::cout << kind << " fixture kappa=" << diversity << " d=" << d_model << " steps=" << steps << ": "
              << slot->seconds << " s; id loss " << testing::MetricValue(eval, "eval/id/loss") << ", ood loss "
              << testing::MetricValue(eval, "eval/ood/loss") << "\n";
  }
  return *slot;
}

using TaskVectorRequest = v1::AnalyzeTaskVectorsRequest;
using TaskVectorReport = v1::AnalyzeTaskVectorsResponse;

double Row(const TaskVectorReport& r, const std::string& name, int layer, int64_t position = -1) {
  for (const v1::TaskVectorValue& row : r.values()) {
    if (row.name() == name && row.layer() == layer && row.position() == position) return row.value();
  }
  ADD_FAILURE() << "no row " << name << " layer " << layer << " position " << position;
  return std::nan("");
}

TaskVectorReport Analyze(const LatentTrainer& t, TaskVectorRequest r) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<TaskVectorReport> report = RunTaskVectorAnalyses(t.model(), t.task(0), r, nullptr, nullptr);
  EXPECT_TRUE(report.ok()) << report.status();
  std::cout << "  analysis: " << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
            << " s\n";
  return report.ok() ? *report : TaskVectorReport();
}

TaskVectorRequest Only(bool p012, bool p3, bool steering, bool ood, bool kl) {
  TaskVectorRequest r = testing::TaskVectorDefaults();
  for (const auto& [asked, name] :
       {std::pair{p012, "p0"}, std::pair{p012, "p1"}, std::pair{p012, "p2"}, std::pair{p3, "p3"},
        std::pair{steering, "steering"}, std::pair{ood, "ood_r2"}, std::pair{kl, "kl"}}) {
    if (asked) r.add_analyses(name);
  }
  return r;
}

// E.11-E.13: P0 stability, P1 additivity, P2 interpolation at the last
// layer, gated on learning (G.4).
TEST(TaskVectorScienceTest, GeometryP0P1P2) {
  const Fixture& f = GetFixture(-1, 32, 500);
  TaskVectorRequest r = Only(true, false, false, false, false);
  r.add_positions(4);
  r.add_positions(46);
  r.set_est_begin(36);
  r.set_est_end(46);
  const TaskVectorReport trained = Analyze(*f.trained, r), untrained = Analyze(*f.untrained, r);
  for (const auto* rep : {&trained, &untrained}) {
    std::cout << (rep == &trained ? "trained" : "untrained") << ": P0 ratio t=4 " << Row(*rep, "p0/resid_ratio", 1, 4)
              << " t=46 " << Row(*rep, "p0/resid_ratio", 1, 46) << "; eta2 task " << Row(*rep, "p1/eta2_task", 1, 46)
              << " int " << Row(*rep, "p1/eta2_int", 1, 46) << "; R2 task mean " << Row(*rep, "p2/r2_task_mean", 1)
              << " additive mean " << Row(*rep, "p2/r2_additive_mean", 1) << "\n";
  }
  // E.11: the residual ratio falls with context and ends small.
  EXPECT_LE(Row(trained, "p0/resid_ratio", 1, 46), 0.15);
  EXPECT_LT(Row(trained, "p0/resid_ratio", 1, 46), Row(trained, "p0/resid_ratio", 1, 4));
  // E.12: additive cell means.
  EXPECT_LE(Row(trained, "p1/eta2_int", 1, 46), 0.1);
  // G.4's learning gates: the task carries real variance, and task vectors
  // explain the states, where the untrained control cannot.
  EXPECT_GE(Row(trained, "p1/eta2_task", 1, 46), 0.3);
  EXPECT_GE(Row(trained, "p2/r2_task_mean", 1), 0.35);
  EXPECT_LT(Row(untrained, "p1/eta2_task", 1, 46), 0.2);
  EXPECT_LT(Row(untrained, "p2/r2_task_mean", 1), 0.2);
  // E.13 as written.
  EXPECT_GE(Row(trained, "p2/r2_additive_mean", 1), 0.8);
}

// E.14: the weights on the task vectors track the Bayesian posterior over
// the majors, for every major as the true task (G.4: 512 sequences each).
TEST(TaskVectorScienceTest, P3WeightsTrackThePosterior) {
  const Fixture& f = GetFixture(-1, 32, 500);
  TaskVectorRequest r = Only(false, true, false, false, false);
  r.add_layers(1);
  r.set_est_begin(30);
  r.set_est_end(46);
  const TaskVectorReport trained = Analyze(*f.trained, r), untrained = Analyze(*f.untrained, r);
  for (int k = 0; k < 3; ++k) {
    const std::string tag = "/task" + std::to_string(k);
    std::cout << "task " << k << ": r_mean " << Row(trained, "p3/r_mean" + tag, 1) << " (untrained "
              << Row(untrained, "p3/r_mean" + tag, 1) << "), L1 " << Row(trained, "p3/l1" + tag, 1) << ", beta(4) "
              << Row(trained, "p3/beta" + tag, 1, 4) << " beta(46) " << Row(trained, "p3/beta" + tag, 1, 46)
              << ", alpha(46) " << Row(trained, "p3/alpha" + tag, 1, 46) << "\n";
    EXPECT_GE(Row(trained, "p3/r_mean" + tag, 1), 0.85);
    // beta of the true task rises with the posterior.
    EXPECT_GT(Row(trained, "p3/beta" + tag, 1, 46), Row(trained, "p3/beta" + tag, 1, 4) + 0.1);
  }
  EXPECT_LT(Row(untrained, "p3/r_mean_min", 1), 0.85);
}

// E.15: injecting sum_j alpha_j theta_j makes the output follow the mixture
// law, at the same hook and in paper_compat mode (estimated post_mlp,
// injected post_attn).
TEST(TaskVectorScienceTest, SteeringAlongTheSimplex) {
  const Fixture& f = GetFixture(-1, 32, 500);
  TaskVectorRequest r = Only(false, false, true, false, false);
  r.set_steer_begin(16);
  r.set_steer_end(31);
  const TaskVectorReport same = Analyze(*f.trained, r), control = Analyze(*f.untrained, r);
  r.set_estimation_hook("post_mlp");
  const TaskVectorReport compat = Analyze(*f.trained, r);
  r.set_estimation_hook("post_attn");
  r.set_steering_subtract("projection");
  const TaskVectorReport projection = Analyze(*f.trained, r);
  for (const auto* rep : {&same, &compat, &projection, &control}) {
    std::cout << (rep == &same ? "same hook" : rep == &compat ? "paper_compat" : rep == &projection ? "projection (E3 variant)" : "untrained") << ": KL base "
              << Row(*rep, "steering/kl_base", 1) << " inj " << Row(*rep, "steering/kl_inj", 1) << " mode "
              << Row(*rep, "steering/kl_mode", 1) << "\n";
  }
  for (const auto* rep : {&same, &compat, &projection}) {
    EXPECT_LE(Row(*rep, "steering/kl_inj", 1), 0.5 * Row(*rep, "steering/kl_base", 1));
    EXPECT_LT(Row(*rep, "steering/kl_inj", 1), Row(*rep, "steering/kl_mode", 1));
  }
  EXPECT_GT(Row(control, "steering/ratio", 1), 0.5);  // an untrained model cannot be steered
}

// The same steering as a declarative Intervene op (D.6 replace_convex): the
// whole window 16-31 edited in one pass, KL to q_lambda over those positions.
TEST(TaskVectorScienceTest, ReplaceConvexInterveneSteers) {
  const Fixture& f = GetFixture(-1, 32, 500);
  for (const std::string subtract : {"true_task", "projection"}) {
    v1::InterveneRequest req;
    v1::Intervention& op = *req.add_interventions();
    op.set_op(v1::Intervention::OP_REPLACE_CONVEX);
    op.set_hook("L1.post_attn");
    op.set_subtract(subtract);
    for (uint32_t p = 16; p <= 31; ++p) op.add_positions(p);
    req.add_eval_sets("id");
    req.set_n_eval(1024);
    req.set_seed(1);
    auto trained = InterveneDecoder(f.trained->model(), f.trained->task(0), req);
    auto untrained = InterveneDecoder(f.untrained->model(), f.untrained->task(0), req);
    ASSERT_TRUE(trained.ok()) << trained.status();
    ASSERT_TRUE(untrained.ok()) << untrained.status();
    const v1::InterventionEffect& e = trained->effects(0);
    const v1::InterventionEffect& u = untrained->effects(0);
    std::cout << subtract << ": KL(model || q_lambda) over 16-31 clean " << e.kl_ref_clean() << " -> steered "
              << e.kl_ref() << " (untrained " << u.kl_ref_clean() << " -> " << u.kl_ref() << ")\n";
    EXPECT_EQ(e.ref_name(), "mixture");
    EXPECT_LE(e.kl_ref(), 0.5 * e.kl_ref_clean());
    EXPECT_GT(u.kl_ref(), 0.5 * u.kl_ref_clean());
  }
}

}  // namespace
}  // namespace circuitlab::engine

namespace circuitlab::engine {
namespace {

// E.16 and E.17 on fixtures trained at three task diversities (G.4: d 48,
// 1500 steps).
TEST(TaskVectorScienceTest, OodStatesLeaveTheTaskSubspaceAndModesSwitch) {
  const std::vector<int> kappas = {-1, 3, 8};
  std::vector<double> code, norm, ratio;
  for (int kappa : kappas) {
    const Fixture& f = GetFixture(kappa, 48, 1500);
    TaskVectorRequest r = Only(false, false, false, true, true);
    r.add_layers(1);
    const TaskVectorReport rep = Analyze(*f.trained, r);
    code.push_back(Row(rep, "ood_r2/code", 1));
    norm.push_back(Row(rep, "ood_r2/norm", 1));
    // Reported only (E.16): the same at 10% of training.
    LatentTrainer early(f.spec, {10086}, torch::kCPU);
    ASSERT_TRUE(early.LoadCheckpoint(f.early).ok());
    TaskVectorRequest ro = Only(false, false, false, true, false);
    ro.add_layers(1);
    const double early_r2 = Row(Analyze(early, ro), "ood_r2/code", 1);
    std::cout << "kappa " << kappa << " at step " << early.step() << ": OOD R2 (code) " << early_r2 << "\n";
    ratio.push_back(Row(rep, "kl/log10_ratio", -1));
    std::cout << "kappa " << kappa << ": OOD R2 code " << code.back() << " (IQR " << Row(rep, "ood_r2/code_q25", 1)
              << "-" << Row(rep, "ood_r2/code_q75", 1) << "), norm " << norm.back() << "; KL exact "
              << Row(rep, "kl/exact", -1) << " extrap " << Row(rep, "kl/extrap", -1) << " log10 ratio "
              << ratio.back() << "\n";
  }
  // E.16 (G.4): strict ordering in kappa with a drop of at least 0.15.
  EXPECT_GT(code[0], code[1]);
  EXPECT_GT(code[1], code[2]);
  EXPECT_GE(code[0] - code[2], 0.15);
  EXPECT_GT(norm[0], norm[2]);
  // E.17 (G.4): retrieval (negative) without minors, extrapolation
  // (positive) at high diversity.
  EXPECT_LT(ratio[0], 0.0);
  EXPECT_GT(ratio[2], 0.0);
}

}  // namespace
}  // namespace circuitlab::engine

namespace circuitlab::engine {
namespace {

// E.18 (G.4 gates) and E.20 (reported) on the high-diversity fixture.
TEST(TaskVectorScienceTest, DoubleDissociation) {
  const Fixture& f = GetFixture(8, 48, 1500);
  TaskVectorRequest r = Only(false, false, false, false, false);
  r.add_analyses("dissociation");
  r.set_probe_begin(24);
  const TaskVectorReport rep = Analyze(*f.trained, r);
  auto pct = [&](const std::string& what, const std::string& group) {
    return Row(rep, "dissociation/" + what + "/" + group + "/pct", 1);
  };
  for (const std::string what : {"task", "vopt", "random1", "random3"}) {
    std::cout << what << ": dCE% major " << pct(what, "major") << " ood " << pct(what, "ood") << " minor "
              << pct(what, "minor") << "\n";
  }
  std::cout << "probe R2 " << Row(rep, "dissociation/probe_r2", 1) << ", task rank "
            << Row(rep, "dissociation/task_rank", 1) << ", protected " << Row(rep, "dissociation/protected_dims", 1)
            << ", opt steps " << Row(rep, "dissociation/opt_steps", 1) << "\n";
  std::cout << "E.20: R2(CLR -> V_opt h) " << Row(rep, "stats/r2_vopt", 1) << " (with token "
            << Row(rep, "stats/r2_vopt_with_token", 1) << "), random " << Row(rep, "stats/r2_random", 1)
            << ", task direction " << Row(rep, "stats/r2_task", 1) << "\n";
  // Task removal hurts the majors, spares OOD.
  EXPECT_GE(pct("task", "major"), 10.0);
  EXPECT_GE(pct("task", "major"), 1.5 * pct("task", "ood"));
  // V_opt removal hurts OOD, spares the majors; random directions do little.
  EXPECT_GE(pct("vopt", "ood"), 3.0 * pct("vopt", "major"));
  EXPECT_GE(pct("vopt", "ood"), 3.0 * std::max(pct("random1", "ood"), 0.5));
}

}  // namespace
}  // namespace circuitlab::engine

namespace circuitlab::engine {
namespace {

// E.19 (G.4): on planted Dyck the state keeps the whole prefix, so cells of
// the last 3 planted symbols leave most of its variance unexplained, while
// the full prefix (the task) explains it; E1's P0 ratio (E.11) is <= 0.15.
TEST(TaskVectorScienceTest, PlantedDyckFailsP0) {
  const Fixture& f = GetFixture(6, 48, 1500, "LATENT_KIND_DYCK");
  TaskVectorRequest r = Only(false, false, false, false, false);
  r.add_analyses("dyck_p0");
  r.add_layers(1);
  // (The untrained model measured 0.066 / 0.065: its state is the current
  // planted symbol; not rerun here to save CI time.)
  const TaskVectorReport trained = Analyze(*f.trained, r);
  std::cout << "last-3 tail ratio " << Row(trained, "dyck/last_k_tail_mean", 1) << ", full prefix "
            << Row(trained, "dyck/prefix_tail_mean", 1) << " over " << Row(trained, "dyck/common_positions", 1)
            << " common planted positions\n";
  EXPECT_GE(Row(trained, "dyck/last_k_tail_mean", 1), 0.25);
  EXPECT_LE(Row(trained, "dyck/prefix_tail_mean", 1), 0.15);
}

}  // namespace
}  // namespace circuitlab::engine
