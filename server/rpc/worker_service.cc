#include "server/rpc/worker_service.h"

#include <google/protobuf/util/time_util.h>
#include <spdlog/spdlog.h>

#include <deque>
#include <memory>
#include <mutex>

#include "server/rpc/service_util.h"

namespace circuitlab::rpc {
namespace {

using Reactor = grpc::ServerBidiReactor<v1::WorkerMessage, v1::ServerMessage>;

// The broker's handle on a stream. Outlives the reactor (the broker may hold
// it a little longer): once the stream is done, messages are dropped.
class Link final : public remote::WorkerLink {
 public:
  explicit Link(Reactor* reactor) : reactor_(reactor) {}

  void Send(v1::ServerMessage message) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (reactor_ == nullptr || finishing_) return;
    queue_.push_back(std::move(message));
    if (!writing_) {
      writing_ = true;
      reactor_->StartWrite(&queue_.front());
    }
  }

  void Close(const absl::Status& why) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (reactor_ == nullptr || finishing_) return;
    finishing_ = true;
    status_ = why;
    if (!writing_) FinishLocked();
  }

  // Reactor callbacks.
  void WriteDone(bool ok) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!queue_.empty()) queue_.pop_front();
    if (!ok) queue_.clear();  // the stream is broken; OnDone follows
    if (reactor_ != nullptr && ok && !queue_.empty()) {
      reactor_->StartWrite(&queue_.front());
      return;
    }
    writing_ = false;
    if (finishing_ && !finished_) FinishLocked();
  }
  void Detach() {
    std::lock_guard<std::mutex> lock(mu_);
    reactor_ = nullptr;
  }
  absl::Status status() {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }

 private:
  void FinishLocked() {
    finished_ = true;
    reactor_->Finish(ToGrpcStatus(status_));
  }

  std::mutex mu_;
  Reactor* reactor_;
  std::deque<v1::ServerMessage> queue_;
  bool writing_ = false;
  bool finishing_ = false;
  bool finished_ = false;
  absl::Status status_;
};

class SessionReactor final : public Reactor {
 public:
  SessionReactor(grpc::CallbackServerContext* ctx, remote::WorkerBroker* broker, const Security* security)
      : broker_(broker), security_(security), link_(std::make_shared<Link>(this)) {
    absl::StatusOr<Caller> caller = Authenticate(*security, ctx, /*workers=*/true);
    if (!caller.ok()) {
      link_->Close(caller.status());
      return;
    }
    if (caller->principal.role != Role::kWorker && caller->principal.role != Role::kAdmin) {
      const absl::Status denied = absl::PermissionDeniedError(
          "'" + caller->principal.name + "' has the " + RoleName(caller->principal.role) +
          " role; workers need the worker (or admin) role (scripts/add-principal.sh NAME worker)");
      security_->Audit(*caller, v1::Register(), nullptr, denied);
      link_->Close(denied);
      return;
    }
    if (broker_ == nullptr) {
      link_->Close(absl::FailedPreconditionError(
          "this server trains its runs itself (--executor local); start it with --executor workers or slurm"));
      return;
    }
    caller_ = *caller;
    // A revoked worker token ends the session (its leases go back to the queue).
    ticket_ = security_->OpenStream(caller_, [link = std::weak_ptr<Link>(link_)] {
      if (auto l = link.lock()) l->Close(absl::UnauthenticatedError("this worker's token was revoked or changed"));
    });
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the worker closed its side, or the stream broke
      link_->Close(absl::OkStatus());
      return;
    }
    absl::Status s;
    if (session_ == 0) {
      if (!in_.has_register_()) {
        s = absl::InvalidArgumentError("the first message of a worker session must be register");
      } else {
        absl::StatusOr<uint64_t> id = broker_->Open(link_, in_.register_(), caller_.principal.name, caller_.peer);
        if (id.ok()) session_ = *id;
        s = id.status();
        security_->Audit(caller_, in_.register_(), nullptr, s);  // a worker joining (or refused) is audited
      }
    } else {
      s = broker_->OnMessage(session_, in_);
    }
    if (!s.ok()) {
      link_->Close(s);
      return;
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override { link_->WriteDone(ok); }

  void OnDone() override {
    link_->Detach();
    if (session_ != 0) broker_->Closed(session_, link_->status());
    delete this;
  }

 private:
  remote::WorkerBroker* const broker_;
  const Security* const security_;
  std::shared_ptr<Link> link_;
  Caller caller_;
  std::shared_ptr<StreamTicket> ticket_;
  uint64_t session_ = 0;
  v1::WorkerMessage in_;
};

}  // namespace

grpc::ServerBidiReactor<v1::WorkerMessage, v1::ServerMessage>* WorkerServiceImpl::Session(
    grpc::CallbackServerContext* ctx) {
  return new SessionReactor(ctx, broker_, security_);
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ListWorkers(grpc::CallbackServerContext* ctx,
                                                         const v1::ListWorkersRequest*,
                                                         v1::ListWorkersResponse* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::StatusOr<Caller> caller = Authenticate(*security_, ctx, /*workers=*/true);
  if (!caller.ok()) {
    reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  response->set_executor(executor_);
  response->set_queued_runs(static_cast<uint32_t>(runs_->QueuedRuns()));
  if (broker_ != nullptr) {
    for (const remote::WorkerInfo& w : broker_->Workers()) {
      v1::WorkerStatus* s = response->add_workers();
      s->set_worker_id(w.id);
      s->set_host(w.host);
      s->set_engine_job(w.engine_job);
      s->set_device(w.device);
      s->set_slots(static_cast<uint32_t>(w.slots));
      for (const std::string& r : w.runs) s->add_run_ids(r);
      s->set_draining(w.draining);
      s->set_principal(w.principal);
      s->set_peer(w.peer);
      *s->mutable_connected_at() = google::protobuf::util::TimeUtil::MicrosecondsToTimestamp(w.connected_at_us);
      *s->mutable_last_seen() = google::protobuf::util::TimeUtil::MicrosecondsToTimestamp(w.last_seen_us);
    }
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace circuitlab::rpc
