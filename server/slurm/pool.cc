#include "server/slurm/pool.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_join.h"
#include "server/common/text.h"

extern char** environ;

namespace circuitlab::remote {
namespace {

std::vector<std::string> Split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t at = 0;
  while (true) {
    const size_t next = s.find(sep, at);
    out.emplace_back(s.substr(at, next == std::string_view::npos ? std::string_view::npos : next - at));
    if (next == std::string_view::npos) return out;
    at = next + 1;
  }
}

std::string Trim(std::string_view s) {
  auto space = [](char c) { return c == ' ' || c == '\r' || c == '\t' || c == '\n'; };
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  return std::string(s);
}

// The first word of a state ("CANCELLED by 0" -> "CANCELLED").
std::string StateWord(std::string_view s) {
  const std::string t = Trim(s);
  return t.substr(0, t.find(' '));
}

bool AllDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

std::vector<SlurmJob> ParseFields(std::string_view out, int* skipped, bool drop_steps) {
  std::vector<SlurmJob> jobs;
  int bad = 0;
  for (const std::string& line : Split(out, '\n')) {
    if (Trim(line).empty()) continue;
    std::vector<std::string> f = Split(line, '|');
    if (f.size() < 3 || Trim(f[0]).empty() || StateWord(f[1]).empty()) {
      ++bad;
      continue;
    }
    const std::string id = Trim(f[0]);
    if (drop_steps && id.find('.') != std::string::npos) continue;
    const std::vector<std::string> ids = ExpandArrayId(id);
    // A pending range ("4712_[2-4]") has no element ids yet.
    const std::string raw = f.size() > 3 && ids.size() == 1 && AllDigits(Trim(f[3])) ? Trim(f[3]) : "";
    for (const std::string& one : ids) jobs.push_back({one, StateWord(f[1]), Trim(f[2]), raw});
  }
  if (skipped != nullptr) *skipped = bad;
  return jobs;
}

// `text` as one word for a POSIX shell: in single quotes, embedded single
// quotes closed and escaped ('it'\''s').
std::string ShellQuote(std::string_view text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

std::vector<std::string> ExpandArrayId(const std::string& id) {
  const size_t open = id.find("_[");
  if (open == std::string::npos || id.back() != ']') return {id};
  const std::string base = id.substr(0, open);
  std::string ranges = id.substr(open + 2, id.size() - open - 3);
  ranges = ranges.substr(0, ranges.find('%'));  // "0-9%2": at most 2 at once
  std::vector<std::string> out;
  for (const std::string& part : Split(ranges, ',')) {
    std::vector<std::string> ends = Split(part, '-');
    if (ends.empty() || ends.size() > 2 || !AllDigits(ends[0]) || (ends.size() == 2 && !AllDigits(ends[1]))) {
      return {id};
    }
    const long lo = std::stol(ends[0]), hi = ends.size() == 2 ? std::stol(ends[1]) : lo;
    if (hi < lo || hi - lo > 100000) return {id};
    for (long i = lo; i <= hi; ++i) out.push_back(base + "_" + std::to_string(i));
  }
  return out;
}

std::vector<SlurmJob> ParseSqueue(std::string_view out, int* skipped) { return ParseFields(out, skipped, false); }

std::vector<SlurmJob> ParseSacct(std::string_view out, int* skipped) { return ParseFields(out, skipped, true); }

bool IsFinalSlurmState(const std::string& state) {
  static const char* const kFinal[] = {"COMPLETED",     "FAILED",    "CANCELLED", "TIMEOUT", "NODE_FAIL",
                                       "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",  "REVOKED", "SPECIAL_EXIT"};
  return std::any_of(std::begin(kFinal), std::end(kFinal), [&](const char* s) { return state == s; });
}

bool AccountingDisabled(std::string_view err) {
  return err.find("accounting storage is disabled") != std::string_view::npos ||
         err.find("Accounting storage is disabled") != std::string_view::npos;
}

std::string PilotScript(const SlurmOptions& o) {
  std::string s = "#!/bin/bash\n";
  for (const std::string& line : o.extra_lines) s += line + "\n";
  s += "# A circuitlab pilot: one worker that leases runs from the server until idle.\n";
  s += "# exec, so that Slurm's signals (--signal=B:USR2@120, scancel) reach the worker.\n";
  std::vector<std::string> argv = {ShellQuote(o.worker_binary),
                                   "--server",
                                   ShellQuote(o.server_address),
                                   "--slots",
                                   o.worker_slots > 0 ? std::to_string(o.worker_slots) : "\"$slots\"",
                                   "--intra-op-threads",
                                   std::to_string(o.intra_op_threads),
                                   "--idle-exit",
                                   std::to_string(o.idle_exit_seconds),
                                   "--engine-job",
                                   "\"slurm:$job\""};
  if (!o.token_file.empty()) argv.insert(argv.end(), {"--token-file", ShellQuote(o.token_file)});
  if (!o.ca_cert.empty()) argv.insert(argv.end(), {"--ca-cert", ShellQuote(o.ca_cert)});
  if (o.tls && o.ca_cert.empty()) argv.push_back("--tls");
  if (!o.gpus_per_node.empty()) argv.insert(argv.end(), {"--device", "cuda:0"});
  if (o.worker_slots == 0) {
    s += "# Sized by its node (--slurm-worker-slots 0): the whole node's CPUs / threads per run.\n";
    s += "slots=$(( ${SLURM_CPUS_ON_NODE:-1} / " + std::to_string(std::max(1, o.intra_op_threads)) + " ))\n";
    s += "[ \"$slots\" -ge 1 ] || slots=1\n";
    s += "[ \"$slots\" -le " + std::to_string(SlurmOptions::kMaxWorkerSlots) + " ] || slots=" +
         std::to_string(SlurmOptions::kMaxWorkerSlots) + "\n";
  }
  s += "job=$SLURM_JOB_ID\n";
  s += "[ -n \"${SLURM_ARRAY_TASK_ID:-}\" ] && job=${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}\n";
  s += "exec " + absl::StrJoin(argv, " ") + "\n";
  return s;
}

std::vector<std::string> SbatchArgs(const SlurmOptions& o, int count) {
  std::vector<std::string> a = {"sbatch",
                                "--parsable",
                                "--job-name=" + o.job_name,
                                "--signal=B:USR2@120",
                                "--no-requeue"};
  if (o.worker_slots > 0) {
    a.push_back("--cpus-per-task=" + std::to_string(o.worker_slots * o.intra_op_threads));
  } else {
    a.insert(a.end(), {"--nodes=1", "--exclusive"});  // the pilot sizes itself by the node
  }
  a.push_back("--output=" + o.log_dir + "/" + o.job_name + (count > 1 ? "-%A_%a.out" : "-%j.out"));
  if (count > 1) a.push_back("--array=0-" + std::to_string(count - 1));
  if (!o.partition.empty()) a.push_back("--partition=" + o.partition);
  if (!o.account.empty()) a.push_back("--account=" + o.account);
  if (!o.qos.empty()) a.push_back("--qos=" + o.qos);
  if (!o.time.empty()) a.push_back("--time=" + o.time);
  if (!o.gpus_per_node.empty()) a.push_back("--gpus-per-node=" + o.gpus_per_node);
  return a;
}

absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv, const std::string& input) {
  int in[2], out[2], err[2];
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    return absl::InternalError(std::string("pipe: ") + std::strerror(errno));
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(in[0]);
  close(out[1]);
  close(err[1]);
  if (rc != 0) {
    close(in[1]);
    close(out[0]);
    close(err[0]);
    return absl::NotFoundError("cannot run " + argv[0] + ": " + std::strerror(rc));
  }
  // Small inputs (a batch script): written before reading.
  for (size_t at = 0; at < input.size();) {
    const ssize_t n = write(in[1], input.data() + at, input.size() - at);
    if (n <= 0) break;
    at += static_cast<size_t>(n);
  }
  close(in[1]);
  CommandResult r;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  std::string* sinks[2] = {&r.out, &r.err};
  int open_fds = 2;
  char buf[8192];
  while (open_fds > 0) {
    if (poll(fds, 2, -1) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      const ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n > 0 && sinks[i]->size() < (16u << 20)) {
        sinks[i]->append(buf, static_cast<size_t>(n));
      } else if (n <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

SlurmPool::SlurmPool(SlurmOptions options, CommandRunner run, std::function<int()> demand)
    : options_(std::move(options)), run_(std::move(run)), demand_(std::move(demand)) {}

SlurmPool::~SlurmPool() { Stop(); }

absl::Status SlurmPool::Start() {
  absl::StatusOr<CommandResult> v = run_({"sbatch", "--version"}, "");
  if (!v.ok()) {
    return absl::FailedPreconditionError("--executor slurm needs Slurm's sbatch on this machine's PATH (" +
                                         std::string(v.status().message()) + ")");
  }
  if (v->exit_code != 0) {
    return absl::FailedPreconditionError(
        "--executor slurm: `sbatch --version` fails here (is SLURM_CONF set, is "
        "this a Slurm submit host?): " +
        Clip(Trim(v->err), 400));
  }
  Refresh();  // adopts the pilots an earlier server process left
  spdlog::info("slurm: {} ({}), job name {}, up to {} pilot(s) of {}; {} pilot(s) found", Trim(v->out),
               options_.partition.empty() ? "default partition" : "partition " + options_.partition, options_.job_name,
               options_.max_workers,
               options_.worker_slots > 0 ? std::to_string(options_.worker_slots) + " slot(s)" : "a whole node each",
               alive());
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      cv_.wait_for(lock, options_.poll);
      if (stopping_) break;
      lock.unlock();
      Cycle();
      lock.lock();
    }
  });
  return absl::OkStatus();
}

void SlurmPool::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (!options_.cancel_on_exit) return;
  std::vector<std::string> argv = {"scancel", "--signal=TERM", "--full"};
  for (const auto& [id, p] : pilots()) {
    if (!p.final) argv.push_back(id);
  }
  if (argv.size() == 3) return;
  spdlog::info("slurm: asking {} pilot(s) to stop (--slurm-cancel-on-exit)", argv.size() - 3);
  (void)run_(argv, "");
}

void SlurmPool::Cycle() {
  Refresh();
  Grow();
}

void SlurmPool::Refresh() {
  absl::StatusOr<CommandResult> q =
      run_({"squeue", "--noheader", "--name=" + options_.job_name, "--format=%i|%T|%r|%A"}, "");
  if (!q.ok() || q->exit_code != 0) {
    spdlog::warn("slurm: squeue failed ({}); pilots unchanged this cycle",
                 q.ok() ? Trim(q->err) : std::string(q.status().message()));
    return;
  }
  int skipped = 0;
  const std::vector<SlurmJob> queued = ParseSqueue(q->out, &skipped);
  if (skipped > 0) spdlog::warn("slurm: {} squeue line(s) could not be read", skipped);
  std::vector<std::string> gone, gone_raw;  // the pilots that left; their own job ids where known
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::map<std::string, bool> seen;
    for (const SlurmJob& j : queued) {
      seen[j.id] = true;
      Pilot& p = pilots_[j.id];
      if (p.state != j.state)
        spdlog::info("slurm: pilot {} {}{}", j.id, j.state,
                     j.reason.empty() || j.reason == "None" ? "" : " (" + j.reason + ")");
      p.state = j.state;
      p.final = false;
      if (!j.raw_id.empty()) p.raw_id = j.raw_id;
    }
    for (auto& [id, p] : pilots_) {
      if (!p.final && !seen.count(id)) {
        gone.push_back(id);
        gone_raw.push_back(p.raw_id.empty() ? id : p.raw_id);
      }
    }
  }
  if (gone.empty()) return;
  // Pilots that left the queue: one batched sacct explains how they ended.
  std::vector<SlurmJob> ended;
  // The completion log (`sacct -c`) knows an array element only by its own
  // job id (squeue's %A: "4712_3" runs as 4716) and finds nothing for
  // --jobs=4712_3; sacct with slurmdbd takes either.
  for (bool completion_log : {false, true}) {
    if (!completion_log && accounting_off_) continue;
    std::vector<std::string> argv = {"sacct",
                                     "--parsable2",
                                     "--noheader",
                                     "-X",
                                     "--format=JobID,State,ExitCode",
                                     "--jobs=" + absl::StrJoin(completion_log ? gone_raw : gone, ",")};
    if (completion_log) argv.insert(argv.begin() + 1, "-c");
    absl::StatusOr<CommandResult> a = run_(argv, "");
    if (a.ok() && a->exit_code == 0) {
      ended = ParseSacct(a->out);
      if (!ended.empty()) break;
    } else if (a.ok() && AccountingDisabled(a->err)) {
      accounting_off_ = true;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& id : gone) {
    Pilot& p = pilots_[id];
    // sacct names an array element "4712_3"; the completion log by its own id.
    auto it = std::find_if(ended.begin(), ended.end(),
                           [&](const SlurmJob& j) { return j.id == id || (!p.raw_id.empty() && j.id == p.raw_id); });
    std::string why = it == ended.end() ? "left the queue (no accounting record)" : it->state + " exit " + it->reason;
    // Not final per sacct (COMPLETING, REQUEUED, ...): the pilot may be back.
    if (it != ended.end() && !IsFinalSlurmState(it->state)) {
      p.state = it->state;
      continue;
    }
    p.final = true;
    p.state = it == ended.end() ? "GONE" : it->state;
    spdlog::info("slurm: pilot {} ended: {}", id, why);
    ended_.push_back(id);
  }
  // A long-lived server submits pilots for months: forget the oldest ends.
  while (ended_.size() > kKeptEnded) {
    auto p = pilots_.find(ended_.front());
    if (p != pilots_.end() && p->second.final) pilots_.erase(p);
    ended_.pop_front();
  }
}

void SlurmPool::Grow() {
  // A node-sized pilot's slots are known once it runs: counted as 1 here, so
  // the pool asks for up to --slurm-max-workers whole nodes.
  const int slots = std::max(1, options_.worker_slots);
  const int demand = std::max(0, demand_());
  const int want = std::min(options_.max_workers, (demand + slots - 1) / slots);
  const int have = alive();
  if (want < have) {
    // Pilots still waiting in Slurm's queue that the queue no longer needs
    // are cancelled (running ones exit when idle).
    std::vector<std::string> argv = {"scancel"};
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = pilots_.rbegin(); it != pilots_.rend() && static_cast<int>(argv.size()) - 1 < have - want; ++it) {
        if (!it->second.final && it->second.state == "PENDING") argv.push_back(it->first);
      }
    }
    if (argv.size() > 1) {
      spdlog::info("slurm: cancelling {} pending pilot(s) the queue no longer needs", argv.size() - 1);
      (void)run_(argv, "");
    }
    return;
  }
  if (want == have) return;
  const int count = want - have;
  absl::StatusOr<CommandResult> r = run_(SbatchArgs(options_, count), PilotScript(options_));
  if (!r.ok() || r->exit_code != 0) {
    spdlog::error("slurm: sbatch failed: {}", r.ok() ? Trim(r->err) : std::string(r.status().message()));
    return;
  }
  // --parsable answers "jobid" or "jobid;cluster".
  std::string id = Trim(r->out);
  id = id.substr(0, id.find(';'));
  if (!AllDigits(id)) {
    spdlog::error("slurm: sbatch answered {}, not a job id", Quote(Clip(id, 80)));
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (count == 1) {
    pilots_[id] = {"SUBMITTED", false, ""};
  } else {
    for (int i = 0; i < count; ++i) pilots_[id + "_" + std::to_string(i)] = {"SUBMITTED", false, ""};
  }
  spdlog::info("slurm: submitted {} pilot(s) as job {} for {} queued/leased run(s) (log {}/{}-{}.out)", count, id,
               demand, options_.log_dir, options_.job_name, count > 1 ? id + "_N" : id);
}

std::map<std::string, SlurmPool::Pilot> SlurmPool::pilots() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pilots_;
}

int SlurmPool::alive() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(std::count_if(pilots_.begin(), pilots_.end(), [](const auto& e) { return !e.second.final; }));
}

}  // namespace circuitlab::remote
