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

// The adapter of every analysis that is a job. On this thread: authenticate,
// check read access to the run, then the core (validation, the store,
// enqueue; no model code). A reader's request is answered from the store or
// a pending job only. When the answer is pending, the call is finished later,
// by the job's end or the brief wait's deadline, never by blocking this
// thread. A call that queues or joins a job (not one answered from the store)
// leaves an audit line.
template <typename Request, typename Response, typename Fn>
grpc::ServerUnaryReactor* JobCall(grpc::CallbackServerContext* ctx, const Security& security,
                                  scheduler::AnalysisJobs* jobs, const grpc::ByteBuffer* in, grpc::ByteBuffer* out,
                                  Fn core_call) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto req = std::make_shared<Request>();
  absl::StatusOr<Caller> caller = Authenticate(security, ctx);
  absl::Status status = caller.status();
  if (status.ok()) status = ParseRequest(*in, req.get());
  if (status.ok()) status = security.Check(*caller, Access::kRead, *req);
  if (status.ok()) {
    // The core call, again when the job ends: the request lives as long as it.
    const scheduler::Requester who(caller->principal.name, Security::ReadsOnly(*caller));
    auto fn = [core_call, req, who] { return core_call(*req, who); };
    absl::StatusOr<Response> answer = CallCatching(fn);
    status = answer.status();
    if (!answer.ok() || scheduler::IsPending(answer->state())) {
      security.Audit(*caller, *req, answer.ok() ? &*answer : nullptr, status);
    }
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
      ctx, *security_, &core_->jobs(), in, out,
      [core = core_](const v1::ProjectCheckpointRequest& req, const scheduler::Requester& who) {
        return core->ProjectCheckpoint(req, who);
      });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::GetTrajectory(grpc::CallbackServerContext* ctx,
                                                             const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return UnaryCall<v1::GetTrajectoryRequest, v1::GetTrajectoryResponse>(
      ctx, *security_, Access::kRead, in, out,
      [&](const v1::GetTrajectoryRequest& req, v1::GetTrajectoryResponse* resp, const Caller&) -> absl::Status {
        CL_ASSIGN_OR_RETURN(*resp, core_->GetTrajectory(req));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::CheckInvariance(grpc::CallbackServerContext* ctx,
                                                               const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return JobCall<v1::CheckInvarianceRequest, v1::CheckInvarianceResponse>(
      ctx, *security_, &core_->jobs(), in, out,
      [core = core_](const v1::CheckInvarianceRequest& req, const scheduler::Requester& who) {
        return core->CheckInvariance(req, who);
      });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::DetectCircuit(grpc::CallbackServerContext* ctx,
                                                             const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return JobCall<v1::DetectCircuitRequest, v1::DetectCircuitResponse>(
      ctx, *security_, &core_->jobs(), in, out,
      [core = core_](const v1::DetectCircuitRequest& req, const scheduler::Requester& who) {
        return core->DetectCircuit(req, who);
      });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::Intervene(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                                         grpc::ByteBuffer* out) {
  return JobCall<v1::InterveneRequest, v1::InterveneResponse>(
      ctx, *security_, &core_->jobs(), in, out,
      [core = core_](const v1::InterveneRequest& req, const scheduler::Requester& who) {
        return core->Intervene(req, who);
      });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::LabelRun(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                                        grpc::ByteBuffer* out) {
  return JobCall<v1::LabelRunRequest, v1::LabelRunResponse>(
      ctx, *security_, &core_->jobs(), in, out,
      [core = core_](const v1::LabelRunRequest& req, const scheduler::Requester& who) {
        return core->LabelRun(req, who);
      });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::CheckDataDependence(grpc::CallbackServerContext* ctx,
                                                                   const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return JobCall<v1::CheckDataDependenceRequest, v1::CheckDataDependenceResponse>(
      ctx, *security_, &core_->jobs(), in, out,
      [core = core_](const v1::CheckDataDependenceRequest& req, const scheduler::Requester& who) {
        return core->CheckDataDependence(req, who);
      });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::AnalyzeTaskVectors(grpc::CallbackServerContext* ctx,
                                                                  const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return JobCall<v1::AnalyzeTaskVectorsRequest, v1::AnalyzeTaskVectorsResponse>(
      ctx, *security_, &core_->jobs(), in, out,
      [core = core_](const v1::AnalyzeTaskVectorsRequest& req, const scheduler::Requester& who) {
        return core->AnalyzeTaskVectors(req, who);
      });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::CancelAnalysis(grpc::CallbackServerContext* ctx,
                                                              const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return UnaryCall<v1::CancelAnalysisRequest, v1::CancelAnalysisResponse>(
      ctx, *security_, Access::kChange, in, out,
      [&](const v1::CancelAnalysisRequest& req, v1::CancelAnalysisResponse* resp,
          const Caller& caller) -> absl::Status {
        const auto may_cancel = [&](const v1::AnalysisJob& job) {
          return MayChange(caller.principal, job.owner(), "analysis job " + job.job_id());
        };
        CL_ASSIGN_OR_RETURN(*resp->mutable_job(), core_->jobs().Cancel(req.job_id(), may_cancel));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::ListAnalysisJobs(grpc::CallbackServerContext* ctx,
                                                                const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return UnaryCall<v1::ListAnalysisJobsRequest, v1::ListAnalysisJobsResponse>(
      ctx, *security_, Access::kRead, in, out,
      [&](const v1::ListAnalysisJobsRequest&, v1::ListAnalysisJobsResponse* resp,
          const Caller& caller) -> absl::Status {
        *resp = core_->jobs().List([&](const v1::AnalysisJob& job) {
          return MayRead(caller.principal, job.owner(), security_->private_runs());
        });
        return absl::OkStatus();
      });
}

}  // namespace circuitlab::rpc
