// One text value into a scalar field of a message, by reflection: what the
// HTTP gateway's query strings (server/http/http_wire.cc) and the CLI's
// generic analysis verbs (client/cli/commands/analysis_verbs.cc) parse
// alike. Integers and numbers in full, bools as true/false/1/0 ("" = true),
// enums by full name or by their last part in any case (RUN_STATE_SUCCEEDED
// or succeeded), strings as they are; a repeated field gets the value added.
// Header-only: protobuf's reflection and absl, nothing of gRPC.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace circuitlab {

// OK, or for a value that does not parse InvalidArgument whose message is
// what the field takes ("an integer", "true or false", "one of A, B"), for
// the caller to phrase; Unimplemented for a message or bytes field.
inline absl::Status SetScalarFromText(google::protobuf::Message* m, const google::protobuf::FieldDescriptor* f,
                                      const std::string& value) {
  namespace pb = google::protobuf;
  const pb::Reflection* r = m->GetReflection();
  const bool rep = f->is_repeated();
  const auto bad = [](const std::string& what) { return absl::InvalidArgumentError(what); };
  switch (f->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_STRING:
      if (f->type() == pb::FieldDescriptor::TYPE_BYTES) return absl::UnimplementedError("a bytes field");
      rep ? r->AddString(m, f, value) : r->SetString(m, f, value);
      return absl::OkStatus();
    case pb::FieldDescriptor::CPPTYPE_BOOL: {
      const std::string v = absl::AsciiStrToLower(value);
      if (v != "true" && v != "false" && v != "1" && v != "0" && !v.empty()) return bad("true or false");
      const bool b = v == "true" || v == "1" || v.empty();
      rep ? r->AddBool(m, f, b) : r->SetBool(m, f, b);
      return absl::OkStatus();
    }
#define CL_FIELD_TEXT_INT(CPP, T, Name, what)            \
  case pb::FieldDescriptor::CPP: {                       \
    T v;                                                 \
    if (!absl::SimpleAtoi(value, &v)) return bad(what);  \
    rep ? r->Add##Name(m, f, v) : r->Set##Name(m, f, v); \
    return absl::OkStatus();                             \
  }
      CL_FIELD_TEXT_INT(CPPTYPE_INT32, int32_t, Int32, "an integer")
      CL_FIELD_TEXT_INT(CPPTYPE_UINT32, uint32_t, UInt32, "a non-negative integer")
      CL_FIELD_TEXT_INT(CPPTYPE_INT64, int64_t, Int64, "an integer")
      CL_FIELD_TEXT_INT(CPPTYPE_UINT64, uint64_t, UInt64, "a non-negative integer")
#undef CL_FIELD_TEXT_INT
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
    case pb::FieldDescriptor::CPPTYPE_FLOAT: {
      double v;
      if (!absl::SimpleAtod(value, &v)) return bad("a number");
      if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_FLOAT) {
        rep ? r->AddFloat(m, f, static_cast<float>(v)) : r->SetFloat(m, f, static_cast<float>(v));
      } else {
        rep ? r->AddDouble(m, f, v) : r->SetDouble(m, f, v);
      }
      return absl::OkStatus();
    }
    case pb::FieldDescriptor::CPPTYPE_ENUM: {
      const pb::EnumDescriptor* e = f->enum_type();
      const pb::EnumValueDescriptor* v = e->FindValueByName(value);
      std::vector<std::string> names;
      const std::string upper = absl::AsciiStrToUpper(value);
      for (int i = 0; v == nullptr && i < e->value_count(); ++i) {
        const std::string& full = e->value(i)->name();
        names.push_back(full);
        if (!upper.empty() && full.size() > upper.size() &&
            full.compare(full.size() - upper.size(), upper.size(), upper) == 0 &&
            full[full.size() - upper.size() - 1] == '_') {
          v = e->value(i);
        }
      }
      if (v == nullptr) return bad("one of " + absl::StrJoin(names, ", "));
      rep ? r->AddEnum(m, f, v) : r->SetEnum(m, f, v);
      return absl::OkStatus();
    }
    default:
      return absl::UnimplementedError("a message field");
  }
}

}  // namespace circuitlab
