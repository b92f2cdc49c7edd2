// circuitlab sweep-show SWEEP and circuitlab sweep-cancel SWEEP: both print
// the sweep's members' states.
#include <iostream>
#include <map>

#include "client/cli/commands/commands.h"

namespace circuitlab::cli {
namespace {
namespace sweep_show_cmd {

struct Options {
  std::string sweep_id;
};

int Print(Context& ctx, const absl::StatusOr<v1::Sweep>& sw) {
  if (!sw.ok()) return ReportError(sw.status());
  if (ctx.g.json) {
    std::cout << client::ToJson(*sw) << "\n";
    return 0;
  }
  std::cout << sw->sweep_id() << "  " << sw->name() << "  " << sw->run_ids_size() << " runs"
            << (sw->done() ? "  (done)" : "") << "\n";
  for (const auto& [name, n] : std::map<std::string, uint32_t>(sw->states().begin(), sw->states().end())) {
    std::cout << "  " << name.substr(std::string("RUN_STATE_").size()) << " " << n << "\n";
  }
  return 0;
}

int Show(Context& ctx, const Options& o) { return Print(ctx, ctx.client.GetSweep(o.sweep_id)); }
int Cancel(Context& ctx, const Options& o) { return Print(ctx, ctx.client.CancelSweep(o.sweep_id)); }

}  // namespace sweep_show_cmd
}  // namespace

void AddSweepShow(CLI::App& app, Action* chosen) {
  auto o = std::make_shared<sweep_show_cmd::Options>();
  CLI::App* sub = AddVerb(app, chosen, "sweep-show", "Show a sweep: its members' states.\n  circuitlab sweep-show s1",
                          o, sweep_show_cmd::Show);
  sub->add_option("SWEEP", o->sweep_id, "Sweep id, e.g. s1")->required();
}

void AddSweepCancel(CLI::App& app, Action* chosen) {
  auto o = std::make_shared<sweep_show_cmd::Options>();
  CLI::App* sub = AddVerb(app, chosen, "sweep-cancel",
                          "Cancel every member of a sweep that has not ended.\n  circuitlab sweep-cancel s1", o,
                          sweep_show_cmd::Cancel);
  sub->add_option("SWEEP", o->sweep_id, "Sweep id")->required();
}

}  // namespace circuitlab::cli
