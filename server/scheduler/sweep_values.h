// The values a sweep's axes take (protobuf Values) as the sweep code shows,
// builds and converts them: internal to server/scheduler (sweep_expand.cc,
// sweep_summary.cc, sweeps.cc).
#pragma once

#include <google/protobuf/struct.pb.h>

#include <nlohmann/json.hpp>
#include <string>

namespace circuitlab::scheduler::sweep_values {

// A value as a sweep names it in a member's name or a message ("0.5", "adam").
std::string Describe(const google::protobuf::Value& v);
google::protobuf::Value Number(double x);
google::protobuf::Value Text(std::string s);
google::protobuf::Value Null();
nlohmann::json ToJson(const google::protobuf::Value& v);
google::protobuf::Value FromJson(const nlohmann::json& j);

}  // namespace circuitlab::scheduler::sweep_values
