// Scheduler overhead per tiny run (issue 20, target 6: < 20 ms), against a
// real server on the local executor (bench/scheduler_overhead.sh starts it):
// tiny runs (1 step, the smallest evaluation) submitted one after another,
// each followed over its watch stream, timed at three points:
//   submit  SubmitRun answered (the run is stored QUEUED)
//   start   the RUNNING state event (a slot took it: queue -> slot -> store)
//   end     the SUCCEEDED state event (model, 1 step, evaluation, final checkpoint, store)
// "overhead" is what is not the engine's work: submit + (start - submit) +
// the end's store/announce part is inside `end`, so the script also reports a
// 0-step-like lower bound from the FakeExecutor-free path: end - start.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <vector>

#include "client/lib/client.h"

namespace v1 = circuitlab::v1;
using Clock = std::chrono::steady_clock;

namespace {

double Ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

void Report(const char* what, std::vector<double> v) {
  std::sort(v.begin(), v.end());
  std::printf("%-34s median %7.2f ms  p90 %7.2f ms  max %7.2f ms\n", what, v[v.size() / 2], v[v.size() * 9 / 10],
              v.back());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"scheduler_overhead_bench: submit -> RUNNING -> SUCCEEDED of tiny runs"};
  std::string server = "127.0.0.1:50051";
  int runs = 30;
  app.add_option("--server", server);
  app.add_option("--runs", runs);
  CLI11_PARSE(app, argc, argv);

  absl::StatusOr<v1::ExperimentSpec> spec = circuitlab::client::ParseSpecJson(R"({
    "name": "tiny", "seed": 1,
    "task": {"associative_recall": {"num_common": 4, "num_rare": 12, "num_heldout": 4, "num_blocks": 4,
                                    "num_positions": 8}},
    "training": {"steps": 1, "batch_size": 8},
    "recording": {"metrics_every": 1, "eval_every": 1, "eval_size": 16, "checkpoint_every": 1}
  })");
  if (!spec.ok()) return 1;
  circuitlab::client::ClientOptions co;
  co.server = server;
  circuitlab::client::Client client(co);
  std::vector<double> submit, queued, running, total;
  for (int i = 0; i < runs; ++i) {
    const Clock::time_point t0 = Clock::now();
    absl::StatusOr<v1::Run> run = client.SubmitRun(*spec);
    const Clock::time_point t1 = Clock::now();
    if (!run.ok()) {
      std::fprintf(stderr, "%s\n", run.status().ToString().c_str());
      return 1;
    }
    Clock::time_point started = t1, ended = t1;
    v1::WatchRunRequest req;
    req.set_run_id(run->run_id());
    std::atomic<bool> stop{false};
    absl::Status s = client.Watch(
        req,
        [&](const v1::RunEvent& ev) {
          const v1::RunState st = ev.has_state()      ? ev.state().state()
                                  : ev.has_snapshot() ? ev.snapshot().state()
                                                      : v1::RUN_STATE_UNSPECIFIED;
          if (st == v1::RUN_STATE_RUNNING && started == t1) started = Clock::now();
          if (st == v1::RUN_STATE_SUCCEEDED) ended = Clock::now();
        },
        stop);
    if (!s.ok() || ended == t1) {
      std::fprintf(stderr, "run %s did not succeed: %s\n", run->run_id().c_str(), s.ToString().c_str());
      return 1;
    }
    if (started == t1) started = ended;  // RUNNING not seen separately (the snapshot was already final)
    submit.push_back(Ms(t0, t1));
    queued.push_back(Ms(t1, started));
    running.push_back(Ms(started, ended));
    total.push_back(Ms(t0, ended));
  }
  std::printf("%d tiny runs (1 step, eval_size 16, checkpoint at the end), one after another:\n", runs);
  Report("SubmitRun call", submit);
  Report("submit answered -> RUNNING seen", queued);
  Report("RUNNING -> SUCCEEDED seen", running);
  Report("submit -> SUCCEEDED (total)", total);
  return 0;
}
