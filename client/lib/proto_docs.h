// The .proto files' comments at run time: protoc's source info for
// analysis_service.proto, compiled into the client (client/CMakeLists.txt),
// so that the CLI's generic analysis verbs explain each flag with the
// comment on its field, the one text a maintainer writes.
#pragma once

#include <span>
#include <string>

#include "google/protobuf/descriptor.h"
#include "server/common/embedded_file.h"

namespace circuitlab::client {

// The compiled-in FileDescriptorSets (generated; one per file).
std::span<const EmbeddedFile> ProtoSourceInfo();

// The comment on a method, message or field of an embedded file, its lines
// joined by spaces: the trailing comment when there is one, else the
// leading one; "" when none.
std::string CommentOf(const google::protobuf::MethodDescriptor* method);
std::string CommentOf(const google::protobuf::Descriptor* message);
std::string CommentOf(const google::protobuf::FieldDescriptor* field);

}  // namespace circuitlab::client
