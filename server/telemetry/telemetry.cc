#include "server/telemetry/telemetry.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <chrono>
#include <map>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "circuitlab/v1/analysis_service.pb.h"
#include "circuitlab/v1/experiment_service.pb.h"

namespace circuitlab::telemetry {
namespace {

const prometheus::Histogram::BucketBoundaries kLatencyBuckets = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                                 0.05,   0.1,   0.25,   0.5,   1,    2.5};

// "RUN_STATE_SUCCEEDED" -> "succeeded".
std::string Lower(std::string_view enum_name, std::string_view prefix) {
  if (enum_name.substr(0, prefix.size()) == prefix) enum_name.remove_prefix(prefix.size());
  return absl::AsciiStrToLower(std::string(enum_name));
}

// A family read at scrape time.
struct Pulled {
  prometheus::MetricFamily family;
  Pulled(std::string name, std::string help, prometheus::MetricType type) {
    family.name = std::move(name);
    family.help = std::move(help);
    family.type = type;
  }
  prometheus::ClientMetric& Add(std::vector<prometheus::ClientMetric::Label> labels = {}) {
    family.metric.emplace_back();
    family.metric.back().label = std::move(labels);
    return family.metric.back();
  }
  void Gauge(double v, std::vector<prometheus::ClientMetric::Label> labels = {}) {
    Add(std::move(labels)).gauge.value = v;
  }
  void Counter(double v, std::vector<prometheus::ClientMetric::Label> labels = {}) {
    Add(std::move(labels)).counter.value = v;
  }
};

// "/circuitlab.v1.ExperimentService/GetRun" -> ("circuitlab.v1.ExperimentService", "GetRun"); anything
// else (it cannot reach a handler) is ("other", "other"), so a caller cannot mint label values.
std::pair<std::string, std::string> SplitMethod(const std::string& full) {
  const size_t slash = full.find('/', 1);
  const bool ours = full.rfind("/circuitlab.v1.", 0) == 0 || full.rfind("/grpc.", 0) == 0;
  if (!ours || slash == std::string::npos || full.size() > 128) return {"other", "other"};
  return {full.substr(1, slash - 1), full.substr(slash + 1)};
}

}  // namespace

Telemetry::Telemetry(TelemetrySources sources)
    : sources_(std::move(sources)), registry_(std::make_shared<prometheus::Registry>()) {
  rpc_requests_ = &prometheus::BuildCounter()
                       .Name("circuitlab_rpc_requests_total")
                       .Help("gRPC calls answered, by service, method and status code")
                       .Register(*registry_);
  rpc_seconds_ = &prometheus::BuildHistogram()
                      .Name("circuitlab_rpc_duration_seconds")
                      .Help("Time from a unary gRPC call's arrival to its status, by service and method")
                      .Register(*registry_);
  http_requests_ = &prometheus::BuildCounter()
                        .Name("circuitlab_http_requests_total")
                        .Help("HTTP requests answered, by route pattern and status code")
                        .Register(*registry_);
  http_rejected_ = &prometheus::BuildCounter()
                        .Name("circuitlab_http_rejected_total")
                        .Help("HTTP requests turned away before routing, by reason (body_too_large, peer_limit)")
                        .Register(*registry_);
  http_seconds_ = &prometheus::BuildHistogram()
                       .Name("circuitlab_http_request_duration_seconds")
                       .Help("Time to answer an HTTP request (event streams excluded), by route pattern")
                       .Register(*registry_);
}

Telemetry::~Telemetry() = default;

void Telemetry::ObserveRpc(const std::string& full_method, int code, double seconds, bool unary) {
  const auto [service, method] = SplitMethod(full_method);
  rpc_requests_
      ->Add({{"service", service},
             {"method", method},
             {"code", absl::StatusCodeToString(static_cast<absl::StatusCode>(code))}})
      .Increment();
  if (unary) rpc_seconds_->Add({{"service", service}, {"method", method}}, kLatencyBuckets).Observe(seconds);
}

void Telemetry::ObserveHttp(const std::string& route, int status, double seconds) {
  http_requests_->Add({{"route", route}, {"code", std::to_string(status)}}).Increment();
  if (seconds >= 0) http_seconds_->Add({{"route", route}}, kLatencyBuckets).Observe(seconds);
}

void Telemetry::HttpRejected(const std::string& reason) { http_rejected_->Add({{"reason", reason}}).Increment(); }

std::string Telemetry::Scrape() {
  std::lock_guard<std::mutex> lock(scrape_mu_);
  std::vector<prometheus::MetricFamily> families = registry_->Collect();

  Pulled build("circuitlab_build_info", "The server's version and executor (always 1)", prometheus::MetricType::Gauge);
  build.Gauge(1, {{"executor", sources_.executor}, {"version", sources_.version}});

  Pulled runs("circuitlab_runs", "Stored runs by state", prometheus::MetricType::Gauge);
  absl::StatusOr<std::map<int, int64_t>> by_state = sources_.runs->CountRunsByState();
  for (int s = v1::RUN_STATE_QUEUED; s <= v1::RUN_STATE_CANCELLED; ++s) {
    const int64_t n = by_state.ok() && by_state->count(s) ? by_state->at(s) : 0;
    runs.Gauge(static_cast<double>(n), {{"state", Lower(v1::RunState_Name(s), "RUN_STATE_")}});
  }
  Pulled queue("circuitlab_queue_depth", "Runs waiting for a slot", prometheus::MetricType::Gauge);
  queue.Gauge(sources_.runs->QueuedRuns());

  Pulled finished("circuitlab_runs_finished_total", "Runs that reached a final state since the server started",
                  prometheus::MetricType::Counter);
  const std::map<int, uint64_t> ended = sources_.runs->FinishedRuns();
  for (int s : {v1::RUN_STATE_SUCCEEDED, v1::RUN_STATE_FAILED, v1::RUN_STATE_CANCELLED}) {
    finished.Counter(static_cast<double>(ended.count(s) ? ended.at(s) : 0),
                     {{"result", Lower(v1::RunState_Name(s), "RUN_STATE_")}});
  }

  Pulled jobs("circuitlab_analysis_jobs", "Analysis jobs known to the executor, by state",
              prometheus::MetricType::Gauge);
  std::map<int, int> job_states;
  const v1::ListAnalysisJobsResponse listed = sources_.jobs->List();
  for (const v1::AnalysisJob& j : listed.jobs()) ++job_states[j.state()];
  for (int s = v1::ANALYSIS_STATE_QUEUED; s <= v1::ANALYSIS_STATE_CANCELLED; ++s) {
    if (s == v1::ANALYSIS_STATE_DONE) continue;  // done jobs are answered and forgotten
    jobs.Gauge(job_states[s], {{"state", Lower(v1::AnalysisState_Name(s), "ANALYSIS_STATE_")}});
  }

  Pulled watches("circuitlab_watch_streams", "Open WatchRun streams (gRPC)", prometheus::MetricType::Gauge);
  watches.Gauge(sources_.runs->OpenWatches());
  Pulled streams("circuitlab_http_event_streams", "Open run event streams (HTTP Server-Sent Events)",
                 prometheus::MetricType::Gauge);
  streams.Gauge(event_streams_.load());

  Pulled workers("circuitlab_workers", "Connected circuitlab-worker sessions and their slots",
                 prometheus::MetricType::Gauge);
  if (sources_.workers != nullptr) {
    workers.Gauge(static_cast<double>(sources_.workers->Workers().size()), {{"kind", "sessions"}});
    workers.Gauge(sources_.workers->TotalSlots(), {{"kind", "slots"}});
    workers.Gauge(sources_.workers->BusySlots(), {{"kind", "busy_slots"}});
  }

  const store::Store::WriteStats w = sources_.runs->StoreWriteStats();
  Pulled commit("circuitlab_sqlite_commit_duration_seconds",
                "Time the store's single writer takes to commit one batch of writes",
                prometheus::MetricType::Histogram);
  prometheus::ClientMetric& h = commit.Add();
  uint64_t cumulative = 0;
  for (size_t i = 0; i < w.commit_buckets.size(); ++i) {
    cumulative += w.commit_buckets[i];
    const double bound = i < std::size(store::Store::kCommitBuckets) ? store::Store::kCommitBuckets[i]
                                                                     : std::numeric_limits<double>::infinity();
    h.histogram.bucket.push_back({cumulative, bound});
  }
  h.histogram.sample_count = w.commits;
  h.histogram.sample_sum = w.commit_seconds;
  Pulled points("circuitlab_metric_points_ingested_total", "Metric points committed to the store",
                prometheus::MetricType::Counter);
  points.Counter(static_cast<double>(w.metric_points));
  Pulled coords("circuitlab_coordinate_values_ingested_total", "IMIR coordinate values committed to the store",
                prometheus::MetricType::Counter);
  coords.Counter(static_cast<double>(w.coordinate_values));

  for (Pulled* p : {&build, &runs, &queue, &finished, &jobs, &watches, &streams, &workers, &commit, &points, &coords}) {
    if (!p->family.metric.empty()) families.push_back(std::move(p->family));
  }
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace circuitlab::telemetry
