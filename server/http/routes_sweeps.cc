// Sweeps and reproductions over HTTP: a sweep and its summary, the recipes,
// the reproductions and their reports.
#include <httplib.h>

#include <string>
#include <vector>

#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/http/http_gateway.h"
#include "server/http/http_wire.h"
#include "server/http/routes.h"
#include "server/reproduce/render.h"

namespace circuitlab::http {

using security::Caller;
using security::MayRead;
using security::Security;

void HttpGateway::SweepRoutes() {
  const Security& security = *cores_.security;
  scheduler::SweepCore* sweeps = cores_.sweeps;
  Read<v1::GetSweepRequest>(R"(/api/v1/sweeps/([^/]+))", "sweeps/{id}", {"sweep_id"},
                            [sweeps](const auto& r, const Caller&) { return sweeps->Get(r.sweep_id()); });
  // ?values=a,b&filters=...&pivot=X,Y,VALUE[,AGGREGATE] (or pivot.x=...).
  Read<v1::GetSweepSummaryRequest>(
      R"(/api/v1/sweeps/([^/]+)/summary)", "sweeps/{id}/summary", {"sweep_id"},
      [sweeps, &security](const auto& r, const Caller& c) -> absl::StatusOr<v1::GetSweepSummaryResponse> {
        // As on gRPC: label columns start LabelRun jobs only for a caller who
        // may start analyses, and a summary that started any is audited.
        int started = 0;
        absl::StatusOr<v1::GetSweepSummaryResponse> out =
            sweeps->Summary(r, scheduler::Requester(c.principal.name, Security::ReadsOnly(c)), &started);
        if (out.ok() && started > 0) security.Audit(c, r, &*out, absl::OkStatus());
        return out;
      });
  Reproductions();
}

// Reproductions (issue 34): the recipes, the list and one reproduction with
// its report (read as on gRPC: a private server shows a user its own).
void HttpGateway::Reproductions() {
  reproduce::ReproductionCore* core = cores_.reproductions;
  if (core == nullptr) return;
  const Security& security = *cores_.security;
  Read<v1::ListRecipesRequest>(
      "/api/v1/recipes", "recipes", {},
      [core](const auto&, const Caller&) -> absl::StatusOr<v1::ListRecipesResponse> { return core->Recipes(); });
  Read<v1::ListReproductionsRequest>("/api/v1/reproductions", "reproductions", {},
                                     [core, &security](const auto& r, const Caller& c) {
                                       return core->List(r, security.ListFilter(c, r.mine()).value_or(""));
                                     });
  Read<v1::GetReproductionRequest>(
      R"(/api/v1/reproductions/([^/]+))", "reproductions/{id}", {"reproduction_id"},
      [core, &security](const auto& r, const Caller& c) -> absl::StatusOr<v1::Reproduction> {
        absl::StatusOr<std::string> owner = core->OwnerOf(r.reproduction_id());
        if (!owner.ok()) return owner.status();
        if (!MayRead(c.principal, *owner, security.private_runs())) {
          return absl::NotFoundError("reproduction " + Clip(r.reproduction_id(), 64) + " not found");
        }
        return core->Get(r.reproduction_id());
      });
  // The report as the Markdown file of docs/reproductions/ (the CLI's
  // `reproduce show --markdown`), for the page's download.
  Get(R"(/api/v1/reproductions/([^/]+)/report\.md)", "reproductions/{id}/report.md", false,
      [core, &security](const httplib::Request& req, httplib::Response& res, const Caller& c) -> absl::Status {
        v1::GetReproductionRequest r;
        CL_RETURN_IF_ERROR(FillRequest(req, {"reproduction_id"}, &r));
        absl::StatusOr<std::string> owner = core->OwnerOf(r.reproduction_id());
        CL_RETURN_IF_ERROR(owner.status());
        if (!MayRead(c.principal, *owner, security.private_runs())) {
          return absl::NotFoundError("reproduction " + Clip(r.reproduction_id(), 64) + " not found");
        }
        CL_ASSIGN_OR_RETURN(v1::Reproduction rep, core->Get(r.reproduction_id()));
        res.set_header("Content-Disposition",
                       "attachment; filename=\"" + rep.reproduction_id() + "-" + rep.recipe().id() + ".md\"");
        res.set_content(reproduce::ReproductionMarkdown(rep), "text/markdown; charset=utf-8");
        return absl::OkStatus();
      });
}

}  // namespace circuitlab::http
