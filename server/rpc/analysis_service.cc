#include "server/rpc/analysis_service.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>

#include "server/common/status_macros.h"
#include "server/rpc/service_util.h"
#include "server/scheduler/analysis_table.h"

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
grpc::ServerUnaryReactor* JobCall(grpc::CallbackServerContext* ctx, const Security& security,
                                  scheduler::AnalysisCore* core, const scheduler::AnalysisEntry& entry,
                                  const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  using Message = google::protobuf::Message;
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  std::shared_ptr<Message> req(entry.request->New());
  absl::StatusOr<Caller> caller = Authenticate(security, ctx);
  absl::Status status = caller.status();
  if (status.ok()) status = ParseRequest(*in, req.get());
  if (status.ok()) status = security.Check(*caller, Access::kRead, *req);
  if (status.ok()) {
    // The core call, again when the job ends: the request lives as long as it.
    const scheduler::Requester who(caller->principal.name, Security::ReadsOnly(*caller));
    auto fn = [core, req, who] { return core->Run(*req, who); };
    absl::StatusOr<std::unique_ptr<Message>> answer = CallCatching(fn);
    status = answer.status();
    if (!answer.ok() || scheduler::IsPendingResponse(**answer)) {
      security.Audit(*caller, *req, answer.ok() ? answer->get() : nullptr, status);
    }
    if (answer.ok()) {
      std::shared_ptr<Message> resp = std::move(*answer);
      const std::string id = scheduler::JobIdOf(*resp);
      if (scheduler::IsPendingResponse(*resp) && !id.empty()) {
        core->jobs().Await(id, kBriefWait, [reactor, resp, out, fn](std::optional<scheduler::AnalysisAnswer> a) {
          absl::Status s;
          if (!a || !scheduler::IsPending(a->state)) {
            // Its end (or, when it ended meanwhile, its stored answer).
            if (a) {
              s = scheduler::FillFromAnswer(*a, resp.get());
            } else {
              absl::StatusOr<std::unique_ptr<Message>> again = CallCatching(fn);
              s = again.status();
              if (again.ok()) resp->CopyFrom(**again);
            }
          } else {
            // Still pending: the new state and progress on the first
            // answer.
            s = scheduler::UpdatePending(*a, resp.get());
          }
          FinishWithin(reactor, s, *resp, out);
        });
        return reactor;
      }
      FinishWithin(reactor, absl::OkStatus(), *resp, out);
      return reactor;
    }
  }
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

AnalysisServiceImpl::AnalysisServiceImpl(scheduler::AnalysisCore* core, const security::Security* security)
    : core_(core), security_(security) {
  const std::map<std::string, Handler> written = {
      {"GetTrajectory", &AnalysisServiceImpl::GetTrajectoryRaw},
      {"CancelAnalysis", &AnalysisServiceImpl::CancelAnalysisRaw},
      {"ListAnalysisJobs", &AnalysisServiceImpl::ListAnalysisJobsRaw},
  };
  // Method i of the descriptor is the generated service's method i.
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(v1::AnalysisService::service_full_name());
  for (int i = 0; i < service->method_count(); ++i) {
    const google::protobuf::MethodDescriptor* m = service->method(i);
    std::function<grpc::ServerUnaryReactor*(grpc::CallbackServerContext*, const grpc::ByteBuffer*, grpc::ByteBuffer*)>
        handler;
    if (auto w = written.find(m->name()); w != written.end()) {
      handler = [this, h = w->second](grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                      grpc::ByteBuffer* out) { return (this->*h)(ctx, in, out); };
    } else if (const scheduler::AnalysisEntry* e = scheduler::FindJobAnalysis(m->input_type())) {
      if (e->response->GetDescriptor() != m->output_type()) {
        std::fprintf(stderr, "AnalysisService.%s answers %s, its analysis table entry %s\n", m->name().c_str(),
                     m->output_type()->full_name().c_str(), e->response->GetDescriptor()->full_name().c_str());
        std::abort();
      }
      handler = [this, e](grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
        return JobCall(ctx, *security_, core_, *e, in, out);
      };
    } else {
      std::fprintf(stderr, "AnalysisService.%s has no handler and no analysis table entry\n", m->name().c_str());
      std::abort();
    }
    MarkMethodRawCallback(i, new grpc::internal::CallbackUnaryHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
                                 [handler](grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                           grpc::ByteBuffer* out) { return handler(ctx, in, out); }));
  }
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::GetTrajectoryRaw(grpc::CallbackServerContext* ctx,
                                                                const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return UnaryCall<v1::GetTrajectoryRequest, v1::GetTrajectoryResponse>(
      ctx, *security_, Access::kRead, in, out,
      [&](const v1::GetTrajectoryRequest& req, v1::GetTrajectoryResponse* resp, const Caller&) -> absl::Status {
        CL_ASSIGN_OR_RETURN(*resp, core_->GetTrajectory(req));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::CancelAnalysisRaw(grpc::CallbackServerContext* ctx,
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

grpc::ServerUnaryReactor* AnalysisServiceImpl::ListAnalysisJobsRaw(grpc::CallbackServerContext* ctx,
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
