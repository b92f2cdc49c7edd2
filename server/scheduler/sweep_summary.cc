#include <google/protobuf/util/json_util.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <vector>

#include "absl/strings/str_join.h"
#include "server/common/seeds.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/scheduler/sweep_values.h"
#include "server/scheduler/sweeps.h"

// GetSweepSummary: a sweep's members as a table (axes, then the columns
// asked for: metrics, coordinates, stored analyses, labels), filtered and
// pivoted.

namespace circuitlab::scheduler {
namespace {

using google::protobuf::Value;
using Json = nlohmann::json;
using sweep_values::Describe;
using sweep_values::FromJson;
using sweep_values::Null;
using sweep_values::Number;
using sweep_values::Text;

constexpr int kMaxColumns = 64;
constexpr int kMaxFilters = 32;

// A value column of GetSweepSummary.
struct Column {
  enum Kind { kMetric, kCoordinate, kFirstStep, kCircuit, kPair, kPairPredicted } kind = kMetric;
  std::string name;    // as asked
  std::string target;  // metric name or coordinate label
  double threshold = 0;
};

// `field` names the request field in errors ("values[2]", "pivot.value").
absl::StatusOr<Column> ParseColumn(const std::string& text, const std::string& field) {
  Column c;
  c.name = text;
  if (text.empty() || text.size() > 256) {
    return absl::InvalidArgumentError(field + " must have 1 to 256 characters, got " + std::to_string(text.size()));
  }
  if (HasControl(text)) return absl::InvalidArgumentError(field + " must not hold control characters");
  if (text == "circuit") {
    c.kind = Column::kCircuit;
  } else if (text == "pair") {
    c.kind = Column::kPair;
  } else if (text == "pair_predicted") {
    c.kind = Column::kPairPredicted;
  } else if (text.rfind("coord:", 0) == 0) {
    c.kind = Column::kCoordinate;
    c.target = text.substr(6);
    if (c.target.empty()) {
      return absl::InvalidArgumentError(field +
                                        " 'coord:' names no coordinate (coord:<label or alpha, beta, gamma, "
                                        "delta>)");
    }
  } else if (text.rfind("first:", 0) == 0) {
    c.kind = Column::kFirstStep;
    const std::string rest = text.substr(6);
    const size_t ge = rest.rfind(">=");
    if (ge == std::string::npos || ge == 0) {
      return absl::InvalidArgumentError(field + " " + Quote(text) + " must read first:<metric>>=<value>");
    }
    c.target = rest.substr(0, ge);
    try {
      size_t used = 0;
      c.threshold = std::stod(rest.substr(ge + 2), &used);
      if (used != rest.size() - ge - 2) throw std::invalid_argument("trailing");
    } catch (const std::exception&) {
      return absl::InvalidArgumentError(field + " " + Quote(text) + ": " + Quote(rest.substr(ge + 2)) +
                                        " is not a number");
    }
  } else {
    c.target = text;
  }
  return c;
}

struct Filter {
  std::string column, op, value;
};

// The operator is the rightmost one, so column names that hold one
// ("first:eval/icl_rare/accuracy>=0.5") can be filtered too.
absl::StatusOr<Filter> ParseFilter(const std::string& text, int i) {
  const size_t end = text.find_last_of("<>=!");
  if (end != std::string::npos && end > 0) {
    size_t at = end;
    if (text[end] == '=' && (text[end - 1] == '<' || text[end - 1] == '>' || text[end - 1] == '!')) --at;
    const std::string op = text.substr(at, end - at + 1);
    if (at > 0 && op != "!") return Filter{text.substr(0, at), op, text.substr(end + 1)};
  }
  return absl::InvalidArgumentError("filters[" + std::to_string(i) + "] '" + text +
                                    "' must read <column><op><value> with op one of = != < <= > >=");
}

std::optional<double> AsNumber(const std::string& s) {
  try {
    size_t used = 0;
    const double x = std::stod(s, &used);
    if (used == s.size()) return x;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

bool Matches(const Value& v, const Filter& f) {
  if (v.kind_case() == Value::kNullValue || v.kind_case() == Value::KIND_NOT_SET) return false;
  const std::optional<double> rhs = AsNumber(f.value);
  if (v.kind_case() == Value::kNumberValue && rhs) {
    const double x = v.number_value();
    if (f.op == "=") return x == *rhs;
    if (f.op == "!=") return x != *rhs;
    if (f.op == "<") return x < *rhs;
    if (f.op == "<=") return x <= *rhs;
    if (f.op == ">") return x > *rhs;
    return x >= *rhs;
  }
  const std::string s = Describe(v);
  if (f.op == "=") return s == f.value;
  if (f.op == "!=") return s != f.value;
  if (f.op == "<") return s < f.value;
  if (f.op == "<=") return s <= f.value;
  if (f.op == ">") return s > f.value;
  return s >= f.value;
}

// Orders values: numbers ascending, then text.
bool ValueLess(const Value& a, const Value& b) {
  const bool an = a.kind_case() == Value::kNumberValue, bn = b.kind_case() == Value::kNumberValue;
  if (an != bn) return an;
  if (an) return a.number_value() < b.number_value();
  return Describe(a) < Describe(b);
}

// The value columns of a summary: those asked for (all evaluation metrics
// and the training loss when none is), plus the column a pivot pivots.
absl::StatusOr<std::vector<Column>> SummaryColumns(const v1::GetSweepSummaryRequest& request,
                                                   const std::vector<std::string>& axes,
                                                   const std::vector<std::map<std::string, double>>& latest) {
  std::vector<Column> columns;
  if (request.values_size() == 0) {
    std::set<std::string> names;
    for (const auto& m : latest) {
      for (const auto& [name, v] : m) {
        if (name.rfind("eval/", 0) == 0 || name == "train/loss") names.insert(name);
      }
    }
    for (const std::string& n : names) columns.push_back(Column{Column::kMetric, n, n, 0});
  } else {
    for (int i = 0; i < request.values_size(); ++i) {
      CL_ASSIGN_OR_RETURN(Column c, ParseColumn(request.values(i), "values[" + std::to_string(i) + "]"));
      columns.push_back(std::move(c));
    }
  }
  // A pivot fetches the column it pivots when `values` did not name it.
  if (request.has_pivot() && request.pivot().aggregate() != "count" && !request.pivot().value().empty()) {
    const std::string& v = request.pivot().value();
    const bool have = v == "state" || v == "run_id" || std::find(axes.begin(), axes.end(), v) != axes.end() ||
                      std::any_of(columns.begin(), columns.end(), [&](const Column& c) { return c.name == v; });
    if (!have) {
      CL_ASSIGN_OR_RETURN(Column c, ParseColumn(v, "pivot.value"));
      columns.push_back(std::move(c));
    }
  }

  return columns;
}

// A cell of a summary row by column name: state, run_id, an axis or a value
// column; nullopt for a name that is none of these.
std::optional<Value> CellOf(const v1::SweepRow& r, const std::string& name, const std::vector<std::string>& axes,
                            const std::vector<Column>& columns) {
  if (name == "state") return Text(v1::RunState_Name(r.state()));
  if (name == "run_id") return Text(r.run_id());
  for (size_t a = 0; a < axes.size(); ++a) {
    if (axes[a] == name) return r.swept(static_cast<int>(a));
  }
  for (size_t k = 0; k < columns.size(); ++k) {
    if (columns[k].name == name) return r.values(static_cast<int>(k));
  }
  return std::nullopt;
}

// InvalidArgument naming `field` unless `name` is a column of the summary.
absl::Status KnownColumn(const std::string& name, const std::string& field, const std::vector<std::string>& axes,
                         const std::vector<Column>& columns) {
  if (name == "state" || name == "run_id" || std::find(axes.begin(), axes.end(), name) != axes.end()) {
    return absl::OkStatus();
  }
  for (const Column& c : columns) {
    if (c.name == name) return absl::OkStatus();
  }
  std::vector<std::string> have = axes;
  for (const Column& c : columns) have.push_back(c.name);
  return absl::InvalidArgumentError(field + " '" + name + "' is neither an axis nor a value column (have: state" +
                                    (have.empty() ? "" : ", " + absl::StrJoin(have, ", ")) + ")");
}

// Keeps the rows every filter matches.
absl::Status ApplyFilters(const v1::GetSweepSummaryRequest& request, const std::vector<std::string>& axes,
                          const std::vector<Column>& columns, v1::GetSweepSummaryResponse* out) {
  std::vector<Filter> filters;
  for (int i = 0; i < request.filters_size(); ++i) {
    CL_ASSIGN_OR_RETURN(Filter f, ParseFilter(request.filters(i), i));
    CL_RETURN_IF_ERROR(KnownColumn(f.column, "filters[" + std::to_string(i) + "]", axes, columns));
    if (f.column == "state" && f.value.rfind("RUN_STATE_", 0) != 0) {
      std::transform(f.value.begin(), f.value.end(), f.value.begin(),
                     [](unsigned char ch) { return std::toupper(ch); });
      f.value = "RUN_STATE_" + f.value;
    }
    filters.push_back(std::move(f));
  }
  if (!filters.empty()) {
    google::protobuf::RepeatedPtrField<v1::SweepRow> kept;
    for (const v1::SweepRow& r : out->rows()) {
      bool ok = true;
      for (const Filter& f : filters) ok = ok && Matches(*CellOf(r, f.column, axes, columns), f);
      if (ok) *kept.Add() = r;
    }
    out->mutable_rows()->Swap(&kept);
  }
  return absl::OkStatus();
}

// One pivot cell: the rows at (x, y) aggregated (text: the most frequent).
Value PivotCell(const v1::GetSweepSummaryResponse& out, const v1::SweepPivot& p, const std::string& agg, const Value& x,
                const Value& y, const std::vector<std::string>& axes, const std::vector<Column>& columns) {
  auto same = [](const Value& a, const Value& b) {
    return a.kind_case() == b.kind_case() && Describe(a) == Describe(b);
  };
  std::vector<double> nums;
  std::map<std::string, int> texts;
  int count = 0;
  for (const v1::SweepRow& r : out.rows()) {
    if (!same(*CellOf(r, p.x(), axes, columns), x) || !same(*CellOf(r, p.y(), axes, columns), y)) continue;
    ++count;
    if (agg == "count") continue;
    const Value v = *CellOf(r, p.value(), axes, columns);
    if (v.kind_case() == Value::kNumberValue) nums.push_back(v.number_value());
    if (v.kind_case() == Value::kStringValue || v.kind_case() == Value::kBoolValue) ++texts[Describe(v)];
  }
  if (agg == "count") return Number(count);
  if (!texts.empty()) {
    // Text: the most frequent value (ties: the first in order).
    auto best =
        std::max_element(texts.begin(), texts.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    return Text(best->first);
  }
  if (nums.empty()) return Null();
  if (agg == "min") return Number(*std::min_element(nums.begin(), nums.end()));
  if (agg == "max") return Number(*std::max_element(nums.begin(), nums.end()));
  double sum = 0;
  for (double n : nums) sum += n;
  return Number(sum / static_cast<double>(nums.size()));
}

// The 2-D table of a pivot over the (filtered) rows.
absl::Status BuildPivot(const v1::SweepPivot& p, const std::vector<std::string>& axes,
                        const std::vector<Column>& columns, v1::GetSweepSummaryResponse* out) {
  CL_RETURN_IF_ERROR(KnownColumn(p.x(), "pivot.x", axes, columns));
  CL_RETURN_IF_ERROR(KnownColumn(p.y(), "pivot.y", axes, columns));
  const std::string agg = p.aggregate().empty() ? "mean" : p.aggregate();
  if (agg != "mean" && agg != "min" && agg != "max" && agg != "count") {
    return absl::InvalidArgumentError("pivot.aggregate must be mean, min, max or count, got " + Quote(agg));
  }
  if (agg != "count") CL_RETURN_IF_ERROR(KnownColumn(p.value(), "pivot.value", axes, columns));
  v1::PivotTable* t = out->mutable_pivot();
  t->set_x(p.x());
  t->set_y(p.y());
  t->set_value(agg == "count" ? "count" : p.value());
  std::vector<Value> xs, ys;
  auto add_unique = [](std::vector<Value>& list, const Value& v) {
    for (const Value& have : list) {
      if (Describe(have) == Describe(v) && have.kind_case() == v.kind_case()) return;
    }
    list.push_back(v);
  };
  for (const v1::SweepRow& r : out->rows()) {
    add_unique(xs, *CellOf(r, p.x(), axes, columns));
    add_unique(ys, *CellOf(r, p.y(), axes, columns));
  }
  std::sort(xs.begin(), xs.end(), ValueLess);
  std::sort(ys.begin(), ys.end(), ValueLess);
  for (const Value& x : xs) *t->add_x_values() = x;
  for (const Value& y : ys) *t->add_y_values() = y;
  for (const Value& y : ys) {
    for (const Value& x : xs) *t->add_cells() = PivotCell(*out, p, agg, x, y, axes, columns);
  }
  return absl::OkStatus();
}

// The first step at which a member's metric reached the column's threshold
// (null when it never did).
absl::StatusOr<Value> FirstStep(store::Store& store, int64_t run_id, const Column& c) {
  store::MetricQuery q;
  q.names = {c.target};
  q.max_points = 1000000;
  CL_ASSIGN_OR_RETURN(std::vector<store::MetricSeries> series, store.GetMetrics(run_id, q));
  if (!series.empty()) {
    const auto& s = series.front();
    for (size_t k = 0; k < s.values.size(); ++k) {
      if (s.values[k] >= c.threshold) return Number(static_cast<double>(s.steps[k]));
    }
  }
  return Null();
}

// A finished member's labels as `who` may have them: stored, started (a
// pending answer), or a LabelRunResponse whose error says why not.
v1::LabelRunResponse LabelOf(AnalysisCore& analyses, int64_t run_id, const Requester& who) {
  v1::LabelRunRequest req;
  req.set_run_id(FormatRunId(run_id));
  absl::StatusOr<v1::LabelRunResponse> got = analyses.Run<v1::LabelRunResponse>(req, who);
  if (got.ok()) return *std::move(got);
  v1::LabelRunResponse label;
  if (got.status().code() == absl::StatusCode::kPermissionDenied && who.read_only) {
    label.set_error("not labelled yet (a reader cannot start labels)");  // a reader reads stored labels only
  } else if (got.status().code() != absl::StatusCode::kResourceExhausted) {
    // This member cannot be labelled: say why in the cell. (A full analysis
    // queue leaves the cell pending: ask again.)
    label.set_state(v1::ANALYSIS_STATE_FAILED);
    label.set_error(std::string(got.status().message()));
  }
  return label;
}

// A label column's cell; a label not ready counts in `pending`.
Value LabelCell(const v1::LabelRunResponse& label, const Column& c, uint32_t* pending) {
  if (label.state() != v1::ANALYSIS_STATE_DONE) {
    if (label.state() == v1::ANALYSIS_STATE_UNSPECIFIED && !label.error().empty()) return Text(label.error());
    if (label.state() == v1::ANALYSIS_STATE_FAILED || label.state() == v1::ANALYSIS_STATE_CANCELLED) {
      return Text("error: " + label.error());
    }
    ++*pending;
    return Null();
  }
  return Text(c.kind == Column::kCircuit ? label.label()
              : c.kind == Column::kPair  ? label.pair()
                                         : label.pair_predicted());
}

}  // namespace

absl::StatusOr<v1::GetSweepSummaryResponse> SweepCore::Summary(const v1::GetSweepSummaryRequest& request,
                                                               const Requester& who, int* started) {
  if (started != nullptr) *started = 0;
  CL_ASSIGN_OR_RETURN(int64_t id, ParseSweepId(request.sweep_id()));
  CL_ASSIGN_OR_RETURN(store::SweepRow row, store_->GetSweep(id));
  v1::SweepSpec spec;
  if (!spec.ParseFromString(row.spec)) return absl::DataLossError("stored spec of the sweep does not parse");
  CL_ASSIGN_OR_RETURN(std::vector<store::RunRow> runs, store_->SweepRuns(id));
  if (request.values_size() > kMaxColumns) {
    return absl::InvalidArgumentError("values must have at most " + std::to_string(kMaxColumns) + " entries, got " +
                                      std::to_string(request.values_size()));
  }
  if (request.filters_size() > kMaxFilters) {
    return absl::InvalidArgumentError("filters must have at most " + std::to_string(kMaxFilters) + " entries, got " +
                                      std::to_string(request.filters_size()));
  }
  const std::vector<std::string> axes = AxisNames(spec);
  std::vector<std::map<std::string, double>> latest(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    CL_ASSIGN_OR_RETURN(latest[i], store_->LatestMetrics(runs[i].id));
  }
  CL_ASSIGN_OR_RETURN(std::vector<Column> columns, SummaryColumns(request, axes, latest));

  v1::GetSweepSummaryResponse out;
  out.set_sweep_id(FormatSweepId(id));
  for (const std::string& a : axes) out.add_axes(a);
  for (const Column& c : columns) out.add_columns(c.name);

  std::vector<int64_t> ids;
  for (const store::RunRow& r : runs) ids.push_back(r.id);
  // Coordinate columns: one query per column over every member.
  std::map<std::string, std::map<int64_t, double>> coords;
  for (const Column& c : columns) {
    if (c.kind != Column::kCoordinate || coords.count(c.target)) continue;
    CL_ASSIGN_OR_RETURN(std::vector<store::Store::LastValue> last,
                        store_->LastCoordinateOfRuns(ids, "paper", c.target));
    auto& m = coords[c.target];
    for (const auto& v : last) m[v.run_id] = v.value;
  }
  uint32_t pending = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    const store::RunRow& r = runs[i];
    v1::SweepRow* o = out.add_rows();
    o->set_run_id(FormatRunId(r.id));
    o->set_state(static_cast<v1::RunState>(r.state));
    Json swept = Json::array();
    if (!r.sweep_values.empty()) swept = Json::parse(r.sweep_values, nullptr, false);
    for (size_t a = 0; a < axes.size(); ++a) {
      *o->add_swept() = swept.is_array() && a < swept.size() ? FromJson(swept[a]) : Null();
    }
    std::optional<v1::LabelRunResponse> label;
    for (const Column& c : columns) {
      Value v = Null();
      switch (c.kind) {
        case Column::kMetric:
          if (auto it = latest[i].find(c.target); it != latest[i].end()) v = Number(it->second);
          break;
        case Column::kCoordinate:
          if (auto it = coords[c.target].find(r.id); it != coords[c.target].end()) v = Number(it->second);
          break;
        case Column::kFirstStep: {
          CL_ASSIGN_OR_RETURN(v, FirstStep(*store_, r.id, c));
          break;
        }
        case Column::kCircuit:
        case Column::kPair:
        case Column::kPairPredicted: {
          if (r.state != v1::RUN_STATE_SUCCEEDED || analyses_ == nullptr) {
            if (r.state != v1::RUN_STATE_FAILED && r.state != v1::RUN_STATE_CANCELLED) ++pending;
            break;
          }
          if (!label) {
            label = LabelOf(*analyses_, r.id, who);
            if (started != nullptr && IsPending(label->state())) ++*started;
          }
          v = LabelCell(*label, c, &pending);
          break;
        }
      }
      *o->add_values() = std::move(v);
    }
  }
  out.set_pending(pending);

  CL_RETURN_IF_ERROR(ApplyFilters(request, axes, columns, &out));
  if (request.has_pivot()) CL_RETURN_IF_ERROR(BuildPivot(request.pivot(), axes, columns, &out));
  return out;
}

}  // namespace circuitlab::scheduler
