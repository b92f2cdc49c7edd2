// What every handler asks before it calls a core: who is calling (the
// principal its token names), whether that principal may touch what the
// request names (the run, sweep or job by its id field), and the audit line
// of a state-changing call. One object, shared by both fronts (gRPC and HTTP);
// it knows neither transport.
#pragma once

#include <google/protobuf/message.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "circuitlab/v1/experiment_service.pb.h"
#include "server/common/quotas.h"
#include "server/security/audit.h"
#include "server/security/auth.h"

namespace circuitlab::security {

struct Caller {
  Principal principal;
  std::string peer;   // "ipv4:10.0.0.7:53012"
  std::string label;  // x-circuitlab-client, for logs only (never an identity)
  bool tls = false;
  // The authorization value it authenticated with (never logged): an open
  // stream is checked again with it when the tokens are re-read.
  std::string credential;
};

// An open stream's claim to its caller's credential (Security::OpenStream).
// revoked() turns true, and the stream's end callback runs once, when a
// re-read tokens file no longer maps the credential to the same principal
// with the same role.
class StreamTicket {
 public:
  StreamTicket(Caller caller, std::function<void()> end) : caller_(std::move(caller)), end_(std::move(end)) {}
  bool revoked() const { return revoked_.load(); }
  const Caller& caller() const { return caller_; }

 private:
  friend class Security;
  const Caller caller_;
  std::function<void()> end_;
  std::atomic<bool> revoked_{false};
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
  v1::ServerInfo server_info;     // what the server runs on (WhoAmI)
};

// What the access rules ask of the server's cores: who owns a run or a
// sweep, and the limits that apply to a principal. Security knows principals
// and roles, not runs: app/ answers this from the scheduler's cores.
class Directory {
 public:
  virtual ~Directory() = default;
  // The principal that owns run / sweep `id`; NotFound for an unknown id.
  virtual absl::StatusOr<std::string> RunOwner(const std::string& id) const = 0;
  virtual absl::StatusOr<std::string> SweepOwner(const std::string& id) const = 0;
  // The limits the cores apply to `principal` (its overrides, else the flags').
  virtual QuotaOverrides LimitsFor(const std::string& principal) const = 0;
};

class Security {
 public:
  // All pointers must outlive this object; `audit` may be null.
  Security(const Authenticator* auth, AuditLog* audit, const Directory* directory, SecurityOptions options)
      : auth_(auth), audit_(audit), directory_(directory), options_(std::move(options)) {}

  // The caller's principal from the authorization it presented (gRPC
  // metadata, an HTTP header), its peer, whether the connection is TLS, and
  // the client's self-chosen label (clipped; for logs, never an identity).
  absl::StatusOr<Caller> Authenticate(std::string_view authorization, std::string peer, bool tls,
                                      std::string_view label) const;

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
  // The WhoAmI answer for `caller` (both fronts): principal, role, transport,
  // its limits, the server's warning and what the server runs on.
  v1::WhoAmIResponse WhoAmI(const Caller& caller) const;
  // The limits that apply to `principal`: its overrides, else the server's
  // (as the cores that enforce them answer).
  QuotaOverrides LimitsFor(const std::string& principal) const;
  // Whether `caller` may only read stored analyses (readers and workers).
  static bool ReadsOnly(const Caller& caller) {
    return caller.principal.role == Role::kReader || caller.principal.role == Role::kWorker;
  }
  // The owner filter ListRuns applies for `caller` (nullopt = everyone's).
  std::optional<std::string> ListFilter(const Caller& caller, bool mine) const;

  // Registers an open stream (WatchRun, an HTTP event stream, a worker's
  // session) of `caller`; `end` must make it finish soon (it is called on the
  // thread that re-reads the tokens, without locks). The stream holds the
  // ticket while it is open; dropping it unregisters.
  std::shared_ptr<StreamTicket> OpenStream(const Caller& caller, std::function<void()> end) const;
  // After the tokens were re-read (SIGHUP): ends the open streams whose
  // credential no longer names the same principal with the same role
  // (issue 32 item 6). Returns how many it ended.
  int RevalidateStreams() const;
  // How many streams are registered and open now.
  int OpenStreamCount() const;

 private:
  // Under --private-runs: every run and sweep `request` names below its top
  // level (at it too, unless `skip_top`) may be read by `who`; NotFound, as
  // for a missing one, when not.
  absl::Status CheckReferences(const Principal& who, const google::protobuf::Message& request, bool skip_top) const;
  const Authenticator* const auth_;
  AuditLog* const audit_;
  const Directory* const directory_;
  const SecurityOptions options_;
  mutable std::mutex streams_mu_;
  mutable std::vector<std::weak_ptr<StreamTicket>> streams_;  // under streams_mu_
};

// True for 127.0.0.0/8, ::1 and "localhost" listen addresses.
bool IsLoopbackAddress(const std::string& host_port);

// The rule for an address a front listens on (`flag`: "--listen", "--http"):
// beyond loopback it needs tokens (`open` = none configured), and TLS unless
// `insecure_plaintext`. InvalidArgument naming the flag and what is missing.
absl::Status CheckListenAddress(const std::string& flag, const std::string& address, bool open, bool tls,
                                bool insecure_plaintext);

// "SubmitRun" for a SubmitRunRequest: the method a request message belongs to.
std::string MethodOf(const google::protobuf::Message& request);

}  // namespace circuitlab::security
