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

std::string ClientOf(const grpc::CallbackServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  if (auto it = md.find("x-circuitlab-client"); it != md.end() && it->second.size() <= 128) {
    return std::string(it->second.data(), it->second.size());
  }
  // "ipv4:127.0.0.1:53012" -> "ipv4:127.0.0.1"
  std::string peer = ctx->peer();
  if (auto colon = peer.rfind(':'); colon != std::string::npos && colon > 5) peer.resize(colon);
  return peer;
}

}  // namespace circuitlab::rpc
