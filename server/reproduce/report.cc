#include "server/reproduce/report.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <optional>
#include <set>

#include "server/reproduce/json_fields.h"
#include "server/reproduce/reduce.h"

namespace circuitlab::reproduce {
namespace {

using Json = nlohmann::json;

std::string Show(const Json& j) {
  if (j.is_number_float()) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4g", j.get<double>());
    return buf;
  }
  return j.is_string() ? j.get<std::string>() : j.dump();
}

std::string Describe(const v1::RecipeValue& v) {
  std::string s;
  if (v.has_constant()) {
    s = Show(ToJson(v.constant()));
  } else {
    const v1::ColumnValue& c = v.column();
    std::string reduce = v1::ColumnValue::Reduce_Name(c.reduce()).substr(7);  // after "REDUCE_"
    std::transform(reduce.begin(), reduce.end(), reduce.begin(), ::tolower);
    s = reduce == "value" ? c.sweep() + "/" + c.column() : reduce + "(" + c.sweep() + "/" + c.column() + ")";
    if (!c.group_by().empty()) {
      std::string across = v1::ColumnValue::Reduce_Name(c.across()).substr(7), by;
      std::transform(across.begin(), across.end(), across.begin(), ::tolower);
      for (const std::string& g : c.group_by()) by += (by.empty() ? "" : ", ") + g;
      s = across + " over (" + by + ") of " + s;
    }
  }
  if (v.scale() != 0 && v.scale() != 1) s = Show(v.scale()) + " x " + s;
  if (v.offset() != 0) s += (v.offset() > 0 ? " + " : " - ") + Show(std::fabs(v.offset()));
  return s;
}

std::optional<bool> Compare(const Json& a, const Json& b, v1::RecipeCheck::Comparison op) {
  if (a.is_null() || b.is_null()) return std::nullopt;
  if (op == v1::RecipeCheck::COMPARISON_CONTAINS) {
    if (!a.is_array()) return std::nullopt;
    return std::find(a.begin(), a.end(), b) != a.end();
  }
  if (a.is_number() && b.is_number()) {
    const double x = a.get<double>(), y = b.get<double>();
    switch (op) {
      case v1::RecipeCheck::COMPARISON_GE:
        return x >= y;
      case v1::RecipeCheck::COMPARISON_GT:
        return x > y;
      case v1::RecipeCheck::COMPARISON_LE:
        return x <= y;
      case v1::RecipeCheck::COMPARISON_LT:
        return x < y;
      case v1::RecipeCheck::COMPARISON_EQ:
        return std::fabs(x - y) <= 1e-9 * std::max(1.0, std::fabs(y));
      case v1::RecipeCheck::COMPARISON_NE:
        return std::fabs(x - y) > 1e-9 * std::max(1.0, std::fabs(y));
      default:
        return std::nullopt;
    }
  }
  if (op == v1::RecipeCheck::COMPARISON_EQ) return a == b;
  if (op == v1::RecipeCheck::COMPARISON_NE) return a != b;
  return std::nullopt;
}

const char* OpText(v1::RecipeCheck::Comparison op) {
  switch (op) {
    case v1::RecipeCheck::COMPARISON_GE:
      return ">=";
    case v1::RecipeCheck::COMPARISON_GT:
      return ">";
    case v1::RecipeCheck::COMPARISON_LE:
      return "<=";
    case v1::RecipeCheck::COMPARISON_LT:
      return "<";
    case v1::RecipeCheck::COMPARISON_EQ:
      return "==";
    case v1::RecipeCheck::COMPARISON_NE:
      return "!=";
    case v1::RecipeCheck::COMPARISON_CONTAINS:
      return "contains";
    default:
      return "?";
  }
}

Json Adjusted(Json j, const v1::RecipeValue& v) {
  if (j.is_number() && (v.offset() != 0 || v.scale() != 0)) {
    return j.get<double>() * (v.scale() != 0 ? v.scale() : 1.0) + v.offset();
  }
  return j;
}

}  // namespace

std::vector<Json> ValuePerSeed(const v1::RecipeValue& value, const Tables& tables, int seeds,
                               std::vector<std::string>* why) {
  std::vector<Json> out(seeds);
  if (value.has_constant()) {
    for (Json& j : out) j = Adjusted(ToJson(value.constant()), value);
    return out;
  }
  const v1::ColumnValue& c = value.column();
  auto t = tables.find(c.sweep());
  if (t == tables.end()) {
    if (why) why->push_back("no table for sweep " + c.sweep());
    return out;
  }
  const SeedView view = ViewOf(t->second);
  std::vector<std::vector<const v1::SweepRow*>> rows(seeds);
  for (const v1::SweepRow& r : t->second.rows()) {
    const int k = view.SeedIndex(r);
    if (k < seeds && Matches(r, view, c)) rows[k].push_back(&r);
  }
  for (int k = 0; k < seeds; ++k) {
    std::string reason;
    out[k] =
        Adjusted(c.group_by().empty() ? Reduce(view, rows[k], c, &reason) : Grouped(view, rows[k], c, &reason), value);
    if (out[k].is_null() && why != nullptr) {
      why->push_back("seed " + std::to_string(k + 1) + ": " + (reason.empty() ? c.column() + " missing" : reason));
    }
  }
  return out;
}

v1::CheckResult EvaluateCheck(const v1::RecipeCheck& check, const Tables& tables, int seeds,
                              const std::map<std::string, v1::CheckOutcome>& earlier) {
  v1::CheckResult r;
  r.set_id(check.id());
  r.set_description(check.description());
  static const char* kAggregate[] = {"every seed", "mean of the seeds", "most seeds"};
  const std::string aggregate =
      check.aggregate() == v1::RecipeCheck::AGGREGATE_AT_LEAST
          ? "at least " + std::to_string(check.at_least()) + " of " + std::to_string(seeds) + " seeds"
          : kAggregate[std::clamp(static_cast<int>(check.aggregate()), 0, 2)];
  r.set_expected(Describe(check.value()) + " " + OpText(check.comparison()) + " " + Describe(check.against()) + " (" +
                 aggregate + ")");
  std::vector<std::string> why;
  const std::vector<Json> values = ValuePerSeed(check.value(), tables, seeds, &why);
  const std::vector<Json> against = ValuePerSeed(check.against(), tables, seeds, &why);
  int pass = 0, fail = 0;
  std::vector<double> numbers, against_numbers;
  for (int k = 0; k < seeds; ++k) {
    *r.add_values() = FromJson(values[k]);
    *r.add_against() = FromJson(against[k]);
    const std::optional<bool> ok = Compare(values[k], against[k], check.comparison());
    r.add_passed(ok.value_or(false));
    if (ok) (*ok ? pass : fail)++;
    if (values[k].is_number()) numbers.push_back(values[k].get<double>());
    if (against[k].is_number()) against_numbers.push_back(against[k].get<double>());
  }
  if (!numbers.empty()) {
    const double mean = std::accumulate(numbers.begin(), numbers.end(), 0.0) / numbers.size();
    double var = 0;
    for (double x : numbers) var += (x - mean) * (x - mean);
    r.set_mean(mean);
    r.set_min(*std::min_element(numbers.begin(), numbers.end()));
    r.set_max(*std::max_element(numbers.begin(), numbers.end()));
    r.set_stddev(numbers.size() > 1 ? std::sqrt(var / (numbers.size() - 1)) : 0);
  }
  v1::CheckOutcome outcome = v1::CHECK_OUTCOME_INCONCLUSIVE;
  switch (check.aggregate()) {
    case v1::RecipeCheck::AGGREGATE_MEAN:
      if (numbers.size() == static_cast<size_t>(seeds) && against_numbers.size() == static_cast<size_t>(seeds)) {
        const double am = std::accumulate(against_numbers.begin(), against_numbers.end(), 0.0) / seeds;
        const std::optional<bool> ok = Compare(Json(r.mean()), Json(am), check.comparison());
        if (ok) outcome = *ok ? v1::CHECK_OUTCOME_PASS : v1::CHECK_OUTCOME_FAIL;
      }
      break;
    case v1::RecipeCheck::AGGREGATE_MAJORITY:
      if (2 * pass > seeds)
        outcome = v1::CHECK_OUTCOME_PASS;
      else if (2 * fail >= seeds)
        outcome = v1::CHECK_OUTCOME_FAIL;
      break;
    case v1::RecipeCheck::AGGREGATE_AT_LEAST: {
      const int need = static_cast<int>(check.at_least());
      if (pass >= need)
        outcome = v1::CHECK_OUTCOME_PASS;
      else if (fail > seeds - need)
        outcome = v1::CHECK_OUTCOME_FAIL;
      break;
    }
    default:
      if (fail > 0)
        outcome = v1::CHECK_OUTCOME_FAIL;
      else if (pass == seeds)
        outcome = v1::CHECK_OUTCOME_PASS;
      break;
  }
  std::string note;
  for (const std::string& n : check.needs()) {
    auto e = earlier.find(n);
    const v1::CheckOutcome o = e == earlier.end() ? v1::CHECK_OUTCOME_UNSPECIFIED : e->second;
    if (o != v1::CHECK_OUTCOME_PASS) {
      outcome = v1::CHECK_OUTCOME_INCONCLUSIVE;
      note += (note.empty() ? "" : "; ") + std::string("needs ") + n + ", which did not pass";
    }
  }
  if (fail > 0 && (outcome == v1::CHECK_OUTCOME_FAIL || check.aggregate() != v1::RecipeCheck::AGGREGATE_ALL_SEEDS)) {
    std::string seeds_failed;
    for (int k = 0; k < seeds; ++k) {
      if (!r.passed(k) && !values[k].is_null() && !against[k].is_null()) {
        seeds_failed += (seeds_failed.empty() ? "" : ", ") + std::to_string(k + 1);
      }
    }
    note += (note.empty() ? "" : "; ") +
            std::string(check.report_only() ? "outside the reference on seed " : "failed on seed ") + seeds_failed;
  }
  for (const std::string& w : why) note += (note.empty() ? "" : "; ") + w;
  if (check.report_only()) {
    outcome = v1::CHECK_OUTCOME_REPORTED;
    r.set_expected(r.expected() + ", reported, not a gate");
  }
  r.set_note(note);
  r.set_outcome(outcome);
  return r;
}

v1::ReproductionReport EvaluateChecks(const v1::RecipeScale& scale, const Tables& tables, int seeds,
                                      std::vector<std::string> notes) {
  v1::ReproductionReport report;
  std::map<std::string, v1::CheckOutcome> outcomes;
  for (const v1::RecipeCheck& check : scale.checks()) {
    v1::CheckResult r = EvaluateCheck(check, tables, seeds, outcomes);
    outcomes[check.id()] = r.outcome();
    switch (r.outcome()) {
      case v1::CHECK_OUTCOME_PASS:
        report.set_passed(report.passed() + 1);
        break;
      case v1::CHECK_OUTCOME_FAIL:
        report.set_failed(report.failed() + 1);
        break;
      case v1::CHECK_OUTCOME_REPORTED:
        report.set_reported(report.reported() + 1);
        break;
      default:
        report.set_inconclusive(report.inconclusive() + 1);
        break;
    }
    *report.add_checks() = std::move(r);
  }
  for (const auto& [name, table] : tables) (*report.mutable_tables())[name] = table;
  for (std::string& n : notes) report.add_notes(std::move(n));
  return report;
}

int64_t MinReportBytes(const v1::RecipeScale& scale, int seeds) {
  const auto constant = [](const v1::RecipeValue& v) -> int64_t {
    return v.has_constant() ? static_cast<int64_t>(v.constant().ByteSizeLong()) : 0;
  };
  int64_t bytes = 0;
  for (const v1::RecipeCheck& c : scale.checks()) {
    bytes += static_cast<int64_t>(c.id().size() + c.description().size()) +
             (seeds + 1) * (constant(c.value()) + constant(c.against()));
  }
  return bytes;
}

void BoundReport(v1::ReproductionReport* report, int64_t max_bytes) {
  const auto size = [&] { return static_cast<int64_t>(report->ByteSizeLong()); };
  if (size() <= max_bytes) return;
  const std::string limit = " (a report holds at most " + std::to_string(max_bytes) + " bytes)";
  std::vector<std::string> notes;
  // The largest tables first: each is its sweep's summary, which
  // GetSweepSummary answers again.
  std::vector<std::pair<int64_t, std::string>> tables;
  for (const auto& [name, t] : report->tables()) tables.emplace_back(static_cast<int64_t>(t.ByteSizeLong()), name);
  std::sort(tables.rbegin(), tables.rend());
  for (const auto& [bytes, name] : tables) {
    if (size() <= max_bytes) break;
    report->mutable_tables()->erase(name);
    notes.push_back("table " + name + " left out: " + std::to_string(bytes) + " bytes" + limit +
                    "; circuitlab sweep-summary on its sweeps gives it");
  }
  std::vector<std::pair<int64_t, int>> checks;
  for (int i = 0; i < report->checks_size(); ++i) {
    const v1::CheckResult& c = report->checks(i);
    int64_t bytes = 0;
    for (const auto& v : c.values()) bytes += static_cast<int64_t>(v.ByteSizeLong());
    for (const auto& v : c.against()) bytes += static_cast<int64_t>(v.ByteSizeLong());
    checks.emplace_back(bytes, i);
  }
  std::sort(checks.rbegin(), checks.rend());
  for (const auto& [bytes, i] : checks) {
    if (size() <= max_bytes) break;
    v1::CheckResult* c = report->mutable_checks(i);
    c->clear_values();
    c->clear_against();
    notes.push_back("check " + c->id() + ": its per-seed values left out (" + std::to_string(bytes) + " bytes)" +
                    limit + "; its outcome and statistics stay");
  }
  // Notes last, the newest kept: they say what was dropped.
  auto* kept = report->mutable_notes();
  for (std::string& n : notes) kept->Add(std::move(n));
  const int64_t over = size() - max_bytes;
  if (over <= 0) return;
  const std::string last = " earlier notes left out" + limit;
  const int64_t room = static_cast<int64_t>(last.size()) + 16;  // the note saying so, its count, tag and length
  int dropped = 0;
  int64_t freed = 0;
  while (dropped < kept->size() - 1 && freed < over + room) {
    const size_t n = kept->Get(dropped).size();
    freed += static_cast<int64_t>(n + 1 + google::protobuf::io::CodedOutputStream::VarintSize64(n));
    ++dropped;
  }
  kept->DeleteSubrange(0, dropped);
  kept->Add(std::to_string(dropped) + last);
}

}  // namespace circuitlab::reproduce
