// Protobuf's JSON mapping in memory linear in the answer (issue 51 item 2).
//
// The HTTP API prints every answer as util::MessageToJsonString does with
// preserve_proto_field_names and always_print_primitive_fields. Protobuf 3.21
// prints those defaults through a DefaultValueObjectWriter, which first
// builds a tree node for every value in the message: a stored attention
// answer of 4,194,304 weights (33 MB of JSON) took ~1.25 GB per read, and
// glibc kept most of it. AppendJson writes the same text (the same field
// names, order, number formats, escapes; map entries may come in another
// order) by walking the message itself: sub-messages smaller than
// `delegate_below` bytes, and the well-known types, are still printed by
// protobuf, so only the large parts (long repeated fields) take this path.
#pragma once

#include <google/protobuf/message.h>

#include <cstddef>
#include <string>

#include "absl/status/status.h"

namespace circuitlab::http {

inline constexpr size_t kDelegateJsonBelow = 64 << 10;

// Appends `m` as JSON to `out`. Internal only when protobuf cannot print a
// part (as MessageToJsonString would fail).
absl::Status AppendJson(const google::protobuf::Message& m, std::string* out,
                        size_t delegate_below = kDelegateJsonBelow);

}  // namespace circuitlab::http
