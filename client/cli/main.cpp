// circuitlab: the command-line client. A thin layer over client::Client:
// parse flags, call, print (human tables by default, --json for scripts).
// Each verb lives in commands/<verb>.cc; what they share is in cli.h.
//
// Exit codes: 0 success; 1 the watched run ended FAILED or CANCELLED (or an
// analysis FAILED); 2 bad usage or spec file; 10 + gRPC status code for an
// RPC error (e.g. 13 INVALID_ARGUMENT, 15 NOT_FOUND, 18 RESOURCE_EXHAUSTED,
// 24 UNAVAILABLE); 130 waiting stopped by Ctrl-C (the run or job goes on).
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>
#include <tuple>

#include "client/cli/cli.h"
#include "client/cli/commands/commands.h"

int main(int argc, char** argv) {
  using namespace circuitlab::cli;
  CLI::App app{
      "circuitlab: submit, watch and query experiments on a circuitlab-server.\n\n"
      "Exit codes: 0 ok; 1 the watched run FAILED/was CANCELLED; 2 bad usage or spec; 10+code for a\n"
      "gRPC error (13 INVALID_ARGUMENT, 15 NOT_FOUND, 18 RESOURCE_EXHAUSTED, 24 UNAVAILABLE);\n"
      "130 waiting stopped by Ctrl-C (the run or analysis job goes on).",
      "circuitlab"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "circuitlab " CIRCUITLAB_VERSION);
  Globals g;
  app.add_option("--server", g.server, "Server address host:port")->capture_default_str()->envname("CIRCUITLAB_TARGET");
  app.add_option("--timeout", g.timeout_s, "Deadline of each call, in seconds (0 < t <= 86400)")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& text) {
            const double t = std::strtod(text.c_str(), nullptr);
            return t > 0 && t <= 86400 ? std::string() : "must be a number of seconds in (0, 86400], got " + text;
          },
          "SECONDS"));
  app.add_flag("--json", g.json, "Machine-readable output (protobuf JSON)");
  app.add_option("--token-file", g.token_file, "File with your bearer token (first line)")
      ->check(CLI::ExistingFile)
      ->envname("CIRCUITLAB_TOKEN_FILE");
  app.add_option("--ca-cert", g.ca_cert, "Connect with TLS, trusting the server certificate this PEM CA signed")
      ->check(CLI::ExistingFile)
      ->envname("CIRCUITLAB_CA_CERT");
  app.add_flag("--tls", g.tls, "Connect with TLS, trusting the system's CAs");
  app.add_option("--client-cert", g.client_cert, "PEM client certificate, for a server that requires mutual TLS")
      ->check(CLI::ExistingFile)
      ->envname("CIRCUITLAB_CLIENT_CERT");
  app.add_option("--client-key", g.client_key, "PEM key of --client-cert")
      ->check(CLI::ExistingFile)
      ->envname("CIRCUITLAB_CLIENT_KEY");
  app.add_option("--tls-server-name", g.tls_server_name,
                 "Check the server's certificate for this name instead of the --server host");

  Action chosen;
  for (auto add : {AddSubmit,     AddLs,        AddShow,      AddWatch,          AddCancel,
                   AddRm,         AddMetrics,   AddCoords,    AddOpen,           AddProject,
                   AddInvariance, AddSweep,     AddSweepShow, AddSweepCancel,    AddSweepSummary,
                   AddDetect,     AddIntervene, AddLabel,     AddDataDependence, AddTaskVectors, AddAttention, AddActivations, AddExport, AddCompare,
                   AddHealth,     AddWhoAmI,    AddAnalyses,  AddCancelAnalysis, AddWorkers, AddReproduce, AddAnalysisVerbs}) {
    add(app, &chosen);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (app.get_subcommands().empty() && dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
      std::cerr << "error: " << (argc > 1 ? "unknown command" : "no command") << "; the commands are:\n";
      for (const CLI::App* sub : app.get_subcommands({})) std::cerr << "  " << sub->get_name() << "\n";
      std::cerr << "circuitlab COMMAND --help explains one, with an example\n";
      return 2;
    }
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (!chosen) return 2;

  circuitlab::client::ClientOptions opts;
  opts.server = g.server;
  opts.timeout = std::chrono::milliseconds(static_cast<int64_t>(g.timeout_s * 1000));
  if (!g.token_file.empty()) {
    absl::StatusOr<std::string> token = circuitlab::client::ReadTextFile(g.token_file, 4096);
    if (!token.ok()) {
      std::cerr << "error: --token-file: " << token.status().message() << "\n";
      return 2;
    }
    // The first line, without the whitespace and CR an editor leaves.
    std::string line = token->substr(0, token->find('\n'));
    const size_t begin = line.find_first_not_of(" \t\r"), end = line.find_last_not_of(" \t\r");
    opts.token = begin == std::string::npos ? "" : line.substr(begin, end - begin + 1);
  }
  opts.tls = g.tls;
  opts.tls_server_name = g.tls_server_name;
  for (auto [flag, path, pem] : {std::tuple{"--ca-cert", &g.ca_cert, &opts.ca_cert_pem},
                                 std::tuple{"--client-cert", &g.client_cert, &opts.client_cert_pem},
                                 std::tuple{"--client-key", &g.client_key, &opts.client_key_pem}}) {
    if (path->empty()) continue;
    absl::StatusOr<std::string> text = circuitlab::client::ReadTextFile(*path, 1 << 20);
    if (!text.ok()) {
      std::cerr << "error: " << flag << ": " << text.status().message() << "\n";
      return 2;
    }
    *pem = *std::move(text);
  }
  if (opts.client_cert_pem.empty() != opts.client_key_pem.empty()) {
    std::cerr << "error: --client-cert and --client-key go together\n";
    return 2;
  }
  circuitlab::client::Client client(opts);
  Context ctx{client, g, opts.timeout};
  return chosen(ctx);
}
