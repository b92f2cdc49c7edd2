// Principals, roles and the audit line format (server/security/auth.h, audit.h).
#include "server/security/auth.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "server/security/audit.h"
#include "tests/test_util/temp_dir.h"

namespace circuitlab::security {
namespace {

std::string Line(const std::string& name, const std::string& role, const std::string& token,
                 const std::string& extra = "") {
  return name + " " + role + " " + TokenDigestField(token) + (extra.empty() ? "" : " " + extra) + "\n";
}

TEST(AuthTest, TokenDigestIsSha256) {
  EXPECT_EQ(TokenDigestField("abc"), "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(TokenDigest("abc").size(), 32u);
}

TEST(AuthTest, ParsesPrincipalsRolesAndOverrides) {
  auto entries = ParseTokensFile("# lab principals\n\n" + Line("alice", "user", "tok-alice-0123456789") +
                                     Line("ci", "reader", "tok-ci-0123456789") + "  " +
                                     Line("root", "admin", "tok-root-0123456789", "max_queued=5 max_watches=7"),
                                 "tokens.txt");
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 3u);
  EXPECT_EQ((*entries)[0].principal.name, "alice");
  EXPECT_EQ((*entries)[0].principal.role, Role::kUser);
  EXPECT_EQ((*entries)[1].principal.role, Role::kReader);
  EXPECT_EQ((*entries)[2].principal.role, Role::kAdmin);
  EXPECT_EQ((*entries)[2].quotas.max_queued, 5);
  EXPECT_EQ((*entries)[2].quotas.max_watches, 7);
  EXPECT_EQ((*entries)[2].quotas.max_analyses, 0);
}

TEST(AuthTest, RefusesBadLinesNamingTheLine) {
  const std::string ok = Line("alice", "user", "tok-alice-0123456789");
  struct Case {
    std::string text, needle;
  };
  for (const Case& c : std::vector<Case>{
           {ok + "bob superuser sha256:" + std::string(64, 'a') + "\n",
            "line 2: the role must be admin, user, reader or worker"},
           {"bob user my-token-in-clear-0123\n", "line 1: the third field must be sha256:<64 hex digits>"},
           {"bob user sha256:abcd\n", "sha256:<64 hex digits>"},
           {ok + Line("alice", "admin", "another-token-0123456"), "line 2: principal 'alice' is named twice"},
           {ok + Line("bob", "user", "tok-alice-0123456789"), "line 2: the same token digest"},
           {Line("bob", "user", "tok-bob-0123456789", "max_queued=0"), "max_queued must be an integer in [1, 1000000]"},
           {Line("bob", "user", "tok-bob-0123456789", "max_cpu=3"), "'max_cpu=3' is not an override"},
           {"bob user\n", "expected 'name role sha256:<hex>'"},
           {Line("bob\x01", "user", "tok-bob-0123456789"), "the name must be 1-64 of"},
           {"# nobody\n", "names no principals"},
       }) {
    auto parsed = ParseTokensFile(c.text, "tokens.txt");
    ASSERT_FALSE(parsed.ok()) << c.text;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(c.needle), std::string::npos) << parsed.status().message();
    EXPECT_NE(parsed.status().message().find("tokens.txt"), std::string::npos) << "names the file";
  }
}

TEST(AuthTest, OpenServerCallsEveryoneLocalAdmin) {
  auto auth = Authenticator::Create("", "", nullptr);
  ASSERT_TRUE(auth.ok());
  EXPECT_TRUE((*auth)->open());
  auto who = (*auth)->Resolve("");
  ASSERT_TRUE(who.ok());
  EXPECT_EQ(who->name, "local");
  EXPECT_EQ(who->role, Role::kAdmin);
}

TEST(AuthTest, ResolvesTokensAndReloadsTheFile) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/tokens.txt";
  std::ofstream(path) << Line("alice", "user", "tok-alice-0123456789", "max_queued=3")
                      << Line("bob", "user", "tok-bob-0123456789");
  Quotas quotas;
  auto auth = Authenticator::Create(path, "", &quotas);
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_FALSE((*auth)->open());
  EXPECT_EQ((*auth)->Resolve("Bearer tok-alice-0123456789")->name, "alice");
  EXPECT_EQ((*auth)->Resolve("Bearer tok-bob-0123456789")->name, "bob");
  EXPECT_EQ(quotas.For("alice").max_queued, 3);
  EXPECT_EQ(quotas.For("bob").max_queued, 0);
  for (const char* bad : {"", "Bearer ", "Bearer tok-alice-012345678", "tok-alice-0123456789", "Basic abc"}) {
    EXPECT_EQ((*auth)->Resolve(bad).status().code(), absl::StatusCode::kUnauthenticated) << bad;
  }
  // Bob's token revoked, alice's limit changed: applies at Reload.
  std::ofstream(path) << Line("alice", "user", "tok-alice-0123456789", "max_queued=9");
  ASSERT_TRUE((*auth)->Reload().ok());
  EXPECT_EQ((*auth)->Resolve("Bearer tok-bob-0123456789").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(quotas.For("alice").max_queued, 9);
  // A broken file is refused and the principals stay as they were.
  std::ofstream(path) << "alice user not-a-digest\n";
  EXPECT_EQ((*auth)->Reload().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*auth)->Resolve("Bearer tok-alice-0123456789")->name, "alice");
  EXPECT_EQ((*auth)->principal_count(), 1u);
}

TEST(AuthTest, SingleTokenFileIsOneAdmin) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/token";
  std::ofstream(path) << "  0123456789abcdef-secret \r\n";
  auto auth = Authenticator::Create("", path, nullptr);
  ASSERT_TRUE(auth.ok()) << auth.status();
  auto who = (*auth)->Resolve("Bearer 0123456789abcdef-secret");
  ASSERT_TRUE(who.ok());
  EXPECT_EQ(who->name, "admin");
  EXPECT_EQ(who->role, Role::kAdmin);
  std::ofstream(path) << "short\n";
  EXPECT_EQ(Authenticator::Create("", path, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Authenticator::Create(path, path, nullptr).status().code(), absl::StatusCode::kInvalidArgument)
      << "one of the two flags, not both";
}

TEST(AuthTest, AccessRules) {
  const Principal alice{"alice", Role::kUser}, bob{"bob", Role::kUser}, ci{"ci", Role::kReader},
      root{"root", Role::kAdmin};
  EXPECT_TRUE(MayChange(alice, "alice", "run r1").ok());
  EXPECT_TRUE(MayChange(root, "alice", "run r1").ok());
  absl::Status refused = MayChange(bob, "alice", "run r1");
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(refused.message().find("run r1 belongs to 'alice'"), std::string::npos) << refused.message();
  EXPECT_EQ(MayChange(ci, "ci", "run r1").code(), absl::StatusCode::kPermissionDenied) << "readers change nothing";
  EXPECT_EQ(MayWrite(ci, "SubmitRun").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(MayWrite(alice, "SubmitRun").ok());
  EXPECT_TRUE(MayRead(bob, "alice", false));
  EXPECT_FALSE(MayRead(bob, "alice", true));
  EXPECT_TRUE(MayRead(alice, "alice", true));
  EXPECT_TRUE(MayRead(root, "alice", true));
  EXPECT_TRUE(MayRead(ci, "alice", true));
}

TEST(AuditTest, OneJsonLineWithClientStringsEscaped) {
  AuditRecord r;
  r.principal = "alice";
  r.role = "user";
  r.peer = "ipv4:127.0.0.1:5000";
  r.client = "spoof\n{\"principal\": \"root\"}";
  r.method = "CancelRun";
  r.target = "r1\n{\"forged\": \xff}";
  r.outcome = absl::PermissionDeniedError("nope");
  const std::string line = AuditLog::Format(r, 1'700'000'000'123'456);
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  auto parsed = nlohmann::json::parse(line);
  EXPECT_EQ(parsed["time"], "2023-11-14T22:13:20.123456Z");
  EXPECT_EQ(parsed["principal"], "alice");
  EXPECT_EQ(parsed["client"], "spoof\n{\"principal\": \"root\"}") << "a label stays inside its field";
  EXPECT_EQ(parsed["method"], "CancelRun");
  EXPECT_EQ(parsed["outcome"], "PERMISSION_DENIED");
  EXPECT_EQ(parsed["target"].get<std::string>().substr(0, 3), "r1\n");
}

}  // namespace
}  // namespace circuitlab::security
