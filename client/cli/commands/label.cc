// circuitlab label RUN [--force]
#include <algorithm>
#include <cstdio>
#include <map>

#include "client/cli/commands/commands.h"

namespace circuitlab::cli {
namespace {
namespace label_cmd {

struct Options {
  std::string run_id;
  bool force = false;
};

// How the last checkpoint's pair was found: heads and pair paths zeroed.
void PrintAblations(const v1::CheckpointLabel& last) {
  std::printf("step %llu, share of accuracy above chance removed by zeroing\n  heads:",
              static_cast<unsigned long long>(last.step()));
  for (int l = 0; l < last.head_ablation_size(); ++l) std::printf("  L%d %.2f", l + 1, last.head_ablation(l));
  if (last.per_head_ablation_size() > last.head_ablation_size()) {  // several heads per layer
    std::map<std::string, double> heads(last.per_head_ablation().begin(), last.per_head_ablation().end());
    std::printf("\n  each head alone:");
    for (const auto& [name, s] : heads) std::printf("  %s %.2f", name.c_str(), s);
  }
  std::map<std::string, double> paths(last.pair_ablation().begin(), last.pair_ablation().end());
  std::printf("\n  pair paths (match coordinates):");
  for (const auto& [name, s] : paths) std::printf("  %s %.2f", name.c_str(), s);
  std::map<std::string, double> scores(last.pair_scores().begin(), last.pair_scores().end());
  std::printf("\n  pair scores |prev| |match| |out|:");
  for (const auto& [name, s] : scores) std::printf("  %s %.3g", name.c_str(), s);
  std::printf("\n");
}

// OTHER and MIXED surprise a reader whose `detect` named a circuit: say what
// the rule measured and what to try (the rule: the proto's CheckpointLabel.pair).
void ExplainPair(const std::string& run_id, const v1::CheckpointLabel& last) {
  if (last.pair() != "OTHER" && last.pair() != "MIXED") return;
  std::string best;
  double most = -1;
  for (const auto& [name, share] : last.pair_ablation()) {
    if (share > most) most = share, best = name;
  }
  if (last.pair() == "OTHER") {
    std::printf("why OTHER: a layer pair is named when zeroing its path's match coordinate (alone, or with up to\n"
                "  two other pairs') removes at least 0.5 of the accuracy above chance; here the most any set\n"
                "  removed was %.2f (%s). The behaviour does not hang on the match coordinate alone:\n"
                "  `circuitlab detect %s` shows which coordinates carry it (SCIENCE.md D.1), `circuitlab\n"
                "  intervene %s --zero beta` what zeroing one does; docs/concepts/circuits.md states the rule.\n",
                std::max(most, 0.0), best.empty() ? "no pair path" : best.c_str(), run_id.c_str(), run_id.c_str());
  } else {
    std::printf("why MIXED: two sets of pair paths of the same size each remove about as much of the accuracy\n"
                "  above chance (the most, %.2f, by %s): the model uses both routes; see the pair paths above and\n"
                "  docs/concepts/circuits.md.\n", most, best.c_str());
  }
}

int Run(Context& ctx, const Options& o) {
  v1::LabelRunRequest req;
  req.set_run_id(o.run_id);
  v1::LabelRunResponse resp;
  auto call = [&](bool force) {
    req.set_force(force);
    return ctx.client.RunAnalysis<v1::LabelRunResponse>(req);
  };
  if (auto rc = RunAnalysis(ctx, "labelling", o.force, call, &resp)) return *rc;
  std::printf("%s: %s%s%s\n", o.run_id.c_str(), resp.label().c_str(),
              resp.pair().empty() ? "" : ("  pair " + resp.pair()).c_str(),
              resp.pair_predicted().empty() ? ""
                                            : ("  (initial magnitudes predicted " + resp.pair_predicted() + ")").c_str());
  std::printf("%8s %-12s %8s %8s %-4s %-4s %-6s %-6s %8s %-14s %s\n", "STEP", "ICL SET", "ICL ACC", "IWL ACC", "ICL",
              "IWL", "C_ICL", "C_IWL", "LD", "LABEL", "PAIR");
  for (const auto& c : resp.checkpoints()) {
    std::printf("%8llu %-12s %8.4f %8.4f %-4s %-4s %-6s %-6s %8.3f %-14s %s\n",
                static_cast<unsigned long long>(c.step()), c.icl_set().c_str(), c.icl_accuracy(), c.iwl_accuracy(),
                c.icl() ? "yes" : "no", c.iwl() ? "yes" : "no", c.coords_icl() ? "yes" : "no",
                c.coords_iwl() ? "yes" : "no", c.conflict_logit_diff(), c.label().c_str(), c.pair().c_str());
  }
  if (resp.checkpoints_size() > 0 && resp.checkpoints().rbegin()->head_ablation_size() > 0) {
    PrintAblations(*resp.checkpoints().rbegin());
    ExplainPair(o.run_id, *resp.checkpoints().rbegin());
  }
  return 0;
}

}  // namespace label_cmd
}  // namespace

void AddLabel(CLI::App& app, Action* chosen) {
  auto o = std::make_shared<label_cmd::Options>();
  CLI::App* sub =
      AddVerb(app, chosen, "label",
              "ICL vs IWL (SCIENCE.md D.2) and the winning layer pair (D.3) at every stored checkpoint, and the\n"
              "run's label (ICL_ONLY, IWL_ONLY, BOTH_*, NEITHER, TRANSIENT_ICL). An analysis job; this waits.\n"
              "  circuitlab label r3",
              o, label_cmd::Run);
  sub->add_option("RUN", o->run_id, "Run id")->required();
  sub->add_flag("--force", o->force, "Recompute even if stored");
}

}  // namespace circuitlab::cli
