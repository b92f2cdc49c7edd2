#include "server/reproduce/render.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <vector>

namespace circuitlab::reproduce {
namespace {

std::string Num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", x);
  return buf;
}

std::string Cell(const google::protobuf::Value& v) {
  switch (v.kind_case()) {
    case google::protobuf::Value::kNumberValue:
      return Num(v.number_value());
    case google::protobuf::Value::kStringValue:
      return v.string_value();
    case google::protobuf::Value::kBoolValue:
      return v.bool_value() ? "true" : "false";
    case google::protobuf::Value::kListValue: {
      const auto& l = v.list_value().values();
      // A series ([step, value] pairs): its length and its first and last values.
      if (!l.empty() && l[0].has_list_value() && l[0].list_value().values_size() == 2) {
        const auto& last = l[l.size() - 1].list_value().values();
        return std::to_string(l.size()) + " points, " + Cell(l[0].list_value().values(1)) + " → " +
               Cell(last[last.size() - 1]) + " at step " + Cell(last[0]);
      }
      std::string s = "[";
      const int n = v.list_value().values_size();
      for (int i = 0; i < std::min(n, 8); ++i) s += (i ? ", " : "") + Cell(v.list_value().values(i));
      return s + (n > 8 ? ", ... (" + std::to_string(n) + ")]" : "]");
    }
    default:
      return "-";
  }
}

// A swept value (an axis: seed, kappa, ...): whole numbers exactly (seed
// 10086, not 1.009e+04), anything else as a cell.
std::string AxisCell(const google::protobuf::Value& v) {
  const double x = v.number_value();
  if (v.has_number_value() && std::abs(x) < 9.0e15 && x == std::floor(x)) {
    return std::to_string(static_cast<int64_t>(x));
  }
  return Cell(v);
}

std::string Outcome(v1::CheckOutcome o) {
  switch (o) {
    case v1::CHECK_OUTCOME_PASS:
      return "PASS";
    case v1::CHECK_OUTCOME_FAIL:
      return "FAIL";
    case v1::CHECK_OUTCOME_INCONCLUSIVE:
      return "INCONCLUSIVE";
    case v1::CHECK_OUTCOME_REPORTED:
      return "REPORTED";
    default:
      return "?";
  }
}

std::string State(v1::ReproductionState s) {
  return v1::ReproductionState_Name(s).substr(19);
}  // after "REPRODUCTION_STATE_"

// Whether check `id` of the reproduction's scale compares with a measured
// value (a column) rather than a constant.
bool AgainstMeasured(const v1::Reproduction& r, const std::string& id) {
  auto scale = r.recipe().scales().find(r.scale());
  if (scale == r.recipe().scales().end()) return false;
  for (const v1::RecipeCheck& c : scale->second.checks()) {
    if (c.id() == id) return c.against().has_column();
  }
  return false;
}

// The values per seed; "value vs against" when the check compares with a
// measured value (E.14: beta at the last position vs beta at position 4 +
// 0.1), since the threshold then differs by seed.
std::string Measured(const v1::CheckResult& c, bool against_measured) {
  std::string s;
  for (int k = 0; k < c.values_size(); ++k) {
    s += (s.empty() ? "" : ", ") + Cell(c.values(k));
    if (against_measured && k < c.against_size()) s += " vs " + Cell(c.against(k));
  }
  if (c.values_size() > 1 && c.stddev() > 0) s += " (mean " + Num(c.mean()) + " ± " + Num(c.stddev()) + ")";
  return s;
}

std::string Escape(std::string s) {  // for a Markdown table cell
  for (size_t i = 0; (i = s.find('|', i)) != std::string::npos; i += 2) s.replace(i, 1, "\\|");
  return s;
}

// The label map of a table with two axes besides the seed, for one seed
// (rows: the second axis, largest on top, as the CLI's sweep maps draw it).
std::string GridMarkdown(const v1::GetSweepSummaryResponse& t, int column, double seed, int seed_axis) {
  std::vector<int> axes;
  for (int i = 0; i < t.axes_size() && axes.size() < 2; ++i) {
    if (i != seed_axis) axes.push_back(i);
  }
  std::set<double> xs, ys;
  std::map<std::pair<double, double>, std::string> cells;
  for (const v1::SweepRow& r : t.rows()) {
    if (seed_axis >= 0 && r.swept(seed_axis).number_value() != seed) continue;
    const double x = r.swept(axes[0]).number_value(), y = r.swept(axes[1]).number_value();
    xs.insert(x);
    ys.insert(y);
    if (column < r.values_size()) cells[{x, y}] = Cell(r.values(column));
  }
  std::ostringstream out;
  out << "| " << t.axes(axes[1]) << " \\ " << t.axes(axes[0]) << " |";
  for (double x : xs) out << " " << Num(x) << " |";
  out << "\n|---|";
  for (size_t i = 0; i < xs.size(); ++i) out << "---|";
  out << "\n";
  for (auto y = ys.rbegin(); y != ys.rend(); ++y) {
    out << "| **" << Num(*y) << "** |";
    for (double x : xs) {
      auto c = cells.find({x, *y});
      out << " " << (c == cells.end() ? "" : Escape(c->second)) << " |";
    }
    out << "\n";
  }
  return out.str();
}

std::string TableMarkdown(const std::string& name, const v1::GetSweepSummaryResponse& t) {
  std::ostringstream out;
  int seed_axis = -1;
  for (int i = 0; i < t.axes_size(); ++i) {
    if (t.axes(i) == "seed") seed_axis = i;
  }
  out << "### " << name << " (" << t.sweep_id() << ", " << t.rows_size() << " runs)\n\n";
  if (t.axes_size() - (seed_axis >= 0 ? 1 : 0) == 2) {  // a map only when two axes place every run
    std::set<double> seeds;
    for (const v1::SweepRow& r : t.rows()) seeds.insert(seed_axis >= 0 ? r.swept(seed_axis).number_value() : 0);
    for (int c = 0; c < t.columns_size(); ++c) {
      bool labels = false;
      for (const v1::SweepRow& r : t.rows()) labels = labels || (c < r.values_size() && r.values(c).has_string_value());
      if (!labels) continue;
      for (double seed : seeds) {
        out << "`" << t.columns(c) << "`, seed " << static_cast<int64_t>(seed) << ":\n\n"
            << GridMarkdown(t, c, seed, seed_axis) << "\n";
      }
    }
  }
  out << "| run | state |";
  for (const std::string& a : t.axes()) out << " " << a << " |";
  for (const std::string& c : t.columns()) out << " " << Escape(c) << " |";
  out << "\n|---|---|";
  for (int i = 0; i < t.axes_size() + t.columns_size(); ++i) out << "---|";
  out << "\n";
  int shown = 0;
  for (const v1::SweepRow& r : t.rows()) {
    if (++shown > 100) {
      out << "\n(" << t.rows_size() - 100 << " more rows: `circuitlab reproduce show --json`)\n";
      break;
    }
    out << "| " << r.run_id() << " | " << v1::RunState_Name(r.state()).substr(10) << " |";
    for (const auto& v : r.swept()) out << " " << Escape(AxisCell(v)) << " |";
    for (const auto& v : r.values()) out << " " << Escape(Cell(v)) << " |";
    out << "\n";
  }
  return out.str();
}

}  // namespace

std::string ReproductionProgressLine(const v1::Reproduction& r) {
  char pct[16];
  std::snprintf(pct, sizeof pct, "%3.0f%%", 100 * r.progress());
  return r.reproduction_id() + " " + r.recipe_id() + " " + r.scale() + "  " + State(r.state()) + " " + pct + "  " +
         r.phase();
}

std::string ReproductionText(const v1::Reproduction& r) {
  std::ostringstream out;
  out << r.reproduction_id() << "  " << r.recipe_id() << "  " << r.title() << "\n";
  out << "  scale " << r.scale() << ", " << r.seeds() << " seed" << (r.seeds() == 1 ? "" : "s") << ", owner "
      << r.owner() << "\n";
  out << "  " << State(r.state()) << "  " << r.phase() << "\n";
  if (!r.error().empty()) out << "  error: " << r.error() << "\n";
  if (!r.sweeps().empty()) {
    out << "  sweeps:";
    for (const auto& [name, id] : std::map<std::string, std::string>(r.sweeps().begin(), r.sweeps().end())) {
      out << " " << name << "=" << id;
    }
    out << "\n";
  }
  if (r.state() != v1::REPRODUCTION_STATE_DONE) return out.str();
  const v1::ReproductionReport& rep = r.report();
  out << "  " << rep.passed() << " passed, " << rep.failed() << " failed, " << rep.inconclusive() << " inconclusive"
      << (rep.reported() ? ", " + std::to_string(rep.reported()) + " reported only" : "") << "; "
      << Num(rep.wall_seconds()) << " s\n\n";
  for (const v1::CheckResult& c : rep.checks()) {
    char head[64];
    std::snprintf(head, sizeof head, "  %-12s %s", Outcome(c.outcome()).c_str(), c.id().c_str());
    out << head << "\n      " << c.description() << "\n      expected " << c.expected() << "\n      measured "
        << Measured(c, AgainstMeasured(r, c.id())) << "\n";
    if (!c.note().empty()) out << "      note: " << c.note() << "\n";
  }
  for (const std::string& n : rep.notes()) out << "  note: " << n << "\n";
  return out.str();
}

std::string ReproductionMarkdown(const v1::Reproduction& r) {
  std::ostringstream out;
  const v1::Recipe& recipe = r.recipe();
  out << "# " << r.recipe_id() << ": " << r.title() << "\n\n";
  out << "**Claim.** " << recipe.claim() << "\n\n**Source.** " << recipe.source() << "\n\n";
  auto scale = recipe.scales().find(r.scale());
  out << "**Scale.** `" << r.scale() << "`";
  if (scale != recipe.scales().end() && !scale->second.note().empty()) out << ": " << scale->second.note();
  out << " Seeds: " << r.seeds() << ".";
  if (r.state() == v1::REPRODUCTION_STATE_DONE) out << " Wall time: " << Num(r.report().wall_seconds()) << " s.";
  out << "\n\n";
  out << "Reproduced by `circuitlab reproduce run " << r.recipe_id() << " --scale " << r.scale() << " --seeds "
      << r.seeds() << "` (" << r.reproduction_id() << ", " << State(r.state()) << ").\n\n";
  if (r.state() != v1::REPRODUCTION_STATE_DONE) {
    out << "Not finished: " << r.phase() << (r.error().empty() ? "" : " (" + r.error() + ")") << "\n";
    return out.str();
  }
  const v1::ReproductionReport& rep = r.report();
  out << "**Outcome:** " << rep.passed() << " passed, " << rep.failed() << " failed, " << rep.inconclusive()
      << " inconclusive" << (rep.reported() ? ", " + std::to_string(rep.reported()) + " reported only (not gates)" : "")
      << ".\n\n";
  out << "| Check | Expected | Measured (per seed) | Outcome |\n|---|---|---|---|\n";
  for (const v1::CheckResult& c : rep.checks()) {
    out << "| **" << c.id() << "**: " << Escape(c.description()) << " | " << Escape(c.expected()) << " | "
        << Escape(Measured(c, AgainstMeasured(r, c.id()))) << " | " << Outcome(c.outcome())
        << (c.note().empty() ? "" : " (" + Escape(c.note()) + ")") << " |\n";
  }
  if (!rep.notes().empty()) {
    out << "\nNotes:\n\n";
    for (const std::string& n : rep.notes()) out << "- " << n << "\n";
  }
  out << "\n## Data\n\n";
  for (const auto& [name, table] :
       std::map<std::string, v1::GetSweepSummaryResponse>(rep.tables().begin(), rep.tables().end())) {
    out << TableMarkdown(name, table) << "\n";
  }
  return out.str();
}

std::string ReproductionCsv(const v1::Reproduction& r) {
  std::ostringstream out;
  out << "reproduction,recipe,scale,check,seed,value,against,passed,outcome\n";
  auto quote = [](std::string s) {
    for (size_t i = 0; (i = s.find('"', i)) != std::string::npos; i += 2) s.insert(i, 1, '"');
    return "\"" + s + "\"";
  };
  for (const v1::CheckResult& c : r.report().checks()) {
    for (int k = 0; k < c.values_size(); ++k) {
      out << r.reproduction_id() << "," << r.recipe_id() << "," << r.scale() << "," << c.id() << "," << k + 1 << ","
          << quote(Cell(c.values(k))) << "," << quote(k < c.against_size() ? Cell(c.against(k)) : "") << ","
          << (k < c.passed_size() && c.passed(k) ? "true" : "false") << "," << Outcome(c.outcome()) << "\n";
    }
  }
  return out.str();
}

}  // namespace circuitlab::reproduce
