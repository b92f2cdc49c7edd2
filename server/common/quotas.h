// Per-principal overrides of the server's limits. The tokens file sets them
// (`alice user sha256:... max_queued=500`); re-reading it (SIGHUP) replaces
// them all at once. The cores ask for a principal's limit at each admission,
// so a change applies to the next call.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <map>
#include <mutex>
#include <string>

namespace circuitlab {

struct QuotaOverrides {
  // 0 = the server's flag applies.
  int max_queued = 0;      // queued runs (--max-queued-per-client)
  int max_analyses = 0;    // queued + running analysis jobs (--max-analysis-jobs-per-client)
  int max_watches = 0;     // open WatchRun streams (--max-watches-per-client)
  int max_sweep_runs = 0;  // runs one sweep may expand to (--max-sweep-runs)
};

class Quotas {
 public:
  void Replace(std::map<std::string, QuotaOverrides> by_principal) {
    std::lock_guard<std::mutex> lock(mu_);
    by_principal_ = std::move(by_principal);
  }
  QuotaOverrides For(const std::string& principal) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_principal_.find(principal);
    return it == by_principal_.end() ? QuotaOverrides{} : it->second;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, QuotaOverrides> by_principal_;
};

// `override_value` when set, else `server_value`.
inline int LimitFor(int override_value, int server_value) { return override_value > 0 ? override_value : server_value; }

// Where a limit came from, for the error that names it.
inline std::string LimitSource(int override_value, const std::string& principal, const std::string& key,
                               const std::string& flag) {
  return override_value > 0 ? "the tokens file's " + key + " for " + principal : "server limit " + flag;
}

}  // namespace circuitlab
