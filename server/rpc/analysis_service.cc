#include "server/rpc/analysis_service.h"

#include "server/common/status_macros.h"
#include "server/rpc/service_util.h"

namespace circuitlab::rpc {

grpc::ServerUnaryReactor* AnalysisServiceImpl::ProjectCheckpoint(grpc::CallbackServerContext* ctx,
                                                                 const v1::ProjectCheckpointRequest* req,
                                                                 v1::ProjectCheckpointResponse* resp) {
  return UnaryCall(ctx, auth_token_, [&]() -> absl::Status {
    CL_ASSIGN_OR_RETURN(*resp, core_->ProjectCheckpoint(*req));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::GetTrajectory(grpc::CallbackServerContext* ctx,
                                                             const v1::GetTrajectoryRequest* req,
                                                             v1::GetTrajectoryResponse* resp) {
  return UnaryCall(ctx, auth_token_, [&]() -> absl::Status {
    CL_ASSIGN_OR_RETURN(*resp, core_->GetTrajectory(*req));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::CheckInvariance(grpc::CallbackServerContext* ctx,
                                                               const v1::CheckInvarianceRequest* req,
                                                               v1::CheckInvarianceResponse* resp) {
  return UnaryCall(ctx, auth_token_, [&]() -> absl::Status {
    CL_ASSIGN_OR_RETURN(*resp, core_->CheckInvariance(*req));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::DetectCircuit(grpc::CallbackServerContext* ctx,
                                                    const v1::DetectCircuitRequest* req, v1::DetectCircuitResponse* resp) {
  return UnaryCall(ctx, auth_token_, [&]() -> absl::Status {
    CL_ASSIGN_OR_RETURN(*resp, core_->DetectCircuit(*req));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::Intervene(grpc::CallbackServerContext* ctx,
                                                    const v1::InterveneRequest* req, v1::InterveneResponse* resp) {
  return UnaryCall(ctx, auth_token_, [&]() -> absl::Status {
    CL_ASSIGN_OR_RETURN(*resp, core_->Intervene(*req));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::LabelRun(grpc::CallbackServerContext* ctx,
                                                    const v1::LabelRunRequest* req, v1::LabelRunResponse* resp) {
  return UnaryCall(ctx, auth_token_, [&]() -> absl::Status {
    CL_ASSIGN_OR_RETURN(*resp, core_->LabelRun(*req));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::CheckDataDependence(grpc::CallbackServerContext* ctx,
                                                                   const v1::CheckDataDependenceRequest* req,
                                                                   v1::CheckDataDependenceResponse* resp) {
  return UnaryCall(ctx, auth_token_, [&]() -> absl::Status {
    CL_ASSIGN_OR_RETURN(*resp, core_->CheckDataDependence(*req));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AnalysisServiceImpl::AnalyzeTaskVectors(grpc::CallbackServerContext* ctx,
                                                                  const v1::AnalyzeTaskVectorsRequest* req,
                                                                  v1::AnalyzeTaskVectorsResponse* resp) {
  return UnaryCall(ctx, auth_token_, [&]() -> absl::Status {
    CL_ASSIGN_OR_RETURN(*resp, core_->AnalyzeTaskVectors(*req));
    return absl::OkStatus();
  });
}

}  // namespace circuitlab::rpc
