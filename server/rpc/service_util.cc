#include "server/rpc/service_util.h"

namespace circuitlab::rpc {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status CheckAuth(const grpc::CallbackServerContext* ctx, const std::string& token) {
  if (token.empty()) return absl::OkStatus();
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  if (it != md.end() && std::string(it->second.data(), it->second.size()) == "Bearer " + token) {
    return absl::OkStatus();
  }
  return absl::UnauthenticatedError("this server requires 'authorization: Bearer <token>' metadata "
                                    "(circuitlab --token-file FILE)");
}

}  // namespace circuitlab::rpc
