// Remote workers (issue 17): the lease broker between the scheduler's slots
// and the circuitlab-worker processes connected over WorkerService.Session
// (worker_service.proto states the protocol).
//
// The broker is an engine::Executor: a scheduler slot that takes a run calls
// Train/TrainPack as it would on the local LibTorch executor, and the call
// blocks while a remote worker trains the run. Leases wait for a worker with
// a free slot, are sent with the resume checkpoint in chunks, and everything
// the worker reports is handed to the run's observer *on the slot's thread*
// (the rpc threads only route messages), so store writes, checkpoint retries
// and watch events are exactly those of a local run. A lease whose worker is
// gone (its stream ended, or it was silent for lease_timeout) ends kPreempted:
// the scheduler queues the run again and it resumes from its newest
// checkpoint.
//
// Capacity: the scheduler asks TryAcquire() before it takes a run for a
// remote slot and Release()s after; the broker wakes it (SetWake) whenever a
// worker registers or frees a slot. So queued runs stay QUEUED (not RUNNING
// on nobody) until a worker can take them.
//
// Thread-safety: all public methods are thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <set>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "circuitlab/v1/worker_service.pb.h"
#include "server/common/clock.h"
#include "server/engine/api.h"
#include "server/scheduler/remote.h"

namespace circuitlab::remote {

// The server's end of one worker's stream (the rpc layer implements it).
class WorkerLink {
 public:
  virtual ~WorkerLink() = default;
  // Queues a message for the worker; never blocks for long.
  virtual void Send(v1::ServerMessage message) = 0;
  // Ends the stream with `why`; the rpc layer then calls WorkerBroker::Closed.
  virtual void Close(const absl::Status& why) = 0;
};

struct BrokerOptions {
  std::chrono::milliseconds heartbeat = std::chrono::seconds(10);
  std::chrono::milliseconds lease_timeout = std::chrono::seconds(60);
  // How long a preempted lease (the server drains) waits for the worker's
  // checkpoint before it is given up.
  std::chrono::milliseconds preempt_grace = std::chrono::seconds(60);
  size_t chunk_bytes = 1 << 20;              // resume checkpoints are sent in pieces this size
  int64_t max_checkpoint_bytes = 4LL << 30;  // larger uploads are refused (the worker's run fails)
  std::string version;                       // workers must report the same
  int max_message_bytes = 4 << 20;           // what the server accepts (--max-request-bytes)
  int max_workers = 4096;                    // connected sessions
  // One principal's connected sessions and their slots together
  // (RESOURCE_EXHAUSTED beyond): one token cannot take every lease.
  int max_sessions_per_principal = 64;
  int max_slots_per_principal = 256;
  // A principal whose workers lose this many leases through their own fault
  // (silent past lease_timeout, or gone before reporting) within
  // `quarantine` is refused new sessions and leases for `quarantine`.
  int quarantine_after = 16;
  std::chrono::seconds quarantine = std::chrono::seconds(600);
  // Two kinds of workers (--executor slurm --slurm-gpus-per-node: CPU and
  // GPU pilots): a lease for a remote GPU slot (a run that asks for CUDA)
  // goes only to a worker on a cuda device, any other lease only to a CPU
  // worker. Off: any worker takes any lease.
  bool by_device = false;
};

// A connected worker, as `circuitlab workers` lists it.
struct WorkerInfo {
  std::string id;  // "w3"
  std::string principal, host, engine_job, device, peer;
  int slots = 0;
  std::vector<std::string> runs;  // run ids it trains now
  bool draining = false;
  int64_t connected_at_us = 0;
  int64_t last_seen_us = 0;
};

class WorkerBroker : public engine::Executor, public scheduler::WorkerCapacity {
 public:
  // `local` answers EvalMetricNames (may be null); `clock` outlives the broker.
  WorkerBroker(BrokerOptions options, engine::Executor* local, Clock* clock);
  ~WorkerBroker() override;

  // Called without locks whenever capacity may have appeared.
  void SetWake(std::function<void()> wake);

  // ---- the rpc side ----
  // A worker's Register message: its session id, after the Registered
  // answer was sent. InvalidArgument for a bad field (named),
  // FailedPrecondition for a version that is not the server's,
  // ResourceExhausted beyond max_workers.
  absl::StatusOr<uint64_t> Open(std::shared_ptr<WorkerLink> link, const v1::Register& reg, const std::string& principal,
                                const std::string& peer);
  // Every later message of the session. An error is a protocol violation:
  // the rpc layer ends the stream with it (and calls Closed).
  absl::Status OnMessage(uint64_t session, const v1::WorkerMessage& message);
  // The stream ended: its leases are lost (their runs go back to the queue).
  void Closed(uint64_t session, const absl::Status& why);

  // ---- the scheduler side ----
  bool TryAcquire(bool gpu) override;
  void Release(bool gpu) override;
  absl::StatusOr<engine::TrainOutcome> Train(const engine::TrainRequest& request,
                                             engine::TrainObserver& observer) override;
  std::vector<absl::StatusOr<engine::TrainOutcome>> TrainPack(
      const std::vector<engine::TrainRequest>& requests, const std::vector<engine::TrainObserver*>& observers) override;
  std::vector<std::string> EvalMetricNames(const v1::ExperimentSpec& resolved) override;

  // ---- what the pool and `circuitlab workers` see ----
  std::vector<WorkerInfo> Workers() const;
  // Slots of connected, non-draining workers; slots leased now (all, or
  // those of the GPU or the CPU workers when by_device).
  int TotalSlots() const;
  int BusySlots() const;
  int BusySlots(bool gpu) const;
  // Leases waiting for a worker.
  int WaitingLeases() const;

 private:
  int TotalSlotsLocked(bool gpu) const;  // mu_ held
  struct Session {
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
  // Whether `s` takes leases of the kind (gpu or not), and its slots
  // count there; everything is the CPU kind unless by_device.
  bool OfKind(const Session& s, bool gpu) const;

  struct Lease {
    uint64_t id = 0;
    size_t members = 0;
    std::vector<int64_t> run_ids;
    std::vector<uint64_t> total_steps;  // per member: reports may not go beyond
    uint64_t reports = 0;               // reports received: a worker that sent none is blamed for losing it
    uint64_t session = 0;
    bool gpu = false;  // for a GPU worker (its runs asked for CUDA; BrokerOptions::by_device)
    uint64_t next_sequence = 1;
    std::deque<v1::WorkerMessage> inbox;  // routed by the rpc side, applied by the slot thread
    bool lost = false;
    absl::Status lost_why;
    bool worker_at_fault = false;  // lost through the worker's fault: not charged to the runs
    bool blamed = false;           // the worker sent what the run cannot have (ApplyReport)
  };
  // What the slot thread keeps about one member of its lease.
  struct Member {
    std::string checkpoint;  // chunks received so far
    std::vector<engine::CoordinateDef> basis;  // basis parts received so far
    uint64_t checkpoint_step = 0;
    int64_t max_checkpoint_bytes = 0;  // this member's cap: its run's memory estimate (and the server's)
    int64_t last_step = 0;
    bool ended = false;
    bool stop_sent = false;
    absl::Status failure;  // a server-side failure (basis or checkpoint not written)
  };
  struct LeaseRun;  // one lease on its slot thread (leases.cc)
  // Applies a lease's messages: reports to their members, a LeaseEnd to all.
  void ApplyInbox(LeaseRun& run, const std::deque<v1::WorkerMessage>& inbox);
  // Ends the lease when lost or its preempted members missed the grace;
  // else sends the stops its members were asked. True when it ended.
  bool EndedOrStopped(LeaseRun& run, bool lost, const absl::Status& lost_why);
  // Runs one lease to its end on the calling (slot) thread.
  std::vector<absl::StatusOr<engine::TrainOutcome>> RunLease(const std::vector<engine::TrainRequest>& requests,
                                                             const std::vector<scheduler::PlacedObserver*>& observers);
  // A session with a free slot now or within a short wait (registered as the
  // lease's), else nullptr.
  std::shared_ptr<Session> TryAssign(const std::shared_ptr<Lease>& lease);
  // A session for `lease` once one has room, or nullptr when its runs are
  // stopped meanwhile (*preempted: a drain, not only cancels).
  std::shared_ptr<Session> AwaitSession(const std::shared_ptr<Lease>& lease,
                                        const std::vector<engine::TrainRequest>& requests, bool* preempted);
  void SendLease(Session& session, const Lease& lease, const std::vector<engine::TrainRequest>& requests,
                 const std::vector<scheduler::PlacedObserver*>& observers);
  void SendStop(Session& session, uint64_t lease, v1::Stop::Reason reason, uint32_t member);
  // Hands one report to the member's observer (the checkpoint's ack goes
  // back). InvalidArgument for what the run cannot have (a checkpoint too
  // large or not loadable for its spec, a basis beyond the cap): the worker's
  // fault.
  absl::Status ApplyReport(Session& session, uint64_t lease, const v1::Report& report, Member& member,
                           scheduler::PlacedObserver& observer, const v1::ExperimentSpec& spec);
  void LoseLocked(Session& session, const absl::Status& why);
  // Empty, or why `principal` may not take leases now (quarantine).
  std::string QuarantinedLocked(const std::string& principal);
  void Watchdog();
  void WakeScheduler();

  const BrokerOptions options_;
  engine::Executor* const local_;
  Clock* const clock_;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // sessions, slots, inboxes changed
  std::function<void()> wake_;
  std::map<uint64_t, std::shared_ptr<Session>> sessions_;
  std::map<uint64_t, std::shared_ptr<Lease>> leases_;
  // Per principal: when its workers lost leases through their own fault
  // (Clock::MonotonicSeconds, within the quarantine window), and until when
  // it is quarantined.
  std::map<std::string, std::deque<double>> faults_;
  std::map<std::string, double> quarantined_until_;
  uint64_t next_session_ = 1;
  uint64_t next_lease_ = 1;
  int acquired_[2] = {0, 0};  // held by the scheduler: CPU kind, GPU kind
  int waiting_ = 0;
  bool stopping_ = false;
  std::thread watchdog_;
};

}  // namespace circuitlab::remote
