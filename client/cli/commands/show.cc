// circuitlab show RUN
#include <iostream>

#include "client/cli/commands/commands.h"
#include "client/lib/run_render.h"

namespace circuitlab::cli {
namespace {
namespace show_cmd {

struct Options {
  std::string run_id;
};

int Run(Context& ctx, const Options& o) {
  auto run = ctx.client.GetRun(o.run_id);
  if (!run.ok()) return ReportError(run.status());
  std::cout << (ctx.g.json ? client::ToJson(*run) + "\n" : client::RunDetailsText(*run));
  return 0;
}

}  // namespace show_cmd
}  // namespace

void AddShow(CLI::App& app, Action* chosen) {
  auto o = std::make_shared<show_cmd::Options>();
  CLI::App* sub = AddVerb(app, chosen, "show", "Show one run: state, progress, latest metrics.\n  circuitlab show r3",
                          o, show_cmd::Run);
  sub->add_option("RUN", o->run_id, "Run id, e.g. r3")->required();
}

}  // namespace circuitlab::cli
