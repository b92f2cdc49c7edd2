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

}  // namespace circuitlab::rpc
