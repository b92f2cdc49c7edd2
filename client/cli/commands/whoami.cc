// circuitlab whoami
#include <iostream>

#include "client/cli/commands/commands.h"
#include "client/lib/text_format.h"

namespace circuitlab::cli {
namespace {
namespace whoami_cmd {

struct Options {};

int Run(Context& ctx, const Options&) {
  absl::StatusOr<v1::WhoAmIResponse> me = ctx.client.WhoAmI();
  if (!me.ok()) return ReportError(me.status());
  if (ctx.g.json) {
    std::cout << client::ToJson(*me) << "\n";
    return 0;
  }
  std::cout << "principal  " << client::EscapeForTerminal(me->principal()) << "\n"
            << "role       " << me->role() << "\n"
            << "peer       " << client::EscapeForTerminal(me->peer()) << "\n"
            << "transport  " << (me->tls() ? "TLS" : "plaintext") << "\n"
            << "runs       " << (me->private_runs() ? "private (a user sees only its own)" : "shared (all see all)")
            << "\n"
            << "limits     " << me->max_queued_runs() << " queued runs, " << me->max_analysis_jobs()
            << " analysis jobs, " << me->max_watches() << " watch streams, " << me->max_sweep_runs()
            << " runs per sweep\n";
  if (!me->warning().empty()) std::cerr << "warning: " << client::EscapeForTerminal(me->warning()) << "\n";
  return 0;
}

}  // namespace whoami_cmd
}  // namespace

void AddWhoAmI(CLI::App& app, Action* chosen) {
  AddVerb(app, chosen, "whoami",
          "Print who the server takes you for: your principal (from your token), role and limits.\n"
          "  circuitlab whoami\n"
          "  circuitlab --token-file ~/.circuitlab/alice.token --ca-cert certs/ca.pem whoami",
          std::make_shared<whoami_cmd::Options>(), whoami_cmd::Run);
}

}  // namespace circuitlab::cli
