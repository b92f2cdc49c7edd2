// The gateway's route builders (internal to server/http): the member
// templates every route file uses, and an event stream's state.
#pragma once

#include <httplib.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/http/http_gateway.h"
#include "server/http/http_wire.h"

namespace circuitlab::http {

struct HttpGateway::Stream {
  scheduler::Watch watch;
  std::shared_ptr<security::StreamTicket> ticket;  // a revoked token ends the stream
  std::mutex mu;
  std::condition_variable cv;
  bool notified = false;
  bool sent_any = false;
};

// One read endpoint: the request from the path's captures and the query, the
// caller's read access to what it names (as on gRPC), the core's answer as JSON.
template <typename Req, typename Fn>
void HttpGateway::Read(const std::string& pattern, const std::string& route, std::vector<std::string> path_fields,
                       Fn fn) {
  Get(pattern, route, false,
      [this, path_fields = std::move(path_fields), fn](const httplib::Request& req, httplib::Response& res,
                                                       const security::Caller& c) -> absl::Status {
        Req r;
        CL_RETURN_IF_ERROR(FillRequest(req, path_fields, &r));
        CL_RETURN_IF_ERROR(cores_.security->Check(c, security::Access::kRead, r));
        auto out = fn(r, c);
        CL_RETURN_IF_ERROR(out.status());
        return Reply(res, *out);
      });
}

}  // namespace circuitlab::http
