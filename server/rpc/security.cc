#include "server/rpc/security.h"

#include "server/common/status_macros.h"
#include "server/common/text.h"

namespace circuitlab::rpc {
namespace {

std::string Metadata(const grpc::CallbackServerContext* ctx, const std::string& key) {
  const auto& md = ctx->client_metadata();
  auto it = md.find(key);
  return it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

// The value of a top-level string field, "" when the message has none.
std::string StringField(const google::protobuf::Message& m, const std::string& name) {
  const google::protobuf::FieldDescriptor* f = m.GetDescriptor()->FindFieldByName(name);
  if (f == nullptr || f->is_repeated() || f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_STRING) {
    return "";
  }
  return m.GetReflection()->GetString(m, f);
}

// The id a response names: its own run_id/sweep_id/job_id, or that of its
// `run` or `job` field (SubmitRun, CancelAnalysis).
std::string TargetOf(const google::protobuf::Message& m) {
  for (const char* name : {"run_id", "sweep_id", "job_id"}) {
    if (std::string id = StringField(m, name); !id.empty()) return id;
  }
  for (const char* name : {"run", "job"}) {
    const google::protobuf::FieldDescriptor* f = m.GetDescriptor()->FindFieldByName(name);
    if (f != nullptr && !f->is_repeated() && f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE &&
        m.GetReflection()->HasField(m, f)) {
      return TargetOf(m.GetReflection()->GetMessage(m, f));
    }
  }
  return "";
}

}  // namespace

std::string MethodOf(const google::protobuf::Message& request) {
  std::string name = request.GetDescriptor()->name();
  constexpr std::string_view kSuffix = "Request";
  if (name.size() > kSuffix.size() && name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0) {
    name.resize(name.size() - kSuffix.size());
  }
  return name;
}

absl::StatusOr<Caller> Security::Authenticate(const grpc::CallbackServerContext* ctx) const {
  Caller caller;
  CL_ASSIGN_OR_RETURN(caller.principal, auth_->Resolve(Metadata(ctx, "authorization")));
  caller.peer = ctx->peer();
  caller.label = Clip(Metadata(ctx, "x-circuitlab-client"), 128);
  if (std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context()) {
    for (const grpc::string_ref& v : auth->FindPropertyValues("transport_security_type")) {
      // "tls" from gRPC's TLS credentials, "ssl" from its older SSL ones.
      const std::string type(v.data(), v.size());
      caller.tls = caller.tls || type == "tls" || type == "ssl";
    }
  }
  return caller;
}

absl::StatusOr<Caller> Security::Authenticate(std::string_view authorization, std::string peer, bool tls) const {
  Caller caller;
  CL_ASSIGN_OR_RETURN(caller.principal, auth_->Resolve(authorization));
  caller.peer = std::move(peer);
  caller.label = "http";
  caller.tls = tls;
  return caller;
}

absl::Status Security::Check(const Caller& caller, Access access, const google::protobuf::Message& request) const {
  const Principal& who = caller.principal;
  if (access == Access::kCreate) return MayWrite(who, MethodOf(request));
  const std::string run_id = StringField(request, "run_id");
  const std::string sweep_id = StringField(request, "sweep_id");
  if (access == Access::kRead && !options_.private_runs) return absl::OkStatus();
  if (access == Access::kChange) CL_RETURN_IF_ERROR(MayWrite(who, MethodOf(request)));
  struct Target {
    const std::string& id;
    scheduler::Scheduler* runs;
    scheduler::SweepCore* sweeps;
    const char* kind;
  };
  for (const Target& t : {Target{run_id, runs_, nullptr, "run"}, Target{sweep_id, nullptr, sweeps_, "sweep"}}) {
    if (t.id.empty()) continue;
    CL_ASSIGN_OR_RETURN(std::string owner, t.runs ? t.runs->OwnerOf(t.id) : t.sweeps->OwnerOf(t.id));
    if (!MayRead(who, owner, options_.private_runs)) {
      // The same answer as for an id that does not exist.
      return absl::NotFoundError(std::string(t.kind) + " " + Clip(EscapeControl(t.id), 64) + " not found");
    }
    if (access == Access::kChange) CL_RETURN_IF_ERROR(MayChange(who, owner, std::string(t.kind) + " " + t.id));
  }
  return absl::OkStatus();
}

std::optional<std::string> Security::ListFilter(const Caller& caller, bool mine) const {
  const bool only_own = options_.private_runs && caller.principal.role == Role::kUser;  // MayRead's rule
  if (mine || only_own) return caller.principal.name;
  return std::nullopt;
}

QuotaOverrides Security::LimitsFor(const std::string& principal) const {
  return {runs_->QueueLimitFor(principal), jobs_->ActiveLimitFor(principal), runs_->WatchLimitFor(principal),
          sweeps_->MaxRunsFor(principal)};
}

void Security::Audit(const Caller& caller, const google::protobuf::Message& request,
                     const google::protobuf::Message* response, const absl::Status& outcome) const {
  if (audit_ == nullptr) return;
  AuditRecord r;
  r.principal = caller.principal.name;
  r.role = RoleName(caller.principal.role);
  r.peer = caller.peer;
  r.client = caller.label;
  r.method = MethodOf(request);
  r.target = TargetOf(request);
  if (r.target.empty() && response != nullptr && outcome.ok()) r.target = TargetOf(*response);
  r.target = Clip(r.target, 64);
  r.outcome = outcome;
  audit_->Record(r);
}

}  // namespace circuitlab::rpc
