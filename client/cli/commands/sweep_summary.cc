// circuitlab sweep-summary SWEEP [--values ...] [--filter ...] [--pivot X Y --value V] [--csv|--svg F] [--wait]
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <thread>

#include "client/cli/commands/commands.h"
#include "client/lib/sweep_render.h"

namespace circuitlab::cli {
namespace {
namespace sweep_summary_cmd {

struct Options {
  std::string sweep_id;
  std::vector<std::string> values, filters, pivot;
  std::string value, aggregate, svg;
  bool csv = false, wait = false;
};

int WriteSvg(const v1::GetSweepSummaryResponse& resp, const std::string& path) {
  std::ofstream out(path);
  out << client::PivotSvg(resp.pivot(), resp.sweep_id() + ": " + resp.pivot().value());
  if (!out) {
    std::cerr << "error: cannot write " << path << "\n";
    return 2;
  }
  std::cerr << "wrote " << path << "\n";
  return 0;
}

int Run(Context& ctx, const Options& o) {
  const std::vector<std::string> values = SplitList(o.values);
  v1::GetSweepSummaryRequest req;
  req.set_sweep_id(o.sweep_id);
  for (const auto& v : values) req.add_values(v);
  for (const auto& f : o.filters) req.add_filters(f);
  if (!o.pivot.empty()) {
    // The server adds the pivoted column when `values` does not name it.
    req.mutable_pivot()->set_x(o.pivot[0]);
    req.mutable_pivot()->set_y(o.pivot[1]);
    req.mutable_pivot()->set_value(!o.value.empty() ? o.value : values.empty() ? "" : values[0]);
    req.mutable_pivot()->set_aggregate(o.aggregate);
  } else if (!o.svg.empty()) {
    std::cerr << "error: --svg needs --pivot X Y\n";
    return 2;
  }
  const bool tty = isatty(STDERR_FILENO);
  CatchInterrupt(true);
  auto resp = ctx.client.GetSweepSummary(req);
  while (o.wait && resp.ok() && resp->pending() > 0 && !Interrupted()) {
    if (tty) std::cerr << "\r" << resp->pending() << " cell(s) being computed\033[K" << std::flush;
    std::this_thread::sleep_for(std::chrono::seconds(1));
    resp = ctx.client.GetSweepSummary(req);
  }
  CatchInterrupt(false);
  if (tty && o.wait) std::cerr << "\r\033[K";
  if (!resp.ok()) return ReportError(resp.status());
  if (!o.svg.empty()) {
    if (int rc = WriteSvg(*resp, o.svg); rc != 0) return rc;
  }
  if (ctx.g.json) {
    std::cout << client::ToJson(*resp) << "\n";
  } else if (o.csv) {
    std::cout << client::SummaryCsv(*resp);
  } else if (req.has_pivot()) {
    std::cout << client::PivotText(resp->pivot(), isatty(STDOUT_FILENO));
  } else {
    std::cout << client::SummaryTable(*resp);
  }
  if (resp->pending() > 0) std::cerr << resp->pending() << " cell(s) still being computed (ask again, or --wait)\n";
  return 0;
}

}  // namespace sweep_summary_cmd
}  // namespace

void AddSweepSummary(CLI::App& app, Action* chosen) {
  auto o = std::make_shared<sweep_summary_cmd::Options>();
  CLI::App* sub =
      AddVerb(app, chosen, "sweep-summary",
              "One row per member: swept values and summary values; filter, export, pivot into a 2-D map.\n"
              "Value columns: a metric name (final value), coord:<name> (last recorded), first:<metric>>=<x> (first\n"
              "step reaching x), circuit / pair / pair_predicted (the run's circuit label, computed on demand).\n"
              "  circuitlab sweep-summary s1 --values eval/icl_rare/accuracy,pair --csv > s1.csv\n"
              "  circuitlab sweep-summary s1 --pivot a b --value pair --svg map.svg --wait",
              o, sweep_summary_cmd::Run);
  sub->add_option("SWEEP", o->sweep_id, "Sweep id")->required();
  sub->add_option("--values", o->values, "Value columns (comma-separated)");
  sub->add_option("--filter", o->filters, "Row filter column<op>value, op in = != < <= > >= (repeatable)");
  sub->add_option("--pivot", o->pivot, "Pivot: the X and Y columns")->expected(2);
  sub->add_option("--value", o->value,
                  "Pivot: the value column, fetched even when --values does not name it (default: the first value "
                  "column)");
  sub->add_option("--aggregate", o->aggregate, "Pivot: mean (default), min, max or count");
  sub->add_flag("--csv", o->csv, "Rows as CSV on stdout");
  sub->add_option("--svg", o->svg, "Write the pivot as an SVG heatmap to this file");
  sub->add_flag("--wait", o->wait, "Wait until on-demand cells (circuit labels) are computed");
}

}  // namespace circuitlab::cli
