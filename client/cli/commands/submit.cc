// circuitlab submit FILE [--watch]
#include <iostream>

#include "client/cli/commands/commands.h"

namespace circuitlab::cli {
namespace {
namespace submit_cmd {

struct Options {
  std::string spec_file;
  bool watch = false;
};

int Run(Context& ctx, const Options& o) {
  auto spec = client::ReadSpecFile(o.spec_file);
  if (!spec.ok()) {
    std::cerr << "error: " << spec.status().message() << "\n";
    return 2;
  }
  auto run = ctx.client.SubmitRun(*spec);
  if (!run.ok()) return ReportError(run.status());
  if (ctx.g.json && !o.watch) {
    std::cout << client::ToJson(*run) << "\n";
  } else {
    std::cerr << "submitted " << run->run_id() << " (" << run->name() << ", " << run->spec().training().steps()
              << " steps)\n";
    if (!o.watch) std::cout << run->run_id() << "\n";
  }
  return o.watch ? DoWatch(ctx.client, run->run_id(), ctx.g.json) : 0;
}

}  // namespace submit_cmd
}  // namespace

void AddSubmit(CLI::App& app, Action* chosen) {
  auto o = std::make_shared<submit_cmd::Options>();
  CLI::App* sub = AddVerb(app, chosen, "submit",
                          "Submit an experiment spec (protobuf JSON) as a new run.\n"
                          "  circuitlab submit examples/induction.json --watch",
                          o, submit_cmd::Run);
  sub->add_option("FILE", o->spec_file, "ExperimentSpec JSON file")->required()->check(CLI::ExistingFile);
  sub->add_flag("--watch,-w", o->watch, "Watch the run until it ends");
}

}  // namespace circuitlab::cli
