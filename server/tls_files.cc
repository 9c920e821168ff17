#include "server/tls_files.h"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
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

absl::StatusOr<TlsPem> ReadTlsFiles(const TlsFiles& files) {
  TlsPem pem;
  absl::StatusOr<std::string> text =
      ReadFile(files.cert_chain, "the TLS certificate (--tls_cert)");
  if (!text.ok()) return text.status();
  pem.cert_chain = *std::move(text);
  text = ReadFile(files.private_key, "the TLS key (--tls_key)");
  if (!text.ok()) return text.status();
  pem.private_key = *std::move(text);
  if (!files.client_ca.empty()) {
    text = ReadFile(files.client_ca, "the client CA (--tls_client_ca)");
    if (!text.ok()) return text.status();
    pem.client_ca = *std::move(text);
  }
  return pem;
}

absl::StatusOr<TlsFilesInfo> CheckTlsFiles(const TlsFiles& files) {
  absl::StatusOr<TlsPem> pem = ReadTlsFiles(files);
  if (!pem.ok()) return pem.status();
  return CheckTlsPem(*pem, files);
}

absl::StatusOr<TlsFilesInfo> CheckTlsPem(const TlsPem& pem,
                                         const TlsFiles& files) {
  UniqueBio cert_bio = MemoryBio(pem.cert_chain);
  UniqueX509 cert(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
  if (!cert) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_cert '", files.cert_chain, "' holds no PEM certificate"));
  }
  UniqueBio key_bio = MemoryBio(pem.private_key);
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
    UniqueBio ca_bio = MemoryBio(pem.client_ca);
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

namespace {

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::InternalError(
      absl::StrCat("cannot ", what, " '", path, "': ", std::strerror(errno)));
}

// Writes `bytes` to a new file `path` (mode 0600) with modification time
// `mtime` (unix seconds).
absl::Status WritePrivateFile(const std::string& path, absl::string_view bytes,
                              int64_t mtime) {
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("create", path);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      absl::Status error = Errno("write", path);
      ::close(fd);
      return error;
    }
    done += static_cast<size_t>(n);
  }
  const timespec times[2] = {{mtime, 0}, {mtime, 0}};
  if (::futimens(fd, times) != 0) {
    absl::Status error = Errno("set the time of", path);
    ::close(fd);
    return error;
  }
  if (::close(fd) != 0) return Errno("close", path);
  return absl::OkStatus();
}

}  // namespace

TlsFileInstaller::TlsFileInstaller(const TlsFiles& source,
                                   const std::string& dir)
    : source_(source), dir_(dir) {
  installed_.cert_chain = dir_ + "/current/cert.pem";
  installed_.private_key = dir_ + "/current/key.pem";
  if (!source_.client_ca.empty())
    installed_.client_ca = dir_ + "/current/client_ca.pem";
}

TlsFileInstaller::~TlsFileInstaller() {
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

absl::StatusOr<std::unique_ptr<TlsFileInstaller>> TlsFileInstaller::Create(
    const TlsFiles& source, const std::string& dir, TlsFilesInfo* info) {
  absl::StatusOr<TlsPem> pem = ReadTlsFiles(source);
  if (!pem.ok()) return pem.status();
  absl::StatusOr<TlsFilesInfo> checked = CheckTlsPem(*pem, source);
  if (!checked.ok()) return checked.status();
  // A previous run's copies (a kilnd that was killed) go first, but only
  // if the directory holds nothing else: --tls_dir pointed at the
  // operator's own certificate directory must not be wiped.
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    int n = 0;
    const bool ours = name == "current" || name == "current.tmp" ||
                      (absl::StartsWith(name, "gen-") &&
                       absl::SimpleAtoi(absl::string_view(name).substr(4), &n));
    if (!ours) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the TLS copies' directory '", dir, "' holds '", name,
          "', which kilnd did not make; give --tls_dir a new or empty "
          "directory of its own (kilnd empties it at start and removes it "
          "at exit)"));
    }
  }
  error.clear();
  std::filesystem::remove_all(dir, error);
  if (error) {
    return absl::InternalError(absl::StrCat(
        "cannot remove the old TLS copies in '", dir, "': ", error.message()));
  }
  std::filesystem::create_directories(std::filesystem::path(dir).parent_path(),
                                      error);
  if (::mkdir(dir.c_str(), 0700) != 0) return Errno("create", dir);
  std::unique_ptr<TlsFileInstaller> installer(
      new TlsFileInstaller(source, dir));
  if (absl::Status s = installer->Install(*pem); !s.ok()) return s;
  if (info != nullptr) *info = *std::move(checked);
  return installer;
}

absl::StatusOr<TlsFileInstaller::Reloaded> TlsFileInstaller::Reload() {
  absl::StatusOr<TlsPem> pem = ReadTlsFiles(source_);
  if (!pem.ok()) return pem.status();
  absl::StatusOr<TlsFilesInfo> checked = CheckTlsPem(*pem, source_);
  if (!checked.ok()) return checked.status();
  Reloaded out;
  out.info = *std::move(checked);
  if (*pem == current_) return out;
  if (absl::Status s = Install(*pem); !s.ok()) return s;
  out.changed = true;
  return out;
}

absl::Status TlsFileInstaller::Install(const TlsPem& pem) {
  const int next = generation_ + 1;
  const std::string gen_name = absl::StrCat("gen-", next);
  const std::string gen = absl::StrCat(dir_, "/", gen_name);
  std::error_code ignored;
  std::filesystem::remove_all(gen, ignored);  // a failed earlier attempt
  if (::mkdir(gen.c_str(), 0700) != 0) return Errno("create", gen);
  const int64_t mtime =
      std::max<int64_t>(absl::ToUnixSeconds(absl::Now()), last_mtime_ + 1);
  absl::Status s = WritePrivateFile(gen + "/key.pem", pem.private_key, mtime);
  if (s.ok()) s = WritePrivateFile(gen + "/cert.pem", pem.cert_chain, mtime);
  if (s.ok() && !source_.client_ca.empty())
    s = WritePrivateFile(gen + "/client_ca.pem", pem.client_ca, mtime);
  if (s.ok()) {
    const std::string link = dir_ + "/current.tmp";
    ::unlink(link.c_str());
    if (::symlink(gen_name.c_str(), link.c_str()) != 0) {
      s = Errno("create the symlink", link);
    } else if (::rename(link.c_str(), (dir_ + "/current").c_str()) != 0) {
      s = Errno("rename into place", link);
    }
  }
  if (!s.ok()) {
    std::filesystem::remove_all(gen, ignored);
    return s;
  }
  // Keep the generation gRPC may still be reading; drop older ones.
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ignored)) {
    const std::string name = entry.path().filename().string();
    int n = 0;
    if (absl::StartsWith(name, "gen-") &&
        absl::SimpleAtoi(absl::string_view(name).substr(4), &n) && n < next - 1)
      std::filesystem::remove_all(entry.path(), ignored);
  }
  generation_ = next;
  last_mtime_ = mtime;
  current_ = pem;
  return absl::OkStatus();
}

}  // namespace kiln
