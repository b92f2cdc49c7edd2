#include "server/reproduce/reduce.h"

#include <cmath>
#include <map>
#include <numeric>
#include <optional>
#include <set>

#include "server/reproduce/json_fields.h"

namespace circuitlab::reproduce {

using Json = nlohmann::json;

namespace {

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

// The slope of log(column) against log(c.other), an axis or a column, over
// the rows where both are positive (REDUCE_SLOPE_LOGLOG).
Json SlopeLogLog(const SeedView& view, const std::vector<const v1::SweepRow*>& rows, int col, const v1::ColumnValue& c,
                 std::string* why) {
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

// One series' first value (REDUCE_SERIES_FIRST), or the step at which it
// first reaches c.fraction of its last value's magnitude (REDUCE_SERIES_RISE).
Json SeriesPoint(const std::vector<Json>& cells, const v1::ColumnValue& c, std::string* why) {
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

}  // namespace

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
    case v1::ColumnValue::REDUCE_SLOPE_LOGLOG:
      return SlopeLogLog(view, rows, col, c, why);
    case v1::ColumnValue::REDUCE_SERIES_FIRST:
    case v1::ColumnValue::REDUCE_SERIES_RISE:
      return SeriesPoint(cells, c, why);
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

}  // namespace circuitlab::reproduce
