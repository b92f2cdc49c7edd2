#include "server/rpc/reproduction_service.h"

#include "server/common/status_macros.h"
#include "server/security/auth.h"

namespace circuitlab::rpc {

absl::Status ReproductionServiceImpl::MayAccess(const Caller& caller, const std::string& id, Access access) const {
  CL_ASSIGN_OR_RETURN(std::string owner, core_->OwnerOf(id));
  if (!security::MayRead(caller.principal, owner, security_->private_runs())) {
    return absl::NotFoundError("reproduction " + id + " not found");
  }
  if (access == Access::kChange) return security::MayChange(caller.principal, owner, "reproduction " + id);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* ReproductionServiceImpl::ListRecipes(grpc::CallbackServerContext* ctx,
                                                               const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return UnaryCall<v1::ListRecipesRequest, v1::ListRecipesResponse>(
      ctx, *security_, Access::kRead, in, out,
      [&](const v1::ListRecipesRequest&, v1::ListRecipesResponse* resp, const Caller&) -> absl::Status {
        *resp = core_->Recipes();
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ReproductionServiceImpl::StartReproduction(grpc::CallbackServerContext* ctx,
                                                                     const grpc::ByteBuffer* in,
                                                                     grpc::ByteBuffer* out) {
  return SlowUnaryCall<v1::StartReproductionRequest, v1::Reproduction>(
      *slow_, ctx, *security_, Access::kCreate, in, out,
      [this](const v1::StartReproductionRequest& req, v1::Reproduction* resp, const Caller& caller) -> absl::Status {
        CL_ASSIGN_OR_RETURN(*resp, core_->Begin(req, caller.principal.name));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ReproductionServiceImpl::GetReproduction(grpc::CallbackServerContext* ctx,
                                                                   const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return UnaryCall<v1::GetReproductionRequest, v1::Reproduction>(
      ctx, *security_, Access::kRead, in, out,
      [&](const v1::GetReproductionRequest& req, v1::Reproduction* resp, const Caller& caller) -> absl::Status {
        CL_RETURN_IF_ERROR(MayAccess(caller, req.reproduction_id(), Access::kRead));
        CL_ASSIGN_OR_RETURN(*resp, core_->Get(req.reproduction_id()));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ReproductionServiceImpl::ListReproductions(grpc::CallbackServerContext* ctx,
                                                                     const grpc::ByteBuffer* in,
                                                                     grpc::ByteBuffer* out) {
  return UnaryCall<v1::ListReproductionsRequest, v1::ListReproductionsResponse>(
      ctx, *security_, Access::kRead, in, out,
      [&](const v1::ListReproductionsRequest& req, v1::ListReproductionsResponse* resp,
          const Caller& caller) -> absl::Status {
        CL_ASSIGN_OR_RETURN(*resp, core_->List(req, security_->ListFilter(caller, req.mine()).value_or("")));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* ReproductionServiceImpl::CancelReproduction(grpc::CallbackServerContext* ctx,
                                                                      const grpc::ByteBuffer* in,
                                                                      grpc::ByteBuffer* out) {
  return UnaryCall<v1::CancelReproductionRequest, v1::Reproduction>(
      ctx, *security_, Access::kChange, in, out,
      [&](const v1::CancelReproductionRequest& req, v1::Reproduction* resp, const Caller& caller) -> absl::Status {
        CL_RETURN_IF_ERROR(MayAccess(caller, req.reproduction_id(), Access::kChange));
        CL_ASSIGN_OR_RETURN(*resp, core_->Cancel(req.reproduction_id()));
        return absl::OkStatus();
      });
}

}  // namespace circuitlab::rpc
