#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "server/common/status_macros.h"
#include "server/common/thread_cancel.h"

namespace circuitlab {
namespace {

// An exception escaping an RPC handler's core becomes INTERNAL with its
// message (issue 14: SubmitSweep's std::length_error answered UNIMPLEMENTED
// with no message).
TEST(CallCatchingTest, ExceptionsBecomeInternalWithTheirMessage) {
  absl::Status s = CallCatching([]() -> absl::Status {
    std::vector<int> v;
    v.reserve(v.max_size() + 1);  // throws std::length_error
    return absl::OkStatus();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(s.message().rfind("internal error: ", 0), 0u) << s;
  absl::StatusOr<int> n = CallCatching([]() -> absl::StatusOr<int> { throw 42; });
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(CallCatching([]() -> absl::StatusOr<int> { return 7; }).value(), 7);
}

TEST(ThreadCancelTest, OnlyTheInstalledTokenStopsThisThread) {
  EXPECT_NO_THROW(ThrowIfThreadCancelled());  // nothing installed (training workers)
  CancelToken token;
  {
    ScopedThreadCancel scope(&token);
    EXPECT_NO_THROW(ThrowIfThreadCancelled());
    token.Request(StopReason::kCancel);
    EXPECT_THROW(ThrowIfThreadCancelled(), ThreadCancelled);
  }
  EXPECT_NO_THROW(ThrowIfThreadCancelled());  // the scope restored the previous (none)
}

}  // namespace
}  // namespace circuitlab
