// AnalysisService handlers (callback API): thin adapters over AnalysisCore.
// The analyses that are jobs never block their thread: a pending answer is
// finished later, by the job's end or a ~2 s deadline (analysis_service.cc).
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>

#include "circuitlab/v1/analysis_service.grpc.pb.h"
#include "server/scheduler/analysis_core.h"

namespace circuitlab::rpc {

class AnalysisServiceImpl final : public v1::AnalysisService::CallbackService {
 public:
  AnalysisServiceImpl(scheduler::AnalysisCore* core, std::string auth_token)
      : core_(core), auth_token_(std::move(auth_token)) {}

  grpc::ServerUnaryReactor* ProjectCheckpoint(grpc::CallbackServerContext* ctx,
                                              const v1::ProjectCheckpointRequest* req,
                                              v1::ProjectCheckpointResponse* resp) override;
  grpc::ServerUnaryReactor* GetTrajectory(grpc::CallbackServerContext* ctx, const v1::GetTrajectoryRequest* req,
                                          v1::GetTrajectoryResponse* resp) override;
  grpc::ServerUnaryReactor* CheckInvariance(grpc::CallbackServerContext* ctx, const v1::CheckInvarianceRequest* req,
                                            v1::CheckInvarianceResponse* resp) override;
  grpc::ServerUnaryReactor* DetectCircuit(grpc::CallbackServerContext* ctx, const v1::DetectCircuitRequest* req,
                                          v1::DetectCircuitResponse* resp) override;
  grpc::ServerUnaryReactor* Intervene(grpc::CallbackServerContext* ctx, const v1::InterveneRequest* req,
                                      v1::InterveneResponse* resp) override;
  grpc::ServerUnaryReactor* CheckDataDependence(grpc::CallbackServerContext* ctx,
                                                const v1::CheckDataDependenceRequest* req,
                                                v1::CheckDataDependenceResponse* resp) override;
  grpc::ServerUnaryReactor* AnalyzeTaskVectors(grpc::CallbackServerContext* ctx,
                                               const v1::AnalyzeTaskVectorsRequest* req,
                                               v1::AnalyzeTaskVectorsResponse* resp) override;
  grpc::ServerUnaryReactor* LabelRun(grpc::CallbackServerContext* ctx, const v1::LabelRunRequest* req,
                                     v1::LabelRunResponse* resp) override;
  grpc::ServerUnaryReactor* CancelAnalysis(grpc::CallbackServerContext* ctx, const v1::CancelAnalysisRequest* req,
                                           v1::CancelAnalysisResponse* resp) override;
  grpc::ServerUnaryReactor* ListAnalysisJobs(grpc::CallbackServerContext* ctx,
                                             const v1::ListAnalysisJobsRequest* req,
                                             v1::ListAnalysisJobsResponse* resp) override;

 private:
  scheduler::AnalysisCore* const core_;
  const std::string auth_token_;
};

}  // namespace circuitlab::rpc
