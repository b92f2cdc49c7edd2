// The experiment core: a persisted priority queue of runs, a device
// inventory with one worker per slot, cancellation, crash recovery and the
// read side (runs, metrics, watch streams) the RPC layer adapts.
//
// Life of a run: Submit validates and resolves the spec (engine::ResolveSpec),
// inserts a QUEUED row and wakes a worker. The worker that takes it persists
// RUNNING (state changes are committed before they are announced to
// watchers), resumes from the newest checkpoint if one exists, streams
// metrics/progress/checkpoints to the store and the progress hub, and persists
// the final state. A server killed at any moment leaves RUNNING rows behind;
// Start() turns them back into QUEUED, so they resume from their checkpoint.
// Drain() (SIGTERM) stops accepting, checkpoints and re-queues running runs.
//
// Thread-safety: all public methods are thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "circuitlab/v1/experiment_service.pb.h"
#include "server/common/cancel.h"
#include "server/common/clock.h"
#include "server/common/quotas.h"
#include "server/engine/api.h"
#include "server/scheduler/progress_hub.h"
#include "server/scheduler/remote.h"
#include "server/store/store.h"

namespace circuitlab::scheduler {

// SUCCEEDED, FAILED or CANCELLED: a run in it never changes again.
inline bool IsFinal(int state) {
  return state == v1::RUN_STATE_SUCCEEDED || state == v1::RUN_STATE_FAILED || state == v1::RUN_STATE_CANCELLED;
}

struct SchedulerOptions {
  int cpu_slots = 1;
  // Slots whose runs train on remote workers (--executor workers|slurm):
  // named "worker:N"; a slot takes a run only when `remote` has a free worker
  // slot, and hands it to the executor (the WorkerBroker) to train.
  int remote_slots = 0;
  // Remote slots for runs whose spec asks for CUDA (resources.device), named
  // "worker-gpu:N": they take only those runs, from GPU workers
  // (--executor slurm --slurm-gpus-per-node: the GPU pilots).
  int remote_gpu_slots = 0;
  WorkerCapacity* remote = nullptr;
  // A run whose remote worker was lost this many times (crashed, killed,
  // silent) fails instead of being queued again: a run that kills its
  // workers must not cycle through the cluster forever.
  int max_lost_leases = 5;
  int cuda_devices = 0;        // from engine::CudaDeviceCount()
  // Memory of each CUDA device (engine::TorchRuntime), or empty when
  // unknown. A pack of seeds on a CUDA slot holds at most as many members as
  // 90% of its device's memory fits (engine::EstimateRunMemoryBytes each).
  std::vector<uint64_t> cuda_memory_bytes;
  int intra_op_threads = 1;    // LibTorch threads per worker
  int max_queued_runs = 1000;  // RESOURCE_EXHAUSTED beyond
  int max_queued_per_client = 200;  // queued runs of one owner (principal)
  // Most sweep members of one pack key (engine::PackKey) trained as one
  // ensemble job; 1 turns packing off.
  int max_pack = 8;
  engine::EngineLimits limits;
  std::string epoch;  // names this server process in watch events
  std::chrono::milliseconds heartbeat = std::chrono::seconds(5);
  int max_watchers = 1024;  // open WatchRun streams, over all clients
  int max_watchers_per_client = 256;  // open WatchRun streams of one owner
  // Per-principal overrides of the two per-owner limits above (may be null).
  const Quotas* quotas = nullptr;
  // A checkpoint that cannot be written (disk full, an unwritable or vanished
  // directory) is retried this many times, the waits doubling from
  // checkpoint_retry_delay (1 + 2 + 4 + 8 + 16 + 32 s by default), before the
  // run fails. The run holds its slot meanwhile and says so (Run.warning).
  int checkpoint_tries = 7;
  std::chrono::milliseconds checkpoint_retry_delay = std::chrono::seconds(1);
};

// "r17" <-> 17. InvalidArgument naming `field` for anything else.
absl::StatusOr<int64_t> ParseRunId(const std::string& text, const std::string& field = "run_id");
std::string FormatRunId(int64_t id);
// "s2" <-> 2, likewise.
absl::StatusOr<int64_t> ParseSweepId(const std::string& text, const std::string& field = "sweep_id");
std::string FormatSweepId(int64_t id);

// The store's row for an engine basis coordinate.
store::CoordinateDefRow ToCoordinateRow(const engine::CoordinateDef& d);

// Checks a series request (GetMetrics, GetTrajectory): max_points in
// [0, 100000], max_step 0 or >= min_step, both at most 2^62.
absl::Status ValidateSeriesRange(uint64_t min_step, uint64_t max_step, uint32_t max_points);

// What WatchRun streams: a subscription plus how to build snapshots.
struct Watch {
  std::shared_ptr<Subscriber> subscriber;
  int64_t run_id = 0;
  std::string owner;  // whose stream it is (per-owner limit)
};

class Scheduler {
 public:
  // Does not start workers (see Start). `store`, `executor` and `clock` must
  // outlive the scheduler.
  Scheduler(SchedulerOptions options, store::Store* store, engine::Executor* executor, Clock* clock);
  ~Scheduler();  // Drain()s if still running

  // Recovers runs a previous process left RUNNING, loads the queue and starts
  // one worker per device slot.
  absl::Status Start();
  // Stops accepting submissions (UNAVAILABLE), preempts running runs (they
  // checkpoint and return to QUEUED), waits for the workers and flushes the
  // store. Idempotent.
  void Drain();

  // ---- ExperimentService core ----
  absl::StatusOr<v1::Run> Submit(v1::ExperimentSpec spec, const std::string& owner);
  // Validates and resolves a spec into the row Submit would insert (no
  // insert): what a sweep checks for every member before queueing any.
  absl::StatusOr<store::NewRun> PrepareRun(v1::ExperimentSpec spec, const std::string& owner);
  // Inserts a sweep with its prepared members and queues them all, or none
  // (RESOURCE_EXHAUSTED when they do not fit the queue limits). Returns
  // (sweep id, run ids).
  absl::StatusOr<std::pair<int64_t, std::vector<int64_t>>> SubmitSweep(const store::NewSweep& sweep,
                                                                       std::vector<store::NewRun> rows,
                                                                       const std::string& owner);
  // RESOURCE_EXHAUSTED when `count` more runs from `owner` would not fit
  // the queue limits now (reserves nothing: a sweep asks before expanding).
  absl::Status CheckQueueRoom(int64_t count, const std::string& owner);
  absl::StatusOr<v1::Run> GetRun(const std::string& run_id);
  // `owner` set: only that principal's runs.
  absl::StatusOr<v1::ListRunsResponse> ListRuns(const v1::ListRunsRequest& request,
                                                std::optional<std::string> owner = std::nullopt);
  // The queued-run and watch-stream limits that apply to `owner` (its
  // overrides, else the options').
  int QueueLimitFor(const std::string& owner) const;
  int WatchLimitFor(const std::string& owner) const;
  // The principal that submitted a run (NotFound for an unknown one).
  absl::StatusOr<std::string> OwnerOf(const std::string& run_id);
  absl::StatusOr<v1::Run> Cancel(const std::string& run_id);
  // Deletes ended runs and everything they hold (Store::DeleteRuns), and the
  // sweep `sweep_id` when > 0. FailedPrecondition for a run that is queued,
  // running, or still winding down. Returns the checkpoint bytes freed.
  absl::StatusOr<int64_t> DeleteRuns(const std::vector<int64_t>& ids, int64_t sweep_id = 0);
  // Called with the ids of runs just deleted (the analysis executor forgets
  // their jobs: AnalysisJobs::ForgetRuns). Set once, at start-up.
  void OnRunsDeleted(std::function<void(const std::vector<int64_t>&)> deleted) {
    std::lock_guard<std::mutex> lock(mu_);
    on_deleted_ = std::move(deleted);
  }
  absl::StatusOr<v1::DeleteRunResponse> Delete(const std::string& run_id);
  absl::StatusOr<v1::GetMetricsResponse> GetMetrics(const v1::GetMetricsRequest& request);
  // Subscribes first, so nothing published after the snapshot is missed.
  absl::StatusOr<Watch> StartWatch(const v1::WatchRunRequest& request, const std::string& owner = {});
  void StopWatch(const Watch& watch);
  // The snapshot event that opens (or resyncs) a stream.
  absl::StatusOr<v1::RunEvent> Snapshot(int64_t run_id, uint64_t sequence, bool resync);

  // Wakes the slots (a remote worker may have capacity now).
  void Wake();
  // Runs waiting in the queue now; those that ask for CUDA (what GPU
  // workers train) or the others.
  int QueuedRuns();
  int QueuedRuns(bool cuda);
  // For /metrics: runs that reached each final state since the server
  // started (RunState number -> count) and the watch streams open now.
  std::map<int, uint64_t> FinishedRuns();
  int OpenWatches();
  // For /metrics, read from the store: runs by state (RunState number ->
  // count, one GROUP BY), and the store writer's commit statistics.
  absl::StatusOr<std::map<int, int64_t>> CountRunsByState() { return store_->CountRunsByState(); }
  store::Store::WriteStats StoreWriteStats() const { return store_->GetWriteStats(); }

  ProgressHub& hub() { return hub_; }
  const std::vector<std::string>& device_slots() const { return slot_names_; }
  // Empty, or why a run's checkpoints cannot be written now (it is retrying):
  // /readyz answers 503 meanwhile (issue 32 item 10).
  std::string StorageFault();

 private:
  struct QueueKey {
    int priority;
    int64_t id;
    bool operator<(const QueueKey& o) const { return priority != o.priority ? priority > o.priority : id < o.id; }
  };
  struct Queued {
    int device_request;
    std::string owner;
    std::string pack;  // runs with the same non-empty key may train as one ensemble
    uint64_t memory = 0;  // with a pack key: one member's estimated memory
    bool packs_on_cpu = false;  // its family's packed step pays on a CPU slot
  };
  struct Pack {
    std::string key;
    uint64_t memory = 0;
    bool packs_on_cpu = false;
  };
  struct Active {
    CancelToken cancel;
    int64_t step = 0;
    int64_t total = 0;
    double rate = 0;
    std::map<std::string, double> latest;
  };
  struct Slot {
    std::string name;  // "cpu:0", "cuda:1"
    bool cuda;
    std::string torch_device;
    bool busy = false;
    bool remote = false;  // trains on a remote worker (options_.remote)
    uint64_t memory = 0;  // CUDA slots: the device's memory (0: unknown)
  };
  class RunObserver;

  // Holds `count` queue places for `owner` (RESOURCE_EXHAUSTED beyond the
  // limits); the caller gives them back by decrementing reserved_.
  absl::Status Reserve(int count, const std::string& owner);
  // One watch stream of `owner` fewer (takes mu_).
  void ReleaseWatch(const std::string& owner);
  // The limits Reserve checks; mu_ held.
  absl::Status RoomLocked(int count, const std::string& owner);
  absl::StatusOr<v1::Run> Submitted(const store::NewRun& row, int64_t id);
  void WorkerLoop(size_t slot);
  // The queued run slot `slot` should take next, or 0.
  int64_t PickLocked(size_t slot);
  // Trains the runs on the slot: one alone, several fresh sweep members as
  // one ensemble (engine::Executor::TrainPack).
  void Execute(size_t slot, const std::vector<int64_t>& run_ids);
  // Marks the run RUNNING on the slot and builds its request (resuming from
  // its newest checkpoint); nullopt when it cannot start (recorded).
  std::optional<engine::TrainRequest> StartRun(const Slot& dev, int64_t run_id, Active& active);
  // Records a run's end (or failure) after training. A run preempted while
  // the server is not draining (its remote worker was lost) is queued again.
  void Finish(int64_t run_id, const absl::StatusOr<engine::TrainOutcome>& outcome);
  void Requeue(int64_t run_id);
  void FailRun(int64_t run_id, const absl::Status& why);
  // The pack key of a queued run ("" = trains alone) and its memory estimate.
  Pack PackOf(const store::RunRow& row) const;
  // Most members of a pack of `q`'s kind the slot takes: on a local CPU slot
  // one unless its family's packed step pays there (the cost model); on CUDA
  // what memory holds; on a remote slot --max-ensemble.
  int PackRoomLocked(size_t slot, const Queued& q) const;
  absl::Status Transition(int64_t run_id, const store::RunTransition& t);
  absl::StatusOr<v1::Run> ToRun(const store::RunRow& row);

  const SchedulerOptions options_;
  store::Store* const store_;
  engine::Executor* const executor_;
  Clock* const clock_;
  ProgressHub hub_;
  std::vector<std::string> slot_names_;

  std::mutex mu_;
  std::function<void(const std::vector<int64_t>&)> on_deleted_;  // under mu_
  std::map<int64_t, std::string> storage_faults_;                  // under mu_: failing checkpoint writes by run
  void NoteStorage(int64_t run_id, const absl::Status& write);
  std::condition_variable work_cv_;
  std::map<QueueKey, Queued> queue_;
  std::map<std::string, int> queued_per_owner_;
  std::map<std::string, int> watches_per_owner_;
  std::map<int, uint64_t> finished_;                     // final state -> runs (FinishedRuns)
  std::map<int64_t, std::pair<int, std::string>> lost_;  // run -> (workers lost, the last reason)
  int reserved_ = 0;  // queue places held by submissions being inserted
  std::map<int64_t, std::shared_ptr<Active>> active_;
  std::vector<Slot> slots_;
  bool started_ = false;
  bool draining_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace circuitlab::scheduler
