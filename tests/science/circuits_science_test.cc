// Science tests of the circuit analyses (SCIENCE.md D.1, D.6) on the trained
// minimal-ICL model of E.4: detection recovers the induction head alpha,
// beta, gamma; interventions on it break in-context behaviour. Margins from
// measured runs (README, closing notes).
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <set>

#include "server/engine/analysis/imir_analyses.h"
#include "server/engine/spec.h"
#include "server/engine/train/trainer.h"
#include "tests/test_util/engine_util.h"

namespace circuitlab::engine {
namespace {

// E.4's configuration (19-coordinate paper model, unit norm, zero init, SGD
// lr 20, MSE, batch 512, N = 8), trained until test accuracy >= 0.95.
std::string TrainedMinimalIcl(v1::ExperimentSpec* spec_out) {
  const v1::ExperimentSpec spec = testing::ResolvedSpec(R"({
    "seed": 1,
    "task": {"minimal_icl": {"num_pairs": 8}},
    "model": {"imir": {"num_layers": 2, "num_heads": 1, "parameterisation": "PARAMETERISATION_COORDINATES",
                       "init": "INIT_SCHEME_ZERO"}},
    "training": {"optimizer": "OPTIMIZER_KIND_SGD", "learning_rate": 20, "batch_size": 512, "steps": 600,
                 "loss": "LOSS_KIND_MSE"},
    "recording": {"eval_size": 2048}
  })");
  EnsembleTrainer trainer(spec, {spec.seed()}, torch::kCPU);
  while (trainer.step() < trainer.total_steps()) {
    trainer.Step(false);
    if (trainer.step() % 25 == 0 && testing::MetricValue(trainer.Evaluate()[0], "eval/test/accuracy") >= 0.95) break;
  }
  std::printf("trained to step %lld\n", static_cast<long long>(trainer.step()));
  *spec_out = spec;
  return trainer.SaveCheckpoint();
}

// D.1's defaults, as the scheduler resolves them (analyses/detect_circuit.cc).
v1::DetectCircuitRequest DetectDefaults(uint64_t seed) {
  v1::DetectCircuitRequest req;
  req.set_n_eval(2048);
  req.set_metric("accuracy");
  req.set_tolerance(0.01);
  req.set_order("magnitude_asc");
  req.set_prepass_eps(1e-3);
  req.set_max_passes(3);
  req.set_selection(v1::BASIS_SELECTION_PAPER);
  req.set_max_evals(5000);
  req.set_seed(seed);
  return req;
}

// D.1 with its defaults on `ckpt`, the summary printed.
absl::StatusOr<v1::DetectCircuitResponse> DetectAndPrint(const v1::ExperimentSpec& spec, const std::string& ckpt) {
  absl::StatusOr<v1::DetectCircuitResponse> r = ImirDetectCircuit(spec, ckpt, DetectDefaults(spec.seed()), {}, nullptr);
  if (r.ok()) {
    std::printf("eval %s: dense %.4f ref %.4f circuit %.4f, %d of %u kept, %u evaluations, template '%s'\n",
                r->eval_set().c_str(), r->m_dense(), r->m_ref(), r->m_circuit(), r->circuit_size(), r->candidates(),
                r->evaluations(), r->template_name().c_str());
  }
  return r;
}

// An Intervene request of one op on `eval_set`, as the scheduler resolves it.
v1::InterveneRequest OneOp(const v1::Intervention& op, const std::string& eval_set, uint64_t seed) {
  v1::InterveneRequest iv;
  iv.set_n_eval(2048);
  iv.set_seed(seed);
  iv.set_selection(v1::BASIS_SELECTION_PAPER);
  iv.add_eval_sets(eval_set);
  *iv.add_interventions() = op;
  return iv;
}

v1::LabelRunRequest LabelDefaults() {
  v1::LabelRunRequest req;
  req.set_n_eval(1024);
  return req;
}

// Measured (seed 1, trained to step 275, 17 s): m_dense = m_ref = m(K*) =
// 1.000; K* = {beta, alpha, gamma} exactly (3 of 19 kept, 27 evaluations);
// the induction-head template on layers (1, 2). Zeroing beta or ablating the
// layer-1 head: accuracy 1.000 -> 0.000 (KL to the clean model only 0.012:
// the MSE-trained logits are small). Asserted: the template with all three
// elements, at most 6 coordinates kept, m(K*) >= m_ref - tolerance; each
// intervention leaves accuracy <= 0.5.
TEST(CircuitScienceTest, DetectionRecoversTheInductionHeadOfTheMinimalIclModel) {
  v1::ExperimentSpec spec;
  const std::string ckpt = TrainedMinimalIcl(&spec);
  absl::StatusOr<v1::DetectCircuitResponse> r = DetectAndPrint(spec, ckpt);
  ASSERT_TRUE(r.ok()) << r.status();
  std::set<std::string> kept;
  for (const v1::CircuitCoordinate& m : r->circuit()) {
    std::printf("  %-24s %-6s %-9s value %8.4f necessity %.4f\n", m.coordinate().label().c_str(),
                m.coordinate().canonical().c_str(), m.role().c_str(), m.coordinate().value(), m.necessity());
    if (!m.coordinate().canonical().empty()) kept.insert(m.coordinate().canonical());
  }
  EXPECT_EQ(r->template_name(), "induction_head");
  EXPECT_EQ(std::vector<uint32_t>(r->template_layers().begin(), r->template_layers().end()),
            (std::vector<uint32_t>{1, 2}));
  for (const char* name : {"alpha", "beta", "gamma"}) EXPECT_TRUE(kept.count(name)) << name;
  EXPECT_LE(r->circuit_size(), 6);
  EXPECT_GE(r->m_circuit(), r->m_ref() - DetectDefaults(1).tolerance());
  EXPECT_GE(r->m_ref(), 0.95);
  EXPECT_FALSE(r->projection_not_faithful());

  // Interventions (D.6): zeroing beta or ablating the layer-1 head removes
  // in-context recall; scaling gamma by 1 changes nothing.
  v1::Intervention op;
  op.set_op(v1::Intervention::OP_ZERO_COORDINATE);
  op.add_coordinates("beta");
  absl::StatusOr<v1::InterveneResponse> zero_beta =
      ImirIntervene(spec, ckpt, OneOp(op, r->eval_set(), spec.seed()), {});
  ASSERT_TRUE(zero_beta.ok()) << zero_beta.status();
  v1::Intervention head;
  head.set_op(v1::Intervention::OP_ABLATE_HEAD);
  head.set_layer(1);
  absl::StatusOr<v1::InterveneResponse> no_head =
      ImirIntervene(spec, ckpt, OneOp(head, r->eval_set(), spec.seed()), {});
  ASSERT_TRUE(no_head.ok()) << no_head.status();
  std::printf("accuracy clean %.4f, beta zeroed %.4f, layer-1 head ablated %.4f\n",
              zero_beta->effects(0).accuracy_clean(), zero_beta->effects(0).accuracy(), no_head->effects(0).accuracy());
  EXPECT_LE(zero_beta->effects(0).accuracy(), 0.5);
  EXPECT_LE(no_head->effects(0).accuracy(), 0.5);
}

}  // namespace
}  // namespace circuitlab::engine

namespace circuitlab::engine {
namespace {

struct TicketRun {
  int64_t t_icl = -1;   // first evaluated step with icl_rare accuracy >= 0.5
  int64_t stopped = 0;  // step at which icl_rare accuracy reached 0.95 (or the last)
  double icl_rare = 0, iwl = 0;
  std::string label;
};

TicketRun TrainTicket(const std::string& model_json) {
  const v1::ExperimentSpec spec = testing::ResolvedSpec(R"({
    "seed": 1,
    "task": {"associative_recall": {"num_common": 8, "num_rare": 24, "num_heldout": 8, "num_blocks": 6,
        "block_length": 2, "position_mode": "POSITION_MODE_BLOCK_OFFSET", "num_positions": 16}},
    "data": {"rare_fraction": 0.5, "variability": 0.0, "burstiness": 1},
    "model": {"imir": )" + model_json + R"(},
    "training": {"optimizer": "OPTIMIZER_KIND_SGD", "learning_rate": 2.0, "batch_size": 256, "steps": 4000},
    "recording": {"eval_size": 512}
  })");
  EnsembleTrainer trainer(spec, {spec.seed()}, torch::kCPU);
  TicketRun run;
  while (trainer.step() < trainer.total_steps()) {
    trainer.Step(false);
    if (trainer.step() % 25 != 0) continue;
    const auto m = trainer.Evaluate()[0];
    run.icl_rare = testing::MetricValue(m, "eval/icl_rare/accuracy");
    run.iwl = testing::MetricValue(m, "eval/iwl/accuracy");
    if (run.t_icl < 0 && run.icl_rare >= 0.5) run.t_icl = trainer.step();
    if (run.icl_rare >= 0.95) break;
  }
  run.stopped = trainer.step();
  absl::StatusOr<v1::LabelRunResponse> label =
      ImirLabelRun(spec, {{trainer.step(), trainer.SaveCheckpoint()}}, LabelDefaults(), {}, nullptr);
  EXPECT_TRUE(label.ok()) << label.status();
  run.label = label.ok() ? label->label() : "";
  return run;
}

// SCIENCE.md E.8 with G.5: imir-2L with common pairs, f_r = 0.5, f_v = 0,
// b = 1, unit-norm coordinates, SGD lr 2, batch 256, until icl_rare >= 0.95
// (<= 4000 steps); (a) the dense model (N(0, 0.01^2)), (b) the 28-coordinate
// paper model and (c) the four-coordinate ticket, both initialised at the
// projection of (a)'s init. Measured (seed 1, through the server): t_ICL (first
// icl_rare >= 0.5, evaluated every 25 steps) 1375 / 2600 / 2550, stop at 1675 /
// 2925 / 2675; icl_rare 0.954 / 0.955 / 0.959, iwl 1.0 each; every run
// labelled BOTH_IWL_WINS. Asserted (G.5): t_ICL(c) / t_ICL(b) in [0.67, 1.5]
// (measured 0.98), final accuracies of (c) within 0.05 of (b) and of (a),
// the same D.2 label as (a). Reported only: t_ICL(c) / t_ICL(a) (1.85; G.5
// measured 2.18).
TEST(CircuitScienceTest, FourCoordinateTicketTracksTheFullModel) {
  const TicketRun dense = TrainTicket(R"({"num_layers": 2, "num_heads": 1, "init": "INIT_SCHEME_NORMAL",
      "init_std": 0.01})");
  const TicketRun full = TrainTicket(R"({"num_layers": 2, "num_heads": 1, "init": "INIT_SCHEME_PROJECTED",
      "parameterisation": "PARAMETERISATION_COORDINATES"})");
  const TicketRun ticket = TrainTicket(R"({"num_layers": 2, "num_heads": 1, "init": "INIT_SCHEME_PROJECTED",
      "parameterisation": "PARAMETERISATION_COORDINATES", "coordinates": ["alpha", "beta", "gamma", "delta"]})");
  for (const auto& [name, r] : {std::pair{"dense", dense}, std::pair{"28-coordinate", full}, std::pair{"ticket", ticket}}) {
    std::printf("%-14s t_ICL %5lld stop %5lld icl_rare %.4f iwl %.4f label %s\n", name,
                static_cast<long long>(r.t_icl), static_cast<long long>(r.stopped), r.icl_rare, r.iwl, r.label.c_str());
  }
  ASSERT_GT(full.t_icl, 0);
  ASSERT_GT(ticket.t_icl, 0);
  ASSERT_GT(dense.t_icl, 0);
  const double ratio = static_cast<double>(ticket.t_icl) / static_cast<double>(full.t_icl);
  std::printf("t_ICL ticket / 28-coordinate %.3f; ticket / dense %.3f\n", ratio,
              static_cast<double>(ticket.t_icl) / static_cast<double>(dense.t_icl));
  EXPECT_GE(ratio, 0.67);
  EXPECT_LE(ratio, 1.5);
  for (const TicketRun* other : {&full, &dense}) {
    EXPECT_NEAR(ticket.icl_rare, other->icl_rare, 0.05);
    EXPECT_NEAR(ticket.iwl, other->iwl, 0.05);
  }
  EXPECT_EQ(ticket.label, dense.label);
  EXPECT_FALSE(ticket.label.empty());
}

}  // namespace
}  // namespace circuitlab::engine

// SCIENCE.md E.10 and E.9 are decided by their recipes (examples/reproduce/)
// in reproduction_science_test.cc.
