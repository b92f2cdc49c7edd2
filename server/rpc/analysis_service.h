// AnalysisService handlers (callback API): thin adapters over AnalysisCore.
// The analyses that are jobs never block their thread: a pending answer is
// finished later, by the job's end or a ~2 s deadline (analysis_service.cc).
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>

#include "circuitlab/v1/analysis_service.grpc.pb.h"
#include "server/scheduler/analysis_core.h"
#include "server/security/security.h"

namespace circuitlab::rpc {

// Every method raw: requests are parsed by ParseRequest (service_util.h).
using RawAnalysisService = v1::AnalysisService::WithRawCallbackMethod_ProjectCheckpoint<
    v1::AnalysisService::WithRawCallbackMethod_GetTrajectory<v1::AnalysisService::WithRawCallbackMethod_CheckInvariance<
        v1::AnalysisService::WithRawCallbackMethod_DetectCircuit<v1::AnalysisService::WithRawCallbackMethod_Intervene<
            v1::AnalysisService::WithRawCallbackMethod_CheckDataDependence<
                v1::AnalysisService::WithRawCallbackMethod_AnalyzeTaskVectors<
                    v1::AnalysisService::WithRawCallbackMethod_LabelRun<
                        v1::AnalysisService::WithRawCallbackMethod_CancelAnalysis<
                            v1::AnalysisService::WithRawCallbackMethod_ListAnalysisJobs<
                                v1::AnalysisService::Service>>>>>>>>>>;

class AnalysisServiceImpl final : public RawAnalysisService {
 public:
  // Both must outlive the service.
  AnalysisServiceImpl(scheduler::AnalysisCore* core, const security::Security* security)
      : core_(core), security_(security) {}

  grpc::ServerUnaryReactor* ProjectCheckpoint(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                              grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* GetTrajectory(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                          grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* CheckInvariance(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                            grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* DetectCircuit(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                          grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* Intervene(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                      grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* CheckDataDependence(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                                grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* AnalyzeTaskVectors(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                               grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* LabelRun(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                     grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* CancelAnalysis(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                           grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* ListAnalysisJobs(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                             grpc::ByteBuffer* out) override;

 private:
  scheduler::AnalysisCore* const core_;
  const security::Security* const security_;
};

}  // namespace circuitlab::rpc
