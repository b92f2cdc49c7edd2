// GetRun latency on an idle server and while heavy analyses run (issue 13).
// Drives a running circuitlab-server through the client library: first
// --reads GetRun calls on the idle server, then --jobs interventions (each a
// distinct job: its own seed) from their own threads, each waiting for its
// answer as the CLI does, while this thread keeps calling GetRun until every
// analysis has answered. Prints p50/p99/max of both phases and the analyses'
// wall time. bench/analysis_load.sh starts the server and trains the run.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "client/lib/client.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace v1 = circuitlab::v1;

struct Latency {
  std::vector<double> ms;
  double Quantile(double q) const {
    if (ms.empty()) return 0;
    std::vector<double> s = ms;
    std::sort(s.begin(), s.end());
    return s[std::min(s.size() - 1, static_cast<size_t>(q * static_cast<double>(s.size())))];
  }
};

circuitlab::client::Client Connect(const std::string& server) {
  circuitlab::client::ClientOptions opts;
  opts.server = server;
  opts.timeout = std::chrono::seconds(60);
  return circuitlab::client::Client(opts);
}

// One GetRun, timed; false when it failed.
bool TimedGetRun(circuitlab::client::Client& c, const std::string& run, Latency& out) {
  const auto t0 = Clock::now();
  const bool ok = c.GetRun(run).ok();
  out.ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  return ok;
}

void Print(const char* phase, const Latency& l, int failed) {
  std::printf("%-34s %6zu calls  p50 %7.2f ms  p99 %7.2f ms  max %8.2f ms  failed %d\n", phase, l.ms.size(),
              l.Quantile(0.5), l.Quantile(0.99), l.Quantile(1.0), failed);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GetRun latency, idle and under heavy analysis jobs"};
  std::string server = "127.0.0.1:50051", run = "r1", kind = "intervene";
  int reads = 500, jobs = 8;
  uint32_t n_eval = 16384;
  app.add_option("--server", server)->capture_default_str();
  app.add_option("--run", run, "A finished run with a checkpoint")->capture_default_str();
  app.add_option("--reads", reads, "GetRun calls on the idle server")->capture_default_str();
  app.add_option("--jobs", jobs, "Heavy analyses at once")->capture_default_str();
  app.add_option("--n-eval", n_eval, "Sequences per evaluation set of each intervention")->capture_default_str();
  app.add_option("--kind", kind, "intervene or detect")->check(CLI::IsMember({"intervene", "detect"}));
  CLI11_PARSE(app, argc, argv);

  circuitlab::client::Client c = Connect(server);
  Latency idle;
  int idle_failed = 0;
  for (int i = 0; i < reads; ++i) idle_failed += TimedGetRun(c, run, idle) ? 0 : 1;
  Print("GetRun, idle server", idle, idle_failed);

  std::atomic<int> answered{0}, analysis_failed{0};
  std::vector<std::thread> callers;
  const auto t0 = Clock::now();
  const uint64_t base_seed = static_cast<uint64_t>(t0.time_since_epoch().count() % 1000000) * 100;
  for (int j = 0; j < jobs; ++j) {
    callers.emplace_back([&, j] {
      circuitlab::client::Client own = Connect(server);
      int state = v1::ANALYSIS_STATE_QUEUED;
      std::string error;
      while (state == v1::ANALYSIS_STATE_QUEUED || state == v1::ANALYSIS_STATE_RUNNING) {
        if (kind == "intervene") {
          v1::InterveneRequest req;
          req.set_run_id(run);
          req.set_n_eval(n_eval);
          req.set_seed(base_seed + static_cast<uint64_t>(j) + 1);  // a fresh job, never a stored answer
          req.add_interventions()->set_op(v1::Intervention::OP_ABLATE_HEAD);
          req.mutable_interventions(0)->set_layer(1);
          auto r = own.RunAnalysis<v1::InterveneResponse>(req);
          state = r.ok() ? r->state() : v1::ANALYSIS_STATE_FAILED;
          error = r.ok() ? r->error() : r.status().ToString();
        } else {
          v1::DetectCircuitRequest req;
          req.set_run_id(run);
          req.set_n_eval(std::min<uint32_t>(n_eval, 4096));
          req.set_seed(base_seed + static_cast<uint64_t>(j) + 1);
          auto r = own.RunAnalysis<v1::DetectCircuitResponse>(req);
          state = r.ok() ? r->state() : v1::ANALYSIS_STATE_FAILED;
          error = r.ok() ? r->error() : r.status().ToString();
        }
      }
      if (state != v1::ANALYSIS_STATE_DONE) {
        std::fprintf(stderr, "analysis %d ended %d: %s\n", j, state, error.c_str());
        ++analysis_failed;
      }
      ++answered;
    });
  }
  Latency loaded;
  int loaded_failed = 0;
  while (answered.load() < jobs) {
    loaded_failed += TimedGetRun(c, run, loaded) ? 0 : 1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  for (std::thread& t : callers) t.join();
  char phase[64];
  std::snprintf(phase, sizeof phase, "GetRun, %d %s jobs running", jobs, kind.c_str());
  Print(phase, loaded, loaded_failed);
  std::printf("%d analyses answered in %.1f s (%d not DONE)\n", jobs, wall, analysis_failed.load());
  return loaded_failed + idle_failed + analysis_failed.load() == 0 ? 0 : 1;
}
