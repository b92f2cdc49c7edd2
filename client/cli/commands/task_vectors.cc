// circuitlab task-vectors RUN | --sweep SWEEP [--analysis A,...] [--layer L,...] [--csv] ...
#include <iostream>

#include "client/cli/commands/commands.h"
#include "client/lib/task_vector_render.h"

namespace circuitlab::cli {
namespace {
namespace task_vectors_cmd {

struct Options {
  std::string run_id, sweep, spec_file, hook, subtract;
  std::vector<std::string> analyses;
  std::vector<uint32_t> layers;
  uint64_t step = 0;
  uint32_t samples = 0;
  bool all = false, paper_compat = false, csv = false, force = false;
};

// The request from --spec and the flags (flags override); nullopt (usage error printed) when it is incomplete.
std::optional<v1::AnalyzeTaskVectorsRequest> BuildRequest(const Options& o) {
  v1::AnalyzeTaskVectorsRequest req;
  if (!o.spec_file.empty()) {
    if (absl::Status st = client::ReadJsonFile(o.spec_file, &req); !st.ok()) {
      std::cerr << "error: " << st.message() << "\n";
      return std::nullopt;
    }
  }
  if (!o.run_id.empty()) req.set_run_id(o.run_id);
  if (!o.sweep.empty()) req.set_sweep_id(o.sweep);
  if (req.run_id().empty() == req.sweep_id().empty()) {
    std::cerr << "error: give a RUN or --sweep SWEEP (one of them)\n";
    return std::nullopt;
  }
  if (o.step) req.set_step(o.step);
  if (o.all) req.set_all_checkpoints(true);
  if (!o.analyses.empty()) {
    req.clear_analyses();
    for (const auto& a : o.analyses) req.add_analyses(a);
  }
  if (!o.layers.empty()) {
    req.clear_layers();
    for (uint32_t l : o.layers) req.add_layers(l);
  }
  if (!o.hook.empty()) req.set_hook(o.hook);
  if (o.samples) req.set_samples_per_cell(o.samples);
  if (o.paper_compat) req.set_paper_compat(true);
  if (!o.subtract.empty()) req.set_steering_subtract(o.subtract);
  return req;
}

int Run(Context& ctx, const Options& o) {
  std::optional<v1::AnalyzeTaskVectorsRequest> req = BuildRequest(o);
  if (!req) return 2;
  v1::AnalyzeTaskVectorsResponse resp;
  auto call = [&](bool force) {
    req->set_force(force);
    return ctx.client.RunAnalysis<v1::AnalyzeTaskVectorsResponse>(*req);
  };
  if (auto rc = RunAnalysis(ctx, "the task-vector analysis", o.force, call, &resp)) return *rc;
  if (o.csv) {
    std::cout << client::TaskVectorCsv(resp);
  } else {
    std::cout << client::TaskVectorText(resp);
    if (resp.from_store()) std::cout << "(stored answer)\n";
  }
  return 0;
}

}  // namespace task_vectors_cmd
}  // namespace

void AddTaskVectors(CLI::App& app, Action* chosen) {
  auto o = std::make_shared<task_vectors_cmd::Options>();
  CLI::App* sub = AddVerb(
      app, chosen, "task-vectors",
      "Task-vector geometry (SCIENCE.md D.5) of a latent-task run: P0 residual ratio, P1 ANOVA, P2 simplex\n"
      "interpolation, P3 alignment with the Bayesian posterior, steering along the task simplex, OOD projection\n"
      "R^2, the two-Bayes mode transition and the double dissociation (task subspace vs the optimised orthogonal\n"
      "direction, with what that direction encodes). An analysis job; this command waits. --all-checkpoints\n"
      "repeats it over training, --sweep over the newest checkpoint of every run of a sweep (e.g. OOD R^2\n"
      "against diversity).\n"
      "  circuitlab task-vectors r3\n"
      "  circuitlab task-vectors r3 --analysis ood_r2 --all-checkpoints --csv > ood_over_training.csv\n"
      "  circuitlab task-vectors --sweep s2 --analysis ood_r2,kl --layer 1",
      o, task_vectors_cmd::Run);
  sub->add_option("RUN", o->run_id, "Run id (or give --sweep)");
  sub->add_option("--sweep", o->sweep, "Sweep id: analyse every run at its newest checkpoint");
  sub->add_option("--analysis", o->analyses, "p0, p1, p2, p3, steering, ood_r2, kl, dissociation (default all)")
      ->delimiter(',');
  sub->add_option("--step", o->step, "Checkpoint step (default: the newest)");
  sub->add_flag("--all-checkpoints", o->all, "Every stored checkpoint of the run");
  sub->add_option("--layer", o->layers, "Layer(s), counted from 1 (default all; repeatable or a,b)")->delimiter(',');
  sub->add_option("--hook", o->hook, "Hidden state: post_mlp (default), post_attn or resid_pre");
  sub->add_option("--samples", o->samples, "Token-conditioned sequences per cell (default 128)");
  sub->add_flag("--paper-compat", o->paper_compat, "Steering: estimate at post_mlp, inject at post_attn");
  sub->add_option("--steering-subtract", o->subtract,
                  "Steering edit: true_task (E1 variant, default) or projection (E3 variant)");
  sub->add_option("--spec", o->spec_file, "AnalyzeTaskVectorsRequest JSON file (every field; flags override)")
      ->check(CLI::ExistingFile);
  sub->add_flag("--csv", o->csv, "CSV: run_id,step,sweep_values,name,layer,position,value");
  sub->add_flag("--force", o->force, "Recompute even if stored");
}

}  // namespace circuitlab::cli
