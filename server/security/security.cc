#include "server/security/security.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <string_view>
#include <utility>
#include <vector>

#include "server/common/status_macros.h"
#include "server/common/text.h"

namespace circuitlab::security {
namespace {

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

// The runs and sweeps a request names below its top level: every singular
// string field called run_id or sweep_id, or ending in _run_id or _sweep_id
// (source_run_id, ...), in nested messages at any depth (an Intervene op's
// swap source, an inline recipe's steps); (id, is_sweep), each once. The
// walk is bounded by the request's size (the transport's limits).
void NestedReferences(const google::protobuf::Message& m, bool top, std::vector<std::pair<std::string, bool>>& out) {
  using FD = google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = m.GetReflection();
  std::vector<const FD*> fields;
  r->ListFields(m, &fields);
  auto ends_with = [](const std::string& s, std::string_view tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  for (const FD* f : fields) {
    if (f->cpp_type() == FD::CPPTYPE_MESSAGE) {
      if (!f->is_repeated()) {
        NestedReferences(r->GetMessage(m, f), false, out);
        continue;
      }
      for (int i = 0; i < r->FieldSize(m, f); ++i) NestedReferences(r->GetRepeatedMessage(m, f, i), false, out);
      continue;
    }
    if (f->is_repeated() || f->cpp_type() != FD::CPPTYPE_STRING) continue;
    const std::string& name = f->name();
    const bool run = name == "run_id" || ends_with(name, "_run_id");
    const bool sweep = name == "sweep_id" || ends_with(name, "_sweep_id");
    if (!run && !sweep) continue;
    if (top && (name == "run_id" || name == "sweep_id")) continue;  // the request's own target
    std::pair<std::string, bool> ref{r->GetString(m, f), sweep};
    if (!ref.first.empty() && std::find(out.begin(), out.end(), ref) == out.end()) out.push_back(std::move(ref));
  }
}

}  // namespace

bool IsLoopbackAddress(const std::string& host_port) {
  std::string host = host_port;
  if (!host.empty() && host[0] == '[') {
    host = host.substr(1, host.find(']') - 1);
  } else if (auto colon = host.rfind(':'); colon != std::string::npos) {
    host.resize(colon);
  }
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

absl::Status CheckListenAddress(const std::string& flag, const std::string& address, bool open, bool tls,
                                bool insecure_plaintext) {
  if (IsLoopbackAddress(address)) return absl::OkStatus();
  if (open) {
    return absl::InvalidArgumentError(flag + " " + address +
                                      " is not a loopback address: serving beyond this machine requires "
                                      "--auth-tokens-file (or --auth-token-file)");
  }
  if (!tls && !insecure_plaintext) {
    return absl::InvalidArgumentError(flag + " " + address +
                                      " is not a loopback address: serving beyond this machine requires TLS "
                                      "(--tls-cert FILE --tls-key FILE, used by both ports; scripts/dev-certs.sh "
                                      "makes test ones), or --insecure-plaintext to send tokens and data in clear");
  }
  return absl::OkStatus();
}

std::string MethodOf(const google::protobuf::Message& request) {
  std::string name = request.GetDescriptor()->name();
  constexpr std::string_view kSuffix = "Request";
  if (name.size() > kSuffix.size() && name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0) {
    name.resize(name.size() - kSuffix.size());
  }
  return name;
}

absl::StatusOr<Caller> Security::Authenticate(std::string_view authorization, std::string peer, bool tls,
                                              std::string_view label) const {
  Caller caller;
  CL_ASSIGN_OR_RETURN(caller.principal, auth_->Resolve(authorization));
  caller.credential = std::string(authorization);
  caller.peer = std::move(peer);
  caller.label = Clip(label, 128);
  caller.tls = tls;
  return caller;
}

absl::Status Security::Check(const Caller& caller, Access access, const google::protobuf::Message& request) const {
  const Principal& who = caller.principal;
  if (access == Access::kCreate) {
    // What it creates is the caller's; what it names (a recipe's analyses, a
    // swap's source) is read like any other reference.
    CL_RETURN_IF_ERROR(MayWrite(who, MethodOf(request)));
    return CheckReferences(who, request, false);
  }
  const std::string run_id = StringField(request, "run_id");
  const std::string sweep_id = StringField(request, "sweep_id");
  if (access == Access::kRead && !options_.private_runs) return absl::OkStatus();
  if (access == Access::kChange) CL_RETURN_IF_ERROR(MayWrite(who, MethodOf(request)));
  struct Target {
    const std::string& id;
    bool sweep;
    const char* kind;
  };
  for (const Target& t : {Target{run_id, false, "run"}, Target{sweep_id, true, "sweep"}}) {
    if (t.id.empty()) continue;
    CL_ASSIGN_OR_RETURN(std::string owner, t.sweep ? directory_->SweepOwner(t.id) : directory_->RunOwner(t.id));
    if (!MayRead(who, owner, options_.private_runs)) {
      // The same answer as for an id that does not exist.
      return absl::NotFoundError(std::string(t.kind) + " " + Clip(EscapeControl(t.id), 64) + " not found");
    }
    if (access == Access::kChange) CL_RETURN_IF_ERROR(MayChange(who, owner, std::string(t.kind) + " " + t.id));
  }
  return CheckReferences(who, request, true);
}

absl::Status Security::CheckReferences(const Principal& who, const google::protobuf::Message& request,
                                       bool skip_top) const {
  if (!options_.private_runs) return absl::OkStatus();
  // Every other run or sweep the request reads (a swap's source, a recipe's
  // analyses) is checked as a read of it, answered as a missing one when
  // refused.
  std::vector<std::pair<std::string, bool>> refs;
  NestedReferences(request, skip_top, refs);
  for (const auto& [id, sweep] : refs) {
    absl::StatusOr<std::string> owner = sweep ? directory_->SweepOwner(id) : directory_->RunOwner(id);
    if (!owner.ok() || !MayRead(who, *owner, options_.private_runs)) {
      return absl::NotFoundError(std::string(sweep ? "sweep " : "run ") + Clip(EscapeControl(id), 64) + " not found");
    }
  }
  return absl::OkStatus();
}

std::optional<std::string> Security::ListFilter(const Caller& caller, bool mine) const {
  const bool only_own = options_.private_runs && caller.principal.role == Role::kUser;  // MayRead's rule
  if (mine || only_own) return caller.principal.name;
  return std::nullopt;
}

QuotaOverrides Security::LimitsFor(const std::string& principal) const { return directory_->LimitsFor(principal); }

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

v1::WhoAmIResponse Security::WhoAmI(const Caller& caller) const {
  v1::WhoAmIResponse who;
  who.set_principal(caller.principal.name);
  who.set_role(RoleName(caller.principal.role));
  who.set_peer(caller.peer);
  who.set_tls(caller.tls);
  who.set_private_runs(options_.private_runs);
  who.set_warning(options_.plaintext_warning);
  const QuotaOverrides limits = LimitsFor(caller.principal.name);
  who.set_max_queued_runs(limits.max_queued);
  who.set_max_analysis_jobs(limits.max_analyses);
  who.set_max_watches(limits.max_watches);
  who.set_max_sweep_runs(limits.max_sweep_runs);
  *who.mutable_server() = options_.server_info;
  return who;
}

std::shared_ptr<StreamTicket> Security::OpenStream(const Caller& caller, std::function<void()> end) const {
  auto ticket = std::make_shared<StreamTicket>(caller, std::move(end));
  std::lock_guard<std::mutex> lock(streams_mu_);
  std::erase_if(streams_, [](const std::weak_ptr<StreamTicket>& t) { return t.expired(); });
  streams_.push_back(ticket);
  return ticket;
}

int Security::OpenStreamCount() const {
  std::lock_guard<std::mutex> lock(streams_mu_);
  return static_cast<int>(std::count_if(streams_.begin(), streams_.end(),
                                        [](const std::weak_ptr<StreamTicket>& t) { return !t.expired(); }));
}

int Security::RevalidateStreams() const {
  std::vector<std::shared_ptr<StreamTicket>> open;
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    std::erase_if(streams_, [](const std::weak_ptr<StreamTicket>& t) { return t.expired(); });
    for (const auto& weak : streams_) {
      if (auto t = weak.lock()) open.push_back(std::move(t));
    }
  }
  int ended = 0;
  for (const std::shared_ptr<StreamTicket>& t : open) {
    absl::StatusOr<Principal> now = auth_->Resolve(t->caller().credential);
    const Principal& was = t->caller().principal;
    if (now.ok() && now->name == was.name && now->role == was.role) continue;
    if (t->revoked_.exchange(true)) continue;
    spdlog::info("tokens re-read: ending {}'s stream from {} (its token {})", EscapeControl(was.name),
                 EscapeControl(t->caller().peer), now.ok() ? "now names another principal or role" : "was revoked");
    if (t->end_) t->end_();
    ++ended;
  }
  return ended;
}

}  // namespace circuitlab::security
