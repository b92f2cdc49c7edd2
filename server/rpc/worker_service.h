// WorkerService: the server's end of circuitlab-worker streams. Each Session
// is a bidirectional reactor: the first message must be Register (from a
// principal with the worker or admin role); every later message goes to the
// lease broker (scheduler/workers.h), which answers through the session's
// link. Writes are queued, one in flight; a broker error ends the stream with
// that status and the broker gets its leases back.
#pragma once

#include <grpcpp/grpcpp.h>

#include "circuitlab/v1/worker_service.grpc.pb.h"
#include "server/rpc/security.h"
#include "server/scheduler/workers.h"

namespace circuitlab::rpc {

class WorkerServiceImpl final : public v1::WorkerService::CallbackService {
 public:
  // Both must outlive the service.
  WorkerServiceImpl(scheduler::WorkerBroker* broker, const Security* security)
      : broker_(broker), security_(security) {}

  grpc::ServerBidiReactor<v1::WorkerMessage, v1::ServerMessage>* Session(grpc::CallbackServerContext* ctx) override;

 private:
  scheduler::WorkerBroker* const broker_;
  const Security* const security_;
};

}  // namespace circuitlab::rpc
