// circuitlab metrics RUN|--sweep S [--name N] [--min-step A] [--max-step B] [--max-points K] [--csv]
#include <algorithm>
#include <cstdio>
#include <iostream>

#include "client/cli/commands/commands.h"

namespace circuitlab::cli {
namespace {
namespace metrics_cmd {

struct Options {
  std::string run_id, sweep_id;
  std::vector<std::string> names;
  uint64_t min_step = 0, max_step = 0;
  uint32_t max_points = 0;
  bool csv = false;
};

int Run(Context& ctx, const Options& o) {
  if (o.run_id.empty() == o.sweep_id.empty()) {
    std::fprintf(stderr, "error: give a RUN or --sweep S (one of them)\n");
    return 2;
  }
  std::vector<std::string> runs{o.run_id};
  if (!o.sweep_id.empty()) {
    auto sweep = ctx.client.GetSweep(o.sweep_id);
    if (!sweep.ok()) return ReportError(sweep.status());
    runs.assign(sweep->run_ids().begin(), sweep->run_ids().end());
  }
  if (o.csv) std::cout << "run_id,name,step,value\n";
  for (const std::string& run_id : runs) {
    v1::GetMetricsRequest req;
    req.set_run_id(run_id);
    for (const auto& n : o.names) req.add_names(n);
    req.set_min_step(o.min_step);
    req.set_max_step(o.max_step);
    req.set_max_points(o.max_points);
    auto resp = ctx.client.GetMetrics(req);
    if (!resp.ok()) return ReportError(resp.status());
    if (ctx.g.json) {
      std::cout << client::ToJson(*resp) << "\n";
    } else if (o.csv) {
      for (const auto& s : resp->series()) {
        for (int i = 0; i < s.steps_size(); ++i) {
          std::printf("%s,%s,%llu,%.9g\n", run_id.c_str(), s.name().c_str(),
                      static_cast<unsigned long long>(s.steps(i)), s.values(i));
        }
      }
    } else {
      if (runs.size() > 1) std::printf("%s\n", run_id.c_str());
      std::printf("%-32s %8s %10s %10s %10s %10s\n", "SERIES", "POINTS", "FIRST", "LAST", "MIN", "MAX");
      for (const auto& s : resp->series()) {
        if (s.values_size() == 0) continue;
        auto [mn, mx] = std::minmax_element(s.values().begin(), s.values().end());
        std::printf("%-32s %8llu %10.4f %10.4f %10.4f %10.4f\n", s.name().c_str(),
                    static_cast<unsigned long long>(s.total_points()), s.values(0), s.values(s.values_size() - 1),
                    *mn, *mx);
      }
    }
  }
  return 0;
}

}  // namespace metrics_cmd
}  // namespace

void AddMetrics(CLI::App& app, Action* chosen) {
  auto o = std::make_shared<metrics_cmd::Options>();
  CLI::App* sub = AddVerb(app, chosen, "metrics",
                          "Metric series of a run, or of every run of a sweep (train/loss, eval/<set>/accuracy, ...).\n"
                          "  circuitlab metrics r3 --name eval/icl_rare/accuracy --csv > icl.csv\n"
                          "  circuitlab metrics --sweep s1 --name train/loss --csv > curves.csv   # one CSV, every member",
                          o, metrics_cmd::Run);
  sub->add_option("RUN", o->run_id, "Run id");
  sub->add_option("--sweep", o->sweep_id, "Every member run of this sweep instead of one run");
  sub->add_option("--name,--names", o->names, "Only these series (repeatable, or comma-separated)")->delimiter(',');
  sub->add_option("--min-step", o->min_step, "First step (inclusive)");
  sub->add_option("--max-step", o->max_step, "Last step (inclusive; 0 = no bound)");
  sub->add_option("--max-points", o->max_points, "Downsample each series to at most this many points");
  sub->add_flag("--csv", o->csv, "CSV: run_id,name,step,value");
}

}  // namespace circuitlab::cli
