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

// A sweep's members: its axes checked, then the grid (and the random draws)
// expanded into specs.

namespace circuitlab::scheduler {
namespace {

using google::protobuf::Value;
using Json = nlohmann::json;
using sweep_values::Describe;
using sweep_values::Number;
using sweep_values::ToJson;

constexpr int kMaxAxes = 16;
constexpr int kMaxAxisValues = 10000;
constexpr int kMaxAlso = 64;  // fields an axis sets besides its own
constexpr uint32_t kMaxSamples = 10000;

std::string AxisField(int i) { return "sweep.axes[" + std::to_string(i) + "]"; }

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

// One axis' own checks: values (a grid) or a range (random draws), never
// both; finite numbers, strings or booleans; at most kMaxAlso extra fields.
absl::Status CheckAxis(const v1::SweepAxis& a, const std::string& field) {
  const bool has_range = a.has_range();
  if (has_range == (a.values_size() > 0)) {
    return absl::InvalidArgumentError(field + " must have either values (a grid) or a range (random), not " +
                                      (has_range ? "both" : "neither"));
  }
  if (a.also_size() > kMaxAlso) {
    return absl::InvalidArgumentError(field + ".also must have at most " + std::to_string(kMaxAlso) + " entries, got " +
                                      std::to_string(a.also_size()));
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
      return absl::InvalidArgumentError(field + ".range must have finite min <= max, got [" + std::to_string(r.min()) +
                                        ", " + std::to_string(r.max()) + "]");
    }
    if (r.log() && !(r.min() > 0)) {
      return absl::InvalidArgumentError(field + ".range.log needs min > 0, got " + std::to_string(r.min()));
    }
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
    CL_RETURN_IF_ERROR(CheckAxis(a, field));
    if (a.has_range()) {
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

}  // namespace circuitlab::scheduler
