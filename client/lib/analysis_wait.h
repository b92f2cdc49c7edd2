// Waiting for an analysis job, for any front end: every analysis answers at
// once from the store, or with its job's state (the server holds each call
// up to ~2 s while the job runs); asking again with the same request reports
// on the same job. (CheckInvariance's own state enum shares AnalysisState's
// numbers.)
#pragma once

#include <functional>

#include "absl/status/statusor.h"
#include "circuitlab/v1/analysis_service.pb.h"

namespace circuitlab::client {

inline bool IsPendingAnalysis(int state) {
  return state == v1::ANALYSIS_STATE_QUEUED || state == v1::ANALYSIS_STATE_RUNNING;
}

// Calls `call(force)` once, then `call(false)` while the job is pending,
// telling `on_pending` each pending answer; stops early when `on_pending`
// returns false. Returns the last answer (an RPC error, a pending answer when
// stopped, else DONE, FAILED or CANCELLED).
template <typename Response, typename Call>
absl::StatusOr<Response> WaitForAnalysis(Call call, bool force,
                                         const std::function<bool(const Response&)>& on_pending) {
  absl::StatusOr<Response> resp = call(force);
  while (resp.ok() && IsPendingAnalysis(static_cast<int>(resp->state()))) {
    if (on_pending && !on_pending(*resp)) break;
    resp = call(false);
  }
  return resp;
}

}  // namespace circuitlab::client
