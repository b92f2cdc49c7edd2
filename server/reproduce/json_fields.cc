#include "server/reproduce/json_fields.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <string_view>
#include <vector>

namespace circuitlab::reproduce {

using Json = nlohmann::json;

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

}  // namespace circuitlab::reproduce
