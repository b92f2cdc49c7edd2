// ExperimentService handlers (callback API). Each unary handler authenticates
// the caller and checks its access (security.h), calls the scheduler and
// converts the status; WatchRun is a write reactor with one write in flight,
// fed by the progress hub.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/status.h"
#include "circuitlab/v1/experiment_service.grpc.pb.h"
#include "server/rpc/service_util.h"
#include "server/scheduler/scheduler.h"
#include "server/scheduler/sweeps.h"

namespace circuitlab::rpc {

// Every method raw: requests are parsed by ParseRequest (service_util.h).
using RawExperimentService = v1::ExperimentService::WithRawCallbackMethod_SubmitRun<
    v1::ExperimentService::WithRawCallbackMethod_GetRun<v1::ExperimentService::WithRawCallbackMethod_ListRuns<
        v1::ExperimentService::WithRawCallbackMethod_CancelRun<v1::ExperimentService::WithRawCallbackMethod_GetMetrics<
            v1::ExperimentService::WithRawCallbackMethod_SubmitSweep<
                v1::ExperimentService::WithRawCallbackMethod_GetSweep<
                    v1::ExperimentService::WithRawCallbackMethod_CancelSweep<
                        v1::ExperimentService::WithRawCallbackMethod_GetSweepSummary<
                            v1::ExperimentService::WithRawCallbackMethod_DeleteRun<
                                v1::ExperimentService::WithRawCallbackMethod_DeleteSweep<
                                    v1::ExperimentService::WithRawCallbackMethod_WhoAmI<
                                        v1::ExperimentService::WithRawCallbackMethod_WatchRun<
                                            v1::ExperimentService::Service>>>>>>>>>>>>>;

class ExperimentServiceImpl final : public RawExperimentService {
 public:
  // All must outlive the service.
  // SubmitSweep runs on `slow`.
  ExperimentServiceImpl(scheduler::Scheduler* core, scheduler::SweepCore* sweeps, const security::Security* security,
                        SlowCalls* slow)
      : core_(core), sweeps_(sweeps), security_(security), slow_(slow) {}

  grpc::ServerUnaryReactor* SubmitRun(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                      grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* GetRun(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                   grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* ListRuns(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                     grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* CancelRun(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                      grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* GetMetrics(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                       grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* SubmitSweep(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                        grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* GetSweep(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                     grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* CancelSweep(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                        grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* GetSweepSummary(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                            grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* DeleteRun(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                      grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* DeleteSweep(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                        grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* WhoAmI(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                   grpc::ByteBuffer* out) override;
  // A malformed request ends the stream with INVALID_ARGUMENT.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* WatchRun(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* in) override;

 private:
  template <typename Req, typename Resp, typename Fn>
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, Access access, const grpc::ByteBuffer* in,
                                  grpc::ByteBuffer* out, Fn&& fn) {
    return UnaryCall<Req, Resp>(ctx, *security_, access, in, out, std::forward<Fn>(fn));
  }

  scheduler::Scheduler* const core_;
  scheduler::SweepCore* const sweeps_;
  const security::Security* const security_;
  SlowCalls* const slow_;
};

}  // namespace circuitlab::rpc
