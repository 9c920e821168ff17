#include "server/tls_files.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace kiln {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using UniqueBio = std::unique_ptr<BIO, BioFree>;
using UniqueX509 = std::unique_ptr<X509, X509Free>;
using UniquePkey = std::unique_ptr<EVP_PKEY, PkeyFree>;

absl::StatusOr<std::string> ReadFile(const std::string& path,
                                     absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return absl::NotFoundError(
        absl::StrCat("cannot read ", what, " '", path, "'"));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

UniqueBio MemoryBio(const std::string& bytes) {
  return UniqueBio(
      BIO_new_mem_buf(bytes.data(), static_cast<int>(bytes.size())));
}

absl::Time Asn1ToTime(const ASN1_TIME* t) {
  struct tm tm = {};
  if (ASN1_TIME_to_tm(t, &tm) != 1) return absl::InfinitePast();
  return absl::FromTM(tm, absl::UTCTimeZone());
}

}  // namespace

absl::StatusOr<TlsFilesInfo> CheckTlsFiles(const TlsFiles& files) {
  absl::StatusOr<std::string> cert_pem =
      ReadFile(files.cert_chain, "the TLS certificate (--tls_cert)");
  if (!cert_pem.ok()) return cert_pem.status();
  absl::StatusOr<std::string> key_pem =
      ReadFile(files.private_key, "the TLS key (--tls_key)");
  if (!key_pem.ok()) return key_pem.status();
  UniqueBio cert_bio = MemoryBio(*cert_pem);
  UniqueX509 cert(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
  if (!cert) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_cert '", files.cert_chain, "' holds no PEM certificate"));
  }
  UniqueBio key_bio = MemoryBio(*key_pem);
  UniquePkey key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  if (!key) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_key '", files.private_key,
                     "' holds no PEM private key (or one with a passphrase)"));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_key '", files.private_key, "' is not the key of --tls_cert '",
        files.cert_chain, "'"));
  }
  TlsFilesInfo info;
  info.not_after = Asn1ToTime(X509_get0_notAfter(cert.get()));
  if (info.not_after < absl::Now()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_cert '", files.cert_chain, "' expired at ",
                     absl::FormatTime(info.not_after, absl::UTCTimeZone())));
  }
  char subject[256] = {};
  X509_NAME_oneline(X509_get_subject_name(cert.get()), subject,
                    sizeof(subject));
  info.subject = subject;
  if (!files.client_ca.empty()) {
    absl::StatusOr<std::string> ca_pem =
        ReadFile(files.client_ca, "the client CA (--tls_client_ca)");
    if (!ca_pem.ok()) return ca_pem.status();
    UniqueBio ca_bio = MemoryBio(*ca_pem);
    while (UniqueX509 ca{
        PEM_read_bio_X509(ca_bio.get(), nullptr, nullptr, nullptr)}) {
      ++info.client_cas;
    }
    if (info.client_cas == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tls_client_ca '", files.client_ca, "' holds no PEM certificate"));
    }
  }
  return info;
}

}  // namespace kiln
