#include "server/remote/workers.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/engine/spec.h"

namespace circuitlab::remote {

using scheduler::PlacedObserver;
namespace {

constexpr uint32_t kMaxSlots = 64;
constexpr size_t kMaxField = 256;
constexpr auto kPoll = std::chrono::milliseconds(100);

std::string LeaseName(uint64_t id) { return "lease " + std::to_string(id); }

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

engine::CoordinateDef FromReport(const v1::ReportCoordinateDef& d) {
  engine::CoordinateDef c;
  c.index = d.index();
  c.label = d.label();
  c.canonical = d.canonical();
  c.matrix = d.matrix();
  c.layer = d.layer();
  c.head = d.head();
  c.block_q = d.block_q();
  c.block_k = d.block_k();
  c.element = d.element();
  c.norm = d.norm();
  c.gauge = d.gauge();
  return c;
}

absl::StatusOr<engine::TrainOutcome> FromEnd(const v1::MemberEnd& end, const std::string& where) {
  engine::TrainOutcome out;
  out.last_step = static_cast<int64_t>(end.last_step());
  switch (end.end()) {
    case v1::MemberEnd::END_COMPLETED:
      out.end = engine::TrainEnd::kCompleted;
      return out;
    case v1::MemberEnd::END_CANCELLED:
      out.end = engine::TrainEnd::kCancelled;
      return out;
    case v1::MemberEnd::END_PREEMPTED:
      out.end = engine::TrainEnd::kPreempted;
      return out;
    default: {
      const int code = end.code() > 0 && end.code() <= 16 ? end.code() : static_cast<int>(absl::StatusCode::kInternal);
      return absl::Status(static_cast<absl::StatusCode>(code), end.error() + " (on " + where + ")");
    }
  }
}

}  // namespace

struct WorkerBroker::Session {
  uint64_t id = 0;
  std::shared_ptr<WorkerLink> link;
  WorkerInfo info;
  int busy = 0;
  bool closed = false;
  double last_seen = 0;  // Clock::MonotonicSeconds
  std::set<uint64_t> leases;
  std::string Where() const {
    return info.id + (info.engine_job.empty() ? "" : " " + info.engine_job) + "@" + info.host + " " + info.device;
  }
};

struct WorkerBroker::Lease {
  uint64_t id = 0;
  size_t members = 0;
  std::vector<int64_t> run_ids;
  std::vector<uint64_t> total_steps;  // per member: reports may not go beyond
  uint64_t reports = 0;               // reports received: a worker that sent none is blamed for losing it
  uint64_t session = 0;
  uint64_t next_sequence = 1;
  std::deque<v1::WorkerMessage> inbox;  // routed by the rpc side, applied by the slot thread
  bool lost = false;
  absl::Status lost_why;
  bool worker_at_fault = false;  // lost through the worker's fault: not charged to the runs
  bool blamed = false;           // the worker sent what the run cannot have (ApplyReport)
};

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

bool WorkerBroker::TryAcquire() {
  std::lock_guard<std::mutex> lock(mu_);
  if (acquired_ >= TotalSlotsLocked()) return false;
  ++acquired_;
  return true;
}

void WorkerBroker::Release() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    acquired_ = std::max(0, acquired_ - 1);
  }
  WakeScheduler();
}

std::vector<std::string> WorkerBroker::EvalMetricNames(const v1::ExperimentSpec& resolved) {
  return local_ != nullptr ? local_->EvalMetricNames(resolved) : std::vector<std::string>{};
}

absl::StatusOr<engine::TrainOutcome> WorkerBroker::Train(const engine::TrainRequest& request,
                                                         engine::TrainObserver& observer) {
  return TrainPack({request}, {&observer})[0];
}

std::vector<absl::StatusOr<engine::TrainOutcome>> WorkerBroker::TrainPack(
    const std::vector<engine::TrainRequest>& requests, const std::vector<engine::TrainObserver*>& observers) {
  std::vector<PlacedObserver*> placed;
  for (engine::TrainObserver* o : observers) {
    auto* p = dynamic_cast<PlacedObserver*>(o);
    if (p == nullptr) {
      return std::vector<absl::StatusOr<engine::TrainOutcome>>(
          requests.size(), absl::InternalError("a remote run needs the scheduler's observer"));
    }
    placed.push_back(p);
  }
  return RunLease(requests, placed);
}

std::shared_ptr<WorkerBroker::Session> WorkerBroker::TryAssign(const std::shared_ptr<Lease>& lease) {
  std::unique_lock<std::mutex> lock(mu_);
  for (int round = 0; round < 2; ++round) {
    std::shared_ptr<Session> best;
    for (auto& [id, s] : sessions_) {
      if (s->closed || s->info.draining || s->busy >= s->info.slots) continue;
      if (!QuarantinedLocked(s->info.principal).empty()) continue;
      if (!best || s->info.slots - s->busy > best->info.slots - best->busy) best = s;
    }
    if (best) {
      ++best->busy;
      best->leases.insert(lease->id);
      lease->session = best->id;
      leases_[lease->id] = lease;
      return best;
    }
    if (round == 0) cv_.wait_for(lock, kPoll);
  }
  return nullptr;
}

void WorkerBroker::SendLease(Session& session, const Lease& lease, const std::vector<engine::TrainRequest>& requests,
                             const std::vector<PlacedObserver*>& observers) {
  v1::ServerMessage m;
  v1::Lease* l = m.mutable_lease();
  l->set_lease_id(lease.id);
  for (size_t i = 0; i < requests.size(); ++i) {
    v1::LeaseMember* member = l->add_members();
    member->set_run_id(absl::StrCat("r", lease.run_ids[i]));
    *member->mutable_spec() = requests[i].spec;
    member->set_resume_bytes(requests[i].resume_from ? requests[i].resume_from->size() : 0);
    member->set_resume_step(static_cast<uint64_t>(std::max<int64_t>(0, observers[i]->start_step())));
  }
  session.link->Send(std::move(m));
  for (size_t i = 0; i < requests.size(); ++i) {
    if (!requests[i].resume_from) continue;
    const std::string& bytes = *requests[i].resume_from;
    for (size_t at = 0; at < bytes.size(); at += options_.chunk_bytes) {
      v1::ServerMessage c;
      c.mutable_resume_chunk()->set_lease_id(lease.id);
      c.mutable_resume_chunk()->set_member(static_cast<uint32_t>(i));
      c.mutable_resume_chunk()->set_data(bytes.substr(at, options_.chunk_bytes));
      session.link->Send(std::move(c));
    }
  }
}

void WorkerBroker::SendStop(Session& session, uint64_t lease, v1::Stop::Reason reason, uint32_t member) {
  v1::ServerMessage m;
  m.mutable_stop()->set_lease_id(lease);
  m.mutable_stop()->set_reason(reason);
  m.mutable_stop()->set_member(member);
  session.link->Send(std::move(m));
}

absl::Status WorkerBroker::ApplyReport(Session& session, uint64_t lease, const v1::Report& r, Member& m,
                                       PlacedObserver& observer, const v1::ExperimentSpec& spec) {
  switch (r.kind_case()) {
    case v1::Report::kMetrics: {
      // Consecutive points of one step are one OnMetrics call, as locally.
      std::vector<engine::Metric> metrics;
      const auto& points = r.metrics().metrics();
      for (int i = 0; i < points.size(); ++i) {
        metrics.push_back({points[i].name(), points[i].value()});
        if (i + 1 == points.size() || points[i + 1].step() != points[i].step()) {
          observer.OnMetrics(static_cast<int64_t>(points[i].step()), metrics);
          metrics.clear();
        }
      }
      return absl::OkStatus();
    }
    case v1::Report::kProgress:
      m.last_step = static_cast<int64_t>(r.progress().step());
      observer.OnProgress(m.last_step, r.progress().steps_per_second());
      return absl::OkStatus();
    case v1::Report::kBasis: {
      if (m.basis.size() + static_cast<size_t>(r.basis().coords_size()) >
          static_cast<size_t>(engine::kMaxBasisCoordinates)) {
        m.basis.clear();
        return absl::InvalidArgumentError("the worker's basis has more than " +
                                          std::to_string(engine::kMaxBasisCoordinates) + " coordinates");
      }
      for (const v1::ReportCoordinateDef& d : r.basis().coords()) m.basis.push_back(FromReport(d));
      if (!r.basis().last()) return absl::OkStatus();
      engine::Basis basis;
      basis.selection = r.basis().selection() == 1 ? engine::Selection::kComplete : engine::Selection::kPaper;
      basis.coords = std::move(m.basis);
      m.basis.clear();
      if (absl::Status s = observer.OnBasis(basis); !s.ok() && m.failure.ok()) {
        m.failure = s;  // as a local run: the basis not recorded fails the run
        if (!m.stop_sent) SendStop(session, lease, v1::Stop::REASON_CANCEL, r.member());
        m.stop_sent = true;
      }
      return absl::OkStatus();
    }
    case v1::Report::kCoordinates:
      observer.OnCoordinates(
          static_cast<int64_t>(r.coordinates().step()),
          r.coordinates().selection() == 1 ? engine::Selection::kComplete : engine::Selection::kPaper,
          std::vector<double>(r.coordinates().values().begin(), r.coordinates().values().end()));
      return absl::OkStatus();
    case v1::Report::kCheckpoint: {
      const v1::CheckpointChunk& c = r.checkpoint();
      if (c.step() != m.checkpoint_step) {
        m.checkpoint.clear();
        m.checkpoint_step = c.step();
      }
      if (static_cast<int64_t>(m.checkpoint.size() + c.data().size()) > m.max_checkpoint_bytes) {
        m.checkpoint.clear();
        return absl::InvalidArgumentError("the checkpoint at step " + std::to_string(c.step()) +
                                          " is larger than this run can have (" +
                                          std::to_string(m.max_checkpoint_bytes) + " bytes)");
      }
      m.checkpoint.append(c.data());
      if (!c.last()) return absl::OkStatus();
      // Stored only when complete (`last`) and loadable by the server's
      // LibTorch for this run's spec (its format, fingerprint and step).
      if (local_ != nullptr) {
        if (absl::Status bad = local_->CheckCheckpoint(spec, static_cast<int64_t>(c.step()), m.checkpoint);
            !bad.ok()) {
          m.checkpoint.clear();
          return absl::InvalidArgumentError("the checkpoint at step " + std::to_string(c.step()) +
                                            " is not one of this run: " + std::string(bad.message()));
        }
      }
      // The server's own failure to write it (a full disk) is the run's, as locally.
      absl::Status s = observer.OnCheckpoint(static_cast<int64_t>(c.step()), m.checkpoint);
      m.checkpoint.clear();
      v1::ServerMessage ack;
      ack.mutable_checkpoint_ack()->set_lease_id(lease);
      ack.mutable_checkpoint_ack()->set_member(r.member());
      ack.mutable_checkpoint_ack()->set_step(c.step());
      if (!s.ok()) {
        ack.mutable_checkpoint_ack()->set_error(s.ToString());
        if (m.failure.ok()) m.failure = s;
      }
      session.link->Send(std::move(ack));
      return absl::OkStatus();
    }
    default:
      return absl::OkStatus();
  }
}

std::shared_ptr<WorkerBroker::Session> WorkerBroker::AwaitSession(const std::shared_ptr<Lease>& lease,
                                                                  const std::vector<engine::TrainRequest>& requests,
                                                                  bool* preempted) {
  std::shared_ptr<Session> session;
  while (!session) {
    bool all_cancelled = true, preempt = false;
    for (const engine::TrainRequest& r : requests) {
      const StopReason why = r.cancel ? r.cancel->reason() : StopReason::kNone;
      preempt = preempt || why == StopReason::kPreempt;
      all_cancelled = all_cancelled && why == StopReason::kCancel;
    }
    if (preempt || all_cancelled) {
      *preempted = preempt;
      break;
    }
    session = TryAssign(lease);
  }
  std::lock_guard<std::mutex> lock(mu_);
  --waiting_;
  return session;
}

std::vector<absl::StatusOr<engine::TrainOutcome>> WorkerBroker::RunLease(
    const std::vector<engine::TrainRequest>& requests, const std::vector<PlacedObserver*>& observers) {
  const size_t n = requests.size();
  std::vector<absl::StatusOr<engine::TrainOutcome>> outcomes(n, engine::TrainOutcome{});
  std::vector<Member> members(n);
  for (size_t i = 0; i < n; ++i) {
    members[i].last_step = std::max<int64_t>(0, observers[i]->start_step());
    // A checkpoint holds the weights and optimiser state: well within the
    // run's memory estimate (twice it, and 1 MiB for the archive).
    members[i].max_checkpoint_bytes =
        std::min<int64_t>(options_.max_checkpoint_bytes,
                          2 * static_cast<int64_t>(engine::EstimateRunMemoryBytes(requests[i].spec)) + (1 << 20));
  }
  auto reason = [&](size_t i) { return requests[i].cancel ? requests[i].cancel->reason() : StopReason::kNone; };
  auto end_all = [&](engine::TrainEnd end) {
    for (size_t i = 0; i < n; ++i) {
      if (members[i].ended) continue;
      members[i].ended = true;
      outcomes[i] = members[i].failure.ok()
                        ? absl::StatusOr<engine::TrainOutcome>(engine::TrainOutcome{end, members[i].last_step})
                        : absl::StatusOr<engine::TrainOutcome>(members[i].failure);
    }
  };

  auto lease = std::make_shared<Lease>();
  lease->members = n;
  for (PlacedObserver* o : observers) lease->run_ids.push_back(o->run_id());
  for (const engine::TrainRequest& r : requests) lease->total_steps.push_back(r.spec.training().steps());
  {
    std::lock_guard<std::mutex> lock(mu_);
    lease->id = next_lease_++;
    ++waiting_;
  }
  // Wait for a worker; runs asked to stop meanwhile end where they are.
  bool preempted = false;
  const std::shared_ptr<Session> session = AwaitSession(lease, requests, &preempted);
  if (!session) {
    for (size_t i = 0; i < n; ++i) {
      members[i].ended = true;
      outcomes[i] = engine::TrainOutcome{reason(i) == StopReason::kCancel && !preempted ? engine::TrainEnd::kCancelled
                                                                                      : engine::TrainEnd::kPreempted,
                                         members[i].last_step};
    }
    return outcomes;
  }
  const std::string where = session->Where();
  std::string names;
  for (int64_t id : lease->run_ids) names += (names.empty() ? "r" : ", r") + std::to_string(id);
  spdlog::info("{} ({}) leased to {}", LeaseName(lease->id), names, EscapeControl(where));
  SendLease(*session, *lease, requests, observers);
  for (PlacedObserver* o : observers) o->OnPlaced(where);

  bool preempt_sent = false;
  bool misbehaved = false;  // its worker sent what the run cannot have: nothing more is applied
  double preempt_deadline = 0;
  while (true) {
    std::deque<v1::WorkerMessage> inbox;
    bool lost = false;
    absl::Status lost_why;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, kPoll, [&] { return !lease->inbox.empty() || lease->lost; });
      inbox.swap(lease->inbox);
      lost = lease->lost;
      lost_why = lease->lost_why;
    }
    for (const v1::WorkerMessage& msg : inbox) {
      if (msg.has_report()) {
        const uint32_t i = msg.report().member();
        if (members[i].ended || misbehaved) continue;
        if (absl::Status bad = ApplyReport(*session, lease->id, msg.report(), members[i], *observers[i],
                                           requests[i].spec);
            !bad.ok()) {
          // An upload the run cannot have: the worker misbehaves. Its session
          // ends and the lease is lost through its fault (the run goes back to
          // the queue, uncharged; the principal counts a fault).
          spdlog::warn("{} ({}): worker {} sent {}; ending its session", LeaseName(lease->id), names,
                       session->info.id, std::string(bad.message()));
          {
            std::lock_guard<std::mutex> lock(mu_);
            lease->blamed = true;
          }
          misbehaved = true;
          session->link->Close(bad);
        }
        continue;
      }
      for (size_t i = 0; i < n; ++i) {
        if (members[i].ended) continue;
        members[i].ended = true;
        outcomes[i] = members[i].failure.ok() ? FromEnd(msg.lease_end().members(static_cast<int>(i)), where)
                                              : absl::StatusOr<engine::TrainOutcome>(members[i].failure);
      }
    }
    if (std::all_of(members.begin(), members.end(), [](const Member& m) { return m.ended; })) break;
    if (lost) {
      spdlog::warn("{} ({}) lost: {}; back to the queue", LeaseName(lease->id), names, std::string(lost_why.message()));
      bool worker_at_fault;
      {
        std::lock_guard<std::mutex> lock(mu_);
        worker_at_fault = lease->worker_at_fault;
      }
      for (size_t i = 0; i < n; ++i) {
        if (!members[i].ended) {
          observers[i]->OnLost(where + ": " + std::string(lost_why.message()), /*counts=*/!worker_at_fault);
        }
      }
      end_all(engine::TrainEnd::kPreempted);
      break;
    }
    for (size_t i = 0; i < n; ++i) {
      if (members[i].ended) continue;
      if (reason(i) == StopReason::kCancel && !members[i].stop_sent) {
        SendStop(*session, lease->id, v1::Stop::REASON_CANCEL, static_cast<uint32_t>(i));
        members[i].stop_sent = true;
      } else if (reason(i) == StopReason::kPreempt && !preempt_sent) {
        SendStop(*session, lease->id, v1::Stop::REASON_PREEMPT, 0);
        preempt_sent = true;
        preempt_deadline = clock_->MonotonicSeconds() + static_cast<double>(options_.preempt_grace.count()) / 1000.0;
      }
    }
    if (preempt_sent && clock_->MonotonicSeconds() > preempt_deadline) {
      const absl::Status why =
          absl::DeadlineExceededError("worker " + session->info.id + " did not checkpoint its preempted runs in time");
      spdlog::warn("{} ({}): {}", LeaseName(lease->id), names, std::string(why.message()));
      for (size_t i = 0; i < n; ++i) {
        if (!members[i].ended) observers[i]->OnLost(where + ": " + std::string(why.message()), /*counts=*/false);
      }
      end_all(engine::TrainEnd::kPreempted);
      session->link->Close(why);
      break;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    --session->busy;
    session->leases.erase(lease->id);
    leases_.erase(lease->id);
  }
  cv_.notify_all();
  WakeScheduler();
  return outcomes;
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
  return TotalSlotsLocked();
}

int WorkerBroker::TotalSlotsLocked() const {
  int total = 0;
  for (const auto& [id, s] : sessions_) {
    if (!s->closed && !s->info.draining) total += s->info.slots;
  }
  return total;
}

int WorkerBroker::BusySlots() const {
  std::lock_guard<std::mutex> lock(mu_);
  int busy = 0;
  for (const auto& [id, s] : sessions_) busy += s->busy;
  return busy;
}

int WorkerBroker::WaitingLeases() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_;
}

}  // namespace circuitlab::remote
