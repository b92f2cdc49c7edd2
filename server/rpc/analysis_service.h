// AnalysisService handlers (callback API): thin adapters over AnalysisCore.
// Every method whose request type has an entry in the analysis table
// (scheduler/analysis_table.h) is served by one generic job handler, wired
// at construction by walking the service's descriptor: a new analysis needs
// no code here. The others (GetTrajectory, CancelAnalysis,
// ListAnalysisJobs) are written out. The job handler never blocks its
// thread: a pending answer is finished later, by the job's end or a ~2 s
// deadline (analysis_service.cc).
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>

#include "circuitlab/v1/analysis_service.grpc.pb.h"
#include "server/scheduler/analysis_core.h"
#include "server/security/security.h"

namespace circuitlab::rpc {

class AnalysisServiceImpl final : public v1::AnalysisService::Service {
 public:
  // Both must outlive the service. Aborts at start-up when a method has
  // neither a table entry nor a handler here (a proto/table mismatch).
  AnalysisServiceImpl(scheduler::AnalysisCore* core, const security::Security* security);

 private:
  using Handler = grpc::ServerUnaryReactor* (AnalysisServiceImpl::*)(grpc::CallbackServerContext*,
                                                                     const grpc::ByteBuffer*, grpc::ByteBuffer*);
  grpc::ServerUnaryReactor* GetTrajectoryRaw(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                             grpc::ByteBuffer* out);
  grpc::ServerUnaryReactor* CancelAnalysisRaw(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                              grpc::ByteBuffer* out);
  grpc::ServerUnaryReactor* ListAnalysisJobsRaw(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                                grpc::ByteBuffer* out);

  scheduler::AnalysisCore* const core_;
  const security::Security* const security_;
};

}  // namespace circuitlab::rpc
