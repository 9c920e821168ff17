// SHA-256 digests (OpenSSL), used for guard keys and artifact integrity.
//
// Thread-safety: all functions are pure and safe to call concurrently;
// a Sha256Hasher instance is not shared between threads.
#ifndef KILN_SUPPORT_SHA256_H_
#define KILN_SUPPORT_SHA256_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"

namespace kiln {

using Sha256Digest = std::array<uint8_t, 32>;

// Incremental SHA-256.
class Sha256Hasher {
 public:
  Sha256Hasher();
  ~Sha256Hasher();
  Sha256Hasher(const Sha256Hasher&) = delete;
  Sha256Hasher& operator=(const Sha256Hasher&) = delete;

  void Update(absl::string_view bytes);
  // Returns the digest; the hasher must not be updated afterwards.
  Sha256Digest Finish();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// One-shot digest of `bytes`.
Sha256Digest Sha256(absl::string_view bytes);

// Lower-case hex of a digest (64 characters).
std::string DigestToHex(const Sha256Digest& digest);

// Parses 64 hex characters; returns false on anything else.
bool HexToDigest(absl::string_view hex, Sha256Digest* digest);

}  // namespace kiln

#endif  // KILN_SUPPORT_SHA256_H_
