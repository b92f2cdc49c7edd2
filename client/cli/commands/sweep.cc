// circuitlab sweep FILE [--watch]
#include <unistd.h>

#include <iostream>
#include <map>
#include <thread>

#include "client/cli/commands/commands.h"
#include "client/lib/sweep_render.h"
#include "client/lib/text_format.h"

namespace circuitlab::cli {
namespace {
namespace sweep_cmd {

struct Options {
  std::string file;
  bool watch = false;
};

// Waits for every member to end, showing the members' states; 130 on Ctrl-C.
int WatchSweep(Context& ctx, v1::Sweep sw) {
  const bool tty = isatty(STDERR_FILENO);
  CatchInterrupt(true);
  while (!sw.done() && !Interrupted()) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    auto next = ctx.client.GetSweep(sw.sweep_id());
    if (!next.ok()) return ReportError(next.status());
    sw = std::move(*next);
    std::string states;
    for (const auto& [name, n] : std::map<std::string, uint32_t>(sw.states().begin(), sw.states().end())) {
      v1::RunState state = v1::RUN_STATE_UNSPECIFIED;
      v1::RunState_Parse(name, &state);
      states.append(" ").append(client::StateName(state)).append(" ").append(std::to_string(n));
    }
    std::cerr << (tty ? "\r" : "") << sw.sweep_id() << ":" << states << (tty ? "\033[K" : "\n") << std::flush;
  }
  CatchInterrupt(false);
  if (tty) std::cerr << "\n";
  if (Interrupted()) return 130;
  v1::GetSweepSummaryRequest req;
  req.set_sweep_id(sw.sweep_id());
  auto summary = ctx.client.GetSweepSummary(req);
  if (!summary.ok()) return ReportError(summary.status());
  std::cout << (ctx.g.json ? client::ToJson(*summary) + "\n" : client::SummaryTable(*summary));
  return 0;
}

int Run(Context& ctx, const Options& o) {
  v1::SweepSpec spec;
  if (absl::Status st = client::ReadJsonFile(o.file, &spec); !st.ok()) {
    std::cerr << "error: " << st.message() << "\n";
    return 2;
  }
  auto sw = ctx.client.SubmitSweep(spec);
  if (!sw.ok()) return ReportError(sw.status());
  std::cerr << "submitted " << sw->sweep_id() << " (" << sw->name() << ", " << sw->run_ids_size() << " runs: "
            << (sw->run_ids_size() ? sw->run_ids(0) + ".." + sw->run_ids(sw->run_ids_size() - 1) : "") << ")\n";
  if (!o.watch) {
    std::cout << (ctx.g.json ? client::ToJson(*sw) : sw->sweep_id()) << "\n";
    return 0;
  }
  return WatchSweep(ctx, std::move(*sw));
}

}  // namespace sweep_cmd
}  // namespace

void AddSweep(CLI::App& app, Action* chosen) {
  auto o = std::make_shared<sweep_cmd::Options>();
  CLI::App* sub =
      AddVerb(app, chosen, "sweep",
              "Submit a sweep: a base spec and axes (grid values, random ranges, seeds) expanded into runs under one\n"
              "sweep id. All members are validated first; none is queued if one is invalid.\n"
              "  circuitlab sweep examples/phase_diagram.json --watch",
              o, sweep_cmd::Run);
  sub->add_option("FILE", o->file, "Sweep spec (circuitlab.v1.SweepSpec as JSON)")
      ->required()
      ->check(CLI::ExistingFile);
  sub->add_flag("--watch", o->watch, "Wait for every member to end, showing progress");
}

}  // namespace circuitlab::cli
