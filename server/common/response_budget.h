// The bytes of answers being serialized and sent at once, over both fronts
// (issue 51: sixteen parallel reads of a 33 MB stored answer took the server
// past 5 GB). An answer takes its size from the budget before it is
// serialized and gives it back once it is sent (HTTP) or handed to gRPC; one
// that does not fit is RESOURCE_EXHAUSTED naming the numbers, so the client
// retries instead of the kernel killing the server. The limit is the
// process's (--max-response-bytes), set once by app::Server.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace circuitlab {

class ResponseBudget {
 public:
  // What an answer holds of the budget; given back when destroyed.
  class Lease {
   public:
    Lease() = default;
    Lease(ResponseBudget* budget, int64_t bytes) : budget_(budget), bytes_(bytes) {}
    Lease(Lease&& o) noexcept : budget_(std::exchange(o.budget_, nullptr)), bytes_(o.bytes_) {}
    Lease& operator=(Lease&& o) noexcept {
      if (this != &o) {
        Release();
        budget_ = std::exchange(o.budget_, nullptr);
        bytes_ = o.bytes_;
      }
      return *this;
    }
    ~Lease() { Release(); }
    void Release() {
      if (budget_ != nullptr) budget_->in_use_.fetch_sub(bytes_);
      budget_ = nullptr;
    }

   private:
    ResponseBudget* budget_ = nullptr;
    int64_t bytes_ = 0;
  };

  static constexpr int64_t kDefaultLimit = int64_t{1} << 30;

  // The process's budget.
  static ResponseBudget& Process() {
    static ResponseBudget budget;
    return budget;
  }
  void SetLimit(int64_t bytes) { limit_.store(bytes); }
  int64_t limit() const { return limit_.load(); }
  int64_t in_use() const { return in_use_.load(); }

  // `bytes` of the budget for an answer (`what`, e.g. "GetAttentionPatterns").
  absl::StatusOr<Lease> Acquire(int64_t bytes, const std::string& what) {
    const int64_t limit = limit_.load();
    int64_t used = in_use_.load();
    while (true) {
      if (used + bytes > limit) {
        return absl::ResourceExhaustedError(
            "the answer to " + what + " would take " + std::to_string(bytes) + " bytes while " + std::to_string(used) +
            " are being answered; the server answers at most " + std::to_string(limit) +
            " at once (--max-response-bytes); retry, or ask for less");
      }
      if (in_use_.compare_exchange_weak(used, used + bytes)) return Lease(this, bytes);
    }
  }

 private:
  std::atomic<int64_t> limit_{kDefaultLimit};
  std::atomic<int64_t> in_use_{0};
};

}  // namespace circuitlab
