// circuitlab intervene RUN [--spec FILE] [--zero C,...] [--ablate-head L,...] [--eval-sets S,...] ...
#include <cstdio>
#include <iostream>

#include "client/cli/commands/commands.h"

namespace circuitlab::cli {
namespace {

struct Options {
  std::string run_id, spec_file;
  std::vector<std::string> zero, eval_sets;
  std::vector<uint32_t> heads;
  uint64_t step = 0;
  uint32_t n_eval = 0;
  bool force = false;
};

// The request from --spec and the quick flags; nullopt (usage error printed) when it holds no intervention.
std::optional<v1::InterveneRequest> BuildRequest(const Options& o) {
  v1::InterveneRequest req;
  if (!o.spec_file.empty()) {
    if (absl::Status st = client::ReadJsonFile(o.spec_file, &req); !st.ok()) {
      std::cerr << "error: " << st.message() << "\n";
      return std::nullopt;
    }
  }
  req.set_run_id(o.run_id);
  if (o.step) req.set_step(o.step);
  if (o.n_eval) req.set_n_eval(o.n_eval);
  for (const auto& s : o.eval_sets) req.add_eval_sets(s);
  if (const std::vector<std::string> zero = SplitList(o.zero); !zero.empty()) {
    v1::Intervention* op = req.add_interventions();
    op->set_op(v1::Intervention::OP_ZERO_COORDINATE);
    for (const auto& c : zero) op->add_coordinates(c);
  }
  for (uint32_t layer : o.heads) {
    v1::Intervention* op = req.add_interventions();
    op->set_op(v1::Intervention::OP_ABLATE_HEAD);
    op->set_layer(layer);
  }
  if (req.interventions_size() == 0) {
    std::cerr << "error: no intervention given: use --spec FILE, --zero or --ablate-head\n";
    return std::nullopt;
  }
  return req;
}

void PrintEffects(const v1::InterveneResponse& resp) {
  std::printf("%-12s %9s %9s %9s %9s %9s %18s\n", "SET", "ACC", "ACC'", "LOSS", "LOSS'", "KL", "LOGIT DIFF -> '");
  for (const auto& e : resp.effects()) {
    std::printf("%-12s %9.4f %9.4f %9.4f %9.4f %9.4f", e.eval_set().c_str(), e.accuracy_clean(), e.accuracy(),
                e.loss_clean(), e.loss(), e.kl_clean());
    if (e.has_logit_diff()) std::printf(" %8.3f -> %7.3f", e.logit_diff_clean(), e.logit_diff());
    if (e.has_kl_ref()) std::printf("  KL(.||%s) %.4f -> %.4f", e.ref_name().c_str(), e.kl_ref_clean(), e.kl_ref());
    std::printf("\n");
    for (const auto& m : e.attention_mass()) {
      std::printf("%-12s attention mass at %s per head:", "", m.pattern().c_str());
      for (int h = 0; h < m.clean_size() && h < m.intervened_size(); ++h) {
        std::printf("  h%d %.4f -> %.4f", h + 1, m.clean(h), m.intervened(h));
      }
      std::printf("\n");
    }
  }
}

int Run(Context& ctx, const Options& o) {
  std::optional<v1::InterveneRequest> req = BuildRequest(o);
  if (!req) return 2;
  v1::InterveneResponse resp;
  auto call = [&](bool force) {
    req->set_force(force);
    return ctx.client.Intervene(*req);
  };
  if (auto rc = RunAnalysis(ctx, "the intervention", o.force, call, &resp)) return *rc;
  std::printf("%s step %llu%s\n", resp.run_id().c_str(), static_cast<unsigned long long>(resp.step()),
              resp.from_store() ? "  (stored answer)" : "");
  for (int i = 0; i < resp.edited_size(); ++i) {
    std::printf("  edited %s: %.4f -> %.4f\n", resp.edited(i).label().c_str(), resp.edited_before(i),
                resp.edited(i).value());
  }
  PrintEffects(resp);
  return 0;
}

}  // namespace

void AddIntervene(CLI::App& app, Action* chosen) {
  auto o = std::make_shared<Options>();
  CLI::App* sub =
      AddVerb(app, chosen, "intervene",
              "Apply interventions to a checkpoint and compare with the clean model on the same sequences: loss,\n"
              "accuracy, KL to the clean model, logit differences, per evaluation set. Interventions come from a\n"
              "JSON file (circuitlab.v1.InterveneRequest; run_id is filled in) or the quick flags.\n"
              "An analysis job on the server; this command waits and shows progress.\n"
              "  circuitlab intervene r3 --zero beta\n"
              "  circuitlab intervene r3 --ablate-head 2\n"
              "  circuitlab intervene r3 --spec examples/intervene_imir_hooks.json",
              o, Run);
  sub->add_option("RUN", o->run_id, "Run id")->required();
  sub->add_option("--spec", o->spec_file, "InterveneRequest as JSON")->check(CLI::ExistingFile);
  sub->add_option("--zero", o->zero, "Zero these coordinates (labels or alpha/beta/gamma/delta)");
  sub->add_option("--ablate-head", o->heads, "Zero head 1 of these layers")->delimiter(',');
  sub->add_option("--eval-sets", o->eval_sets, "Evaluation sets (default: all)")->delimiter(',');
  sub->add_option("--step", o->step, "Checkpoint step (default: the newest)");
  sub->add_option("--n-eval", o->n_eval, "Sequences per set (default 2048)");
  sub->add_flag("--force", o->force, "Recompute even if stored");
}

}  // namespace circuitlab::cli
