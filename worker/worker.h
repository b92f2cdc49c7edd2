// circuitlab-worker: dials a circuitlab server (WorkerService.Session,
// worker_service.proto), leases runs, trains them with the same engine as the
// server would, and streams back metrics, progress, coordinates and
// checkpoints. The server stays the only writer of its store.
//
// One session at a time. A lost session (the server restarted, the network
// broke) stops the runs it held (the server re-queues them from their newest
// checkpoint) and the worker dials again for up to `reconnect_seconds`.
// Drain() (SIGTERM, SIGUSR2 from Slurm before a pilot's end) leases nothing
// more, preempts the runs (they checkpoint and are handed back) and ends the
// session; so does being idle for `idle_exit_seconds`.
//
// Exit codes (Run): 0 drained or idle; 2 the server could not be reached at
// start; 3 the server was lost for longer than reconnect_seconds; 4 the
// server refused the worker (token, role, version, no remote executor).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "circuitlab/v1/worker_service.pb.h"
#include "server/engine/api.h"

namespace grpc {
class Channel;
template <class W, class R>
class ClientReaderWriter;
}  // namespace grpc

namespace circuitlab::worker {

struct WorkerOptions {
  std::string server = "127.0.0.1:50051";
  std::string token;
  bool tls = false;
  std::string ca_cert_pem, client_cert_pem, client_key_pem, tls_server_name;
  int slots = 1;
  std::string device = "cpu";
  int intra_op_threads = 1;
  std::string engine_job;  // "slurm:4711", "k8s:worker-2"
  std::string host;
  std::string version;
  int idle_exit_seconds = 0;  // 0 = never
  int connect_timeout_seconds = 30;
  int reconnect_seconds = 300;
  size_t chunk_bytes = 1 << 20;
};

class Worker {
 public:
  // `executor` (the LibTorch one) must outlive the worker.
  Worker(WorkerOptions options, engine::Executor* executor);
  ~Worker();
  int Run();
  // Thread-safe; from the signal thread.
  void Drain(const std::string& why);

 private:
  struct LeaseRun;
  class Observer;
  enum class End { kDone, kLost, kRefused };

  End Session(std::string* why);
  // Applies one message of the server (a lease, a resume chunk, a stop, a
  // checkpoint ack); the lease to start now that it is complete, if any.
  std::shared_ptr<LeaseRun> OnServerMessage(const v1::ServerMessage& in);
  void StartLease(const std::shared_ptr<LeaseRun>& lease);
  void TrainLease(std::shared_ptr<LeaseRun> lease);
  // Writes one message on the session's stream (false once it is broken).
  bool Write(const v1::WorkerMessage& message);
  void Monitor();

  const WorkerOptions options_;
  engine::Executor* const executor_;
  std::shared_ptr<grpc::Channel> channel_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, std::shared_ptr<LeaseRun>> leases_;
  int training_ = 0;  // lease threads running
  std::atomic<bool> draining_{false};
  std::string drain_why_;
  bool drain_sent_ = false;
  bool session_open_ = false;
  bool closing_ = false;  // WritesDone sent: the session ends when the server closes
  double idle_since_ = 0;
  int heartbeat_seconds_ = 10;
  double ack_timeout_ = 120;
  size_t part_bytes_ = 1 << 20;  // checkpoint chunks and basis parts (Registered.max_message_bytes / 4)

  std::mutex write_mu_;
  grpc::ClientReaderWriter<v1::WorkerMessage, v1::ServerMessage>* stream_ = nullptr;  // under write_mu_
};

}  // namespace circuitlab::worker
