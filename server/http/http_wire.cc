#include "server/http/http_wire.h"

#include <google/protobuf/util/json_util.h>
#include <malloc.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "server/common/field_text.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/http/json_writer.h"

namespace circuitlab::http {
namespace {

namespace pb = google::protobuf;

// One query value into a scalar field (added when repeated).
absl::Status SetScalar(pb::Message* m, const pb::FieldDescriptor* f, const std::string& value,
                       const std::string& path) {
  const absl::Status s = SetScalarFromText(m, f, value);
  if (absl::IsUnimplemented(s)) {
    return absl::InvalidArgumentError("query parameter " + path + " cannot be set from a query string");
  }
  if (!s.ok()) {
    return absl::InvalidArgumentError("query parameter " + path + " must be " + std::string(s.message()) +
                                      ", got " + Quote(Clip(value, 64)));
  }
  return s;
}

}  // namespace

namespace pb = google::protobuf;

int HttpStatusOf(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    case absl::StatusCode::kUnimplemented:
      return 501;
    default:
      return 500;
  }
}

void WriteError(httplib::Response& res, const absl::Status& s) {
  res.status = HttpStatusOf(s);
  const nlohmann::json body = {{"code", absl::StatusCodeToString(s.code())},
                               {"message", Clip(std::string(s.message()), 1000)}};
  res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n", "application/json");
  if (res.status == 401) res.set_header("WWW-Authenticate", "Bearer realm=\"circuitlab\"");
  if (res.status == 503 || res.status == 429) res.set_header("Retry-After", "5");
}

absl::StatusOr<std::string> ToJson(const pb::Message& m) {
  std::string out;
  CL_RETURN_IF_ERROR(AppendJson(m, &out));
  return out;
}

void Send(httplib::Response& res, std::shared_ptr<std::string> body, const char* type, ResponseBudget::Lease lease) {
  if (body->size() < kStreamAnswersFrom) {
    res.set_content(*body, type);
    return;
  }
  const size_t n = body->size();
  auto held = std::make_shared<ResponseBudget::Lease>(std::move(lease));
  res.set_content_provider(
      n, type,
      [body](size_t offset, size_t length, httplib::DataSink& sink) {
        return sink.write(body->data() + offset, std::min(length, body->size() - offset));
      },
      [body, held](bool) {
        // Sent: the buffer goes now, and what the answer's parts left free
        // in malloc's arenas goes back to the system (with the two arenas
        // app/server.cc allows, five GETs of a 50 MB answer keep nothing).
        std::string().swap(*body);
        held->Release();
        ::malloc_trim(0);
      });
}

absl::Status Reply(httplib::Response& res, const pb::Message& m) {
  CL_ASSIGN_OR_RETURN(ResponseBudget::Lease lease,
                      ResponseBudget::Process().Acquire(kJsonPerWireByte * static_cast<int64_t>(m.ByteSizeLong()),
                                                        std::string(m.GetDescriptor()->name())));
  auto body = std::make_shared<std::string>();
  CL_RETURN_IF_ERROR(AppendJson(m, body.get()));
  body->push_back('\n');
  Send(res, std::move(body), "application/json", std::move(lease));
  return absl::OkStatus();
}

absl::Status SetField(pb::Message* root, const std::string& key, const std::string& value) {
  pb::Message* m = root;
  std::vector<std::string> parts = absl::StrSplit(key, '.');
  for (size_t i = 0; i < parts.size(); ++i) {
    const pb::FieldDescriptor* f = m->GetDescriptor()->FindFieldByName(parts[i]);
    if (f == nullptr) {
      std::vector<std::string> known;
      for (int k = 0; k < m->GetDescriptor()->field_count(); ++k) known.push_back(m->GetDescriptor()->field(k)->name());
      return absl::InvalidArgumentError("unknown query parameter " + Quote(Clip(key, 64)) +
                                        " (known here: " + absl::StrJoin(known, ", ") + ")");
    }
    const bool message = f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE && !f->is_repeated();
    if (i + 1 == parts.size() && message) {
      // A message from a list: its scalar fields in declaration order (pivot=x,y,value).
      pb::Message* sub = m->GetReflection()->MutableMessage(m, f);
      std::vector<std::string> items = absl::StrSplit(value, ',');
      const pb::Descriptor* d = sub->GetDescriptor();
      if (items.size() > static_cast<size_t>(d->field_count())) {
        return absl::InvalidArgumentError("query parameter " + Quote(Clip(key, 64)) + " takes at most " +
                                          std::to_string(d->field_count()) + " comma-separated values");
      }
      for (size_t k = 0; k < items.size(); ++k) {
        CL_RETURN_IF_ERROR(SetField(sub, d->field(static_cast<int>(k))->name(), items[k]));
      }
      return absl::OkStatus();
    }
    if (i + 1 < parts.size()) {
      if (!message) {
        return absl::InvalidArgumentError("query parameter " + Quote(Clip(key, 64)) + ": " + f->name() +
                                          " has no fields");
      }
      m = m->GetReflection()->MutableMessage(m, f);
      continue;
    }
    if (!f->is_repeated()) return SetScalar(m, f, value, key);
    for (absl::string_view item : absl::StrSplit(value, ',', absl::SkipEmpty())) {
      CL_RETURN_IF_ERROR(SetScalar(m, f, std::string(item), key));
    }
    return absl::OkStatus();
  }
  return absl::OkStatus();
}

absl::Status FillRequest(const httplib::Request& req, const std::vector<std::string>& path_fields, pb::Message* m) {
  for (size_t i = 0; i < path_fields.size() && i + 1 < req.matches.size(); ++i) {
    CL_RETURN_IF_ERROR(SetField(m, path_fields[i], req.matches[i + 1].str()));
  }
  if (req.params.size() > 256) return absl::InvalidArgumentError("at most 256 query parameters");
  for (const auto& [key, value] : req.params) {
    CL_RETURN_IF_ERROR(SetField(m, key, value));
  }
  return absl::OkStatus();
}

bool ClipRepeated(pb::Message* m, int keep, const pb::FieldDescriptor* skip) {
  const pb::Reflection* r = m->GetReflection();
  std::vector<const pb::FieldDescriptor*> fields;
  r->ListFields(*m, &fields);
  bool cut = false;
  for (const pb::FieldDescriptor* f : fields) {
    if (f->is_repeated() && f != skip && r->FieldSize(*m, f) > keep) {
      while (r->FieldSize(*m, f) > keep) r->RemoveLast(m, f);
      cut = true;
    }
    if (f->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (!f->is_repeated()) {
      cut |= ClipRepeated(r->MutableMessage(m, f), keep);
      continue;
    }
    for (int i = 0; i < r->FieldSize(*m, f); ++i) cut |= ClipRepeated(r->MutableRepeatedMessage(m, f, i), keep);
  }
  return cut;
}

}  // namespace circuitlab::http
