// Child process for the cache crash and safety tests.
//
//   cache_crash_writer write <data_dir> <round> <capacity_bytes>
//     Puts artifacts named by (round, i) in a loop and writes "i\n" to stdout
//     after each Put returns OK, until killed (or 100000 puts or 30 s).
//     Reads back earlier entries of the round as it goes; exits 3 if one
//     does not match, 2 on any error.
//   cache_crash_writer open <data_dir>
//     Opens the store and prints the status; exits 0 if it opened, else
//     10 + the absl::StatusCode.
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cache/artifact_store.h"
#include "tests/cache/crash_payload.h"

namespace {

// Unbuffered, so that every acknowledgement the parent reads was made after
// its Put returned, and none sits in a buffer when the SIGKILL comes.
void WriteAll(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n <= 0) std::exit(2);
    done += static_cast<size_t>(n);
  }
}

int Open(const std::string& dir) {
  kiln::ArtifactStoreOptions options;
  options.data_dir = dir;
  absl::StatusOr<std::unique_ptr<kiln::ArtifactStore>> store =
      kiln::ArtifactStore::Open(options);
  WriteAll(1, absl::StrCat(store.status().ToString(), "\n"));
  return store.ok() ? 0 : 10 + static_cast<int>(store.status().code());
}

int Write(const std::string& dir, int round, uint64_t capacity) {
  kiln::ArtifactStoreOptions options;
  options.data_dir = dir;
  options.capacity_bytes = capacity;
  options.flush_interval = absl::Milliseconds(20);
  options.access_flush_batch = 8;
  absl::StatusOr<std::unique_ptr<kiln::ArtifactStore>> store =
      kiln::ArtifactStore::Open(options);
  if (!store.ok()) {
    WriteAll(2, absl::StrCat("open: ", store.status().ToString(), "\n"));
    return 2;
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  for (int i = 0; i < 100000 && absl::Now() < deadline; ++i) {
    const kiln::Sha256Digest key = kiln::crash_test::Key(round, i);
    const absl::Status status = (*store)->Put(
        key, kiln::crash_test::Payload(key, kiln::crash_test::SizeOf(i)),
        {.compile_seconds = 0.001 * i});
    if (!status.ok()) {
      WriteAll(2, absl::StrCat("put: ", status.ToString(), "\n"));
      return 2;
    }
    WriteAll(1, absl::StrCat(i, "\n"));
    if (i % 3 == 2) {
      const int j = i / 2;
      const kiln::Sha256Digest old_key = kiln::crash_test::Key(round, j);
      absl::StatusOr<std::optional<kiln::CachedArtifact>> got =
          (*store)->Get(old_key);
      if (!got.ok()) {
        WriteAll(2, absl::StrCat("get: ", got.status().ToString(), "\n"));
        return 2;
      }
      if (got->has_value() &&
          (*got)->payload !=
              kiln::crash_test::Payload(old_key, kiln::crash_test::SizeOf(j))) {
        WriteAll(2, absl::StrCat("get: wrong payload for ", j, "\n"));
        return 3;
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // stdout carries the acknowledgements only; the store's logs go to stderr.
  spdlog::set_default_logger(spdlog::stderr_logger_st("stderr"));
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "open" && argc == 3) return Open(argv[2]);
  int round = 0;
  uint64_t capacity = 0;
  if (mode == "write" && argc == 5 && absl::SimpleAtoi(argv[3], &round) &&
      absl::SimpleAtoi(argv[4], &capacity)) {
    return Write(argv[2], round, capacity);
  }
  std::fprintf(stderr,
               "usage: %s write <data_dir> <round> <capacity_bytes>\n"
               "       %s open <data_dir>\n",
               argv[0], argv[0]);
  return 64;
}
