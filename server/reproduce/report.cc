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

namespace circuitlab::reproduce {
namespace {

using Json = nlohmann::json;

// A table's rows grouped by seed index, and its columns by name.
struct SeedView {
  const v1::GetSweepSummaryResponse* table = nullptr;
  int seed_axis = -1;
  std::vector<double> seeds;  // distinct seed values, ascending

  int SeedIndex(const v1::SweepRow& row) const {
    if (seed_axis < 0) return 0;
    const double s = row.swept(seed_axis).number_value();
    return static_cast<int>(std::lower_bound(seeds.begin(), seeds.end(), s) - seeds.begin());
  }
  int Column(const std::string& name) const {
    for (int i = 0; i < table->columns_size(); ++i) {
      if (table->columns(i) == name) return i;
    }
    return -1;
  }
  int Axis(const std::string& name) const {
    for (int i = 0; i < table->axes_size(); ++i) {
      if (table->axes(i) == name) return i;
    }
    return -1;
  }
};

SeedView ViewOf(const v1::GetSweepSummaryResponse& t) {
  SeedView v;
  v.table = &t;
  v.seed_axis = v.Axis(kSeedAxis);
  std::set<double> seeds;
  for (const v1::SweepRow& r : t.rows()) {
    if (v.seed_axis >= 0 && v.seed_axis < r.swept_size()) seeds.insert(r.swept(v.seed_axis).number_value());
  }
  v.seeds.assign(seeds.begin(), seeds.end());
  return v;
}

bool IsLabel(const Json& j, const v1::ColumnValue& c) {
  if (!j.is_string()) return false;
  const std::string s = j.get<std::string>();
  return !s.empty() && std::find(c.unlabelled().begin(), c.unlabelled().end(), s) == c.unlabelled().end();
}

// Least-squares slope of y on x.
std::optional<double> Slope(const std::vector<std::pair<double, double>>& xy) {
  std::set<double> xs;
  for (const auto& p : xy) xs.insert(p.first);
  if (xs.size() < 2) return std::nullopt;
  double mx = 0, my = 0;
  for (const auto& [x, y] : xy) mx += x, my += y;
  mx /= xy.size();
  my /= xy.size();
  double sxy = 0, sxx = 0;
  for (const auto& [x, y] : xy) sxy += (x - mx) * (y - my), sxx += (x - mx) * (x - mx);
  return sxy / sxx;
}

std::vector<double> Ranks(const std::vector<double>& v) {
  std::vector<size_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
  std::vector<double> rank(v.size());
  for (size_t i = 0; i < idx.size();) {
    size_t j = i;
    while (j + 1 < idx.size() && v[idx[j + 1]] == v[idx[i]]) ++j;
    for (size_t k = i; k <= j; ++k) rank[idx[k]] = (i + j) / 2.0;  // ties share their mean rank
    i = j + 1;
  }
  return rank;
}

std::optional<double> Spearman(const Json& series) {
  if (!series.is_array() || series.size() < 3) return std::nullopt;
  std::vector<double> steps, values;
  for (const Json& p : series) {
    if (!p.is_array() || p.size() != 2 || !p[0].is_number() || !p[1].is_number()) return std::nullopt;
    steps.push_back(p[0].get<double>());
    values.push_back(p[1].get<double>());
  }
  std::vector<std::pair<double, double>> xy;
  const std::vector<double> rs = Ranks(steps), rv = Ranks(values);
  double ms = 0, mv = 0;
  for (size_t i = 0; i < rs.size(); ++i) ms += rs[i], mv += rv[i];
  ms /= rs.size();
  mv /= rv.size();
  double num = 0, ds = 0, dv = 0;
  for (size_t i = 0; i < rs.size(); ++i) {
    num += (rs[i] - ms) * (rv[i] - mv);
    ds += (rs[i] - ms) * (rs[i] - ms);
    dv += (rv[i] - mv) * (rv[i] - mv);
  }
  if (ds == 0 || dv == 0) return std::nullopt;
  return num / std::sqrt(ds * dv);
}

// The labelled cells of the plane of the first two non-seed axes as its grid
// lines: [0] the lines of constant x (cells by y), [1] those of constant y
// (cells by x). `value` turns a label into what the lines hold (nullopt
// skips the cell); nullopt when the table has fewer than two such axes.
template <typename T>
using GridLines = std::array<std::map<double, std::map<double, T>>, 2>;  // line -> position -> value

template <typename T, typename F>
std::optional<GridLines<T>> PlaneLines(const SeedView& view, const std::vector<const v1::SweepRow*>& rows, int col,
                                       const v1::ColumnValue& c, F value) {
  std::vector<int> axes;
  for (int i = 0; i < view.table->axes_size() && axes.size() < 2; ++i) {
    if (i != view.seed_axis) axes.push_back(i);
  }
  if (axes.size() < 2) return std::nullopt;
  GridLines<T> lines;
  for (const v1::SweepRow* r : rows) {
    const Json cell = ToJson(r->values(col));
    if (!IsLabel(cell, c)) continue;
    const std::optional<T> v = value(cell.get<std::string>());
    if (!v) continue;
    const double x = r->swept(axes[0]).number_value(), y = r->swept(axes[1]).number_value();
    lines[0][x][y] = *v;
    lines[1][y][x] = *v;
  }
  return lines;
}

// The most label changes along one line of the grid of the first two
// non-seed axes.
std::optional<double> Crossings(const SeedView& view, const std::vector<const v1::SweepRow*>& rows, int col,
                                const v1::ColumnValue& c) {
  const auto lines = PlaneLines<std::string>(view, rows, col, c, [](const std::string& l) { return std::optional(l); });
  if (!lines) return std::nullopt;
  int most = 0;
  for (const auto& axis : *lines) {
    for (const auto& [line, cells] : axis) {
      int changes = 0;
      const std::string* last = nullptr;
      for (const auto& [pos, label] : cells) {
        if (last != nullptr && *last != label) ++changes;
        last = &label;
      }
      most = std::max(most, changes);
    }
  }
  return most;
}

// SCIENCE.md G.6: along each line of the grid of the first two non-seed
// axes, the ranked labels' steps up or down; per axis the direction most
// steps take, and the steps against it. Labels outside the order are skipped.
std::optional<double> OrderReversals(const SeedView& view, const std::vector<const v1::SweepRow*>& rows, int col,
                                     const v1::ColumnValue& c) {
  std::map<std::string, int> rank;
  for (int i = 0; i < c.order_size(); ++i) rank.emplace(c.order(i), i);
  const auto lines = PlaneLines<int>(view, rows, col, c, [&](const std::string& l) -> std::optional<int> {
    const auto k = rank.find(l);
    return k == rank.end() ? std::nullopt : std::optional(k->second);
  });
  if (!lines) return std::nullopt;
  int reversals = 0;
  for (const auto& axis : *lines) {
    int up = 0, down = 0;
    for (const auto& [line, cells] : axis) {
      const int* last = nullptr;
      for (const auto& [pos, r] : cells) {
        if (last != nullptr && r > *last) ++up;
        if (last != nullptr && r < *last) ++down;
        last = &r;
      }
    }
    reversals += std::min(up, down);
  }
  return reversals;
}

Json Reduce(const SeedView& view, const std::vector<const v1::SweepRow*>& rows, const v1::ColumnValue& c,
            std::string* why) {
  const int col = view.Column(c.column());
  if (col < 0) {
    *why = "sweep " + c.sweep() + " has no column " + c.column();
    return nullptr;
  }
  if (rows.empty()) {
    *why = "no rows of " + c.sweep() + " for this seed";
    return nullptr;
  }
  std::vector<Json> cells;
  for (const v1::SweepRow* r : rows) cells.push_back(col < r->values_size() ? ToJson(r->values(col)) : Json());
  std::vector<double> numbers;
  for (const Json& j : cells) {
    if (j.is_number()) numbers.push_back(j.get<double>());
    if (j.is_boolean()) numbers.push_back(j.get<bool>() ? 1 : 0);
  }
  switch (c.reduce()) {
    case v1::ColumnValue::REDUCE_VALUE:
      if (cells.size() != 1) *why = c.column() + " has " + std::to_string(cells.size()) + " rows per seed, not 1";
      if (cells.size() == 1 && cells[0].is_null()) *why = c.column() + " has no value";
      return cells.size() == 1 ? cells[0] : Json();
    case v1::ColumnValue::REDUCE_MEAN:
    case v1::ColumnValue::REDUCE_MIN:
    case v1::ColumnValue::REDUCE_MAX: {
      if (numbers.empty()) {
        *why = c.column() + " has no numbers";
        return nullptr;
      }
      if (c.reduce() == v1::ColumnValue::REDUCE_MIN) return *std::min_element(numbers.begin(), numbers.end());
      if (c.reduce() == v1::ColumnValue::REDUCE_MAX) return *std::max_element(numbers.begin(), numbers.end());
      return std::accumulate(numbers.begin(), numbers.end(), 0.0) / numbers.size();
    }
    case v1::ColumnValue::REDUCE_COUNT:
      return std::count_if(cells.begin(), cells.end(), [](const Json& j) { return !j.is_null(); });
    case v1::ColumnValue::REDUCE_LABELLED:
      return static_cast<double>(
                 std::count_if(cells.begin(), cells.end(), [&](const Json& j) { return IsLabel(j, c); })) /
             cells.size();
    case v1::ColumnValue::REDUCE_DISTINCT: {
      std::set<std::string> labels;
      for (const Json& j : cells) {
        if (IsLabel(j, c)) labels.insert(j.get<std::string>());
      }
      return labels.size();
    }
    case v1::ColumnValue::REDUCE_DIFFERENT: {
      const int other = view.Column(c.other());
      if (other < 0) {
        *why = "sweep " + c.sweep() + " has no column " + c.other();
        return nullptr;
      }
      int differ = 0;
      for (const v1::SweepRow* r : rows) {
        const Json a = ToJson(r->values(col)), b = ToJson(r->values(other));
        differ += !a.is_null() && !b.is_null() && a != b;
      }
      return differ;
    }
    case v1::ColumnValue::REDUCE_CROSSINGS: {
      std::optional<double> n = Crossings(view, rows, col, c);
      if (!n) *why = "sweep " + c.sweep() + " has fewer than two axes besides the seed";
      return n ? Json(*n) : Json();
    }
    case v1::ColumnValue::REDUCE_ORDER_REVERSALS: {
      std::optional<double> n = OrderReversals(view, rows, col, c);
      if (!n) *why = "sweep " + c.sweep() + " has fewer than two axes besides the seed";
      return n ? Json(*n) : Json();
    }
    case v1::ColumnValue::REDUCE_SLOPE_LOGLOG: {
      const int axis = view.Axis(c.other()), other = view.Column(c.other());
      std::vector<std::pair<double, double>> xy;
      for (const v1::SweepRow* r : rows) {
        const Json y = ToJson(r->values(col));
        const Json x = axis >= 0 ? ToJson(r->swept(axis)) : other >= 0 ? ToJson(r->values(other)) : Json();
        if (x.is_number() && y.is_number() && x.get<double>() > 0 && y.get<double>() > 0) {
          xy.emplace_back(std::log(x.get<double>()), std::log(y.get<double>()));
        }
      }
      std::optional<double> s = Slope(xy);
      if (!s) *why = c.column() + " has positive values at fewer than two values of " + c.other();
      return s ? Json(*s) : Json();
    }
    case v1::ColumnValue::REDUCE_SERIES_FIRST:
    case v1::ColumnValue::REDUCE_SERIES_RISE: {
      const Json* series = cells.size() == 1 && cells[0].is_array() && !cells[0].empty() ? &cells[0] : nullptr;
      if (series == nullptr) {
        *why = c.column() + " is not one series with points";
        return nullptr;
      }
      if (c.reduce() == v1::ColumnValue::REDUCE_SERIES_FIRST) return (*series)[0][1];
      const double goal = c.fraction() * std::fabs((*series)[series->size() - 1][1].get<double>());
      for (const Json& p : *series) {
        if (std::fabs(p[1].get<double>()) >= goal) return p[0];
      }
      return nullptr;
    }
    case v1::ColumnValue::REDUCE_SPEARMAN_WITH_STEP: {
      std::optional<double> rho = cells.size() == 1 ? Spearman(cells[0]) : std::nullopt;
      if (!rho) *why = c.column() + " is not one series of at least 3 varying points";
      return rho ? Json(*rho) : Json();
    }
    default:
      *why = "unknown reduce " + std::to_string(c.reduce());
      return nullptr;
  }
}

// Reduce within each group of rows (by the group_by axes), then across the
// groups' numbers.
Json Grouped(const SeedView& view, const std::vector<const v1::SweepRow*>& rows, const v1::ColumnValue& c,
             std::string* why) {
  std::vector<int> axes;
  for (const std::string& name : c.group_by()) {
    const int i = view.Axis(name);
    if (i < 0) {
      *why = "sweep " + c.sweep() + " has no axis " + name + " to group by";
      return nullptr;
    }
    axes.push_back(i);
  }
  std::map<std::string, std::vector<const v1::SweepRow*>> groups;
  for (const v1::SweepRow* r : rows) {
    Json key = Json::array();
    for (int i : axes) key.push_back(ToJson(r->swept(i)));
    groups[key.dump()].push_back(r);
  }
  std::vector<double> numbers;
  for (const auto& [key, members] : groups) {
    std::string ignored;
    const Json v = Reduce(view, members, c, &ignored);
    if (v.is_number()) numbers.push_back(v.get<double>());
  }
  if (c.across() == v1::ColumnValue::REDUCE_COUNT) return numbers.size();
  if (numbers.empty()) {
    *why = c.column() + " has no value in any group";
    return nullptr;
  }
  switch (c.across()) {
    case v1::ColumnValue::REDUCE_MIN:
      return *std::min_element(numbers.begin(), numbers.end());
    case v1::ColumnValue::REDUCE_MAX:
      return *std::max_element(numbers.begin(), numbers.end());
    case v1::ColumnValue::REDUCE_MEAN:
      return std::accumulate(numbers.begin(), numbers.end(), 0.0) / numbers.size();
    default:
      *why = "across must be REDUCE_MEAN, REDUCE_MIN, REDUCE_MAX or REDUCE_COUNT";
      return nullptr;
  }
}

bool Matches(const v1::SweepRow& row, const SeedView& view, const v1::ColumnValue& c) {
  for (const auto& [axis, want] : c.where()) {
    const int i = view.Axis(axis);
    if (i < 0 || i >= row.swept_size() || ToJson(row.swept(i)) != ToJson(want)) return false;
  }
  return true;
}

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

Json ToJson(const google::protobuf::Value& v) {
  switch (v.kind_case()) {
    case google::protobuf::Value::kNumberValue:
      return v.number_value();
    case google::protobuf::Value::kStringValue:
      return v.string_value();
    case google::protobuf::Value::kBoolValue:
      return v.bool_value();
    case google::protobuf::Value::kListValue: {
      Json a = Json::array();
      for (const auto& e : v.list_value().values()) a.push_back(ToJson(e));
      return a;
    }
    case google::protobuf::Value::kStructValue: {
      Json o = Json::object();
      for (const auto& [k, e] : v.struct_value().fields()) o[k] = ToJson(e);
      return o;
    }
    default:
      return nullptr;
  }
}

google::protobuf::Value FromJson(const Json& j) {
  google::protobuf::Value v;
  if (j.is_number()) {
    v.set_number_value(j.get<double>());
  } else if (j.is_string()) {
    v.set_string_value(j.get<std::string>());
  } else if (j.is_boolean()) {
    v.set_bool_value(j.get<bool>());
  } else if (j.is_array()) {
    for (const Json& e : j) *v.mutable_list_value()->add_values() = FromJson(e);
  } else if (j.is_object()) {
    for (const auto& [k, e] : j.items()) (*v.mutable_struct_value()->mutable_fields())[k] = FromJson(e);
  } else {
    v.set_null_value(google::protobuf::NULL_VALUE);
  }
  return v;
}

namespace {

// "a.b[k=v].c" -> "a", "b", "[k=v]", "c": dots inside brackets do not split.
std::vector<std::string> PathParts(const std::string& path) {
  std::vector<std::string> parts(1);
  int depth = 0;
  for (char ch : path) {
    if (ch == '[' && depth++ == 0 && !parts.back().empty() && parts.back() != "*") parts.emplace_back();
    if (ch == ']') --depth;
    if (ch == '.' && depth == 0) {
      parts.emplace_back();
      continue;
    }
    parts.back() += ch;
  }
  return parts;
}

// Whether object `e` has every "field=value" of `filter` ("name=p0/x,layer=1"):
// a string field equals the text, a number the text's number, a bool
// "true"/"false".
bool MatchesFilter(const Json& e, std::string_view filter) {
  if (!e.is_object()) return false;
  for (size_t start = 0; start <= filter.size();) {
    const size_t comma = std::min(filter.find(',', start), filter.size());
    const std::string_view term = filter.substr(start, comma - start);
    start = comma + 1;
    const size_t eq = term.find('=');
    if (eq == std::string_view::npos) return false;
    const std::string key(term.substr(0, eq)), want(term.substr(eq + 1));
    if (!e.contains(key)) return false;
    const Json& v = e[key];
    if (v.is_string()) {
      if (v.get<std::string>() != want) return false;
    } else if (v.is_boolean()) {
      if ((v.get<bool>() ? "true" : "false") != want) return false;
    } else if (v.is_number()) {
      char* end = nullptr;
      const double d = std::strtod(want.c_str(), &end);
      if (want.empty() || *end != '\0' || d != v.get<double>()) return false;
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

Json FieldAt(const Json& doc, const std::string& path) {
  const std::vector<std::string> parts = PathParts(path);
  std::function<Json(const Json&, size_t)> walk = [&](const Json& at, size_t i) -> Json {
    if (i == parts.size()) return at;
    const std::string& p = parts[i];
    if (p == "#" && i + 1 == parts.size()) return at.is_array() ? Json(at.size()) : Json();
    const bool every = p == "*" || p.rfind("*[", 0) == 0;
    const bool filtered = p.size() >= 2 && p.back() == ']' && (p[0] == '[' || every);
    if (every || filtered) {
      if (!at.is_array()) return nullptr;
      const std::string_view filter =
          filtered ? std::string_view(p).substr(p.find('[') + 1, p.size() - p.find('[') - 2) : std::string_view();
      const bool count = every && i + 2 == parts.size() && parts[i + 1] == "#";
      Json out = Json::array();
      size_t matched = 0;
      for (const Json& e : at) {
        if (filtered && !MatchesFilter(e, filter)) continue;
        if (count) {
          ++matched;
          continue;
        }
        Json v = walk(e, i + 1);
        if (v.is_null()) continue;
        if (!every) return v;  // "[k=v]": the first match
        out.push_back(std::move(v));
      }
      if (count) return Json(matched);
      return every ? out : Json();
    }
    if (at.is_array()) {
      char* end = nullptr;
      const long k = std::strtol(p.c_str(), &end, 10);
      if (p.empty() || *end != '\0' || k < 0 || static_cast<size_t>(k) >= at.size()) return nullptr;
      return walk(at[k], i + 1);
    }
    if (at.is_object() && at.contains(p)) return walk(at[p], i + 1);
    return nullptr;
  };
  return walk(doc, 0);
}

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
    note += (note.empty() ? "" : "; ") + std::string(check.report_only() ? "outside the reference on seed "
                                                                        : "failed on seed ") +
            seeds_failed;
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
