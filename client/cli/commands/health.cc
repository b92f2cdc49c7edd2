// circuitlab health
#include <iostream>

#include "client/cli/commands/commands.h"

namespace circuitlab::cli {
namespace {
namespace health_cmd {

struct Options {};

int Run(Context& ctx, const Options&) {
  absl::Status s = ctx.client.Health();
  if (!s.ok()) return ReportError(s);
  std::cout << "SERVING " << ctx.g.server << "\n";
  // Health needs no token; WhoAmI does. Its warning (plaintext beyond
  // loopback) is worth a line when it can be had.
  if (absl::StatusOr<v1::WhoAmIResponse> me = ctx.client.WhoAmI(); me.ok() && !me->warning().empty()) {
    std::cerr << "warning: " << me->warning() << "\n";
  }
  return 0;
}

}  // namespace health_cmd
}  // namespace

void AddHealth(CLI::App& app, Action* chosen) {
  AddVerb(app, chosen, "health", "Check that the server is up and serving.\n  circuitlab health",
          std::make_shared<health_cmd::Options>(), health_cmd::Run);
}

}  // namespace circuitlab::cli
