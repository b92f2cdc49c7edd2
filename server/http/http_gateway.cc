#include "server/http/http_gateway.h"

#include <google/protobuf/util/json_util.h>
#include <httplib.h>
#include <malloc.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "server/common/response_budget.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/http/dashboard_assets.h"
#include "server/http/json_writer.h"
#include "server/reproduce/render.h"

namespace circuitlab::http {

using security::Access;
using security::Caller;
using security::MayRead;
using security::Role;
using security::Security;
using security::StreamTicket;
using security::TlsFiles;
namespace {

namespace pb = google::protobuf;

// Answers this large are sent from their buffer and given back once sent.
constexpr size_t kStreamAnswersFrom = 1 << 20;
// The largest request body read (the API's writes are small JSON).
constexpr uint64_t kMaxBody = 64 << 10;
// GET /api/v1/runs/{id}/interventions: a page of stored interventions ends
// before the one that would take its JSON over this, or its stored bytes
// (what is read to make it) over the second.
constexpr size_t kMaxInterventionPageJson = 1 << 20;
constexpr int64_t kMaxInterventionPageStored = 16 << 20;
// An answer's JSON is at most about this many times its protobuf size
// (floats as text): what the response budget and the page budgets count.
constexpr int64_t kJsonPerWireByte = 3;
// In a listed request, a repeated field's first elements (see StoredIntervention).
constexpr int kListedElements = 16;
// How long a client may pause within its request (each read).
constexpr std::chrono::seconds kReadTimeout{2};
// Admit counted this thread's request for its peer (the pre-routing handler,
// the handler, the response and the logger run on one thread).
thread_local bool tls_counted = false;

int HttpStatusOf(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    case absl::StatusCode::kUnimplemented:
      return 501;
    default:
      return 500;
  }
}

void WriteError(httplib::Response& res, const absl::Status& s) {
  res.status = HttpStatusOf(s);
  const nlohmann::json body = {{"code", absl::StatusCodeToString(s.code())},
                               {"message", Clip(std::string(s.message()), 1000)}};
  res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n", "application/json");
  if (res.status == 401) res.set_header("WWW-Authenticate", "Bearer realm=\"circuitlab\"");
  if (res.status == 503 || res.status == 429) res.set_header("Retry-After", "5");
}

absl::StatusOr<std::string> ToJson(const pb::Message& m) {
  std::string out;
  CL_RETURN_IF_ERROR(AppendJson(m, &out));
  return out;
}

// `body` sent as `type` from its one buffer (set_content would copy a large
// one), `lease` held until it is sent.
void Send(httplib::Response& res, std::shared_ptr<std::string> body, const char* type, ResponseBudget::Lease lease) {
  if (body->size() < kStreamAnswersFrom) {
    res.set_content(*body, type);
    return;
  }
  const size_t n = body->size();
  auto held = std::make_shared<ResponseBudget::Lease>(std::move(lease));
  res.set_content_provider(
      n, type,
      [body](size_t offset, size_t length, httplib::DataSink& sink) {
        return sink.write(body->data() + offset, std::min(length, body->size() - offset));
      },
      [body, held](bool) {
        // Sent: the buffer goes now, and what the answer's parts left free
        // in malloc's arenas goes back to the system (with the two arenas
        // app/server.cc allows, five GETs of a 50 MB answer keep nothing).
        std::string().swap(*body);
        held->Release();
        ::malloc_trim(0);
      });
}

// The answer as JSON (json_writer.h: memory linear in its size).
absl::Status Reply(httplib::Response& res, const pb::Message& m) {
  CL_ASSIGN_OR_RETURN(ResponseBudget::Lease lease,
                      ResponseBudget::Process().Acquire(kJsonPerWireByte * static_cast<int64_t>(m.ByteSizeLong()),
                                                        std::string(m.GetDescriptor()->name())));
  auto body = std::make_shared<std::string>();
  CL_RETURN_IF_ERROR(AppendJson(m, body.get()));
  body->push_back('\n');
  Send(res, std::move(body), "application/json", std::move(lease));
  return absl::OkStatus();
}

// One query value into a scalar field (added when repeated).
absl::Status SetScalar(pb::Message* m, const pb::FieldDescriptor* f, const std::string& value,
                       const std::string& path) {
  const pb::Reflection* r = m->GetReflection();
  const bool rep = f->is_repeated();
  auto bad = [&](const char* what) {
    return absl::InvalidArgumentError("query parameter " + path + " must be " + what + ", got " +
                                      Quote(Clip(value, 64)));
  };
  switch (f->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_STRING:
      rep ? r->AddString(m, f, value) : r->SetString(m, f, value);
      return absl::OkStatus();
    case pb::FieldDescriptor::CPPTYPE_BOOL: {
      const std::string v = absl::AsciiStrToLower(value);
      if (v != "true" && v != "false" && v != "1" && v != "0" && !v.empty()) return bad("true or false");
      const bool b = v == "true" || v == "1" || v.empty();
      rep ? r->AddBool(m, f, b) : r->SetBool(m, f, b);
      return absl::OkStatus();
    }
    case pb::FieldDescriptor::CPPTYPE_INT32: {
      int32_t v;
      if (!absl::SimpleAtoi(value, &v)) return bad("an integer");
      rep ? r->AddInt32(m, f, v) : r->SetInt32(m, f, v);
      return absl::OkStatus();
    }
    case pb::FieldDescriptor::CPPTYPE_UINT32: {
      uint32_t v;
      if (!absl::SimpleAtoi(value, &v)) return bad("a non-negative integer");
      rep ? r->AddUInt32(m, f, v) : r->SetUInt32(m, f, v);
      return absl::OkStatus();
    }
    case pb::FieldDescriptor::CPPTYPE_INT64: {
      int64_t v;
      if (!absl::SimpleAtoi(value, &v)) return bad("an integer");
      rep ? r->AddInt64(m, f, v) : r->SetInt64(m, f, v);
      return absl::OkStatus();
    }
    case pb::FieldDescriptor::CPPTYPE_UINT64: {
      uint64_t v;
      if (!absl::SimpleAtoi(value, &v)) return bad("a non-negative integer");
      rep ? r->AddUInt64(m, f, v) : r->SetUInt64(m, f, v);
      return absl::OkStatus();
    }
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
    case pb::FieldDescriptor::CPPTYPE_FLOAT: {
      double v;
      if (!absl::SimpleAtod(value, &v)) return bad("a number");
      if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_FLOAT) {
        rep ? r->AddFloat(m, f, static_cast<float>(v)) : r->SetFloat(m, f, static_cast<float>(v));
      } else {
        rep ? r->AddDouble(m, f, v) : r->SetDouble(m, f, v);
      }
      return absl::OkStatus();
    }
    case pb::FieldDescriptor::CPPTYPE_ENUM: {
      // The full name (RUN_STATE_SUCCEEDED) or its last part in any case (succeeded).
      const pb::EnumDescriptor* e = f->enum_type();
      const pb::EnumValueDescriptor* v = e->FindValueByName(value);
      std::vector<std::string> names;
      for (int i = 0; v == nullptr && i < e->value_count(); ++i) {
        const std::string& full = e->value(i)->name();
        names.push_back(full);
        const std::string upper = absl::AsciiStrToUpper(value);
        if (full.size() > upper.size() && full.compare(full.size() - upper.size(), upper.size(), upper) == 0 &&
            full[full.size() - upper.size() - 1] == '_') {
          v = e->value(i);
        }
      }
      if (v == nullptr) return bad(("one of " + absl::StrJoin(names, ", ")).c_str());
      rep ? r->AddEnum(m, f, v) : r->SetEnum(m, f, v);
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError("query parameter " + path + " cannot be set from a query string");
  }
}

// `key` (a field name, dotted into nested messages: pivot.x) = `value`;
// a repeated field takes repeated parameters or a comma-separated list.
absl::Status SetField(pb::Message* root, const std::string& key, const std::string& value) {
  pb::Message* m = root;
  std::vector<std::string> parts = absl::StrSplit(key, '.');
  for (size_t i = 0; i < parts.size(); ++i) {
    const pb::FieldDescriptor* f = m->GetDescriptor()->FindFieldByName(parts[i]);
    if (f == nullptr) {
      std::vector<std::string> known;
      for (int k = 0; k < m->GetDescriptor()->field_count(); ++k) known.push_back(m->GetDescriptor()->field(k)->name());
      return absl::InvalidArgumentError("unknown query parameter " + Quote(Clip(key, 64)) +
                                        " (known here: " + absl::StrJoin(known, ", ") + ")");
    }
    const bool message = f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE && !f->is_repeated();
    if (i + 1 == parts.size() && message) {
      // A message from a list: its scalar fields in declaration order (pivot=x,y,value).
      pb::Message* sub = m->GetReflection()->MutableMessage(m, f);
      std::vector<std::string> items = absl::StrSplit(value, ',');
      const pb::Descriptor* d = sub->GetDescriptor();
      if (items.size() > static_cast<size_t>(d->field_count())) {
        return absl::InvalidArgumentError("query parameter " + Quote(Clip(key, 64)) + " takes at most " +
                                          std::to_string(d->field_count()) + " comma-separated values");
      }
      for (size_t k = 0; k < items.size(); ++k) {
        CL_RETURN_IF_ERROR(SetField(sub, d->field(static_cast<int>(k))->name(), items[k]));
      }
      return absl::OkStatus();
    }
    if (i + 1 < parts.size()) {
      if (!message) {
        return absl::InvalidArgumentError("query parameter " + Quote(Clip(key, 64)) + ": " + f->name() +
                                          " has no fields");
      }
      m = m->GetReflection()->MutableMessage(m, f);
      continue;
    }
    if (!f->is_repeated()) return SetScalar(m, f, value, key);
    for (absl::string_view item : absl::StrSplit(value, ',', absl::SkipEmpty())) {
      CL_RETURN_IF_ERROR(SetScalar(m, f, std::string(item), key));
    }
    return absl::OkStatus();
  }
  return absl::OkStatus();
}

// The request: the path's captures into `path_fields`, then the query
// parameters.
absl::Status FillRequest(const httplib::Request& req, const std::vector<std::string>& path_fields, pb::Message* m) {
  for (size_t i = 0; i < path_fields.size() && i + 1 < req.matches.size(); ++i) {
    CL_RETURN_IF_ERROR(SetField(m, path_fields[i], req.matches[i + 1].str()));
  }
  if (req.params.size() > 256) return absl::InvalidArgumentError("at most 256 query parameters");
  for (const auto& [key, value] : req.params) {
    CL_RETURN_IF_ERROR(SetField(m, key, value));
  }
  return absl::OkStatus();
}

const char* EventKind(const v1::RunEvent& e) {
  switch (e.event_case()) {
    case v1::RunEvent::kSnapshot:
      return "snapshot";
    case v1::RunEvent::kState:
      return "state";
    case v1::RunEvent::kProgress:
      return "progress";
    case v1::RunEvent::kMetrics:
      return "metrics";
    case v1::RunEvent::kHeartbeat:
      return "heartbeat";
    default:
      return "event";
  }
}

std::string Hostname() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

// Cuts every repeated field of `m`, at any depth, to its first `keep`
// elements (but `skip`, at the top); true when anything was cut.
bool ClipRepeated(pb::Message* m, int keep, const pb::FieldDescriptor* skip = nullptr) {
  const pb::Reflection* r = m->GetReflection();
  std::vector<const pb::FieldDescriptor*> fields;
  r->ListFields(*m, &fields);
  bool cut = false;
  for (const pb::FieldDescriptor* f : fields) {
    if (f->is_repeated() && f != skip && r->FieldSize(*m, f) > keep) {
      while (r->FieldSize(*m, f) > keep) r->RemoveLast(m, f);
      cut = true;
    }
    if (f->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (!f->is_repeated()) {
      cut |= ClipRepeated(r->MutableMessage(m, f), keep);
      continue;
    }
    for (int i = 0; i < r->FieldSize(*m, f); ++i) cut |= ClipRepeated(r->MutableRepeatedMessage(m, f, i), keep);
  }
  return cut;
}

// A stored intervention as the HTTP API answers it; `whole`: its request
// as stored, else its summary (StoredIntervention).
absl::StatusOr<v1::StoredIntervention> StoredInterventionFrom(const store::Store::StoredAnalysis& row,
                                                              const std::string& run_id, bool whole) {
  v1::StoredIntervention out;
  if (!out.mutable_request()->ParseFromString(row.request) || !out.mutable_response()->ParseFromString(row.result)) {
    return absl::DataLossError("a stored intervention of " + run_id + " does not parse");
  }
  out.set_key(std::to_string(row.request_hash));
  out.set_stored_at_us(row.created_at);
  out.set_request_bytes(static_cast<int64_t>(row.request.size()));
  if (!whole) {
    out.set_request_clipped(ClipRepeated(out.mutable_request(), kListedElements,
                                         v1::InterveneRequest::descriptor()->FindFieldByName("interventions")));
  }
  v1::InterveneResponse* rs = out.mutable_response();
  rs->set_state(v1::ANALYSIS_STATE_DONE);
  rs->set_progress(1.0);
  rs->set_from_store(true);
  return out;
}

absl::StatusOr<v1::ListStoredInterventionsResponse> StoredInterventions(
    store::Store& store, const v1::ListStoredInterventionsRequest& r) {
  if (r.page_size() < 0 || r.page_size() > 50) {
    return absl::InvalidArgumentError("page_size must be in [0, 50], got " + std::to_string(r.page_size()));
  }
  std::optional<store::Store::AnalysisCursor> after;
  if (!r.page_token().empty()) {
    const std::vector<std::string> parts = absl::StrSplit(r.page_token(), '.');
    store::Store::AnalysisCursor c;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &c.created_at) || !absl::SimpleAtoi(parts[1], &c.request_hash)) {
      return absl::InvalidArgumentError("page_token must be a previous answer's next_page_token, got " +
                                        Quote(Clip(r.page_token(), 64)));
    }
    after = c;
  }
  CL_ASSIGN_OR_RETURN(const int64_t id, scheduler::ParseRunId(r.run_id()));
  CL_RETURN_IF_ERROR(store.GetRun(id).status());
  const int size = r.page_size() ? r.page_size() : 10;
  bool cut = false;
  CL_ASSIGN_OR_RETURN(std::vector<store::Store::StoredAnalysis> rows,
                      store.ListAnalyses(id, "intervene", size + 1, after, kMaxInterventionPageStored, &cut));
  v1::ListStoredInterventionsResponse out;
  out.set_run_id(scheduler::FormatRunId(id));
  size_t json = 0;
  bool more = cut || static_cast<int>(rows.size()) > size;
  for (size_t i = 0; i < rows.size() && static_cast<int>(i) < size; ++i) {
    CL_ASSIGN_OR_RETURN(v1::StoredIntervention item, StoredInterventionFrom(rows[i], out.run_id(), false));
    json += item.ByteSizeLong() * kJsonPerWireByte;
    if (json > kMaxInterventionPageJson && out.interventions_size() > 0) {
      more = true;
      break;
    }
    *out.add_interventions() = std::move(item);
  }
  if (more) {
    const v1::StoredIntervention& last = out.interventions(out.interventions_size() - 1);
    out.set_next_page_token(std::to_string(last.stored_at_us()) + "." + last.key());
  }
  return out;
}

absl::StatusOr<v1::StoredIntervention> StoredInterventionOf(store::Store& store,
                                                            const v1::GetStoredInterventionRequest& r) {
  int64_t hash = 0;
  if (!absl::SimpleAtoi(r.key(), &hash)) {
    return absl::InvalidArgumentError("key must be a listed intervention's key, got " + Quote(Clip(r.key(), 64)));
  }
  CL_ASSIGN_OR_RETURN(const int64_t id, scheduler::ParseRunId(r.run_id()));
  CL_RETURN_IF_ERROR(store.GetRun(id).status());
  CL_ASSIGN_OR_RETURN(std::optional<store::Store::StoredAnalysis> row, store.GetStoredAnalysis(id, "intervene", hash));
  if (!row.has_value()) {
    return absl::NotFoundError("run " + scheduler::FormatRunId(id) + " has no stored intervention " +
                               Quote(Clip(r.key(), 64)));
  }
  return StoredInterventionFrom(*row, scheduler::FormatRunId(id), true);
}

}  // namespace

struct HttpGateway::Stream {
  scheduler::Watch watch;
  std::shared_ptr<StreamTicket> ticket;  // a revoked token ends the stream
  std::mutex mu;
  std::condition_variable cv;
  bool notified = false;
  bool sent_any = false;
};

absl::StatusOr<std::unique_ptr<HttpGateway>> HttpGateway::Start(const HttpOptions& options, const TlsFiles& tls,
                                                                HttpCores cores) {
  if (options.threads < 1 || options.threads > 4096) {
    return absl::InvalidArgumentError("--http-threads must be in [1, 4096], got " + std::to_string(options.threads));
  }
  if (options.max_per_peer < 1 || options.max_per_peer > 4096) {
    return absl::InvalidArgumentError("--http-max-per-peer must be in [1, 4096], got " +
                                      std::to_string(options.max_per_peer));
  }
  if (options.max_streams < 0 || options.max_streams > 1024) {
    return absl::InvalidArgumentError("--http-max-streams must be in [0, 1024], got " +
                                      std::to_string(options.max_streams));
  }
  const size_t colon = options.listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(options.listen.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError("--http must be HOST:PORT (port 0 picks a free one), got " +
                                      Quote(options.listen));
  }
  std::string host = options.listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);

  HttpOptions effective = options;
  effective.max_per_peer = std::min(options.max_per_peer, std::max(1, options.threads / 2));
  if (effective.max_per_peer != options.max_per_peer) {
    spdlog::info("http: --http-max-per-peer {} applies as {} (at most half of --http-threads {})", options.max_per_peer,
                 effective.max_per_peer, options.threads);
  }
  std::unique_ptr<HttpGateway> g(new HttpGateway(effective, cores));
  if (tls.enabled()) {
    auto ssl = std::make_unique<httplib::SSLServer>(tls.cert.c_str(), tls.key.c_str(),
                                                    tls.client_ca.empty() ? nullptr : tls.client_ca.c_str());
    if (!ssl->is_valid()) {
      return absl::InvalidArgumentError("--http: cannot use --tls-cert " + tls.cert + " / --tls-key " + tls.key +
                                        " for HTTPS");
    }
    g->server_ = std::move(ssl);
    g->tls_ = true;
  } else {
    g->server_ = std::make_unique<httplib::Server>();
  }
  const size_t pool = static_cast<size_t>(options.threads);
  g->server_->new_task_queue = [pool] { return new httplib::ThreadPool(pool); };
  g->server_->set_payload_max_length(kMaxBody);
  g->server_->set_read_timeout(kReadTimeout);
  g->server_->set_write_timeout(std::chrono::seconds(10));  // a stream reader that stops reading
  g->server_->set_keep_alive_timeout(2);
  g->server_->set_keep_alive_max_count(100);
  HttpGateway* self = g.get();
  g->server_->set_pre_routing_handler([self](const httplib::Request& req, httplib::Response& res) {
    return self->Admit(req, res) ? httplib::Server::HandlerResponse::Unhandled
                                 : httplib::Server::HandlerResponse::Handled;
  });
  g->server_->set_logger([self](const httplib::Request& req, const httplib::Response&) { self->Done(req); });
  g->Routes();
  // httplib listens with a backlog of 5 (compiled into Debian's library), so
  // a burst of connections (a dashboard's tabs, a balancer's probes) has its
  // SYNs dropped and resent a second later; the socket is re-listened with the
  // kernel's limit (net.core.somaxconn) once bound.
  int listen_fd = -1;
  g->server_->set_socket_options([&listen_fd](int fd) {
    httplib::default_socket_options(fd);
    listen_fd = fd;
  });
  g->port_ = port == 0 ? g->server_->bind_to_any_port(host) : (g->server_->bind_to_port(host, port) ? port : -1);
  if (g->port_ <= 0) {
    return absl::UnavailableError("cannot listen on --http " + options.listen + " (address in use or invalid)");
  }
  if (listen_fd >= 0) ::listen(listen_fd, SOMAXCONN);
  telemetry::Telemetry* telemetry = cores.telemetry;
  g->guard_ = std::make_unique<ConnectionGuard>(
      ConnectionGuard::Options{g->port_, effective.max_per_peer, effective.request_deadline, std::chrono::milliseconds(250),
                               g->tls_},
      [telemetry](const char* reason) {
        if (telemetry != nullptr) telemetry->HttpRejected(reason);
      });
  g->guard_->Start();
  const std::string shown = host == "0.0.0.0" || host == "::" || host.empty() ? Hostname()
                            : host.find(':') != std::string::npos             ? "[" + host + "]"
                                                                              : host;
  g->url_ = std::string(g->tls_ ? "https" : "http") + "://" + shown + ":" + std::to_string(g->port_) + "/";
  httplib::Server* s = g->server_.get();
  g->thread_ = std::thread([s] { s->listen_after_bind(); });
  return g;
}

HttpGateway::HttpGateway(HttpOptions options, HttpCores cores) : options_(std::move(options)), cores_(cores) {}

bool HttpGateway::Admit(const httplib::Request& req, httplib::Response& res) {
  const std::string length = req.get_header_value("Content-Length");
  uint64_t declared = 0;
  if (!length.empty() && (!absl::SimpleAtoi(length, &declared) || declared > kMaxBody)) {
    if (cores_.telemetry) cores_.telemetry->HttpRejected("body_too_large");
    WriteError(res, absl::InvalidArgumentError("the request body may have at most " + std::to_string(kMaxBody) +
                                               " bytes, Content-Length says " + Clip(length, 32)));
    res.status = 413;
    res.set_header("Connection", "close");
    return false;
  }
  std::lock_guard<std::mutex> lock(streams_mu_);
  int& n = per_peer_[req.remote_addr];
  if (n >= options_.max_per_peer) {
    if (cores_.telemetry) cores_.telemetry->HttpRejected("peer_limit");
    WriteError(res, absl::ResourceExhaustedError("too many requests in progress from " + Clip(req.remote_addr, 64) +
                                                 " (--http-max-per-peer=" + std::to_string(options_.max_per_peer) +
                                                 "); retry later"));
    return false;
  }
  ++n;
  tls_counted = true;
  return true;
}

void HttpGateway::Done(const httplib::Request& req) {
  if (guard_) guard_->LeaveHandler(req.remote_addr, req.remote_port);
  if (!std::exchange(tls_counted, false)) return;
  std::lock_guard<std::mutex> lock(streams_mu_);
  auto it = per_peer_.find(req.remote_addr);
  if (it == per_peer_.end()) return;
  if (--it->second <= 0) per_peer_.erase(it);
}

HttpGateway::~HttpGateway() { Shutdown(); }

void HttpGateway::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  ready_ = false;
  if (guard_) guard_->Stop();  // before the sockets it watches go
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
  server_.reset();  // joins the pool: every stream has ended
}

std::function<void(const httplib::Request&, httplib::Response&)> HttpGateway::Wrap(const std::string& route, bool open,
                                                                               Handler handler) {
  return [this, route, open, handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
    // The request has arrived whole (headers and body): no deadline from now
    // on (an event stream is long by design).
    if (guard_) guard_->EnterHandler(req.remote_addr, req.remote_port);
    const auto started = std::chrono::steady_clock::now();
    absl::Status s;
    Caller caller;
    if (!open) {
      absl::StatusOr<Caller> c =
          cores_.security->Authenticate(req.get_header_value("Authorization"),
                                        "http:" + req.remote_addr + ":" + std::to_string(req.remote_port), tls_, "http");
      if (c.ok()) {
        caller = std::move(*c);
        s = security::MayUseResearchSurface(caller.principal);  // no HTTP route is the workers'
      } else {
        s = c.status();
      }
    }
    if (s.ok()) s = CallCatching([&] { return handler(req, res, caller); });
    if (!s.ok()) WriteError(res, s);
    if (res.status == -1) res.status = 200;  // httplib's "not set yet"
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_header("X-Frame-Options", "DENY");
    res.set_header("Referrer-Policy", "no-referrer");
    const bool stream = route == "runs/{id}/events" && res.status == 200;
    const double seconds =
        stream ? -1 : std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (cores_.telemetry) cores_.telemetry->ObserveHttp(route, res.status, seconds);
  };
}

void HttpGateway::Get(const std::string& pattern, const std::string& route, bool open, Handler handler) {
  server_->Get(pattern, Wrap(route, open, std::move(handler)));
}

void HttpGateway::Post(const std::string& pattern, const std::string& route, Handler handler) {
  server_->Post(pattern, Wrap(route, false, std::move(handler)));
}

// One read endpoint: the request from the path's captures and the query, the
// caller's read access to what it names (as on gRPC), the core's answer as JSON.
template <typename Req, typename Fn>
void HttpGateway::Read(const std::string& pattern, const std::string& route, std::vector<std::string> path_fields,
                       Fn fn) {
  Get(pattern, route, false,
      [this, path_fields = std::move(path_fields), fn](const httplib::Request& req, httplib::Response& res,
                                                       const Caller& c) -> absl::Status {
        Req r;
        CL_RETURN_IF_ERROR(FillRequest(req, path_fields, &r));
        CL_RETURN_IF_ERROR(cores_.security->Check(c, Access::kRead, r));
        auto out = fn(r, c);
        CL_RETURN_IF_ERROR(out.status());
        return Reply(res, *out);
      });
}

template <typename Req, typename Resp>
void HttpGateway::AnalysisReads(const std::string& name, const std::string& verb) {
  const Security& security = *cores_.security;
  scheduler::AnalysisCore* analysis = cores_.analysis;
  Read<Req>("/api/v1/runs/([^/]+)/" + name, "runs/{id}/" + name, {"run_id"},
            [analysis, &security](const Req& r, const Caller& c) -> absl::StatusOr<Resp> {
              absl::StatusOr<Resp> out =
                  analysis->Run<Resp>(r, scheduler::Requester(c.principal.name, Security::ReadsOnly(c)));
              if (!out.ok() || scheduler::IsPending(out->state())) security.Audit(c, r, out.ok() ? &*out : nullptr, out.status());
              return out;
            });
  Read<Req>("/api/v1/runs/([^/]+)/" + name + "/stored", "runs/{id}/" + name + "/stored", {"run_id"},
            [analysis, verb](const Req& r, const Caller& c) -> absl::StatusOr<Resp> {
              absl::StatusOr<Resp> out = analysis->Run<Resp>(r, scheduler::Requester(c.principal.name, true));
              if (!absl::IsPermissionDenied(out.status())) return out;
              Resp none;
              none.set_error("none stored for " + r.run_id() + " with these options; `circuitlab " + verb + " " +
                             r.run_id() + "` computes one (or, for a caller who may start analyses, the same URL "
                             "without /stored)");
              return none;
            });
}

// Reproductions (issue 34): the recipes, the list and one reproduction with
// its report (read as on gRPC: a private server shows a user its own).
void HttpGateway::Reproductions() {
  reproduce::ReproductionCore* core = cores_.reproductions;
  if (core == nullptr) return;
  const Security& security = *cores_.security;
  Read<v1::ListRecipesRequest>("/api/v1/recipes", "recipes", {},
                               [core](const auto&, const Caller&) -> absl::StatusOr<v1::ListRecipesResponse> {
                                 return core->Recipes();
                               });
  Read<v1::ListReproductionsRequest>("/api/v1/reproductions", "reproductions", {},
                                     [core, &security](const auto& r, const Caller& c) {
                                       return core->List(r, security.ListFilter(c, r.mine()).value_or(""));
                                     });
  Read<v1::GetReproductionRequest>(
      R"(/api/v1/reproductions/([^/]+))", "reproductions/{id}", {"reproduction_id"},
      [core, &security](const auto& r, const Caller& c) -> absl::StatusOr<v1::Reproduction> {
        absl::StatusOr<std::string> owner = core->OwnerOf(r.reproduction_id());
        if (!owner.ok()) return owner.status();
        if (!MayRead(c.principal, *owner, security.private_runs())) {
          return absl::NotFoundError("reproduction " + Clip(r.reproduction_id(), 64) + " not found");
        }
        return core->Get(r.reproduction_id());
      });
  // The report as the Markdown file of docs/reproductions/ (the CLI's
  // `reproduce show --markdown`), for the page's download.
  Get(R"(/api/v1/reproductions/([^/]+)/report\.md)", "reproductions/{id}/report.md", false,
      [core, &security](const httplib::Request& req, httplib::Response& res, const Caller& c) -> absl::Status {
        v1::GetReproductionRequest r;
        CL_RETURN_IF_ERROR(FillRequest(req, {"reproduction_id"}, &r));
        absl::StatusOr<std::string> owner = core->OwnerOf(r.reproduction_id());
        CL_RETURN_IF_ERROR(owner.status());
        if (!MayRead(c.principal, *owner, security.private_runs())) {
          return absl::NotFoundError("reproduction " + Clip(r.reproduction_id(), 64) + " not found");
        }
        CL_ASSIGN_OR_RETURN(v1::Reproduction rep, core->Get(r.reproduction_id()));
        res.set_header("Content-Disposition", "attachment; filename=\"" + rep.reproduction_id() + "-" +
                                                  rep.recipe().id() + ".md\"");
        res.set_content(reproduce::ReproductionMarkdown(rep), "text/markdown; charset=utf-8");
        return absl::OkStatus();
      });
}

// A run's interventions over HTTP (issue 36): GET lists the stored Intervene
// answers with their requests; POST runs one from the browser.
void HttpGateway::Interventions() {
  scheduler::AnalysisCore* analysis = cores_.analysis;
  const std::string pattern = R"(/api/v1/runs/([^/]+)/interventions)";
  Read<v1::ListStoredInterventionsRequest>(
      pattern, "runs/{id}/interventions", {"run_id"},
      [analysis](const auto& r, const Caller&) -> absl::StatusOr<v1::ListStoredInterventionsResponse> {
        return StoredInterventions(analysis->store(), r);
      });
  Read<v1::GetStoredInterventionRequest>(
      R"(/api/v1/runs/([^/]+)/interventions/([^/]+))", "runs/{id}/interventions/{key}", {"run_id", "key"},
      [analysis](const auto& r, const Caller&) -> absl::StatusOr<v1::StoredIntervention> {
        return StoredInterventionOf(analysis->store(), r);
      });
  AnalysisPost<v1::InterveneRequest, v1::InterveneResponse>(pattern, "runs/{id}/interventions",
                                                             "GET /api/v1/runs/{id}/interventions");
}

// An analysis whose request does not fit a query string (nested messages:
// an InterveneRequest's prompts, GetActivations' sequences), POSTed as JSON.
// Writes from a browser: a bearer token only (no cookie is ever read, so
// another site's page cannot ride a session) and a JSON body (a cross-site
// form cannot send Content-Type application/json without a CORS preflight,
// which this server never grants); then exactly the gRPC call's checks: read
// access to the run, a role that may start analyses, the request's
// validation, quotas and memory, an audit line. `stored` names where a
// reader finds stored answers instead (for the refusal's message).
template <typename Req, typename Resp>
void HttpGateway::AnalysisPost(const std::string& pattern, const std::string& route, const std::string& stored) {
  const Security& security = *cores_.security;
  scheduler::AnalysisCore* analysis = cores_.analysis;
  Post(pattern, route,
       [analysis, &security, stored](const httplib::Request& req, httplib::Response& res,
                                             const Caller& c) -> absl::Status {
         const std::string name(Req::descriptor()->name());
         const std::string type = absl::AsciiStrToLower(req.get_header_value("Content-Type"));
         if (type.rfind("application/json", 0) != 0) {
           WriteError(res, absl::InvalidArgumentError("the body must be a " + name +
                                                      " as JSON with Content-Type: application/json, got Content-Type " +
                                                      Quote(Clip(type, 64))));
           res.status = 415;
           return absl::OkStatus();
         }
         Req r;
         pb::util::JsonParseOptions o;
         o.ignore_unknown_fields = false;
         if (pb::util::Status p = pb::util::JsonStringToMessage(req.body, &r, o); !p.ok()) {
           return absl::InvalidArgumentError("the body is not a " + name + ": " + Clip(p.ToString(), 300));
         }
         const std::string path_id = req.matches[1];
         if (!r.run_id().empty() && r.run_id() != path_id) {
           return absl::InvalidArgumentError("run_id in the body (" + Quote(Clip(r.run_id(), 32)) +
                                             ") is not the run of the path (" + Quote(Clip(path_id, 32)) + ")");
         }
         r.set_run_id(path_id);
         if (Security::ReadsOnly(c)) {
           std::string where = stored;
           if (const size_t at = where.find("{id}"); at != std::string::npos) where.replace(at, 4, Clip(path_id, 32));
           const absl::Status refused = absl::PermissionDeniedError(
               "POST " + Clip(req.path, 128) + " starts an analysis; the principal " + c.principal.name + " may only read " +
               (where.empty() ? std::string("stored answers") : "stored answers (" + where + ")"));
           security.Audit(c, r, nullptr, refused);
           return refused;
         }
         CL_RETURN_IF_ERROR(security.Check(c, Access::kRead, r));
         absl::StatusOr<Resp> out = analysis->Run<Resp>(r, scheduler::Requester(c.principal.name, false));
         if (!out.ok() || scheduler::IsPending(out->state())) security.Audit(c, r, out.ok() ? &*out : nullptr, out.status());
         CL_RETURN_IF_ERROR(out.status());
         return Reply(res, *out);
       });
}

// A model out (issue 46): GET .../export answers ExportWeights as JSON (a
// job for a starter, polled; the safetensors bytes in base64 once done), and
// .../export/weights.safetensors the stored file itself, as an attachment
// (`curl -o`), never starting a job.
void HttpGateway::Exports() {
  scheduler::AnalysisCore* analysis = cores_.analysis;
  AnalysisReads<v1::ExportWeightsRequest, v1::ExportWeightsResponse>("export", "export");
  Get(R"(/api/v1/runs/([^/]+)/export/weights\.safetensors)", "runs/{id}/export/weights.safetensors", false,
      [this, analysis](const httplib::Request& req, httplib::Response& res, const Caller& c) -> absl::Status {
        v1::ExportWeightsRequest r;
        CL_RETURN_IF_ERROR(FillRequest(req, {"run_id"}, &r));
        CL_RETURN_IF_ERROR(cores_.security->Check(c, Access::kRead, r));
        absl::StatusOr<v1::ExportWeightsResponse> out =
            analysis->Run<v1::ExportWeightsResponse>(r, scheduler::Requester(c.principal.name, true));
        if (absl::IsPermissionDenied(out.status()) || (out.ok() && out->state() != v1::ANALYSIS_STATE_DONE)) {
          return absl::NotFoundError("no export stored for " + Clip(r.run_id(), 32) +
                                     " at this step; GET /api/v1/runs/" + Clip(r.run_id(), 32) +
                                     "/export (or `circuitlab export " + Clip(r.run_id(), 32) + "`) makes one");
        }
        CL_RETURN_IF_ERROR(out.status());
        CL_ASSIGN_OR_RETURN(ResponseBudget::Lease lease,
                            ResponseBudget::Process().Acquire(static_cast<int64_t>(out->safetensors().size()),
                                                              "weights.safetensors"));
        res.set_header("Content-Disposition", "attachment; filename=\"" + out->run_id() + "-step-" +
                                                  std::to_string(out->step()) + ".safetensors\"");
        Send(res, std::make_shared<std::string>(std::move(*out->mutable_safetensors())), "application/octet-stream",
             std::move(lease));  // the budget is held until the file is sent, as for every answer
        return absl::OkStatus();
      });
}

void HttpGateway::Routes() {
  const Security& security = *cores_.security;
  scheduler::Scheduler* runs = cores_.runs;
  scheduler::SweepCore* sweeps = cores_.sweeps;
  scheduler::AnalysisCore* analysis = cores_.analysis;

  // ---- probes and metrics ----
  Get("/healthz", "healthz", true, [](const httplib::Request&, httplib::Response& res, const Caller&) {
    res.set_content("ok\n", "text/plain");
    return absl::OkStatus();
  });
  Get("/readyz", "readyz", true, [this](const httplib::Request&, httplib::Response& res, const Caller&) {
    if (!ready_) return absl::UnavailableError("draining: not taking new work");
    if (const std::string fault = cores_.runs->StorageFault(); !fault.empty()) {
      return absl::UnavailableError("checkpoints cannot be written (" + fault + ")");
    }
    res.set_content("ready\n", "text/plain");
    return absl::OkStatus();
  });
  Get("/metrics", "metrics", false, [this](const httplib::Request&, httplib::Response& res, const Caller& caller) {
    if (cores_.telemetry == nullptr) return absl::UnimplementedError("no telemetry on this server");
    // Its counts cover every user's runs: with --private-runs, for admins
    // only (issue 32 item 10).
    if (cores_.security->private_runs() && caller.principal.role != Role::kAdmin) {
      return absl::PermissionDeniedError("with --private-runs, /metrics (every user's run counts) is for admins");
    }
    res.set_content(cores_.telemetry->Scrape(), "text/plain; version=0.0.4; charset=utf-8");
    return absl::OkStatus();
  });

  // ---- the JSON API (the read RPCs) ----
  Get("/api/v1/whoami", "whoami", false, [&security](const httplib::Request&, httplib::Response& res, const Caller& c) {
    return Reply(res, security.WhoAmI(c));
  });
  Read<v1::ListRunsRequest>("/api/v1/runs", "runs", {}, [&security, runs](const auto& r, const Caller& c) {
    return runs->ListRuns(r, security.ListFilter(c, r.mine()));
  });
  Read<v1::GetRunRequest>(R"(/api/v1/runs/([^/]+))", "runs/{id}", {"run_id"},
                          [runs](const auto& r, const Caller&) { return runs->GetRun(r.run_id()); });
  Read<v1::GetMetricsRequest>(R"(/api/v1/runs/([^/]+)/metrics)", "runs/{id}/metrics", {"run_id"},
                              [runs](const auto& r, const Caller&) { return runs->GetMetrics(r); });
  Read<v1::GetTrajectoryRequest>(R"(/api/v1/runs/([^/]+)/coordinates)", "runs/{id}/coordinates", {"run_id"},
                                 [analysis](const auto& r, const Caller&) { return analysis->GetTrajectory(r); });
  // A stored LabelRun answer (never starts one: writes stay on gRPC). None
  // stored: state ANALYSIS_STATE_UNSPECIFIED and `error` says how to make one.
  Read<v1::LabelRunRequest>(R"(/api/v1/runs/([^/]+)/label)", "runs/{id}/label", {"run_id"},
                            [analysis](const auto& r, const Caller& c) -> absl::StatusOr<v1::LabelRunResponse> {
                              absl::StatusOr<v1::LabelRunResponse> out =
                                  analysis->Run<v1::LabelRunResponse>(r, scheduler::Requester(c.principal.name, true));
                              if (!absl::IsPermissionDenied(out.status())) return out;
                              v1::LabelRunResponse none;
                              none.set_error("no stored label for " + r.run_id() +
                                             " with these options; `circuitlab label " + r.run_id() + "` computes one");
                              return none;
                            });
  // Analyses (a job for a starter, stored for a reader; and /stored):
  // ?step=&eval_set=&sequences=&layers=0,1&heads=&seed= (attention), the
  // DetectCircuitRequest's fields (circuit), AnalyzeTaskVectorsRequest's
  // (task-vectors).
  AnalysisReads<v1::GetAttentionPatternsRequest, v1::GetAttentionPatternsResponse>("attention", "attention");
  AnalysisReads<v1::DetectCircuitRequest, v1::DetectCircuitResponse>("circuit", "detect");
  AnalysisReads<v1::AnalyzeTaskVectorsRequest, v1::AnalyzeTaskVectorsResponse>("task-vectors", "task-vectors");
  Get(R"(/api/v1/runs/([^/]+)/events)", "runs/{id}/events", false,
      [this](const httplib::Request& req, httplib::Response& res, const Caller& c) { return Events(req, res, c); });
  Read<v1::GetSweepRequest>(R"(/api/v1/sweeps/([^/]+))", "sweeps/{id}", {"sweep_id"},
                            [sweeps](const auto& r, const Caller&) { return sweeps->Get(r.sweep_id()); });
  // ?values=a,b&filters=...&pivot=X,Y,VALUE[,AGGREGATE] (or pivot.x=...).
  Read<v1::GetSweepSummaryRequest>(R"(/api/v1/sweeps/([^/]+)/summary)", "sweeps/{id}/summary", {"sweep_id"},
                                   [sweeps, &security](const auto& r, const Caller& c) {
                                     return security.SweepSummary(c, r, *sweeps);
                                   });
  Read<v1::ListAnalysisJobsRequest>(
      "/api/v1/analyses", "analyses", {},
      [&security, analysis](const auto&, const Caller& c) -> absl::StatusOr<v1::ListAnalysisJobsResponse> {
        return analysis->jobs().List(
            [&](const v1::AnalysisJob& job) { return MayRead(c.principal, job.owner(), security.private_runs()); });
      });
  Interventions();
  // Activations on the caller's own sequences (issue 46): a POSTed
  // GetActivationsRequest; stored answers are not listed.
  AnalysisPost<v1::GetActivationsRequest, v1::GetActivationsResponse>(R"(/api/v1/runs/([^/]+)/activations)",
                                                                     "runs/{id}/activations", "");
  Exports();
  Reproductions();
  Get(R"(/api/.*)", "api/unknown", true, [](const httplib::Request& req, httplib::Response&, const Caller&) {
    return absl::NotFoundError("no such API endpoint: " + Quote(Clip(req.path, 128)) +
                               " (the routes: docs/reference/http.md)");
  });

  // ---- the dashboard ----
  Get(R"(/([A-Za-z0-9_./-]*))", "static", true,
      [](const httplib::Request& req, httplib::Response& res, const Caller&) -> absl::Status {
        const std::string path = req.path == "/" ? "/index.html" : req.path;
        const std::optional<DashboardAsset> a = FindDashboardAsset(path);
        if (!a) return absl::NotFoundError("no such page: " + Quote(Clip(req.path, 128)));
        res.set_content(a->bytes.data(), a->bytes.size(), std::string(a->content_type));
        res.set_header("Cache-Control", "no-cache");
        res.set_header("Content-Security-Policy",
                       "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
                       "frame-ancestors 'none'");
        return absl::OkStatus();
      });
}

// A run's watch stream as Server-Sent Events:
//   id: <epoch>/<sequence>   event: snapshot|state|progress|metrics|heartbeat   data: the RunEvent as JSON
// Resumed with Last-Event-ID (or ?after_sequence=&epoch=), as WatchRun resumes.
absl::Status HttpGateway::Events(const httplib::Request& req, httplib::Response& res, const Caller& caller) {
  v1::WatchRunRequest r;
  CL_RETURN_IF_ERROR(FillRequest(req, {"run_id"}, &r));
  if (const std::string last = req.get_header_value("Last-Event-ID"); !last.empty()) {
    const size_t slash = last.rfind('/');
    uint64_t seq = 0;
    if (!absl::SimpleAtoi(slash == std::string::npos ? last : last.substr(slash + 1), &seq)) {
      return absl::InvalidArgumentError("Last-Event-ID must be EPOCH/SEQUENCE as sent in an event's id, got " +
                                        Quote(Clip(last, 64)));
    }
    r.set_after_sequence(seq);
    r.set_epoch(slash == std::string::npos ? cores_.runs->hub().epoch() : last.substr(0, slash));
  }
  CL_RETURN_IF_ERROR(cores_.security->Check(caller, Access::kRead, r));
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    if (stopping_) return absl::UnavailableError("the server is stopping");
    if (open_streams_ >= options_.max_streams) {
      return absl::UnavailableError(
          "too many open event streams (--http-max-streams=" + std::to_string(options_.max_streams) + "); retry later");
    }
    ++open_streams_;
  }
  auto release_slot = [this] {
    std::lock_guard<std::mutex> lock(streams_mu_);
    --open_streams_;
  };
  absl::StatusOr<scheduler::Watch> watch = cores_.runs->StartWatch(r, caller.principal.name);
  if (!watch.ok()) {
    release_slot();
    return watch.status();
  }
  auto st = std::make_shared<Stream>();
  st->watch = std::move(*watch);
  st->ticket = cores_.security->OpenStream(caller, [sub = st->watch.subscriber] {
    if (std::function<void()> wake = sub->Close()) wake();
  });
  if (cores_.telemetry) cores_.telemetry->EventStreams(+1);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, st](size_t, httplib::DataSink& sink) -> bool {
        auto send = [&](const v1::RunEvent& e) {
          absl::StatusOr<std::string> json = ToJson(e);
          if (!json.ok()) return false;
          const std::string frame = "id: " + e.epoch() + "/" + std::to_string(e.sequence()) +
                                    "\nevent: " + EventKind(e) + "\ndata: " + *json + "\n\n";
          return sink.write(frame.data(), frame.size());
        };
        for (int sent = 0; sent < 256; ++sent) {
          scheduler::Subscriber::Item item = st->watch.subscriber->Next();
          switch (item.kind) {
            case scheduler::Subscriber::Kind::kEvent:
              if (!send(item.event)) return false;
              if (item.event.has_state() && scheduler::IsFinal(item.event.state().state())) {
                sink.done();
                return true;
              }
              continue;
            case scheduler::Subscriber::Kind::kResync: {
              absl::StatusOr<v1::RunEvent> snap =
                  cores_.runs->Snapshot(st->watch.run_id, item.sequence, /*resync=*/st->sent_any);
              if (!snap.ok() || !send(*snap)) return false;
              st->sent_any = true;
              if (scheduler::IsFinal(snap->snapshot().state())) {
                sink.done();
                return true;
              }
              continue;
            }
            case scheduler::Subscriber::Kind::kEnd:
              sink.done();
              return true;
            case scheduler::Subscriber::Kind::kNone:
              break;
          }
          std::weak_ptr<Stream> weak = st;
          if (!st->watch.subscriber->Arm([weak] {
                if (auto s = weak.lock()) {
                  std::lock_guard<std::mutex> lock(s->mu);
                  s->notified = true;
                  s->cv.notify_all();
                }
              })) {
            continue;  // something arrived meanwhile
          }
          // Wait for the hub (its heartbeats come every few seconds) or the shutdown.
          std::unique_lock<std::mutex> lock(st->mu);
          st->cv.wait_for(lock, std::chrono::milliseconds(500), [&] { return st->notified; });
          st->notified = false;
          lock.unlock();
          {
            std::lock_guard<std::mutex> stop(streams_mu_);
            if (stopping_) {
              sink.done();
              return true;
            }
          }
          return sink.is_writable();
        }
        return true;
      },
      [this, st, release_slot](bool) {
        cores_.runs->StopWatch(st->watch);
        if (cores_.telemetry) cores_.telemetry->EventStreams(-1);
        release_slot();
      });
  return absl::OkStatus();
}

}  // namespace circuitlab::http
