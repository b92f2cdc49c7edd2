// The Slurm pool's parsers against recorded squeue/sacct output (arrays,
// truncated lines, job steps, "CANCELLED by N", accounting disabled), the
// pilot script and sbatch line, and the pool's cycle against a fake Slurm.
#include "server/slurm/pool.h"

#include <gtest/gtest.h>

#include <fstream>

namespace circuitlab::remote {
namespace {

TEST(Slurm, ParsesSqueueWithArraysAndTruncation) {
  // squeue --noheader --format=%i|%T|%r|%A (22.05), the last line cut short.
  const std::string out =
      "4711|RUNNING|None|4711\n"
      "4712_[2-4,7]|PENDING|Resources|4712\n"
      "4712_0|RUNNING|None|4716\n"
      "4713|COMPLETING|None\n"
      "4714|PEND";
  int skipped = 0;
  const std::vector<SlurmJob> jobs = ParseSqueue(out, &skipped);
  EXPECT_EQ(skipped, 1);
  std::vector<std::string> ids;
  for (const SlurmJob& j : jobs) ids.push_back(j.id);
  EXPECT_EQ(ids, (std::vector<std::string>{"4711", "4712_2", "4712_3", "4712_4", "4712_7", "4712_0", "4713"}));
  EXPECT_EQ(jobs[1].state, "PENDING");
  EXPECT_EQ(jobs[1].reason, "Resources");
  EXPECT_EQ(jobs[1].raw_id, "") << "a pending range's elements have no ids of their own yet";
  EXPECT_EQ(jobs[5].raw_id, "4716");
  EXPECT_FALSE(IsFinalSlurmState(jobs.back().state)) << "COMPLETING is not final";
}

TEST(Slurm, ParsesSacctDroppingStepsAndBySuffix) {
  // sacct --parsable2 --noheader -X (steps appear when -X is not honoured).
  const std::string out =
      "4711|COMPLETED|0:0\n"
      "4711.batch|COMPLETED|0:0\n"
      "4712_3|CANCELLED by 0|0:15\n"
      "4713|FAILED|1:0\n"
      "4714|PREEMPTED|0:0\n"
      "4715|REQUEUED|0:0\n"
      "garbage\n";
  int skipped = 0;
  const std::vector<SlurmJob> jobs = ParseSacct(out, &skipped);
  EXPECT_EQ(skipped, 1);
  ASSERT_EQ(jobs.size(), 5u);
  EXPECT_EQ(jobs[1].id, "4712_3");
  EXPECT_EQ(jobs[1].state, "CANCELLED");
  EXPECT_EQ(jobs[1].reason, "0:15");
  EXPECT_TRUE(IsFinalSlurmState(jobs[0].state));
  EXPECT_TRUE(IsFinalSlurmState(jobs[1].state));
  EXPECT_TRUE(IsFinalSlurmState(jobs[2].state));
  EXPECT_FALSE(IsFinalSlurmState(jobs[3].state)) << "PREEMPTED may be requeued";
  EXPECT_FALSE(IsFinalSlurmState(jobs[4].state));
  for (const char* s : {"PENDING", "RUNNING", "SUSPENDED", "CONFIGURING", "REQUEUE_HOLD"}) {
    EXPECT_FALSE(IsFinalSlurmState(s)) << s;
  }
  for (const char* s : {"TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}) {
    EXPECT_TRUE(IsFinalSlurmState(s)) << s;
  }
}

TEST(Slurm, ExpandsArrayIds) {
  EXPECT_EQ(ExpandArrayId("9_[0-2]"), (std::vector<std::string>{"9_0", "9_1", "9_2"}));
  EXPECT_EQ(ExpandArrayId("9_[1,5-6%2]"), (std::vector<std::string>{"9_1", "9_5", "9_6"}));
  EXPECT_EQ(ExpandArrayId("9_4"), std::vector<std::string>{"9_4"});
  EXPECT_EQ(ExpandArrayId("9_[x-2]"), std::vector<std::string>{"9_[x-2]"}) << "unreadable: kept as it is";
}

TEST(Slurm, RecognisesDisabledAccounting) {
  EXPECT_TRUE(AccountingDisabled("sacct: error: Slurm accounting storage is disabled\n"));
  EXPECT_FALSE(AccountingDisabled("sacct: error: Invalid job id specified\n"));
}

TEST(Slurm, PilotScriptExecsTheWorker) {
  SlurmOptions o;
  o.worker_binary = "/opt/cl/bin/circuitlab-worker";
  o.server_address = "login1:50051";
  o.token_file = "/home/me/it's.token";
  o.ca_cert = "/home/me/ca.pem";
  o.worker_slots = 2;
  o.extra_lines = {"#SBATCH --constraint=skylake", "module load gcc"};
  const std::string s = PilotScript(o);
  EXPECT_EQ(s.rfind("#!/bin/bash\n#SBATCH --constraint=skylake\nmodule load gcc\n", 0), 0u) << s;
  EXPECT_NE(s.find("exec '/opt/cl/bin/circuitlab-worker' --server 'login1:50051' --slots 2"), std::string::npos) << s;
  EXPECT_NE(s.find("--token-file '/home/me/it'\\''s.token'"), std::string::npos) << s;
  EXPECT_NE(s.find("--ca-cert '/home/me/ca.pem'"), std::string::npos) << s;
  EXPECT_NE(s.find("--engine-job \"slurm:$job\""), std::string::npos) << s;

  o.partition = "gpu";
  o.account = "lab";
  o.time = "4:00:00";
  o.gpus_per_node = "1";
  o.log_dir = "/data/slurm-logs";
  const std::vector<std::string> a = SbatchArgs(o, 3);
  auto has = [&](const std::string& x) { return std::find(a.begin(), a.end(), x) != a.end(); };
  EXPECT_TRUE(has("--parsable"));
  EXPECT_TRUE(has("--signal=B:USR2@120"));
  EXPECT_TRUE(has("--no-requeue"));
  EXPECT_TRUE(has("--array=0-2"));
  EXPECT_TRUE(has("--partition=gpu"));
  EXPECT_TRUE(has("--account=lab"));
  EXPECT_TRUE(has("--time=4:00:00"));
  EXPECT_TRUE(has("--gpus-per-node=1"));
  EXPECT_TRUE(has("--cpus-per-task=2"));
  EXPECT_TRUE(has("--output=/data/slurm-logs/circuitlab-%A_%a.out"));
  const std::vector<std::string> one = SbatchArgs(o, 1);
  EXPECT_TRUE(std::none_of(one.begin(), one.end(), [](const std::string& x) { return x.rfind("--array", 0) == 0; }));
  EXPECT_NE(std::find(one.begin(), one.end(), "--output=/data/slurm-logs/circuitlab-%j.out"), one.end());
}

// --slurm-worker-slots 0: a pilot takes a whole node and sizes its worker by
// the node's CPUs. The script is run by bash with /bin/echo as the worker.
TEST(Slurm, NodeSizedPilotTakesTheWholeNodeAndCountsItsCpus) {
  SlurmOptions o;
  o.worker_binary = "/bin/echo";
  o.server_address = "srv:50051";
  o.worker_slots = 0;
  o.intra_op_threads = 2;
  const std::vector<std::string> a = SbatchArgs(o, 1);
  auto has = [&](const std::string& x) { return std::find(a.begin(), a.end(), x) != a.end(); };
  EXPECT_TRUE(has("--exclusive"));
  EXPECT_TRUE(has("--nodes=1"));
  EXPECT_TRUE(
      std::none_of(a.begin(), a.end(), [](const std::string& x) { return x.rfind("--cpus-per-task", 0) == 0; }));
  const std::string script = ::testing::TempDir() + "/pilot.sh";
  {
    std::ofstream out(script);
    out << PilotScript(o);
  }
  // CPUs on the node -> the worker's --slots (threads per run 2).
  for (auto [cpus, slots] : {std::pair<std::string, std::string>{"8", "4"}, {"3", "1"}, {"1", "1"}, {"1000", "64"}}) {
    absl::StatusOr<CommandResult> r =
        RunCommand({"env", "SLURM_CPUS_ON_NODE=" + cpus, "SLURM_JOB_ID=9", "bash", script}, "");
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_NE(r->out.find("--slots " + slots + " "), std::string::npos) << cpus << " CPUs: " << r->out;
  }
}

// A fake Slurm: answers by program, records every call.
struct FakeSlurm {
  std::vector<std::vector<std::string>> calls;
  std::string squeue = "";
  CommandResult sacct{0, "", ""};
  CommandResult sacct_c{0, "", ""};
  int next_job = 100;
  CommandRunner Runner() {
    return [this](const std::vector<std::string>& argv, const std::string&) -> absl::StatusOr<CommandResult> {
      calls.push_back(argv);
      if (argv[0] == "sbatch" && argv.size() > 1 && argv[1] == "--version")
        return CommandResult{0, "slurm 22.05.8\n", ""};
      if (argv[0] == "sbatch") return CommandResult{0, std::to_string(next_job++) + "\n", ""};
      if (argv[0] == "squeue") return CommandResult{0, squeue, ""};
      if (argv[0] == "sacct") return argv[1] == "-c" ? sacct_c : sacct;
      return CommandResult{0, "", ""};
    };
  }
  int Count(const std::string& program) {
    return static_cast<int>(std::count_if(calls.begin(), calls.end(), [&](const auto& c) { return c[0] == program; }));
  }
};

TEST(SlurmPool, SizesPilotsToTheQueueAndExplainsTheirEnds) {
  FakeSlurm slurm;
  int demand = 3;
  SlurmOptions o;
  o.max_workers = 2;
  o.worker_slots = 1;
  o.log_dir = "/tmp/logs";
  SlurmPool pool(o, slurm.Runner(), [&] { return demand; });
  pool.Cycle();
  ASSERT_EQ(slurm.Count("sbatch"), 1);
  EXPECT_EQ(pool.alive(), 2) << "3 runs, at most 2 pilots: one array of two";
  EXPECT_NE(std::find(slurm.calls.back().begin(), slurm.calls.back().end(), "--array=0-1"), slurm.calls.back().end());

  slurm.squeue = "100_0|RUNNING|None\n100_1|RUNNING|None\n";
  pool.Cycle();
  EXPECT_EQ(slurm.Count("sbatch"), 1) << "enough pilots";
  EXPECT_EQ(slurm.Count("sacct"), 0);

  // Both left the queue: one batched sacct explains them; the queue still
  // wants workers, so two more are submitted.
  slurm.squeue = "";
  slurm.sacct = {0, "100_0|COMPLETED|0:0\n100_1|CANCELLED by 0|0:15\n", ""};
  pool.Cycle();
  ASSERT_EQ(slurm.Count("sacct"), 1);
  const auto& sacct =
      *std::find_if(slurm.calls.begin(), slurm.calls.end(), [](const auto& c) { return c[0] == "sacct"; });
  EXPECT_NE(std::find(sacct.begin(), sacct.end(), "--jobs=100_0,100_1"), sacct.end());
  EXPECT_TRUE(pool.pilots().at("100_0").final);
  EXPECT_EQ(pool.pilots().at("100_1").state, "CANCELLED");
  EXPECT_EQ(slurm.Count("sbatch"), 2);

  demand = 0;
  slurm.squeue = "101_0|RUNNING|None\n101_1|PENDING|Priority\n";
  pool.Cycle();
  EXPECT_EQ(slurm.Count("sbatch"), 2) << "no demand, no pilots";
  ASSERT_EQ(slurm.Count("scancel"), 1) << "the pending pilot is no longer needed";
  EXPECT_EQ(slurm.calls.back(), (std::vector<std::string>{"scancel", "101_1"})) << "the running one exits when idle";
}

TEST(SlurmPool, FallsBackWhenAccountingIsDisabled) {
  FakeSlurm slurm;
  int demand = 1;
  SlurmOptions o;
  SlurmPool pool(o, slurm.Runner(), [&] { return demand; });
  pool.Cycle();
  ASSERT_EQ(pool.alive(), 1);
  demand = 0;
  slurm.sacct = {1, "", "sacct: error: Slurm accounting storage is disabled\n"};
  slurm.sacct_c = {0, "", ""};  // nothing in the completion log either
  pool.Cycle();
  EXPECT_EQ(pool.alive(), 0) << "a pilot that left the queue with no record has ended";
  EXPECT_EQ(pool.pilots().at("100").state, "GONE");
  const int sacct_calls = slurm.Count("sacct");
  demand = 1;
  slurm.squeue = "";
  pool.Cycle();  // a new pilot (101)
  pool.Cycle();  // it left: only `sacct -c` is asked now
  EXPECT_EQ(slurm.Count("sacct"), sacct_calls + 1);
  EXPECT_EQ(slurm.calls.back()[0], "sbatch") << "and the queue still wants one";
}

// Seen on a real cluster (tests/cluster): a node died under array pilot 1_0,
// and `sacct -c --jobs=1_0` answered nothing, `--jobs=2` "2|NODE_FAIL|0:0":
// the completion log knows an array element only by its own job id, which
// squeue's %A tells.
TEST(SlurmPool, ExplainsAnArrayPilotsEndFromTheCompletionLog) {
  FakeSlurm slurm;
  int demand = 3;
  SlurmOptions o;
  o.max_workers = 3;
  SlurmPool pool(o, slurm.Runner(), [&] { return demand; });
  pool.Cycle();  // submits array 100 of three
  slurm.squeue = "100_0|RUNNING|None|101\n100_1|RUNNING|None|102\n100_2|RUNNING|None|100\n";
  pool.Cycle();
  EXPECT_EQ(pool.pilots().at("100_0").raw_id, "101");
  demand = 2;
  slurm.squeue = "100_1|RUNNING|None|102\n100_2|RUNNING|None|100\n";
  slurm.sacct = {1, "", "sacct: error: Slurm accounting storage is disabled\n"};
  slurm.sacct_c = {0, "101|NODE_FAIL|0:0\n", ""};
  pool.Cycle();
  const auto& asked = slurm.calls.back();
  ASSERT_EQ(asked[1], "-c");
  EXPECT_EQ(asked.back(), "--jobs=101") << "the completion log is asked by the element's own id";
  EXPECT_TRUE(pool.pilots().at("100_0").final);
  EXPECT_EQ(pool.pilots().at("100_0").state, "NODE_FAIL") << "not GONE: the log's record is found by its own id";
}

TEST(SlurmPool, ForgetsTheOldestEndedPilots) {
  FakeSlurm slurm;
  SlurmPool pool(SlurmOptions(), slurm.Runner(), [] { return 1; });
  slurm.sacct = {1, "", "sacct: error: Slurm accounting storage is disabled\n"};
  // Every cycle: the last pilot left the queue (ended), a new one is submitted.
  for (size_t i = 0; i < SlurmPool::kKeptEnded + 10; ++i) pool.Cycle();
  const auto pilots = pool.pilots();
  EXPECT_EQ(pilots.size(), SlurmPool::kKeptEnded + 1) << "the kept ends and the live pilot";
  EXPECT_EQ(pool.alive(), 1);
  EXPECT_EQ(pilots.count("100"), 0u) << "the oldest end is forgotten";
}

TEST(SlurmPool, RefusesToStartWithoutSbatch) {
  SlurmPool pool(
      SlurmOptions(),
      [](const std::vector<std::string>&, const std::string&) -> absl::StatusOr<CommandResult> {
        return absl::NotFoundError("cannot run sbatch: No such file or directory");
      },
      [] { return 0; });
  absl::Status s = pool.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("needs Slurm's sbatch"), std::string::npos) << s;
}

TEST(SlurmPool, RunCommandCapturesOutputAndExitCode) {
  absl::StatusOr<CommandResult> r = RunCommand({"sh", "-c", "cat; echo err >&2; exit 3"}, "hello");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->out, "hello");
  EXPECT_EQ(r->err, "err\n");
  EXPECT_EQ(r->exit_code, 3);
  EXPECT_EQ(RunCommand({"/no/such/program"}, "").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace circuitlab::remote
