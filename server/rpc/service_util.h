// What every gRPC handler shares: the one absl -> gRPC status conversion, the
// bearer-token check, and the unary adapter (check auth, call the core,
// finish with its status).
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/status.h"
#include "server/common/status_macros.h"

namespace circuitlab::rpc {

// The codes share numbers.
grpc::Status ToGrpcStatus(const absl::Status& status);

// Unauthenticated unless the call carries `authorization: Bearer <token>`
// (always OK when `token` is empty).
absl::Status CheckAuth(const grpc::CallbackServerContext* ctx, const std::string& token);

// Who is calling, for per-client limits: the `x-circuitlab-client` metadata,
// else the peer's host.
std::string ClientOf(const grpc::CallbackServerContext* ctx);

template <typename Fn>
grpc::ServerUnaryReactor* UnaryCall(grpc::CallbackServerContext* ctx, const std::string& token, Fn&& fn) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status s = CheckAuth(ctx, token);
  if (s.ok()) s = CallCatching(fn);
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

}  // namespace circuitlab::rpc
