// ExperimentService handlers (callback API). Each unary handler checks auth,
// calls the scheduler and converts the status; WatchRun is a write reactor
// with one write in flight, fed by the progress hub.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/status.h"
#include "circuitlab/v1/experiment_service.grpc.pb.h"
#include "server/rpc/service_util.h"
#include "server/scheduler/scheduler.h"
#include "server/scheduler/sweeps.h"

namespace circuitlab::rpc {

class ExperimentServiceImpl final : public v1::ExperimentService::CallbackService {
 public:
  ExperimentServiceImpl(scheduler::Scheduler* core, scheduler::SweepCore* sweeps, std::string auth_token)
      : core_(core), sweeps_(sweeps), auth_token_(std::move(auth_token)) {}

  grpc::ServerUnaryReactor* SubmitRun(grpc::CallbackServerContext* ctx, const v1::SubmitRunRequest* req,
                                      v1::SubmitRunResponse* resp) override;
  grpc::ServerUnaryReactor* GetRun(grpc::CallbackServerContext* ctx, const v1::GetRunRequest* req,
                                   v1::Run* resp) override;
  grpc::ServerUnaryReactor* ListRuns(grpc::CallbackServerContext* ctx, const v1::ListRunsRequest* req,
                                     v1::ListRunsResponse* resp) override;
  grpc::ServerUnaryReactor* CancelRun(grpc::CallbackServerContext* ctx, const v1::CancelRunRequest* req,
                                      v1::Run* resp) override;
  grpc::ServerUnaryReactor* GetMetrics(grpc::CallbackServerContext* ctx, const v1::GetMetricsRequest* req,
                                       v1::GetMetricsResponse* resp) override;
  grpc::ServerWriteReactor<v1::RunEvent>* WatchRun(grpc::CallbackServerContext* ctx,
                                                   const v1::WatchRunRequest* req) override;
  grpc::ServerUnaryReactor* SubmitSweep(grpc::CallbackServerContext* ctx, const v1::SubmitSweepRequest* req,
                                        v1::Sweep* resp) override;
  grpc::ServerUnaryReactor* GetSweep(grpc::CallbackServerContext* ctx, const v1::GetSweepRequest* req,
                                     v1::Sweep* resp) override;
  grpc::ServerUnaryReactor* CancelSweep(grpc::CallbackServerContext* ctx, const v1::CancelSweepRequest* req,
                                        v1::Sweep* resp) override;
  grpc::ServerUnaryReactor* GetSweepSummary(grpc::CallbackServerContext* ctx, const v1::GetSweepSummaryRequest* req,
                                            v1::GetSweepSummaryResponse* resp) override;

 private:
  template <typename Fn>
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, Fn&& fn) {
    return UnaryCall(ctx, auth_token_, std::forward<Fn>(fn));
  }

  scheduler::Scheduler* const core_;
  scheduler::SweepCore* const sweeps_;
  const std::string auth_token_;
};

}  // namespace circuitlab::rpc
