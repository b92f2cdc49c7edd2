// circuitlab cancel-analysis JOB
#include <iostream>

#include "client/cli/commands/commands.h"

namespace circuitlab::cli {
namespace {
namespace cancel_analysis_cmd {

struct Options {
  std::string job_id;
};

int Run(Context& ctx, const Options& o) {
  auto resp = ctx.client.CancelAnalysis(o.job_id);
  if (!resp.ok()) return ReportError(resp.status());
  if (ctx.g.json) {
    std::cout << client::ToJson(*resp) << "\n";
    return 0;
  }
  std::cout << resp->job().job_id() << " "
            << (resp->job().state() == v1::ANALYSIS_STATE_CANCELLED ? "cancelled"
                                                                    : "cancel requested (stops at its next check)")
            << "\n";
  return 0;
}

}  // namespace cancel_analysis_cmd
}  // namespace

void AddCancelAnalysis(CLI::App& app, Action* chosen) {
  auto o = std::make_shared<cancel_analysis_cmd::Options>();
  CLI::App* sub =
      AddVerb(app, chosen, "cancel-analysis",
              "Stop a queued or running analysis job (its id is shown while an analysis command waits, and by\n"
              "`circuitlab analyses`). A running job stops at its next forward pass.\n"
              "  circuitlab cancel-analysis a7",
              o, cancel_analysis_cmd::Run);
  sub->add_option("JOB", o->job_id, "Analysis job id, e.g. a7")->required();
}

}  // namespace circuitlab::cli
