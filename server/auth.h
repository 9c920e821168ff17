// Bearer tokens and roles for kilnd (README.md, "Running kilnd for a team").
//
// The token file (kilnd --auth_tokens=FILE) holds one token per line:
//
//   # sha256-hex                                                      roles
//   name 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
//   compile      ci
//   60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752
//   compile,read-stats alice
//   fd61a03af4f77d870fc21e05e7e80678095c92d808cfb3b5c279ee04c74aca13  admin ops
//
// The first column is the SHA-256 (hex) of the token a client sends as
// `authorization: Bearer <token>`; the file never holds a token itself
// (`printf %s "$TOKEN" | sha256sum`). Roles, comma-separated:
//
//   compile     Compile, Lookup (gRPC and the hit socket), ExplainKey,
//               GetServerInfo
//   read-stats  GetStats
//   admin       Evict, ListEntries, and every other role's RPCs
//
// The name (default: "token-" and the hash's first 8 hex digits) is the
// identity in logs and the unit of the per-token compile limits. An
// optional last field `expires=WHEN` (RFC 3339, e.g. 2027-01-31T00:00:00Z,
// or unix seconds) ends the token's validity: from then on it gets
// UNAUTHENTICATED ("token 'ci' expired at ..."), without a reload. A file
// that does not parse is refused whole (at start: kilnd exits; on SIGHUP:
// the previous tokens stay and the error is logged).
//
// Checking a token hashes it once and compares the hash with every entry
// in constant time (no early exit, no map lookup keyed by secret-derived
// bytes), so timing tells nothing about how close a guess was.
//
// Under mTLS, roles can also go by client certificate instead of token
// (kilnd --client_cert_roles=FILE): one line per certificate common name,
// `roles common-name` (`#` comments; the name is the rest of the line,
// spaces included):
//
//   compile     ci-runner
//   admin       ops bot
//
// A caller that sends no token is authorized by the common name of the
// client certificate gRPC verified against --tls_client_ca (CertRoles);
// one that sends a token, when kilnd also has tokens, by the token.
//
// Thread-safety: Authenticator and CertRoles are thread-safe; Reload swaps
// the table atomically under concurrent Checks.
#ifndef KILN_SERVER_AUTH_H_
#define KILN_SERVER_AUTH_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "support/sha256.h"

namespace kiln {

// A role is a bit; a token holds a set of them.
enum class Role : uint32_t {
  kCompile = 1u << 0,
  kReadStats = 1u << 1,
  kAdmin = 1u << 2,
};

// "compile", "read-stats", "admin".
absl::string_view RoleName(Role role);

// Who made a request: the token's name; without tokens, the common name of
// a verified client certificate (mTLS); else empty (one anonymous caller).
struct Identity {
  std::string name;
  std::string kind = "token";  // or "client certificate"
  // How the per-token compile limits (server/compile_pool.h) name this
  // caller: "token 'ci'", "client certificate 'alice'"; empty: anonymous.
  std::string FairUseKey() const {
    return name.empty() ? std::string() : kind + " '" + name + "'";
  }
};

// One parsed line of a token file.
struct TokenEntry {
  Sha256Digest hash{};
  uint32_t roles = 0;  // bits of Role; admin implies the others
  std::string name;
  absl::Time expires = absl::InfiniteFuture();  // `expires=`; none: never
};

// Parses a token file's text (`origin` names it in errors). Errors:
// INVALID_ARGUMENT naming the line and what is wrong (a hash that is not
// 64 hex digits, an unknown role, a duplicate hash or name, an `expires=`
// that is neither RFC 3339 nor unix seconds).
absl::StatusOr<std::vector<TokenEntry>> ParseTokenFile(
    absl::string_view text, absl::string_view origin);

// One parsed line of a client-certificate roles file.
struct CertRoleEntry {
  std::string common_name;
  uint32_t roles = 0;  // bits of Role; admin implies the others
};

// Parses a client-certificate roles file's text (`origin` names it in
// errors). Errors: INVALID_ARGUMENT naming the line and what is wrong (no
// name, an unknown role, a name listed twice).
absl::StatusOr<std::vector<CertRoleEntry>> ParseCertRolesFile(
    absl::string_view text, absl::string_view origin);

// Roles by verified client-certificate common name (see the file comment).
class CertRoles {
 public:
  // Reads and parses `path`. Errors: those of ParseCertRolesFile; NOT_FOUND
  // when the file cannot be read.
  static absl::StatusOr<std::unique_ptr<CertRoles>> Load(std::string path);

  // Reads the file again; on error keeps the current table. Returns the
  // number of certificate names now in force.
  absl::StatusOr<size_t> Reload();

  // The identity (kind "client certificate") of a caller whose verified
  // client certificate has `common_name` (empty: the caller presented
  // none) if its line holds `needed`. Errors: UNAUTHENTICATED when there
  // is no certificate or its name is not listed; PERMISSION_DENIED naming
  // the role `method` needs and the certificate.
  absl::StatusOr<Identity> Check(absl::string_view common_name, Role needed,
                                 absl::string_view method) const;

  const std::string& path() const { return path_; }

 private:
  CertRoles(std::string path, std::vector<CertRoleEntry> entries);

  const std::string path_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const std::vector<CertRoleEntry>> entries_
      ABSL_GUARDED_BY(mu_);
};

class Authenticator {
 public:
  // Reads and parses `path`. Errors: those of ParseTokenFile; NOT_FOUND or
  // PERMISSION_DENIED when the file cannot be read.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Load(std::string path);

  // Reads the file again; on error keeps the current tokens. Returns the
  // number of tokens now in force.
  absl::StatusOr<size_t> Reload();

  // The identity behind `authorization` (the value of the request's
  // "authorization" metadata, "Bearer <token>"; empty when absent) if it
  // holds `needed` at `now`. Errors: UNAUTHENTICATED for a missing,
  // malformed or unknown token, or one whose `expires=` is not after `now`
  // (naming the token and the time); PERMISSION_DENIED naming the role
  // `method` needs and the token's name.
  absl::StatusOr<Identity> Check(absl::string_view authorization, Role needed,
                                 absl::string_view method,
                                 absl::Time now = absl::Now()) const;

  const std::string& path() const { return path_; }

 private:
  Authenticator(std::string path, std::vector<TokenEntry> entries);

  const std::string path_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const std::vector<TokenEntry>> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kiln

#endif  // KILN_SERVER_AUTH_H_
