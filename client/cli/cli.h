// What the `circuitlab` verbs share: global flags, the context a verb runs
// in, exit codes, argument parsing helpers, watching a run, and waiting for an
// analysis job. Each verb lives in commands/<verb>.cc and registers itself
// with an Add<Verb> function (commands.h).
#pragma once

#include <CLI/CLI.hpp>

#include <chrono>
#include <filesystem>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/lib/analysis_wait.h"
#include "client/lib/client.h"

namespace circuitlab::cli {

namespace v1 = circuitlab::v1;

struct Globals {
  std::string server = "127.0.0.1:50051";
  double timeout_s = 30;
  bool json = false;
  std::string token_file;
  std::string ca_cert, client_cert, client_key, tls_server_name;
  bool tls = false;
};

struct Context {
  client::Client& client;
  const Globals& g;
  std::chrono::milliseconds timeout;
};

// What a parsed verb does; set by the verb's parse callback.
using Action = std::function<int(Context&)>;

// 10 + the gRPC code (0 for OK).
int ExitCodeFor(const absl::Status& s);
// Prints the error (and a hint when the server is unreachable); its exit code.
int ReportError(const absl::Status& s);
// queued|running|succeeded|failed|cancelled (any case); CLI::ValidationError otherwise.
v1::RunState ParseState(const std::string& text);
// Splits comma-separated lists, keeping commas inside () and [] (coordinate
// labels such as "OUT:[(0,1,0)]:I" hold them).
std::vector<std::string> SplitList(const std::vector<std::string>& items);
// "4,9,12" -> ids; CLI::ValidationError naming `flag` for anything else.
std::vector<int64_t> ParseIds(const std::string& text, const std::string& flag);

// Ctrl-C: installed while a command waits; the wait ends, the work goes on.
void CatchInterrupt(bool on);
bool Interrupted();

// A spec file (checked without a run) or a run id.
template <typename Request>
absl::Status SetTarget(const std::string& target, Request* req) {
  if (!std::filesystem::exists(target)) {
    req->set_run_id(target);
    return absl::OkStatus();
  }
  absl::StatusOr<v1::ExperimentSpec> spec = client::ReadSpecFile(target);
  if (!spec.ok()) return spec.status();
  *req->mutable_spec() = *spec;
  return absl::OkStatus();
}

// Follows a run live until it ends (0 SUCCEEDED, 1 FAILED/CANCELLED, 130 Ctrl-C).
int DoWatch(client::Client& client, const std::string& run_id, bool json);

// Shows a pending job's id and progress on a terminal; false once Ctrl-C was
// pressed (it then says how to cancel the job).
bool ShowPending(const std::string& what, const std::string& job_id, int state, double progress);
// Clears the progress line.
void EndPending();

// An answer as protobuf JSON (the generic verbs overload it for their
// reflected answers, commands/analysis_verbs.cc).
inline std::string AnswerJson(const google::protobuf::Message& m) { return client::ToJson(m); }

// Waits for an analysis as a person would (job id and progress on a terminal,
// Ctrl-C stops waiting, not the job). Returns the exit code when nothing is
// left to print (an RPC error, --json output, a FAILED or CANCELLED job,
// Ctrl-C); else nullopt with the DONE answer in *out.
template <typename Response, typename Call>
std::optional<int> RunAnalysis(const Context& ctx, const std::string& what, bool force, Call call, Response* out) {
  CatchInterrupt(true);
  std::string job;
  bool stopped = false;
  absl::StatusOr<Response> resp = client::WaitForAnalysis<Response>(call, force, [&](const Response& r) {
    if (!r.job_id().empty()) job = r.job_id();
    stopped = !ShowPending(what, job, static_cast<int>(r.state()), r.progress());
    return !stopped;
  });
  CatchInterrupt(false);
  EndPending();
  if (stopped) return 130;
  if (!resp.ok()) return ReportError(resp.status());
  const int state = static_cast<int>(resp->state());
  if (ctx.g.json) {
    std::cout << AnswerJson(*resp) << "\n";
    return state == v1::ANALYSIS_STATE_DONE ? 0 : 1;
  }
  if (state != v1::ANALYSIS_STATE_DONE) {
    std::cerr << "error: " << what << (state == v1::ANALYSIS_STATE_CANCELLED ? " was cancelled: " : " failed: ")
              << resp->error() << "\n";
    return 1;
  }
  *out = std::move(*resp);
  return std::nullopt;
}

}  // namespace circuitlab::cli
