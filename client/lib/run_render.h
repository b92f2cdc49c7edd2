// Renderings of runs: the details of one run, and the live progress of a
// watched run (a bar on a terminal, a line every few seconds otherwise).
#pragma once

#include <chrono>
#include <map>
#include <string>

#include "circuitlab/v1/experiment_service.pb.h"

namespace circuitlab::client {

// State, progress, times, tags, error and latest metrics, one per line.
std::string RunDetailsText(const v1::Run& run);

// Draws WatchRun events on stderr (protobuf JSON lines on stdout with
// `json`) and remembers the run's state and latest metrics.
class ProgressPrinter {
 public:
  explicit ProgressPrinter(bool json);

  void OnEvent(const v1::RunEvent& ev);
  // Ends a bar drawn on a terminal.
  void EndLine();

  v1::RunState state() const { return state_; }
  const std::string& error() const { return error_; }
  const std::map<std::string, double>& latest() const { return latest_; }

 private:
  std::string Get(const std::string& key) const;
  void Draw(uint64_t step, double rate, double eta);

  bool json_;
  bool tty_;
  bool drawn_ = false;
  bool announced_ = false;
  uint64_t total_ = 0;
  std::string run_id_;
  v1::RunState state_ = v1::RUN_STATE_UNSPECIFIED;
  std::string error_;
  std::map<std::string, double> latest_;
  std::chrono::steady_clock::time_point last_line_{};
};

}  // namespace circuitlab::client
