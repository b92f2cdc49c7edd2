// The HTTP gateway's wire helpers (internal to server/http): statuses as
// HTTP codes and JSON errors, answers as JSON within the response budget,
// requests filled from a path's captures and the query by field name.
#pragma once

#include <google/protobuf/message.h>
#include <httplib.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/common/response_budget.h"

namespace circuitlab::http {

// Answers this large are sent from their buffer and given back once sent.
inline constexpr size_t kStreamAnswersFrom = 1 << 20;
// An answer's JSON is at most about this many times its protobuf size
// (floats as text): what the response budget and the page budgets count.
inline constexpr int64_t kJsonPerWireByte = 3;

// The HTTP status of a gRPC-style status (NOT_FOUND 404, ...).
int HttpStatusOf(const absl::Status& s);
// `s` as {"code", "message"} JSON with its HTTP status (and WWW-Authenticate
// or Retry-After where they apply).
void WriteError(httplib::Response& res, const absl::Status& s);
absl::StatusOr<std::string> ToJson(const google::protobuf::Message& m);
// `body` sent as `type` from its one buffer (set_content would copy a large
// one), `lease` held until it is sent.
void Send(httplib::Response& res, std::shared_ptr<std::string> body, const char* type, ResponseBudget::Lease lease);
// The answer as JSON (json_writer.h: memory linear in its size), counted
// against the response budget until sent.
absl::Status Reply(httplib::Response& res, const google::protobuf::Message& m);
// `key` (a field name, dotted into nested messages: pivot.x) = `value`; a
// repeated field takes repeated parameters or a comma-separated list.
absl::Status SetField(google::protobuf::Message* root, const std::string& key, const std::string& value);
// The request: the path's captures into `path_fields`, then the query
// parameters (at most 256); an unknown one or a value that does not parse is
// INVALID_ARGUMENT naming it.
absl::Status FillRequest(const httplib::Request& req, const std::vector<std::string>& path_fields,
                         google::protobuf::Message* m);
// Cuts every repeated field of `m`, at any depth, to its first `keep`
// elements (but `skip`, at the top); true when anything was cut.
bool ClipRepeated(google::protobuf::Message* m, int keep, const google::protobuf::FieldDescriptor* skip = nullptr);

}  // namespace circuitlab::http
