// The server's Prometheus metrics, served as text on the HTTP front end's
// /metrics (prometheus-cpp's core: a registry and its TextSerializer; no
// second web server).
//
// Two kinds of series:
//   - counted as things happen: gRPC calls by service, method and code (the
//     gRPC front's interceptor calls ObserveRpc, so every handler is covered
//     without touching it), unary latency, HTTP requests by route and status, open HTTP event
//     streams;
//   - read from the cores at scrape time: runs by state (one GROUP BY), the
//     queue depth, runs finished by result since start, analysis jobs by
//     state, open watch streams, connected workers, the store writer's commit
//     latency and the metric points / coordinate values it committed (the
//     store is read through the scheduler, never directly).
// Names are prefixed circuitlab_, in base units, counters end in _total, and
// no label carries an unbounded value (never a run id).
//
// Thread-safety: all methods are thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "server/scheduler/analysis_jobs.h"
#include "server/scheduler/scheduler.h"
#include "server/remote/workers.h"

namespace prometheus {
class Registry;
template <typename T>
class Family;
class Counter;
class Histogram;
}  // namespace prometheus

namespace circuitlab::telemetry {

struct TelemetrySources {
  scheduler::Scheduler* runs = nullptr;        // required
  scheduler::AnalysisJobs* jobs = nullptr;     // required
  remote::WorkerBroker* workers = nullptr;  // null without a remote executor
  std::string version;
  std::string executor = "local";
};

class Telemetry {
 public:
  explicit Telemetry(TelemetrySources sources);
  ~Telemetry();

  // One gRPC call ended ("/circuitlab.v1.ExperimentService/GetRun").
  void ObserveRpc(const std::string& full_method, int code, double seconds, bool unary);
  // One HTTP request answered; `route` is the route pattern, never the path.
  void ObserveHttp(const std::string& route, int status, double seconds);
  // A request the HTTP port turned away before routing it (issue 32 item 1):
  // reason "body_too_large" or "peer_limit".
  void HttpRejected(const std::string& reason);
  // Open HTTP event streams (the gateway adds and removes).
  void EventStreams(int delta) { event_streams_ += delta; }

  // Everything, in the Prometheus text exposition format 0.0.4.
  std::string Scrape();

 private:
  const TelemetrySources sources_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* rpc_requests_ = nullptr;
  prometheus::Family<prometheus::Histogram>* rpc_seconds_ = nullptr;
  prometheus::Family<prometheus::Counter>* http_requests_ = nullptr;
  prometheus::Family<prometheus::Counter>* http_rejected_ = nullptr;
  prometheus::Family<prometheus::Histogram>* http_seconds_ = nullptr;
  std::atomic<int> event_streams_{0};
  std::mutex scrape_mu_;  // one scrape at a time
};

}  // namespace circuitlab::telemetry
