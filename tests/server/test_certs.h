// Certificates for the TLS tests, made with OpenSSL's C API into a temp
// dir: a CA, and leaf certificates it signs (server: SAN 127.0.0.1 and
// localhost; client), valid or already expired. EC P-256 keys (fast).
#ifndef KILN_TESTS_SERVER_TEST_CERTS_H_
#define KILN_TESTS_SERVER_TEST_CERTS_H_

#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <memory>
#include <string>

namespace kiln::testing {

struct PkeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};

// A key and its certificate.
struct TestCert {
  std::unique_ptr<EVP_PKEY, PkeyDeleter> key;
  std::unique_ptr<X509, X509Deleter> cert;

  // Writes `<prefix>.crt` and `<prefix>.key` (PEM).
  void Write(const std::string& prefix) const {
    FILE* f = std::fopen((prefix + ".crt").c_str(), "w");
    PEM_write_X509(f, cert.get());
    std::fclose(f);
    f = std::fopen((prefix + ".key").c_str(), "w");
    PEM_write_PrivateKey(f, key.get(), nullptr, nullptr, 0, nullptr, nullptr);
    std::fclose(f);
  }
};

inline void AddExtension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
}

// A certificate for `common_name`, signed by `issuer` (null: self-signed,
// a CA), valid from now + not_before_s to now + not_after_s seconds.
inline TestCert MakeCert(const std::string& common_name, const TestCert* issuer,
                         bool server, long not_before_s = -60,
                         long not_after_s = 24 * 3600) {
  static long serial = 1;
  TestCert out;
  out.key.reset(EVP_EC_gen("P-256"));
  out.cert.reset(X509_new());
  X509* x = out.cert.get();
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), serial++);
  X509_gmtime_adj(X509_getm_notBefore(x), not_before_s);
  X509_gmtime_adj(X509_getm_notAfter(x), not_after_s);
  X509_set_pubkey(x, out.key.get());
  X509_NAME* name = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(
      name, "CN", MBSTRING_ASC,
      reinterpret_cast<const unsigned char*>(common_name.c_str()), -1, -1, 0);
  X509* issuer_cert = issuer ? issuer->cert.get() : x;
  X509_set_issuer_name(x, X509_get_subject_name(issuer_cert));
  if (issuer == nullptr) {
    AddExtension(x, issuer_cert, NID_basic_constraints, "critical,CA:TRUE");
    AddExtension(x, issuer_cert, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    AddExtension(x, issuer_cert, NID_basic_constraints, "CA:FALSE");
    AddExtension(x, issuer_cert, NID_ext_key_usage,
                 server ? "serverAuth" : "clientAuth");
    if (server)
      AddExtension(x, issuer_cert, NID_subject_alt_name,
                   "IP:127.0.0.1,DNS:localhost");
  }
  X509_sign(x, issuer ? issuer->key.get() : out.key.get(), EVP_sha256());
  return out;
}

}  // namespace kiln::testing

#endif  // KILN_TESTS_SERVER_TEST_CERTS_H_
