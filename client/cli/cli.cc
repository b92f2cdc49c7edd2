#include "client/cli/cli.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <sstream>
#include <stdexcept>
#include <cstdio>

#include "client/lib/run_render.h"
#include "client/lib/text_format.h"

namespace circuitlab::cli {
namespace {

std::atomic<bool> g_interrupted{false};
extern "C" void OnSigint(int) { g_interrupted.store(true); }

}  // namespace

int ExitCodeFor(const absl::Status& s) { return s.ok() ? 0 : 10 + static_cast<int>(s.code()); }

int ReportError(const absl::Status& s) {
  std::cerr << "error: " << absl::StatusCodeToString(s.code()) << ": " << s.message() << "\n";
  if (s.code() == absl::StatusCode::kUnauthenticated) {
    std::cerr << "hint: pass your token with --token-file FILE (or CIRCUITLAB_TOKEN_FILE)\n";
  }
  if (s.code() == absl::StatusCode::kUnavailable) {
    std::cerr << "hint: is circuitlab-server running and reachable at the --server address? A server with TLS "
                 "needs --ca-cert FILE (or --tls); one with mutual TLS also --client-cert and --client-key\n";
  }
  return ExitCodeFor(s);
}

v1::RunState ParseState(const std::string& text) {
  std::string up = text;
  std::transform(up.begin(), up.end(), up.begin(), ::toupper);
  v1::RunState s;
  if (v1::RunState_Parse("RUN_STATE_" + up, &s) || v1::RunState_Parse(up, &s)) return s;
  throw CLI::ValidationError("--state", "unknown state '" + text + "' (queued|running|succeeded|failed|cancelled)");
}

std::vector<int64_t> ParseIds(const std::string& text, const std::string& flag) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      size_t used = 0;
      out.push_back(std::stoll(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw CLI::ValidationError(flag, "expects comma-separated integers, got '" + text + "'");
    }
  }
  return out;
}

std::vector<std::string> SplitList(const std::vector<std::string>& items) {
  std::vector<std::string> out;
  for (const std::string& item : items) {
    int depth = 0;
    std::string cur;
    for (char c : item) {
      if (c == '(' || c == '[') ++depth;
      if (c == ')' || c == ']') --depth;
      if (c == ',' && depth == 0) {
        if (!cur.empty()) out.push_back(cur);
        cur.clear();
      } else {
        cur += c;
      }
    }
    if (!cur.empty()) out.push_back(cur);
  }
  return out;
}

void CatchInterrupt(bool on) { std::signal(SIGINT, on ? OnSigint : SIG_DFL); }

bool Interrupted() { return g_interrupted.load(); }

int DoWatch(client::Client& client, const std::string& run_id, bool json) {
  client::ProgressPrinter printer(json);
  v1::WatchRunRequest req;
  req.set_run_id(run_id);
  req.set_include_metrics(true);
  CatchInterrupt(true);
  absl::Status s = client.Watch(req, [&](const v1::RunEvent& ev) { printer.OnEvent(ev); }, g_interrupted);
  CatchInterrupt(false);
  printer.EndLine();
  if (absl::IsCancelled(s) && Interrupted()) {
    std::cerr << "stopped watching; " << run_id << " goes on (circuitlab cancel " << run_id << " stops it)\n";
    return 130;
  }
  if (!s.ok()) return ReportError(s);
  if (!json && client::IsFinal(printer.state())) {
    std::cout << run_id << " " << client::StateName(printer.state()) << "\n";
    for (const auto& [name, value] : printer.latest()) std::printf("  %-32s %.4f\n", name.c_str(), value);
  }
  return printer.state() == v1::RUN_STATE_SUCCEEDED ? 0 : 1;
}

bool ShowPending(const std::string& what, const std::string& job_id, int state, double progress) {
  const bool tty = isatty(STDERR_FILENO);
  if (Interrupted()) {
    if (tty) std::cerr << "\r\033[K";
    std::cerr << "stopped waiting; " << what << " (job " << job_id << ") goes on (circuitlab cancel-analysis "
              << job_id << " stops it)\n";
    return false;
  }
  if (tty) {
    std::cerr << "\r" << job_id << " " << (state == v1::ANALYSIS_STATE_QUEUED ? "queued " : "running ")
              << client::Fixed(100 * progress, 0) << "%\033[K" << std::flush;
  }
  return true;
}

void EndPending() {
  if (isatty(STDERR_FILENO)) std::cerr << "\r\033[K";
}

}  // namespace circuitlab::cli
