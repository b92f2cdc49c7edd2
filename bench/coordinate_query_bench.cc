// Coordinate storage benchmark: write throughput of the batching writer, and
// the three query shapes the schema is built for, on runs of 100 coordinates
// x 2000 recorded steps:
//   (a) coordinate X over all steps of run R      (GetTrajectory, one name)
//   (b) all coordinates of run R at step s        (CoordinatesAt)
//   (c) coordinate X at the last step of N runs   (LastCoordinateOfRuns)
// Prints one JSON object; times are medians over repetitions.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "server/store/store.h"

namespace cs = circuitlab::store;

namespace {

template <typename Fn>
double MedianMillis(int reps, Fn&& fn) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto a = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"coordinate storage benchmark"};
  int runs = 10, coords = 100, steps = 2000, reps = 50;
  int metric_steps = 250000;  // x 8 series = 2 M metric points in one run (GetRun's latest values)
  app.add_option("--runs", runs);
  app.add_option("--coords", coords);
  app.add_option("--steps", steps);
  app.add_option("--reps", reps);
  app.add_option("--metric-steps", metric_steps);
  CLI11_PARSE(app, argc, argv);

  const std::string dir = std::filesystem::temp_directory_path() / "circuitlab-coord-bench";
  std::filesystem::remove_all(dir);
  auto store = cs::Store::Open(dir);
  if (!store.ok()) return 1;
  // A SUCCEEDED run row (its spec does not matter here).
  auto new_run = [&](const std::string& name) {
    cs::NewRun nr;
    nr.name = name;
    nr.spec = "x";
    nr.spec_json = "{}";
    nr.state = 3;
    return *(*store)->InsertRun(nr);
  };
  std::vector<int64_t> run_ids;
  auto w0 = std::chrono::steady_clock::now();
  for (int r = 0; r < runs; ++r) {
    const int64_t id = new_run("bench");
    run_ids.push_back(id);
    std::vector<cs::CoordinateDefRow> defs;
    for (int i = 0; i < coords; ++i) {
      cs::CoordinateDefRow d;
      d.index = i;
      d.label = "L2H1:[∅→(1,0)]:c" + std::to_string(i);
      d.matrix = "L2H1";
      d.element = "c" + std::to_string(i);
      d.norm = 1;
      defs.push_back(d);
    }
    auto ids = *(*store)->PutCoordinateDefs(id, "paper", defs);
    for (int s = 1; s <= steps; ++s) {
      std::vector<double> values(coords);
      for (int i = 0; i < coords; ++i) values[i] = 0.001 * s * (i + 1);
      (*store)->AppendCoordinates(id, s, ids, values);
    }
  }
  if (!(*store)->Flush().ok()) return 1;
  const double write_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();

  cs::TrajectoryQuery q;
  q.names = {"L2H1:[∅→(1,0)]:c42"};
  size_t points = 0;
  const double a =
      MedianMillis(reps, [&] { points = (*(*store)->GetTrajectory(run_ids[run_ids.size() / 2], q))[0].steps.size(); });
  size_t rows = 0;
  const double b = MedianMillis(
      reps, [&] { rows = (*store)->CoordinatesAt(run_ids[run_ids.size() / 2], "paper", steps / 2)->size(); });
  size_t last = 0;
  const double c = MedianMillis(
      reps, [&] { last = (*store)->LastCoordinateOfRuns(run_ids, "paper", "L2H1:[∅→(1,0)]:c42")->size(); });

  // Metrics: one run with 8 series of metric_steps points; the latest value of each.
  const int64_t metric_run = new_run("metrics");
  const auto m0 = std::chrono::steady_clock::now();
  for (int s = 1; s <= metric_steps; s += 500) {
    std::vector<cs::MetricPoint> batch;
    for (int k = s; k < s + 500 && k <= metric_steps; ++k) {
      for (int n = 0; n < 8; ++n) batch.push_back({"series/" + std::to_string(n), k, 1.0 / k});
    }
    (*store)->AppendMetrics(metric_run, std::move(batch));
  }
  if (!(*store)->Flush().ok()) return 1;
  const double metric_write_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - m0).count();
  size_t latest = 0;
  const double d = MedianMillis(std::max(3, reps / 10), [&] { latest = (*store)->LatestMetrics(metric_run)->size(); });
  std::fprintf(stderr, "metrics: %lld points written in %.2f s (%.0f rows/s); latest values of %zu series: %.3f ms\n",
               8LL * metric_steps, metric_write_s, 8.0 * metric_steps / metric_write_s, latest, d);
  const auto db_bytes = std::filesystem::file_size(dir + "/circuitlab.db");
  std::printf(
      "{\"runs\": %d, \"coords\": %d, \"steps\": %d, \"rows\": %lld, \"write_s\": %.2f, \"rows_per_s\": %.0f, "
      "\"db_mb\": %.1f, \"series_ms\": %.3f, \"series_points\": %zu, \"at_step_ms\": %.3f, \"at_step_rows\": %zu, "
      "\"last_of_runs_ms\": %.3f, \"last_of_runs\": %zu, \"metric_points\": %lld, \"metric_rows_per_s\": %.0f, "
      "\"latest_metrics_ms\": %.3f}\n",
      runs, coords, steps, static_cast<long long>(runs) * coords * steps, write_s,
      runs * static_cast<double>(coords) * steps / write_s, db_bytes / 1048576.0, a, points, b, rows, c, last,
      8LL * metric_steps, 8.0 * metric_steps / metric_write_s, d);
  store->reset();
  std::filesystem::remove_all(dir);
  return 0;
}
