// A lease's life on the slot thread that trains it: waiting for a worker,
// the lease sent, its reports applied (metrics, coordinates, checkpoints in
// chunks), stops for cancelled or preempted members, the end or the loss of
// the lease. The workers' side (sessions, registration) is workers.cc.
#include "server/remote/workers.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"
#include "server/engine/spec.h"
#include "server/remote/broker_state.h"

namespace circuitlab::remote {

using scheduler::PlacedObserver;
namespace {

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
      if (s->closed || s->info.draining || s->busy >= s->info.slots || !OfKind(*s, lease->gpu)) continue;
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

// One lease on its slot thread (RunLease): its members and their outcomes,
// the worker that holds it, and the stops sent.
struct WorkerBroker::LeaseRun {
  const std::vector<engine::TrainRequest>& requests;
  const std::vector<PlacedObserver*>& observers;
  std::vector<Member> members;
  std::vector<absl::StatusOr<engine::TrainOutcome>> outcomes;
  std::shared_ptr<Lease> lease;
  std::shared_ptr<Session> session;
  std::string where, names;
  bool preempt_sent = false;
  bool misbehaved = false;  // its worker sent what the run cannot have: nothing more is applied
  double preempt_deadline = 0;

  StopReason reason(size_t i) const { return requests[i].cancel ? requests[i].cancel->reason() : StopReason::kNone; }
  bool AllEnded() const {
    return std::all_of(members.begin(), members.end(), [](const Member& m) { return m.ended; });
  }
  // Every member still running ends with `end` (or its server-side failure).
  void EndAll(engine::TrainEnd end) {
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i].ended) continue;
      members[i].ended = true;
      outcomes[i] = members[i].failure.ok()
                        ? absl::StatusOr<engine::TrainOutcome>(engine::TrainOutcome{end, members[i].last_step})
                        : absl::StatusOr<engine::TrainOutcome>(members[i].failure);
    }
  }
  // Tells each still-running member's observer the lease was lost.
  void Lost(const std::string& why, bool counts) {
    for (size_t i = 0; i < members.size(); ++i) {
      if (!members[i].ended) observers[i]->OnLost(where + ": " + why, counts);
    }
  }
};

void WorkerBroker::ApplyInbox(LeaseRun& run, const std::deque<v1::WorkerMessage>& inbox) {
  for (const v1::WorkerMessage& msg : inbox) {
    if (msg.has_report()) {
      const uint32_t i = msg.report().member();
      if (run.members[i].ended || run.misbehaved) continue;
      if (absl::Status bad = ApplyReport(*run.session, run.lease->id, msg.report(), run.members[i],
                                         *run.observers[i], run.requests[i].spec);
          !bad.ok()) {
        // An upload the run cannot have: the worker misbehaves. Its session
        // ends and the lease is lost through its fault (the run goes back to
        // the queue, uncharged; the principal counts a fault).
        spdlog::warn("{} ({}): worker {} sent {}; ending its session", LeaseName(run.lease->id), run.names,
                     run.session->info.id, std::string(bad.message()));
        {
          std::lock_guard<std::mutex> lock(mu_);
          run.lease->blamed = true;
        }
        run.misbehaved = true;
        run.session->link->Close(bad);
      }
      continue;
    }
    for (size_t i = 0; i < run.members.size(); ++i) {
      if (run.members[i].ended) continue;
      run.members[i].ended = true;
      run.outcomes[i] = run.members[i].failure.ok()
                            ? FromEnd(msg.lease_end().members(static_cast<int>(i)), run.where)
                            : absl::StatusOr<engine::TrainOutcome>(run.members[i].failure);
    }
  }
}

bool WorkerBroker::EndedOrStopped(LeaseRun& run, bool lost, const absl::Status& lost_why) {
  if (lost) {
    spdlog::warn("{} ({}) lost: {}; back to the queue", LeaseName(run.lease->id), run.names,
                 std::string(lost_why.message()));
    bool worker_at_fault;
    {
      std::lock_guard<std::mutex> lock(mu_);
      worker_at_fault = run.lease->worker_at_fault;
    }
    run.Lost(std::string(lost_why.message()), /*counts=*/!worker_at_fault);
    run.EndAll(engine::TrainEnd::kPreempted);
    return true;
  }
  for (size_t i = 0; i < run.members.size(); ++i) {
    if (run.members[i].ended) continue;
    if (run.reason(i) == StopReason::kCancel && !run.members[i].stop_sent) {
      SendStop(*run.session, run.lease->id, v1::Stop::REASON_CANCEL, static_cast<uint32_t>(i));
      run.members[i].stop_sent = true;
    } else if (run.reason(i) == StopReason::kPreempt && !run.preempt_sent) {
      SendStop(*run.session, run.lease->id, v1::Stop::REASON_PREEMPT, 0);
      run.preempt_sent = true;
      run.preempt_deadline =
          clock_->MonotonicSeconds() + static_cast<double>(options_.preempt_grace.count()) / 1000.0;
    }
  }
  if (run.preempt_sent && clock_->MonotonicSeconds() > run.preempt_deadline) {
    const absl::Status why = absl::DeadlineExceededError("worker " + run.session->info.id +
                                                         " did not checkpoint its preempted runs in time");
    spdlog::warn("{} ({}): {}", LeaseName(run.lease->id), run.names, std::string(why.message()));
    run.Lost(std::string(why.message()), /*counts=*/false);
    run.EndAll(engine::TrainEnd::kPreempted);
    run.session->link->Close(why);
    return true;
  }
  return false;
}

std::vector<absl::StatusOr<engine::TrainOutcome>> WorkerBroker::RunLease(
    const std::vector<engine::TrainRequest>& requests, const std::vector<PlacedObserver*>& observers) {
  const size_t n = requests.size();
  LeaseRun run{requests, observers, std::vector<Member>(n),
               std::vector<absl::StatusOr<engine::TrainOutcome>>(n, engine::TrainOutcome{}), nullptr, nullptr, "", ""};
  for (size_t i = 0; i < n; ++i) {
    run.members[i].last_step = std::max<int64_t>(0, observers[i]->start_step());
    // A checkpoint holds the weights and optimiser state: well within the
    // run's memory estimate (twice it, and 1 MiB for the archive).
    run.members[i].max_checkpoint_bytes =
        std::min<int64_t>(options_.max_checkpoint_bytes,
                          2 * static_cast<int64_t>(engine::EstimateRunMemoryBytes(requests[i].spec)) + (1 << 20));
  }
  run.lease = std::make_shared<Lease>();
  run.lease->members = n;
  // A remote GPU slot's runs (the scheduler names its device cuda:0).
  run.lease->gpu = n > 0 && requests[0].device.rfind("cuda", 0) == 0;
  for (PlacedObserver* o : observers) run.lease->run_ids.push_back(o->run_id());
  for (const engine::TrainRequest& r : requests) run.lease->total_steps.push_back(r.spec.training().steps());
  {
    std::lock_guard<std::mutex> lock(mu_);
    run.lease->id = next_lease_++;
    ++waiting_;
  }
  // Wait for a worker; runs asked to stop meanwhile end where they are.
  bool preempted = false;
  run.session = AwaitSession(run.lease, requests, &preempted);
  if (!run.session) {
    for (size_t i = 0; i < n; ++i) {
      run.members[i].ended = true;
      run.outcomes[i] = engine::TrainOutcome{run.reason(i) == StopReason::kCancel && !preempted
                                                 ? engine::TrainEnd::kCancelled
                                                 : engine::TrainEnd::kPreempted,
                                             run.members[i].last_step};
    }
    return run.outcomes;
  }
  run.where = run.session->Where();
  for (int64_t id : run.lease->run_ids) run.names += (run.names.empty() ? "r" : ", r") + std::to_string(id);
  spdlog::info("{} ({}) leased to {}", LeaseName(run.lease->id), run.names, EscapeControl(run.where));
  SendLease(*run.session, *run.lease, requests, observers);
  for (PlacedObserver* o : observers) o->OnPlaced(run.where);
  while (true) {
    std::deque<v1::WorkerMessage> inbox;
    bool lost = false;
    absl::Status lost_why;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, kPoll, [&] { return !run.lease->inbox.empty() || run.lease->lost; });
      inbox.swap(run.lease->inbox);
      lost = run.lease->lost;
      lost_why = run.lease->lost_why;
    }
    ApplyInbox(run, inbox);
    if (run.AllEnded() || EndedOrStopped(run, lost, lost_why)) break;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    --run.session->busy;
    run.session->leases.erase(run.lease->id);
    leases_.erase(run.lease->id);
  }
  cv_.notify_all();
  WakeScheduler();
  return std::move(run.outcomes);
}

}  // namespace circuitlab::remote
