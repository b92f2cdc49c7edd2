// A reproduction's data as JSON: protobuf Values to and from JSON, and the
// field at a path of an analysis answer (the columns recipes read).
#pragma once

#include <map>
#include <string>

#include "circuitlab/v1/reproduce.pb.h"
#include "google/protobuf/struct.pb.h"
#include "nlohmann/json.hpp"

namespace circuitlab::reproduce {

using Tables = std::map<std::string, v1::GetSweepSummaryResponse>;

// The axis a reproduction adds to each sweep.
inline constexpr char kSeedAxis[] = "seed";

// The field at `path` of a JSON document; null when there is none.
// "a.b.0.c": fields and list indices; "*" collects every element of a
// list; "values[name=p0/resid_ratio,layer=1]" is the first element whose
// fields have those values, "*[layer=1]" every such element; a last "#" is
// the length of the list.
nlohmann::json FieldAt(const nlohmann::json& doc, const std::string& path);

// Between protobuf's Value and JSON.
nlohmann::json ToJson(const google::protobuf::Value& v);
google::protobuf::Value FromJson(const nlohmann::json& j);

}  // namespace circuitlab::reproduce
