// What the integration tests share: a real server on an ephemeral loopback
// port (real engine unless a test passes its own executor or analyzer), a
// client, a tiny spec, and waiting helpers.
#pragma once

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "client/lib/client.h"
#include "server/engine/api.h"
#include "server/app/server.h"
#include "server/scheduler/analysis_core.h"
#include "server/scheduler/scheduler.h"
#include "server/scheduler/sweeps.h"
#include "server/store/store.h"
#include "tests/test_util/fake_executor.h"
#include "tests/test_util/temp_dir.h"

namespace circuitlab::testing {

// A tiny but real experiment: trains in well under a second per 100 steps.
inline v1::ExperimentSpec TinySpec(uint64_t steps = 60, uint64_t seed = 3) {
  auto spec = client::ParseSpecJson(R"({
    "name": "tiny", "seed": 3, "tags": ["it"],
    "task": {"associative_recall": {"num_common": 4, "num_rare": 12, "num_heldout": 4,
                                    "num_blocks": 4, "num_positions": 8}},
    "training": {"learning_rate": 4.0, "batch_size": 32},
    "recording": {"metrics_every": 10, "eval_every": 20, "eval_size": 64, "checkpoint_every": 20}
  })");
  EXPECT_TRUE(spec.ok()) << spec.status();
  spec->mutable_training()->set_steps(steps);
  spec->set_seed(seed);
  return *spec;
}

// A 2x2 sweep of TinySpec(steps): learning rate {lr_a, lr_b} (axis "lr") x seed {1, 2}.
inline v1::SweepSpec LrBySeedSweep(const std::string& name, uint64_t steps, double lr_a, double lr_b) {
  v1::SweepSpec sweep;
  sweep.set_name(name);
  *sweep.mutable_base() = TinySpec(steps);
  v1::SweepAxis* lr = sweep.add_axes();
  lr->set_field("training.learning_rate");
  lr->set_name("lr");
  lr->add_values()->set_number_value(lr_a);
  lr->add_values()->set_number_value(lr_b);
  v1::SweepAxis* seed = sweep.add_axes();
  seed->set_field("seed");
  seed->add_values()->set_number_value(1);
  seed->add_values()->set_number_value(2);
  return sweep;
}

// A real server (app::Server, as circuitlab-server builds it) on --data
// `dir`, with the test's executor and, when given, its analyzer, principals
// and audit log.
class Server {
 public:
  // `auth` null: an open server (every caller the admin "local").
  Server(const std::string& dir, engine::Executor* executor, scheduler::SchedulerOptions opts = {},
         app::FrontOptions fronts = {}, engine::Analyzer* analyzer = nullptr,
         const security::Authenticator* auth = nullptr, security::AuditLog* audit = nullptr,
         const std::string& listen = "127.0.0.1:0") {
    app::ServerOptions o;
    o.data_dir = dir;
    o.fronts = std::move(fronts);
    o.fronts.listen = listen;
    o.scheduler = opts;
    o.scheduler.epoch = "epoch-" + std::to_string(reinterpret_cast<uintptr_t>(this));
    o.scheduler.heartbeat = std::chrono::milliseconds(200);
    o.max_sweep_runs = 64;
    o.use_cuda = false;
    o.version = "test";
    o.executor = executor;
    o.analyzer = analyzer;
    o.auth = auth;
    o.audit = audit;
    auto server = app::Server::Create(std::move(o));
    EXPECT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  ~Server() { server_->Shutdown(std::chrono::milliseconds(200)); }
  std::string address() const { return "127.0.0.1:" + std::to_string(server_->port()); }
  // With fronts.http.listen set: the HTTP port.
  int http_port() const { return server_->http_port(); }
  app::Server& app() { return *server_; }

 private:
  std::unique_ptr<app::Server> server_;
};

// Waits for the connection within its deadline (`wait_for_ready`): a loaded
// machine can refuse a first connect for a moment; a test of a connection
// that must fail passes false.
inline client::Client MakeClient(const std::string& address, const std::string& token = "",
                                 bool wait_for_ready = true) {
  client::ClientOptions opts;
  opts.server = address;
  opts.timeout = std::chrono::seconds(10);
  opts.token = token;
  opts.wait_for_ready = wait_for_ready;
  return client::Client(opts);
}

// What server reflection answers to list_services (the response's bytes, in
// which the service names can be found), or the status the call ended with.
// Debian ships no reflection stubs, so this speaks the protocol with a
// generic stub: ServerReflectionRequest{list_services: ""} is field 7,
// length-delimited, empty.
inline absl::StatusOr<std::string> ListServicesByReflection(const std::string& address, const std::string& token = "") {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  auto call = stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  auto step = [&](intptr_t want) {
    void* tag = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(reinterpret_cast<intptr_t>(tag), want);
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  bool ok = step(1);
  grpc::Slice request(std::string("\x3a\x00", 2));
  grpc::ByteBuffer buffer(&request, 1);
  grpc::ByteBuffer response;
  std::string bytes;
  if (ok) {
    call->Write(buffer, reinterpret_cast<void*>(2));
    ok = step(2);
  }
  if (ok) {
    call->WritesDone(reinterpret_cast<void*>(3));
    ok = step(3);
  }
  if (ok) {
    call->Read(&response, reinterpret_cast<void*>(4));
    ok = step(4);
  }
  if (ok) {
    std::vector<grpc::Slice> slices;
    EXPECT_TRUE(response.Dump(&slices).ok());
    for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  step(5);
  cq.Shutdown();
  void* tag;
  while (cq.Next(&tag, &ok)) {
  }
  if (!status.ok()) return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  return bytes;
}

// An analysis call, asked again while its job is pending (the server holds
// each call up to ~2 s, so a quick job answers in one); force only the first time.
template <typename Response, typename Request>
absl::StatusOr<Response> Analysis(client::Client& c, Request req) {
  absl::StatusOr<Response> r = c.RunAnalysis<Response>(req);
  req.set_force(false);
  for (int i = 0; i < 120 && r.ok() && scheduler::IsPending(r->state()); ++i) r = c.RunAnalysis<Response>(req);
  return r;
}

inline v1::RunState WaitForEnd(client::Client& c, const std::string& id) {
  v1::RunState state = v1::RUN_STATE_UNSPECIFIED;
  WaitFor(
      [&] {
        auto run = c.GetRun(id);
        state = run.ok() ? run->state() : state;
        return state == v1::RUN_STATE_SUCCEEDED || state == v1::RUN_STATE_FAILED || state == v1::RUN_STATE_CANCELLED;
      },
      std::chrono::seconds(60));
  return state;
}

inline double FinalValue(client::Client& c, const std::string& id, const std::string& name) {
  v1::GetMetricsRequest req;
  req.set_run_id(id);
  req.add_names(name);
  auto m = c.GetMetrics(req);
  if (!m.ok() || m->series_size() != 1 || m->series(0).values_size() == 0) {
    ADD_FAILURE() << "no series " << name << " for " << id;
    return NAN;
  }
  return m->series(0).values(m->series(0).values_size() - 1);
}

// A sweep of `base` over these seeds.
inline v1::SweepSpec SeedSweep(const v1::ExperimentSpec& base, std::initializer_list<int> seeds) {
  v1::SweepSpec sweep;
  *sweep.mutable_base() = base;
  v1::SweepAxis* axis = sweep.add_axes();
  axis->set_field("seed");
  for (int s : seeds) axis->add_values()->set_number_value(s);
  return sweep;
}

// This process's resident memory and its peak since the last reset, in bytes
// (/proc/self/status; writing 5 to clear_refs resets the peak).
struct Rss {
  int64_t now = 0, peak = 0;
};
inline Rss ReadRss() {
  std::ifstream in("/proc/self/status");
  Rss r;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) r.now = std::stoll(line.substr(6)) * 1024;
    if (line.rfind("VmHWM:", 0) == 0) r.peak = std::stoll(line.substr(6)) * 1024;
  }
  return r;
}
inline bool ResetPeakRss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

}  // namespace circuitlab::testing
