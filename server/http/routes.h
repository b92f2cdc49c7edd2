// The gateway's route builders (internal to server/http): the member
// templates every route file uses, and an event stream's state.
#pragma once

#include <google/protobuf/util/json_util.h>
#include <httplib.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/http/http_gateway.h"
#include "server/http/http_wire.h"

namespace circuitlab::http {

struct HttpGateway::Stream {
  scheduler::Watch watch;
  std::shared_ptr<security::StreamTicket> ticket;  // a revoked token ends the stream
  std::mutex mu;
  std::condition_variable cv;
  bool notified = false;
  bool sent_any = false;
};

// One read endpoint: the request from the path's captures and the query, the
// caller's read access to what it names (as on gRPC), the core's answer as JSON.
template <typename Req, typename Fn>
void HttpGateway::Read(const std::string& pattern, const std::string& route, std::vector<std::string> path_fields,
                       Fn fn) {
  Get(pattern, route, false,
      [this, path_fields = std::move(path_fields), fn](const httplib::Request& req, httplib::Response& res,
                                                       const security::Caller& c) -> absl::Status {
        Req r;
        CL_RETURN_IF_ERROR(FillRequest(req, path_fields, &r));
        CL_RETURN_IF_ERROR(cores_.security->Check(c, security::Access::kRead, r));
        auto out = fn(r, c);
        CL_RETURN_IF_ERROR(out.status());
        return Reply(res, *out);
      });
}

template <typename Req, typename Resp>
void HttpGateway::AnalysisReads(const std::string& name, const std::string& verb) {
  const security::Security& security = *cores_.security;
  scheduler::AnalysisCore* analysis = cores_.analysis;
  Read<Req>("/api/v1/runs/([^/]+)/" + name, "runs/{id}/" + name, {"run_id"},
            [analysis, &security](const Req& r, const security::Caller& c) -> absl::StatusOr<Resp> {
              absl::StatusOr<Resp> out =
                  analysis->Run<Resp>(r, scheduler::Requester(c.principal.name, security::Security::ReadsOnly(c)));
              if (!out.ok() || scheduler::IsPending(out->state()))
                security.Audit(c, r, out.ok() ? &*out : nullptr, out.status());
              return out;
            });
  Read<Req>("/api/v1/runs/([^/]+)/" + name + "/stored", "runs/{id}/" + name + "/stored", {"run_id"},
            [analysis, verb](const Req& r, const security::Caller& c) -> absl::StatusOr<Resp> {
              absl::StatusOr<Resp> out = analysis->Run<Resp>(r, scheduler::Requester(c.principal.name, true));
              if (!absl::IsPermissionDenied(out.status())) return out;
              Resp none;
              none.set_error("none stored for " + r.run_id() + " with these options; `circuitlab " + verb + " " +
                             r.run_id() +
                             "` computes one (or, for a caller who may start analyses, the same URL "
                             "without /stored)");
              return none;
            });
}

// An analysis whose request does not fit a query string (nested messages:
// an InterveneRequest's prompts, GetActivations' sequences), POSTed as JSON.
// Writes from a browser: a bearer token only (no cookie is ever read, so
// another site's page cannot ride a session) and a JSON body (a cross-site
// form cannot send Content-Type application/json without a CORS preflight,
// which this server never grants); then exactly the gRPC call's checks: read
// access to the run, a role that may start analyses, the request's
// validation, quotas and memory, an audit line. `stored` names where a
// reader finds stored answers instead (for the refusal's message).
template <typename Req, typename Resp>
void HttpGateway::AnalysisPost(const std::string& pattern, const std::string& route, const std::string& stored) {
  const security::Security& security = *cores_.security;
  scheduler::AnalysisCore* analysis = cores_.analysis;
  Post(pattern, route,
       [analysis, &security, stored](const httplib::Request& req, httplib::Response& res,
                                     const security::Caller& c) -> absl::Status {
         const std::string name(Req::descriptor()->name());
         const std::string type = absl::AsciiStrToLower(req.get_header_value("Content-Type"));
         if (type.rfind("application/json", 0) != 0) {
           WriteError(res,
                      absl::InvalidArgumentError("the body must be a " + name +
                                                 " as JSON with Content-Type: application/json, got Content-Type " +
                                                 Quote(Clip(type, 64))));
           res.status = 415;
           return absl::OkStatus();
         }
         Req r;
         google::protobuf::util::JsonParseOptions o;
         o.ignore_unknown_fields = false;
         if (google::protobuf::util::Status p = google::protobuf::util::JsonStringToMessage(req.body, &r, o); !p.ok()) {
           return absl::InvalidArgumentError("the body is not a " + name + ": " + Clip(p.ToString(), 300));
         }
         const std::string path_id = req.matches[1];
         if (!r.run_id().empty() && r.run_id() != path_id) {
           return absl::InvalidArgumentError("run_id in the body (" + Quote(Clip(r.run_id(), 32)) +
                                             ") is not the run of the path (" + Quote(Clip(path_id, 32)) + ")");
         }
         r.set_run_id(path_id);
         if (security::Security::ReadsOnly(c)) {
           std::string where = stored;
           if (const size_t at = where.find("{id}"); at != std::string::npos) where.replace(at, 4, Clip(path_id, 32));
           const absl::Status refused = absl::PermissionDeniedError(
               "POST " + Clip(req.path, 128) + " starts an analysis; the principal " + c.principal.name +
               " may only read " + (where.empty() ? std::string("stored answers") : "stored answers (" + where + ")"));
           security.Audit(c, r, nullptr, refused);
           return refused;
         }
         CL_RETURN_IF_ERROR(security.Check(c, security::Access::kRead, r));
         absl::StatusOr<Resp> out = analysis->Run<Resp>(r, scheduler::Requester(c.principal.name, false));
         if (!out.ok() || scheduler::IsPending(out->state()))
           security.Audit(c, r, out.ok() ? &*out : nullptr, out.status());
         CL_RETURN_IF_ERROR(out.status());
         return Reply(res, *out);
       });
}

}  // namespace circuitlab::http
