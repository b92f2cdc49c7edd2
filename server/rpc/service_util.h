// What every gRPC handler shares: the one absl -> gRPC status conversion, the
// request parser, and the unary adapter (authenticate, parse, check access,
// call the core, audit, finish with its status).
//
// Every method is registered raw (grpc::ByteBuffer in and out) and parses its
// own request: gRPC's generated handlers answer a payload that does not parse
// with UNIMPLEMENTED and no message, which a client reads as version skew.
// Here it is INVALID_ARGUMENT naming the message, and a request carrying
// fields this server does not know is refused rather than stored and echoed.
#pragma once

#include <google/protobuf/message.h>
#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "server/common/response_budget.h"
#include "server/common/status_macros.h"
#include "server/security/security.h"

namespace circuitlab::rpc {

// The gRPC handlers speak of callers and their rights as security/ does.
using security::Access;
using security::Caller;
using security::MayChange;
using security::MayRead;
using security::Role;
using security::RoleName;
using security::Security;
using security::StreamTicket;

// The caller of a gRPC call: its `authorization` and `x-circuitlab-client`
// metadata, its peer, and whether the transport is TLS. Every service but
// WorkerService (`workers` true) refuses the worker role (PermissionDenied).
absl::StatusOr<Caller> Authenticate(const Security& security, const grpc::CallbackServerContext* ctx,
                                    bool workers = false);

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

// Finishes a unary call: with `s` when it failed, else with `resp` written
// into `out` within the process's ResponseBudget (RESOURCE_EXHAUSTED, naming
// the numbers, when it does not fit).
void FinishWithin(grpc::ServerUnaryReactor* reactor, const absl::Status& s, const google::protobuf::Message& resp,
                  grpc::ByteBuffer* out);

// A unary method: authenticate the caller, parse `in` as Req, check the
// caller's `access` to what it names, `fn(req, &resp, caller)` (an exception
// is INTERNAL with its message), `resp` into `out`, finish. A call that is not
// a read leaves an audit line.
template <typename Req, typename Resp, typename Fn>
grpc::ServerUnaryReactor* UnaryCall(grpc::CallbackServerContext* ctx, const Security& security, Access access,
                                    const grpc::ByteBuffer* in, grpc::ByteBuffer* out, Fn&& fn) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  Req req;
  Resp resp;
  absl::StatusOr<Caller> caller = Authenticate(security, ctx);
  absl::Status s = caller.status();
  if (s.ok()) s = ParseRequest(*in, &req);
  if (s.ok()) s = security.Check(*caller, access, req);
  if (s.ok()) s = CallCatching([&] { return fn(req, &resp, *caller); });
  if (caller.ok() && access != Access::kRead) security.Audit(*caller, req, &resp, s);
  FinishWithin(reactor, s, resp, out);
  return reactor;
}

// The threads of the calls whose validation is heavy (StartReproduction and
// SubmitSweep check every member of up to thousands of runs): gRPC runs a
// unary handler on its own callback threads, so sixteen such calls at once
// stalled every read (GetRun waited 10.6 s). They run here instead, at most
// `threads` at a time; past `max_waiting` waiting, a call is refused.
class SlowCalls {
 public:
  SlowCalls(int threads, size_t max_waiting);
  // Runs what was queued, then joins (the gRPC server, shut down first,
  // waits for these calls to finish).
  ~SlowCalls();
  SlowCalls(const SlowCalls&) = delete;
  SlowCalls& operator=(const SlowCalls&) = delete;
  // False (nothing queued) when max_waiting calls already wait.
  bool Run(std::function<void()> call);
  size_t max_waiting() const { return max_waiting_; }

 private:
  void Work();
  const size_t max_waiting_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// UnaryCall with `fn` run on `slow`'s threads: the caller authenticated,
// the request parsed and its access checked on gRPC's thread (cheap), the
// call itself and its answer from `slow`. RESOURCE_EXHAUSTED when too many
// wait already.
template <typename Req, typename Resp, typename Fn>
grpc::ServerUnaryReactor* SlowUnaryCall(SlowCalls& slow, grpc::CallbackServerContext* ctx, const Security& security,
                                        Access access, const grpc::ByteBuffer* in, grpc::ByteBuffer* out, Fn fn) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto req = std::make_shared<Req>();
  absl::StatusOr<Caller> caller = Authenticate(security, ctx);
  absl::Status s = caller.status();
  if (s.ok()) s = ParseRequest(*in, req.get());
  if (s.ok()) s = security.Check(*caller, access, *req);
  if (s.ok()) {
    const bool queued = slow.Run([reactor, req, who = *caller, &security, access, out, fn = std::move(fn)]() mutable {
      Resp resp;
      const absl::Status done = CallCatching([&] { return fn(*req, &resp, who); });
      if (access != Access::kRead) security.Audit(who, *req, &resp, done);
      FinishWithin(reactor, done, resp, out);
    });
    if (queued) return reactor;
    s = absl::ResourceExhaustedError("the server is busy: " + std::to_string(slow.max_waiting()) +
                                     " submissions wait to be validated; retry in a moment");
  }
  if (caller.ok() && access != Access::kRead) security.Audit(*caller, *req, nullptr, s);
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

}  // namespace circuitlab::rpc
