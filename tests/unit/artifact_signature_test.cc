// Signed artifacts (support/artifact_signature.h): kilnd's key in a PEM file
// (created owner-only, read back, refused when readable by others or not an
// Ed25519 key), signatures that verify only with the signer's key, only over
// the same digest, and trusted-key lists (parsing, rotation).
#include "support/artifact_signature.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

class TempDir {
 public:
  TempDir() {
    std::string pattern = "/tmp/kiln_signature_test.XXXXXX";
    path_ = mkdtemp(pattern.data()) ? pattern : "";
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

TEST(ArtifactSignatureTest, SignedDigestVerifiesOnlyWithTheSignersKey) {
  auto signer = ArtifactSigner::Generate();
  auto other = ArtifactSigner::Generate();
  ASSERT_NE(signer, nullptr);
  ASSERT_NE(other, nullptr);
  ASSERT_EQ(signer->public_key().size(), kEd25519PublicKeyBytes);
  EXPECT_NE(signer->public_key(), other->public_key());
  const Sha256Digest digest = Sha256("an artifact's bytes");
  const std::string signature = signer->Sign(digest);
  ASSERT_EQ(signature.size(), kEd25519SignatureBytes);

  TrustedKeys trusted;
  ASSERT_TRUE(trusted.Add(signer->public_key()).ok());
  EXPECT_TRUE(trusted.Verify(digest, signature).ok());

  // Re-signed by another key.
  absl::Status forged = trusted.Verify(digest, other->Sign(digest));
  EXPECT_EQ(forged.code(), absl::StatusCode::kPermissionDenied) << forged;
  EXPECT_TRUE(absl::StrContains(forged.message(), "does not verify"));
  // Another artifact under this signature (a flipped byte in the bytes
  // changes their digest).
  const Sha256Digest changed = Sha256("an artifact's bytez");
  EXPECT_EQ(trusted.Verify(changed, signature).code(),
            absl::StatusCode::kPermissionDenied);
  // A flipped bit in the signature; a truncated one.
  std::string flipped = signature;
  flipped[17] ^= 0x04;
  EXPECT_EQ(trusted.Verify(digest, flipped).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(trusted.Verify(digest, signature.substr(0, 63)).code(),
            absl::StatusCode::kPermissionDenied);
  // Unsigned.
  absl::Status unsigned_status = trusted.Verify(digest, "");
  EXPECT_EQ(unsigned_status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(unsigned_status.message(), "unsigned"))
      << unsigned_status;
}

// Rotation: a client trusting the old and the new key takes artifacts
// signed by either; once the old key is dropped, only the new one.
TEST(ArtifactSignatureTest, RotationWithTwoTrustedKeys) {
  auto old_key = ArtifactSigner::Generate();
  auto new_key = ArtifactSigner::Generate();
  const Sha256Digest digest = Sha256("kernel");
  absl::StatusOr<TrustedKeys> both = TrustedKeys::Parse(absl::StrCat(
      old_key->public_key_hex(), ", ", new_key->public_key_hex(), "\n"));
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->size(), 2u);
  EXPECT_TRUE(both->Verify(digest, old_key->Sign(digest)).ok());
  EXPECT_TRUE(both->Verify(digest, new_key->Sign(digest)).ok());
  absl::StatusOr<TrustedKeys> only_new =
      TrustedKeys::Parse(new_key->public_key_hex());
  ASSERT_TRUE(only_new.ok());
  EXPECT_TRUE(only_new->Verify(digest, new_key->Sign(digest)).ok());
  EXPECT_EQ(only_new->Verify(digest, old_key->Sign(digest)).code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(ArtifactSignatureTest, TrustedKeysParseErrorsNameTheEntry) {
  EXPECT_TRUE(TrustedKeys::Parse("").ok());
  EXPECT_TRUE(TrustedKeys::Parse(" , \n")->empty());
  for (const std::string bad :
       {std::string("abc"), std::string(63, 'a'), std::string(65, 'a'),
        std::string(63, 'a') + "g"}) {
    absl::StatusOr<TrustedKeys> parsed = TrustedKeys::Parse(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(parsed.status().message(), bad));
  }
  TrustedKeys keys;
  EXPECT_EQ(keys.Add("short").code(), absl::StatusCode::kInvalidArgument);
}

TEST(ArtifactSignatureTest, KeyFileIsCreatedOwnerOnlyAndReadBack) {
  TempDir dir;
  const std::string path = dir.Sub("key.pem");
  EXPECT_EQ(ArtifactSigner::LoadOrCreate(path, false).status().code(),
            absl::StatusCode::kNotFound);
  auto created = ArtifactSigner::LoadOrCreate(path, true);
  ASSERT_TRUE(created.ok()) << created.status();
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto again = ArtifactSigner::LoadOrCreate(path, true);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->public_key(), (*created)->public_key());
  const Sha256Digest digest = Sha256("x");
  TrustedKeys trusted;
  ASSERT_TRUE(trusted.Add((*created)->public_key()).ok());
  EXPECT_TRUE(trusted.Verify(digest, (*again)->Sign(digest)).ok());

  // Readable by others: refused, with the fix in the message.
  ASSERT_EQ(chmod(path.c_str(), 0644), 0);
  absl::Status wide = ArtifactSigner::LoadOrCreate(path, true).status();
  EXPECT_EQ(wide.code(), absl::StatusCode::kPermissionDenied) << wide;
  EXPECT_TRUE(absl::StrContains(wide.message(), "chmod 600"));

  // Not a key.
  const std::string junk = dir.Sub("junk.pem");
  std::ofstream(junk) << "-----BEGIN PRIVATE KEY-----\nnope\n";
  absl::Status bad = ArtifactSigner::LoadOrCreate(junk, true).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_TRUE(absl::StrContains(bad.message(), junk));
}

}  // namespace
}  // namespace kiln
