// A run's routes: the run, its metrics, coordinates and label, and its
// watch stream as Server-Sent Events.
#include <httplib.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/http/http_gateway.h"
#include "server/http/http_wire.h"
#include "server/http/routes.h"

namespace circuitlab::http {

using security::Access;
using security::Caller;
using security::Security;
namespace {

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

}  // namespace

void HttpGateway::RunRoutes() {
  const Security& security = *cores_.security;
  scheduler::Scheduler* runs = cores_.runs;
  scheduler::AnalysisCore* analysis = cores_.analysis;
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
  Get(R"(/api/v1/runs/([^/]+)/events)", "runs/{id}/events", false,
      [this](const httplib::Request& req, httplib::Response& res, const Caller& c) { return Events(req, res, c); });
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
      "text/event-stream", [this, st](size_t, httplib::DataSink& sink) { return PumpEvents(st, sink); },
      [this, st, release_slot](bool) {
        cores_.runs->StopWatch(st->watch);
        if (cores_.telemetry) cores_.telemetry->EventStreams(-1);
        release_slot();
      });
  return absl::OkStatus();
}

// Sends what the run's watch has (at most 256 events a call), then waits up
// to 500 ms for more; false ends the stream (the client left or a send
// failed), sink.done() when the run ended or the server stops.
bool HttpGateway::PumpEvents(const std::shared_ptr<Stream>& st, httplib::DataSink& sink) {
  auto send = [&](const v1::RunEvent& e) {
    absl::StatusOr<std::string> json = ToJson(e);
    if (!json.ok()) return false;
    const std::string frame = "id: " + e.epoch() + "/" + std::to_string(e.sequence()) + "\nevent: " + EventKind(e) +
                              "\ndata: " + *json + "\n\n";
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
}

}  // namespace circuitlab::http
