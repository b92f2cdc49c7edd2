// circuitlab detect RUN [--step S] [--eval-set E] [--metric M] [--tolerance T] [--order O] ...
#include <cstdio>

#include "client/cli/commands/commands.h"
#include "client/lib/text_format.h"

namespace circuitlab::cli {
namespace {
namespace detect_cmd {

struct Options {
  std::string run_id, eval_set, metric, order;
  uint64_t step = 0;
  double tolerance = 0;
  uint32_t n_eval = 0, max_evals = 0;
  bool complete = false, force = false;
};

void PrintTemplate(const v1::DetectCircuitResponse& resp) {
  std::string layers;
  for (uint32_t l : resp.template_layers()) layers += (layers.empty() ? "" : ",") + std::to_string(l);
  std::printf("template: %s%s\n", resp.template_name().empty() ? "none recognised" : resp.template_name().c_str(),
              layers.empty() ? "" : (" (layers " + layers + ")").c_str());
  for (const auto& e : resp.template_elements()) {
    std::printf("  %s %s %s\n", e.found() ? "[x]" : "[ ]", client::Pad(e.label(), 30).c_str(), e.canonical().c_str());
  }
}

void PrintCircuit(const v1::DetectCircuitResponse& resp) {
  std::printf("%s %-6s %-9s %10s %10s %10s\n", client::Pad("COORDINATE", 30).c_str(), "NAME", "ROLE", "VALUE",
              "MAGNITUDE", "NECESSITY");
  for (const auto& c : resp.circuit()) {
    std::printf("%s %-6s %-9s %10.4f %10.4f %10.4f", client::Pad(c.coordinate().label(), 30).c_str(),
                c.coordinate().canonical().c_str(), c.role().c_str(), c.coordinate().value(),
                c.coordinate().magnitude(), c.necessity());
    if (c.irrelevant_mass_delta_size() > 0) {
      std::printf("  irrelevant-key mass without it:");
      for (double v : c.irrelevant_mass_delta()) std::printf(" %+.3f", v);
    }
    std::printf("\n");
  }
  if (resp.irrelevant_mass_size() > 0) {
    std::printf("irrelevant-key attention mass per layer with the circuit:");
    for (double v : resp.irrelevant_mass()) std::printf(" %.3f", v);
    std::printf("\n");
  }
}

int Run(Context& ctx, const Options& o) {
  v1::DetectCircuitRequest req;
  req.set_run_id(o.run_id);
  req.set_step(o.step);
  req.set_eval_set(o.eval_set);
  req.set_metric(o.metric);
  req.set_tolerance(o.tolerance);
  req.set_order(o.order);
  req.set_n_eval(o.n_eval);
  req.set_max_evals(o.max_evals);
  req.set_selection(o.complete ? v1::BASIS_SELECTION_COMPLETE : v1::BASIS_SELECTION_PAPER);
  v1::DetectCircuitResponse resp;
  auto call = [&](bool force) {
    req.set_force(force);
    return ctx.client.RunAnalysis<v1::DetectCircuitResponse>(req);
  };
  if (auto rc = RunAnalysis(ctx, "circuit detection", o.force, call, &resp)) return *rc;
  std::printf("%s step %llu, %s on %s%s\n", o.run_id.c_str(), static_cast<unsigned long long>(resp.step()),
              resp.metric().c_str(), resp.eval_set().c_str(), resp.from_store() ? "  (stored answer)" : "");
  std::printf("dense %.4f   all coordinates %.4f   circuit %.4f   (%u of %u coordinates kept, %u evaluations%s)\n",
              resp.m_dense(), resp.m_ref(), resp.m_circuit(), resp.circuit_size(), resp.candidates(),
              resp.evaluations(), resp.budget_exhausted() ? ", budget exhausted" : "");
  if (resp.projection_not_faithful()) {
    std::printf("note: the projection is not faithful (|dense - all coordinates| > 0.05): the circuit describes "
                "the projected model\n");
  }
  PrintTemplate(resp);
  PrintCircuit(resp);
  return 0;
}

}  // namespace detect_cmd
}  // namespace

void AddDetect(CLI::App& app, Action* chosen) {
  auto o = std::make_shared<detect_cmd::Options>();
  CLI::App* sub =
      AddVerb(app, chosen, "detect",
              "Automatic circuit detection (SCIENCE.md D.1): project the checkpoint onto the IMIR basis, ablate\n"
              "coordinates greedily while the metric stays within --tolerance, and name the minimal circuit left:\n"
              "its coordinates, their roles (canonical / aiding / shortcut), the template recognised.\n"
              "An analysis job on the server; this command waits and shows progress.\n"
              "  circuitlab detect r3\n  circuitlab detect r3 --metric loss --tolerance 0.05",
              o, detect_cmd::Run);
  sub->add_option("RUN", o->run_id, "Run id")->required();
  sub->add_option("--step", o->step, "Checkpoint step (default: the newest)");
  sub->add_option("--eval-set", o->eval_set, "Evaluation set (default: icl_rare for recall, else test)");
  sub->add_option("--metric", o->metric, "accuracy (default), loss or p_target");
  sub->add_option("--tolerance", o->tolerance, "Allowed total degradation (default 0.01; 0.02 nats for loss)");
  sub->add_option("--order", o->order, "magnitude_asc (default), effect_asc or label");
  sub->add_option("--n-eval", o->n_eval, "Sequences (default 2048)");
  sub->add_option("--max-evals", o->max_evals, "Budget of metric evaluations (default 5000)");
  sub->add_flag("--complete", o->complete, "FULL models: detect over the complete basis");
  sub->add_flag("--force", o->force, "Recompute even if stored");
}

}  // namespace circuitlab::cli
