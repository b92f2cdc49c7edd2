// Cancellation of the analysis running on this thread, reached from deep
// inside the engine without a token threaded through every call.
//
// An analysis worker installs its job's token with ScopedThreadCancel for the
// length of the job; the models' forward passes call ThrowIfThreadCancelled()
// once per call (one thread-local load when nothing is installed, as on the
// training workers), and the engine's entry points turn the exception into
// absl::CancelledError. So a cancelled or drained analysis stops within one
// forward pass of one evaluation chunk, whatever analysis it is.
#pragma once

#include <exception>

#include "server/common/cancel.h"

namespace circuitlab {

// Thrown by ThrowIfThreadCancelled; caught at the engine's entry points.
struct ThreadCancelled : std::exception {
  const char* what() const noexcept override { return "analysis cancelled"; }
};

inline const CancelToken*& ThreadCancelToken() {
  static thread_local const CancelToken* token = nullptr;
  return token;
}

inline void ThrowIfThreadCancelled() {
  const CancelToken* token = ThreadCancelToken();
  if (token != nullptr && token->stop_requested()) throw ThreadCancelled();
}

// Installs `token` on this thread until destroyed (restoring the previous one).
class ScopedThreadCancel {
 public:
  explicit ScopedThreadCancel(const CancelToken* token) : previous_(ThreadCancelToken()) {
    ThreadCancelToken() = token;
  }
  ~ScopedThreadCancel() { ThreadCancelToken() = previous_; }
  ScopedThreadCancel(const ScopedThreadCancel&) = delete;
  ScopedThreadCancel& operator=(const ScopedThreadCancel&) = delete;

 private:
  const CancelToken* previous_;
};

}  // namespace circuitlab
