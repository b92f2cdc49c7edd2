#include "client/lib/proto_docs.h"

#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "google/protobuf/descriptor.pb.h"

namespace circuitlab::client {
namespace {

using Path = std::vector<int>;

// Field numbers of descriptor.proto's FileDescriptorProto and
// DescriptorProto, as SourceCodeInfo paths use them.
constexpr int kFileMessages = 4, kFileServices = 6, kMessageFields = 2, kMessageNested = 3, kServiceMethods = 2;

// Every embedded file's comments by (file name, path).
const std::map<std::pair<std::string, Path>, std::string>& Comments() {
  static const auto* comments = [] {
    auto* out = new std::map<std::pair<std::string, Path>, std::string>();
    for (const EmbeddedFile& f : ProtoSourceInfo()) {
      google::protobuf::FileDescriptorSet set;
      if (!set.ParseFromArray(f.bytes.data(), static_cast<int>(f.bytes.size()))) continue;
      for (const google::protobuf::FileDescriptorProto& file : set.file()) {
        for (const auto& loc : file.source_code_info().location()) {
          const std::string& text = loc.trailing_comments().empty() ? loc.leading_comments() : loc.trailing_comments();
          if (text.empty()) continue;
          std::vector<std::string> lines;
          for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
            lines.emplace_back(absl::StripAsciiWhitespace(line));
          }
          (*out)[{file.name(), Path(loc.path().begin(), loc.path().end())}] = absl::StrJoin(lines, " ");
        }
      }
    }
    return out;
  }();
  return *comments;
}

Path PathOf(const google::protobuf::Descriptor* message) {
  if (message->containing_type() == nullptr) return {kFileMessages, message->index()};
  Path p = PathOf(message->containing_type());
  p.insert(p.end(), {kMessageNested, message->index()});
  return p;
}

std::string Find(const google::protobuf::FileDescriptor* file, const Path& path) {
  const auto& all = Comments();
  auto it = all.find({std::string(file->name()), path});
  return it == all.end() ? "" : it->second;
}

}  // namespace

std::string CommentOf(const google::protobuf::MethodDescriptor* method) {
  return Find(method->service()->file(), {kFileServices, method->service()->index(), kServiceMethods, method->index()});
}

std::string CommentOf(const google::protobuf::Descriptor* message) { return Find(message->file(), PathOf(message)); }

std::string CommentOf(const google::protobuf::FieldDescriptor* field) {
  if (field->containing_type() == nullptr) return "";
  Path p = PathOf(field->containing_type());
  p.insert(p.end(), {kMessageFields, field->index()});
  return Find(field->file(), p);
}

}  // namespace circuitlab::client
