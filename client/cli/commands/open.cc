// circuitlab open
#include <iostream>

#include "client/cli/commands/commands.h"

namespace circuitlab::cli {
namespace {
namespace open_cmd {

struct Options {
  std::string target;
  std::string dashboard;
};

// The dashboard of the server --server names: its host on the HTTP port's
// default (8080), https when the gRPC connection uses TLS.
std::string DefaultDashboard(const Globals& g) {
  std::string host = g.server;
  if (const size_t colon = host.rfind(':'); colon != std::string::npos && host.find(']') == std::string::npos) {
    host.resize(colon);
  } else if (const size_t close = host.find(']'); close != std::string::npos) {
    host.resize(close + 1);
  }
  const bool tls = g.tls || !g.ca_cert.empty();
  return std::string(tls ? "https" : "http") + "://" + (host.empty() ? "127.0.0.1" : host) + ":8080/";
}

int Run(Context& ctx, const Options& o) {
  std::string base = o.dashboard.empty() ? DefaultDashboard(ctx.g) : o.dashboard;
  if (base.back() != '/') base += '/';
  std::string page;
  if (!o.target.empty() && (o.target[0] == 's' || o.target[0] == 'S')) {
    absl::StatusOr<v1::Sweep> s = ctx.client.GetSweep(o.target);
    if (!s.ok()) return ReportError(s.status());
    page = "#/sweep/" + s->sweep_id();
  } else if (!o.target.empty()) {
    absl::StatusOr<v1::Run> r = ctx.client.GetRun(o.target);
    if (!r.ok()) return ReportError(r.status());
    page = "#/run/" + r->run_id();
  }
  const std::string url = base + page;
  if (ctx.g.json) {
    std::cout << "{\"url\": \"" << url << "\"}\n";
  } else {
    std::cout << url << "\n";
  }
  return 0;
}

}  // namespace open_cmd
}  // namespace

void AddOpen(CLI::App& app, Action* chosen) {
  auto opts = std::make_shared<open_cmd::Options>();
  CLI::App* sub = AddVerb(app, chosen, "open",
                          "Print the dashboard URL of a run (r3), a sweep (s2), or, with no argument, the runs table.\n"
                          "The run or sweep is looked up first, so a typo is an error, not a dead link.\n"
                          "  circuitlab open r3\n"
                          "  xdg-open $(circuitlab open s2)",
                          opts, open_cmd::Run);
  sub->add_option("target", opts->target, "Run (r3) or sweep (s2) id");
  sub->add_option("--dashboard", opts->dashboard,
                  "The server's dashboard URL (its --http address; the server logs it at start). Default: the "
                  "--server host on port 8080")
      ->envname("CIRCUITLAB_DASHBOARD");
}

}  // namespace circuitlab::cli
