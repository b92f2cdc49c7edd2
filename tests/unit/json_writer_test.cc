// http::AppendJson writes what protobuf's MessageToJsonString writes (field
// names, order, defaults, numbers, escapes, well-known types), for every
// message type of the API filled by reflection: the HTTP answers do not
// change when large ones stop going through protobuf's tree (issue 51 item 2).
#include "server/http/json_writer.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/timestamp.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "circuitlab/v1/analysis_service.pb.h"
#include "circuitlab/v1/reproduce.pb.h"

namespace circuitlab::http {
namespace {

namespace pb = google::protobuf;
using FD = pb::FieldDescriptor;

std::string Protobuf(const pb::Message& m) {
  pb::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  std::string out;
  EXPECT_TRUE(pb::util::MessageToJsonString(m, &out, o).ok());
  return out;
}

std::string Ours(const pb::Message& m, size_t delegate_below = 0) {
  std::string out;
  EXPECT_TRUE(AppendJson(m, &out, delegate_below).ok());
  return out;
}

// Every field set, with values that exercise the printer: escapes, NaN and
// infinities, 64-bit integers, unknown enum numbers, bytes, `entries` map
// entries, and `depth` levels of nesting (well-known types get valid values).
class Filler {
 public:
  explicit Filler(int entries) : entries_(entries) {}

  void Fill(pb::Message* m, int depth) {
    const pb::Descriptor* d = m->GetDescriptor();
    if (d->full_name() == "google.protobuf.Timestamp") {
      static_cast<pb::Timestamp*>(m)->set_seconds(1'700'000'000 + n_++);
      return;
    }
    if (d->full_name() == "google.protobuf.Value") {
      auto* v = static_cast<pb::Value*>(m);
      if (n_++ % 2) {
        v->set_string_value("v<" + std::to_string(n_) + ">");
      } else {
        v->set_number_value(0.25 * n_);
      }
      return;
    }
    if (d->file()->name().rfind("google/protobuf/", 0) == 0) return;
    const pb::Reflection* r = m->GetReflection();
    for (int i = 0; i < d->field_count(); ++i) {
      const FD* f = d->field(i);
      if (f->is_map()) {
        for (int k = 0; k < entries_; ++k) {
          pb::Message* e = r->AddMessage(m, f);
          Scalar(e, e->GetDescriptor()->map_key(), -1);
          const FD* v = e->GetDescriptor()->map_value();
          if (v->cpp_type() == FD::CPPTYPE_MESSAGE) {
            Fill(e->GetReflection()->MutableMessage(e, v), depth - 1);  // protobuf cannot print an unset value
          } else {
            Scalar(e, v, -1);
          }
        }
      } else if (f->cpp_type() == FD::CPPTYPE_MESSAGE) {
        if (depth <= 0) continue;
        if (f->is_repeated()) {
          for (int k = 0; k < 2; ++k) Fill(r->AddMessage(m, f), depth - 1);
        } else {
          Fill(r->MutableMessage(m, f), depth - 1);
        }
      } else if (f->is_repeated()) {
        for (int k = 0; k < 4; ++k) Scalar(m, f, k);
      } else if (n_ % 5 != 0) {  // leave some at their defaults
        Scalar(m, f, -1);
      } else {
        ++n_;
      }
    }
  }

 private:
  void Scalar(pb::Message* m, const FD* f, int k) {
    const pb::Reflection* r = m->GetReflection();
    const bool rep = f->is_repeated();
    const int64_t n = n_++;
    static const char* kTexts[] = {"plain",          "q\"b\\s/",      "<script>&'",      "\n\t\r\b\f\x01\x1f",
                                   "\x7f\xc2\x80\xc2\xad\xc3\xa9", "\xe2\x80\xa8\xe2\x80\xae\xef\xbb\xbf",
                                   "\xf0\x9f\x98\x80 \xf3\xa0\x80\x81", ""};
    switch (f->cpp_type()) {
      case FD::CPPTYPE_INT32: rep ? r->AddInt32(m, f, -3 * n) : r->SetInt32(m, f, -3 * n); break;
      case FD::CPPTYPE_UINT32: rep ? r->AddUInt32(m, f, 7 * n) : r->SetUInt32(m, f, 7 * n); break;
      case FD::CPPTYPE_INT64: {
        const int64_t v = -(int64_t{1} << 60) + n;
        rep ? r->AddInt64(m, f, v) : r->SetInt64(m, f, v);
        break;
      }
      case FD::CPPTYPE_UINT64: {
        const uint64_t v = (uint64_t{1} << 63) + n;
        rep ? r->AddUInt64(m, f, v) : r->SetUInt64(m, f, v);
        break;
      }
      case FD::CPPTYPE_FLOAT: {
        const float vs[] = {0.1f, -1e-7f, 3.4e38f, std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(), 1.0f / 3, 123456.79f};
        const float v = vs[n % 7];
        rep ? r->AddFloat(m, f, v) : r->SetFloat(m, f, v);
        break;
      }
      case FD::CPPTYPE_DOUBLE: {
        const double vs[] = {0.1, -2.5e-300, 1e21, -std::numeric_limits<double>::infinity(), 1.0 / 3,
                             std::numeric_limits<double>::quiet_NaN(), 12345678901234567.0};
        const double v = vs[n % 7];
        rep ? r->AddDouble(m, f, v) : r->SetDouble(m, f, v);
        break;
      }
      case FD::CPPTYPE_BOOL: rep ? r->AddBool(m, f, n % 2) : r->SetBool(m, f, n % 2); break;
      case FD::CPPTYPE_ENUM: {
        const pb::EnumDescriptor* e = f->enum_type();
        const int v = n % 4 == 3 ? 1000 + static_cast<int>(n) : e->value(static_cast<int>(n % e->value_count()))->number();
        rep ? r->AddEnumValue(m, f, v) : r->SetEnumValue(m, f, v);
        break;
      }
      case FD::CPPTYPE_STRING: {
        std::string v = f->type() == FD::TYPE_BYTES ? std::string("\x00\xff\x10 bytes", 10) + std::to_string(n)
                                                    : kTexts[n % 8] + std::to_string(n);
        rep ? r->AddString(m, f, v) : r->SetString(m, f, v);
        break;
      }
      case FD::CPPTYPE_MESSAGE: break;
    }
  }

  int entries_;
  int64_t n_ = 1;
};

std::vector<const pb::Descriptor*> ApiMessages() {
  std::vector<const pb::Descriptor*> out;
  for (const char* file : {"circuitlab/v1/analysis_service.proto", "circuitlab/v1/experiment_service.proto",
                           "circuitlab/v1/reproduce.proto", "circuitlab/v1/spec.proto"}) {
    const pb::FileDescriptor* fd = pb::DescriptorPool::generated_pool()->FindFileByName(file);
    if (fd == nullptr) continue;
    for (int i = 0; i < fd->message_type_count(); ++i) out.push_back(fd->message_type(i));
  }
  return out;
}

TEST(JsonWriterTest, WritesWhatProtobufWritesForEveryApiMessage) {
  // The generated files must be linked in for the pool to know them.
  v1::GetAttentionPatternsResponse touch_analysis;
  v1::Reproduction touch_reproduce;
  const std::vector<const pb::Descriptor*> types = ApiMessages();
  ASSERT_GT(types.size(), 100u);
  int compared = 0;
  for (const pb::Descriptor* d : types) {
    for (int depth : {0, 1, 3}) {
      std::unique_ptr<pb::Message> m(pb::MessageFactory::generated_factory()->GetPrototype(d)->New());
      Filler(1).Fill(m.get(), depth);
      // One entry per map: the text is compared byte for byte.
      ASSERT_EQ(Ours(*m), Protobuf(*m)) << d->full_name() << " depth " << depth;
      ++compared;
      // Several entries per map: protobuf's map order is its hash map's, so
      // the documents are compared as JSON.
      std::unique_ptr<pb::Message> many(m->New());
      Filler(3).Fill(many.get(), depth);
      ASSERT_EQ(nlohmann::json::parse(Ours(*many)), nlohmann::json::parse(Protobuf(*many)))
          << d->full_name() << " depth " << depth;
      // The default: small parts printed by protobuf, the same text.
      ASSERT_EQ(Ours(*m, kDelegateJsonBelow), Protobuf(*m)) << d->full_name();
    }
  }
  EXPECT_GT(compared, 300);
}

TEST(JsonWriterTest, AnEmptyMessagePrintsItsDefaults) {
  v1::GetAttentionPatternsResponse empty;
  EXPECT_EQ(Ours(empty), Protobuf(empty));
  EXPECT_NE(Ours(empty).find("\"patterns\":[]"), std::string::npos);
}

TEST(JsonWriterTest, EveryCodePointIsEscapedAsProtobufEscapesIt) {
  auto put = [](std::string& s, uint32_t cp) {
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else if (cp < 0x800) {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 63));
    } else if (cp < 0x10000) {
      s += static_cast<char>(0xE0 | (cp >> 12));
      s += static_cast<char>(0x80 | ((cp >> 6) & 63));
      s += static_cast<char>(0x80 | (cp & 63));
    } else {
      s += static_cast<char>(0xF0 | (cp >> 18));
      s += static_cast<char>(0x80 | ((cp >> 12) & 63));
      s += static_cast<char>(0x80 | ((cp >> 6) & 63));
      s += static_cast<char>(0x80 | (cp & 63));
    }
  };
  // In chunks of 4,096 code points (surrogates are no code points of UTF-8).
  for (uint32_t start = 0; start <= 0x10FFFF; start += 4096) {
    v1::AttentionPattern p;
    std::string s;
    for (uint32_t cp = start; cp < start + 4096 && cp <= 0x10FFFF; ++cp) {
      if (cp < 0xD800 || cp > 0xDFFF) put(s, cp);
    }
    p.set_name(s);
    ASSERT_EQ(Ours(p), Protobuf(p)) << "code points from U+" << std::hex << start;
  }
}

// A large attention answer (524,288 weights) goes through the writer's own
// path and gives protobuf's text.
TEST(JsonWriterTest, TheLargestAttentionAnswerIsProtobufsText) {
  v1::GetAttentionPatternsResponse r;
  r.set_run_id("r1");
  r.set_step(300);
  r.set_state(v1::ANALYSIS_STATE_DONE);
  for (int k = 0; k < 2; ++k) {
    v1::AttentionPattern* p = r.add_patterns();
    p->set_layer(k / 2);
    p->set_head(k % 2);
    p->set_name("L" + std::to_string(k));
    p->set_size(512);
    for (int i = 0; i < 512 * 512; ++i) p->add_weights(static_cast<float>((i * 2654435761u) % 1000) / 997.0f);
  }
  std::string ours;
  ASSERT_TRUE(AppendJson(r, &ours).ok());
  EXPECT_EQ(ours, Protobuf(r));
  EXPECT_GT(ours.size(), 2u << 20);
}

}  // namespace
}  // namespace circuitlab::http
