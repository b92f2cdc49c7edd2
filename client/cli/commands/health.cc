// circuitlab health
#include <iostream>

#include "absl/strings/str_join.h"
#include "client/cli/commands/commands.h"
#include "client/lib/text_format.h"

namespace circuitlab::cli {
namespace {
namespace health_cmd {

struct Options {};

int Run(Context& ctx, const Options&) {
  absl::Status s = ctx.client.Health();
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
  AddVerb(app, chosen, "health", "Check that the server is up and serving; with a token, also what it runs on (LibTorch, CUDA\n"
          "devices, slots).\n  circuitlab health",
          std::make_shared<health_cmd::Options>(), health_cmd::Run);
}

}  // namespace circuitlab::cli
