// The cost of TLS on the request paths (issue 15): latency of SubmitRun,
// GetRun and a whole WatchRun of an ended run (stream opened, snapshot read,
// stream closed), plus a new connection's first call (handshake included),
// against one running circuitlab-server. bench/tls_cost.sh runs it against a
// plaintext and a TLS server (both with tokens) and prints the ratios.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "client/lib/client.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace v1 = circuitlab::v1;

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Series {
  std::vector<double> ms;
  double Quantile(double q) const {
    std::vector<double> s = ms;
    std::sort(s.begin(), s.end());
    return s.empty() ? 0 : s[std::min(s.size() - 1, static_cast<size_t>(q * static_cast<double>(s.size())))];
  }
};

template <typename Fn>
Series Time(int n, Fn&& fn) {
  Series out;
  for (int i = 0; i < n; ++i) {
    const auto t0 = Clock::now();
    if (!fn()) {
      std::fprintf(stderr, "a call failed\n");
      std::exit(1);
    }
    out.ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"TLS cost on SubmitRun, GetRun, WatchRun and a new connection"};
  std::string server, token_file, ca, spec_path;
  int n = 300;
  app.add_option("--server", server)->required();
  app.add_option("--token-file", token_file)->required();
  app.add_option("--ca-cert", ca, "TLS when given");
  app.add_option("--spec", spec_path)->required();
  app.add_option("--n", n, "calls per path")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  circuitlab::client::ClientOptions opts;
  opts.server = server;
  opts.timeout = std::chrono::seconds(60);
  opts.token = Read(token_file).substr(0, 64);
  opts.ca_cert_pem = ca.empty() ? "" : Read(ca);
  circuitlab::client::Client c(opts);
  auto spec = circuitlab::client::ReadSpecFile(spec_path);
  if (!spec.ok()) return 1;
  std::string last;
  const Series submit = Time(n, [&] {
    auto r = c.SubmitRun(*spec);
    if (r.ok()) last = r->run_id();
    return r.ok();
  });
  // Every run ends (1 step each) before the reads and watches.
  for (int i = 0; i < 600; ++i) {
    auto r = c.GetRun(last);
    if (r.ok() && r->state() == v1::RUN_STATE_SUCCEEDED) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const Series get = Time(n * 4, [&] { return c.GetRun(last).ok(); });
  std::atomic<bool> stop{false};
  v1::WatchRunRequest watch;
  watch.set_run_id(last);
  const Series watched = Time(n, [&] {
    return c
        .Watch(
            watch, [](const v1::RunEvent&) {}, stop)
        .ok();
  });
  const Series connect = Time(n / 3, [&] {
    circuitlab::client::Client fresh(opts);
    return fresh.GetRun(last).ok();
  });
  for (const auto& [name, s] : {std::pair{"submit", &submit}, std::pair{"get_run", &get},
                                std::pair{"watch_run", &watched}, std::pair{"new_connection", &connect}}) {
    std::printf("%s %zu p50_ms %.3f p99_ms %.3f\n", name, s->ms.size(), s->Quantile(0.5), s->Quantile(0.99));
  }
  return 0;
}
