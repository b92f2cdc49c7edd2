#include "server/rpc/analysis_service.h"

#include <chrono>
#include <optional>

#include "server/common/status_macros.h"
#include "server/rpc/service_util.h"

namespace circuitlab::rpc {
namespace {

// How long an analysis call waits for its job before it answers QUEUED or
// RUNNING (the client asks again): a quick job answers DONE in one call.
constexpr std::chrono::milliseconds kBriefWait{2000};

// The adapter of every analysis that is a job. On this thread: auth, then the
// core (validation, the store, enqueue; no model code). When the answer is
// pending, the call is finished later, by the job's end or the brief wait's
// deadline, never by blocking this thread.
template <typename Response, typename Fn>
grpc::ServerUnaryReactor* JobCall(grpc::CallbackServerContext* ctx, const std::string& token,
                                  scheduler::AnalysisJobs* jobs, Response* resp, Fn fn) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status status = CheckAuth(ctx, token);
  if (status.ok()) {
    absl::StatusOr<Response> answer = CallCatching(fn);
    status = answer.status();
    if (answer.ok()) {
      *resp = std::move(*answer);
      if (scheduler::IsPending(resp->state()) && !resp->job_id().empty()) {
        jobs->Await(resp->job_id(), kBriefWait, [reactor, resp, fn](std::optional<scheduler::AnalysisAnswer> a) {
          absl::Status s;
          if (!a || !scheduler::IsPending(a->state)) {
            // Its end (or, when it ended meanwhile, its stored answer).
            absl::StatusOr<Response> end = a ? scheduler::ResponseFromAnswer<Response>(*a) : CallCatching(fn);
            s = end.status();
            if (end.ok()) *resp = std::move(*end);
          } else {
            resp->set_state(static_cast<decltype(resp->state())>(a->state));
            resp->set_progress(a->progress);
            resp->set_error(a->error);
          }
          reactor->Finish(ToGrpcStatus(s));
        });
        return reactor;
      }
    }
  }
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* AnalysisServiceImpl::ProjectCheckpoint(grpc::CallbackServerContext* ctx,
                                                                 const v1::ProjectCheckpointRequest* req,
                                                                 v1::ProjectCheckpointResponse* resp) {
  return JobCall(ctx, auth_token_, &core_->jobs(), resp,
                 [core = core_, req, client = ClientOf(ctx)] { return core->ProjectCheckpoint(*req, client); });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::GetTrajectory(grpc::CallbackServerContext* ctx,
                                                             const v1::GetTrajectoryRequest* req,
                                                             v1::GetTrajectoryResponse* resp) {
  return UnaryCall(ctx, auth_token_, [&]() -> absl::Status {
    CL_ASSIGN_OR_RETURN(*resp, core_->GetTrajectory(*req));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::CheckInvariance(grpc::CallbackServerContext* ctx,
                                                               const v1::CheckInvarianceRequest* req,
                                                               v1::CheckInvarianceResponse* resp) {
  return JobCall(ctx, auth_token_, &core_->jobs(), resp,
                 [core = core_, req, client = ClientOf(ctx)] { return core->CheckInvariance(*req, client); });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::DetectCircuit(grpc::CallbackServerContext* ctx,
                                                             const v1::DetectCircuitRequest* req,
                                                             v1::DetectCircuitResponse* resp) {
  return JobCall(ctx, auth_token_, &core_->jobs(), resp,
                 [core = core_, req, client = ClientOf(ctx)] { return core->DetectCircuit(*req, client); });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::Intervene(grpc::CallbackServerContext* ctx,
                                                         const v1::InterveneRequest* req, v1::InterveneResponse* resp) {
  return JobCall(ctx, auth_token_, &core_->jobs(), resp,
                 [core = core_, req, client = ClientOf(ctx)] { return core->Intervene(*req, client); });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::LabelRun(grpc::CallbackServerContext* ctx,
                                                        const v1::LabelRunRequest* req, v1::LabelRunResponse* resp) {
  return JobCall(ctx, auth_token_, &core_->jobs(), resp,
                 [core = core_, req, client = ClientOf(ctx)] { return core->LabelRun(*req, client); });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::CheckDataDependence(grpc::CallbackServerContext* ctx,
                                                                   const v1::CheckDataDependenceRequest* req,
                                                                   v1::CheckDataDependenceResponse* resp) {
  return JobCall(ctx, auth_token_, &core_->jobs(), resp,
                 [core = core_, req, client = ClientOf(ctx)] { return core->CheckDataDependence(*req, client); });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::AnalyzeTaskVectors(grpc::CallbackServerContext* ctx,
                                                                  const v1::AnalyzeTaskVectorsRequest* req,
                                                                  v1::AnalyzeTaskVectorsResponse* resp) {
  return JobCall(ctx, auth_token_, &core_->jobs(), resp,
                 [core = core_, req, client = ClientOf(ctx)] { return core->AnalyzeTaskVectors(*req, client); });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::CancelAnalysis(grpc::CallbackServerContext* ctx,
                                                              const v1::CancelAnalysisRequest* req,
                                                              v1::CancelAnalysisResponse* resp) {
  return UnaryCall(ctx, auth_token_, [&]() -> absl::Status {
    CL_ASSIGN_OR_RETURN(*resp->mutable_job(), core_->jobs().Cancel(req->job_id()));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::ListAnalysisJobs(grpc::CallbackServerContext* ctx,
                                                                const v1::ListAnalysisJobsRequest* req,
                                                                v1::ListAnalysisJobsResponse* resp) {
  return UnaryCall(ctx, auth_token_, [&]() -> absl::Status {
    *resp = core_->jobs().List();
    return absl::OkStatus();
  });
}

}  // namespace circuitlab::rpc
