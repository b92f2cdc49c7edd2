// Injected time, so tests control it (FakeClock) and code never calls
// std::chrono::system_clock directly where a test needs to reason about time.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>

namespace circuitlab {

class Clock {
 public:
  virtual ~Clock() = default;
  // Wall-clock time in microseconds since the Unix epoch.
  virtual int64_t NowMicros() const = 0;
  // Monotonic seconds, for rates and durations.
  virtual double MonotonicSeconds() const = 0;
  // The process-wide real clock.
  static Clock* Real();
};

// A clock that only moves when told. Thread-safe.
class FakeClock : public Clock {
 public:
  explicit FakeClock(int64_t start_micros = 1'700'000'000'000'000) : now_(start_micros) {}
  int64_t NowMicros() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return now_;
  }
  double MonotonicSeconds() const override { return static_cast<double>(NowMicros()) * 1e-6; }
  void AdvanceMicros(int64_t d) {
    std::lock_guard<std::mutex> lock(mu_);
    now_ += d;
  }

 private:
  mutable std::mutex mu_;
  int64_t now_;
};

}  // namespace circuitlab
