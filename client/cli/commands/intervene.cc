// circuitlab intervene RUN [--spec FILE] [--zero C,...] [--ablate-head L,...] [--patch HOOK,... [--patch-from SET]
//   [--positions P,...]] [--per-position] [--eval-sets S,...] [--csv] ...
//   [--clean IDS [--clean-positions IDS] ... --answer IDS [--wrong IDS] [--corrupted IDS ...]]
#include <cstdio>
#include <iostream>

#include "client/cli/commands/commands.h"

namespace circuitlab::cli {
namespace {
namespace intervene_cmd {

struct Options {
  std::string run_id, spec_file, patch_from;
  std::vector<std::string> zero, eval_sets, patch;
  // The caller's prompts: one sequence per --clean / --corrupted.
  std::vector<std::string> clean, clean_positions, corrupted, corrupted_positions;
  std::string answer, wrong;
  std::vector<uint32_t> heads, positions;
  uint64_t step = 0;
  uint32_t n_eval = 0;
  bool force = false, per_position = false, csv = false;
};

// --clean/--corrupted (one sequence each) with their position ids; a
// corrupted prompt without its own takes its clean partner's (the same
// layout). An error message, or empty.
std::string AddPrompts(const Options& o, v1::Prompts* p) {
  auto add = [](const std::vector<std::string>& seqs, const std::vector<std::string>& pos, const std::string& flag,
                const std::vector<std::string>* fallback, google::protobuf::RepeatedPtrField<v1::InputSequence>* out) {
    if (!pos.empty() && pos.size() != seqs.size()) {
      return flag + "-positions: give one per " + flag + " (" + std::to_string(seqs.size()) + "), got " +
             std::to_string(pos.size());
    }
    for (size_t i = 0; i < seqs.size(); ++i) {
      v1::InputSequence* s = out->Add();
      for (int64_t t : ParseIds(seqs[i], flag)) s->add_tokens(t);
      const std::string* ids = !pos.empty()                                  ? &pos[i]
                               : fallback != nullptr && i < fallback->size() ? &(*fallback)[i]
                                                                             : nullptr;
      if (ids != nullptr) {
        for (int64_t q : ParseIds(*ids, flag + "-positions")) s->add_positions(q);
      }
    }
    return std::string();
  };
  if (std::string e = add(o.clean, o.clean_positions, "--clean", nullptr, p->mutable_clean()); !e.empty()) return e;
  if (std::string e = add(o.corrupted, o.corrupted_positions, "--corrupted", &o.clean_positions, p->mutable_corrupted());
      !e.empty()) {
    return e;
  }
  for (int64_t t : ParseIds(o.answer, "--answer")) p->add_answers(static_cast<uint32_t>(t));
  if (!o.wrong.empty()) {
    for (int64_t t : ParseIds(o.wrong, "--wrong")) p->add_wrong(static_cast<uint32_t>(t));
  }
  if (p->answers_size() == 0) return "--answer: name the correct next token of the prompts (one, or one per --clean)";
  return "";
}

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
  if (!o.patch.empty()) {
    v1::PatchSweep* sweep = req.mutable_patch();
    for (const auto& hook : o.patch) sweep->add_hooks(hook);
    for (uint32_t p : o.positions) sweep->add_positions(p);
    if (!o.patch_from.empty()) sweep->set_reference_set(o.patch_from);
  } else if (!o.positions.empty() || !o.patch_from.empty()) {
    std::cerr << "error: --positions and --patch-from belong to a patch sweep: add --patch HOOK,...\n";
    return std::nullopt;
  }
  if (o.per_position) req.set_per_position(true);
  if (!o.clean.empty()) {
    if (std::string e = AddPrompts(o, req.mutable_prompts()); !e.empty()) {
      std::cerr << "error: " << e << "\n";
      return std::nullopt;
    }
  } else if (!o.corrupted.empty() || !o.answer.empty() || !o.wrong.empty() || !o.clean_positions.empty()) {
    std::cerr << "error: --corrupted, --answer, --wrong and --clean-positions belong to prompts: add --clean IDS\n";
    return std::nullopt;
  }
  if (req.interventions_size() == 0 && !req.has_patch()) {
    std::cerr << "error: no intervention given: use --spec FILE, --zero, --ablate-head or --patch\n";
    return std::nullopt;
  }
  return req;
}

// The patch sweep's sites and the per-position series, one table each.
void PrintSeries(const v1::InterventionEffect& e) {
  if (e.patch_size() > 0) {
    // On the caller's prompts the base is the corrupted prompts, the source the clean ones.
    const bool prompts = e.eval_set() == "prompts";
    std::printf("%-12s patch_effect: %s acc %.4f loss %.4f, %s acc %.4f loss %.4f", "",
                prompts ? "corrupted" : "base (this set)", e.accuracy_clean(), e.loss_clean(),
                prompts ? "clean" : "source", e.patch_source_accuracy(), e.patch_source_loss());
    if (e.has_logit_diff()) std::printf(" (logit diff %.3f -> %.3f)", e.logit_diff_clean(), e.patch_source_logit_diff());
    std::printf("\n");
    std::printf("%-12s %-18s %5s %9s %9s %9s %9s%s\n", "", "HOOK", "POS", "ACC", "EFF(ACC)", "LOSS", "EFF(LOSS)",
                e.has_logit_diff() ? "  LOGIT DIFF  EFF(LD)" : "");
    for (const auto& p : e.patch()) {
      const std::string pos = p.position() < 0 ? "all" : std::to_string(p.position());
      std::printf("%-12s %-18s %5s %9.4f %9.3f %9.4f %9.3f", "", p.hook().c_str(), pos.c_str(), p.accuracy(),
                  p.effect_accuracy(), p.loss(), p.effect_loss());
      if (e.has_logit_diff()) std::printf("  %10.3f %8.3f", p.logit_diff(), p.effect_logit_diff());
      std::printf("\n");
    }
  }
  if (e.positions_size() > 0) {
    std::printf("%-12s %5s %9s %9s %9s %9s %9s\n", "", "POS", "ACC", "ACC'", "LOSS", "LOSS'", "KL");
    for (const auto& p : e.positions()) {
      std::printf("%-12s %5u %9.4f %9.4f %9.4f %9.4f %9.4f\n", "", p.position(), p.accuracy_clean(), p.accuracy(),
                  p.loss_clean(), p.loss(), p.kl_clean());
    }
  }
}

// Every number of the response as CSV rows: set,kind,hook,position,metric,value.
void PrintCsv(const v1::InterveneResponse& resp) {
  std::printf("eval_set,kind,hook,position,metric,value\n");
  for (const auto& e : resp.effects()) {
    auto row = [&](const char* kind, const std::string& hook, const std::string& pos, const char* metric, double v) {
      std::printf("%s,%s,%s,%s,%s,%.9g\n", e.eval_set().c_str(), kind, hook.c_str(), pos.c_str(), metric, v);
    };
    row("set", "", "", "loss_clean", e.loss_clean());
    row("set", "", "", "loss", e.loss());
    row("set", "", "", "accuracy_clean", e.accuracy_clean());
    row("set", "", "", "accuracy", e.accuracy());
    row("set", "", "", "kl_clean", e.kl_clean());
    if (e.has_logit_diff()) {
      row("set", "", "", "logit_diff_clean", e.logit_diff_clean());
      row("set", "", "", "logit_diff", e.logit_diff());
    }
    if (e.has_kl_ref()) {
      row("set", "", "", "kl_ref_clean", e.kl_ref_clean());
      row("set", "", "", "kl_ref", e.kl_ref());
    }
    for (const auto& m : e.attention_mass()) {
      const int heads = m.clean_size();
      for (int h = 0; h < heads && h < m.intervened_size(); ++h) {
        row("attention_mass", m.pattern(), "", ("head" + std::to_string(h + 1) + "_clean").c_str(), m.clean(h));
        row("attention_mass", m.pattern(), "", ("head" + std::to_string(h + 1)).c_str(), m.intervened(h));
      }
      for (int i = 0; i < m.queries_size(); ++i) {  // per query (--per-position)
        for (int h = 0; h < heads; ++h) {
          const int k = i * heads + h;
          if (k >= m.clean_by_query_size() || k >= m.intervened_by_query_size()) break;
          const std::string q = std::to_string(m.queries(i)), head = "head" + std::to_string(h + 1);
          row("attention_mass", m.pattern(), q, (head + "_clean").c_str(), m.clean_by_query(k));
          row("attention_mass", m.pattern(), q, head.c_str(), m.intervened_by_query(k));
        }
      }
    }
    if (e.patch_size() > 0) {
      row("patch_source", "", "", "loss", e.patch_source_loss());
      row("patch_source", "", "", "accuracy", e.patch_source_accuracy());
      if (e.has_logit_diff()) row("patch_source", "", "", "logit_diff", e.patch_source_logit_diff());
    }
    for (const auto& p : e.patch()) {
      const std::string pos = p.position() < 0 ? "all" : std::to_string(p.position());
      row("patch", p.hook(), pos, "loss", p.loss());
      row("patch", p.hook(), pos, "accuracy", p.accuracy());
      row("patch", p.hook(), pos, "effect_loss", p.effect_loss());
      row("patch", p.hook(), pos, "effect_accuracy", p.effect_accuracy());
      if (e.has_logit_diff()) {
        row("patch", p.hook(), pos, "logit_diff", p.logit_diff());
        row("patch", p.hook(), pos, "effect_logit_diff", p.effect_logit_diff());
      }
    }
    for (const auto& p : e.positions()) {
      const std::string pos = std::to_string(p.position());
      for (const auto& [metric, v] :
           {std::pair{"loss_clean", p.loss_clean()}, std::pair{"loss", p.loss()},
            std::pair{"accuracy_clean", p.accuracy_clean()}, std::pair{"accuracy", p.accuracy()},
            std::pair{"kl_clean", p.kl_clean()}, std::pair{"logit_diff_clean", p.logit_diff_clean()},
            std::pair{"logit_diff", p.logit_diff()}, std::pair{"kl_ref_clean", p.kl_ref_clean()},
            std::pair{"kl_ref", p.kl_ref()}}) {
        row("position", "", pos, metric, v);
      }
    }
  }
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
    PrintSeries(e);
  }
}

int Run(Context& ctx, const Options& o) {
  std::optional<v1::InterveneRequest> req = BuildRequest(o);
  if (!req) return 2;
  v1::InterveneResponse resp;
  auto call = [&](bool force) {
    req->set_force(force);
    return ctx.client.RunAnalysis<v1::InterveneResponse>(*req);
  };
  if (auto rc = RunAnalysis(ctx, "the intervention", o.force, call, &resp)) return *rc;
  if (o.csv) {
    PrintCsv(resp);
    return 0;
  }
  std::printf("%s step %llu%s\n", resp.run_id().c_str(), static_cast<unsigned long long>(resp.step()),
              resp.from_store() ? "  (stored answer)" : "");
  for (int i = 0; i < resp.edited_size(); ++i) {
    std::printf("  edited %s: %.4f -> %.4f\n", resp.edited(i).label().c_str(), resp.edited_before(i),
                resp.edited(i).value());
  }
  PrintEffects(resp);
  return 0;
}

}  // namespace intervene_cmd
}  // namespace

void AddIntervene(CLI::App& app, Action* chosen) {
  auto o = std::make_shared<intervene_cmd::Options>();
  CLI::App* sub =
      AddVerb(app, chosen, "intervene",
              "Apply interventions to a checkpoint and compare with the clean model on the same sequences: loss,\n"
              "accuracy, KL to the clean model, logit differences, per evaluation set. Interventions come from a\n"
              "JSON file (circuitlab.v1.InterveneRequest; run_id is filled in) or the quick flags.\n"
              "An analysis job on the server; this command waits and shows progress.\n"
              "  circuitlab intervene r3 --zero beta\n"
              "  circuitlab intervene r3 --ablate-head 2\n"
              "  circuitlab intervene r3 --spec examples/intervene_imir_hooks.json\n"
              "Activation patching (SCIENCE.md D.6 patch_effect): --patch sweeps hook points and positions, one\n"
              "site at a time, patching each site from the paired sequence of --patch-from (default: the same set,\n"
              "another seed); each site's effect is (m_patched - m_base) / (m_source - m_base): 1 when the site\n"
              "alone carries the difference between the two runs.\n"
              "  circuitlab intervene r3 --patch L1.H1.out,L2.attn --patch-from iwl --eval-sets icl_rare\n"
              "  circuitlab intervene r3 --patch L2.post_attn --positions 0,8,16 --per-position --csv > p.csv\n"
              "Your own prompts instead of the evaluation sets: --clean (one sequence each; IMIR runs add\n"
              "--clean-positions), the correct next token --answer and a competing --wrong (logit difference =\n"
              "answer - wrong at the last position). With --patch, --corrupted prompts (paired with --clean) are\n"
              "patched from the clean ones: effect 1 where one site restores the clean logit difference.\n"
              "  circuitlab intervene r1 --patch L1.H1.out,L2.H1.out --clean 0,14,30,22,25,14 \\\n"
              "      --clean-positions 0,3,4,9,10,12 --corrupted 0,14,30,22,25,16 --answer 30 --wrong 25",
              o, intervene_cmd::Run);
  sub->add_option("RUN", o->run_id, "Run id")->required();
  sub->add_option("--spec", o->spec_file, "InterveneRequest as JSON")->check(CLI::ExistingFile);
  sub->add_option("--zero", o->zero, "Zero these coordinates (labels or alpha/beta/gamma/delta)");
  sub->add_option("--ablate-head", o->heads, "Zero head 1 of these layers")->delimiter(',');
  sub->add_option("--eval-sets", o->eval_sets, "Evaluation sets (default: all)")->delimiter(',');
  sub->add_option("--step", o->step, "Checkpoint step (default: the newest)");
  sub->add_option("--n-eval", o->n_eval, "Sequences per set (default 2048)");
  sub->add_option("--patch", o->patch, "Patch sweep over these hook points (patch_effect)")->delimiter(',');
  sub->add_option("--patch-from", o->patch_from, "Evaluation set the patched activations come from")->type_name("SET");
  sub->add_option("--positions", o->positions, "Positions the sweep patches one at a time (default: every position)")
      ->delimiter(',');
  sub->add_flag("--per-position", o->per_position, "Also report every metric per answer position");
  sub->add_option("--clean", o->clean, "A prompt of your own: token ids, comma-separated; repeat for more")
      ->type_name("IDS");
  sub->add_option("--clean-positions", o->clean_positions, "IMIR: a prompt's position ids, one per --clean")
      ->type_name("IDS");
  sub->add_option("--corrupted", o->corrupted, "With --patch: the corrupted partner of each --clean")
      ->type_name("IDS");
  sub->add_option("--corrupted-positions", o->corrupted_positions,
                  "IMIR: a corrupted prompt's position ids (default: its clean partner's)")
      ->type_name("IDS");
  sub->add_option("--answer", o->answer, "The correct next token after the prompts: one, or one per --clean")
      ->type_name("IDS");
  sub->add_option("--wrong", o->wrong, "The competing token (logit difference = answer - wrong)")->type_name("IDS");
  sub->add_flag("--csv", o->csv, "CSV: eval_set,kind,hook,position,metric,value");
  sub->add_flag("--force", o->force, "Recompute even if stored");
}

}  // namespace circuitlab::cli
