#include "server/rpc/analysis_service.h"

#include <chrono>
#include <memory>
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
template <typename Request, typename Response, typename Fn>
grpc::ServerUnaryReactor* JobCall(grpc::CallbackServerContext* ctx, const std::string& token,
                                  scheduler::AnalysisJobs* jobs, const grpc::ByteBuffer* in, grpc::ByteBuffer* out,
                                  Fn core_call) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto req = std::make_shared<Request>();
  absl::Status status = CheckAuth(ctx, token);
  if (status.ok()) status = ParseRequest(*in, req.get());
  if (status.ok()) {
    // The core call, again when the job ends: the request lives as long as it.
    auto fn = [core_call, req, client = ClientOf(ctx)] { return core_call(*req, client); };
    absl::StatusOr<Response> answer = CallCatching(fn);
    status = answer.status();
    if (answer.ok()) {
      if (scheduler::IsPending(answer->state()) && !answer->job_id().empty()) {
        auto resp = std::make_shared<Response>(std::move(*answer));
        jobs->Await(resp->job_id(), kBriefWait, [reactor, resp, out, fn](std::optional<scheduler::AnalysisAnswer> a) {
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
          reactor->Finish(s.ok() ? WriteResponse(*resp, out) : ToGrpcStatus(s));
        });
        return reactor;
      }
      reactor->Finish(WriteResponse(*answer, out));
      return reactor;
    }
  }
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* AnalysisServiceImpl::ProjectCheckpoint(grpc::CallbackServerContext* ctx,
                                                                 const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return JobCall<v1::ProjectCheckpointRequest, v1::ProjectCheckpointResponse>(
      ctx, auth_token_, &core_->jobs(), in, out,
      [core = core_](const v1::ProjectCheckpointRequest& req, const std::string& client) {
        return core->ProjectCheckpoint(req, client);
      });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::GetTrajectory(grpc::CallbackServerContext* ctx,
                                                             const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return UnaryCall<v1::GetTrajectoryRequest, v1::GetTrajectoryResponse>(
      ctx, auth_token_, in, out,
      [&](const v1::GetTrajectoryRequest& req, v1::GetTrajectoryResponse* resp) -> absl::Status {
        CL_ASSIGN_OR_RETURN(*resp, core_->GetTrajectory(req));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::CheckInvariance(grpc::CallbackServerContext* ctx,
                                                               const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return JobCall<v1::CheckInvarianceRequest, v1::CheckInvarianceResponse>(
      ctx, auth_token_, &core_->jobs(), in, out,
      [core = core_](const v1::CheckInvarianceRequest& req, const std::string& client) {
        return core->CheckInvariance(req, client);
      });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::DetectCircuit(grpc::CallbackServerContext* ctx,
                                                             const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return JobCall<v1::DetectCircuitRequest, v1::DetectCircuitResponse>(
      ctx, auth_token_, &core_->jobs(), in, out,
      [core = core_](const v1::DetectCircuitRequest& req, const std::string& client) {
        return core->DetectCircuit(req, client);
      });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::Intervene(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                                         grpc::ByteBuffer* out) {
  return JobCall<v1::InterveneRequest, v1::InterveneResponse>(
      ctx, auth_token_, &core_->jobs(), in, out,
      [core = core_](const v1::InterveneRequest& req, const std::string& client) {
        return core->Intervene(req, client);
      });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::LabelRun(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                                        grpc::ByteBuffer* out) {
  return JobCall<v1::LabelRunRequest, v1::LabelRunResponse>(
      ctx, auth_token_, &core_->jobs(), in, out,
      [core = core_](const v1::LabelRunRequest& req, const std::string& client) {
        return core->LabelRun(req, client);
      });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::CheckDataDependence(grpc::CallbackServerContext* ctx,
                                                                   const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return JobCall<v1::CheckDataDependenceRequest, v1::CheckDataDependenceResponse>(
      ctx, auth_token_, &core_->jobs(), in, out,
      [core = core_](const v1::CheckDataDependenceRequest& req, const std::string& client) {
        return core->CheckDataDependence(req, client);
      });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::AnalyzeTaskVectors(grpc::CallbackServerContext* ctx,
                                                                  const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return JobCall<v1::AnalyzeTaskVectorsRequest, v1::AnalyzeTaskVectorsResponse>(
      ctx, auth_token_, &core_->jobs(), in, out,
      [core = core_](const v1::AnalyzeTaskVectorsRequest& req, const std::string& client) {
        return core->AnalyzeTaskVectors(req, client);
      });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::CancelAnalysis(grpc::CallbackServerContext* ctx,
                                                              const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return UnaryCall<v1::CancelAnalysisRequest, v1::CancelAnalysisResponse>(
      ctx, auth_token_, in, out,
      [&](const v1::CancelAnalysisRequest& req, v1::CancelAnalysisResponse* resp) -> absl::Status {
        CL_ASSIGN_OR_RETURN(*resp->mutable_job(), core_->jobs().Cancel(req.job_id()));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::ListAnalysisJobs(grpc::CallbackServerContext* ctx,
                                                                const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return UnaryCall<v1::ListAnalysisJobsRequest, v1::ListAnalysisJobsResponse>(
      ctx, auth_token_, in, out,
      [&](const v1::ListAnalysisJobsRequest& req, v1::ListAnalysisJobsResponse* resp) -> absl::Status {
        *resp = core_->jobs().List();
        return absl::OkStatus();
      });
}

}  // namespace circuitlab::rpc
