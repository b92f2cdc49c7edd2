// circuitlab-worker: flags -> the LibTorch executor and a Worker (worker.h);
// SIGTERM/SIGINT/SIGUSR2 drain it (its runs checkpoint and go back to the
// server), a second signal exits at once.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string_view>
#include <thread>

#include "server/common/logging.h"
#include "server/engine/api.h"
#include "worker/worker.h"

namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

bool ReadFile(const std::string& path, std::string* out, bool first_line) {
  std::ifstream in(path);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  if (first_line) {
    *out = out->substr(0, out->find('\n'));
    while (!out->empty() && (out->back() == '\r' || out->back() == ' ')) out->pop_back();
  }
  return true;
}

// The GPUs this process was given, as the batch system or a person set
// them: "CUDA_VISIBLE_DEVICES=0,1 (SLURM_JOB_GPUS=2,3)", or "" when unset.
std::string GivenGpus() {
  const std::string visible = Env("CUDA_VISIBLE_DEVICES"), slurm = Env("SLURM_JOB_GPUS");
  if (visible.empty() && slurm.empty()) return "";
  std::string out = "CUDA_VISIBLE_DEVICES=" + (visible.empty() ? std::string("(unset)") : visible);
  if (!slurm.empty()) out += " (SLURM_JOB_GPUS=" + slurm + ")";
  return out;
}

}  // namespace

// The flags that are not WorkerOptions fields.
struct Flags {
  std::string token_file = Env("CIRCUITLAB_TOKEN_FILE"), ca_cert = Env("CIRCUITLAB_CA_CERT");
  std::string client_cert, client_key, log_level = "info";
  bool cuda_deterministic = true;
};

void DefineFlags(CLI::App& app, circuitlab::worker::WorkerOptions& o, Flags& f) {
  o.server = Env("CIRCUITLAB_TARGET").empty() ? o.server : Env("CIRCUITLAB_TARGET");
  if (!Env("SLURM_JOB_ID").empty()) o.engine_job = "slurm:" + Env("SLURM_JOB_ID");
  app.add_option("--server", o.server, "host:port of the server (env CIRCUITLAB_TARGET)")->capture_default_str();
  app.add_option("--token-file", f.token_file, "File whose first line is the token (env CIRCUITLAB_TOKEN_FILE)");
  app.add_option("--ca-cert", f.ca_cert, "PEM CA of the server's certificate; turns TLS on (env CIRCUITLAB_CA_CERT)");
  app.add_flag("--tls", o.tls, "TLS with the system's CAs");
  app.add_option("--client-cert", f.client_cert, "PEM client certificate (servers with mutual TLS)");
  app.add_option("--client-key", f.client_key, "PEM key of --client-cert");
  app.add_option("--tls-server-name", o.tls_server_name, "Check the server's certificate for this name");
  app.add_option("--slots", o.slots, "Runs (or ensembles) trained at once")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--device", o.device, "Torch device: cpu or cuda:N")->capture_default_str();
  app.add_flag("--cuda-deterministic,!--no-cuda-deterministic", f.cuda_deterministic,
               "With --device cuda:N: deterministic CUDA kernels, a run repeats bit-for-bit on the same GPU\n"
               "and software (default on; off is somewhat faster)");
  app.add_option("--intra-op-threads", o.intra_op_threads, "LibTorch/BLAS threads per run")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_option("--engine-job", o.engine_job,
                 "What started this worker, shown in Run.device (default slurm:$SLURM_JOB_ID under Slurm)");
  app.add_option("--idle-exit", o.idle_exit_seconds, "Exit after this many seconds with nothing to train (0 = never)")
      ->capture_default_str()
      ->check(CLI::Range(0, 86400 * 365));
  app.add_option("--connect-timeout", o.connect_timeout_seconds, "Give up at start after this many seconds")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  app.add_option("--reconnect-seconds", o.reconnect_seconds,
                 "After losing the server, dial again for this long before exiting")
      ->capture_default_str()
      ->check(CLI::Range(0, 86400 * 7));
  app.add_option("--log-level", f.log_level, "trace|debug|info|warn|error|off")->capture_default_str();
  app.set_version_flag("--version", "circuitlab-worker " CIRCUITLAB_VERSION);
}

// Logging, the token and PEM files read, the device checked, the host
// named; 0, or the exit code (2) after saying why.
int Prepare(circuitlab::worker::WorkerOptions& o, const Flags& f) {
  if (absl::Status s = circuitlab::SetupLogging(f.log_level); !s.ok()) {
    std::fprintf(stderr, "circuitlab-worker: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (!f.token_file.empty() && !ReadFile(f.token_file, &o.token, true)) {
    std::fprintf(stderr, "circuitlab-worker: cannot read --token-file %s\n", f.token_file.c_str());
    return 2;
  }
  for (auto [path, pem, flag] : {std::tuple<const std::string*, std::string*, const char*>{&f.ca_cert, &o.ca_cert_pem, "--ca-cert"},
                                 {&f.client_cert, &o.client_cert_pem, "--client-cert"},
                                 {&f.client_key, &o.client_key_pem, "--client-key"}}) {
    if (!path->empty() && !ReadFile(*path, pem, false)) {
      std::fprintf(stderr, "circuitlab-worker: cannot read %s %s\n", flag, path->c_str());
      return 2;
    }
  }
  if (o.device != "cpu" && o.device.rfind("cuda:", 0) != 0) {
    std::fprintf(stderr, "circuitlab-worker: --device must be cpu or cuda:N, got '%s'\n", o.device.c_str());
    return 2;
  }
  const std::string gpus = GivenGpus();
  if (o.device != "cpu") {
    // Refused here, not at the first lease: a pilot on a node without the
    // GPU it was meant for should fail its job at once, saying why.
    const circuitlab::engine::TorchRuntime torch = circuitlab::engine::DescribeTorchRuntime();
    spdlog::info("devices: {}; given {}", torch.Describe(), gpus.empty() ? "no CUDA_VISIBLE_DEVICES" : gpus);
    int index = -1;
    const std::string_view n = std::string_view(o.device).substr(5);
    const auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), index);
    if (ec != std::errc() || end != n.data() + n.size() || index < 0 || index >= torch.cuda_devices) {
      std::fprintf(stderr, "circuitlab-worker: --device %s is not available: %s (given %s)\n", o.device.c_str(),
                   torch.Describe().c_str(), gpus.empty() ? "no CUDA_VISIBLE_DEVICES" : gpus.c_str());
      return 2;
    }
  }
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  o.host = host;
  o.version = CIRCUITLAB_VERSION;
  return 0;
}

// Trains until the worker ends, draining on SIGTERM/SIGINT/SIGUSR2; its exit code.
int Serve(const circuitlab::worker::WorkerOptions& o, bool cuda_deterministic) {
  // Signals are taken by sigwait on the main thread: the kernel offers a
  // process signal to the main thread first, so threads that libraries
  // started before this mask (with the signals unblocked) never get them.
  // Training runs on `runner`; it wakes us with SIGUSR1 when done.
  sigset_t signals;
  sigemptyset(&signals);
  for (int s : {SIGINT, SIGTERM, SIGUSR2, SIGUSR1}) sigaddset(&signals, s);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  circuitlab::engine::ConfigureRuntime(o.intra_op_threads);
  if (o.device != "cpu") circuitlab::engine::ConfigureCuda(cuda_deterministic);
  std::unique_ptr<circuitlab::engine::Executor> executor = circuitlab::engine::MakeTorchExecutor();
  circuitlab::worker::Worker worker(o, executor.get());
  int rc = 0;
  const pthread_t main_thread = pthread_self();
  std::thread runner([&] {
    rc = worker.Run();
    pthread_kill(main_thread, SIGUSR1);
  });
  int sig = 0, count = 0;
  while (sigwait(&signals, &sig) == 0 && sig != SIGUSR1) {
    if (++count > 1) {
      spdlog::warn("second signal: exiting without handing back the runs (the server re-queues them)");
      std::_Exit(1);
    }
    worker.Drain(sig == SIGUSR2   ? "SIGUSR2 (Slurm: the job nears its end or is preempted)"
                 : sig == SIGTERM ? "SIGTERM"
                                  : "SIGINT");
  }
  runner.join();
  return rc;
}

int main(int argc, char** argv) {
  CLI::App app{
      "circuitlab-worker: trains runs for a circuitlab server. Dials the server (TLS and a token with the worker\n"
      "role, as any client), leases runs, trains them with this machine's LibTorch and streams metrics,\n"
      "coordinates and checkpoints back; the server keeps the store. Slurm pilots run it (circuitlab-server\n"
      "--executor slurm); so can a Kubernetes Job or a person (--executor workers).\n"
      "SIGTERM/SIGUSR2: lease nothing more, checkpoint the runs, hand them back, exit 0.\n"
      "Exit codes: 0 drained or idle; 2 bad flags (a --device this machine lacks) or server unreachable\n"
      "at start; 3 server lost longer than --reconnect-seconds; 4 refused (token, role, version, a server\n"
      "without remote workers).\n\n"
      "Example:\n  circuitlab-worker --server login1:50051 --ca-cert ca.pem --token-file worker.token --slots 2",
      "circuitlab-worker"};
  circuitlab::worker::WorkerOptions o;
  Flags f;
  DefineFlags(app, o, f);
  CLI11_PARSE(app, argc, argv);
  if (const int rc = Prepare(o, f); rc != 0) return rc;
  return Serve(o, f.cuda_deterministic);
}
