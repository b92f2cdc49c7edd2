// What every handler asks before it calls a core: who is calling (the
// principal its token names), whether that principal may touch what the
// request names (the run, sweep or job by its id field), and the audit line
// of a state-changing call. One object, shared by both services.
#pragma once

#include <google/protobuf/message.h>
#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/rpc/audit.h"
#include "server/rpc/auth.h"
#include "server/scheduler/analysis_jobs.h"
#include "server/scheduler/scheduler.h"
#include "server/scheduler/sweeps.h"

namespace circuitlab::rpc {

struct Caller {
  Principal principal;
  std::string peer;   // "ipv4:10.0.0.7:53012"
  std::string label;  // x-circuitlab-client, for logs only (never an identity)
  bool tls = false;
};

// What a method does with the run/sweep/job its request names.
enum class Access {
  kRead,    // any principal; with --private-runs, a user only its own
  kCreate,  // submits something new: users and admins
  kChange,  // cancels or deletes: the owner or an admin
};

struct SecurityOptions {
  bool private_runs = false;      // users read only their own runs, sweeps and jobs
  std::string plaintext_warning;  // non-empty when serving beyond loopback without TLS
};

class Security {
 public:
  // All pointers must outlive this object; `audit` may be null.
  Security(const Authenticator* auth, AuditLog* audit, scheduler::Scheduler* runs, scheduler::SweepCore* sweeps,
           scheduler::AnalysisJobs* jobs, SecurityOptions options)
      : auth_(auth), audit_(audit), runs_(runs), sweeps_(sweeps), jobs_(jobs), options_(std::move(options)) {}

  // The caller's principal from its `authorization` metadata.
  absl::StatusOr<Caller> Authenticate(const grpc::CallbackServerContext* ctx) const;
  // The same for the HTTP front end: its Authorization header, peer, whether
  // the connection is TLS.
  absl::StatusOr<Caller> Authenticate(std::string_view authorization, std::string peer, bool tls) const;

  // Whether `caller` may do `access` to what `request` names through its
  // run_id / sweep_id field (those it does not have are not checked).
  // NotFound (as for an unknown id) for a run a private server hides;
  // PermissionDenied naming the owner for a change by someone else.
  absl::Status Check(const Caller& caller, Access access, const google::protobuf::Message& request) const;

  // The audit line of a call (when an audit log is configured); the target
  // is the request's id field, else the id in the response.
  void Audit(const Caller& caller, const google::protobuf::Message& request, const google::protobuf::Message* response,
             const absl::Status& outcome) const;

  bool private_runs() const { return options_.private_runs; }
  const std::string& plaintext_warning() const { return options_.plaintext_warning; }
  // The limits that apply to `principal`: its overrides, else the server's
  // (as the cores that enforce them answer).
  QuotaOverrides LimitsFor(const std::string& principal) const;
  // The owner filter ListRuns applies for `caller` (nullopt = everyone's).
  std::optional<std::string> ListFilter(const Caller& caller, bool mine) const;

 private:
  const Authenticator* const auth_;
  AuditLog* const audit_;
  scheduler::Scheduler* const runs_;
  scheduler::SweepCore* const sweeps_;
  scheduler::AnalysisJobs* const jobs_;
  const SecurityOptions options_;
};

// "SubmitRun" for a SubmitRunRequest: the method a request message belongs to.
std::string MethodOf(const google::protobuf::Message& request);

}  // namespace circuitlab::rpc
