#include "server/reproduce/recipes.h"

#include <google/protobuf/util/json_util.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <regex>
#include <set>
#include <tuple>

#include "server/common/status_macros.h"
#include "server/common/text.h"

namespace circuitlab::reproduce {
namespace {

const std::regex& NameRe() {
  static const std::regex re("[a-z0-9_-]{1,64}");
  return re;
}

absl::Status CheckName(const std::string& name, const std::string& field) {
  if (!std::regex_match(name, NameRe())) {
    return absl::InvalidArgumentError(field + " must be 1-64 of [a-z0-9_-], got \"" + name + "\"");
  }
  return absl::OkStatus();
}

bool IsSeedField(const std::string& field) { return field == "seed" || field == "/seed"; }

absl::Status CheckValue(const v1::RecipeValue& v, const v1::RecipeScale& scale, const std::set<std::string>& sweeps,
                        const std::string& field) {
  switch (v.source_case()) {
    case v1::RecipeValue::kConstant:
      return absl::OkStatus();
    case v1::RecipeValue::kColumn: {
      const v1::ColumnValue& c = v.column();
      if (c.column().size() > 256 || c.other().size() > 256) {
        return absl::InvalidArgumentError(field + ".column: column and other must have at most 256 characters");
      }
      if (c.unlabelled_size() > 64 || c.order_size() > 64 || c.group_by_size() > 8 || c.where_size() > 8) {
        return absl::InvalidArgumentError(field +
                                          ".column: at most 64 unlabelled values, 64 order labels, 8 group_by "
                                          "axes and 8 where entries");
      }
      if ((c.reduce() == v1::ColumnValue::REDUCE_ORDER_REVERSALS) != (c.order_size() > 0)) {
        return absl::InvalidArgumentError(field + ".column.order ranks the labels for REDUCE_ORDER_REVERSALS, " +
                                          "which needs at least one, and only it: got " +
                                          std::to_string(c.order_size()) + " with " +
                                          v1::ColumnValue::Reduce_Name(c.reduce()));
      }
      if (!sweeps.count(c.sweep())) {
        return absl::InvalidArgumentError(field + ".column.sweep names no sweep of the scale, got \"" + c.sweep() +
                                          "\"");
      }
      if (c.column().empty()) return absl::InvalidArgumentError(field + ".column.column must not be empty");
      const v1::RecipeAnalysis* a = nullptr;
      if (IsAnalysisColumn(scale, c.column(), &a) && a->sweep() != c.sweep()) {
        return absl::InvalidArgumentError(field + ".column.column reads analysis \"" + a->name() +
                                          "\", which runs on " + a->sweep() + ", not " + c.sweep());
      }
      const bool needs_other =
          c.reduce() == v1::ColumnValue::REDUCE_DIFFERENT || c.reduce() == v1::ColumnValue::REDUCE_SLOPE_LOGLOG;
      if (needs_other && c.other().empty()) {
        return absl::InvalidArgumentError(field + ".column.other must name a column for " +
                                          v1::ColumnValue::Reduce_Name(c.reduce()));
      }
      const bool series = IsSeriesColumn(c.column());
      const bool series_reduce = c.reduce() == v1::ColumnValue::REDUCE_SPEARMAN_WITH_STEP ||
                                 c.reduce() == v1::ColumnValue::REDUCE_SERIES_FIRST ||
                                 c.reduce() == v1::ColumnValue::REDUCE_SERIES_RISE;
      if (series != series_reduce) {
        return absl::InvalidArgumentError(field + ".column: \"series:\" and \"trajectory:\" columns go with the " +
                                          "REDUCE_SERIES_* reduces and REDUCE_SPEARMAN_WITH_STEP, and only they, got " +
                                          c.column() + " with " + v1::ColumnValue::Reduce_Name(c.reduce()));
      }
      if (c.reduce() == v1::ColumnValue::REDUCE_SERIES_RISE && !(c.fraction() > 0 && c.fraction() <= 1)) {
        return absl::InvalidArgumentError(field + ".column.fraction must be in (0, 1] for REDUCE_SERIES_RISE");
      }
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(field + " must be a constant or a column");
  }
}

// One figure of a scale: it draws a sweep of the scale, a kind it knows,
// 1 to 12 columns that fit the kind; `f` names it in errors.
absl::Status ValidateFigure(const v1::RecipeScale& scale, const v1::RecipeFigure& fig,
                            const std::set<std::string>& sweeps, const std::string& f) {
  if (!sweeps.count(fig.sweep())) {
    return absl::InvalidArgumentError(f + ".sweep names no sweep of the scale, got \"" + fig.sweep() + "\"");
  }
  if (fig.kind() == v1::RecipeFigure::KIND_UNSPECIFIED || !v1::RecipeFigure::Kind_IsValid(fig.kind())) {
    return absl::InvalidArgumentError(f + ".kind must be KIND_LABEL_MAP, KIND_CURVE, KIND_SERIES or KIND_BARS");
  }
  if (fig.columns().empty() || fig.columns_size() > 12 || fig.legend_size() > fig.columns_size()) {
    return absl::InvalidArgumentError(f + ".columns must name 1 to 12 columns (and legend at most one name each)");
  }
  if (fig.kind() == v1::RecipeFigure::KIND_LABEL_MAP && (fig.columns_size() != 1 || fig.x().empty() ||
                                                          fig.y().empty())) {
    return absl::InvalidArgumentError(f + ": a KIND_LABEL_MAP needs x and y (two axes) and one label column");
  }
  if (fig.kind() == v1::RecipeFigure::KIND_CURVE && fig.x().empty()) {
    return absl::InvalidArgumentError(f + ".x must name an axis or a column for KIND_CURVE");
  }
  for (const std::string& c : fig.columns()) {
    const v1::RecipeAnalysis* a = nullptr;
    if (c.empty() || c.size() > 256) return absl::InvalidArgumentError(f + ".columns: 1 to 256 characters each");
    if (IsAnalysisColumn(scale, c, &a) && a->sweep() != fig.sweep()) {
      return absl::InvalidArgumentError(f + ".columns reads analysis \"" + a->name() + "\", which runs on " +
                                        a->sweep() + ", not " + fig.sweep());
    }
    if (IsSeriesColumn(c) && fig.kind() != v1::RecipeFigure::KIND_SERIES) {
      return absl::InvalidArgumentError(f + ".columns: \"series:\" and \"trajectory:\" columns go with " +
                                        "KIND_SERIES, got " + c);
    }
  }
  if (fig.title().size() > 256 || fig.y_title().size() > 256 || fig.x().size() > 256 || fig.y().size() > 256 ||
      fig.where_size() > 8) {
    return absl::InvalidArgumentError(f + ": title, y_title, x and y at most 256 characters, where 8 entries");
  }
  return absl::OkStatus();
}

// A scale's checks: ids unique, needs naming earlier checks that pass or
// fail, aggregates known, values reading what the scale has.
absl::Status ValidateChecks(const v1::RecipeScale& scale, const std::set<std::string>& sweeps,
                            const std::string& where) {
  if (scale.checks().empty()) return absl::InvalidArgumentError(where + ".checks must hold at least one check");
  std::set<std::string> checks, reported;
  for (int i = 0; i < scale.checks_size(); ++i) {
    const v1::RecipeCheck& c = scale.checks(i);
    const std::string f = where + ".checks[" + std::to_string(i) + "]";
    CL_RETURN_IF_ERROR(CheckName(c.id(), f + ".id"));
    for (const std::string& r : c.needs()) {
      if (!checks.count(r)) {
        return absl::InvalidArgumentError(f + ".needs names no earlier check, got \"" + r + "\"");
      }
      if (reported.count(r)) {
        return absl::InvalidArgumentError(f + ".needs names \"" + r +
                                          "\", a report_only check, which never passes or fails");
      }
    }
    if (c.report_only()) reported.insert(c.id());
    if (!v1::RecipeCheck::Aggregate_IsValid(c.aggregate())) {
      return absl::InvalidArgumentError(f + ".aggregate is not a known value: " + std::to_string(c.aggregate()));
    }
    if ((c.aggregate() == v1::RecipeCheck::AGGREGATE_AT_LEAST) != (c.at_least() > 0) || c.at_least() > 16) {
      return absl::InvalidArgumentError(f + ".at_least must be in [1, 16] with AGGREGATE_AT_LEAST, and 0 " +
                                        "otherwise, got " + std::to_string(c.at_least()));
    }
    if (!checks.insert(c.id()).second) return absl::InvalidArgumentError(f + ".id repeats \"" + c.id() + "\"");
    CL_RETURN_IF_ERROR(CheckValue(c.value(), scale, sweeps, f + ".value"));
    CL_RETURN_IF_ERROR(CheckValue(c.against(), scale, sweeps, f + ".against"));
  }
  return absl::OkStatus();
}

absl::Status ValidateScale(const v1::RecipeScale& scale, const std::string& where) {
  if (scale.default_seeds() > 16) {
    return absl::InvalidArgumentError(where + ".default_seeds must be in [0, 16], got " +
                                      std::to_string(scale.default_seeds()));
  }
  if (scale.sweeps().empty()) return absl::InvalidArgumentError(where + ".sweeps must name at least one experiment");
  for (const auto& [field, size, most] : {std::tuple<const char*, int, int>{"sweeps", scale.sweeps_size(), 16},
                                          {"analyses", scale.analyses_size(), 32},
                                          {"checks", scale.checks_size(), 128}}) {
    if (size > most) {
      return absl::InvalidArgumentError(where + "." + field + " must have at most " + std::to_string(most) +
                                        " entries, got " + std::to_string(size));
    }
  }
  if (scale.note().size() > 4096) return absl::InvalidArgumentError(where + ".note must have at most 4096 characters");
  std::set<std::string> sweeps, names;
  for (int i = 0; i < scale.sweeps_size(); ++i) {
    const v1::RecipeSweep& s = scale.sweeps(i);
    const std::string f = where + ".sweeps[" + std::to_string(i) + "]";
    CL_RETURN_IF_ERROR(CheckName(s.name(), f + ".name"));
    if (!names.insert(s.name()).second) return absl::InvalidArgumentError(f + ".name repeats \"" + s.name() + "\"");
    sweeps.insert(s.name());
    for (const v1::SweepAxis& axis : s.sweep().axes()) {
      if (IsSeedField(axis.field())) {
        return absl::InvalidArgumentError(f +
                                          ".sweep sweeps the seed; a reproduction adds the seed axis itself "
                                          "(--seeds)");
      }
    }
  }
  for (int i = 0; i < scale.analyses_size(); ++i) {
    const v1::RecipeAnalysis& a = scale.analyses(i);
    const std::string f = where + ".analyses[" + std::to_string(i) + "]";
    CL_RETURN_IF_ERROR(CheckName(a.name(), f + ".name"));
    if (!names.insert(a.name()).second) return absl::InvalidArgumentError(f + ".name repeats \"" + a.name() + "\"");
    if (!sweeps.count(a.sweep())) {
      return absl::InvalidArgumentError(f + ".sweep names no sweep of the scale, got \"" + a.sweep() + "\"");
    }
    if (a.request_case() == v1::RecipeAnalysis::REQUEST_NOT_SET) {
      return absl::InvalidArgumentError(f + " must hold one request (detect_circuit, label_run, intervene, ...)");
    }
  }
  if (scale.figures_size() > 8) {
    return absl::InvalidArgumentError(where + ".figures must have at most 8 entries, got " +
                                      std::to_string(scale.figures_size()));
  }
  for (int i = 0; i < scale.figures_size(); ++i) {
    const v1::RecipeFigure& fig = scale.figures(i);
    const std::string f = where + ".figures[" + std::to_string(i) + "]";
    CL_RETURN_IF_ERROR(ValidateFigure(scale, fig, sweeps, f));
  }
  CL_RETURN_IF_ERROR(ValidateChecks(scale, sweeps, where));
  return absl::OkStatus();
}

}  // namespace

bool IsSeriesColumn(const std::string& column) {
  return column.rfind("series:", 0) == 0 || column.rfind("trajectory:", 0) == 0;
}

bool ClaimOrder(const std::string& a, const std::string& b) {
  auto key = [](const std::string& id) {
    const size_t dot = id.find('.');
    long n = 0;
    if (dot != std::string::npos) n = std::strtol(id.c_str() + dot + 1, nullptr, 10);
    return std::make_tuple(id.substr(0, dot), n, id);
  };
  return key(a) < key(b);
}

bool IsAnalysisColumn(const v1::RecipeScale& scale, const std::string& column, const v1::RecipeAnalysis** analysis) {
  const size_t dot = column.find('.');
  if (dot == std::string::npos) return false;
  const std::string name = column.substr(0, dot);
  for (const v1::RecipeAnalysis& a : scale.analyses()) {
    if (a.name() == name) {
      if (analysis != nullptr) *analysis = &a;
      return true;
    }
  }
  return false;
}

absl::StatusOr<v1::Recipe> ParseRecipe(std::string_view json, std::string_view where) {
  v1::Recipe r;
  google::protobuf::util::JsonParseOptions o;
  o.ignore_unknown_fields = false;
  auto s = google::protobuf::util::JsonStringToMessage(std::string(json), &r, o);
  if (!s.ok()) return absl::InvalidArgumentError(std::string(where) + ": " + std::string(s.message()));
  return r;
}

namespace {

// Every string of a recipe (texts, names, selectors) free of control
// characters: C0 but newline and tab, DEL, C1 and the bidirectional
// formatting characters (issue 51 item 8: a report's title printed raw must
// not drive or reorder the reader's terminal). `path` names the field.
absl::Status CheckTexts(const google::protobuf::Message& m, const std::string& path) {
  using FD = google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = m.GetReflection();
  std::vector<const FD*> fields;
  r->ListFields(m, &fields);
  auto clean = [&](const std::string& text, const std::string& field) -> absl::Status {
    for (size_t i = 0; i < text.size(); ++i) {
      const size_t n = ControlAt(text, i);
      if (n == 0 || text[i] == '\n' || text[i] == '\t') continue;
      return absl::InvalidArgumentError(field + " must not hold control characters (C0 but newline and tab, DEL, "
                                        "C1, bidirectional formatting), got " + Quote(text));
    }
    return absl::OkStatus();
  };
  for (const FD* f : fields) {
    const std::string at = path + "." + f->name();
    if (f->is_map()) {  // map<string, RecipeScale>: recipe.scales.ci.checks[0]...
      for (int i = 0; i < r->FieldSize(m, f); ++i) {
        const google::protobuf::Message& entry = r->GetRepeatedMessage(m, f, i);
        const FD* key = entry.GetDescriptor()->map_key();
        const FD* value = entry.GetDescriptor()->map_value();
        const std::string name =
            key->cpp_type() == FD::CPPTYPE_STRING ? entry.GetReflection()->GetString(entry, key) : std::to_string(i);
        CL_RETURN_IF_ERROR(clean(name, at + " key"));
        if (value->cpp_type() == FD::CPPTYPE_MESSAGE) {
          CL_RETURN_IF_ERROR(CheckTexts(entry.GetReflection()->GetMessage(entry, value), at + "." + name));
        }
      }
      continue;
    }
    if (f->cpp_type() == FD::CPPTYPE_MESSAGE) {
      if (!f->is_repeated()) {
        CL_RETURN_IF_ERROR(CheckTexts(r->GetMessage(m, f), at));
        continue;
      }
      for (int i = 0; i < r->FieldSize(m, f); ++i) {
        CL_RETURN_IF_ERROR(CheckTexts(r->GetRepeatedMessage(m, f, i), at + "[" + std::to_string(i) + "]"));
      }
      continue;
    }
    if (f->cpp_type() != FD::CPPTYPE_STRING || f->type() == FD::TYPE_BYTES) continue;
    if (!f->is_repeated()) {
      CL_RETURN_IF_ERROR(clean(r->GetString(m, f), at));
      continue;
    }
    for (int i = 0; i < r->FieldSize(m, f); ++i) {
      CL_RETURN_IF_ERROR(clean(r->GetRepeatedString(m, f, i), at + "[" + std::to_string(i) + "]"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateRecipe(const v1::Recipe& recipe) {
  CL_RETURN_IF_ERROR(CheckTexts(recipe, "recipe"));
  static const std::regex id_re("[A-Za-z0-9._-]{1,32}");
  if (!std::regex_match(recipe.id(), id_re)) {
    return absl::InvalidArgumentError("recipe.id must be 1-32 of [A-Za-z0-9._-], got \"" + recipe.id() + "\"");
  }
  if (recipe.scales().empty()) return absl::InvalidArgumentError("recipe " + recipe.id() + " has no scales");
  if (recipe.scales_size() > 8) return absl::InvalidArgumentError("recipe.scales must have at most 8 entries");
  for (const auto& [field, text] : {std::pair<const char*, const std::string*>{"title", &recipe.title()},
                                    {"claim", &recipe.claim()},
                                    {"source", &recipe.source()}}) {
    if (text->size() > 4096) {
      return absl::InvalidArgumentError(std::string("recipe.") + field + " must have at most 4096 characters");
    }
  }
  for (const auto& [name, scale] : recipe.scales()) {
    CL_RETURN_IF_ERROR(CheckName(name, "recipe " + recipe.id() + " scale name"));
    CL_RETURN_IF_ERROR(ValidateScale(scale, "recipe " + recipe.id() + " scales." + name));
  }
  return absl::OkStatus();
}

std::string ScaleNames(const v1::Recipe& recipe) {
  std::vector<std::string> names;
  for (const auto& [name, scale] : recipe.scales()) names.push_back(name);
  std::sort(names.begin(), names.end());
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

const std::vector<v1::Recipe>& BuiltInRecipes() {
  static const std::vector<v1::Recipe> recipes = [] {
    std::vector<v1::Recipe> out;
    for (const EmbeddedFile& f : EmbeddedRecipeFiles()) {
      absl::StatusOr<v1::Recipe> r = ParseRecipe(f.bytes, f.name);
      absl::Status valid = r.ok() ? ValidateRecipe(*r) : r.status();
      if (!valid.ok()) {
        spdlog::error("recipe {} left out: {}", f.name, std::string(valid.message()));
        continue;
      }
      out.push_back(std::move(*r));
    }
    std::sort(out.begin(), out.end(),
              [](const v1::Recipe& a, const v1::Recipe& b) { return ClaimOrder(a.id(), b.id()); });
    return out;
  }();
  return recipes;
}

absl::StatusOr<v1::Recipe> FindRecipe(const std::string& id) {
  std::string known;
  for (const v1::Recipe& r : BuiltInRecipes()) {
    if (r.id() == id) return r;
    known += (known.empty() ? "" : ", ") + r.id();
  }
  return absl::NotFoundError("recipe_id names no recipe of this server, got \"" + id + "\" (it has " +
                             (known.empty() ? std::string("none") : known) + ")");
}

}  // namespace circuitlab::reproduce
