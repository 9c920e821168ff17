#include "server/auth.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace kiln {
namespace {

constexpr uint32_t kAllRoles = static_cast<uint32_t>(Role::kCompile) |
                               static_cast<uint32_t>(Role::kReadStats) |
                               static_cast<uint32_t>(Role::kAdmin);

absl::StatusOr<uint32_t> ParseRoles(absl::string_view text) {
  uint32_t roles = 0;
  for (absl::string_view name : absl::StrSplit(text, ',')) {
    if (name == "compile") {
      roles |= static_cast<uint32_t>(Role::kCompile);
    } else if (name == "read-stats") {
      roles |= static_cast<uint32_t>(Role::kReadStats);
    } else if (name == "admin") {
      roles |= kAllRoles;  // admin implies every other role
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown role '", name, "' (roles: compile, read-stats, admin)"));
    }
  }
  return roles;
}

// `expires=` value: RFC 3339 or unix seconds.
absl::StatusOr<absl::Time> ParseExpiry(absl::string_view text) {
  int64_t seconds = 0;
  if (absl::SimpleAtoi(text, &seconds)) return absl::FromUnixSeconds(seconds);
  absl::Time t;
  std::string error;
  if (absl::ParseTime(absl::RFC3339_full, text, &t, &error)) return t;
  return absl::InvalidArgumentError(absl::StrCat(
      "expires='", text,
      "' is neither RFC 3339 (2027-01-31T00:00:00Z) nor unix seconds"));
}

// Equal without an early exit: the time depends on the length only.
bool ConstantTimeEqual(const Sha256Digest& a, const Sha256Digest& b) {
  uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

absl::StatusOr<std::string> ReadFile(
    const std::string& path, absl::string_view what = "the token file") {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read ", what, " '", path, "'"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kCompile:
      return "compile";
    case Role::kReadStats:
      return "read-stats";
    case Role::kAdmin:
      return "admin";
  }
  return "unknown";
}

absl::StatusOr<std::vector<TokenEntry>> ParseTokenFile(
    absl::string_view text, absl::string_view origin) {
  std::vector<TokenEntry> entries;
  absl::flat_hash_set<std::string> hashes, names;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    auto error = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat(origin, ":", line_number, ": ", what,
                       " (expected: sha256-hex roles [name] [expires=WHEN])"));
    };
    TokenEntry entry;
    if (fields.size() >= 3 && absl::StartsWith(fields.back(), "expires=")) {
      absl::StatusOr<absl::Time> expires =
          ParseExpiry(fields.back().substr(std::strlen("expires=")));
      if (!expires.ok()) return error(expires.status().message());
      entry.expires = *expires;
      fields.pop_back();
    }
    if (fields.size() < 2 || fields.size() > 3)
      return error(absl::StrCat(fields.size(), " fields"));
    const std::string hex = absl::AsciiStrToLower(fields[0]);
    if (hex.size() != 64 || !HexToDigest(hex, &entry.hash))
      return error("the first field is not a SHA-256 in 64 hex digits");
    absl::StatusOr<uint32_t> roles = ParseRoles(fields[1]);
    if (!roles.ok()) return error(roles.status().message());
    entry.roles = *roles;
    entry.name = fields.size() == 3 ? std::string(fields[2])
                                    : absl::StrCat("token-", hex.substr(0, 8));
    if (!hashes.insert(hex).second) return error("a hash listed twice");
    if (!names.insert(entry.name).second)
      return error(absl::StrCat("the name '", entry.name, "' is used twice"));
    entries.push_back(std::move(entry));
  }
  return entries;
}

Authenticator::Authenticator(std::string path, std::vector<TokenEntry> entries)
    : path_(std::move(path)),
      entries_(
          std::make_shared<const std::vector<TokenEntry>>(std::move(entries))) {
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Load(
    std::string path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<std::vector<TokenEntry>> entries = ParseTokenFile(*text, path);
  if (!entries.ok()) return entries.status();
  return std::unique_ptr<Authenticator>(
      new Authenticator(std::move(path), *std::move(entries)));
}

absl::StatusOr<size_t> Authenticator::Reload() {
  absl::StatusOr<std::string> text = ReadFile(path_);
  if (!text.ok()) return text.status();
  absl::StatusOr<std::vector<TokenEntry>> entries =
      ParseTokenFile(*text, path_);
  if (!entries.ok()) return entries.status();
  const size_t count = entries->size();
  auto table =
      std::make_shared<const std::vector<TokenEntry>>(*std::move(entries));
  absl::MutexLock lock(&mu_);
  entries_ = std::move(table);
  return count;
}

absl::StatusOr<Identity> Authenticator::Check(absl::string_view authorization,
                                              Role needed,
                                              absl::string_view method,
                                              absl::Time now) const {
  if (authorization.empty()) {
    return absl::UnauthenticatedError(absl::StrCat(
        method,
        " needs a token: send \"authorization: Bearer <token>\" (kilnctl "
        "--token, $KILN_TOKEN or $KILN_TOKEN_FILE)"));
  }
  absl::string_view token = authorization;
  if (!absl::ConsumePrefix(&token, "Bearer ") || token.empty()) {
    return absl::UnauthenticatedError(absl::StrCat(
        method, ": the authorization metadata is not \"Bearer <token>\""));
  }
  const Sha256Digest hash = Sha256(token);
  std::shared_ptr<const std::vector<TokenEntry>> entries;
  {
    absl::MutexLock lock(&mu_);
    entries = entries_;
  }
  // Every entry is compared, whatever matched.
  const TokenEntry* found = nullptr;
  for (const TokenEntry& entry : *entries) {
    if (ConstantTimeEqual(entry.hash, hash)) found = &entry;
  }
  if (found == nullptr) {
    return absl::UnauthenticatedError(absl::StrCat(
        method, ": unknown token (not in kilnd's token file, or removed)"));
  }
  if (now >= found->expires) {
    return absl::UnauthenticatedError(
        absl::StrCat(method, ": token '", found->name, "' expired at ",
                     absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", found->expires,
                                      absl::UTCTimeZone())));
  }
  if ((found->roles & static_cast<uint32_t>(needed)) == 0) {
    return absl::PermissionDeniedError(
        absl::StrCat(method, " needs the role '", RoleName(needed),
                     "', which token '", found->name, "' does not have"));
  }
  return Identity{found->name};
}

absl::StatusOr<std::vector<CertRoleEntry>> ParseCertRolesFile(
    absl::string_view text, absl::string_view origin) {
  std::vector<CertRoleEntry> entries;
  absl::flat_hash_set<std::string> names;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    auto error = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat(origin, ":", line_number, ": ", what,
                       " (expected: roles common-name)"));
    };
    const size_t space = line.find_first_of(" \t");
    if (space == absl::string_view::npos) return error("no common name");
    absl::StatusOr<uint32_t> roles = ParseRoles(line.substr(0, space));
    if (!roles.ok()) return error(roles.status().message());
    CertRoleEntry entry;
    entry.roles = *roles;
    entry.common_name =
        std::string(absl::StripAsciiWhitespace(line.substr(space)));
    if (!names.insert(entry.common_name).second) {
      return error(
          absl::StrCat("the name '", entry.common_name, "' is listed twice"));
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

CertRoles::CertRoles(std::string path, std::vector<CertRoleEntry> entries)
    : path_(std::move(path)),
      entries_(std::make_shared<const std::vector<CertRoleEntry>>(
          std::move(entries))) {}

absl::StatusOr<std::unique_ptr<CertRoles>> CertRoles::Load(std::string path) {
  absl::StatusOr<std::string> text =
      ReadFile(path, "the client certificate roles file");
  if (!text.ok()) return text.status();
  absl::StatusOr<std::vector<CertRoleEntry>> entries =
      ParseCertRolesFile(*text, path);
  if (!entries.ok()) return entries.status();
  return std::unique_ptr<CertRoles>(
      new CertRoles(std::move(path), *std::move(entries)));
}

absl::StatusOr<size_t> CertRoles::Reload() {
  absl::StatusOr<std::string> text =
      ReadFile(path_, "the client certificate roles file");
  if (!text.ok()) return text.status();
  absl::StatusOr<std::vector<CertRoleEntry>> entries =
      ParseCertRolesFile(*text, path_);
  if (!entries.ok()) return entries.status();
  const size_t count = entries->size();
  auto table =
      std::make_shared<const std::vector<CertRoleEntry>>(*std::move(entries));
  absl::MutexLock lock(&mu_);
  entries_ = std::move(table);
  return count;
}

absl::StatusOr<Identity> CertRoles::Check(absl::string_view common_name,
                                          Role needed,
                                          absl::string_view method) const {
  if (common_name.empty()) {
    return absl::UnauthenticatedError(absl::StrCat(
        method,
        " needs a client certificate listed in kilnd's client certificate "
        "roles file (or a token)"));
  }
  std::shared_ptr<const std::vector<CertRoleEntry>> entries;
  {
    absl::MutexLock lock(&mu_);
    entries = entries_;
  }
  const CertRoleEntry* found = nullptr;
  for (const CertRoleEntry& entry : *entries) {
    if (entry.common_name == common_name) found = &entry;
  }
  if (found == nullptr) {
    return absl::UnauthenticatedError(
        absl::StrCat(method, ": client certificate '", common_name,
                     "' is not in kilnd's client certificate roles file"));
  }
  if ((found->roles & static_cast<uint32_t>(needed)) == 0) {
    return absl::PermissionDeniedError(
        absl::StrCat(method, " needs the role '", RoleName(needed),
                     "', which client certificate '", found->common_name,
                     "' does not have"));
  }
  return Identity{found->common_name, "client certificate"};
}

}  // namespace kiln
