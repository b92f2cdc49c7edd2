#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "client/lib/text_format.h"
#include "server/common/status_macros.h"
#include "server/common/text.h"
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

namespace circuitlab {
namespace {

// Issue 32 item 8: Unicode's C1 controls and bidirectional formatting
// characters count as control characters: refused in names, escaped in logs
// and in what the CLI prints; printable UTF-8 passes untouched.
TEST(TextTest, UnicodeControlsAreControlCharacters) {
  EXPECT_TRUE(HasControl("a\x1b[31m"));
  EXPECT_TRUE(HasControl("csi \u009b31m"));
  EXPECT_TRUE(HasControl("gpj\u202eexe"));
  EXPECT_TRUE(HasControl("isolate \u2066x\u2069"));
  EXPECT_TRUE(HasControl("mark \u200f"));
  EXPECT_FALSE(HasControl("naïve Straße 名前 ±π"));
  EXPECT_FALSE(HasControl("\u00a0\u2028"));  // NBSP, line separator: not C1 or bidi
  EXPECT_EQ(EscapeControl("a\nb\tc\x7f" "d\u009be\u202ef"), "a\\nb\\tc\\x7fd\\u009be\\u202ef");
  EXPECT_EQ(client::EscapeForTerminal("r\u009b\x1b" "x\u202e名"), "r\\u009b\\x1bx\\u202e名");
  EXPECT_EQ(EscapeControl(std::string("\xc2", 1)), std::string("\xc2", 1)) << "a cut sequence is not read past";
}

}  // namespace
}  // namespace circuitlab
