#include "support/sha256.h"

#include <openssl/evp.h>

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"

namespace kiln {

struct Sha256Hasher::State {
  struct CtxFree {
    void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
  };
  std::unique_ptr<EVP_MD_CTX, CtxFree> ctx{EVP_MD_CTX_new()};
};

namespace {
// The SHA-256 implementation, fetched once. With EVP_sha256() OpenSSL 3
// looks the implementation up again (a lock and a table probe) on every
// EVP_DigestInit_ex, which doubles the cost of the short digests guard keys
// are made of. Immutable after the first call; never freed (it lives as long
// as the process's OpenSSL).
const EVP_MD* Sha256Md() {
  static const EVP_MD* const md = [] {
    const EVP_MD* fetched = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    return fetched != nullptr ? fetched : EVP_sha256();
  }();
  return md;
}
}  // namespace

Sha256Hasher::Sha256Hasher() : state_(std::make_unique<State>()) {
  // Allocation or init failure of a digest context means OpenSSL is unusable;
  // there is no sensible way to continue computing keys.
  if (state_->ctx == nullptr ||
      EVP_DigestInit_ex(state_->ctx.get(), Sha256Md(), nullptr) != 1) {
    std::abort();
  }
}

Sha256Hasher::~Sha256Hasher() = default;

void Sha256Hasher::Update(absl::string_view bytes) {
  EVP_DigestUpdate(state_->ctx.get(), bytes.data(), bytes.size());
}

Sha256Digest Sha256Hasher::Finish() {
  Sha256Digest digest{};
  unsigned int len = 0;
  EVP_DigestFinal_ex(state_->ctx.get(), digest.data(), &len);
  return digest;
}

Sha256Digest Sha256(absl::string_view bytes) {
  Sha256Hasher hasher;
  hasher.Update(bytes);
  return hasher.Finish();
}

std::string DigestToHex(const Sha256Digest& digest) {
  return absl::BytesToHexString(absl::string_view(
      reinterpret_cast<const char*>(digest.data()), digest.size()));
}

bool HexToDigest(absl::string_view hex, Sha256Digest* digest) {
  if (hex.size() != 64) return false;
  for (char c : hex) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  std::string bytes = absl::HexStringToBytes(hex);
  std::copy(bytes.begin(), bytes.end(), digest->begin());
  return true;
}

}  // namespace kiln
