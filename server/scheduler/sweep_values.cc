#include "server/scheduler/sweep_values.h"

#include <cmath>
#include <cstdio>

namespace circuitlab::scheduler::sweep_values {

using google::protobuf::Value;
using Json = nlohmann::json;

std::string Describe(const Value& v) {
  switch (v.kind_case()) {
    case Value::kNumberValue: {
      const double x = v.number_value();
      if (x == std::floor(x) && std::abs(x) < 1e15) return std::to_string(static_cast<int64_t>(x));
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.6g", x);
      return buf;
    }
    case Value::kStringValue:
      return v.string_value();
    case Value::kBoolValue:
      return v.bool_value() ? "true" : "false";
    default:
      return "";
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
    case Value::kStringValue:
      return Json(v.string_value());
    case Value::kBoolValue:
      return Json(v.bool_value());
    default:
      return Json(nullptr);
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

}  // namespace circuitlab::scheduler::sweep_values
