// kilnd's TLS files: checked, then installed where gRPC reads them.
//
// gRPC's FileWatcherCertificateProvider (what kilnd serves TLS with) reads
// its files itself, at start and again every refresh interval, and takes
// new contents for new handshakes; gRPC 1.51 has no public call to make it
// reload now, and it would read whatever an operator is halfway through
// writing. So kilnd never points it at the operator's files:
// TlsFileInstaller reads them, checks them with OpenSSL (CheckTlsPem:
// unreadable, not PEM, a key that does not match the certificate, a
// certificate that expired) and only then copies them into a directory of
// its own, which gRPC watches every second. The operator's files reach
// gRPC exactly when kilnd installs them (at start, on SIGHUP, and with
// --tls_refresh_seconds also when they change), and a bad file never does.
//
// Thread-safety: the free functions are reentrant; TlsFileInstaller is
// not thread-safe (kilnd calls it from its signal thread only).
#ifndef KILN_SERVER_TLS_FILES_H_
#define KILN_SERVER_TLS_FILES_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kiln {

// Paths of the TLS files (--tls_cert, --tls_key, --tls_client_ca).
struct TlsFiles {
  std::string cert_chain;   // PEM, the server's certificate first
  std::string private_key;  // PEM
  std::string client_ca;    // PEM bundle; empty: no client certificates
};

// The contents of a TlsFiles.
struct TlsPem {
  std::string cert_chain;
  std::string private_key;
  std::string client_ca;  // empty when TlsFiles::client_ca is

  bool operator==(const TlsPem& o) const {
    return cert_chain == o.cert_chain && private_key == o.private_key &&
           client_ca == o.client_ca;
  }
};

struct TlsFilesInfo {
  std::string subject;   // the server certificate's subject, one line
  absl::Time not_after;  // when it expires
  int client_cas = 0;    // certificates in client_ca
};

// Reads the files. Errors: NOT_FOUND naming a file that cannot be read.
absl::StatusOr<TlsPem> ReadTlsFiles(const TlsFiles& files);

// Checks contents read from `files` (whose paths the errors name).
// Errors: INVALID_ARGUMENT for a file that holds no usable PEM, a key that
// does not belong to the certificate, or a certificate past its notAfter.
absl::StatusOr<TlsFilesInfo> CheckTlsPem(const TlsPem& pem,
                                         const TlsFiles& files);

// ReadTlsFiles, then CheckTlsPem; their errors.
absl::StatusOr<TlsFilesInfo> CheckTlsFiles(const TlsFiles& files);

// Installs checked copies of an operator's TLS files in a directory kilnd
// owns, for gRPC's FileWatcherCertificateProvider to watch (see the file
// comment). Layout: DIR/gen-N/{cert.pem,key.pem,client_ca.pem} (mode
// 0600, DIR and gen-N 0700) and the symlink DIR/current -> gen-N; gRPC
// reads DIR/current/*. Installing a new generation writes gen-N+1 whole,
// then renames a new symlink over DIR/current, so the certificate, its key
// and the client CA change together in one rename. The generation before
// stays until the next install (gRPC may be reading it); older ones are
// removed. Each generation's files get a modification time one second past
// the previous generation's, so that gRPC's own check (it re-reads a pair
// whose files' times changed while it read them) also catches a rename
// between its reads of the key and of the certificate.
class TlsFileInstaller {
 public:
  // Reads and checks `source` and installs it as generation 1 in `dir`
  // (created 0700; a previous run's generations in it are removed). On
  // success `*info` (if non-null) describes the installed files. Errors:
  // ReadTlsFiles', CheckTlsPem's; FAILED_PRECONDITION when `dir` exists
  // and holds anything but an earlier installer's files (never removed);
  // INTERNAL when `dir` cannot be made or written (naming the path and
  // errno's text).
  static absl::StatusOr<std::unique_ptr<TlsFileInstaller>> Create(
      const TlsFiles& source, const std::string& dir,
      TlsFilesInfo* info = nullptr);
  // Removes the directory and the copies in it.
  ~TlsFileInstaller();
  TlsFileInstaller(const TlsFileInstaller&) = delete;
  TlsFileInstaller& operator=(const TlsFileInstaller&) = delete;

  // What gRPC watches: DIR/current/cert.pem, key.pem and (with a client CA)
  // client_ca.pem.
  const TlsFiles& installed() const { return installed_; }
  const TlsFiles& source() const { return source_; }
  int generation() const { return generation_; }

  struct Reloaded {
    TlsFilesInfo info;     // of the source files (valid)
    bool changed = false;  // false: same bytes as installed, nothing done
  };
  // Reads and checks the source files again; if they are valid and differ
  // from the installed ones, installs them as the next generation. On any
  // error the installed files stay as they were. Errors: as Create's.
  absl::StatusOr<Reloaded> Reload();

 private:
  TlsFileInstaller(const TlsFiles& source, const std::string& dir);
  // Writes `pem` as the next generation and points DIR/current at it.
  absl::Status Install(const TlsPem& pem);

  const TlsFiles source_;
  const std::string dir_;
  TlsFiles installed_;
  TlsPem current_;
  int generation_ = 0;
  int64_t last_mtime_ = 0;  // unix seconds given to the newest generation
};

}  // namespace kiln

#endif  // KILN_SERVER_TLS_FILES_H_
