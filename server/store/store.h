// circuitlab's persistent state: one SQLite database (WAL) plus checkpoint
// files under a data directory.
//
//   <data>/circuitlab.db        runs, tags, metrics, checkpoint index
//   <data>/checkpoints/r<id>/   checkpoint files, written atomically
//   <data>/LOCK                 held (flock) while a Store is open
//
// The store speaks in rows and bytes; it knows nothing of protobuf, gRPC or
// tensors. Run states are stored as the integers the caller gives (the
// scheduler uses circuitlab.v1.RunState numbers).
//
// Writes go through one writer thread that owns the only read-write
// connection. Metric and progress rows are queued and committed in batches
// (at most `flush_interval` late); every other write waits for its commit, so
// a state change is durable before the caller announces it. A kill -9 loses at
// most the last uncommitted batch of metrics/progress. Reads use their own
// read-only connections from a pool and never block the writer.
//
// Thread-safety: all public methods are thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace circuitlab::store {

// The schema version this binary writes. Opening a database with a newer
// version fails with FailedPrecondition.
int LatestSchemaVersion();

struct StoreOptions {
  // Longest time a queued metric/progress write waits before its commit.
  std::chrono::milliseconds flush_interval{200};
  // Queued asynchronous writes that force an early commit.
  size_t max_batch_ops = 512;
  // Queued asynchronous writes beyond which Append* calls block (backpressure).
  size_t max_pending_ops = 20000;
  // Read-only connections kept open.
  int reader_connections = 4;
};

struct NewRun {
  std::string name;
  std::string spec;       // serialized circuitlab.v1.ExperimentSpec
  std::string spec_json;  // the same, as JSON, for people and sqlite3 queries
  int state = 0;
  int priority = 0;
  int device_request = 0;
  int64_t total_steps = 0;
  int64_t created_at_us = 0;
  std::vector<std::string> tags;
  std::string owner;          // the principal that submitted it
  int64_t sweep_id = 0;       // 0 = not in a sweep
  std::string sweep_values;   // the member's axis values (JSON array)
};

struct RunRow {
  int64_t id = 0;
  std::string name;
  std::string spec;
  int state = 0;
  int priority = 0;
  int device_request = 0;
  int64_t created_at_us = 0;
  int64_t started_at_us = 0;   // 0 = never
  int64_t finished_at_us = 0;  // 0 = not finished
  std::string device;
  std::string error;
  int64_t step = 0;
  int64_t total_steps = 0;
  int attempts = 0;
  int64_t checkpoint_step = 0;
  std::vector<std::string> tags;
  std::string owner;  // the principal that submitted it
  int64_t sweep_id = 0;
  std::string sweep_values;
  std::string warning;
  std::string packed_with;  // the runs its latest attempt trained with as one ensemble: "r3,r4"
};

struct NewSweep {
  std::string name;
  std::string spec;       // serialized circuitlab.v1.SweepSpec
  std::string spec_json;
  int64_t created_at_us = 0;
  std::string owner;  // the principal that submitted it
};

struct SweepRow {
  int64_t id = 0;
  std::string name;
  std::string spec;
  int64_t created_at_us = 0;
  std::string owner;  // the principal that submitted it
};

// A reproduction (ReproductionService): `body` is the serialized
// circuitlab.v1.Reproduction, the columns what listings filter on.
struct ReproductionRow {
  int64_t id = 0;
  std::string owner;
  int state = 0;
  int64_t created_at_us = 0;
  std::string body;     // empty when a listing read only the summary
  std::string summary;  // the record in the BASIC view; a listing of a row stored before gets its body here
};

// Which reproductions a listing reads, newest first.
struct ReproductionQuery {
  std::string owner;        // all when empty
  std::vector<int> states;  // all when empty
  int limit = 50;
  int64_t before_id = 0;    // only ids below it (the next page); 0: from the newest
  bool with_body = false;   // the whole records too (else only their summaries)
  // The page ends before the row that would take its bytes (bodies and
  // summaries) over this many; 0: no budget. A page has at least one row.
  int64_t max_bytes = 0;
};

struct ReproductionPage {
  std::vector<ReproductionRow> rows;
  bool cut = false;  // ended by max_bytes (more rows may follow)
};

// A state transition. Unset optionals leave the column unchanged.
struct RunTransition {
  int state = 0;
  std::optional<std::string> device;
  std::optional<std::string> error;
  std::optional<int64_t> started_at_us;   // only written if the run has none yet
  std::optional<int64_t> finished_at_us;  // 0 clears it
  std::optional<std::string> packed_with;  // "" when the attempt trains alone
  bool increment_attempts = false;
  // Only apply if the run is currently in one of these states (empty = any).
  // FailedPrecondition otherwise.
  std::vector<int> from_states;
};

struct RunFilter {
  std::vector<int> states;        // any of these; empty = all
  std::vector<std::string> tags;  // all of these
  int64_t sweep_id = 0;           // only members of this sweep (0 = any)
  std::optional<std::string> owner;  // only runs of this principal (unset = anyone's)
  int64_t before_id = 0;          // pagination: only ids < before_id (0 = none)
  int limit = 50;
  // The page ends early, after at least one run, once its specs and names
  // reach this many bytes (0 = no bound).
  int64_t max_bytes = 0;
};

struct RunPage {
  std::vector<RunRow> runs;
  int64_t total = 0;  // matching rows over all pages
  bool cut = false;   // ended early at max_bytes
};

struct MetricPoint {
  std::string name;
  int64_t step = 0;
  double value = 0;
};

struct MetricQuery {
  std::vector<std::string> names;  // empty = all
  int64_t min_step = 0;
  int64_t max_step = 0;  // 0 = unbounded
  int max_points = 10000;
  // Cap over all series of the answer: each series gets at most
  // max_total_points / (number of series) points.
  int64_t max_total_points = 2'000'000;
};

struct MetricSeries {
  std::string name;
  std::vector<int64_t> steps;
  std::vector<double> values;
  int64_t total_points = 0;
};

struct Checkpoint {
  int64_t step = 0;
  std::string bytes;
};

// One coordinate of a run's basis (engine::CoordinateDef, as rows).
struct CoordinateDefRow {
  int64_t id = 0;  // assigned by the store
  int32_t index = 0;
  std::string label, canonical, matrix;
  int layer = 0, head = 0;
  std::string block_q, block_k, element;
  double norm = 0;
  bool gauge = false;
};

struct TrajectoryQuery {
  std::string selection = "paper";
  std::vector<std::string> names;  // labels or canonical names; empty = all
  int64_t min_step = 0;
  int64_t max_step = 0;  // 0 = unbounded
  int max_points = 10000;
  int64_t max_total_points = 2'000'000;
};

struct CoordinateSeries {
  CoordinateDefRow def;
  std::vector<int64_t> steps;
  std::vector<double> values;
  int64_t total_points = 0;
};

class Store {
 public:
  // Opens or creates the store under `data_dir`, applies pending migrations and
  // takes the directory lock. FailedPrecondition when another process holds
  // the lock or the database is newer than this binary; DataLoss when the file
  // is not a database.
  static absl::StatusOr<std::unique_ptr<Store>> Open(const std::string& data_dir, StoreOptions options = {});
  ~Store();  // flushes and stops the writer
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // ---- writes ----
  absl::StatusOr<int64_t> InsertRun(const NewRun& run);
  // The sweep and all its member runs in one transaction (all or none); the
  // members' sweep_id is set to the new sweep's. Returns (sweep id, run ids).
  absl::StatusOr<std::pair<int64_t, std::vector<int64_t>>> InsertSweep(const NewSweep& sweep,
                                                                       std::vector<NewRun> runs);
  // NotFound for an unknown id, FailedPrecondition when from_states does not
  // hold.
  absl::Status TransitionRun(int64_t run_id, const RunTransition& t);
  // Batched: progress (last completed step).
  void RecordProgress(int64_t run_id, int64_t step);
  // Batched: metric points; a point at an existing (run, name, step) replaces
  // it (a resumed run recomputes the steps after its checkpoint).
  void AppendMetrics(int64_t run_id, std::vector<MetricPoint> points);
  // Writes the checkpoint file atomically (temp + fsync + rename), then its
  // row, then deletes checkpoints beyond the newest `keep` (0 = keep all).
  absl::Status PutCheckpoint(int64_t run_id, int64_t step, const std::string& bytes, int keep);
  // Stores the coordinate definitions of (run, selection) once and returns
  // their ids in index order; a second call with the same number of
  // definitions returns the stored ids (a resumed run), a different number
  // is FailedPrecondition.
  absl::StatusOr<std::vector<int64_t>> PutCoordinateDefs(int64_t run_id, const std::string& selection,
                                                         const std::vector<CoordinateDefRow>& defs);
  // Batched: coordinate values at `step` (ids from PutCoordinateDefs).
  void AppendCoordinates(int64_t run_id, int64_t step, std::vector<int64_t> ids, std::vector<double> values);
  // Analyses of a spec alone (no run) use run_id kNoRun.
  static constexpr int64_t kNoRun = 0;
  // `owner` (may be empty: no one's) is charged its request and result's
  // bytes; with `max_owner_bytes` > 0, the owner's oldest other answers are
  // deleted until its answers hold at most that many (`evicted`, may be
  // null: how many). A run-less analysis belongs to no one.
  absl::Status PutAnalysis(int64_t run_id, const std::string& kind, int64_t request_hash, const std::string& request,
                           const std::string& result, const std::string& owner = "", int64_t max_owner_bytes = 0,
                           int* evicted = nullptr);
  // The bytes of `owner`'s stored answers.
  absl::StatusOr<int64_t> StoredAnalysisBytes(const std::string& owner);
  // A new reproduction (its id is returned; row.id is ignored), and its
  // record rewritten as it goes (NotFound for an unknown id).
  absl::StatusOr<int64_t> InsertReproduction(const ReproductionRow& row);
  absl::Status UpdateReproduction(int64_t id, int state, const std::string& body, const std::string& summary);
  // Waits until everything queued so far is committed.
  absl::Status Flush();

  // ---- reads ----
  absl::StatusOr<RunRow> GetRun(int64_t run_id);
  absl::StatusOr<RunPage> ListRuns(const RunFilter& filter);
  absl::StatusOr<SweepRow> GetSweep(int64_t sweep_id);
  // A sweep's members in expansion (id) order, tags not loaded.
  absl::StatusOr<std::vector<RunRow>> SweepRuns(int64_t sweep_id);
  // Ids of runs in `state`, by priority (high first) then id.
  absl::StatusOr<std::vector<int64_t>> RunIdsInState(int state);
  absl::StatusOr<std::vector<MetricSeries>> GetMetrics(int64_t run_id, const MetricQuery& q);
  // The value at the highest step of every series of the run.
  absl::StatusOr<std::map<std::string, double>> LatestMetrics(int64_t run_id);
  // The newest checkpoint, verified against its checksum (DataLoss if it does
  // not match); nullopt when the run has none.
  absl::StatusOr<std::optional<Checkpoint>> LatestCheckpoint(int64_t run_id);
  // The newest checkpoint whose file is present and matches its checksum;
  // each damaged newer one is described in `skipped` (its step and why).
  // Nothing (start from step 0) when none is intact.
  absl::StatusOr<std::optional<Checkpoint>> LatestIntactCheckpoint(int64_t run_id, std::vector<std::string>* skipped);
  // Deletes runs whose state is one of `ended` with everything that hangs
  // off them (metrics, tags, coordinates, analyses, checkpoint rows and
  // files) and, when sweep_id > 0, that sweep; all or nothing.
  // FailedPrecondition naming the first run in another state, NotFound for
  // an unknown run. Returns the checkpoint bytes freed. Ids are never reused.
  absl::StatusOr<int64_t> DeleteRuns(const std::vector<int64_t>& run_ids, const std::vector<int>& ended,
                                     int64_t sweep_id = 0);
  // Records what the server worked around for a run (Run.warning).
  absl::Status SetRunWarning(int64_t run_id, const std::string& warning);
  // The checkpoint at exactly `step` (verified); nullopt when there is none.
  absl::StatusOr<std::optional<Checkpoint>> CheckpointAt(int64_t run_id, int64_t step);
  // Steps that have checkpoints, ascending.
  absl::StatusOr<std::vector<int64_t>> CheckpointSteps(int64_t run_id);
  // Coordinate series of a run, in index order, downsampled like GetMetrics.
  absl::StatusOr<std::vector<CoordinateSeries>> GetTrajectory(int64_t run_id, const TrajectoryQuery& q);
  // Every coordinate of (run, selection) at one step, in index order.
  absl::StatusOr<std::vector<std::pair<CoordinateDefRow, double>>> CoordinatesAt(int64_t run_id,
                                                                                 const std::string& selection,
                                                                                 int64_t step);
  // Coordinate `label` (or canonical name) at the last recorded step of each of `run_ids` (one
  // query; runs without it are left out): (run_id, step, value).
  struct LastValue {
    int64_t run_id = 0, step = 0;
    double value = 0;
  };
  absl::StatusOr<std::vector<LastValue>> LastCoordinateOfRuns(const std::vector<int64_t>& run_ids,
                                                              const std::string& selection, const std::string& label);
  absl::StatusOr<ReproductionRow> GetReproduction(int64_t id);
  absl::StatusOr<ReproductionPage> ListReproductions(const ReproductionQuery& query);
  // A stored analysis result; nullopt when none.
  absl::StatusOr<std::optional<std::string>> GetAnalysis(int64_t run_id, const std::string& kind,
                                                         int64_t request_hash);
  // The stored analyses of one kind on a run, newest first, at most `limit`:
  // the canonical request (serialized, as PutAnalysis got it), the result,
  // when it was stored (microseconds since the epoch) and the request's
  // hash (its key). `after`: only those listed after that one (the next
  // page). `max_bytes`: the list ends before the row that would take its
  // requests and results over this many bytes (always one row); 0: none.
  struct StoredAnalysis {
    std::string request;
    std::string result;
    int64_t created_at = 0;
    int64_t request_hash = 0;
  };
  struct AnalysisCursor {
    int64_t created_at = 0;
    int64_t request_hash = 0;
  };
  // `cut` (may be null): set when max_bytes ended the list.
  absl::StatusOr<std::vector<StoredAnalysis>> ListAnalyses(int64_t run_id, const std::string& kind, int limit,
                                                           std::optional<AnalysisCursor> after = std::nullopt,
                                                           int64_t max_bytes = 0, bool* cut = nullptr);
  // One stored analysis with its request; nullopt when none.
  absl::StatusOr<std::optional<StoredAnalysis>> GetStoredAnalysis(int64_t run_id, const std::string& kind,
                                                                  int64_t request_hash);

  // A consistent copy of the data directory `data_dir` (database snapshot,
  // then checkpoint files) into the new directory `dest_dir`, which is then a
  // complete data directory (restore: start the server on it). Safe while a
  // server runs on `data_dir`.
  // InvalidArgument when `dest_dir` is `data_dir` or inside it; a backup that
  // fails removes what it wrote.
  static absl::Status Backup(const std::string& data_dir, const std::string& dest_dir);

  // What the writer has done since the store opened (for /metrics).
  struct WriteStats {
    uint64_t commits = 0;  // transactions (batches)
    // Commit durations: counts per bucket, bucket i holding durations
    // <= kCommitBuckets[i] and above the previous bound; the last one the rest.
    std::vector<uint64_t> commit_buckets;
    double commit_seconds = 0;       // sum
    uint64_t metric_points = 0;      // committed metric rows
    uint64_t coordinate_values = 0;  // committed coordinate rows
  };
  static constexpr double kCommitBuckets[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};
  WriteStats GetWriteStats() const;
  // Runs per stored state (one GROUP BY).
  absl::StatusOr<std::map<int, int64_t>> CountRunsByState();

  const std::string& data_dir() const;

  class Impl;

 private:
  // Backup's copy into the (created) `dest_dir`.
  static absl::Status CopyInto(const std::string& data_dir, const std::string& dest_dir);
  explicit Store(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace circuitlab::store
