// End-to-end tests: the circuitlab-server and circuitlab binaries, driven as
// a user drives them (paths come from CMake).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "client/lib/client.h"
#include "tests/test_util/process.h"
#include "tests/test_util/temp_dir.h"

namespace circuitlab {
namespace {

using testing::CommandResult;
using testing::RunCommand;
using testing::ServerProcess;
using testing::TempDir;
using testing::WaitFor;

const std::string kServer = CIRCUITLAB_SERVER_BIN;
const std::string kCli = CIRCUITLAB_CLI_BIN;
const std::string kWorker = CIRCUITLAB_WORKER_BIN;
const std::string kExamples = CIRCUITLAB_EXAMPLES_DIR;

CommandResult Cli(const ServerProcess& server, std::vector<std::string> args) {
  std::vector<std::string> argv = {kCli, "--server", server.address()};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv);
}

std::string WriteSpec(const TempDir& dir, const std::string& name, const std::string& json) {
  const std::string path = dir.path() + "/" + name;
  std::ofstream(path) << json;
  return path;
}

constexpr const char* kTinySpec = R"({
  "name": "e2e", "seed": 5, "tags": ["e2e"],
  "task": {"associative_recall": {"num_common": 4, "num_rare": 12, "num_heldout": 4, "num_blocks": 4,
                                  "num_positions": 8}},
  "training": {"learning_rate": 4.0, "batch_size": 32, "steps": STEPS},
  "recording": {"metrics_every": 10, "eval_every": 50, "eval_size": 64, "checkpoint_every": 25}
})";

std::string Tiny(int steps) {
  std::string s = kTinySpec;
  s.replace(s.find("STEPS"), 5, std::to_string(steps));
  return s;
}

TEST(EndToEndTest, UserSessionThroughTheCli) {
  TempDir dir;
  ServerProcess server(kServer, dir.path() + "/data");
  ASSERT_TRUE(server.ok());

  // Health, then what the server runs on (LibTorch, CUDA devices, slots).
  CommandResult health = Cli(server, {"health"});
  EXPECT_EQ(health.exit_code, 0) << health.out;
  EXPECT_NE(health.out.find("SERVING " + server.address() + "\ncircuitlab "), std::string::npos) << health.out;
  EXPECT_NE(health.out.find(", LibTorch "), std::string::npos) << health.out;
  EXPECT_NE(health.out.find(" CUDA device"), std::string::npos) << health.out;
  EXPECT_NE(health.out.find(", slots cpu:0"), std::string::npos) << health.out;
  const std::string spec = WriteSpec(dir, "tiny.json", Tiny(100));
  CommandResult submit = Cli(server, {"submit", spec, "--watch"});
  EXPECT_EQ(submit.exit_code, 0) << submit.out;
  EXPECT_NE(submit.out.find("r1 SUCCEEDED"), std::string::npos) << submit.out;
  EXPECT_NE(submit.out.find("eval/icl_rare/accuracy"), std::string::npos);

  // The server's HTTP port (ServerProcess asks for an ephemeral one) and
  // `circuitlab open`, which checks the run exists before it prints its page.
  ASSERT_GT(server.http_port(), 0);
  const std::string dashboard = "http://127.0.0.1:" + std::to_string(server.http_port()) + "/";
  CommandResult open = Cli(server, {"open", "r1", "--dashboard", dashboard});
  EXPECT_EQ(open.exit_code, 0) << open.out;
  EXPECT_EQ(open.out, dashboard + "#/run/r1\n");
  EXPECT_EQ(Cli(server, {"open", "r9", "--dashboard", dashboard}).exit_code, 15) << "NOT_FOUND, not a dead link";
  EXPECT_EQ(Cli(server, {"open"}).out, "http://127.0.0.1:8080/\n") << "the default: the --server host, port 8080";

  CommandResult ls = Cli(server, {"ls", "--tag", "e2e"});
  EXPECT_EQ(ls.exit_code, 0);
  EXPECT_NE(ls.out.find("SUCCEEDED"), std::string::npos) << ls.out;

  CommandResult json = Cli(server, {"--json", "show", "r1"});
  ASSERT_EQ(json.exit_code, 0);
  EXPECT_NE(json.out.find("\"state\": \"RUN_STATE_SUCCEEDED\""), std::string::npos) << json.out;

  CommandResult csv = Cli(server, {"metrics", "r1", "--name", "train/loss", "--csv"});
  ASSERT_EQ(csv.exit_code, 0);
  EXPECT_EQ(csv.out.rfind("run_id,name,step,value\n", 0), 0u) << csv.out;
  EXPECT_EQ(std::count(csv.out.begin(), csv.out.end(), '\n'), 11);  // header + steps 10..100
  EXPECT_NE(csv.out.find("r1,train/loss,100,"), std::string::npos);

  // IMIR coordinates over training and the projection of a checkpoint.
  CommandResult coords = Cli(server, {"coords", "r1", "--name", "alpha", "--csv"});
  ASSERT_EQ(coords.exit_code, 0) << coords.out;
  EXPECT_NE(coords.out.find("r1,\"L1H1:[∅→∅]:S_1\",alpha,100,"), std::string::npos) << coords.out;
  CommandResult project = Cli(server, {"project", "r1", "--complete"});
  ASSERT_EQ(project.exit_code, 0) << project.out;
  EXPECT_NE(project.out.find("r1 step 100, complete basis"), std::string::npos) << project.out;
  EXPECT_NE(project.out.find("rho "), std::string::npos);
  // No checkpoint there. (Debian 13's tier once saw 24, UNAVAILABLE, here under CI's load: the message says
  // which layer answered.)
  CommandResult missing = Cli(server, {"project", "r1", "--step", "7"});
  EXPECT_EQ(missing.exit_code, 15) << missing.out;
  // The analysis jobs: none left queued; an unknown job is NOT_FOUND.
  CommandResult jobs = Cli(server, {"analyses"});
  ASSERT_EQ(jobs.exit_code, 0) << jobs.out;
  EXPECT_NE(jobs.out.find("0 job(s); 1 worker(s)"), std::string::npos) << jobs.out;
  EXPECT_EQ(Cli(server, {"cancel-analysis", "a999"}).exit_code, 15);

  // A submitted run can be watched separately and cancelled.
  CommandResult queued = Cli(server, {"submit", WriteSpec(dir, "long.json", Tiny(1000000))});
  ASSERT_EQ(queued.exit_code, 0) << queued.out;
  CommandResult cancel = Cli(server, {"cancel", "r2", "--wait"});
  EXPECT_EQ(cancel.exit_code, 0);
  EXPECT_NE(cancel.out.find("CANCELLED"), std::string::npos) << cancel.out;
  EXPECT_EQ(Cli(server, {"watch", "r2"}).exit_code, 1) << "watching a cancelled run exits 1";

  // rm deletes ended runs with their checkpoints (issue 14 item 11); the
  // ids are not reused.
  CommandResult rm = Cli(server, {"rm", "r1", "r2"});
  EXPECT_EQ(rm.exit_code, 0) << rm.out;
  EXPECT_NE(rm.out.find("deleted r1, "), std::string::npos) << rm.out;
  EXPECT_EQ(Cli(server, {"show", "r1"}).exit_code, 15);  // NOT_FOUND
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/data/checkpoints/r1"));
  CommandResult again = Cli(server, {"submit", WriteSpec(dir, "again.json", Tiny(1000000))});
  EXPECT_NE(again.out.find("r3"), std::string::npos) << again.out;
  CommandResult busy = Cli(server, {"rm", "r3"});
  EXPECT_NE(busy.exit_code, 0);
  EXPECT_NE(busy.out.find("cancel it first"), std::string::npos) << busy.out;

  EXPECT_EQ(server.Stop(SIGTERM), 0) << "SIGTERM drains and exits 0";
}

TEST(EndToEndTest, ErrorsAreClearAndExitCodesMapStatuses) {
  TempDir dir;
  ServerProcess server(kServer, dir.path() + "/data");
  ASSERT_TRUE(server.ok());

  // An unknown field is named by protobuf's own JSON parser: exit 2.
  CommandResult unknown = Cli(server, {"submit", WriteSpec(dir, "typo.json", R"({"trainig": {}})")});
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.out.find("trainig"), std::string::npos) << unknown.out;

  // An out-of-range value: INVALID_ARGUMENT (10 + 3) naming field, range, value.
  CommandResult bad = Cli(server, {"submit", WriteSpec(dir, "bad.json", R"({"training": {"batch_size": 0}})")});
  EXPECT_EQ(bad.exit_code, 13);
  EXPECT_NE(bad.out.find("training.batch_size must be in [1, 65536], got 0"), std::string::npos) << bad.out;

  EXPECT_EQ(Cli(server, {"show", "r42"}).exit_code, 15);  // NOT_FOUND
  CommandResult verb = Cli(server, {"frobnicate"});
  EXPECT_EQ(verb.exit_code, 2);
  EXPECT_NE(verb.out.find("unknown command; the commands are:\n  submit"), std::string::npos) << verb.out;
  EXPECT_NE(verb.out.find("cancel-analysis"), std::string::npos) << verb.out;
  for (const char* t : {"0", "-1", "nan", "1e9"}) {
    CommandResult timeout = Cli(server, {"--timeout", t, "health"});
    EXPECT_EQ(timeout.exit_code, 2) << t;
    EXPECT_NE(timeout.out.find("(0, 86400]"), std::string::npos) << timeout.out;
  }
  CommandResult endless = Cli(server, {"submit", "/dev/zero"});  // read with a cap, not forever
  EXPECT_EQ(endless.exit_code, 2);
  EXPECT_NE(endless.out.find("larger than 4 MiB"), std::string::npos) << endless.out;
  CommandResult help = Cli(server, {"--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("submit"), std::string::npos);
  EXPECT_NE(help.out.find("Exit codes"), std::string::npos);

  server.Stop(SIGTERM);
  CommandResult down = RunCommand({kCli, "--server", server.address(), "--timeout", "2", "health"});
  EXPECT_EQ(down.exit_code, 24) << down.out;  // UNAVAILABLE
}

// A worker asked for a GPU this machine does not have refuses to start,
// naming the LibTorch and the devices it sees (issue 35).
TEST(EndToEndTest, WorkerRefusesADeviceItDoesNotHave) {
  for (const std::string device : {"cuda:99", "cuda:x", "cuda:-1"}) {
    CommandResult r = RunCommand({kWorker, "--server", "127.0.0.1:1", "--device", device});
    EXPECT_EQ(r.exit_code, 2) << device << ": " << r.out;
    EXPECT_NE(r.out.find("--device " + device + " is not available: LibTorch "), std::string::npos) << r.out;
  }
}

// Every command's --help shows an example; every example file it names exists.
TEST(EndToEndTest, EveryHelpExampleExists) {
  CommandResult list = RunCommand({kCli, "no-such-command"});
  std::istringstream lines(list.out);
  std::string line;
  int commands = 0, files = 0;
  while (std::getline(lines, line)) {
    if (line.rfind("  ", 0) != 0) continue;
    const std::string verb = line.substr(2);
    CommandResult help = RunCommand({kCli, verb, "--help"});
    ASSERT_EQ(help.exit_code, 0) << verb;
    EXPECT_NE(help.out.find("  circuitlab " + verb), std::string::npos) << verb << " --help has no example";
    ++commands;
    for (size_t at = help.out.find("examples/"); at != std::string::npos; at = help.out.find("examples/", at + 1)) {
      const size_t end = help.out.find_first_of(" \n", at);
      const std::string file = help.out.substr(at + 9, end - at - 9);
      std::ifstream in(kExamples + "/" + file);
      EXPECT_TRUE(in.good()) << verb << " --help cites examples/" << file << ", which does not exist";
      ++files;
    }
  }
  EXPECT_GE(commands, 21);
  EXPECT_GE(files, 4);
}

// A token file written on Windows (CRLF) or with trailing blanks works for the
// server and the CLI alike.
TEST(EndToEndTest, TokenFilesAreTrimmed) {
  TempDir dir;
  const std::string token = dir.path() + "/token";
  std::ofstream(token) << "0123456789abcdef0123\r\n";
  ServerProcess server(kServer, dir.path() + "/data", {"--auth-token-file", token});
  ASSERT_TRUE(server.ok());
  const std::string spaced = dir.path() + "/token2";
  std::ofstream(spaced) << "  0123456789abcdef0123 \n";
  EXPECT_EQ(Cli(server, {"--token-file", token, "health"}).exit_code, 0);
  EXPECT_EQ(Cli(server, {"--token-file", spaced, "ls"}).exit_code, 0);
  EXPECT_EQ(Cli(server, {"ls"}).exit_code, 26);  // UNAUTHENTICATED without it
}

// kill -9 at any moment loses at most the last unflushed batch; the restarted
// server resumes the run from its checkpoint, and on CPU it ends with exactly
// the final loss of an uninterrupted run of the same spec.
// A latent-task run and its task-vector geometry, as a user asks for them.
TEST(EndToEndTest, TaskVectorsThroughTheCli) {
  TempDir dir;
  ServerProcess server(kServer, dir.path() + "/data");
  ASSERT_TRUE(server.ok());
  const std::string spec = WriteSpec(dir, "dice.json", R"({"seed": 2,
    "task": {"latent": {"kind": "LATENT_KIND_DICE", "seq_len": 16}},
    "model": {"decoder": {"num_layers": 1, "d_model": 16, "num_heads": 2}},
    "training": {"steps": 40}, "recording": {"eval_size": 32, "checkpoint_every": 20}})");
  CommandResult submit = Cli(server, {"submit", spec, "--watch"});
  ASSERT_EQ(submit.exit_code, 0) << submit.out;
  EXPECT_NE(submit.out.find("eval/ood/bayes_loss"), std::string::npos) << submit.out;
  CommandResult text = Cli(server, {"task-vectors", "r1", "--analysis", "p0,ood_r2", "--samples", "16"});
  ASSERT_EQ(text.exit_code, 0) << text.out;
  EXPECT_NE(text.out.find("p0/resid_ratio"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("ood_r2/code"), std::string::npos) << text.out;
  CommandResult csv = Cli(server, {"task-vectors", "r1", "--analysis", "ood_r2", "--all-checkpoints", "--csv"});
  ASSERT_EQ(csv.exit_code, 0) << csv.out;
  EXPECT_EQ(csv.out.rfind("run_id,step,sweep_values,name,layer,position,value\n", 0), 0u) << csv.out;
  EXPECT_NE(csv.out.find("r1,20,,ood_r2/code,1,-1,"), std::string::npos) << csv.out;  // layers from 1
  EXPECT_NE(csv.out.find("r1,40,,ood_r2/code,1,-1,"), std::string::npos) << csv.out;
  EXPECT_EQ(Cli(server, {"task-vectors", "r1", "--layer", "3"}).exit_code, 13);  // INVALID_ARGUMENT
  EXPECT_EQ(Cli(server, {"task-vectors", "r1", "--layer", "0"}).exit_code, 13);  // layers count from 1
  EXPECT_EQ(Cli(server, {"detect", "r1"}).exit_code, 19);                       // FAILED_PRECONDITION
  EXPECT_EQ(Cli(server, {"task-vectors"}).exit_code, 2);                        // no target
}

// Issue 4's user path: sweep a slice of the phase-diagram plane, map it, pick
// a cell, ask which pair won and how (label), which circuit (detect), and what
// zeroing one of its coordinates does (intervene). Four cells of
// examples/phase_diagram.json's plane, a, b in {0, 0.5}: on the shipped map
// (a, b) = (0, 0.5) is 2-3 and (0.5, 0) is 1-2.
TEST(EndToEndTest, PhaseDiagramCellThroughTheCli) {
  TempDir dir;
  ServerProcess server(kServer, dir.path() + "/data");
  ASSERT_TRUE(server.ok());
  const std::string p = "/model/imir/initial_coordinates/";
  const std::string sweep = WriteSpec(dir, "plane.json", R"({"name": "plane", "base": {"seed": 1,
    "task": {"associative_recall": {"num_common": 0, "num_rare": 24, "num_heldout": 8, "num_blocks": 6,
      "block_length": 2, "position_mode": "POSITION_MODE_BLOCK_OFFSET", "num_positions": 16}},
    "data": {"rare_fraction": 1.0, "burstiness": 1},
    "model": {"imir": {"num_layers": 3, "num_heads": 1, "parameterisation": "PARAMETERISATION_COORDINATES",
      "coordinate_scaling": "COORDINATE_SCALING_UNIT_NORM", "init": "INIT_SCHEME_ZERO"}},
    "training": {"learning_rate": 8.0, "batch_size": 64, "steps": 1500, "stop_metric": "eval/icl_rare/accuracy",
      "stop_at": 0.95},
    "recording": {"metrics_every": 10, "eval_every": 10, "eval_size": 512, "checkpoint_every": 100}},
    "axes": [{"name": "a", "field": ")" + p + R"(L1H1:[∅→∅]:S_1",
              "also": [")" + p + R"(L2H1:[∅→(1,0,0)]:I_t", ")" + p + R"(OUT:[(0,1,0)]:I"], "values": [0, 0.5]},
             {"name": "b", "field": ")" + p + R"(L2H1:[∅→∅]:S_1",
              "also": [")" + p + R"(L3H1:[∅→(0,1,0)]:I_t", ")" + p + R"(OUT:[(0,0,1)]:I"], "values": [0.5, 0]}]})");
  CommandResult submitted = Cli(server, {"sweep", sweep, "--watch"});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.out;
  const std::string svg = dir.path() + "/map.svg";
  // The README's command: the pivot fetches the column it pivots (no --values).
  CommandResult map = Cli(server, {"--timeout", "120", "sweep-summary", "s1", "--pivot", "a", "b", "--value", "pair",
                                   "--svg", svg, "--wait"});
  ASSERT_EQ(map.exit_code, 0) << map.out;
  EXPECT_NE(map.out.find("2-3"), std::string::npos) << map.out;
  EXPECT_NE(map.out.find("1-2"), std::string::npos) << map.out;
  std::ifstream in(svg);
  const std::string drawn((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(drawn.find("a=0, b=0.5: 2-3"), std::string::npos) << drawn.substr(0, 400);
  // r1 is the cell (0, 0.5): pair 2-3, carried by its match coordinate alone.
  CommandResult label = Cli(server, {"--timeout", "120", "label", "r1"});
  ASSERT_EQ(label.exit_code, 0) << label.out;
  EXPECT_NE(label.out.find("pair 2-3"), std::string::npos) << label.out;
  EXPECT_NE(label.out.find("pair paths (match coordinates):"), std::string::npos) << label.out;
  CommandResult detect = Cli(server, {"--timeout", "120", "detect", "r1"});
  ASSERT_EQ(detect.exit_code, 0) << detect.out;
  EXPECT_NE(detect.out.find("L3H1:[∅→(0,1,0)]:I_t"), std::string::npos) << detect.out;
  CommandResult zeroed = Cli(server, {"--timeout", "120", "intervene", "r1", "--zero", "L3H1:[∅→(0,1,0)]:I_t",
                                      "--eval-sets", "icl_rare", "--n-eval", "512"});
  ASSERT_EQ(zeroed.exit_code, 0) << zeroed.out;
  // SET ACC ACC' ...: the 2-3 match coordinate carries the recall (measured
  // 0.980 -> 0.502 on these 512 sequences).
  const size_t row = zeroed.out.find("icl_rare ");
  ASSERT_NE(row, std::string::npos) << zeroed.out;
  double clean = 0, after = 0;
  ASSERT_EQ(std::sscanf(zeroed.out.c_str() + row, "icl_rare %lf %lf", &clean, &after), 2) << zeroed.out;
  EXPECT_GE(clean, 0.95);
  EXPECT_LE(after, 0.6 * clean) << zeroed.out;
  // Activation patching through the CLI: two sites and all at once, as CSV.
  CommandResult patched =
      Cli(server, {"--timeout", "120", "intervene", "r1", "--patch", "L1.H1.out", "--positions", "0,5", "--patch-from",
                   "icl_rare", "--eval-sets", "icl_rare", "--n-eval", "256", "--per-position", "--csv"});
  ASSERT_EQ(patched.exit_code, 0) << patched.out;
  EXPECT_EQ(patched.out.rfind("eval_set,kind,hook,position,metric,value\n", 0), 0u) << patched.out;
  for (const char* row : {"icl_rare,patch,L1.H1.out,0,effect_accuracy,", "icl_rare,patch,L1.H1.out,5,loss,",
                          "icl_rare,patch,L1.H1.out,all,effect_loss,", "icl_rare,patch_source,,,accuracy,",
                          "icl_rare,position,,13,accuracy_clean,"}) {
    EXPECT_NE(patched.out.find(row), std::string::npos) << row << "\n" << patched.out;
  }
  EXPECT_EQ(Cli(server, {"intervene", "r1", "--positions", "3"}).exit_code, 2);  // positions need --patch
  EXPECT_EQ(server.Stop(SIGTERM), 0);
}

TEST(EndToEndTest, KilledServerResumesRunsWithIdenticalResults) {
  TempDir dir;
  const std::string data = dir.path() + "/data";
  const std::string spec = WriteSpec(dir, "resume.json", Tiny(600));
  auto client_for = [](const ServerProcess& s) {
    client::ClientOptions o;
    o.server = s.address();
    return std::make_unique<client::Client>(o);
  };
  {
    ServerProcess server(kServer, data);
    ASSERT_TRUE(server.ok());
    ASSERT_EQ(Cli(server, {"submit", spec}).exit_code, 0);
    auto c = client_for(server);
    ASSERT_TRUE(WaitFor([&] {
      auto run = c->GetRun("r1");
      return run.ok() && run->checkpoint_step() >= 100;
    }));
    EXPECT_EQ(server.Stop(SIGKILL), 128 + SIGKILL);
  }
  ServerProcess server(kServer, data);
  ASSERT_TRUE(server.ok());
  CommandResult watch = Cli(server, {"watch", "r1"});
  EXPECT_EQ(watch.exit_code, 0) << watch.out;
  ASSERT_EQ(Cli(server, {"submit", spec, "--watch"}).exit_code, 0);

  auto c = client_for(server);
  EXPECT_EQ(c->GetRun("r1")->attempts(), 2u);
  EXPECT_EQ(c->GetRun("r2")->attempts(), 1u);
  v1::GetMetricsRequest req;
  req.add_names("train/loss");
  req.add_names("eval/icl_rare/accuracy");
  req.set_run_id("r1");
  auto resumed = c->GetMetrics(req);
  req.set_run_id("r2");
  auto straight = c->GetMetrics(req);
  ASSERT_TRUE(resumed.ok() && straight.ok());
  ASSERT_EQ(resumed->series_size(), 2);
  for (int i = 0; i < 2; ++i) {
    // Every recorded step matches, including those recomputed after the resume.
    EXPECT_EQ(resumed->series(i).steps_size(), straight->series(i).steps_size());
    for (int k = 0; k < straight->series(i).values_size(); ++k) {
      EXPECT_EQ(resumed->series(i).values(k), straight->series(i).values(k))
          << resumed->series(i).name() << " at step " << straight->series(i).steps(k);
    }
  }
  EXPECT_EQ(server.Stop(SIGTERM), 0);
}

// Issue 14 item 9: `circuitlab-server --backup` while the server trains, a
// restore at another path, and the run resumed there ends with the metrics of
// an uninterrupted run. A database that lost runs the disk still holds is
// refused at start.
TEST(EndToEndTest, BackupWhileRunningRestoresElsewhereAndResumes) {
  TempDir dir;
  const std::string data = dir.path() + "/data", copy = dir.path() + "/elsewhere/restored";
  const std::string spec = WriteSpec(dir, "backup.json", Tiny(600));
  {
    ServerProcess server(kServer, data);
    ASSERT_TRUE(server.ok());
    ASSERT_EQ(Cli(server, {"submit", spec}).exit_code, 0);
    client::ClientOptions o;
    o.server = server.address();
    client::Client c(o);
    ASSERT_TRUE(WaitFor([&] {
      auto run = c.GetRun("r1");
      return run.ok() && run->checkpoint_step() >= 100;
    }));
    CommandResult backup = RunCommand({kServer, "--data", data, "--backup", copy});
    ASSERT_EQ(backup.exit_code, 0) << backup.out;
    EXPECT_EQ(server.Stop(SIGTERM), 0);
  }
  ServerProcess restored(kServer, copy);
  ASSERT_TRUE(restored.ok());
  ASSERT_EQ(Cli(restored, {"watch", "r1"}).exit_code, 0);
  ASSERT_EQ(Cli(restored, {"submit", spec, "--watch"}).exit_code, 0);
  client::ClientOptions o;
  o.server = restored.address();
  client::Client c(o);
  // (r1 normally resumes here from a backed-up checkpoint, attempts 2; on a
  // loaded machine it may have ended before the backup: the metrics agree
  // either way.)
  v1::GetMetricsRequest req;
  req.add_names("train/loss");
  req.set_run_id("r1");
  auto resumed = c.GetMetrics(req);
  req.set_run_id("r2");
  auto straight = c.GetMetrics(req);
  ASSERT_TRUE(resumed.ok() && straight.ok());
  ASSERT_EQ(resumed->series_size(), 1);
  ASSERT_EQ(resumed->series(0).values_size(), straight->series(0).values_size());
  for (int k = 0; k < straight->series(0).values_size(); ++k) {
    EXPECT_EQ(resumed->series(0).values(k), straight->series(0).values(k)) << "step " << straight->series(0).steps(k);
  }
  EXPECT_EQ(restored.Stop(SIGTERM), 0);

  // The naive backup: the database without its runs (here: removed), the
  // checkpoint directories still there. The server refuses to start rather
  // than hand out r1 again.
  std::filesystem::remove(copy + "/circuitlab.db");
  std::filesystem::remove(copy + "/circuitlab.db-wal");
  std::filesystem::remove(copy + "/circuitlab.db-shm");
  CommandResult refused = RunCommand({kServer, "--data", copy, "--listen", "127.0.0.1:0"});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.out.find("has lost runs that the disk still holds (checkpoints/r1 .. r2"), std::string::npos)
      << refused.out;
}

}  // namespace
}  // namespace circuitlab

namespace circuitlab {
namespace {

// A lab server as the README's Security section sets it up: certificates
// from scripts/dev-certs.sh, principals from scripts/add-principal.sh, TLS,
// tokens and the audit log; then users through the CLI, and a revocation
// applied by SIGHUP without a restart.
TEST(EndToEndTest, SecuredServerThroughTheCli) {
  TempDir dir;
  const std::string scripts = CIRCUITLAB_SCRIPTS_DIR;
  const std::string tokens = dir.path() + "/tokens.txt";
  ASSERT_EQ(RunCommand({scripts + "/dev-certs.sh", dir.path() + "/certs"}).exit_code, 0);
  for (const char* who : {"alice user", "bob user", "root admin"}) {
    const std::string name = std::string(who).substr(0, std::string(who).find(' '));
    const std::string role = std::string(who).substr(name.size() + 1);
    CommandResult added = RunCommand({scripts + "/add-principal.sh", name, role, tokens, dir.path()});
    ASSERT_EQ(added.exit_code, 0) << added.out;
  }
  EXPECT_EQ(RunCommand({scripts + "/add-principal.sh", "alice", "user", tokens, dir.path()}).exit_code, 1)
      << "a name is added once";
  const std::string audit = dir.path() + "/audit.jsonl";
  ServerProcess server(kServer, dir.path() + "/data",
                       {"--tls-cert", dir.path() + "/certs/server.pem", "--tls-key", dir.path() + "/certs/server.key",
                        "--auth-tokens-file", tokens, "--audit-log", audit});
  ASSERT_TRUE(server.ok());
  auto as = [&](const std::string& who, std::vector<std::string> args) {
    std::vector<std::string> argv = {kCli,
                                     "--server",
                                     server.address(),
                                     "--ca-cert",
                                     dir.path() + "/certs/ca.pem",
                                     "--token-file",
                                     dir.path() + "/" + who + ".token"};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv);
  };

  CommandResult plaintext = Cli(server, {"health"});
  EXPECT_EQ(plaintext.exit_code, 24) << plaintext.out;
  EXPECT_NE(plaintext.out.find("--ca-cert"), std::string::npos) << "the hint names the flag: " << plaintext.out;
  EXPECT_EQ(as("alice", {"health"}).exit_code, 0);
  CommandResult me = as("alice", {"whoami"});
  ASSERT_EQ(me.exit_code, 0) << me.out;
  EXPECT_NE(me.out.find("principal  alice"), std::string::npos) << me.out;
  EXPECT_NE(me.out.find("transport  TLS"), std::string::npos) << me.out;

  ASSERT_EQ(as("alice", {"submit", WriteSpec(dir, "long.json", Tiny(1000000))}).exit_code, 0);
  CommandResult mine = as("bob", {"ls", "--mine"});
  EXPECT_EQ(mine.exit_code, 0);
  EXPECT_EQ(mine.out.find("r1 "), std::string::npos) << mine.out;
  CommandResult all = as("bob", {"ls"});
  EXPECT_NE(all.out.find("alice"), std::string::npos) << "the owner column: " << all.out;
  CommandResult denied = as("bob", {"cancel", "r1"});
  EXPECT_EQ(denied.exit_code, 17) << denied.out;  // 10 + PERMISSION_DENIED
  EXPECT_NE(denied.out.find("belongs to 'alice'"), std::string::npos) << denied.out;

  // Bob's line removed; SIGHUP re-reads the file; his token stops working.
  ASSERT_EQ(RunCommand({"/bin/sh", "-c",
                        "grep -v '^bob ' " + tokens + " > " + tokens + ".new && mv " + tokens + ".new " + tokens})
                .exit_code,
            0);
  kill(server.pid(), SIGHUP);
  EXPECT_TRUE(WaitFor([&] { return as("bob", {"whoami"}).exit_code == 26; }, std::chrono::seconds(10)))
      << "UNAUTHENTICATED (10 + 16) after SIGHUP";
  EXPECT_EQ(as("alice", {"cancel", "r1", "--wait"}).exit_code, 0);

  std::ifstream in(audit);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"principal\":\"bob\",\"role\":\"user\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"method\":\"CancelRun\",\"target\":\"r1\",\"outcome\":\"PERMISSION_DENIED\""),
            std::string::npos)
      << text;
  EXPECT_EQ(server.Stop(SIGTERM), 0);
}

}  // namespace
}  // namespace circuitlab
