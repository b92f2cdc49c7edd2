// circuitlab workers
#include <google/protobuf/util/time_util.h>

#include <iomanip>
#include <iostream>

#include "client/cli/commands/commands.h"
#include "client/lib/text_format.h"

namespace circuitlab::cli {
namespace {
namespace workers_cmd {

struct Options {};

std::string Ago(const google::protobuf::Timestamp& t) {
  const int64_t now =
      google::protobuf::util::TimeUtil::TimestampToSeconds(google::protobuf::util::TimeUtil::GetCurrentTime());
  const int64_t s = std::max<int64_t>(0, now - google::protobuf::util::TimeUtil::TimestampToSeconds(t));
  return s < 120 ? std::to_string(s) + " s ago" : std::to_string(s / 60) + " min ago";
}

int Run(Context& ctx, const Options&) {
  absl::StatusOr<v1::ListWorkersResponse> w = ctx.client.ListWorkers();
  if (!w.ok()) return ReportError(w.status());
  if (ctx.g.json) {
    std::cout << client::ToJson(*w) << "\n";
    return 0;
  }
  std::cout << "executor " << w->executor() << ", " << w->workers_size() << " worker(s) connected, " << w->queued_runs()
            << " run(s) queued\n";
  if (w->workers_size() == 0) return 0;
  std::cout << std::left << std::setw(8) << "WORKER" << std::setw(18) << "HOST" << std::setw(18) << "JOB"
            << std::setw(8) << "DEVICE" << std::setw(6) << "SLOTS" << std::setw(14) << "SEEN"
            << "RUNS\n";
  for (const v1::WorkerStatus& s : w->workers()) {
    std::string runs;
    for (const std::string& r : s.run_ids()) runs += (runs.empty() ? "" : ",") + r;
    if (s.draining()) runs += (runs.empty() ? "" : " ") + std::string("(draining)");
    std::cout << std::left << std::setw(8) << s.worker_id() << std::setw(18)
              << client::EscapeForTerminal(s.host()).substr(0, 17) << std::setw(18)
              << client::EscapeForTerminal(s.engine_job().empty() ? "-" : s.engine_job()).substr(0, 17) << std::setw(8)
              << client::EscapeForTerminal(s.device()) << std::setw(6) << s.slots() << std::setw(14)
              << Ago(s.last_seen()) << (runs.empty() ? "-" : runs) << "\n";
  }
  return 0;
}

}  // namespace workers_cmd
}  // namespace

void AddWorkers(CLI::App& app, Action* chosen) {
  AddVerb(app, chosen, "workers",
          "List the remote workers connected to the server (circuitlab-worker processes: Slurm pilots, a\n"
          "Kubernetes Job, by hand) and the runs each trains; the server's executor (local, workers, slurm).\n"
          "  circuitlab workers\n"
          "  circuitlab --json workers",
          std::make_shared<workers_cmd::Options>(), workers_cmd::Run);
}

}  // namespace circuitlab::cli
