// WorkerService: the server's end of circuitlab-worker streams. Each Session
// is a bidirectional reactor: the first message must be Register (from a
// principal with the worker or admin role); every later message goes to the
// lease broker (remote/workers.h), which answers through the session's
// link. Writes are queued, one in flight; a broker error ends the stream with
// that status and the broker gets its leases back.
#pragma once

#include <grpcpp/grpcpp.h>

#include "circuitlab/v1/worker_service.grpc.pb.h"
#include "server/security/security.h"
#include "server/scheduler/scheduler.h"
#include "server/remote/workers.h"

namespace circuitlab::rpc {

class WorkerServiceImpl final : public v1::WorkerService::CallbackService {
 public:
  // All must outlive the service; `broker` is null on --executor local
  // (sessions are then refused).
  WorkerServiceImpl(remote::WorkerBroker* broker, scheduler::Scheduler* runs, std::string executor,
                    const security::Security* security)
      : broker_(broker), runs_(runs), executor_(std::move(executor)), security_(security) {}

  grpc::ServerBidiReactor<v1::WorkerMessage, v1::ServerMessage>* Session(grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* ctx, const v1::ListWorkersRequest* request,
                                        v1::ListWorkersResponse* response) override;

 private:
  remote::WorkerBroker* const broker_;
  scheduler::Scheduler* const runs_;
  const std::string executor_;
  const security::Security* const security_;
};

}  // namespace circuitlab::rpc
