// The HTTP front end (cpp-httplib), beside gRPC on its own port:
//
//   /                          the dashboard (static files compiled into the binary)
//   /api/v1/...                read-only JSON: the read RPCs through protobuf's JSON mapping
//   /api/v1/runs/{id}/events   Server-Sent Events: a run's watch stream
//   /metrics                   Prometheus text format (telemetry.h)
//   /healthz, /readyz          liveness; readiness (503 once the server drains)
//
// It calls the same cores as the gRPC handlers, through the same Security
// (tokens as "Authorization: Bearer", the same access rules); it implements no
// query of its own. Writes stay on gRPC. Query parameters fill the request
// message by field name (reflection): an unknown parameter or a value that
// does not parse is 400 naming it. TLS uses the gRPC port's certificate and
// key (and client CA). /healthz, /readyz and the static files answer without
// a token; everything else needs one whenever the server has tokens.
//
// Threads and slow clients (issues 32 and 51): each connection is served on
// one of `threads` pooled threads (event streams included); at most
// `max_streams` streams are open at once (503 beyond, with Retry-After). A
// client must send each piece of its request within kReadTimeout, and the
// whole request within `request_deadline` (else 408 and the connection is
// closed: a client that drips its headers holds a thread for seconds, not
// for as long as it likes). One address has at most `max_per_peer`
// connections (those still sending their headers or waiting for a thread
// count, connection_guard.h) and requests in progress (429 beyond); never
// more than half the threads, so one address cannot hold the pool. A
// declared body larger than kMaxBody is refused (413) before it is read.
// What is turned away is counted (circuitlab_http_rejected_total{reason}).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "server/http/connection_guard.h"
#include "server/reproduce/reproductions.h"
#include "server/scheduler/analysis_core.h"
#include "server/scheduler/scheduler.h"
#include "server/scheduler/sweeps.h"
#include "server/security/security.h"
#include "server/security/tls.h"
#include "server/telemetry/telemetry.h"

namespace httplib {
class DataSink;
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace circuitlab::http {

struct HttpOptions {
  std::string listen;    // host:port (port 0 picks one); empty = no HTTP port (--http's default: 127.0.0.1:8080)
  int threads = 256;     // connections served at once, each on a pooled thread, in [1, 4096]
  int max_streams = 16;  // open event streams, in [0, 1024]
  // Connections and requests in progress from one address (429 beyond), in
  // [1, 4096]; at most half of `threads` apply.
  int max_per_peer = 32;
  // How long one request may take to arrive whole (headers and body), at any pace.
  std::chrono::milliseconds request_deadline{10000};
  // False: an address that cannot be bound leaves the server without an HTTP
  // port (a warning) instead of failing its start (the default --http).
  bool required = true;
};

struct HttpCores {
  const security::Security* security = nullptr;
  scheduler::Scheduler* runs = nullptr;
  scheduler::SweepCore* sweeps = nullptr;
  scheduler::AnalysisCore* analysis = nullptr;
  telemetry::Telemetry* telemetry = nullptr;
  reproduce::ReproductionCore* reproductions = nullptr;  // null: no /api/v1/reproductions
};

class HttpGateway {
 public:
  // Binds and serves on a thread. InvalidArgument for out-of-range options or
  // TLS files that do not load, Unavailable when the address cannot be
  // bound. The cores must outlive the gateway. `tls` empty = plaintext.
  static absl::StatusOr<std::unique_ptr<HttpGateway>> Start(const HttpOptions& options, const security::TlsFiles& tls,
                                                            HttpCores cores);
  ~HttpGateway();  // Shutdown()

  int port() const { return port_; }
  // "http://127.0.0.1:8080/" (https with TLS; a wildcard host reads as the
  // machine's name).
  const std::string& url() const { return url_; }
  // /readyz answers 503 from now on.
  void MarkNotReady() { ready_ = false; }
  // Ends the event streams, stops accepting, joins the server thread.
  void Shutdown();

 private:
  struct Stream;
  HttpGateway(HttpOptions options, HttpCores cores);
  // The routes, by resource: Routes (http_gateway.cc: probes, /metrics, the
  // dashboard) calls RunRoutes (routes_runs.cc), AnalysisRoutes
  // (routes_analyses.cc, which calls TableRoutes, routes_jobs.cc) and SweepRoutes (routes_sweeps.cc: sweeps and
  // reproductions); routes.h has the templates they share.
  void Routes();
  void RunRoutes();
  void AnalysisRoutes();
  void SweepRoutes();
  // Wraps a handler: authentication (unless `open`), errors as JSON, telemetry.
  using Handler = std::function<absl::Status(const httplib::Request&, httplib::Response&, const security::Caller&)>;
  void Get(const std::string& pattern, const std::string& route, bool open, Handler handler);
  void Post(const std::string& pattern, const std::string& route, Handler handler);
  // `handler` behind authentication (unless `open`), errors as JSON, the security headers, telemetry.
  std::function<void(const httplib::Request&, httplib::Response&)> Wrap(const std::string& route, bool open,
                                                                        Handler handler);
  void Interventions();
  // GET /api/v1/runs/{id}/export (ExportWeights as JSON) and
  // .../export/weights.safetensors (the stored file, raw).
  void Exports();
  // An analysis whose request does not fit a query string (nested messages:
  // an InterveneRequest's prompts, GetActivations' sequences), POSTed as
  // JSON: `request` the type's default instance, `stored` where a reader
  // finds stored answers instead (for the refusal's message). routes_jobs.cc.
  void AnalysisPost(const std::string& pattern, const std::string& route, const std::string& stored,
                    const google::protobuf::Message& request);
  // GET /api/v1/recipes, /api/v1/reproductions[?mine=], /api/v1/reproductions/{id}.
  void Reproductions();
  // A JSON read: `fn(request, caller)` answers absl::StatusOr<a message>.
  template <typename Req, typename Fn>
  void Read(const std::string& pattern, const std::string& route, std::vector<std::string> path_fields, Fn fn);
  // An analysis of a run as two reads: /api/v1/runs/{id}/`name` answers as
  // the RPC does (a job for a caller who may start analyses: QUEUED/RUNNING
  // with job_id and progress, ask again; the stored answer for a reader),
  // and .../`name`/stored only a stored answer, never starting one (none:
  // state ANALYSIS_STATE_UNSPECIFIED, `error` saying how to compute one;
  // `verb` is the CLI's, "" for none). `request`: the type's default
  // instance (an analysis table entry's). routes_jobs.cc.
  void AnalysisReads(const std::string& name, const std::string& verb, const google::protobuf::Message& request);
  // Every analysis table entry with a run_id under
  // /api/v1/runs/{id}/analyses/{name}: the two reads and the POST.
  void TableRoutes();
  absl::Status Events(const httplib::Request& req, httplib::Response& res, const security::Caller& caller);
  bool PumpEvents(const std::shared_ptr<Stream>& st, httplib::DataSink& sink);

  const HttpOptions options_;
  const HttpCores cores_;
  std::unique_ptr<httplib::Server> server_;
  std::unique_ptr<ConnectionGuard> guard_;  // from the port's binding until Shutdown
  std::thread thread_;
  int port_ = 0;
  bool tls_ = false;
  std::string url_;
  std::atomic<bool> ready_{true};
  // Event streams: how many are open; `stopping_` ends them.
  std::mutex streams_mu_;
  int open_streams_ = 0;
  bool stopping_ = false;
  // Requests in progress by remote address (under streams_mu_).
  std::map<std::string, int> per_peer_;
  // Before routing: refuses oversized bodies and busy peers; else counts the
  // request for its peer until `Done`.
  bool Admit(const httplib::Request& req, httplib::Response& res);
  void Done(const httplib::Request& req);
};

}  // namespace circuitlab::http
