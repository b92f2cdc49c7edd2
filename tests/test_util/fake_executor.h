// A torch-free engine::Executor for scheduler and RPC tests. A "run" counts
// steps; each step emits metrics, checkpoints every `checkpoint_every`
// steps (the checkpoint bytes are "step=<n>"), honours cancel/preempt, and
// resumes from a checkpoint. Steps can be slowed down or held at a gate.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "server/engine/api.h"

namespace circuitlab::testing {

class FakeExecutor : public engine::Executor {
 public:
  std::chrono::milliseconds step_time{0};
  int checkpoint_every = 5;
  int progress_every = 1;  // progress reported every this many steps (an engine throttles its reports)
  // When set, Train fails with this status after `fail_after` steps.
  absl::Status fail_with = absl::OkStatus();
  int fail_after = 0;

  absl::StatusOr<engine::TrainOutcome> Train(const engine::TrainRequest& req, engine::TrainObserver& obs) override {
    started_.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      started_names_.push_back(req.spec.name());
    }
    int64_t step = 0;
    if (req.resume_from) {
      const std::string& b = *req.resume_from;
      if (b.rfind("step=", 0) != 0) return absl::InvalidArgumentError("bad fake checkpoint");
      step = std::stoll(b.substr(5));
      resumed_from_.store(step);
    }
    const int64_t total = static_cast<int64_t>(req.spec.training().steps());
    while (step < total) {
      WaitAtGate();
      if (req.cancel && req.cancel->stop_requested()) {
        if (req.cancel->reason() == StopReason::kPreempt) {
          if (absl::Status s = obs.OnCheckpoint(step, "step=" + std::to_string(step)); !s.ok()) return s;
          return engine::TrainOutcome{engine::TrainEnd::kPreempted, step};
        }
        return engine::TrainOutcome{engine::TrainEnd::kCancelled, step};
      }
      if (step_time.count() > 0) std::this_thread::sleep_for(step_time);
      ++step;
      if (!fail_with.ok() && step >= fail_after) return fail_with;
      obs.OnMetrics(step, {{"train/loss", 1.0 / static_cast<double>(step)}, {"train/step", static_cast<double>(step)}});
      if (step % progress_every == 0 || step == total) obs.OnProgress(step, 100.0);
      if (step % checkpoint_every == 0 || step == total) {
        if (absl::Status s = obs.OnCheckpoint(step, "step=" + std::to_string(step)); !s.ok()) return s;
      }
    }
    return engine::TrainOutcome{engine::TrainEnd::kCompleted, step};
  }

  std::vector<absl::StatusOr<engine::TrainOutcome>> TrainPack(const std::vector<engine::TrainRequest>& requests,
                                                              const std::vector<engine::TrainObserver*>& observers) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      pack_sizes_.push_back(requests.size());
    }
    return engine::Executor::TrainPack(requests, observers);  // one after another
  }
  // Sizes of the packs TrainPack was given, in order.
  std::vector<size_t> pack_sizes() {
    std::lock_guard<std::mutex> lock(mu_);
    return pack_sizes_;
  }

  // Holds every run before its next step until Open().
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    gate_open_ = false;
  }
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      gate_open_ = true;
    }
    cv_.notify_all();
  }
  int started() const { return started_.load(); }
  // Spec names of the runs started, in order.
  std::vector<std::string> started_names() {
    std::lock_guard<std::mutex> lock(mu_);
    return started_names_;
  }
  int64_t resumed_from() const { return resumed_from_.load(); }

 private:
  void WaitAtGate() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(30), [&] { return gate_open_; });
  }
  std::mutex mu_;
  std::condition_variable cv_;
  bool gate_open_ = true;
  std::vector<std::string> started_names_;
  std::vector<size_t> pack_sizes_;
  std::atomic<int> started_{0};
  std::atomic<int64_t> resumed_from_{-1};
};

}  // namespace circuitlab::testing
