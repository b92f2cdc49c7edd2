// circuitlab watch RUN
#include "client/cli/commands/commands.h"

namespace circuitlab::cli {
namespace {
namespace watch_cmd {

struct Options {
  std::string run_id;
};

int Run(Context& ctx, const Options& o) { return DoWatch(ctx.client, o.run_id, ctx.g.json); }

}  // namespace watch_cmd
}  // namespace

void AddWatch(CLI::App& app, Action* chosen) {
  auto o = std::make_shared<watch_cmd::Options>();
  CLI::App* sub = AddVerb(app, chosen, "watch",
                          "Follow a run live: progress bar with step, loss, ICL/IWL accuracy.\n"
                          "Ctrl-C stops watching, not the run.\n  circuitlab watch r3",
                          o, watch_cmd::Run);
  sub->add_option("RUN", o->run_id, "Run id")->required();
}

}  // namespace circuitlab::cli
