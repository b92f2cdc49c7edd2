// circuitlab analyses: the analysis jobs queued and running on the server.
#include <cstdio>
#include <iostream>

#include "client/cli/commands/commands.h"
#include "client/lib/text_format.h"

namespace circuitlab::cli {
namespace {
namespace analyses_cmd {

struct Options {};

int Run(Context& ctx, const Options&) {
  auto resp = ctx.client.ListAnalysisJobs();
  if (!resp.ok()) return ReportError(resp.status());
  if (ctx.g.json) {
    std::cout << client::ToJson(*resp) << "\n";
    return 0;
  }
  std::printf("%-7s %-16s %-7s %-8s %8s %10s  %s\n", "JOB", "KIND", "RUN", "STATE", "PROGRESS", "MEMORY", "OWNER");
  for (const v1::AnalysisJob& j : resp->jobs()) {
    std::printf("%-7s %-16s %-7s %-8s %7.0f%% %6llu MiB  %s\n", j.job_id().c_str(), j.kind().c_str(),
                j.run_id().empty() ? "-" : j.run_id().c_str(),
                v1::AnalysisState_Name(j.state()).substr(std::string("ANALYSIS_STATE_").size()).c_str(),
                100 * j.progress(), static_cast<unsigned long long>(j.memory_bytes() >> 20),
                client::EscapeForTerminal(j.owner()).c_str());
  }
  std::cerr << resp->jobs_size() << " job(s); " << resp->workers() << " worker(s), "
            << (resp->memory_in_use_bytes() >> 20) << " of " << (resp->memory_budget_bytes() >> 20)
            << " MiB in use\n";
  return 0;
}

}  // namespace analyses_cmd
}  // namespace

void AddAnalyses(CLI::App& app, Action* chosen) {
  AddVerb(app, chosen, "analyses",
          "List the analysis jobs queued and running on the server (every analysis is a job on its bounded\n"
          "executor: --analysis-workers), oldest first, with the executor's memory in use.\n"
          "  circuitlab analyses",
          std::make_shared<analyses_cmd::Options>(), analyses_cmd::Run);
}

}  // namespace circuitlab::cli
