// A run's analyses over HTTP: attention, circuits and task vectors as jobs
// or stored answers, the analysis jobs, interventions (stored and POSTed),
// activations on the caller's sequences, and the exported weights.
#include <httplib.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/http/http_gateway.h"
#include "server/http/http_wire.h"
#include "server/http/routes.h"

namespace circuitlab::http {

using security::Access;
using security::Caller;
using security::MayRead;
using security::Security;
namespace {

// GET /api/v1/runs/{id}/interventions: a page of stored interventions ends
// before the one that would take its JSON over this, or its stored bytes
// (what is read to make it) over the second.
constexpr size_t kMaxInterventionPageJson = 1 << 20;
constexpr int64_t kMaxInterventionPageStored = 16 << 20;
// In a listed request, a repeated field's first elements (see StoredIntervention).
constexpr int kListedElements = 16;

// A stored intervention as the HTTP API answers it; `whole`: its request
// as stored, else its summary (StoredIntervention).
absl::StatusOr<v1::StoredIntervention> StoredInterventionFrom(const store::Store::StoredAnalysis& row,
                                                              const std::string& run_id, bool whole) {
  v1::StoredIntervention out;
  if (!out.mutable_request()->ParseFromString(row.request) || !out.mutable_response()->ParseFromString(row.result)) {
    return absl::DataLossError("a stored intervention of " + run_id + " does not parse");
  }
  out.set_key(std::to_string(row.request_hash));
  out.set_stored_at_us(row.created_at);
  out.set_request_bytes(static_cast<int64_t>(row.request.size()));
  if (!whole) {
    out.set_request_clipped(ClipRepeated(out.mutable_request(), kListedElements,
                                         v1::InterveneRequest::descriptor()->FindFieldByName("interventions")));
  }
  v1::InterveneResponse* rs = out.mutable_response();
  rs->set_state(v1::ANALYSIS_STATE_DONE);
  rs->set_progress(1.0);
  rs->set_from_store(true);
  return out;
}

absl::StatusOr<v1::ListStoredInterventionsResponse> StoredInterventions(store::Store& store,
                                                                        const v1::ListStoredInterventionsRequest& r) {
  if (r.page_size() < 0 || r.page_size() > 50) {
    return absl::InvalidArgumentError("page_size must be in [0, 50], got " + std::to_string(r.page_size()));
  }
  std::optional<store::Store::AnalysisCursor> after;
  if (!r.page_token().empty()) {
    const std::vector<std::string> parts = absl::StrSplit(r.page_token(), '.');
    store::Store::AnalysisCursor c;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &c.created_at) ||
        !absl::SimpleAtoi(parts[1], &c.request_hash)) {
      return absl::InvalidArgumentError("page_token must be a previous answer's next_page_token, got " +
                                        Quote(Clip(r.page_token(), 64)));
    }
    after = c;
  }
  CL_ASSIGN_OR_RETURN(const int64_t id, scheduler::ParseRunId(r.run_id()));
  CL_RETURN_IF_ERROR(store.GetRun(id).status());
  const int size = r.page_size() ? r.page_size() : 10;
  bool cut = false;
  CL_ASSIGN_OR_RETURN(std::vector<store::Store::StoredAnalysis> rows,
                      store.ListAnalyses(id, "intervene", size + 1, after, kMaxInterventionPageStored, &cut));
  v1::ListStoredInterventionsResponse out;
  out.set_run_id(scheduler::FormatRunId(id));
  size_t json = 0;
  bool more = cut || static_cast<int>(rows.size()) > size;
  for (size_t i = 0; i < rows.size() && static_cast<int>(i) < size; ++i) {
    CL_ASSIGN_OR_RETURN(v1::StoredIntervention item, StoredInterventionFrom(rows[i], out.run_id(), false));
    json += item.ByteSizeLong() * kJsonPerWireByte;
    if (json > kMaxInterventionPageJson && out.interventions_size() > 0) {
      more = true;
      break;
    }
    *out.add_interventions() = std::move(item);
  }
  if (more) {
    const v1::StoredIntervention& last = out.interventions(out.interventions_size() - 1);
    out.set_next_page_token(std::to_string(last.stored_at_us()) + "." + last.key());
  }
  return out;
}

absl::StatusOr<v1::StoredIntervention> StoredInterventionOf(store::Store& store,
                                                            const v1::GetStoredInterventionRequest& r) {
  int64_t hash = 0;
  if (!absl::SimpleAtoi(r.key(), &hash)) {
    return absl::InvalidArgumentError("key must be a listed intervention's key, got " + Quote(Clip(r.key(), 64)));
  }
  CL_ASSIGN_OR_RETURN(const int64_t id, scheduler::ParseRunId(r.run_id()));
  CL_RETURN_IF_ERROR(store.GetRun(id).status());
  CL_ASSIGN_OR_RETURN(std::optional<store::Store::StoredAnalysis> row, store.GetStoredAnalysis(id, "intervene", hash));
  if (!row.has_value()) {
    return absl::NotFoundError("run " + scheduler::FormatRunId(id) + " has no stored intervention " +
                               Quote(Clip(r.key(), 64)));
  }
  return StoredInterventionFrom(*row, scheduler::FormatRunId(id), true);
}

}  // namespace

void HttpGateway::AnalysisRoutes() {
  const Security& security = *cores_.security;
  scheduler::AnalysisCore* analysis = cores_.analysis;
  // Analyses (a job for a starter, stored for a reader; and /stored):
  // ?step=&eval_set=&sequences=&layers=0,1&heads=&seed= (attention), the
  // DetectCircuitRequest's fields (circuit), AnalyzeTaskVectorsRequest's
  // (task-vectors).
  AnalysisReads("attention", "attention", v1::GetAttentionPatternsRequest::default_instance());
  AnalysisReads("circuit", "detect", v1::DetectCircuitRequest::default_instance());
  AnalysisReads("task-vectors", "task-vectors", v1::AnalyzeTaskVectorsRequest::default_instance());
  Read<v1::ListAnalysisJobsRequest>(
      "/api/v1/analyses", "analyses", {},
      [&security, analysis](const auto&, const Caller& c) -> absl::StatusOr<v1::ListAnalysisJobsResponse> {
        return analysis->jobs().List(
            [&](const v1::AnalysisJob& job) { return MayRead(c.principal, job.owner(), security.private_runs()); });
      });
  Interventions();
  // Activations on the caller's own sequences (issue 46): a POSTed
  // GetActivationsRequest; stored answers are not listed.
  AnalysisPost(R"(/api/v1/runs/([^/]+)/activations)", "runs/{id}/activations", "",
               v1::GetActivationsRequest::default_instance());
  Exports();
  TableRoutes();
}

// A run's interventions over HTTP (issue 36): GET lists the stored Intervene
// answers with their requests; POST runs one from the browser.
void HttpGateway::Interventions() {
  scheduler::AnalysisCore* analysis = cores_.analysis;
  const std::string pattern = R"(/api/v1/runs/([^/]+)/interventions)";
  Read<v1::ListStoredInterventionsRequest>(
      pattern, "runs/{id}/interventions", {"run_id"},
      [analysis](const auto& r, const Caller&) -> absl::StatusOr<v1::ListStoredInterventionsResponse> {
        return StoredInterventions(analysis->store(), r);
      });
  Read<v1::GetStoredInterventionRequest>(
      R"(/api/v1/runs/([^/]+)/interventions/([^/]+))", "runs/{id}/interventions/{key}", {"run_id", "key"},
      [analysis](const auto& r, const Caller&) -> absl::StatusOr<v1::StoredIntervention> {
        return StoredInterventionOf(analysis->store(), r);
      });
  AnalysisPost(pattern, "runs/{id}/interventions", "GET /api/v1/runs/{id}/interventions",
               v1::InterveneRequest::default_instance());
}

// A model out (issue 46): GET .../export answers ExportWeights as JSON (a
// job for a starter, polled; the safetensors bytes in base64 once done), and
// .../export/weights.safetensors the stored file itself, as an attachment
// (`curl -o`), never starting a job.
void HttpGateway::Exports() {
  scheduler::AnalysisCore* analysis = cores_.analysis;
  AnalysisReads("export", "export", v1::ExportWeightsRequest::default_instance());
  Get(R"(/api/v1/runs/([^/]+)/export/weights\.safetensors)", "runs/{id}/export/weights.safetensors", false,
      [this, analysis](const httplib::Request& req, httplib::Response& res, const Caller& c) -> absl::Status {
        v1::ExportWeightsRequest r;
        CL_RETURN_IF_ERROR(FillRequest(req, {"run_id"}, &r));
        CL_RETURN_IF_ERROR(cores_.security->Check(c, Access::kRead, r));
        absl::StatusOr<v1::ExportWeightsResponse> out =
            analysis->Run<v1::ExportWeightsResponse>(r, scheduler::Requester(c.principal.name, true));
        if (absl::IsPermissionDenied(out.status()) || (out.ok() && out->state() != v1::ANALYSIS_STATE_DONE)) {
          return absl::NotFoundError("no export stored for " + Clip(r.run_id(), 32) +
                                     " at this step; GET /api/v1/runs/" + Clip(r.run_id(), 32) +
                                     "/export (or `circuitlab export " + Clip(r.run_id(), 32) + "`) makes one");
        }
        CL_RETURN_IF_ERROR(out.status());
        CL_ASSIGN_OR_RETURN(
            ResponseBudget::Lease lease,
            ResponseBudget::Process().Acquire(static_cast<int64_t>(out->safetensors().size()), "weights.safetensors"));
        res.set_header("Content-Disposition", "attachment; filename=\"" + out->run_id() + "-step-" +
                                                  std::to_string(out->step()) + ".safetensors\"");
        Send(res, std::make_shared<std::string>(std::move(*out->mutable_safetensors())), "application/octet-stream",
             std::move(lease));  // the budget is held until the file is sent, as for every answer
        return absl::OkStatus();
      });
}

}  // namespace circuitlab::http
