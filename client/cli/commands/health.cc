// circuitlab health
#include <chrono>
#include <iostream>
#include <thread>

#include "absl/strings/str_join.h"
#include "client/cli/commands/commands.h"
#include "client/lib/text_format.h"

namespace circuitlab::cli {
namespace {
namespace health_cmd {

struct Options {
  double wait_seconds = 0;
};

int Run(Context& ctx, const Options& o) {
  // --wait: a server just started in the background takes a moment to serve;
  // ask again every 0.2 s until it answers SERVING or the time is up.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.wait_seconds);
  absl::Status s = ctx.client.Health();
  while (!s.ok() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    s = ctx.client.Health();
  }
  if (!s.ok()) return ReportError(s);
  std::cout << "SERVING " << ctx.g.server << "\n";
  // Health needs no token; WhoAmI does. What the server runs on, and its
  // warning (plaintext beyond loopback), are worth lines when they can be had.
  absl::StatusOr<v1::WhoAmIResponse> me = ctx.client.WhoAmI();
  if (!me.ok()) return 0;
  const v1::ServerInfo& info = me->server();
  if (!info.torch_version().empty()) {
    std::cout << "circuitlab " << client::EscapeForTerminal(info.version()) << ", LibTorch "
              << client::EscapeForTerminal(info.torch_version())
              << (info.cuda_runtime().empty() ? " (CPU only)"
                                              : " (CUDA " + client::EscapeForTerminal(info.cuda_runtime()) + ")")
              << ", " << info.cuda_devices() << " CUDA device" << (info.cuda_devices() == 1 ? "" : "s")
              << ", slots " << client::EscapeForTerminal(absl::StrJoin(info.device_slots(), ",")) << "\n";
  }
  if (!me->warning().empty()) std::cerr << "warning: " << me->warning() << "\n";
  return 0;
}

}  // namespace health_cmd
}  // namespace

void AddHealth(CLI::App& app, Action* chosen) {
  auto opts = std::make_shared<health_cmd::Options>();
  CLI::App* sub = AddVerb(app, chosen, "health",
                          "Check that the server is up and serving; with a token, also what it runs on (LibTorch,\n"
                          "CUDA devices, slots).\n  circuitlab health\n"
                          "  circuitlab-server --data \"$(mktemp -d)\" & circuitlab health --wait 30   # until it serves",
                          opts, health_cmd::Run);
  sub->add_option("--wait", opts->wait_seconds,
                  "Keep asking, every 0.2 s, for up to this many seconds until the server answers (for a server "
                  "just started)")
      ->check(CLI::Range(0.0, 3600.0));
}

}  // namespace circuitlab::cli
