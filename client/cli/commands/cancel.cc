// circuitlab cancel RUN [--wait]
#include <iostream>
#include <thread>

#include "client/cli/commands/commands.h"
#include "client/lib/text_format.h"

namespace circuitlab::cli {
namespace {
namespace cancel_cmd {

struct Options {
  std::string run_id;
  bool wait = false;
};

int Run(Context& ctx, const Options& o) {
  auto run = ctx.client.CancelRun(o.run_id);
  if (!run.ok()) return ReportError(run.status());
  const auto deadline = std::chrono::steady_clock::now() + ctx.timeout;
  while (o.wait && !client::IsFinal(run->state()) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    run = ctx.client.GetRun(o.run_id);
    if (!run.ok()) return ReportError(run.status());
  }
  if (ctx.g.json) {
    std::cout << client::ToJson(*run) << "\n";
  } else {
    std::cout << run->run_id() << " "
              << (client::IsFinal(run->state()) ? client::StateName(run->state())
                                                : "cancel requested (stops at its next step)")
              << "\n";
  }
  return 0;
}

}  // namespace cancel_cmd
}  // namespace

void AddCancel(CLI::App& app, Action* chosen) {
  auto o = std::make_shared<cancel_cmd::Options>();
  CLI::App* sub = AddVerb(app, chosen, "cancel", "Cancel a queued or running run.\n  circuitlab cancel r3 --wait", o,
                          cancel_cmd::Run);
  sub->add_option("RUN", o->run_id, "Run id")->required();
  sub->add_flag("--wait", o->wait, "Wait (up to --timeout) until the run has stopped");
}

}  // namespace circuitlab::cli
