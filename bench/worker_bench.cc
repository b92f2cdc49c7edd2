// The remote-worker protocol's own costs (issue 17), against a real server on
// --executor workers (bench/worker_lease.sh starts it):
//   lease overhead: SubmitRun returns -> the Lease message reaches a worker,
//                   for tiny runs one after another (the real worker adds
//                   model construction before its first step; the script
//                   measures that from the logs);
//   metric throughput: metric points a worker streams per second until the
//                   server has stored them all (the run's end is recorded
//                   after every report before it is applied).
// This process is both the client and a protocol-level worker that trains
// nothing, so the figures are the service's, not LibTorch's.
#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "circuitlab/v1/experiment_service.grpc.pb.h"
#include "circuitlab/v1/worker_service.grpc.pb.h"
#include "client/lib/client.h"

namespace v1 = circuitlab::v1;
using Clock = std::chrono::steady_clock;

// Polls the run's state through ListRuns (newest first) until it succeeded:
// GetRun would also read the run's latest metrics, a store query that
// competes with the writes being measured.
void WaitEnded(circuitlab::client::Client& client, const std::string& run_id) {
  v1::ListRunsRequest req;
  req.set_page_size(1);
  while (true) {
    absl::StatusOr<v1::ListRunsResponse> r = client.ListRuns(req);
    if (r.ok() && r->runs_size() == 1 && r->runs(0).run_id() == run_id &&
        r->runs(0).state() == v1::RUN_STATE_SUCCEEDED) {
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// `count` reports of `batch` metric points each (8 series) for `lease`.
std::vector<v1::WorkerMessage> MetricReports(uint64_t lease, int count, int batch) {
  std::vector<v1::WorkerMessage> reports;
  reports.reserve(static_cast<size_t>(count));
  int64_t step = 0;
  for (int r = 0; r < count; ++r) {
    v1::WorkerMessage m;
    m.mutable_report()->set_lease_id(lease);
    m.mutable_report()->set_sequence(static_cast<uint64_t>(r + 1));
    for (int j = 0; j < batch; ++j) {
      auto* p = m.mutable_report()->mutable_metrics()->add_metrics();
      if (j % 8 == 0) ++step;
      p->set_step(static_cast<uint64_t>(step));
      p->set_name("bench/m" + std::to_string(j % 8));
      p->set_value(0.5 * j);
    }
    reports.push_back(std::move(m));
  }
  return reports;
}

int main(int argc, char** argv) {
  CLI::App app{"worker_bench: lease overhead and metric throughput of the worker protocol"};
  std::string server = "127.0.0.1:50051", spec_file;
  int runs = 30, points = 2'000'000, batch = 512;
  app.add_option("--server", server);
  app.add_option("--spec", spec_file, "a spec file (any small run)")->required();
  app.add_option("--runs", runs, "tiny runs for the lease overhead");
  app.add_option("--points", points, "metric points for the throughput run");
  app.add_option("--batch", batch, "points per report (the worker batches 512)");
  CLI11_PARSE(app, argc, argv);

  absl::StatusOr<v1::ExperimentSpec> spec = circuitlab::client::ReadSpecFile(spec_file);
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", spec.status().ToString().c_str());
    return 1;
  }
  circuitlab::client::ClientOptions co;
  co.server = server;
  circuitlab::client::Client client(co);

  auto channel = grpc::CreateChannel(server, grpc::InsecureChannelCredentials());
  auto stub = v1::WorkerService::NewStub(channel);
  grpc::ClientContext ctx;
  auto stream = stub->Session(&ctx);
  v1::WorkerMessage reg;
  reg.mutable_register_()->set_host("bench");
  reg.mutable_register_()->set_slots(1);
  reg.mutable_register_()->set_device("cpu");
  reg.mutable_register_()->set_version(CIRCUITLAB_VERSION);
  v1::ServerMessage in;
  if (!stream->Write(reg) || !stream->Read(&in) || !in.has_registered()) {
    std::fprintf(stderr, "registration failed: %s\n", stream->Finish().error_message().c_str());
    return 1;
  }
  // Waits for the next Lease (skipping anything else).
  auto next_lease = [&]() -> uint64_t {
    while (stream->Read(&in)) {
      if (in.has_lease()) return in.lease().lease_id();
    }
    return 0;
  };
  auto end_lease = [&](uint64_t lease, uint64_t seq) {
    v1::WorkerMessage end;
    end.mutable_lease_end()->set_lease_id(lease);
    end.mutable_lease_end()->set_sequence(seq);
    auto* m = end.mutable_lease_end()->add_members();
    m->set_end(v1::MemberEnd::END_COMPLETED);
    m->set_last_step(spec->training().steps());
    stream->Write(end);
  };
  auto wait_ended = [&](const std::string& run_id) { WaitEnded(client, run_id); };

  std::vector<double> lease_ms;
  for (int i = 0; i < runs; ++i) {
    absl::StatusOr<v1::Run> run = client.SubmitRun(*spec);
    const auto t1 = Clock::now();
    if (!run.ok()) {
      std::fprintf(stderr, "submit: %s\n", run.status().ToString().c_str());
      return 1;
    }
    const uint64_t lease = next_lease();
    lease_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t1).count());
    end_lease(lease, 1);
    wait_ended(run->run_id());
  }
  std::sort(lease_ms.begin(), lease_ms.end());
  std::printf(
      "lease overhead (submit answered -> Lease at the worker), %d tiny runs: median %.2f ms, p90 %.2f ms, "
      "max %.2f ms\n",
      runs, lease_ms[lease_ms.size() / 2], lease_ms[lease_ms.size() * 9 / 10], lease_ms.back());

  // Throughput: `points` metric points in reports of `batch`, then the end.
  absl::StatusOr<v1::Run> run = client.SubmitRun(*spec);
  const uint64_t lease = next_lease();
  const int n_reports = (points + batch - 1) / batch;
  const std::vector<v1::WorkerMessage> reports = MetricReports(lease, n_reports, batch);
  const auto t0 = Clock::now();
  for (const v1::WorkerMessage& m : reports) stream->Write(m);
  end_lease(lease, static_cast<uint64_t>(n_reports + 1));
  wait_ended(run->run_id());
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("metric throughput: %d points (%d reports of %d, 8 series) stored in %.2f s: %.0f points/s\n",
              n_reports * batch, n_reports, batch, s, n_reports * batch / s);
  stream->WritesDone();
  stream->Finish();
  return 0;
}
