#include "server/rpc/experiment_service.h"

#include <memory>
#include <mutex>

#include "server/common/status_macros.h"

namespace circuitlab::rpc {
namespace {

// Streams one run's events. One write in flight; the next event is pulled
// when the previous write completes or, when none is ready, when the hub
// notifies. The hub's notification may outlive the reactor, so it holds only
// a shared Link that the reactor detaches from in OnDone.
class WatchReactor : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  WatchReactor(scheduler::Scheduler* core, scheduler::Watch watch, const Security& security, const Caller& caller)
      : core_(core), watch_(std::move(watch)), link_(std::make_shared<Link>()) {
    // A revoked token ends the stream (Security::RevalidateStreams).
    ticket_ = security.OpenStream(caller, [sub = watch_.subscriber] {
      if (std::function<void()> wake = sub->Close()) wake();
    });
    link_->reactor = this;
    PumpVia(link_);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(link_->mu);
    writing_ = false;
    if (!ok) return FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
    if (finish_after_write_) return FinishLocked(grpc::Status::OK);
    PumpLocked();
  }

  void OnCancel() override {
    std::lock_guard<std::mutex> lock(link_->mu);
    cancelled_ = true;
    if (!writing_) FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled"));
  }

  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(link_->mu);
      link_->reactor = nullptr;
    }
    core_->StopWatch(watch_);
    delete this;
  }

 private:
  struct Link {
    std::mutex mu;
    WatchReactor* reactor = nullptr;
  };

  static void PumpVia(const std::shared_ptr<Link>& link) {
    std::lock_guard<std::mutex> lock(link->mu);
    if (link->reactor != nullptr) link->reactor->PumpLocked();
  }

  void FinishLocked(const grpc::Status& status) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  void StartWriteLocked(const v1::RunEvent& event, bool last) {
    event_.Clear();
    if (grpc::Status s = WriteResponse(event, &event_); !s.ok()) return FinishLocked(s);
    finish_after_write_ = last;
    writing_ = true;
    StartWrite(&event_);
  }

  void PumpLocked() {
    if (writing_ || finished_ || cancelled_) return;
    while (true) {
      scheduler::Subscriber::Item item = watch_.subscriber->Next();
      switch (item.kind) {
        case scheduler::Subscriber::Kind::kEvent: {
          const bool last = item.event.has_state() && scheduler::IsFinal(item.event.state().state());
          return StartWriteLocked(item.event, last);
        }
        case scheduler::Subscriber::Kind::kResync: {
          absl::StatusOr<v1::RunEvent> snap = core_->Snapshot(watch_.run_id, item.sequence, /*resync=*/sent_any_);
          if (!snap.ok()) return FinishLocked(ToGrpcStatus(snap.status()));
          sent_any_ = true;
          const bool last = scheduler::IsFinal(snap->snapshot().state());
          return StartWriteLocked(*snap, last);
        }
        case scheduler::Subscriber::Kind::kEnd:
          if (ticket_->revoked()) {
            return FinishLocked(grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                                             "this stream's token was revoked or changed (the server re-read its "
                                             "tokens); authenticate again"));
          }
          return FinishLocked(grpc::Status::OK);
        case scheduler::Subscriber::Kind::kNone: {
          std::weak_ptr<Link> weak = link_;
          if (watch_.subscriber->Arm([weak] {
                if (auto link = weak.lock()) PumpVia(link);
              })) {
            return;
          }
          break;  // something arrived meanwhile: poll again
        }
      }
    }
  }

  scheduler::Scheduler* const core_;
  const scheduler::Watch watch_;
  const std::shared_ptr<Link> link_;
  std::shared_ptr<StreamTicket> ticket_;
  // Guarded by link_->mu.
  grpc::ByteBuffer event_;  // the event being written, serialized
  bool writing_ = false;
  bool finished_ = false;
  bool cancelled_ = false;
  bool finish_after_write_ = false;
  bool sent_any_ = false;
};

}  // namespace

grpc::ServerUnaryReactor* ExperimentServiceImpl::SubmitRun(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                                           grpc::ByteBuffer* out) {
  return Unary<v1::SubmitRunRequest, v1::SubmitRunResponse>(
      ctx, Access::kCreate, in, out,
      [&](const v1::SubmitRunRequest& req, v1::SubmitRunResponse* resp, const Caller& caller) -> absl::Status {
        CL_ASSIGN_OR_RETURN(*resp->mutable_run(), core_->Submit(req.spec(), caller.principal.name));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ExperimentServiceImpl::GetRun(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                                        grpc::ByteBuffer* out) {
  return Unary<v1::GetRunRequest, v1::Run>(
      ctx, Access::kRead, in, out, [&](const v1::GetRunRequest& req, v1::Run* resp, const Caller&) -> absl::Status {
        CL_ASSIGN_OR_RETURN(*resp, core_->GetRun(req.run_id()));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ExperimentServiceImpl::ListRuns(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                                          grpc::ByteBuffer* out) {
  return Unary<v1::ListRunsRequest, v1::ListRunsResponse>(
      ctx, Access::kRead, in, out,
      [&](const v1::ListRunsRequest& req, v1::ListRunsResponse* resp, const Caller& caller) -> absl::Status {
        CL_ASSIGN_OR_RETURN(*resp, core_->ListRuns(req, security_->ListFilter(caller, req.mine())));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ExperimentServiceImpl::CancelRun(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                                           grpc::ByteBuffer* out) {
  return Unary<v1::CancelRunRequest, v1::Run>(
      ctx, Access::kChange, in, out,
      [&](const v1::CancelRunRequest& req, v1::Run* resp, const Caller&) -> absl::Status {
        CL_ASSIGN_OR_RETURN(*resp, core_->Cancel(req.run_id()));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ExperimentServiceImpl::GetMetrics(grpc::CallbackServerContext* ctx,
                                                            const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return Unary<v1::GetMetricsRequest, v1::GetMetricsResponse>(
      ctx, Access::kRead, in, out,
      [&](const v1::GetMetricsRequest& req, v1::GetMetricsResponse* resp, const Caller&) -> absl::Status {
        CL_ASSIGN_OR_RETURN(*resp, core_->GetMetrics(req));
        return absl::OkStatus();
      });
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ExperimentServiceImpl::WatchRun(grpc::CallbackServerContext* ctx,
                                                                            const grpc::ByteBuffer* in) {
  v1::WatchRunRequest req;
  absl::StatusOr<Caller> caller = Authenticate(*security_, ctx);
  absl::Status s = caller.status();
  if (s.ok()) s = ParseRequest(*in, &req);
  if (s.ok()) s = security_->Check(*caller, Access::kRead, req);
  absl::StatusOr<scheduler::Watch> watch =
      s.ok() ? CallCatching([&] { return core_->StartWatch(req, caller->principal.name); })
             : absl::StatusOr<scheduler::Watch>(s);
  if (!watch.ok()) {
    // A reactor that only reports the error.
    class Failed : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
     public:
      explicit Failed(const grpc::Status& st) { Finish(st); }
      void OnDone() override { delete this; }
    };
    return new Failed(ToGrpcStatus(watch.status()));
  }
  return new WatchReactor(core_, std::move(*watch), *security_, *caller);
}

grpc::ServerUnaryReactor* ExperimentServiceImpl::SubmitSweep(grpc::CallbackServerContext* ctx,
                                                             const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return SlowUnaryCall<v1::SubmitSweepRequest, v1::Sweep>(
      *slow_, ctx, *security_, Access::kCreate, in, out,
      [this](const v1::SubmitSweepRequest& req, v1::Sweep* resp, const Caller& caller) -> absl::Status {
        CL_ASSIGN_OR_RETURN(*resp, sweeps_->Submit(req.sweep(), caller.principal.name));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ExperimentServiceImpl::GetSweep(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                                          grpc::ByteBuffer* out) {
  return Unary<v1::GetSweepRequest, v1::Sweep>(
      ctx, Access::kRead, in, out, [&](const v1::GetSweepRequest& req, v1::Sweep* resp, const Caller&) -> absl::Status {
        CL_ASSIGN_OR_RETURN(*resp, sweeps_->Get(req.sweep_id()));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ExperimentServiceImpl::CancelSweep(grpc::CallbackServerContext* ctx,
                                                             const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return Unary<v1::CancelSweepRequest, v1::Sweep>(
      ctx, Access::kChange, in, out,
      [&](const v1::CancelSweepRequest& req, v1::Sweep* resp, const Caller&) -> absl::Status {
        CL_ASSIGN_OR_RETURN(*resp, sweeps_->Cancel(req.sweep_id()));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ExperimentServiceImpl::GetSweepSummary(grpc::CallbackServerContext* ctx,
                                                                 const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return Unary<v1::GetSweepSummaryRequest, v1::GetSweepSummaryResponse>(
      ctx, Access::kRead, in, out,
      [&](const v1::GetSweepSummaryRequest& req, v1::GetSweepSummaryResponse* resp,
          const Caller& caller) -> absl::Status {
        // Label columns start LabelRun jobs only for a caller who may start
        // analyses; a summary that started any leaves an audit line.
        int started = 0;
        CL_ASSIGN_OR_RETURN(*resp, sweeps_->Summary(req, scheduler::Requester(caller.principal.name,
                                                                             security::Security::ReadsOnly(caller)),
                                                    &started));
        if (started > 0) security_->Audit(caller, req, resp, absl::OkStatus());
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ExperimentServiceImpl::DeleteRun(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                                           grpc::ByteBuffer* out) {
  return Unary<v1::DeleteRunRequest, v1::DeleteRunResponse>(
      ctx, Access::kChange, in, out,
      [&](const v1::DeleteRunRequest& req, v1::DeleteRunResponse* resp, const Caller&) -> absl::Status {
        CL_ASSIGN_OR_RETURN(*resp, core_->Delete(req.run_id()));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ExperimentServiceImpl::DeleteSweep(grpc::CallbackServerContext* ctx,
                                                             const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return Unary<v1::DeleteSweepRequest, v1::DeleteSweepResponse>(
      ctx, Access::kChange, in, out,
      [&](const v1::DeleteSweepRequest& req, v1::DeleteSweepResponse* resp, const Caller&) -> absl::Status {
        CL_ASSIGN_OR_RETURN(*resp, sweeps_->Delete(req.sweep_id()));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ExperimentServiceImpl::WhoAmI(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                                        grpc::ByteBuffer* out) {
  return Unary<v1::WhoAmIRequest, v1::WhoAmIResponse>(
      ctx, Access::kRead, in, out,
      [&](const v1::WhoAmIRequest&, v1::WhoAmIResponse* resp, const Caller& caller) -> absl::Status {
        *resp = security_->WhoAmI(caller);
        return absl::OkStatus();
      });
}

}  // namespace circuitlab::rpc
