#include "server/remote/workers.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/engine/spec.h"
#include "server/remote/broker_state.h"

namespace circuitlab::remote {
namespace {

absl::Status CheckText(const std::string& value, const char* field) {
  if (value.size() > kMaxField) {
    return absl::InvalidArgumentError(std::string("register.") + field + " must be at most " +
                                      std::to_string(kMaxField) + " bytes, got " + std::to_string(value.size()));
  }
  if (HasControl(value)) {
    return absl::InvalidArgumentError(std::string("register.") + field + " must hold no control characters, got " +
                                      Quote(value));
  }
  return absl::OkStatus();
}


// What a worker reports about a member whose run has `total` steps: steps
// within the run, metric names printable and short (issue 32 item 4). An
// error ends the worker's session as a protocol violation.
absl::Status CheckReport(const v1::Report& r, uint64_t total, const std::string& lease) {
  auto step = [&](uint64_t s, const char* what) -> absl::Status {
    if (s > total) {
      return absl::InvalidArgumentError(lease + ": a " + std::string(what) + " report at step " + std::to_string(s) +
                                        " of a run of " + std::to_string(total) + " steps");
    }
    return absl::OkStatus();
  };
  switch (r.kind_case()) {
    case v1::Report::kProgress:
      return step(r.progress().step(), "progress");
    case v1::Report::kCheckpoint:
      return step(r.checkpoint().step(), "checkpoint");
    case v1::Report::kCoordinates:
      return step(r.coordinates().step(), "coordinates");
    case v1::Report::kMetrics:
      for (const v1::ReportMetric& m : r.metrics().metrics()) {
        CL_RETURN_IF_ERROR(step(m.step(), "metrics"));
        if (m.name().empty() || m.name().size() > kMaxField || HasControl(m.name())) {
          return absl::InvalidArgumentError(lease + ": a metric name must be 1 to " + std::to_string(kMaxField) +
                                            " printable bytes, got " + Quote(m.name()));
        }
      }
      return absl::OkStatus();
    case v1::Report::kBasis:
      for (const v1::ReportCoordinateDef& d : r.basis().coords()) {
        for (const std::string* text : {&d.label(), &d.canonical(), &d.matrix(), &d.element()}) {
          if (text->size() > kMaxField || HasControl(*text)) {
            return absl::InvalidArgumentError(lease + ": a basis coordinate's names must be at most " +
                                              std::to_string(kMaxField) + " printable bytes, got " + Quote(*text));
          }
        }
      }
      return absl::OkStatus();
    default:
      return absl::OkStatus();
  }
}

}  // namespace

WorkerBroker::WorkerBroker(BrokerOptions options, engine::Executor* local, Clock* clock)
    : options_(std::move(options)), local_(local), clock_(clock) {
  watchdog_ = std::thread([this] { Watchdog(); });
}

WorkerBroker::~WorkerBroker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  watchdog_.join();
}

void WorkerBroker::SetWake(std::function<void()> wake) {
  std::lock_guard<std::mutex> lock(mu_);
  wake_ = std::move(wake);
}

void WorkerBroker::WakeScheduler() {
  std::function<void()> wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    wake = wake_;
  }
  if (wake) wake();
}

absl::StatusOr<uint64_t> WorkerBroker::Open(std::shared_ptr<WorkerLink> link, const v1::Register& reg,
                                            const std::string& principal, const std::string& peer) {
  if (reg.slots() < 1 || reg.slots() > kMaxSlots) {
    return absl::InvalidArgumentError("register.slots must be in [1, " + std::to_string(kMaxSlots) + "], got " +
                                      std::to_string(reg.slots()));
  }
  for (auto [value, field] : {std::pair{&reg.host(), "host"},
                              {&reg.engine_job(), "engine_job"},
                              {&reg.device(), "device"},
                              {&reg.version(), "version"}}) {
    if (absl::Status s = CheckText(*value, field); !s.ok()) return s;
  }
  if (reg.device() != "cpu" && reg.device().rfind("cuda:", 0) != 0) {
    return absl::InvalidArgumentError("register.device must be \"cpu\" or \"cuda:N\", got " + Quote(reg.device()));
  }
  if (reg.version() != options_.version) {
    return absl::FailedPreconditionError("this worker is circuitlab " + Quote(reg.version()) + " but the server is " +
                                         Quote(options_.version) + "; run the server's circuitlab-worker");
  }
  uint64_t id = 0;
  v1::ServerMessage answer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return absl::UnavailableError("the server is shutting down");
    if (static_cast<int>(sessions_.size()) >= options_.max_workers) {
      return absl::ResourceExhaustedError("this server has " + std::to_string(sessions_.size()) +
                                          " workers connected (limit " + std::to_string(options_.max_workers) + ")");
    }
    if (std::string why = QuarantinedLocked(principal); !why.empty()) return absl::ResourceExhaustedError(why);
    int sessions = 0, slots = 0;
    for (const auto& [sid, s] : sessions_) {
      if (s->closed || s->info.principal != principal) continue;
      ++sessions;
      slots += s->info.slots;
    }
    if (sessions >= options_.max_sessions_per_principal) {
      return absl::ResourceExhaustedError("'" + EscapeControl(principal) + "' has " + std::to_string(sessions) +
                                          " worker sessions connected (--max-worker-sessions-per-principal " +
                                          std::to_string(options_.max_sessions_per_principal) + ")");
    }
    if (slots + static_cast<int>(reg.slots()) > options_.max_slots_per_principal) {
      return absl::ResourceExhaustedError("'" + EscapeControl(principal) + "' has " + std::to_string(slots) +
                                          " worker slots; " + std::to_string(reg.slots()) + " more would exceed " +
                                          "--max-worker-slots-per-principal " +
                                          std::to_string(options_.max_slots_per_principal));
    }
    id = next_session_++;
    auto s = std::make_shared<Session>();
    s->id = id;
    s->link = link;
    s->info.id = "w" + std::to_string(id);
    s->info.principal = principal;
    s->info.host = reg.host().empty() ? "?" : reg.host();
    s->info.engine_job = reg.engine_job();
    s->info.device = reg.device();
    s->info.peer = peer;
    s->info.slots = static_cast<int>(reg.slots());
    s->info.connected_at_us = clock_->NowMicros();
    s->last_seen = clock_->MonotonicSeconds();
    answer.mutable_registered()->set_worker_id(s->info.id);
    spdlog::info("worker {} connected: {} ({} slot(s), {}), principal {}, peer {}", s->info.id,
                 EscapeControl(s->Where()), s->info.slots, EscapeControl(s->info.device), EscapeControl(principal),
                 peer);
    sessions_[id] = std::move(s);
  }
  answer.mutable_registered()->set_heartbeat_seconds(
      static_cast<uint32_t>(std::max<int64_t>(1, options_.heartbeat.count() / 1000)));
  answer.mutable_registered()->set_max_message_bytes(static_cast<uint32_t>(options_.max_message_bytes));
  answer.mutable_registered()->set_lease_timeout_seconds(
      static_cast<uint32_t>(std::max<int64_t>(1, options_.lease_timeout.count() / 1000)));
  link->Send(std::move(answer));
  cv_.notify_all();
  WakeScheduler();
  return id;
}

absl::Status WorkerBroker::OnMessage(uint64_t session, const v1::WorkerMessage& message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(session);
    if (it == sessions_.end() || it->second->closed) return absl::FailedPreconditionError("the session has ended");
    Session& s = *it->second;
    s.last_seen = clock_->MonotonicSeconds();
    uint64_t lease_id = 0, sequence = 0;
    uint32_t member = 0;
    switch (message.kind_case()) {
      case v1::WorkerMessage::kHeartbeat:
        return absl::OkStatus();
      case v1::WorkerMessage::kDrain:
        if (!s.info.draining) spdlog::info("worker {} drains (preempted or stopping)", s.info.id);
        s.info.draining = true;
        return absl::OkStatus();
      case v1::WorkerMessage::kRegister:
        return absl::InvalidArgumentError("register may only be the first message of a session");
      case v1::WorkerMessage::kReport:
        lease_id = message.report().lease_id();
        sequence = message.report().sequence();
        member = message.report().member();
        break;
      case v1::WorkerMessage::kLeaseEnd:
        lease_id = message.lease_end().lease_id();
        sequence = message.lease_end().sequence();
        break;
      default:
        return absl::InvalidArgumentError("an empty worker message");
    }
    auto l = leases_.find(lease_id);
    if (l == leases_.end() || l->second->lost) {
      return absl::OkStatus();  // a late message of a lease already given up
    }
    Lease& lease = *l->second;
    if (lease.session != session) {
      return absl::PermissionDeniedError(LeaseName(lease_id) + " was not given to this worker");
    }
    if (member >= lease.members) {
      return absl::InvalidArgumentError("report.member " + std::to_string(member) + " is out of range for " +
                                        LeaseName(lease_id) + " (" + std::to_string(lease.members) + " member(s))");
    }
    if (message.has_lease_end() && message.lease_end().members_size() != static_cast<int>(lease.members)) {
      return absl::InvalidArgumentError("lease_end must give one end per member (" + std::to_string(lease.members) +
                                        "), got " + std::to_string(message.lease_end().members_size()));
    }
    if (sequence < lease.next_sequence) return absl::OkStatus();  // a resend: already applied
    if (sequence > lease.next_sequence) {
      return absl::InvalidArgumentError(LeaseName(lease_id) + ": sequence " + std::to_string(sequence) +
                                        " arrived while " + std::to_string(lease.next_sequence) + " was expected");
    }
    if (message.has_report()) {
      CL_RETURN_IF_ERROR(CheckReport(message.report(), lease.total_steps[member], LeaseName(lease_id)));
      ++lease.reports;
    }
    ++lease.next_sequence;
    lease.inbox.push_back(message);
  }
  cv_.notify_all();
  return absl::OkStatus();
}

void WorkerBroker::LoseLocked(Session& s, const absl::Status& why) {
  s.closed = true;
  const double now = clock_->MonotonicSeconds();
  const double window = static_cast<double>(options_.quarantine.count());
  std::deque<double>& faults = faults_[s.info.principal];
  for (uint64_t id : s.leases) {
    auto l = leases_.find(id);
    if (l == leases_.end()) continue;
    Lease& lease = *l->second;
    lease.lost = true;
    lease.lost_why = why;
    // Silent past the lease timeout, or gone before reporting anything on the
    // lease: the worker's fault, not the run's (issue 32 item 3).
    lease.worker_at_fault = lease.blamed || absl::IsDeadlineExceeded(why) || lease.reports == 0;
    if (lease.worker_at_fault) faults.push_back(now);
  }
  while (!faults.empty() && faults.front() < now - window) faults.pop_front();
  if (static_cast<int>(faults.size()) >= options_.quarantine_after && !quarantined_until_.count(s.info.principal)) {
    quarantined_until_[s.info.principal] = now + window;
    spdlog::warn("worker principal '{}' quarantined for {} s: its workers lost {} leases through their own fault",
                 EscapeControl(s.info.principal), options_.quarantine.count(), faults.size());
  }
  if (faults.empty()) faults_.erase(s.info.principal);
}

std::string WorkerBroker::QuarantinedLocked(const std::string& principal) {
  auto it = quarantined_until_.find(principal);
  if (it == quarantined_until_.end()) return "";
  const double left = it->second - clock_->MonotonicSeconds();
  if (left <= 0) {
    quarantined_until_.erase(it);
    faults_.erase(principal);
    return "";
  }
  return "worker principal '" + EscapeControl(principal) + "' is quarantined for " +
         std::to_string(static_cast<int>(left) + 1) + " s more: its workers lost " +
         std::to_string(options_.quarantine_after) + " leases by going silent or away without reporting";
}

void WorkerBroker::Closed(uint64_t session, const absl::Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(session);
    if (it == sessions_.end()) return;
    Session& s = *it->second;
    if (!s.leases.empty() || !why.ok()) {
      spdlog::warn(
          "worker {} ({}) disconnected{}{}", s.info.id, EscapeControl(s.Where()),
          why.ok() ? "" : ": " + std::string(why.message()),
          s.leases.empty() ? "" : "; its " + std::to_string(s.leases.size()) + " lease(s) go back to the queue");
    } else {
      spdlog::info("worker {} left", s.info.id);
    }
    LoseLocked(s, why.ok() ? absl::UnavailableError("the worker left") : why);
    sessions_.erase(it);
  }
  cv_.notify_all();
  WakeScheduler();
}

void WorkerBroker::Watchdog() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, std::chrono::milliseconds(200));
    const double now = clock_->MonotonicSeconds();
    const double limit = static_cast<double>(options_.lease_timeout.count()) / 1000.0;
    std::vector<std::pair<std::shared_ptr<WorkerLink>, absl::Status>> close;
    for (auto& [id, s] : sessions_) {
      if (s->closed || now - s->last_seen <= limit) continue;
      const absl::Status why = absl::DeadlineExceededError(
          "no word from worker " + s->info.id + " for " + std::to_string(static_cast<int>(now - s->last_seen)) +
          " s (lease timeout " + std::to_string(static_cast<int>(limit)) + " s)");
      spdlog::warn("{}", std::string(why.message()));
      LoseLocked(*s, why);
      close.emplace_back(s->link, why);
    }
    if (close.empty()) continue;
    lock.unlock();
    cv_.notify_all();
    for (auto& [link, why] : close) link->Close(why);
    lock.lock();
  }
}

bool WorkerBroker::TryAcquire(bool gpu) {
  std::lock_guard<std::mutex> lock(mu_);
  if (acquired_[gpu] >= TotalSlotsLocked(gpu)) return false;
  ++acquired_[gpu];
  return true;
}

void WorkerBroker::Release(bool gpu) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    acquired_[gpu] = std::max(0, acquired_[gpu] - 1);
  }
  WakeScheduler();
}

std::vector<WorkerInfo> WorkerBroker::Workers() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<WorkerInfo> out;
  for (const auto& [id, s] : sessions_) {
    WorkerInfo info = s->info;
    info.last_seen_us = clock_->NowMicros() - static_cast<int64_t>((clock_->MonotonicSeconds() - s->last_seen) * 1e6);
    for (uint64_t l : s->leases) {
      if (auto it = leases_.find(l); it != leases_.end()) {
        for (int64_t r : it->second->run_ids) info.runs.push_back(absl::StrCat("r", r));
      }
    }
    out.push_back(std::move(info));
  }
  return out;
}

int WorkerBroker::TotalSlots() const {
  std::lock_guard<std::mutex> lock(mu_);
  return TotalSlotsLocked(false) + TotalSlotsLocked(true);
}

bool WorkerBroker::OfKind(const Session& s, bool gpu) const {
  const bool on_gpu = options_.by_device && s.info.device.rfind("cuda", 0) == 0;
  return on_gpu == gpu;
}

int WorkerBroker::TotalSlotsLocked(bool gpu) const {
  int total = 0;
  for (const auto& [id, s] : sessions_) {
    if (!s->closed && !s->info.draining && OfKind(*s, gpu)) total += s->info.slots;
  }
  return total;
}

int WorkerBroker::BusySlots() const { return BusySlots(false) + BusySlots(true); }

int WorkerBroker::BusySlots(bool gpu) const {
  std::lock_guard<std::mutex> lock(mu_);
  int busy = 0;
  for (const auto& [id, s] : sessions_) busy += OfKind(*s, gpu) ? s->busy : 0;
  return busy;
}

int WorkerBroker::WaitingLeases() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_;
}

}  // namespace circuitlab::remote
