// The verbs of `circuitlab`, one file each under commands/. Add<Verb> defines
// the verb's subcommand and options on `app`; when the verb is parsed, it
// sets *chosen to the verb's action. main.cpp calls every Add<Verb>.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "client/cli/cli.h"

namespace circuitlab::cli {

// A verb whose options live in `opts` (kept alive by the action).
template <typename Options>
CLI::App* AddVerb(CLI::App& app, Action* chosen, const std::string& name, const std::string& help,
                  std::shared_ptr<Options> opts, int (*run)(Context&, const Options&)) {
  CLI::App* sub = app.add_subcommand(name, help);
  sub->callback([chosen, opts, run] { *chosen = [opts, run](Context& ctx) { return run(ctx, *opts); }; });
  return sub;
}

// Runs
void AddSubmit(CLI::App& app, Action* chosen);
void AddLs(CLI::App& app, Action* chosen);
void AddShow(CLI::App& app, Action* chosen);
void AddCompare(CLI::App& app, Action* chosen);
void AddWatch(CLI::App& app, Action* chosen);
void AddCancel(CLI::App& app, Action* chosen);
void AddRm(CLI::App& app, Action* chosen);
void AddMetrics(CLI::App& app, Action* chosen);
void AddCoords(CLI::App& app, Action* chosen);
void AddOpen(CLI::App& app, Action* chosen);
// Sweeps
void AddSweep(CLI::App& app, Action* chosen);
void AddSweepShow(CLI::App& app, Action* chosen);
void AddSweepCancel(CLI::App& app, Action* chosen);
void AddSweepSummary(CLI::App& app, Action* chosen);
// Analyses (jobs on the server)
void AddProject(CLI::App& app, Action* chosen);
void AddInvariance(CLI::App& app, Action* chosen);
void AddDetect(CLI::App& app, Action* chosen);
void AddIntervene(CLI::App& app, Action* chosen);
void AddLabel(CLI::App& app, Action* chosen);
void AddDataDependence(CLI::App& app, Action* chosen);
void AddTaskVectors(CLI::App& app, Action* chosen);
void AddAttention(CLI::App& app, Action* chosen);
void AddActivations(CLI::App& app, Action* chosen);
void AddExport(CLI::App& app, Action* chosen);
void AddReproduce(CLI::App& app, Action* chosen);
void AddAnalyses(CLI::App& app, Action* chosen);
void AddCancelAnalysis(CLI::App& app, Action* chosen);
// Every other AnalysisService job, from the descriptor (analysis_verbs.cc).
void AddAnalysisVerbs(CLI::App& app, Action* chosen);
// The server
void AddHealth(CLI::App& app, Action* chosen);
void AddWhoAmI(CLI::App& app, Action* chosen);
void AddWorkers(CLI::App& app, Action* chosen);

}  // namespace circuitlab::cli
