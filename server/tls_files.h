// kilnd's TLS files, checked before gRPC gets them.
//
// gRPC's FileWatcherCertificateProvider (what kilnd serves TLS with) reads
// the files itself, at start and again every refresh interval, and takes
// new contents for new handshakes; on files it cannot use it keeps what it
// had and logs in gRPC's own log. CheckTlsFiles reads the same files with
// OpenSSL so that kilnd can refuse to start, and say on SIGHUP, what is
// wrong with them in its own words: unreadable, not PEM, a key that does
// not match the certificate, a certificate that expired.
//
// Thread-safety: reentrant.
#ifndef KILN_SERVER_TLS_FILES_H_
#define KILN_SERVER_TLS_FILES_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kiln {

struct TlsFiles {
  std::string cert_chain;   // PEM, the server's certificate first
  std::string private_key;  // PEM
  std::string client_ca;    // PEM bundle; empty: no client certificates
};

struct TlsFilesInfo {
  std::string subject;   // the server certificate's subject, one line
  absl::Time not_after;  // when it expires
  int client_cas = 0;    // certificates in client_ca
};

// Errors: NOT_FOUND for a file that cannot be read, INVALID_ARGUMENT for
// one that holds no usable PEM, a key that does not belong to the
// certificate, or a certificate past its notAfter (each names the file).
absl::StatusOr<TlsFilesInfo> CheckTlsFiles(const TlsFiles& files);

}  // namespace kiln

#endif  // KILN_SERVER_TLS_FILES_H_
