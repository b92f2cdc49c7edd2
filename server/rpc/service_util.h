// What every gRPC handler shares: the one absl -> gRPC status conversion, the
// bearer-token check, the request parser, and the unary adapter (check auth,
// parse, call the core, finish with its status).
//
// Every method is registered raw (grpc::ByteBuffer in and out) and parses its
// own request: gRPC's generated handlers answer a payload that does not parse
// with UNIMPLEMENTED and no message, which a client reads as version skew.
// Here it is INVALID_ARGUMENT naming the message, and a request carrying
// fields this server does not know is refused rather than stored and echoed.
#pragma once

#include <google/protobuf/message.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "server/common/status_macros.h"

namespace circuitlab::rpc {

// The codes share numbers. The message is capped at kMaxStatusMessage
// characters (a longer one ends in "…"): gRPC refuses trailing metadata past
// its limit, which would hide the error behind a transport one.
constexpr size_t kMaxStatusMessage = 1000;
grpc::Status ToGrpcStatus(const absl::Status& status);

// `in` parsed into `req`: InvalidArgument when it is not a `req` message (or
// exceeds the nesting limit) or holds fields unknown to this server, naming
// the first such field by its path.
absl::Status ParseRequest(const grpc::ByteBuffer& in, google::protobuf::Message* req);

// The first unknown field anywhere in `m`, as "field 99 of training" (path
// from the root; "" for the root); empty when there is none.
std::string FirstUnknownField(const google::protobuf::Message& m, const std::string& path = "");

// `resp` serialized into `out` (Internal when it cannot be).
grpc::Status WriteResponse(const google::protobuf::Message& resp, grpc::ByteBuffer* out);

// Unauthenticated unless the call carries `authorization: Bearer <token>`
// (always OK when `token` is empty).
absl::Status CheckAuth(const grpc::CallbackServerContext* ctx, const std::string& token);

// Who is calling, for per-client limits: the `x-circuitlab-client` metadata,
// else the peer's host.
std::string ClientOf(const grpc::CallbackServerContext* ctx);

// A unary method: auth, parse `in` as Req, `fn(req, &resp)` (an exception is
// INTERNAL with its message), `resp` into `out`, finish.
template <typename Req, typename Resp, typename Fn>
grpc::ServerUnaryReactor* UnaryCall(grpc::CallbackServerContext* ctx, const std::string& token,
                                    const grpc::ByteBuffer* in, grpc::ByteBuffer* out, Fn&& fn) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  Req req;
  Resp resp;
  absl::Status s = CheckAuth(ctx, token);
  if (s.ok()) s = ParseRequest(*in, &req);
  if (s.ok()) s = CallCatching([&] { return fn(req, &resp); });
  reactor->Finish(s.ok() ? WriteResponse(resp, out) : ToGrpcStatus(s));
  return reactor;
}

}  // namespace circuitlab::rpc
