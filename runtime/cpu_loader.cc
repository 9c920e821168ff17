#include "runtime/cpu_loader.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/dl_error.h"

namespace kiln {
namespace {

// An owned file descriptor.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(ScopedFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  ScopedFd& operator=(ScopedFd&& other) noexcept {
    if (this != &other) {
      if (fd_ >= 0) close(fd_);
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }
  int Release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

std::string FdPath(int fd) { return absl::StrCat("/proc/self/fd/", fd); }

}  // namespace

absl::StatusOr<LoadedLibrary> LoadedLibrary::Load(
    absl::string_view so_bytes, const Sha256Digest& expected_sha256) {
  return Load(absl::MakeConstSpan(&so_bytes, 1), expected_sha256);
}

absl::StatusOr<LoadedLibrary> LoadedLibrary::Load(
    absl::Span<const absl::string_view> so_pieces,
    const Sha256Digest& expected_sha256) {
  Sha256Hasher hasher;
  size_t so_size = 0;
  for (absl::string_view piece : so_pieces) {
    hasher.Update(piece);
    so_size += piece.size();
  }
  const Sha256Digest actual = hasher.Finish();
  if (actual != expected_sha256) {
    return absl::DataLossError(absl::StrCat(
        "shared object SHA-256 mismatch: expected ",
        DigestToHex(expected_sha256), ", got ", DigestToHex(actual), " (",
        so_size, " bytes); not loaded"));
  }

  ScopedFd fd(
      memfd_create("kiln-cpu-kernels", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (fd.get() < 0) return absl::ErrnoToStatus(errno, "memfd_create");
  for (absl::string_view piece : so_pieces) {
    for (absl::string_view rest = piece; !rest.empty();) {
      const ssize_t n = write(fd.get(), rest.data(), rest.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return absl::ErrnoToStatus(errno, "write to memfd");
      }
      rest.remove_prefix(static_cast<size_t>(n));
    }
  }
  // The verified bytes are the bytes mapped: nobody (e.g. through
  // /proc/PID/fd) can change them any more.
  if (fcntl(fd.get(), F_ADD_SEALS,
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
    return absl::ErrnoToStatus(errno, "sealing the memfd");
  }

  // glibc's dlopen first matches the name against the libraries already
  // loaded and only then looks at the file. If /proc/self/fd/N still names a
  // loaded library (our fd number reused after a library that dlclose could
  // not unload), dlopen would return that other library. Move to another fd
  // number (keeping the taken ones open meanwhile) until the name is free.
  std::vector<ScopedFd> taken;
  for (int attempt = 0;; ++attempt) {
    void* stale = dlopen(FdPath(fd.get()).c_str(), RTLD_LAZY | RTLD_NOLOAD);
    if (stale == nullptr) break;
    dlclose(stale);
    if (attempt == 64) {
      return absl::InternalError(
          "no /proc/self/fd/N name free of an already-loaded library");
    }
    ScopedFd next(fcntl(fd.get(), F_DUPFD_CLOEXEC, 0));
    if (next.get() < 0) return absl::ErrnoToStatus(errno, "dup of memfd");
    taken.push_back(std::move(fd));
    fd = std::move(next);
  }

  void* handle = dlopen(FdPath(fd.get()).c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("dlopen of shared object ", DigestToHex(actual), " (",
                     so_size, " bytes) failed: ", DlError()));
  }
  return LoadedLibrary(fd.Release(), handle);
}

LoadedLibrary::LoadedLibrary(LoadedLibrary&& other) noexcept
    : memfd_(std::exchange(other.memfd_, -1)),
      handle_(std::exchange(other.handle_, nullptr)) {}

LoadedLibrary& LoadedLibrary::operator=(LoadedLibrary&& other) noexcept {
  if (this != &other) {
    Reset();
    memfd_ = std::exchange(other.memfd_, -1);
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

LoadedLibrary::~LoadedLibrary() { Reset(); }

void LoadedLibrary::Reset() {
  // dlclose first: the fd keeps the name /proc/self/fd/N unique while the
  // library is loaded.
  if (handle_ != nullptr) dlclose(handle_);
  if (memfd_ >= 0) close(memfd_);
  handle_ = nullptr;
  memfd_ = -1;
}

absl::StatusOr<void*> LoadedLibrary::Symbol(absl::string_view name) const {
  if (handle_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("Symbol(\"", name, "\") on an empty LoadedLibrary"));
  }
  const std::string name_z(name);
  dlerror();  // clear
  void* address = dlsym(handle_, name_z.c_str());
  if (address == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "symbol \"", name, "\" not found in the shared object: ", DlError()));
  }
  return address;
}

}  // namespace kiln
