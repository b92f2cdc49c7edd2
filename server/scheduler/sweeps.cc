#include "server/scheduler/sweeps.h"

#include <google/protobuf/util/json_util.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>

#include "absl/strings/str_join.h"
#include "server/common/seeds.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"

namespace circuitlab::scheduler {
namespace {

using google::protobuf::Value;
using Json = nlohmann::json;

constexpr int kMaxAxes = 16;
constexpr int kMaxAxisValues = 10000;
constexpr int kMaxAlso = 64;  // fields an axis sets besides its own
constexpr uint32_t kMaxSamples = 10000;
constexpr int kMaxColumns = 64;
constexpr int kMaxFilters = 32;

std::string AxisField(int i) { return "sweep.axes[" + std::to_string(i) + "]"; }

std::string Describe(const Value& v) {
  switch (v.kind_case()) {
    case Value::kNumberValue: {
      const double x = v.number_value();
      if (x == std::floor(x) && std::abs(x) < 1e15) return std::to_string(static_cast<int64_t>(x));
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.6g", x);
      return buf;
    }
    case Value::kStringValue: return v.string_value();
    case Value::kBoolValue: return v.bool_value() ? "true" : "false";
    default: return "";
  }
}

Value Number(double x) {
  Value v;
  v.set_number_value(x);
  return v;
}

Value Text(std::string s) {
  Value v;
  v.set_string_value(std::move(s));
  return v;
}

Value Null() {
  Value v;
  v.set_null_value(google::protobuf::NULL_VALUE);
  return v;
}

Json ToJson(const Value& v) {
  switch (v.kind_case()) {
    case Value::kNumberValue: {
      const double x = v.number_value();
      // Integral values print without a fraction, so integer fields take them.
      if (x == std::floor(x) && std::abs(x) < 9e15) return Json(static_cast<int64_t>(x));
      return Json(x);
    }
    case Value::kStringValue: return Json(v.string_value());
    case Value::kBoolValue: return Json(v.bool_value());
    default: return Json(nullptr);
  }
}

Value FromJson(const Json& j) {
  if (j.is_number()) return Number(j.get<double>());
  if (j.is_string()) return Text(j.get<std::string>());
  if (j.is_boolean()) {
    Value v;
    v.set_bool_value(j.get<bool>());
    return v;
  }
  return Null();
}

// The node a JSON pointer names, created as needed, one reference token at a
// time: an array index names an element or appends one ("-" or the array's
// size), never grows the array further, so that "/tags/20000000" is refused
// instead of allocating 20 million elements.
absl::StatusOr<Json*> PointerNode(Json& doc, const std::string& path, const std::string& where) {
  Json* at = &doc;
  size_t begin = 1;
  while (true) {
    const size_t slash = path.find('/', begin);
    std::string token = path.substr(begin, slash == std::string::npos ? std::string::npos : slash - begin);
    for (size_t k = 0; (k = token.find('~', k)) != std::string::npos; ++k) {
      if (k + 1 >= token.size() || (token[k + 1] != '0' && token[k + 1] != '1')) {
        return absl::InvalidArgumentError(where + ": '~' must be followed by 0 or 1 in a JSON pointer");
      }
      token.replace(k, 2, token[k + 1] == '0' ? "~" : "/");
    }
    if (at->is_array()) {
      const size_t size = at->size();
      size_t index = size;
      if (token != "-") {
        if (token.empty() || token.size() > 9 || token.find_first_not_of("0123456789") != std::string::npos ||
            (token.size() > 1 && token[0] == '0')) {
          return absl::InvalidArgumentError(where + ": '" + token.substr(0, 32) + "' is not an array index");
        }
        index = std::stoul(token);
      }
      if (index > size) {
        return absl::InvalidArgumentError(where + ": index " + token + " is past the end of an array of " +
                                          std::to_string(size) + " (an axis may set an element or append one)");
      }
      if (index == size) at->push_back(nullptr);
      at = &(*at)[index];
    } else if (at->is_object() || at->is_null()) {
      at = &(*at)[token];
    } else {
      return absl::InvalidArgumentError(where + ": '" + token.substr(0, 32) + "' is inside a non-message value");
    }
    if (slash == std::string::npos) return at;
    begin = slash + 1;
  }
}

// Sets `path` (dotted, or a JSON pointer when it starts with '/') in `doc`.
absl::Status SetPath(Json& doc, const std::string& path, const Json& value, const std::string& field) {
  if (path.empty()) return absl::InvalidArgumentError(field + ".field must not be empty");
  const std::string where = field + ".field '" + (path.size() > 200 ? path.substr(0, 200) + "…" : path) + "'";
  if (path[0] == '/') {
    absl::StatusOr<Json*> node = PointerNode(doc, path, where);
    if (!node.ok()) return node.status();
    **node = value;
    return absl::OkStatus();
  }
  Json* at = &doc;
  size_t begin = 0;
  while (true) {
    const size_t dot = path.find('.', begin);
    const std::string key = path.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin);
    if (key.empty()) return absl::InvalidArgumentError(where + " has an empty component");
    if (!at->is_object() && !at->is_null()) {
      return absl::InvalidArgumentError(where + ": '" + key.substr(0, 32) + "' is inside a non-message value");
    }
    at = &(*at)[key];
    if (dot == std::string::npos) break;
    begin = dot + 1;
  }
  *at = value;
  return absl::OkStatus();
}

std::string LastComponent(const std::string& path) {
  const size_t cut = path.find_last_of(path.empty() || path[0] != '/' ? '.' : '/');
  return cut == std::string::npos ? path : path.substr(cut + 1);
}

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
      return absl::InvalidArgumentError(field + " 'coord:' names no coordinate (coord:<label or alpha, beta, gamma, "
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
      std::transform(f.value.begin(), f.value.end(), f.value.begin(), [](unsigned char ch) { return std::toupper(ch); });
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
Value PivotCell(const v1::GetSweepSummaryResponse& out, const v1::SweepPivot& p, const std::string& agg,
                const Value& x, const Value& y, const std::vector<std::string>& axes,
                const std::vector<Column>& columns) {
  auto same = [](const Value& a, const Value& b) { return a.kind_case() == b.kind_case() && Describe(a) == Describe(b); };
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
    auto best = std::max_element(texts.begin(), texts.end(),
                                 [](const auto& a, const auto& b) { return a.second < b.second; });
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

}  // namespace

std::vector<std::string> AxisNames(const v1::SweepSpec& sweep) {
  std::vector<std::string> names;
  for (const v1::SweepAxis& a : sweep.axes()) names.push_back(a.name().empty() ? LastComponent(a.field()) : a.name());
  return names;
}

int64_t SweepMemberCount(const v1::SweepSpec& sweep, int64_t cap) {
  int64_t count = 1;
  bool random = false;
  for (const v1::SweepAxis& a : sweep.axes()) {
    random = random || a.has_range();
    if (!a.has_range()) count *= a.values_size();
    if (count > cap) return count;
  }
  return random ? count * std::max<uint32_t>(1, sweep.samples()) : count;
}

absl::StatusOr<std::vector<SweepMember>> ExpandSweep(const v1::SweepSpec& sweep, int max_members) {
  if (sweep.axes_size() > kMaxAxes) {
    return absl::InvalidArgumentError("sweep.axes must have at most " + std::to_string(kMaxAxes) + " entries, got " +
                                      std::to_string(sweep.axes_size()));
  }
  if (sweep.samples() > kMaxSamples) {
    return absl::InvalidArgumentError("sweep.samples must be in [0, " + std::to_string(kMaxSamples) + "], got " +
                                      std::to_string(sweep.samples()));
  }
  std::vector<int> grid, random;
  const std::vector<std::string> names = AxisNames(sweep);
  std::set<std::string> seen;
  for (int i = 0; i < sweep.axes_size(); ++i) {
    const v1::SweepAxis& a = sweep.axes(i);
    const std::string field = AxisField(i);
    if (a.field().empty()) return absl::InvalidArgumentError(field + ".field must name a spec field, e.g. \"seed\"");
    if (!seen.insert(names[i]).second) {
      return absl::InvalidArgumentError(field + ".name " + Quote(names[i]) +
                                        " is used by another axis; give each a name");
    }
    const bool has_range = a.has_range();
    if (has_range == (a.values_size() > 0)) {
      return absl::InvalidArgumentError(field + " must have either values (a grid) or a range (random), not " +
                                        (has_range ? "both" : "neither"));
    }
    if (a.also_size() > kMaxAlso) {
      return absl::InvalidArgumentError(field + ".also must have at most " + std::to_string(kMaxAlso) +
                                        " entries, got " + std::to_string(a.also_size()));
    }
    if (a.values_size() > kMaxAxisValues) {
      return absl::InvalidArgumentError(field + ".values must have at most " + std::to_string(kMaxAxisValues) +
                                        " entries, got " + std::to_string(a.values_size()));
    }
    for (int j = 0; j < a.values_size(); ++j) {
      const Value::KindCase k = a.values(j).kind_case();
      if (k != Value::kNumberValue && k != Value::kStringValue && k != Value::kBoolValue) {
        return absl::InvalidArgumentError(field + ".values[" + std::to_string(j) +
                                          "] must be a number, a string or a boolean");
      }
      // JSON has no NaN or infinity; a binary request can carry them, and a
      // member would silently train with the field's default.
      if (k == Value::kNumberValue && !std::isfinite(a.values(j).number_value())) {
        return absl::InvalidArgumentError(field + ".values[" + std::to_string(j) + "] must be a finite number, got " +
                                          std::to_string(a.values(j).number_value()));
      }
    }
    if (has_range) {
      const v1::SweepRange& r = a.range();
      if (!std::isfinite(r.min()) || !std::isfinite(r.max()) || !(r.min() <= r.max())) {
        return absl::InvalidArgumentError(field + ".range must have finite min <= max, got [" +
                                          std::to_string(r.min()) + ", " + std::to_string(r.max()) + "]");
      }
      if (r.log() && !(r.min() > 0)) {
        return absl::InvalidArgumentError(field + ".range.log needs min > 0, got " + std::to_string(r.min()));
      }
      random.push_back(i);
    } else {
      grid.push_back(i);
    }
  }
  if (random.empty() && sweep.samples() > 1) {
    return absl::InvalidArgumentError("sweep.samples is " + std::to_string(sweep.samples()) +
                                      " but no axis has a range to draw from");
  }
  const int64_t draws = random.empty() ? 1 : std::max<uint32_t>(1, sweep.samples());
  const int64_t count = SweepMemberCount(sweep, max_members);
  if (count > max_members) {
    return absl::ResourceExhaustedError("the sweep expands to more than " + std::to_string(max_members) +
                                        " runs (server limit --max-sweep-runs=" + std::to_string(max_members) + ")");
  }

  std::string base_json;
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(sweep.base(), &base_json, print).ok()) {
    return absl::InternalError("cannot print the base spec as JSON");
  }
  const Json base = Json::parse(base_json);
  const uint64_t seed = sweep.seed() != 0 ? sweep.seed() : sweep.base().seed();

  std::vector<SweepMember> members;
  members.reserve(static_cast<size_t>(count));
  for (int64_t d = 0; d < draws; ++d) {
    std::vector<Value> drawn(static_cast<size_t>(sweep.axes_size()));
    std::mt19937_64 gen(DeriveSeed(seed, "sweep", static_cast<uint64_t>(d)));
    for (int i : random) {
      const v1::SweepRange& r = sweep.axes(i).range();
      const double u = std::uniform_real_distribution<double>(0.0, 1.0)(gen);
      double x = r.log() ? std::exp(std::log(r.min()) + u * (std::log(r.max()) - std::log(r.min())))
                         : r.min() + u * (r.max() - r.min());
      if (r.integer()) x = std::clamp(std::round(x), std::ceil(r.min()), std::floor(r.max()));
      drawn[static_cast<size_t>(i)] = Number(x);
    }
    const int64_t cells = count / draws;
    for (int64_t cell = 0; cell < cells; ++cell) {
      std::vector<Value> values = drawn;
      int64_t rest = cell;
      for (auto it = grid.rbegin(); it != grid.rend(); ++it) {
        const int n = sweep.axes(*it).values_size();
        values[static_cast<size_t>(*it)] = sweep.axes(*it).values(static_cast<int>(rest % n));
        rest /= n;
      }
      Json doc = base;
      std::string suffix;
      for (int i = 0; i < sweep.axes_size(); ++i) {
        const v1::SweepAxis& a = sweep.axes(i);
        const Json v = ToJson(values[static_cast<size_t>(i)]);
        CL_RETURN_IF_ERROR(SetPath(doc, a.field(), v, AxisField(i)));
        for (const std::string& also : a.also()) CL_RETURN_IF_ERROR(SetPath(doc, also, v, AxisField(i) + ".also"));
        suffix += (suffix.empty() ? "" : ",") + names[static_cast<size_t>(i)] + "=" +
                  Describe(values[static_cast<size_t>(i)]);
      }
      SweepMember m;
      google::protobuf::util::JsonParseOptions parse;
      const auto parsed = google::protobuf::util::JsonStringToMessage(doc.dump(), &m.spec, parse);
      if (!parsed.ok()) {
        return absl::InvalidArgumentError("sweep member [" + suffix + "]: " + std::string(parsed.message()));
      }
      const std::string base_name = sweep.base().name().empty() ? sweep.name() : sweep.base().name();
      m.spec.set_name(base_name + "[" + suffix + "]");
      for (const std::string& t : sweep.tags()) m.spec.add_tags(t);
      m.values = std::move(values);
      members.push_back(std::move(m));
    }
  }
  return members;
}

SweepCore::SweepCore(Scheduler* scheduler, store::Store* store, AnalysisCore* analyses, int max_sweep_runs,
                     const Quotas* quotas)
    : scheduler_(scheduler), store_(store), analyses_(analyses), max_sweep_runs_(max_sweep_runs), quotas_(quotas) {}

absl::StatusOr<v1::Sweep> SweepCore::Submit(const v1::SweepSpec& sweep, const std::string& owner) {
  if (sweep.name().size() > 256) {
    return absl::InvalidArgumentError("sweep.name must have at most 256 characters, got " +
                                      std::to_string(sweep.name().size()));
  }
  if (HasControl(sweep.name())) {
    return absl::InvalidArgumentError("sweep.name must not contain control characters, got " + Quote(sweep.name()));
  }
  const int max_runs = MaxRunsFor(owner);
  // The queue's room is checked before the sweep is expanded (issue 14).
  if (const int64_t count = SweepMemberCount(sweep, max_runs); count <= max_runs) {
    CL_RETURN_IF_ERROR(scheduler_->CheckQueueRoom(count, owner));
  }
  CL_ASSIGN_OR_RETURN(std::vector<SweepMember> members, ExpandSweep(sweep, max_runs));
  if (members.empty()) return absl::InvalidArgumentError("the sweep has no members");
  std::vector<store::NewRun> rows;
  rows.reserve(members.size());
  for (SweepMember& m : members) {
    const std::string who = m.spec.name();
    absl::StatusOr<store::NewRun> row = scheduler_->PrepareRun(std::move(m.spec), owner);
    if (!row.ok()) {
      return absl::Status(row.status().code(), "sweep member " + who + ": " + std::string(row.status().message()));
    }
    Json values = Json::array();
    for (const Value& v : m.values) values.push_back(ToJson(v));
    row->sweep_values = values.dump();
    rows.push_back(std::move(*row));
  }
  store::NewSweep s;
  s.name = sweep.name().empty() ? sweep.base().name() : sweep.name();
  s.spec = sweep.SerializeAsString();
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(sweep, &s.spec_json, print).ok()) s.spec_json = "{}";
  s.created_at_us = rows.front().created_at_us;
  s.owner = owner;
  CL_ASSIGN_OR_RETURN(auto ids, scheduler_->SubmitSweep(s, std::move(rows), owner));
  return Get(FormatSweepId(ids.first));
}

absl::StatusOr<v1::Sweep> SweepCore::ToSweep(const store::SweepRow& row, const std::vector<store::RunRow>& runs) {
  v1::Sweep out;
  out.set_sweep_id(FormatSweepId(row.id));
  out.set_name(row.name);
  if (!out.mutable_spec()->ParseFromString(row.spec)) {
    return absl::DataLossError("stored spec of " + FormatSweepId(row.id) + " does not parse");
  }
  out.mutable_created_at()->set_seconds(row.created_at_us / 1000000);
  out.mutable_created_at()->set_nanos(static_cast<int32_t>(row.created_at_us % 1000000) * 1000);
  bool done = true;
  for (const store::RunRow& r : runs) {
    out.add_run_ids(FormatRunId(r.id));
    ++(*out.mutable_states())[v1::RunState_Name(static_cast<v1::RunState>(r.state))];
    done = done && IsFinal(r.state);
  }
  out.set_done(done);
  out.set_owner(row.owner);
  return out;
}

absl::StatusOr<v1::Sweep> SweepCore::Get(const std::string& sweep_id) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseSweepId(sweep_id));
  CL_ASSIGN_OR_RETURN(store::SweepRow row, store_->GetSweep(id));
  CL_ASSIGN_OR_RETURN(std::vector<store::RunRow> runs, store_->SweepRuns(id));
  return ToSweep(row, runs);
}

absl::StatusOr<std::string> SweepCore::OwnerOf(const std::string& sweep_id) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseSweepId(sweep_id));
  CL_ASSIGN_OR_RETURN(store::SweepRow row, store_->GetSweep(id));
  return row.owner;
}

absl::StatusOr<v1::Sweep> SweepCore::Cancel(const std::string& sweep_id) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseSweepId(sweep_id));
  CL_RETURN_IF_ERROR(store_->GetSweep(id).status());
  CL_ASSIGN_OR_RETURN(std::vector<store::RunRow> runs, store_->SweepRuns(id));
  int cancelled = 0;
  for (const store::RunRow& r : runs) {
    if (IsFinal(r.state)) continue;
    absl::StatusOr<v1::Run> c = scheduler_->Cancel(FormatRunId(r.id));
    // A member that ended meanwhile answers FailedPrecondition: nothing to do.
    if (!c.ok() && c.status().code() != absl::StatusCode::kFailedPrecondition) return c.status();
    if (c.ok()) ++cancelled;
  }
  spdlog::info("cancelled sweep {}: {} member(s) stopped", FormatSweepId(id), cancelled);
  return Get(sweep_id);
}

absl::StatusOr<v1::DeleteSweepResponse> SweepCore::Delete(const std::string& sweep_id) {
  CL_ASSIGN_OR_RETURN(int64_t id, ParseSweepId(sweep_id));
  CL_RETURN_IF_ERROR(store_->GetSweep(id).status());
  CL_ASSIGN_OR_RETURN(std::vector<store::RunRow> runs, store_->SweepRuns(id));
  std::vector<int64_t> ids;
  v1::DeleteSweepResponse out;
  out.set_sweep_id(FormatSweepId(id));
  for (const store::RunRow& r : runs) {
    ids.push_back(r.id);
    out.add_run_ids(FormatRunId(r.id));
  }
  CL_ASSIGN_OR_RETURN(int64_t freed, scheduler_->DeleteRuns(ids, id));
  out.set_freed_bytes(static_cast<uint64_t>(freed));
  return out;
}

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
    CL_ASSIGN_OR_RETURN(std::vector<store::Store::LastValue> last, store_->LastCoordinateOfRuns(ids, "paper", c.target));
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
          store::MetricQuery q;
          q.names = {c.target};
          q.max_points = 1000000;
          CL_ASSIGN_OR_RETURN(std::vector<store::MetricSeries> series, store_->GetMetrics(r.id, q));
          if (!series.empty()) {
            const auto& s = series.front();
            for (size_t k = 0; k < s.values.size(); ++k) {
              if (s.values[k] >= c.threshold) {
                v = Number(static_cast<double>(s.steps[k]));
                break;
              }
            }
          }
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
            v1::LabelRunRequest req;
            req.set_run_id(FormatRunId(r.id));
            absl::StatusOr<v1::LabelRunResponse> got = analyses_->Run<v1::LabelRunResponse>(req, who);
            if (got.ok()) {
              label = std::move(*got);
              if (started != nullptr && IsPending(label->state())) ++*started;
            } else if (got.status().code() == absl::StatusCode::kPermissionDenied && who.read_only) {
              label = v1::LabelRunResponse();  // a reader reads stored labels only
              label->set_error("not labelled yet (a reader cannot start labels)");
            } else if (got.status().code() == absl::StatusCode::kResourceExhausted) {
              label = v1::LabelRunResponse();  // a full analysis queue: the cell stays pending; ask again
            } else {
              label = v1::LabelRunResponse();  // this member cannot be labelled: say why in the cell
              label->set_state(v1::ANALYSIS_STATE_FAILED);
              label->set_error(std::string(got.status().message()));
            }
          }
          if (label->state() != v1::ANALYSIS_STATE_DONE) {
            if (label->state() == v1::ANALYSIS_STATE_UNSPECIFIED && !label->error().empty()) {
              v = Text(label->error());
            } else if (label->state() == v1::ANALYSIS_STATE_FAILED ||
                       label->state() == v1::ANALYSIS_STATE_CANCELLED) {
              v = Text("error: " + label->error());
            } else {
              ++pending;
            }
            break;
          }
          const std::string& text = c.kind == Column::kCircuit ? label->label()
                                    : c.kind == Column::kPair  ? label->pair()
                                                               : label->pair_predicted();
          v = Text(text);
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
