// Who is calling: principals with roles, resolved from the bearer token.
//
// The tokens file (--auth-tokens-file) holds one principal per line:
//
//   # name  role    digest of the token                        overrides (optional)
//   alice   user    sha256:9f86d081884c7d659a2feaa0c55ad015...  max_queued=500
//   ci      reader  sha256:2c26b46b68ffc68ff99b453c1d304134...
//   root    admin   sha256:fcde2b2edba56bf408601fb721fe9b5c...
//
// Tokens are never stored in clear: a call's `authorization: Bearer <token>`
// is hashed and compared in constant time with every principal's digest. The
// file is re-read on SIGHUP (Authenticator::Reload); a file that does not
// parse leaves the principals as they were. The older --auth-token-file (the
// token itself, one line) is one `admin` principal named "admin". With neither,
// the server is open: every caller is the principal "local", an admin (only
// allowed on loopback addresses).
//
// Roles: `admin` may do anything to anyone's runs; `user` submits and may
// cancel or delete its own runs, sweeps and analysis jobs; `reader` reads and
// submits nothing (a stored analysis answer is a read; starting one is not).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/common/quotas.h"

namespace circuitlab::security {

// kWorker: a circuitlab-worker (WorkerService); otherwise read-only.
enum class Role { kReader, kUser, kAdmin, kWorker };
const char* RoleName(Role role);

struct Principal {
  std::string name;  // owns what it submits ("local" on an open server)
  Role role = Role::kAdmin;
};

// One line of a tokens file.
struct TokenEntry {
  Principal principal;
  std::string digest;  // 32 raw bytes of SHA-256(token)
  QuotaOverrides quotas;
};

// SHA-256 of `token`, 32 raw bytes.
std::string TokenDigest(std::string_view token);
// The same as a tokens file writes it: "sha256:<64 lowercase hex digits>".
std::string TokenDigestField(std::string_view token);

// The principals of a tokens file's text. InvalidArgument naming `source`, the
// line and what is wrong (bad role, a digest that is not sha256:<64 hex>, a
// token in clear, a repeated name or digest, an unknown or out-of-range
// override); a file without principals is refused too.
absl::StatusOr<std::vector<TokenEntry>> ParseTokensFile(std::string_view text, const std::string& source);

// The first line of --auth-token-file, trimmed; InvalidArgument when shorter
// than 16 characters.
absl::StatusOr<std::string> ReadSingleToken(const std::string& path);

class Authenticator {
 public:
  // From --auth-tokens-file `tokens_file`, else --auth-token-file
  // `single_token_file`, else open. `quotas` (may be null) receives the
  // file's per-principal overrides at every (re)load.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(const std::string& tokens_file,
                                                               const std::string& single_token_file, Quotas* quotas);

  // Re-reads the file (SIGHUP). On error the principals stay as they were.
  absl::Status Reload();

  // True when no tokens are configured: every caller is "local", an admin.
  bool open() const { return tokens_file_.empty() && single_token_file_.empty(); }
  size_t principal_count() const;

  // The principal a call's `authorization` metadata value names ("" when the
  // call has none). Unauthenticated when tokens are configured and it names
  // none of them.
  absl::StatusOr<Principal> Resolve(std::string_view authorization) const;

 private:
  Authenticator(std::string tokens_file, std::string single_token_file, Quotas* quotas)
      : tokens_file_(std::move(tokens_file)), single_token_file_(std::move(single_token_file)), quotas_(quotas) {}

  const std::string tokens_file_;
  const std::string single_token_file_;
  Quotas* const quotas_;
  mutable std::mutex mu_;
  std::shared_ptr<const std::vector<TokenEntry>> entries_;  // replaced whole on Reload
};

// Access rules (one place). PermissionDenied naming the owner when `who` may
// not cancel or delete what `owner` owns (only its owner or an admin may).
absl::Status MayChange(const Principal& who, const std::string& owner, const std::string& what);
// PermissionDenied for a reader: it may read but not `method`.
absl::Status MayWrite(const Principal& who, const std::string& method);
// Least privilege (issue 51 item 11): the worker role reaches WorkerService
// only; PermissionDenied on every other service and HTTP route.
absl::Status MayUseResearchSurface(const Principal& who);
// Whether `who` may read what `owner` owns: always, unless the server keeps
// runs private (--private-runs), where a user reads only its own (admins and
// readers, whose role is to read, still read everything).
bool MayRead(const Principal& who, const std::string& owner, bool private_runs);

}  // namespace circuitlab::security
