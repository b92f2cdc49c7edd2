// circuitlab coords RUN [--name N] [--complete] [--csv] [--all] ...
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "client/cli/commands/commands.h"
#include "client/lib/text_format.h"

namespace circuitlab::cli {
namespace {
namespace coords_cmd {

struct Options {
  std::string run_id;
  std::vector<std::string> names;
  bool complete = false, csv = false, all = false;
  uint64_t min_step = 0, max_step = 0;
  uint32_t max_points = 0;
};

void PrintCsv(const std::string& run_id, const v1::GetTrajectoryResponse& resp) {
  std::cout << "run_id,label,canonical,step,value\n";
  for (const auto& s : resp.series()) {
    for (int i = 0; i < s.steps_size(); ++i) {
      std::printf("%s,\"%s\",%s,%llu,%.9g\n", run_id.c_str(), s.coordinate().label().c_str(),
                  s.coordinate().canonical().c_str(), static_cast<unsigned long long>(s.steps(i)), s.values(i));
    }
  }
}

// The largest coordinates (all of them with --all or --name), then rho.
void PrintTable(Context& ctx, const Options& o, const v1::GetTrajectoryResponse& resp) {
  std::vector<const v1::CoordinateSeries*> rows;
  for (const auto& s : resp.series()) rows.push_back(&s);
  const size_t limit = o.all || !o.names.empty() ? rows.size() : std::min<size_t>(30, rows.size());
  if (limit < rows.size()) {
    std::stable_sort(rows.begin(), rows.end(), [](auto* a, auto* b) {
      return std::abs(a->coordinate().magnitude()) > std::abs(b->coordinate().magnitude());
    });
  }
  std::printf("%s %-6s %7s %10s %10s %10s\n", client::Pad("COORDINATE", 34).c_str(), "NAME", "POINTS", "FIRST",
              "LAST", "MAX|.|");
  for (size_t i = 0; i < limit; ++i) {
    const auto& s = *rows[i];
    double mx = 0;
    for (double v : s.values()) mx = std::max(mx, std::abs(v));
    std::printf("%s %-6s %7llu %10.4f %10.4f %10.4f\n", client::Pad(s.coordinate().label(), 34).c_str(),
                s.coordinate().canonical().c_str(), static_cast<unsigned long long>(s.total_points()),
                s.values_size() ? s.values(0) : 0.0, s.values_size() ? s.values(s.values_size() - 1) : 0.0, mx);
  }
  if (limit < rows.size()) {
    std::cerr << limit << " of " << rows.size() << " coordinates (largest last magnitude; --all for every one)\n";
  }
  v1::GetMetricsRequest mreq;
  mreq.set_run_id(o.run_id);
  mreq.add_names("manifold/rho");
  mreq.add_names("manifold/rho_paper");
  if (auto m = ctx.client.GetMetrics(mreq); m.ok()) {
    for (const auto& s : m->series()) {
      if (s.values_size() == 0) continue;
      std::printf("%s %-6s %7llu %10.4f %10.4f\n", client::Pad(s.name(), 34).c_str(), "",
                  static_cast<unsigned long long>(s.total_points()), s.values(0), s.values(s.values_size() - 1));
    }
  }
}

int Run(Context& ctx, const Options& o) {
  v1::GetTrajectoryRequest req;
  req.set_run_id(o.run_id);
  req.set_selection(o.complete ? v1::BASIS_SELECTION_COMPLETE : v1::BASIS_SELECTION_PAPER);
  for (const auto& n : SplitList(o.names)) req.add_names(n);
  req.set_min_step(o.min_step);
  req.set_max_step(o.max_step);
  req.set_max_points(o.max_points);
  auto resp = ctx.client.RunAnalysis<v1::GetTrajectoryResponse>(req);
  if (!resp.ok()) return ReportError(resp.status());
  if (ctx.g.json) {
    std::cout << client::ToJson(*resp) << "\n";
  } else if (o.csv) {
    PrintCsv(o.run_id, *resp);
  } else if (resp->series_size() == 0) {
    std::cerr << "no coordinates recorded for " << o.run_id
              << (o.complete ? " (complete set: set recording.complete_coordinates)" : "") << "\n";
  } else {
    PrintTable(ctx, o, *resp);
  }
  return 0;
}

}  // namespace coords_cmd
}  // namespace

void AddCoords(CLI::App& app, Action* chosen) {
  auto o = std::make_shared<coords_cmd::Options>();
  CLI::App* sub = AddVerb(app, chosen, "coords",
                          "IMIR coordinates over training (recorded every recording.coordinates_every steps).\n"
                          "Names are labels (L2H1:[∅→(1,0)]:I_t) or canonical names (alpha, beta, gamma, delta).\n"
                          "  circuitlab coords r3 --name alpha --name beta --name gamma --csv > abc.csv",
                          o, coords_cmd::Run);
  sub->add_option("RUN", o->run_id, "Run id")->required();
  sub->add_option("--name,--names", o->names, "Only these coordinates (repeatable, or comma-separated)");
  sub->add_flag("--complete", o->complete, "The complete set (needs recording.complete_coordinates)");
  sub->add_option("--min-step", o->min_step, "First step (inclusive)");
  sub->add_option("--max-step", o->max_step, "Last step (inclusive; 0 = no bound)");
  sub->add_option("--max-points", o->max_points, "Downsample each series to at most this many points");
  sub->add_flag("--csv", o->csv, "CSV: run_id,label,canonical,step,value");
  sub->add_flag("--all", o->all, "Show every coordinate (default: the 30 largest)");
}

}  // namespace circuitlab::cli
