// The lease broker (remote/workers.h) against a recording link and
// observer: registration, capacity, a lease's whole life (resume chunks out;
// metrics, progress, checkpoint chunks in; acks; the end), idempotent
// sequence numbers, cancel, a lost worker, the heartbeat timeout.
#include "server/remote/workers.h"

#include <gtest/gtest.h>

#include <future>
#include <thread>

namespace circuitlab::remote {
namespace {

using scheduler::PlacedObserver;

using namespace std::chrono_literals;

class RecordingLink : public WorkerLink {
 public:
  void Send(v1::ServerMessage m) override {
    std::lock_guard<std::mutex> lock(mu);
    sent.push_back(std::move(m));
    cv.notify_all();
  }
  void Close(const absl::Status& why) override {
    std::lock_guard<std::mutex> lock(mu);
    if (was_closed) return;  // as the real stream: the first reason ends it
    closed = why;
    was_closed = true;
    cv.notify_all();
  }
  // The first sent message of `kind` at or after index `from` (waits up to 5 s).
  std::optional<v1::ServerMessage> WaitFor(v1::ServerMessage::KindCase kind, size_t from = 0) {
    std::unique_lock<std::mutex> lock(mu);
    std::optional<v1::ServerMessage> found;
    cv.wait_for(lock, 5s, [&] {
      for (size_t i = from; i < sent.size(); ++i) {
        if (sent[i].kind_case() == kind) {
          found = sent[i];
          return true;
        }
      }
      return false;
    });
    return found;
  }
  size_t Count(v1::ServerMessage::KindCase kind) {
    std::lock_guard<std::mutex> lock(mu);
    return static_cast<size_t>(
        std::count_if(sent.begin(), sent.end(), [&](const auto& m) { return m.kind_case() == kind; }));
  }
  std::mutex mu;
  std::condition_variable cv;
  std::vector<v1::ServerMessage> sent;
  absl::Status closed;
  bool was_closed = false;
};

class RecordingObserver : public PlacedObserver {
 public:
  explicit RecordingObserver(int64_t id, int64_t start = 0) : id_(id), start_(start) {}
  int64_t run_id() const override { return id_; }
  int64_t start_step() const override { return start_; }
  void OnPlaced(const std::string& device) override { placed = device; }
  void OnLost(const std::string& why, bool counts) override {
    lost.push_back(why);
    lost_counts.push_back(counts);
  }
  std::vector<std::string> lost;
  std::vector<bool> lost_counts;
  void OnMetrics(int64_t step, const std::vector<engine::Metric>& m) override {
    metric_calls.push_back({step, m.size()});
  }
  void OnProgress(int64_t step, double) override { progress.push_back(step); }
  absl::Status OnCheckpoint(int64_t step, const std::string& bytes) override {
    checkpoints.push_back({step, bytes});
    return checkpoint_status;
  }
  absl::Status OnBasis(const engine::Basis& basis) override {
    bases.push_back(basis);
    return absl::OkStatus();
  }
  std::vector<engine::Basis> bases;
  std::string placed;
  std::vector<std::pair<int64_t, size_t>> metric_calls;
  std::vector<int64_t> progress;
  std::vector<std::pair<int64_t, std::string>> checkpoints;
  absl::Status checkpoint_status;

 private:
  int64_t id_, start_;
};

v1::Register Reg(uint32_t slots = 1, const std::string& version = "test") {
  v1::Register r;
  r.set_host("node1");
  r.set_engine_job("slurm:42");
  r.set_slots(slots);
  r.set_device("cpu");
  r.set_version(version);
  return r;
}

v1::WorkerMessage ReportMsg(uint64_t lease, uint64_t seq) {
  v1::WorkerMessage m;
  m.mutable_report()->set_lease_id(lease);
  m.mutable_report()->set_sequence(seq);
  return m;
}

v1::WorkerMessage EndMsg(uint64_t lease, uint64_t seq, v1::MemberEnd::End end, uint64_t step) {
  v1::WorkerMessage m;
  m.mutable_lease_end()->set_lease_id(lease);
  m.mutable_lease_end()->set_sequence(seq);
  m.mutable_lease_end()->add_members()->set_end(end);
  m.mutable_lease_end()->mutable_members(0)->set_last_step(step);
  return m;
}

struct WorkerBrokerTest : ::testing::Test {
  BrokerOptions Options() {
    BrokerOptions o;
    o.version = "test";
    o.chunk_bytes = 4;
    o.lease_timeout = 2s;
    o.preempt_grace = 2s;
    return o;
  }
  FakeClock clock;
};

TEST_F(WorkerBrokerTest, RegisterChecksFieldsAndVersion) {
  WorkerBroker b(Options(), nullptr, &clock);
  auto link = std::make_shared<RecordingLink>();
  auto bad = b.Open(link, Reg(0), "w", "peer");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("register.slots must be in [1, 64]"), std::string::npos) << bad.status();
  auto skew = b.Open(link, Reg(1, "0.0.9"), "w", "peer");
  EXPECT_EQ(skew.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(skew.status().message().find("the server is 'test'"), std::string::npos) << skew.status();
  v1::Register gpu = Reg();
  gpu.set_device("tpu");
  EXPECT_EQ(b.Open(link, gpu, "w", "peer").status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(b.Open(link, Reg(2), "w", "peer").ok());
  auto reg = link->WaitFor(v1::ServerMessage::kRegistered);
  ASSERT_TRUE(reg.has_value());
  EXPECT_EQ(reg->registered().worker_id(), "w1");
  EXPECT_EQ(reg->registered().lease_timeout_seconds(), 2u);
  EXPECT_EQ(reg->registered().max_message_bytes(), 4u << 20) << "so that workers size their parts";
  ASSERT_EQ(b.Workers().size(), 1u);
  EXPECT_EQ(b.Workers()[0].engine_job, "slurm:42");
}

TEST_F(WorkerBrokerTest, CapacityFollowsWorkersAndDrain) {
  WorkerBroker b(Options(), nullptr, &clock);
  EXPECT_FALSE(b.TryAcquire(false));
  auto link = std::make_shared<RecordingLink>();
  const uint64_t s = *b.Open(link, Reg(2), "w", "peer");
  EXPECT_TRUE(b.TryAcquire(false));
  EXPECT_TRUE(b.TryAcquire(false));
  EXPECT_FALSE(b.TryAcquire(false));
  b.Release(false);
  EXPECT_TRUE(b.TryAcquire(false));
  b.Release(false);
  b.Release(false);
  v1::WorkerMessage drain;
  drain.mutable_drain();
  ASSERT_TRUE(b.OnMessage(s, drain).ok());
  EXPECT_FALSE(b.TryAcquire(false)) << "a draining worker takes nothing more";
  EXPECT_EQ(b.TotalSlots(), 0);
}

// --executor slurm with GPU pilots: leases of the remote GPU slots (runs
// that ask for CUDA) go to GPU workers only, the others to CPU workers only.
TEST_F(WorkerBrokerTest, ByDeviceLeasesGoToTheirKindOfWorker) {
  BrokerOptions o = Options();
  o.by_device = true;
  WorkerBroker b(o, nullptr, &clock);
  auto cpu_link = std::make_shared<RecordingLink>(), gpu_link = std::make_shared<RecordingLink>();
  const uint64_t cpu = *b.Open(cpu_link, Reg(2), "w", "peer");
  v1::Register gpu_reg = Reg(1);
  gpu_reg.set_device("cuda:0");
  const uint64_t gpu = *b.Open(gpu_link, gpu_reg, "w", "peer");
  EXPECT_TRUE(b.TryAcquire(true));
  EXPECT_FALSE(b.TryAcquire(true)) << "one GPU worker slot";
  EXPECT_TRUE(b.TryAcquire(false));
  EXPECT_TRUE(b.TryAcquire(false));
  EXPECT_FALSE(b.TryAcquire(false)) << "two CPU worker slots; the GPU worker's is not among them";
  EXPECT_EQ(b.TotalSlots(), 3);

  for (bool on_gpu : {true, false}) {
    RecordingObserver obs(on_gpu ? 5 : 6);
    engine::TrainRequest req;
    req.device = on_gpu ? "cuda:0" : "cpu";  // what the scheduler's remote GPU and CPU slots name
    CancelToken token;
    req.cancel = &token;
    RecordingLink& to = on_gpu ? *gpu_link : *cpu_link;
    RecordingLink& other = on_gpu ? *cpu_link : *gpu_link;
    const size_t other_leases = other.Count(v1::ServerMessage::kLease);
    auto done = std::async(std::launch::async, [&] { return b.Train(req, obs); });
    auto lease = to.WaitFor(v1::ServerMessage::kLease);
    ASSERT_TRUE(lease.has_value()) << (on_gpu ? "the GPU worker" : "the CPU worker") << " got no lease";
    EXPECT_EQ(other.Count(v1::ServerMessage::kLease), other_leases);
    EXPECT_EQ(b.BusySlots(on_gpu), 1);
    EXPECT_EQ(b.BusySlots(!on_gpu), 0);
    ASSERT_TRUE(b.OnMessage(on_gpu ? gpu : cpu, EndMsg(lease->lease().lease_id(), 1, v1::MemberEnd::END_COMPLETED, 0))
                    .ok());
    EXPECT_EQ(done.get()->end, engine::TrainEnd::kCompleted);
  }
}

TEST_F(WorkerBrokerTest, LeaseLifeResumeReportsCheckpointAndEnd) {
  WorkerBroker b(Options(), nullptr, &clock);
  auto link = std::make_shared<RecordingLink>();
  const uint64_t s = *b.Open(link, Reg(), "w", "peer");
  RecordingObserver obs(7, 300);
  engine::TrainRequest req;
  req.spec.set_name("x");
  req.spec.mutable_training()->set_steps(500);
  req.resume_from = std::string("0123456789");  // 3 chunks of <= 4 bytes
  CancelToken token;
  req.cancel = &token;
  auto done = std::async(std::launch::async, [&] { return b.Train(req, obs); });

  auto lease = link->WaitFor(v1::ServerMessage::kLease);
  ASSERT_TRUE(lease.has_value());
  const uint64_t id = lease->lease().lease_id();
  ASSERT_EQ(lease->lease().members_size(), 1);
  EXPECT_EQ(lease->lease().members(0).run_id(), "r7");
  EXPECT_EQ(lease->lease().members(0).resume_bytes(), 10u);
  EXPECT_EQ(lease->lease().members(0).resume_step(), 300u);
  // The chunks follow the Lease message.
  std::string resume;
  {
    std::unique_lock<std::mutex> lock(link->mu);
    link->cv.wait_for(lock, 5s, [&] {
      return std::count_if(link->sent.begin(), link->sent.end(), [](const auto& m) { return m.has_resume_chunk(); }) ==
             3;
    });
    for (const auto& m : link->sent) {
      if (m.has_resume_chunk()) resume += m.resume_chunk().data();
    }
  }
  EXPECT_EQ(resume, "0123456789");
  EXPECT_EQ(link->Count(v1::ServerMessage::kResumeChunk), 3u);

  // Metrics of two steps in one batch: one OnMetrics per step.
  v1::WorkerMessage metrics = ReportMsg(id, 1);
  for (auto [step, name] : {std::pair{301, "a"}, {301, "b"}, {302, "a"}}) {
    auto* p = metrics.mutable_report()->mutable_metrics()->add_metrics();
    p->set_step(step);
    p->set_name(name);
    p->set_value(1);
  }
  ASSERT_TRUE(b.OnMessage(s, metrics).ok());
  ASSERT_TRUE(b.OnMessage(s, metrics).ok()) << "a resend is dropped, not an error";
  v1::WorkerMessage progress = ReportMsg(id, 2);
  progress.mutable_report()->mutable_progress()->set_step(302);
  ASSERT_TRUE(b.OnMessage(s, progress).ok());
  for (uint64_t seq : {3, 4}) {
    v1::WorkerMessage c = ReportMsg(id, seq);
    c.mutable_report()->mutable_checkpoint()->set_step(400);
    c.mutable_report()->mutable_checkpoint()->set_data(seq == 3 ? "ab" : "cd");
    c.mutable_report()->mutable_checkpoint()->set_last(seq == 4);
    ASSERT_TRUE(b.OnMessage(s, c).ok());
  }
  auto ack = link->WaitFor(v1::ServerMessage::kCheckpointAck);
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->checkpoint_ack().step(), 400u);
  EXPECT_EQ(ack->checkpoint_ack().error(), "");
  // A gap in the numbering is a protocol error.
  EXPECT_EQ(b.OnMessage(s, ReportMsg(id, 9)).code(), absl::StatusCode::kInvalidArgument);
  // A basis in two parts is recorded once, whole, when the last arrives.
  for (uint64_t seq : {5, 6}) {
    v1::WorkerMessage part = ReportMsg(id, seq);
    part.mutable_report()->mutable_basis()->set_selection(1);
    part.mutable_report()->mutable_basis()->add_coords()->set_label(seq == 5 ? "L1H1:a" : "OUT:b");
    part.mutable_report()->mutable_basis()->set_last(seq == 6);
    ASSERT_TRUE(b.OnMessage(s, part).ok());
  }
  ASSERT_TRUE(b.OnMessage(s, EndMsg(id, 7, v1::MemberEnd::END_COMPLETED, 500)).ok());

  absl::StatusOr<engine::TrainOutcome> out = done.get();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->end, engine::TrainEnd::kCompleted);
  EXPECT_EQ(out->last_step, 500);
  EXPECT_EQ(obs.placed, "w1 slurm:42@node1 cpu");
  ASSERT_EQ(obs.metric_calls.size(), 2u);
  EXPECT_EQ(obs.metric_calls[0], (std::pair<int64_t, size_t>{301, 2}));
  EXPECT_EQ(obs.metric_calls[1], (std::pair<int64_t, size_t>{302, 1}));
  EXPECT_EQ(obs.progress, std::vector<int64_t>{302});
  ASSERT_EQ(obs.checkpoints.size(), 1u);
  EXPECT_EQ(obs.checkpoints[0], (std::pair<int64_t, std::string>{400, "abcd"}));
  ASSERT_EQ(obs.bases.size(), 1u);
  EXPECT_EQ(obs.bases[0].selection, engine::Selection::kComplete);
  ASSERT_EQ(obs.bases[0].coords.size(), 2u);
  EXPECT_EQ(obs.bases[0].coords[1].label, "OUT:b");
  EXPECT_EQ(b.BusySlots(), 0);
}

TEST_F(WorkerBrokerTest, CancelSendsStopAndFailuresKeepTheirCode) {
  WorkerBroker b(Options(), nullptr, &clock);
  auto link = std::make_shared<RecordingLink>();
  const uint64_t s = *b.Open(link, Reg(), "w", "peer");
  RecordingObserver obs(3);
  engine::TrainRequest req;
  CancelToken token;
  req.cancel = &token;
  auto done = std::async(std::launch::async, [&] { return b.Train(req, obs); });
  auto lease = link->WaitFor(v1::ServerMessage::kLease);
  ASSERT_TRUE(lease.has_value());
  token.Request(StopReason::kCancel);
  auto stop = link->WaitFor(v1::ServerMessage::kStop);
  ASSERT_TRUE(stop.has_value());
  EXPECT_EQ(stop->stop().reason(), v1::Stop::REASON_CANCEL);
  ASSERT_TRUE(b.OnMessage(s, EndMsg(lease->lease().lease_id(), 1, v1::MemberEnd::END_CANCELLED, 12)).ok());
  EXPECT_EQ(done.get()->end, engine::TrainEnd::kCancelled);

  CancelToken token2;
  req.cancel = &token2;
  size_t sent_so_far = 0;
  {
    std::lock_guard<std::mutex> lock(link->mu);
    sent_so_far = link->sent.size();
  }
  auto failed = std::async(std::launch::async, [&] { return b.Train(req, obs); });
  auto lease2 = link->WaitFor(v1::ServerMessage::kLease, sent_so_far);
  ASSERT_TRUE(lease2.has_value());
  v1::WorkerMessage end = EndMsg(lease2->lease().lease_id(), 1, v1::MemberEnd::END_FAILED, 0);
  end.mutable_lease_end()->mutable_members(0)->set_error("checkpoint does not match the spec");
  end.mutable_lease_end()->mutable_members(0)->set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
  ASSERT_TRUE(b.OnMessage(s, end).ok());
  absl::StatusOr<engine::TrainOutcome> out = failed.get();
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("(on w1 slurm:42@node1 cpu)"), std::string::npos) << out.status();
}

TEST_F(WorkerBrokerTest, ALostWorkerHandsTheRunBackAtItsLastStep) {
  WorkerBroker b(Options(), nullptr, &clock);
  auto link = std::make_shared<RecordingLink>();
  const uint64_t s = *b.Open(link, Reg(), "w", "peer");
  RecordingObserver obs(5);
  engine::TrainRequest req;
  req.spec.mutable_training()->set_steps(100);
  auto done = std::async(std::launch::async, [&] { return b.Train(req, obs); });
  auto lease = link->WaitFor(v1::ServerMessage::kLease);
  ASSERT_TRUE(lease.has_value());
  v1::WorkerMessage progress = ReportMsg(lease->lease().lease_id(), 1);
  progress.mutable_report()->mutable_progress()->set_step(77);
  ASSERT_TRUE(b.OnMessage(s, progress).ok());
  // Another session may not report for it.
  auto other = std::make_shared<RecordingLink>();
  const uint64_t s2 = *b.Open(other, Reg(), "w", "peer");
  EXPECT_EQ(b.OnMessage(s2, ReportMsg(lease->lease().lease_id(), 2)).code(), absl::StatusCode::kPermissionDenied);
  b.Closed(s, absl::UnavailableError("connection reset"));
  absl::StatusOr<engine::TrainOutcome> out = done.get();
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->end, engine::TrainEnd::kPreempted);
  EXPECT_EQ(out->last_step, 77);
  ASSERT_EQ(obs.lost.size(), 1u);
  EXPECT_EQ(obs.lost[0], "w1 slurm:42@node1 cpu: connection reset");
  EXPECT_TRUE(obs.lost_counts[0]) << "gone after reporting on the run: charged to the run (--max-lost-leases)";
  EXPECT_EQ(b.OnMessage(s, ReportMsg(1, 3)).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(WorkerBrokerTest, ASilentWorkerTimesOut) {
  WorkerBroker b(Options(), nullptr, &clock);
  auto link = std::make_shared<RecordingLink>();
  ASSERT_TRUE(b.Open(link, Reg(), "w", "peer").ok());
  RecordingObserver obs(5);
  engine::TrainRequest req;
  auto done = std::async(std::launch::async, [&] { return b.Train(req, obs); });
  ASSERT_TRUE(link->WaitFor(v1::ServerMessage::kLease).has_value());
  clock.AdvanceMicros(3'000'000);  // past the 2 s lease timeout
  absl::StatusOr<engine::TrainOutcome> out = done.get();
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->end, engine::TrainEnd::kPreempted);
  // The watchdog ends the lease, then closes the session: the slot may see
  // the first before the second has happened.
  for (int i = 0; i < 200; ++i) {
    {
      std::lock_guard<std::mutex> lock(link->mu);
      if (link->was_closed) break;
    }
    std::this_thread::sleep_for(10ms);
  }
  std::lock_guard<std::mutex> lock(link->mu);
  EXPECT_TRUE(link->was_closed);
  EXPECT_EQ(link->closed.code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_EQ(obs.lost_counts.size(), 1u);
  EXPECT_FALSE(obs.lost_counts[0]) << "a silent worker is charged itself, not the run";
}

TEST_F(WorkerBrokerTest, RunsStoppedBeforeAnyWorkerEndWhereTheyAre) {
  WorkerBroker b(Options(), nullptr, &clock);
  RecordingObserver obs(9, 400);
  engine::TrainRequest req;
  CancelToken token;
  req.cancel = &token;
  auto done = std::async(std::launch::async, [&] { return b.Train(req, obs); });
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(b.WaitingLeases(), 1);
  token.Request(StopReason::kPreempt);
  absl::StatusOr<engine::TrainOutcome> out = done.get();
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->end, engine::TrainEnd::kPreempted);
  EXPECT_EQ(out->last_step, 400);
  EXPECT_EQ(b.WaitingLeases(), 0);
}

TEST_F(WorkerBrokerTest, AFailedCheckpointWriteIsAckedWithTheError) {
  WorkerBroker b(Options(), nullptr, &clock);
  auto link = std::make_shared<RecordingLink>();
  const uint64_t s = *b.Open(link, Reg(), "w", "peer");
  RecordingObserver obs(5);
  obs.checkpoint_status = absl::UnavailableError("disk full");
  engine::TrainRequest req;
  req.spec.mutable_training()->set_steps(200);
  auto done = std::async(std::launch::async, [&] { return b.Train(req, obs); });
  auto lease = link->WaitFor(v1::ServerMessage::kLease);
  ASSERT_TRUE(lease.has_value());
  const uint64_t id = lease->lease().lease_id();
  v1::WorkerMessage c = ReportMsg(id, 1);
  c.mutable_report()->mutable_checkpoint()->set_step(100);
  c.mutable_report()->mutable_checkpoint()->set_data("x");
  c.mutable_report()->mutable_checkpoint()->set_last(true);
  ASSERT_TRUE(b.OnMessage(s, c).ok());
  auto ack = link->WaitFor(v1::ServerMessage::kCheckpointAck);
  ASSERT_TRUE(ack.has_value());
  EXPECT_NE(ack->checkpoint_ack().error().find("disk full"), std::string::npos);
  v1::WorkerMessage end = EndMsg(id, 2, v1::MemberEnd::END_FAILED, 100);
  ASSERT_TRUE(b.OnMessage(s, end).ok());
  absl::StatusOr<engine::TrainOutcome> out = done.get();
  EXPECT_EQ(out.status().code(), absl::StatusCode::kUnavailable) << "the server's own failure is the run's error";
  EXPECT_NE(out.status().message().find("disk full"), std::string::npos);
}

}  // namespace
}  // namespace circuitlab::remote

namespace circuitlab::remote {
namespace {

using scheduler::PlacedObserver;

// An executor whose CheckCheckpoint accepts only "good:<step>" bytes, standing
// in for the engine's archive check.
class CheckingExecutor : public engine::Executor {
 public:
  absl::StatusOr<engine::TrainOutcome> Train(const engine::TrainRequest&, engine::TrainObserver&) override {
    return absl::UnimplementedError("not here");
  }
  absl::Status CheckCheckpoint(const v1::ExperimentSpec&, int64_t step, const std::string& bytes) override {
    return bytes == "good:" + std::to_string(step) ? absl::OkStatus()
                                                   : absl::InvalidArgumentError("not a checkpoint of this run");
  }
};

// Issue 32 item 3: one principal cannot register unbounded sessions or
// slots, and a principal whose workers keep going silent on their leases is
// quarantined; their runs are not charged.
TEST_F(WorkerBrokerTest, OnePrincipalCannotTakeEveryLease) {
  BrokerOptions o = Options();
  o.max_sessions_per_principal = 2;
  o.max_slots_per_principal = 5;
  o.quarantine_after = 2;
  o.quarantine = 60s;
  WorkerBroker b(o, nullptr, &clock);
  auto link = std::make_shared<RecordingLink>();
  ASSERT_TRUE(b.Open(link, Reg(3), "mallory", "p").ok());
  auto too_many_slots = b.Open(link, Reg(3), "mallory", "p");
  EXPECT_EQ(too_many_slots.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(too_many_slots.status().message().find("--max-worker-slots-per-principal 5"), std::string::npos);
  ASSERT_TRUE(b.Open(link, Reg(2), "mallory", "p").ok());
  auto too_many_sessions = b.Open(link, Reg(1), "mallory", "p");
  EXPECT_EQ(too_many_sessions.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(too_many_sessions.status().message().find("--max-worker-sessions-per-principal 2"), std::string::npos);

  // Two of mallory's leases go silent: both runs come back uncharged, and
  // mallory is quarantined (no new session, no lease for her sessions).
  std::vector<std::unique_ptr<RecordingObserver>> obs;
  std::vector<std::future<absl::StatusOr<engine::TrainOutcome>>> runs;
  engine::TrainRequest req;
  req.spec.mutable_training()->set_steps(10);
  for (int i = 0; i < 2; ++i) {
    obs.push_back(std::make_unique<RecordingObserver>(i + 1));
    runs.push_back(std::async(std::launch::async, [&, i] { return b.Train(req, *obs[i]); }));
  }
  for (int i = 0; i < 500 && link->Count(v1::ServerMessage::kLease) < 2; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(link->Count(v1::ServerMessage::kLease), 2u);
  clock.AdvanceMicros(3'000'000);  // past the lease timeout: mallory's workers said nothing
  for (auto& r : runs) EXPECT_EQ(r.get()->end, engine::TrainEnd::kPreempted);
  for (const auto& o : obs) {
    ASSERT_EQ(o->lost_counts.size(), 1u);
    EXPECT_FALSE(o->lost_counts[0]) << "silent workers: the runs are not charged";
  }
  auto refused = b.Open(std::make_shared<RecordingLink>(), Reg(1), "mallory", "p");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("is quarantined for"), std::string::npos) << refused.status();
  EXPECT_TRUE(b.Open(std::make_shared<RecordingLink>(), Reg(1), "alice", "p").ok()) << "others are not affected";
  clock.AdvanceMicros(61'000'000);
  EXPECT_TRUE(b.Open(std::make_shared<RecordingLink>(), Reg(1), "mallory", "p").ok()) << "the quarantine ends";
}

// Issue 32 item 4: what a worker uploads is bounded and checked: steps within
// the run, printable names and host, a checkpoint stored only when whole and
// loadable for its spec. An upload the run cannot have (a checkpoint too
// large for it or not its own, a basis beyond 200,000 coordinates) ends the
// worker's session: the run goes back to the queue uncharged.
TEST_F(WorkerBrokerTest, UploadsAreBoundedAndChecked) {
  CheckingExecutor local;
  WorkerBroker b(Options(), &local, &clock);
  v1::Register evil = Reg();
  evil.set_host("node\x1b]0;pwned\x07\n");
  auto bad_host = b.Open(std::make_shared<RecordingLink>(), evil, "w", "p");
  EXPECT_EQ(bad_host.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_host.status().message().find("register.host must hold no control characters"), std::string::npos);

  // One lease per scenario: `send` gets the session, its link and the lease id.
  auto scenario = [&](const std::function<void(uint64_t, RecordingLink&, uint64_t)>& send, RecordingObserver& obs) {
    auto link = std::make_shared<RecordingLink>();
    const uint64_t s = *b.Open(link, Reg(), "w", "peer");
    engine::TrainRequest req;
    req.spec.mutable_training()->set_steps(30);
    CancelToken token;
    req.cancel = &token;
    auto done = std::async(std::launch::async, [&] { return b.Train(req, obs); });
    auto lease = link->WaitFor(v1::ServerMessage::kLease);
    EXPECT_TRUE(lease.has_value());
    if (lease) send(s, *link, lease->lease().lease_id());
    absl::StatusOr<engine::TrainOutcome> out = done.get();
    b.Closed(s, link->closed);  // as the rpc layer does once the stream ends
    return out;
  };
  auto chunk = [](uint64_t lease, uint64_t seq, uint64_t step, std::string data, bool last) {
    v1::WorkerMessage m = ReportMsg(lease, seq);
    m.mutable_report()->mutable_checkpoint()->set_step(step);
    m.mutable_report()->mutable_checkpoint()->set_data(std::move(data));
    m.mutable_report()->mutable_checkpoint()->set_last(last);
    return m;
  };

  // Steps beyond the run and unprintable names are protocol errors (the rpc
  // layer ends the session with them); a complete, loadable checkpoint is
  // stored, chunks without `last` never are.
  RecordingObserver good(4);
  auto out = scenario(
      [&](uint64_t s, RecordingLink& link, uint64_t id) {
        v1::WorkerMessage beyond = ReportMsg(id, 1);
        beyond.mutable_report()->mutable_progress()->set_step(18446744073709551615ULL);
        const absl::Status s1 = b.OnMessage(s, beyond);
        EXPECT_EQ(s1.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_NE(s1.message().find("progress report at step 18446744073709551615 of a run of 30 steps"),
                  std::string::npos)
            << s1;
        v1::WorkerMessage bad_name = ReportMsg(id, 1);
        auto* m = bad_name.mutable_report()->mutable_metrics()->add_metrics();
        m->set_step(3);
        m->set_name("loss\n[error] forged");
        EXPECT_EQ(b.OnMessage(s, bad_name).code(), absl::StatusCode::kInvalidArgument);
        ASSERT_TRUE(b.OnMessage(s, chunk(id, 1, 10, "good:", false)).ok());
        ASSERT_TRUE(b.OnMessage(s, chunk(id, 2, 20, "good:", false)).ok());  // step 10's never completed
        ASSERT_TRUE(b.OnMessage(s, chunk(id, 3, 20, "20", true)).ok());
        ASSERT_TRUE(link.WaitFor(v1::ServerMessage::kCheckpointAck).has_value());
        ASSERT_TRUE(b.OnMessage(s, EndMsg(id, 4, v1::MemberEnd::END_COMPLETED, 30)).ok());
      },
      good);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->end, engine::TrainEnd::kCompleted);
  ASSERT_EQ(good.checkpoints.size(), 1u);
  EXPECT_EQ(good.checkpoints[0], (std::pair<int64_t, std::string>{20, "good:20"}));

  // Each of these ends the session; the run comes back (preempted), uncharged.
  const std::string mib(1 << 20, 'x');
  const std::vector<std::pair<std::string, std::function<void(uint64_t, uint64_t)>>> misbehaviours = {
      {"is not one of this run", [&](uint64_t s, uint64_t id) { ASSERT_TRUE(b.OnMessage(s, chunk(id, 1, 10, "junk", true)).ok()); }},
      {"is larger than this run can have",
       [&](uint64_t s, uint64_t id) {
         for (uint64_t k = 1; k <= 3; ++k) ASSERT_TRUE(b.OnMessage(s, chunk(id, k, 30, mib, k == 3)).ok());
       }},
      {"more than 200000 coordinates",
       [&](uint64_t s, uint64_t id) {
         v1::WorkerMessage basis = ReportMsg(id, 1);
         for (int i = 0; i < 200001; ++i) basis.mutable_report()->mutable_basis()->add_coords();
         ASSERT_TRUE(b.OnMessage(s, basis).ok());
       }},
  };
  for (const auto& [why, send] : misbehaviours) {
    RecordingObserver obs(5);
    std::shared_ptr<RecordingLink> seen;
    auto ended = scenario(
        [&](uint64_t s, RecordingLink& link, uint64_t id) {
          send(s, id);
          std::unique_lock<std::mutex> lock(link.mu);
          link.cv.wait_for(lock, 5s, [&] { return link.was_closed; });
          EXPECT_TRUE(link.was_closed) << why;
          EXPECT_NE(link.closed.message().find(why), std::string::npos) << link.closed;
          lock.unlock();
          b.Closed(s, link.closed);
        },
        obs);
    ASSERT_TRUE(ended.ok()) << why << ": " << ended.status();
    EXPECT_EQ(ended->end, engine::TrainEnd::kPreempted) << why;
    ASSERT_EQ(obs.lost_counts.size(), 1u) << why;
    EXPECT_FALSE(obs.lost_counts[0]) << why << ": the worker's fault, not the run's";
    EXPECT_TRUE(obs.checkpoints.empty()) << why;
  }
}

}  // namespace
}  // namespace circuitlab::remote
