// ReproductionService handlers (callback API): authenticate, check access
// (a reproduction is read by whoever may read its owner's runs, cancelled by
// its owner or an admin, started by users and admins), call the core,
// convert the status.
#pragma once

#include <grpcpp/grpcpp.h>

#include "circuitlab/v1/reproduce.grpc.pb.h"
#include "server/reproduce/reproductions.h"
#include "server/rpc/service_util.h"

namespace circuitlab::rpc {

using RawReproductionService = v1::ReproductionService::WithRawCallbackMethod_ListRecipes<
    v1::ReproductionService::WithRawCallbackMethod_StartReproduction<
        v1::ReproductionService::WithRawCallbackMethod_GetReproduction<
            v1::ReproductionService::WithRawCallbackMethod_ListReproductions<
                v1::ReproductionService::WithRawCallbackMethod_CancelReproduction<v1::ReproductionService::Service>>>>>;

class ReproductionServiceImpl final : public RawReproductionService {
 public:
  // Both must outlive the service.
  // All must outlive the service; StartReproduction runs on `slow`.
  ReproductionServiceImpl(reproduce::ReproductionCore* core, const security::Security* security, SlowCalls* slow)
      : core_(core), security_(security), slow_(slow) {}

  grpc::ServerUnaryReactor* ListRecipes(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                        grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* StartReproduction(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                              grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* GetReproduction(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                            grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* ListReproductions(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                              grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* CancelReproduction(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                               grpc::ByteBuffer* out) override;

 private:
  // The owner of `id` when `caller` may `access` it (NotFound as for an
  // unknown id when a private server hides it).
  absl::Status MayAccess(const Caller& caller, const std::string& id, Access access) const;

  reproduce::ReproductionCore* const core_;
  const security::Security* const security_;
  SlowCalls* const slow_;
};

}  // namespace circuitlab::rpc
