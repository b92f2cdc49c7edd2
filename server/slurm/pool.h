// The Slurm executor's pilot pool (issue 17): Slurm places and stops
// circuitlab-worker processes; the workers dial the server and lease runs
// (workers.h). The pool keeps as many pilot jobs as the queue needs, up to
// --slurm-max-workers, each a worker that trains many runs and exits after
// being idle a while; never one Slurm job per run.
//
// One cycle (every poll interval): one `squeue` for the pool's job name; one
// batched `sacct --parsable2` for pilots that left the queue (falling back to
// `sacct -c`, the job-completion log, and then to "ended, state unknown"
// when accounting is disabled); then `sbatch --parsable` (a job array for
// several pilots) when the live pilots fall short of the demand.
// Pending, running, COMPLETING, PREEMPTED, REQUEUED and SUSPENDED pilots are
// alive. Heartbeats decide whether a worker is alive; Slurm only explains why
// a pilot ended (logged).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace circuitlab::remote {

// One job (or array element) as squeue/sacct report it.
struct SlurmJob {
  std::string id;      // "4711", "4711_3"; a pending array's "4711_[4-7]" is expanded
  std::string state;   // "PENDING", "RUNNING", "COMPLETED", "CANCELLED" (a "by 0" suffix dropped)
  std::string reason;  // squeue's %r, or sacct's ExitCode
  // squeue's %A: the id Slurm gives each array element ("4712_3" runs as
  // 4716), which is all `sacct -c` (the job-completion log) knows it by.
  std::string raw_id;
};

// `squeue --noheader --format=%i|%T|%r|%A` output. Lines that do not have
// three fields (a truncated read) are skipped and counted in *skipped.
std::vector<SlurmJob> ParseSqueue(std::string_view out, int* skipped = nullptr);
// `sacct --parsable2 --noheader -X --format=JobID,State,ExitCode` output,
// likewise; job steps ("4711.batch") are dropped.
std::vector<SlurmJob> ParseSacct(std::string_view out, int* skipped = nullptr);
// "4711_[0-3,7]" -> 4711_0 ... 4711_3, 4711_7; anything else as it is.
std::vector<std::string> ExpandArrayId(const std::string& id);
// Whether a job in `state` will not run again (COMPLETED, FAILED,
// CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, BOOT_FAIL, DEADLINE).
// PENDING, RUNNING, COMPLETING, PREEMPTED, REQUEUED, SUSPENDED, ... are not.
bool IsFinalSlurmState(const std::string& state);
// True for sacct's answer when accounting is off.
bool AccountingDisabled(std::string_view sacct_stderr);

struct SlurmOptions {
  int max_workers = 4;   // pilots at once
  // Runs one pilot trains at once. 0 sizes each pilot by its node: the pilot
  // takes a whole node (sbatch --exclusive) and trains
  // $SLURM_CPUS_ON_NODE / intra_op_threads runs at once (at least 1, at most
  // kMaxWorkerSlots), so a 2-CPU node runs 2 and a 1-CPU node 1.
  int worker_slots = 1;
  static constexpr int kMaxWorkerSlots = 64;  // the worker's --slots range
  int intra_op_threads = 1;
  std::string partition, account, qos, time;  // empty = Slurm's default
  std::string gpus_per_node;                  // --gpus-per-node, e.g. "1" or "a100:2"; empty = CPU pilots
  std::vector<std::string> extra_lines;       // written after the shebang (#SBATCH ... or set-up commands)
  std::string job_name = "circuitlab";        // the pool finds its pilots by it, also after a restart
  std::string log_dir;                        // --output: <log_dir>/<job_name>-%A_%a.out
  std::string worker_binary;                  // circuitlab-worker on the nodes
  std::string server_address;                 // what the workers dial
  std::string token_file;                     // the workers' token (readable on the nodes)
  std::string ca_cert;                        // the CA of the server's certificate
  bool tls = false;
  int idle_exit_seconds = 120;  // a pilot with nothing to do exits
  std::chrono::milliseconds poll = std::chrono::seconds(5);
  bool cancel_on_exit = false;  // scancel the pilots when the server stops
};

// The batch script of a pilot (sbatch reads it on stdin).
std::string PilotScript(const SlurmOptions& options);
// sbatch's arguments for `count` pilots (an array when count > 1).
std::vector<std::string> SbatchArgs(const SlurmOptions& options, int count);

// Runs a command; the pool's only contact with Slurm (tests replace it).
struct CommandResult {
  int exit_code = 0;
  std::string out, err;
};
using CommandRunner =
    std::function<absl::StatusOr<CommandResult>(const std::vector<std::string>& argv, const std::string& input)>;
// fork/exec with pipes; NotFound when the program is not on PATH.
absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv, const std::string& input);

class SlurmPool {
 public:
  // `demand()` is how many worker slots the queue could use now (queued
  // runs + leased ones).
  SlurmPool(SlurmOptions options, CommandRunner run, std::function<int()> demand);
  ~SlurmPool();  // Stop()s

  // Checks that sbatch exists and adopts pilots of an earlier server
  // process (same job name), then polls on a thread.
  absl::Status Start();
  // Stops polling; with cancel_on_exit, scancels the pool's pilots.
  void Stop();
  // One cycle (the thread's body; tests call it directly).
  void Cycle();

  struct Pilot {
    std::string state;
    bool final = false;
    std::string raw_id;  // SlurmJob::raw_id, once squeue has shown it
  };
  // The live pilots and the most recent kKeptEnded ended ones.
  std::map<std::string, Pilot> pilots() const;
  static constexpr size_t kKeptEnded = 64;
  int alive() const;

 private:
  void Refresh();
  void Grow();

  const SlurmOptions options_;
  CommandRunner run_;
  std::function<int()> demand_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Pilot> pilots_;
  std::deque<std::string> ended_;  // final pilots, oldest first (pruned)
  bool stopping_ = false;
  bool accounting_off_ = false;
  std::thread thread_;
};

}  // namespace circuitlab::remote
