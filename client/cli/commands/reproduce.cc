// circuitlab reproduce list | run RECIPE | show ID | cancel ID: the papers'
// claims as server-side jobs (ReproductionService).
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include "client/cli/commands/commands.h"
#include "server/reproduce/render.h"
#include "client/lib/text_format.h"

namespace circuitlab::cli {
namespace {
namespace reproduce_cmd {

struct Options {
  std::string recipe;       // run: the recipe id, or a recipe file with --recipe-file
  std::string recipe_file;  // run: a recipe of one's own (protobuf JSON)
  std::string scale = "ci";
  uint32_t seeds = 0;
  bool watch = false;
  std::string id;  // show, cancel
  bool markdown = false, csv = false;
  std::string out;  // show: write here instead of stdout
  bool mine = false;
  std::string page_token;  // list: from the line that says more follow
};

// 0 when DONE with no failed check, 3 when a check failed, 1 when the
// reproduction failed or was cancelled.
int ExitOf(const v1::Reproduction& r) {
  if (r.state() == v1::REPRODUCTION_STATE_DONE) return r.report().failed() > 0 ? 3 : 0;
  return r.state() == v1::REPRODUCTION_STATE_FAILED || r.state() == v1::REPRODUCTION_STATE_CANCELLED ? 1 : 0;
}

bool Ended(const v1::Reproduction& r) {
  return r.state() == v1::REPRODUCTION_STATE_DONE || r.state() == v1::REPRODUCTION_STATE_FAILED ||
         r.state() == v1::REPRODUCTION_STATE_CANCELLED;
}

int Print(Context& ctx, const v1::Reproduction& r, const Options& o) {
  std::string text = ctx.g.json   ? client::ToJson(r) + "\n"
                     : o.markdown ? reproduce::ReproductionMarkdown(r)
                     : o.csv      ? reproduce::ReproductionCsv(r)
                                  : reproduce::ReproductionText(r);
  if (o.out.empty()) {
    if (o.markdown || o.csv || ctx.g.json) {
      std::cout << text;
    } else {  // escaped line by line: names and notes come from the server
      for (size_t at = 0, nl; at < text.size(); at = nl + 1) {
        nl = text.find('\n', at);
        if (nl == std::string::npos) nl = text.size();
        std::cout << client::EscapeForTerminal(text.substr(at, nl - at)) << "\n";
      }
    }
  } else {
    std::ofstream f(o.out);
    f << text;
    if (!f) return ReportError(absl::UnavailableError("cannot write " + o.out));
    std::cerr << "wrote " << o.out << "\n";
  }
  return ExitOf(r);
}

int List(Context& ctx, const Options& o) {
  absl::StatusOr<v1::ListRecipesResponse> recipes = ctx.client.ListRecipes();
  if (!recipes.ok()) return ReportError(recipes.status());
  v1::ListReproductionsRequest req;
  req.set_mine(o.mine);
  req.set_page_token(o.page_token);
  absl::StatusOr<v1::ListReproductionsResponse> mine = ctx.client.ListReproductions(req);
  if (!mine.ok()) return ReportError(mine.status());
  if (ctx.g.json) {
    std::cout << client::ToJson(*recipes) << "\n" << client::ToJson(*mine) << "\n";
    return 0;
  }
  std::cout << "Recipes (circuitlab reproduce run ID --scale SCALE):\n";
  for (const auto& e : recipes->recipes()) {
    std::string scales;
    for (const std::string& s : e.scales()) {
      char hours[32];
      std::snprintf(hours, sizeof hours, " ~%.2g h", e.estimated_cpu_hours().at(s));
      scales += (scales.empty() ? "" : ", ") + s + hours;
    }
    std::cout << "  " << e.id() << "  " << e.title() << "\n      scales: " << scales << "\n";
  }
  if (!mine->reproductions().empty()) std::cout << "\nReproductions:\n";
  for (const v1::Reproduction& r : mine->reproductions()) {
    std::cout << "  " << client::EscapeForTerminal(reproduce::ReproductionProgressLine(r)) << "\n";
  }
  if (!mine->next_page_token().empty()) {
    std::cout << "  (older ones: circuitlab reproduce list --page-token " << mine->next_page_token() << ")\n";
  }
  return 0;
}

int Watch(Context& ctx, v1::Reproduction r, const Options& o) {
  std::string last;
  while (!Ended(r)) {
    const std::string line = reproduce::ReproductionProgressLine(r);
    if (line != last) std::cerr << client::EscapeForTerminal(line) << "\n";
    last = line;
    std::this_thread::sleep_for(std::chrono::seconds(2));
    absl::StatusOr<v1::Reproduction> again = ctx.client.GetReproduction(r.reproduction_id());
    if (!again.ok()) return ReportError(again.status());
    r = std::move(*again);
  }
  return Print(ctx, r, o);
}

int Run(Context& ctx, const Options& o) {
  v1::StartReproductionRequest req;
  if (!o.recipe_file.empty()) {
    if (absl::Status s = client::ReadJsonFile(o.recipe_file, req.mutable_recipe()); !s.ok()) return ReportError(s);
  } else {
    req.set_recipe_id(o.recipe);
  }
  req.set_scale(o.scale);
  req.set_seeds(o.seeds);
  absl::StatusOr<v1::Reproduction> r = ctx.client.StartReproduction(req);
  if (!r.ok()) return ReportError(r.status());
  if (o.watch) return Watch(ctx, *r, o);
  if (ctx.g.json) {
    std::cout << client::ToJson(*r) << "\n";
  } else {
    std::cout << r->reproduction_id() << "  " << r->recipe_id() << " at scale " << r->scale() << ", " << r->seeds()
              << " seed(s): " << client::EscapeForTerminal(r->phase()) << "\n  follow it: circuitlab reproduce show "
              << r->reproduction_id() << " --watch\n";
  }
  return 0;
}

int Show(Context& ctx, const Options& o) {
  absl::StatusOr<v1::Reproduction> r = ctx.client.GetReproduction(o.id);
  if (!r.ok()) return ReportError(r.status());
  return o.watch ? Watch(ctx, *r, o) : Print(ctx, *r, o);
}

int Cancel(Context& ctx, const Options& o) {
  absl::StatusOr<v1::Reproduction> r = ctx.client.CancelReproduction(o.id);
  if (!r.ok()) return ReportError(r.status());
  std::cout << client::EscapeForTerminal(reproduce::ReproductionProgressLine(*r)) << "\n";
  return 0;
}

}  // namespace reproduce_cmd
}  // namespace

void AddReproduce(CLI::App& app, Action* chosen) {
  using reproduce_cmd::Options;
  CLI::App* rep = app.add_subcommand(
      "reproduce",
      "Reproduce a claim of the papers (SCIENCE.md §E) on the server: its runs and sweeps train on the server's\n"
      "executor, its analyses run as jobs, and every check of the claim is evaluated per seed into a report.\n"
      "  circuitlab reproduce list\n"
      "  circuitlab reproduce run E.9 --scale paper --watch\n"
      "  circuitlab reproduce show p1 --markdown --out docs/reproductions/E.9.md\n"
      "Exit status of run --watch and show: 0 when every check passed or was inconclusive, 3 when one failed,\n"
      "1 when the reproduction failed or was cancelled.");
  rep->require_subcommand(1);
  auto list = std::make_shared<Options>();
  CLI::App* l = AddVerb(*rep, chosen, "list",
                        "The server's recipes (with their scales and estimated CPU-hours) and "
                        "the reproductions so far.",
                        list, reproduce_cmd::List);
  l->add_flag("--mine", list->mine, "Only my reproductions");
  l->add_option("--page-token", list->page_token, "The next page of reproductions, from the line that ends a list");
  auto run = std::make_shared<Options>();
  CLI::App* r =
      AddVerb(*rep, chosen, "run", "Start a reproduction.\n  circuitlab reproduce run E.9 --scale cpu --seeds 3", run,
              reproduce_cmd::Run);
  r->add_option("RECIPE", run->recipe, "Recipe id, e.g. E.9 (see `reproduce list`)");
  r->add_option("--recipe-file", run->recipe_file, "A recipe of your own (circuitlab.v1.Recipe as JSON) instead");
  r->add_option("--scale", run->scale, "ci (the science tests' sizes), cpu (about an hour on 2 cores) or paper")
      ->capture_default_str();
  r->add_option("--seeds", run->seeds, "Seeds, in [1, 16]; 0 = the scale's default (3 at cpu and paper)")
      ->capture_default_str();
  r->add_flag("--watch", run->watch, "Follow it to the end, then print the report");
  r->add_flag("--markdown", run->markdown, "With --watch: the report as Markdown");
  auto show = std::make_shared<Options>();
  CLI::App* s = AddVerb(*rep, chosen, "show", "A reproduction and, once done, its report.", show, reproduce_cmd::Show);
  s->add_option("ID", show->id, "Reproduction id, e.g. p1")->required();
  s->add_flag("--watch", show->watch, "Follow it to the end first");
  s->add_flag("--markdown", show->markdown, "The report as Markdown (claim, checks, data tables and label maps)");
  s->add_flag("--csv", show->csv, "One line per check and seed");
  s->add_option("--out", show->out, "Write the report to this file");
  auto cancel = std::make_shared<Options>();
  CLI::App* c = AddVerb(*rep, chosen, "cancel", "Cancel a reproduction and its runs that have not ended.", cancel,
                        reproduce_cmd::Cancel);
  c->add_option("ID", cancel->id, "Reproduction id")->required();
}

}  // namespace circuitlab::cli
