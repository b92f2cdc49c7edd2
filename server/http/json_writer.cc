#include "server/http/json_writer.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/stubs/strutil.h>
#include <google/protobuf/util/json_util.h>

#include <cmath>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"

namespace circuitlab::http {
namespace {

namespace pb = google::protobuf;
using FD = pb::FieldDescriptor;

// Code points protobuf's JSON escapes as \uXXXX beyond the ASCII controls,
// '"', '\\', '<' and '>' (measured on libprotobuf 3.21 over every code point:
// tests/unit/json_writer_test.cc compares the two).
bool EscapedByProtobuf(uint32_t cp) {
  if (cp < 0x20 || cp == '<' || cp == '>' || (cp >= 0x7F && cp <= 0x9F) || cp == 0xAD) return true;
  if ((cp >= 0x600 && cp <= 0x603) || cp == 0x6DD || cp == 0x70F || cp == 0x17B4 || cp == 0x17B5) return true;
  if ((cp >= 0x200B && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202E) || (cp >= 0x2060 && cp <= 0x2064) ||
      (cp >= 0x206A && cp <= 0x206F))
    return true;
  if (cp == 0xFEFF || (cp >= 0xFFF9 && cp <= 0xFFFB)) return true;
  if ((cp >= 0x1D173 && cp <= 0x1D17A) || cp == 0xE0001 || (cp >= 0xE0020 && cp <= 0xE007F)) return true;
  return false;
}

void AppendUnit(uint32_t unit, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  const char u[6] = {'\\', 'u', kHex[(unit >> 12) & 15], kHex[(unit >> 8) & 15], kHex[(unit >> 4) & 15],
                     kHex[unit & 15]};
  out->append(u, 6);
}

// A string as protobuf's JSON writes it (the text is valid UTF-8: proto3
// strings are checked when parsed or set through the generated API).
void AppendString(std::string_view s, std::string* out) {
  out->push_back('"');
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (i + len > s.size()) len = s.size() - i;
    uint32_t cp = c;
    if (len > 1) {
      cp = c & (0x3F >> (len - 1));
      for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    }
    switch (cp) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\b': out->append("\\b"); break;
      case '\f': out->append("\\f"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      default:
        if (!EscapedByProtobuf(cp)) {
          out->append(s.data() + i, len);
        } else if (cp < 0x10000) {
          AppendUnit(cp, out);
        } else {
          AppendUnit(0xD800 + ((cp - 0x10000) >> 10), out);
          AppendUnit(0xDC00 + ((cp - 0x10000) & 0x3FF), out);
        }
    }
    i += len;
  }
  out->push_back('"');
}

template <typename T>
void AppendFloating(T v, std::string* out) {
  if (std::isnan(v)) {
    out->append("\"NaN\"");
  } else if (std::isinf(v)) {
    out->append(v > 0 ? "\"Infinity\"" : "\"-Infinity\"");
  } else if constexpr (sizeof(T) == sizeof(float)) {
    out->append(pb::SimpleFtoa(v));
  } else {
    out->append(pb::SimpleDtoa(v));
  }
}

bool IsWellKnown(const pb::Descriptor* d) { return d->file()->name().rfind("google/protobuf/", 0) == 0; }

absl::Status Delegate(const pb::Message& m, bool defaults, std::string* out) {
  pb::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = defaults;
  std::string text;
  if (pb::util::Status s = pb::util::MessageToJsonString(m, &text, o); !s.ok()) {
    return absl::InternalError("cannot write " + m.GetDescriptor()->name() + " as JSON: " + s.ToString());
  }
  out->append(text);
  return absl::OkStatus();
}

class Writer {
 public:
  Writer(std::string* out, size_t delegate_below) : out_(out), delegate_below_(delegate_below) {}

  absl::Status Message(const pb::Message& m) {
    const pb::Descriptor* d = m.GetDescriptor();
    if (IsWellKnown(d)) return Delegate(m, m.ByteSizeLong() < delegate_below_, out_);
    if (m.ByteSizeLong() < delegate_below_) return Delegate(m, true, out_);
    const pb::Reflection* r = m.GetReflection();
    out_->push_back('{');
    bool first = true;
    // Protobuf's order: the fields in declaration order, but those declared
    // `optional` (proto3's explicit presence) and those of a well-known type
    // after all the others (its tree gives them no default node).
    auto late = [](const FD* f) {
      return f->has_optional_keyword() ||
             (!f->is_repeated() && f->cpp_type() == FD::CPPTYPE_MESSAGE && IsWellKnown(f->message_type()));
    };
    std::vector<const FD*> fields;
    for (int i = 0; i < d->field_count(); ++i) {
      if (!late(d->field(i))) fields.push_back(d->field(i));
    }
    for (int i = 0; i < d->field_count(); ++i) {
      if (late(d->field(i))) fields.push_back(d->field(i));
    }
    for (const FD* f : fields) {
      if (!f->is_repeated() && f->has_presence() && !r->HasField(m, f)) continue;
      if (!first) out_->push_back(',');
      first = false;
      AppendString(f->name(), out_);
      out_->push_back(':');
      if (f->is_map()) {
        CL_RETURN_IF_ERROR(Map(m, f));
      } else if (f->is_repeated()) {
        out_->push_back('[');
        const int n = r->FieldSize(m, f);
        for (int k = 0; k < n; ++k) {
          if (k) out_->push_back(',');
          CL_RETURN_IF_ERROR(Value(m, f, k));
        }
        out_->push_back(']');
      } else {
        CL_RETURN_IF_ERROR(Value(m, f, -1));
      }
    }
    out_->push_back('}');
    return absl::OkStatus();
  }

 private:
  // Map keys are strings in JSON: protobuf writes an integer or bool key as
  // its decimal text or true/false, quoted.
  absl::Status Map(const pb::Message& m, const FD* f) {
    const pb::Reflection* r = m.GetReflection();
    out_->push_back('{');
    const int n = r->FieldSize(m, f);
    for (int k = 0; k < n; ++k) {
      const pb::Message& entry = r->GetRepeatedMessage(m, f, k);
      const FD* key = entry.GetDescriptor()->map_key();
      const pb::Reflection* er = entry.GetReflection();
      if (k) out_->push_back(',');
      switch (key->cpp_type()) {
        case FD::CPPTYPE_STRING: AppendString(er->GetString(entry, key), out_); break;
        case FD::CPPTYPE_BOOL: out_->append(er->GetBool(entry, key) ? "\"true\"" : "\"false\""); break;
        case FD::CPPTYPE_INT32: AppendString(absl::StrCat(er->GetInt32(entry, key)), out_); break;
        case FD::CPPTYPE_UINT32: AppendString(absl::StrCat(er->GetUInt32(entry, key)), out_); break;
        case FD::CPPTYPE_INT64: AppendString(absl::StrCat(er->GetInt64(entry, key)), out_); break;
        case FD::CPPTYPE_UINT64: AppendString(absl::StrCat(er->GetUInt64(entry, key)), out_); break;
        default: return absl::InternalError("map key of type " + std::string(key->cpp_type_name()));
      }
      out_->push_back(':');
      CL_RETURN_IF_ERROR(Value(entry, entry.GetDescriptor()->map_value(), -1));
    }
    out_->push_back('}');
    return absl::OkStatus();
  }

  // One value of field `f` (element `k` when repeated, else k < 0).
  absl::Status Value(const pb::Message& m, const FD* f, int k) {
    const pb::Reflection* r = m.GetReflection();
    const bool rep = k >= 0;
    switch (f->cpp_type()) {
      case FD::CPPTYPE_INT32:
        out_->append(absl::StrCat(rep ? r->GetRepeatedInt32(m, f, k) : r->GetInt32(m, f)));
        break;
      case FD::CPPTYPE_UINT32:
        out_->append(absl::StrCat(rep ? r->GetRepeatedUInt32(m, f, k) : r->GetUInt32(m, f)));
        break;
      case FD::CPPTYPE_INT64:  // 64-bit integers are strings in protobuf's JSON
        AppendString(absl::StrCat(rep ? r->GetRepeatedInt64(m, f, k) : r->GetInt64(m, f)), out_);
        break;
      case FD::CPPTYPE_UINT64:
        AppendString(absl::StrCat(rep ? r->GetRepeatedUInt64(m, f, k) : r->GetUInt64(m, f)), out_);
        break;
      case FD::CPPTYPE_FLOAT:
        AppendFloating(rep ? r->GetRepeatedFloat(m, f, k) : r->GetFloat(m, f), out_);
        break;
      case FD::CPPTYPE_DOUBLE:
        AppendFloating(rep ? r->GetRepeatedDouble(m, f, k) : r->GetDouble(m, f), out_);
        break;
      case FD::CPPTYPE_BOOL:
        out_->append((rep ? r->GetRepeatedBool(m, f, k) : r->GetBool(m, f)) ? "true" : "false");
        break;
      case FD::CPPTYPE_ENUM: {
        const int v = rep ? r->GetRepeatedEnumValue(m, f, k) : r->GetEnumValue(m, f);
        if (const pb::EnumValueDescriptor* e = f->enum_type()->FindValueByNumber(v)) {
          AppendString(e->name(), out_);
        } else {
          out_->append(absl::StrCat(v));
        }
        break;
      }
      case FD::CPPTYPE_STRING: {
        std::string scratch;
        const std::string& s = rep ? r->GetRepeatedStringReference(m, f, k, &scratch)
                                   : r->GetStringReference(m, f, &scratch);
        if (f->type() == FD::TYPE_BYTES) {
          AppendString(absl::Base64Escape(s), out_);
        } else {
          AppendString(s, out_);
        }
        break;
      }
      case FD::CPPTYPE_MESSAGE:
        return Message(rep ? r->GetRepeatedMessage(m, f, k) : r->GetMessage(m, f));
    }
    return absl::OkStatus();
  }

  std::string* out_;
  size_t delegate_below_;
};

}  // namespace

absl::Status AppendJson(const pb::Message& m, std::string* out, size_t delegate_below) {
  return Writer(out, delegate_below).Message(m);
}

}  // namespace circuitlab::http
