#include "worker/worker.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>

#include "circuitlab/v1/worker_service.grpc.pb.h"
#include "client/lib/channel.h"

namespace circuitlab::worker {
namespace {

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Codes after which dialling again cannot help.
bool Refusal(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAUTHENTICATED || code == grpc::StatusCode::PERMISSION_DENIED ||
         code == grpc::StatusCode::FAILED_PRECONDITION || code == grpc::StatusCode::INVALID_ARGUMENT ||
         code == grpc::StatusCode::UNIMPLEMENTED || code == grpc::StatusCode::RESOURCE_EXHAUSTED;
}

v1::MemberEnd ToEnd(const absl::StatusOr<engine::TrainOutcome>& o) {
  v1::MemberEnd e;
  if (!o.ok()) {
    e.set_end(v1::MemberEnd::END_FAILED);
    e.set_error(std::string(o.status().message()));
    e.set_code(static_cast<int>(o.status().code()));
    return e;
  }
  e.set_last_step(static_cast<uint64_t>(o->last_step));
  e.set_end(o->end == engine::TrainEnd::kCompleted   ? v1::MemberEnd::END_COMPLETED
            : o->end == engine::TrainEnd::kCancelled ? v1::MemberEnd::END_CANCELLED
                                                     : v1::MemberEnd::END_PREEMPTED);
  return e;
}

}  // namespace

struct Worker::LeaseRun {
  uint64_t id = 0;
  std::vector<v1::LeaseMember> members;
  std::vector<std::string> resume;  // received so far
  std::vector<CancelToken> tokens;
  uint64_t sequence = 0;  // last sent; under write_mu_
  bool started = false;
  // The session ended: nothing more is sent. Set under mu_ (so the
  // checkpoint-ack wait sees it), read under write_mu_ too: atomic.
  std::atomic<bool> lost{false};
  std::map<std::pair<uint32_t, uint64_t>, std::string> acks;  // (member, step) -> error; under mu_
  std::thread::id thread;
  bool Complete() const {
    for (size_t i = 0; i < members.size(); ++i) {
      if (resume[i].size() < members[i].resume_bytes()) return false;
    }
    return true;
  }
};

// Reports what one member produces. Metrics are batched (up to 512 points or
// until the next non-metric report) so that a fast run is not one message
// per step.
class Worker::Observer : public engine::TrainObserver {
 public:
  Observer(Worker* w, std::shared_ptr<LeaseRun> lease, uint32_t member)
      : w_(w), lease_(std::move(lease)), member_(member) {}
  ~Observer() override { Flush(); }

  void OnMetrics(int64_t step, const std::vector<engine::Metric>& metrics) override {
    for (const engine::Metric& m : metrics) {
      v1::ReportMetric* p = pending_.mutable_report()->mutable_metrics()->add_metrics();
      p->set_step(static_cast<uint64_t>(step));
      p->set_name(m.name);
      p->set_value(m.value);
    }
    if (pending_.report().metrics().metrics_size() >= 512) Flush();
  }

  void OnProgress(int64_t step, double steps_per_second) override {
    v1::WorkerMessage m;
    m.mutable_report()->mutable_progress()->set_step(static_cast<uint64_t>(step));
    m.mutable_report()->mutable_progress()->set_steps_per_second(steps_per_second);
    Send(m);
  }

  absl::Status OnCheckpoint(int64_t step, const std::string& bytes) override {
    const size_t chunk = std::min(w_->options_.chunk_bytes, w_->part_bytes_);
    for (size_t at = 0; at == 0 || at < bytes.size(); at += chunk) {
      v1::WorkerMessage m;
      v1::CheckpointChunk* c = m.mutable_report()->mutable_checkpoint();
      c->set_step(static_cast<uint64_t>(step));
      c->set_data(bytes.substr(at, chunk));
      c->set_last(at + chunk >= bytes.size());
      if (!Send(m)) return absl::UnavailableError("the connection to the server was lost");
    }
    // The server writes it (with its own retries) before the run goes on,
    // exactly as a local run waits for its store.
    std::unique_lock<std::mutex> lock(w_->mu_);
    const auto key = std::make_pair(member_, static_cast<uint64_t>(step));
    const bool answered = w_->cv_.wait_for(lock, std::chrono::duration<double>(w_->ack_timeout_),
                                           [&] { return lease_->acks.count(key) > 0 || lease_->lost; });
    if (lease_->lost) return absl::UnavailableError("the connection to the server was lost");
    if (!answered) return absl::DeadlineExceededError("the server did not confirm the checkpoint");
    const std::string error = lease_->acks[key];
    lease_->acks.erase(key);
    if (!error.empty()) return absl::UnavailableError("the server could not write the checkpoint: " + error);
    return absl::OkStatus();
  }

  // In parts of at most a quarter of the server's message limit.
  absl::Status OnBasis(const engine::Basis& basis) override {
    v1::WorkerMessage m;
    size_t bytes = 0;
    for (size_t i = 0; i < basis.coords.size() || i == 0; ++i) {
      v1::BasisReport* b = m.mutable_report()->mutable_basis();
      b->set_selection(static_cast<int>(basis.selection));
      if (i < basis.coords.size()) {
        const engine::CoordinateDef& d = basis.coords[i];
        v1::ReportCoordinateDef* c = b->add_coords();
        c->set_index(d.index);
        c->set_label(d.label);
        c->set_canonical(d.canonical);
        c->set_matrix(d.matrix);
        c->set_layer(d.layer);
        c->set_head(d.head);
        c->set_block_q(d.block_q);
        c->set_block_k(d.block_k);
        c->set_element(d.element);
        c->set_norm(d.norm);
        c->set_gauge(d.gauge);
        bytes += c->ByteSizeLong() + 8;
      }
      const bool last = i + 1 >= basis.coords.size();
      if (!last && bytes < w_->part_bytes_) continue;
      b->set_last(last);
      if (!Send(m)) return absl::UnavailableError("the connection to the server was lost");
      m.Clear();
      bytes = 0;
    }
    return absl::OkStatus();
  }

  void OnCoordinates(int64_t step, engine::Selection selection, const std::vector<double>& values) override {
    v1::WorkerMessage m;
    v1::CoordinateBatch* c = m.mutable_report()->mutable_coordinates();
    c->set_step(static_cast<uint64_t>(step));
    c->set_selection(static_cast<int>(selection));
    c->mutable_values()->Add(values.begin(), values.end());
    Send(m);
  }

  void Flush() {
    if (pending_.report().metrics().metrics_size() == 0) return;
    v1::WorkerMessage m;
    m.Swap(&pending_);
    SendNow(m);
  }

 private:
  bool Send(v1::WorkerMessage& m) {
    Flush();
    return SendNow(m);
  }
  bool SendNow(v1::WorkerMessage& m) {
    m.mutable_report()->set_lease_id(lease_->id);
    m.mutable_report()->set_member(member_);
    std::lock_guard<std::mutex> lock(w_->write_mu_);
    if (lease_->lost || w_->stream_ == nullptr) return false;
    m.mutable_report()->set_sequence(++lease_->sequence);
    return w_->stream_->Write(m);
  }

  Worker* w_;
  std::shared_ptr<LeaseRun> lease_;
  uint32_t member_;
  v1::WorkerMessage pending_;
};

Worker::Worker(WorkerOptions options, engine::Executor* executor) : options_(std::move(options)), executor_(executor) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(64 << 20);
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);  // an inherited http_proxy must not reroute the stream
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 5000);
  client::ClientOptions c;
  c.server = options_.server;
  c.tls = options_.tls;
  c.ca_cert_pem = options_.ca_cert_pem;
  c.client_cert_pem = options_.client_cert_pem;
  c.client_key_pem = options_.client_key_pem;
  c.tls_server_name = options_.tls_server_name;
  channel_ = client::MakeChannel(c, args);
}

Worker::~Worker() = default;

void Worker::Drain(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_) return;
    drain_why_ = why;
    draining_ = true;
  }
  cv_.notify_all();
}

bool Worker::Write(const v1::WorkerMessage& message) {
  std::lock_guard<std::mutex> lock(write_mu_);
  return stream_ != nullptr && stream_->Write(message);
}

int Worker::Run() {
  bool ever_connected = false;
  double lost_since = Now();
  int backoff_ms = 500;
  while (true) {
    const int wait_s = ever_connected ? 10 : options_.connect_timeout_seconds;
    if (!channel_->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(wait_s))) {
      if (!ever_connected) {
        spdlog::error(
            "cannot reach the server at {} within {} s (is it running, is the address right, can this "
            "node reach it, does --ca-cert match its certificate?)",
            options_.server, wait_s);
        return 2;
      }
    } else {
      std::string why;
      const End end = Session(&why);
      if (end == End::kDone) return 0;
      if (end == End::kRefused) {
        spdlog::error("the server refused this worker: {}", why);
        return 4;
      }
      ever_connected = true;
      lost_since = Now();
      spdlog::warn("lost the server ({}); dialling again for up to {} s", why, options_.reconnect_seconds);
      backoff_ms = 500;
    }
    if (draining_) {
      spdlog::info("draining and the server is gone: exiting");
      return 0;
    }
    if (Now() - lost_since > options_.reconnect_seconds) {
      spdlog::error("the server at {} has been unreachable for {} s; exiting", options_.server,
                    options_.reconnect_seconds);
      return 3;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(backoff_ms));
    backoff_ms = std::min(backoff_ms * 2, 5000);
  }
}

std::shared_ptr<Worker::LeaseRun> Worker::OnServerMessage(const v1::ServerMessage& in) {
  std::lock_guard<std::mutex> lock(mu_);
  std::shared_ptr<LeaseRun> start;
  if (in.has_lease()) {
    auto lease = std::make_shared<LeaseRun>();
    lease->id = in.lease().lease_id();
    lease->members.assign(in.lease().members().begin(), in.lease().members().end());
    lease->resume.resize(lease->members.size());
    lease->tokens = std::vector<CancelToken>(lease->members.size());
    leases_[lease->id] = lease;
    // Leased just before the server saw our Drain: hand it straight back.
    if (drain_sent_) {
      for (CancelToken& t : lease->tokens) t.Request(StopReason::kPreempt);
    }
    if (lease->Complete()) start = lease;
  } else if (in.has_resume_chunk()) {
    auto it = leases_.find(in.resume_chunk().lease_id());
    if (it != leases_.end() && in.resume_chunk().member() < it->second->resume.size()) {
      it->second->resume[in.resume_chunk().member()] += in.resume_chunk().data();
      if (!it->second->started && it->second->Complete()) start = it->second;
    }
  } else if (in.has_stop()) {
    auto it = leases_.find(in.stop().lease_id());
    if (it != leases_.end()) {
      if (in.stop().reason() == v1::Stop::REASON_PREEMPT) {
        for (CancelToken& t : it->second->tokens) t.Request(StopReason::kPreempt);
      } else if (in.stop().member() < it->second->tokens.size()) {
        it->second->tokens[in.stop().member()].Request(StopReason::kCancel);
      }
    }
  } else if (in.has_checkpoint_ack()) {
    auto it = leases_.find(in.checkpoint_ack().lease_id());
    if (it != leases_.end()) {
      it->second->acks[{in.checkpoint_ack().member(), in.checkpoint_ack().step()}] = in.checkpoint_ack().error();
    }
    cv_.notify_all();
  }
  if (start) start->started = true;
  return start;
}

Worker::End Worker::Session(std::string* why) {
  auto stub = v1::WorkerService::NewStub(channel_);
  grpc::ClientContext ctx;
  if (!options_.token.empty()) ctx.AddMetadata("authorization", "Bearer " + options_.token);
  ctx.AddMetadata("x-circuitlab-client", "circuitlab-worker@" + options_.host);
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::ServerMessage>> stream = stub->Session(&ctx);
  v1::WorkerMessage reg;
  v1::Register* r = reg.mutable_register_();
  r->set_host(options_.host);
  r->set_engine_job(options_.engine_job);
  r->set_slots(static_cast<uint32_t>(options_.slots));
  r->set_device(options_.device);
  r->set_version(options_.version);
  r->set_intra_op_threads(static_cast<uint32_t>(options_.intra_op_threads));
  v1::ServerMessage in;
  if (!stream->Write(reg) || !stream->Read(&in) || !in.has_registered()) {
    const grpc::Status s = stream->Finish();
    *why = s.ok() ? "the server ended the session at once" : s.error_message();
    if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      *why += " (a server without WorkerService: an older circuitlab?)";
    }
    return Refusal(s.error_code()) ? End::kRefused : End::kLost;
  }
  heartbeat_seconds_ = static_cast<int>(std::max<uint32_t>(1, in.registered().heartbeat_seconds()));
  // Parts well inside the server's limit (1 MiB under the default 4 MiB).
  const uint32_t limit = in.registered().max_message_bytes() > 0 ? in.registered().max_message_bytes() : 4u << 20;
  part_bytes_ = std::max<size_t>(16 << 10, limit / 4);
  ack_timeout_ = 2.0 * std::max<uint32_t>(1, in.registered().lease_timeout_seconds());
  spdlog::info("registered with {} as {} ({} slot(s), {}{})", options_.server, in.registered().worker_id(),
               options_.slots, options_.device, options_.engine_job.empty() ? "" : ", " + options_.engine_job);
  {
    std::lock_guard<std::mutex> wl(write_mu_);
    stream_ = stream.get();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    session_open_ = true;
    closing_ = false;
    drain_sent_ = false;
    idle_since_ = Now();
  }
  std::thread monitor([this] { Monitor(); });

  while (stream->Read(&in)) {
    if (std::shared_ptr<LeaseRun> start = OnServerMessage(in)) StartLease(start);
  }

  // The session is over: runs still training stop (the server queues them
  // again), nothing more is written.
  {
    std::lock_guard<std::mutex> wl(write_mu_);
    stream_ = nullptr;
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    session_open_ = false;
    for (auto& [id, lease] : leases_) {
      lease->lost = true;
      for (CancelToken& t : lease->tokens) t.Request(StopReason::kCancel);
    }
    cv_.notify_all();
    cv_.wait(lock, [&] { return training_ == 0; });
  }
  monitor.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    leases_.clear();
  }
  const grpc::Status s = stream->Finish();
  const bool done = closing_ && s.ok();
  *why = s.ok() ? "the server closed the session" : s.error_message();
  if (done) return End::kDone;
  return Refusal(s.error_code()) ? End::kRefused : End::kLost;
}

void Worker::StartLease(const std::shared_ptr<LeaseRun>& lease) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++training_;
  }
  // Detached: a pilot trains many leases; Session() waits for training_ to
  // reach 0 before it returns.
  std::thread([this, lease] { TrainLease(lease); }).detach();
}

void Worker::TrainLease(std::shared_ptr<LeaseRun> lease) {
  const size_t n = lease->members.size();
  std::vector<engine::TrainRequest> requests(n);
  std::vector<std::unique_ptr<Observer>> observers;
  std::vector<engine::TrainObserver*> raw;
  std::string names;
  for (size_t i = 0; i < n; ++i) {
    requests[i].spec = lease->members[i].spec();
    requests[i].device = options_.device;
    if (lease->members[i].resume_bytes() > 0) requests[i].resume_from = std::move(lease->resume[i]);
    requests[i].cancel = &lease->tokens[i];
    requests[i].intra_op_threads = options_.intra_op_threads;
    observers.push_back(std::make_unique<Observer>(this, lease, static_cast<uint32_t>(i)));
    raw.push_back(observers.back().get());
    names += (names.empty() ? "" : ", ") + lease->members[i].run_id();
  }
  spdlog::info("lease {}: training {}{}", lease->id, names,
               lease->members[0].resume_step() > 0 ? " from step " + std::to_string(lease->members[0].resume_step())
                                                   : std::string());
  std::vector<absl::StatusOr<engine::TrainOutcome>> outcomes =
      n == 1 ? std::vector<absl::StatusOr<engine::TrainOutcome>>{executor_->Train(requests[0], *observers[0])}
             : executor_->TrainPack(requests, raw);
  for (auto& o : observers) o->Flush();
  v1::WorkerMessage end;
  end.mutable_lease_end()->set_lease_id(lease->id);
  for (size_t i = 0; i < n; ++i) {
    *end.mutable_lease_end()->add_members() =
        ToEnd(i < outcomes.size() ? outcomes[i] : absl::InternalError("no outcome"));
  }
  bool reported = false;
  {
    std::lock_guard<std::mutex> wl(write_mu_);
    if (!lease->lost && stream_ != nullptr) {
      end.mutable_lease_end()->set_sequence(++lease->sequence);
      reported = stream_->Write(end);
    }
  }
  const std::string how = v1::MemberEnd::End_Name(end.lease_end().members(0).end()).substr(4);
  if (reported) {
    spdlog::info("lease {}: {} {}", lease->id, names, how);
  } else {
    // Cut off from the server (or dropped by it) past the lease timeout: the
    // server has given the lease up and re-queued the run; nothing of it
    // from here counts.
    spdlog::warn("lease {}: {} stopped ({}), not reported: the connection to the server was lost", lease->id, names,
                 how);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    leases_.erase(lease->id);
    idle_since_ = Now();
    --training_;
  }
  cv_.notify_all();
}

void Worker::Monitor() {
  double last_beat = Now();
  std::unique_lock<std::mutex> lock(mu_);
  while (session_open_) {
    cv_.wait_for(lock, std::chrono::milliseconds(200));
    if (!session_open_) break;
    const double now = Now();
    bool beat = false, drain = false, close = false;
    if (now - last_beat >= heartbeat_seconds_) {
      beat = true;
      last_beat = now;
    }
    if (draining_ && !drain_sent_) {
      drain = true;
      drain_sent_ = true;
      spdlog::info("draining ({}): leasing nothing more; {} lease(s) checkpoint and go back", drain_why_,
                   leases_.size());
      for (auto& [id, lease] : leases_) {
        for (CancelToken& t : lease->tokens) t.Request(StopReason::kPreempt);
      }
    }
    if (!closing_ && leases_.empty()) {
      if (draining_ && drain_sent_) close = true;
      if (options_.idle_exit_seconds > 0 && now - idle_since_ >= options_.idle_exit_seconds) {
        spdlog::info("idle for {} s: exiting", options_.idle_exit_seconds);
        close = true;
      }
    }
    if (close) closing_ = true;
    lock.unlock();
    if (beat) {
      v1::WorkerMessage m;
      m.mutable_heartbeat();
      Write(m);
    }
    if (drain) {
      v1::WorkerMessage m;
      m.mutable_drain();
      Write(m);
    }
    if (close) {
      std::lock_guard<std::mutex> wl(write_mu_);
      if (stream_ != nullptr) stream_->WritesDone();
    }
    lock.lock();
  }
}

}  // namespace circuitlab::worker
