// Loads a CPU artifact's shared object (the bytes kilnd linked) from memory
// and looks up its kernels. No LLVM here: clients run without it.
//
//   absl::StatusOr<LoadedLibrary> lib = LoadedLibrary::Load(bytes, sha256);
//   absl::StatusOr<void*> fn = lib->Symbol("kernel_0");
//
// Thread-safety: Load may be called from several threads at once (memfd,
// dlopen and dlsym are thread-safe). Symbol is const and may be called
// concurrently on one LoadedLibrary; moving or destroying it must not race
// with other calls on the same object.
#ifndef KILN_RUNTIME_CPU_LOADER_H_
#define KILN_RUNTIME_CPU_LOADER_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "support/sha256.h"

namespace kiln {

// A shared object loaded with dlopen from a sealed memfd; owns the dlopen
// handle and the memfd and releases both (dlclose, then close) when
// destroyed. Pointers from Symbol() are valid only while it lives. Movable,
// not copyable; a moved-from LoadedLibrary holds nothing.
class LoadedLibrary {
 public:
  // Checks that SHA-256(so_bytes) == expected_sha256 before the bytes are
  // used in any other way, then copies them into an anonymous memfd
  // (memfd_create, MFD_CLOEXEC), seals it against writes and size changes,
  // and loads it with dlopen("/proc/self/fd/N", RTLD_NOW | RTLD_LOCAL): all
  // symbols are bound now, and none becomes visible to other libraries. No
  // file is created. The library's constructors (none in Kiln's kernels) run
  // during the call.
  //
  // Errors: DATA_LOSS naming the expected and actual hashes on a mismatch
  // (nothing is loaded); FAILED_PRECONDITION with dlerror()'s text when the
  // dynamic loader rejects the bytes (not ELF, another architecture, an
  // unresolvable symbol or missing DT_NEEDED library); the errno text when
  // memfd_create, write or fcntl fail.
  static absl::StatusOr<LoadedLibrary> Load(
      absl::string_view so_bytes, const Sha256Digest& expected_sha256);

  // The same for a shared object whose bytes are the concatenation of
  // `so_pieces` (e.g. the gRPC slices it arrived in, client/raw_lookup.h):
  // hashed piece by piece, then written piece by piece, never joined.
  static absl::StatusOr<LoadedLibrary> Load(
      absl::Span<const absl::string_view> so_pieces,
      const Sha256Digest& expected_sha256);

  LoadedLibrary(LoadedLibrary&& other) noexcept;
  LoadedLibrary& operator=(LoadedLibrary&& other) noexcept;
  LoadedLibrary(const LoadedLibrary&) = delete;
  LoadedLibrary& operator=(const LoadedLibrary&) = delete;
  ~LoadedLibrary();

  // The address of the library's symbol `name` (dlsym; only this library and
  // its dependencies are searched).
  //
  // Errors: NOT_FOUND naming the symbol; FAILED_PRECONDITION on a moved-from
  // LoadedLibrary.
  absl::StatusOr<void*> Symbol(absl::string_view name) const;

 private:
  LoadedLibrary(int memfd, void* handle) : memfd_(memfd), handle_(handle) {}
  void Reset();

  int memfd_ = -1;
  void* handle_ = nullptr;
};

}  // namespace kiln

#endif  // KILN_RUNTIME_CPU_LOADER_H_
