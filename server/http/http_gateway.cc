#include "server/http/http_gateway.h"

#include <httplib.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <vector>

#include "absl/strings/numbers.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/http/dashboard_assets.h"
#include "server/http/http_wire.h"

namespace circuitlab::http {

using security::Caller;
using security::Role;
using security::Security;
using security::TlsFiles;

namespace {

// The largest request body read (the API's writes are small JSON).
constexpr uint64_t kMaxBody = 64 << 10;
// How long a client may pause within its request (each read).
constexpr std::chrono::seconds kReadTimeout{2};
// Admit counted this thread's request for its peer (the pre-routing handler,
// the handler, the response and the logger run on one thread).
thread_local bool tls_counted = false;

std::string Hostname() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

}  // namespace

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
      ConnectionGuard::Options{g->port_, effective.max_per_peer, effective.request_deadline,
                               std::chrono::milliseconds(250), g->tls_},
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
      absl::StatusOr<Caller> c = cores_.security->Authenticate(
          req.get_header_value("Authorization"), "http:" + req.remote_addr + ":" + std::to_string(req.remote_port),
          tls_, "http");
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

void HttpGateway::Routes() {
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

  // ---- the JSON API (the read RPCs), by resource ----
  RunRoutes();       // routes_runs.cc
  AnalysisRoutes();  // routes_analyses.cc
  SweepRoutes();     // routes_sweeps.cc
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

}  // namespace circuitlab::http
