// Analyses as HTTP routes: the two reads (GET .../{name}: a job or a
// stored answer; GET .../{name}/stored: stored only) and the POST of a
// request as JSON, for any request type of the analysis table; and
// TableRoutes, which gives every table entry its routes under
// /api/v1/runs/{id}/analyses/{name} (the fronts' name, server/common/
// analysis_names.h), so that an analysis added to the proto and the table
// is reachable over HTTP with no line here.
#include <google/protobuf/util/json_util.h>
#include <httplib.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "server/common/analysis_names.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/http/http_gateway.h"
#include "server/http/http_wire.h"
#include "server/scheduler/analysis_table.h"

namespace circuitlab::http {
namespace {

namespace pb = google::protobuf;

// A job's answer still QUEUED or RUNNING.
bool Pending(const pb::Message& answer) {
  const pb::FieldDescriptor* state = answer.GetDescriptor()->FindFieldByName("state");
  return state != nullptr && scheduler::IsPending(static_cast<v1::AnalysisState>(
                                 answer.GetReflection()->GetEnumValue(answer, state)));
}

std::unique_ptr<pb::Message> New(const pb::Message& prototype) { return std::unique_ptr<pb::Message>(prototype.New()); }

const std::string& RunIdOf(const pb::Message& m) {
  static const std::string kNone;
  const pb::FieldDescriptor* f = m.GetDescriptor()->FindFieldByName("run_id");
  return f == nullptr ? kNone : m.GetReflection()->GetStringReference(m, f, nullptr);
}

}  // namespace

void HttpGateway::AnalysisReads(const std::string& name, const std::string& verb, const pb::Message& request) {
  const security::Security* security = cores_.security;
  scheduler::AnalysisCore* analysis = cores_.analysis;
  const pb::Message* prototype = &request;  // a default instance: lives as long as the program
  const pb::Message* response = scheduler::FindJobAnalysis(request.GetDescriptor())->response;
  const auto fill = [](const httplib::Request& req, const pb::Message& prototype) -> absl::StatusOr<std::unique_ptr<pb::Message>> {
    std::unique_ptr<pb::Message> r = New(prototype);
    CL_RETURN_IF_ERROR(FillRequest(req, {"run_id"}, r.get()));
    return r;
  };
  Get("/api/v1/runs/([^/]+)/" + name, "runs/{id}/" + name, false,
      [=](const httplib::Request& req, httplib::Response& res, const security::Caller& c) -> absl::Status {
        CL_ASSIGN_OR_RETURN(std::unique_ptr<pb::Message> r, fill(req, *prototype));
        CL_RETURN_IF_ERROR(security->Check(c, security::Access::kRead, *r));
        auto out = analysis->Run(*r, scheduler::Requester(c.principal.name, security::Security::ReadsOnly(c)));
        if (!out.ok() || Pending(**out)) security->Audit(c, *r, out.ok() ? out->get() : nullptr, out.status());
        CL_RETURN_IF_ERROR(out.status());
        return Reply(res, **out);
      });
  Get("/api/v1/runs/([^/]+)/" + name + "/stored", "runs/{id}/" + name + "/stored", false,
      [=](const httplib::Request& req, httplib::Response& res, const security::Caller& c) -> absl::Status {
        CL_ASSIGN_OR_RETURN(std::unique_ptr<pb::Message> r, fill(req, *prototype));
        CL_RETURN_IF_ERROR(security->Check(c, security::Access::kRead, *r));
        auto out = analysis->Run(*r, scheduler::Requester(c.principal.name, true));
        if (!absl::IsPermissionDenied(out.status())) {
          CL_RETURN_IF_ERROR(out.status());
          return Reply(res, **out);
        }
        std::unique_ptr<pb::Message> none = New(*response);
        const std::string& id = RunIdOf(*r);
        none->GetReflection()->SetString(
            none.get(), none->GetDescriptor()->FindFieldByName("error"),
            "none stored for " + id + " with these options; " +
                (verb.empty() ? "for a caller who may start analyses, the same URL without /stored computes one"
                              : "`circuitlab " + verb + " " + id +
                                    "` computes one (or, for a caller who may start analyses, the same URL "
                                    "without /stored)"));
        return Reply(res, *none);
      });
}

// Writes from a browser: a bearer token only (no cookie is ever read, so
// another site's page cannot ride a session) and a JSON body (a cross-site
// form cannot send Content-Type application/json without a CORS preflight,
// which this server never grants); then exactly the gRPC call's checks: read
// access to the run, a role that may start analyses, the request's
// validation, quotas and memory, an audit line.
void HttpGateway::AnalysisPost(const std::string& pattern, const std::string& route, const std::string& stored,
                               const pb::Message& request) {
  const security::Security* security = cores_.security;
  scheduler::AnalysisCore* analysis = cores_.analysis;
  const pb::Message* prototype = &request;  // a default instance: lives as long as the program
  Post(pattern, route,
       [=](const httplib::Request& req, httplib::Response& res, const security::Caller& c) -> absl::Status {
         const std::string name(prototype->GetDescriptor()->name());
         const std::string type = absl::AsciiStrToLower(req.get_header_value("Content-Type"));
         if (type.rfind("application/json", 0) != 0) {
           WriteError(res,
                      absl::InvalidArgumentError("the body must be a " + name +
                                                 " as JSON with Content-Type: application/json, got Content-Type " +
                                                 Quote(Clip(type, 64))));
           res.status = 415;
           return absl::OkStatus();
         }
         std::unique_ptr<pb::Message> r = New(*prototype);
         pb::util::JsonParseOptions o;
         o.ignore_unknown_fields = false;
         if (pb::util::Status p = pb::util::JsonStringToMessage(req.body, r.get(), o); !p.ok()) {
           return absl::InvalidArgumentError("the body is not a " + name + ": " + Clip(p.ToString(), 300));
         }
         const std::string path_id = req.matches[1];
         const pb::FieldDescriptor* run_id = r->GetDescriptor()->FindFieldByName("run_id");
         if (!RunIdOf(*r).empty() && RunIdOf(*r) != path_id) {
           return absl::InvalidArgumentError("run_id in the body (" + Quote(Clip(RunIdOf(*r), 32)) +
                                             ") is not the run of the path (" + Quote(Clip(path_id, 32)) + ")");
         }
         r->GetReflection()->SetString(r.get(), run_id, path_id);
         if (security::Security::ReadsOnly(c)) {
           std::string where = stored;
           if (const size_t at = where.find("{id}"); at != std::string::npos) where.replace(at, 4, Clip(path_id, 32));
           const absl::Status refused = absl::PermissionDeniedError(
               "POST " + Clip(req.path, 128) + " starts an analysis; the principal " + c.principal.name +
               " may only read " + (where.empty() ? std::string("stored answers") : "stored answers (" + where + ")"));
           security->Audit(c, *r, nullptr, refused);
           return refused;
         }
         CL_RETURN_IF_ERROR(security->Check(c, security::Access::kRead, *r));
         auto out = analysis->Run(*r, scheduler::Requester(c.principal.name, false));
         if (!out.ok() || Pending(**out)) security->Audit(c, *r, out.ok() ? out->get() : nullptr, out.status());
         CL_RETURN_IF_ERROR(out.status());
         return Reply(res, **out);
       });
}

void HttpGateway::TableRoutes() {
  for (const scheduler::AnalysisEntry* entry : scheduler::JobAnalyses()) {
    const pb::MethodDescriptor* method = AnalysisMethodOf(entry->request->GetDescriptor());
    if (method == nullptr || entry->request->GetDescriptor()->FindFieldByName("run_id") == nullptr) continue;
    const std::string name = "analyses/" + AnalysisFrontName(method->name());
    AnalysisReads(name, "", *entry->request);
    AnalysisPost("/api/v1/runs/([^/]+)/" + name, "runs/{id}/" + name, "runs/{id}/" + name + "/stored",
                 *entry->request);
  }
}

}  // namespace circuitlab::http
