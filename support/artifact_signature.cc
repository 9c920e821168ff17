#include "support/artifact_signature.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kiln {
namespace {

struct PkeyDeleter {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
struct MdCtxDeleter {
  void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
};
struct PkeyCtxDeleter {
  void operator()(EVP_PKEY_CTX* ctx) const { EVP_PKEY_CTX_free(ctx); }
};
struct BioDeleter {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyDeleter>;

// The message signed for an artifact: the domain tag and the digest.
std::string SignedMessage(const Sha256Digest& digest) {
  std::string message(kArtifactSignatureDomain);
  message.push_back('\0');
  message.append(reinterpret_cast<const char*>(digest.data()), digest.size());
  return message;
}

PkeyPtr GenerateKey() {
  std::unique_ptr<EVP_PKEY_CTX, PkeyCtxDeleter> ctx(
      EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, nullptr));
  EVP_PKEY* key = nullptr;
  if (ctx == nullptr || EVP_PKEY_keygen_init(ctx.get()) != 1 ||
      EVP_PKEY_keygen(ctx.get(), &key) != 1) {
    return nullptr;
  }
  return PkeyPtr(key);
}

absl::Status ErrnoStatus(absl::string_view what, const std::string& path) {
  const int error = errno;
  const std::string message =
      absl::StrCat(what, " ", path, ": ", std::strerror(error));
  if (error == ENOENT) return absl::NotFoundError(message);
  if (error == EACCES || error == EPERM)
    return absl::PermissionDeniedError(message);
  return absl::UnavailableError(message);
}

// Writes `key` as PEM to a new file `path` (0600, O_EXCL: never replaces a
// key another kilnd just wrote).
absl::Status WriteNewKey(EVP_PKEY* key, const std::string& path) {
  const int fd =
      open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus("cannot create the signing key", path);
  FILE* file = fdopen(fd, "w");
  if (file == nullptr) {
    close(fd);
    return ErrnoStatus("cannot open the signing key", path);
  }
  const bool written = PEM_write_PrivateKey(file, key, nullptr, nullptr, 0,
                                            nullptr, nullptr) == 1;
  const bool synced = fflush(file) == 0 && fsync(fileno(file)) == 0;
  const bool closed = fclose(file) == 0;
  if (!written || !synced || !closed) {
    unlink(path.c_str());
    return absl::UnavailableError(
        absl::StrCat("cannot write the signing key ", path));
  }
  return absl::OkStatus();
}

}  // namespace

struct ArtifactSigner::Key {
  PkeyPtr pkey;
};

ArtifactSigner::ArtifactSigner(std::unique_ptr<Key> key)
    : key_(std::move(key)) {
  unsigned char raw[kEd25519PublicKeyBytes];
  size_t length = sizeof(raw);
  if (EVP_PKEY_get_raw_public_key(key_->pkey.get(), raw, &length) == 1) {
    public_key_.assign(reinterpret_cast<const char*>(raw), length);
  }
}

ArtifactSigner::~ArtifactSigner() = default;

std::unique_ptr<ArtifactSigner> ArtifactSigner::Generate() {
  auto key = std::make_unique<Key>();
  key->pkey = GenerateKey();
  if (key->pkey == nullptr) return nullptr;
  return std::unique_ptr<ArtifactSigner>(new ArtifactSigner(std::move(key)));
}

absl::StatusOr<std::unique_ptr<ArtifactSigner>> ArtifactSigner::LoadOrCreate(
    const std::string& path, bool create) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    if (errno != ENOENT || !create)
      return ErrnoStatus("cannot read the signing key", path);
    PkeyPtr fresh = GenerateKey();
    if (fresh == nullptr)
      return absl::InternalError("cannot generate an Ed25519 key");
    absl::Status written = WriteNewKey(fresh.get(), path);
    // Unless another process created it meanwhile (then read theirs).
    if (!written.ok() && stat(path.c_str(), &st) != 0) return written;
  }
  std::unique_ptr<BIO, BioDeleter> bio(BIO_new_file(path.c_str(), "r"));
  if (bio == nullptr) return ErrnoStatus("cannot read the signing key", path);
  PkeyPtr pkey(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (pkey == nullptr || EVP_PKEY_id(pkey.get()) != EVP_PKEY_ED25519) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the signing key ", path,
        " is not an Ed25519 private key in PEM (make one with `openssl "
        "genpkey -algorithm ed25519 -out ",
        path, "`)"));
  }
  if (stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("the signing key ", path, " is readable by others (mode ",
                     absl::StrCat(absl::Hex(st.st_mode & 0777)),
                     "); make it owner-only: chmod 600 ", path));
  }
  auto key = std::make_unique<Key>();
  key->pkey = std::move(pkey);
  return std::unique_ptr<ArtifactSigner>(new ArtifactSigner(std::move(key)));
}

std::string ArtifactSigner::public_key_hex() const {
  return KeyToHex(public_key_);
}

std::string ArtifactSigner::Sign(const Sha256Digest& artifact_digest) const {
  const std::string message = SignedMessage(artifact_digest);
  std::unique_ptr<EVP_MD_CTX, MdCtxDeleter> ctx(EVP_MD_CTX_new());
  unsigned char signature[kEd25519SignatureBytes];
  size_t length = sizeof(signature);
  if (ctx == nullptr ||
      EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr,
                         key_->pkey.get()) != 1 ||
      EVP_DigestSign(ctx.get(), signature, &length,
                     reinterpret_cast<const unsigned char*>(message.data()),
                     message.size()) != 1) {
    return "";  // verifies as unsigned: clients that check refuse it
  }
  return std::string(reinterpret_cast<const char*>(signature), length);
}

absl::StatusOr<TrustedKeys> TrustedKeys::Parse(absl::string_view text) {
  TrustedKeys keys;
  for (absl::string_view entry :
       absl::StrSplit(text, absl::ByAnyChar(", \t\r\n"), absl::SkipEmpty())) {
    std::string raw;
    if (entry.size() != 2 * kEd25519PublicKeyBytes ||
        !absl::c_all_of(entry, absl::ascii_isxdigit)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "trusted key \"", entry,
          "\" is not an Ed25519 public key as 64 hex digits (what `kilnctl "
          "public-key` prints)"));
    }
    raw = absl::HexStringToBytes(entry);
    if (absl::Status s = keys.Add(raw); !s.ok()) return s;
  }
  return keys;
}

absl::Status TrustedKeys::Add(absl::string_view raw_public_key) {
  if (raw_public_key.size() != kEd25519PublicKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a trusted key must be ", kEd25519PublicKeyBytes,
                     " bytes, got ", raw_public_key.size()));
  }
  keys_.emplace_back(raw_public_key);
  return absl::OkStatus();
}

absl::Status TrustedKeys::Verify(const Sha256Digest& artifact_digest,
                                 absl::string_view signature) const {
  if (signature.empty()) {
    return absl::PermissionDeniedError(
        "the artifact is unsigned and this client trusts only signed ones "
        "(KILN_TRUSTED_KEYS): not loaded");
  }
  if (signature.size() == kEd25519SignatureBytes) {
    const std::string message = SignedMessage(artifact_digest);
    for (const std::string& raw : keys_) {
      PkeyPtr key(EVP_PKEY_new_raw_public_key(
          EVP_PKEY_ED25519, nullptr,
          reinterpret_cast<const unsigned char*>(raw.data()), raw.size()));
      std::unique_ptr<EVP_MD_CTX, MdCtxDeleter> ctx(EVP_MD_CTX_new());
      if (key == nullptr || ctx == nullptr ||
          EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr,
                               key.get()) != 1) {
        continue;
      }
      if (EVP_DigestVerify(
              ctx.get(),
              reinterpret_cast<const unsigned char*>(signature.data()),
              signature.size(),
              reinterpret_cast<const unsigned char*>(message.data()),
              message.size()) == 1) {
        return absl::OkStatus();
      }
    }
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "the artifact's signature does not verify with any of the ", keys_.size(),
      " trusted key(s) (signed by another key, or changed since it was "
      "signed): not loaded"));
}

std::string KeyToHex(absl::string_view raw) {
  return absl::BytesToHexString(raw);
}

}  // namespace kiln
