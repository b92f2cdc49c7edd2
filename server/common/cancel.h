// Cooperative cancellation for long work (training runs, analyses).
//
// A CancelToken is shared between the party that asks work to stop and the
// work itself, which polls `stop_requested()` at safe points (every training
// step). Two kinds of stop exist because they end differently:
//   kCancel  - the user cancelled: the run ends in state CANCELLED.
//   kPreempt - the server drains (SIGTERM): checkpoint, go back to QUEUED, and
//              resume on the next start.
// Thread-safe; the first request wins.
#pragma once

#include <atomic>

namespace circuitlab {

enum class StopReason { kNone = 0, kCancel = 1, kPreempt = 2 };

class CancelToken {
 public:
  // Returns true if this call set the reason (no earlier request).
  bool Request(StopReason reason) {
    int expected = static_cast<int>(StopReason::kNone);
    return reason_.compare_exchange_strong(expected, static_cast<int>(reason));
  }
  bool stop_requested() const { return reason() != StopReason::kNone; }
  StopReason reason() const { return static_cast<StopReason>(reason_.load(std::memory_order_acquire)); }

 private:
  std::atomic<int> reason_{static_cast<int>(StopReason::kNone)};
};

}  // namespace circuitlab
