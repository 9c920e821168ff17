// Signed artifacts (issue 18.3): kilnd signs every artifact it serves with
// an Ed25519 key only it holds; clients configured with trusted public keys
// refuse any artifact that is unsigned or not signed by one of them, before
// any of its code is loaded.
//
// What is signed: the 32-byte SHA-256 of the artifact's serialization
// (kiln.v1.Artifact, as stored in kilnd's cache and sent in Lookup
// responses), after the domain tag kArtifactSignatureDomain, so that a
// signature cannot be replayed as one over anything else. The signature
// travels next to the artifact (CompileResponse/LookupResponse
// .artifact_signature), never inside it, so cache keys and stored artifacts
// do not change. The binary is covered through the artifact's binary_sha256,
// which the loader checks as before.
//
// Keys: the private key is a PEM file (PKCS#8, as `openssl genpkey
// -algorithm ed25519` writes it) that kilnd reads or creates (mode 0600);
// public keys are written as 64 hex digits of the raw 32-byte key.
//
// Thread-safety: ArtifactSigner and TrustedKeys are immutable after
// creation; Sign and Verify may be called from any number of threads.
#ifndef KILN_SUPPORT_ARTIFACT_SIGNATURE_H_
#define KILN_SUPPORT_ARTIFACT_SIGNATURE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "support/sha256.h"

namespace kiln {

inline constexpr absl::string_view kArtifactSignatureDomain =
    "kiln.v1.Artifact signature 1";
inline constexpr size_t kEd25519PublicKeyBytes = 32;
inline constexpr size_t kEd25519SignatureBytes = 64;

// Holds kilnd's private key.
class ArtifactSigner {
 public:
  // Reads the Ed25519 private key in the PEM file `path`; when the file does
  // not exist and `create`, generates a key and writes it there first (mode
  // 0600, created exclusively). Errors: NOT_FOUND (no file, !create),
  // INVALID_ARGUMENT (not an Ed25519 private key), PERMISSION_DENIED and
  // other I/O errors; each message names the path.
  static absl::StatusOr<std::unique_ptr<ArtifactSigner>> LoadOrCreate(
      const std::string& path, bool create);
  // From a key in memory (tests).
  static std::unique_ptr<ArtifactSigner> Generate();
  ~ArtifactSigner();

  // The raw 32-byte public key, and as 64 hex digits.
  const std::string& public_key() const { return public_key_; }
  std::string public_key_hex() const;

  // The 64-byte signature over the artifact whose serialization has
  // `artifact_digest` as SHA-256.
  std::string Sign(const Sha256Digest& artifact_digest) const;

 private:
  struct Key;
  explicit ArtifactSigner(std::unique_ptr<Key> key);
  std::unique_ptr<Key> key_;
  std::string public_key_;
};

// The public keys a client trusts (several: rotation).
class TrustedKeys {
 public:
  TrustedKeys() = default;
  // Keys as 64 hex digits each, separated by commas, spaces or newlines
  // (the form of $KILN_TRUSTED_KEYS and of kilnctl public-key's output).
  // Errors: INVALID_ARGUMENT naming the bad entry.
  static absl::StatusOr<TrustedKeys> Parse(absl::string_view text);
  // Adds a raw 32-byte key. Errors: INVALID_ARGUMENT.
  absl::Status Add(absl::string_view raw_public_key);

  bool empty() const { return keys_.empty(); }
  size_t size() const { return keys_.size(); }

  // OK when `signature` is a valid signature by one of the keys over the
  // artifact whose serialization hashes to `artifact_digest`. Else
  // PERMISSION_DENIED: "unsigned" when the signature is empty, otherwise
  // "not signed by a trusted key" (another key, or bytes changed since).
  absl::Status Verify(const Sha256Digest& artifact_digest,
                      absl::string_view signature) const;

 private:
  std::vector<std::string> keys_;  // raw 32-byte public keys
};

// Raw key bytes as lowercase hex.
std::string KeyToHex(absl::string_view raw);

}  // namespace kiln

#endif  // KILN_SUPPORT_ARTIFACT_SIGNATURE_H_
