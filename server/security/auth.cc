#include "server/security/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <spdlog/spdlog.h>

#include <fstream>
#include <set>
#include <sstream>

#include "server/common/text.h"

namespace circuitlab::security {
namespace {

constexpr size_t kDigestBytes = 32;
constexpr std::string_view kBearer = "Bearer ";

std::string Trim(std::string_view s) {
  const size_t begin = s.find_first_not_of(" \t\r"), end = s.find_last_not_of(" \t\r");
  return begin == std::string_view::npos ? "" : std::string(s.substr(begin, end - begin + 1));
}

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-' && c != '@') return false;
  }
  return true;
}

absl::StatusOr<std::string> ParseDigest(const std::string& field, const std::string& where) {
  constexpr std::string_view kPrefix = "sha256:";
  if (field.rfind(kPrefix, 0) != 0 || field.size() != kPrefix.size() + 2 * kDigestBytes ||
      field.find_first_not_of("0123456789abcdefABCDEF", kPrefix.size()) != std::string::npos) {
    return absl::InvalidArgumentError(
        where +
        ": the third field must be sha256:<64 hex digits> of the token, never the token itself (make one "
        "with scripts/add-principal.sh, or: printf %s \"$TOKEN\" | sha256sum)");
  }
  std::string raw(kDigestBytes, '\0');
  for (size_t i = 0; i < kDigestBytes; ++i) {
    raw[i] = static_cast<char>(std::stoi(field.substr(kPrefix.size() + 2 * i, 2), nullptr, 16));
  }
  return raw;
}

absl::Status ParseOverride(const std::string& field, const std::string& where, QuotaOverrides* q) {
  const size_t eq = field.find('=');
  const std::string key = field.substr(0, eq);
  int* target = key == "max_queued"       ? &q->max_queued
                : key == "max_analyses"   ? &q->max_analyses
                : key == "max_watches"    ? &q->max_watches
                : key == "max_sweep_runs" ? &q->max_sweep_runs
                                          : nullptr;
  if (eq == std::string::npos || target == nullptr) {
    return absl::InvalidArgumentError(where + ": '" + Clip(EscapeControl(field), 64) +
                                      "' is not an override (max_queued=, max_analyses=, max_watches=, "
                                      "max_sweep_runs=)");
  }
  const std::string value = field.substr(eq + 1);
  if (value.empty() || value.size() > 7 || value.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(value) < 1 || std::stoi(value) > 1000000) {
    return absl::InvalidArgumentError(where + ": " + key + " must be an integer in [1, 1000000], got '" +
                                      Clip(EscapeControl(value), 32) + "'");
  }
  *target = std::stoi(value);
  return absl::OkStatus();
}

}  // namespace

const char* RoleName(Role role) {
  switch (role) {
    case Role::kReader:
      return "reader";
    case Role::kUser:
      return "user";
    case Role::kAdmin:
      return "admin";
    case Role::kWorker:
      return "worker";
  }
  return "?";
}

std::string TokenDigest(std::string_view token) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(token.data(), token.size(), out, &len, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<const char*>(out), len);
}

std::string TokenDigestField(std::string_view token) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "sha256:";
  for (unsigned char c : TokenDigest(token)) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

absl::StatusOr<std::vector<TokenEntry>> ParseTokensFile(std::string_view text, const std::string& source) {
  std::vector<TokenEntry> entries;
  std::set<std::string> names, digests;
  std::istringstream in{std::string(text)};
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream fields(line);
    std::vector<std::string> f;
    for (std::string w; fields >> w;) f.push_back(w);
    if (f.empty()) continue;
    const std::string where = source + " line " + std::to_string(number);
    if (f.size() < 3) {
      return absl::InvalidArgumentError(where + ": expected 'name role sha256:<hex>' and optional overrides, got " +
                                        std::to_string(f.size()) + " field(s)");
    }
    TokenEntry e;
    if (!ValidName(f[0])) {
      return absl::InvalidArgumentError(where + ": the name must be 1-64 of A-Z a-z 0-9 . _ - @, got '" +
                                        Clip(EscapeControl(f[0]), 64) + "'");
    }
    e.principal.name = f[0];
    if (f[1] == "admin") {
      e.principal.role = Role::kAdmin;
    } else if (f[1] == "user") {
      e.principal.role = Role::kUser;
    } else if (f[1] == "reader") {
      e.principal.role = Role::kReader;
    } else if (f[1] == "worker") {
      e.principal.role = Role::kWorker;
    } else {
      return absl::InvalidArgumentError(where + ": the role must be admin, user, reader or worker, got '" +
                                        Clip(EscapeControl(f[1]), 32) + "'");
    }
    absl::StatusOr<std::string> digest = ParseDigest(f[2], where);
    if (!digest.ok()) return digest.status();
    e.digest = *std::move(digest);
    for (size_t i = 3; i < f.size(); ++i) {
      if (absl::Status s = ParseOverride(f[i], where, &e.quotas); !s.ok()) return s;
    }
    if (!names.insert(e.principal.name).second) {
      return absl::InvalidArgumentError(where + ": principal '" + e.principal.name + "' is named twice");
    }
    if (!digests.insert(e.digest).second) {
      return absl::InvalidArgumentError(where +
                                        ": the same token digest as an earlier principal (tokens must "
                                        "differ, or the server could not tell them apart)");
    }
    entries.push_back(std::move(e));
  }
  if (entries.empty()) return absl::InvalidArgumentError(source + " names no principals");
  return entries;
}

absl::StatusOr<std::string> ReadSingleToken(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError("cannot read " + path);
  std::string line;
  std::getline(in, line);
  // Without the whitespace and CR an editor leaves (clients trim theirs too).
  std::string token = Trim(line);
  if (token.size() < 16) return absl::InvalidArgumentError(path + ": the token must be at least 16 characters");
  return token;
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(const std::string& tokens_file,
                                                                     const std::string& single_token_file,
                                                                     Quotas* quotas) {
  if (!tokens_file.empty() && !single_token_file.empty()) {
    return absl::InvalidArgumentError("give --auth-tokens-file or --auth-token-file, not both");
  }
  std::unique_ptr<Authenticator> auth(new Authenticator(tokens_file, single_token_file, quotas));
  if (!auth->open()) {
    if (absl::Status s = auth->Reload(); !s.ok()) return s;
  }
  return auth;
}

absl::Status Authenticator::Reload() {
  std::vector<TokenEntry> entries;
  if (!tokens_file_.empty()) {
    std::ifstream in(tokens_file_);
    if (!in) return absl::NotFoundError("cannot read --auth-tokens-file " + tokens_file_);
    std::stringstream text;
    text << in.rdbuf();
    if (text.str().size() > (1 << 20)) return absl::InvalidArgumentError(tokens_file_ + " is larger than 1 MiB");
    absl::StatusOr<std::vector<TokenEntry>> parsed = ParseTokensFile(text.str(), tokens_file_);
    if (!parsed.ok()) return parsed.status();
    entries = *std::move(parsed);
  } else if (!single_token_file_.empty()) {
    absl::StatusOr<std::string> token = ReadSingleToken(single_token_file_);
    if (!token.ok()) return token.status();
    entries.push_back(TokenEntry{Principal{"admin", Role::kAdmin}, TokenDigest(*token), {}});
  }
  if (quotas_ != nullptr) {
    std::map<std::string, QuotaOverrides> overrides;
    for (const TokenEntry& e : entries) overrides[e.principal.name] = e.quotas;
    quotas_->Replace(std::move(overrides));
  }
  auto table = std::make_shared<const std::vector<TokenEntry>>(std::move(entries));
  std::lock_guard<std::mutex> lock(mu_);
  entries_ = std::move(table);
  return absl::OkStatus();
}

size_t Authenticator::principal_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_ ? entries_->size() : 0;
}

absl::StatusOr<Principal> Authenticator::Resolve(std::string_view authorization) const {
  if (open()) return Principal{"local", Role::kAdmin};
  std::shared_ptr<const std::vector<TokenEntry>> entries;
  {
    std::lock_guard<std::mutex> lock(mu_);
    entries = entries_;
  }
  if (authorization.substr(0, kBearer.size()) == kBearer && authorization.size() > kBearer.size() && entries) {
    const std::string digest = TokenDigest(authorization.substr(kBearer.size()));
    // Every digest is compared, each in constant time: the time taken does
    // not depend on which principal (if any) matched, nor where.
    const TokenEntry* match = nullptr;
    for (const TokenEntry& e : *entries) {
      if (CRYPTO_memcmp(e.digest.data(), digest.data(), kDigestBytes) == 0) match = &e;
    }
    if (match != nullptr) return match->principal;
    return absl::UnauthenticatedError("the bearer token names no principal of this server (revoked, or a typo?)");
  }
  return absl::UnauthenticatedError(
      "this server requires 'authorization: Bearer <token>' metadata (circuitlab --token-file FILE)");
}

absl::Status MayChange(const Principal& who, const std::string& owner, const std::string& what) {
  if (who.role == Role::kAdmin || (who.role == Role::kUser && who.name == owner)) return absl::OkStatus();
  if (who.role == Role::kReader || who.role == Role::kWorker) return MayWrite(who, "change " + what);
  return absl::PermissionDeniedError(what + " belongs to '" + EscapeControl(owner) + "'; only its owner or an admin " +
                                     "may change it ('" + who.name + "' is a user)");
}

absl::Status MayWrite(const Principal& who, const std::string& method) {
  if (who.role != Role::kReader && who.role != Role::kWorker) return absl::OkStatus();
  return absl::PermissionDeniedError("'" + who.name + "' has the " + RoleName(who.role) +
                                     " role: it may read but not " + method);
}

absl::Status MayUseResearchSurface(const Principal& who) {
  if (who.role != Role::kWorker) return absl::OkStatus();
  return absl::PermissionDeniedError("'" + who.name +
                                     "' has the worker role: it reaches WorkerService only (a circuitlab-worker's "
                                     "session), not runs, analyses or reproductions");
}

bool MayRead(const Principal& who, const std::string& owner, bool private_runs) {
  return !private_runs || who.role != Role::kUser || who.name == owner;
}

}  // namespace circuitlab::security
