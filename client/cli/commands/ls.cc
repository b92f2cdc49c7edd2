// circuitlab ls [--state S] [--tag T] [--mine] [--limit N] [--page-token P]
#include <cstdio>
#include <iostream>

#include "client/cli/commands/commands.h"
#include "client/lib/text_format.h"

namespace circuitlab::cli {
namespace {
namespace ls_cmd {

struct Options {
  std::vector<std::string> states, tags;
  int limit = 50;
  std::string page;
  bool mine = false;
};

int Run(Context& ctx, const Options& o) {
  v1::ListRunsRequest req;
  try {
    for (const auto& s : o.states) req.add_states(ParseState(s));
  } catch (const CLI::ValidationError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  for (const auto& t : o.tags) req.add_tags(t);
  req.set_page_size(o.limit);
  req.set_page_token(o.page);
  req.set_mine(o.mine);
  auto resp = ctx.client.ListRuns(req);
  if (!resp.ok()) return ReportError(resp.status());
  if (ctx.g.json) {
    std::cout << client::ToJson(*resp) << "\n";
    return 0;
  }
  std::printf("%-7s %-10s %-8s %-16s %-24s %-12s %s\n", "RUN", "STATE", "DEVICE", "STEP", "CREATED", "OWNER", "NAME");
  for (const v1::Run& r : resp->runs()) {
    std::string step = std::to_string(r.progress().step()) + "/" + std::to_string(r.progress().total_steps());
    std::printf("%-7s %-10s %-8s %-16s %-24s %-12s %s\n", r.run_id().c_str(), client::StateName(r.state()).c_str(),
                r.device().empty() ? "-" : r.device().c_str(), step.c_str(), client::FormatTime(r.created_at()).c_str(),
                r.owner().empty() ? "-" : client::EscapeForTerminal(r.owner()).c_str(),
                client::EscapeForTerminal(r.name()).c_str());
  }
  std::cerr << resp->runs_size() << " of " << resp->total_size() << " run(s)";
  if (!resp->next_page_token().empty()) std::cerr << "; next page: --page-token " << resp->next_page_token();
  std::cerr << "\n";
  return 0;
}

}  // namespace ls_cmd
}  // namespace

void AddLs(CLI::App& app, Action* chosen) {
  auto o = std::make_shared<ls_cmd::Options>();
  CLI::App* sub = AddVerb(app, chosen, "ls", "List runs, newest first.\n  circuitlab ls --state running --tag demo", o,
                          ls_cmd::Run);
  sub->add_option("--state", o->states,
                  "Only runs in this state (repeatable): queued|running|succeeded|failed|cancelled");
  sub->add_option("--tag", o->tags, "Only runs with this tag (repeatable; all must match)");
  sub->add_flag("--mine", o->mine, "Only your own runs (those your token's principal submitted)");
  sub->add_option("--limit", o->limit, "Runs per page (1-1000)")->capture_default_str()->check(CLI::Range(1, 1000));
  sub->add_option("--page-token", o->page, "Continue from a previous page");
}

}  // namespace circuitlab::cli
