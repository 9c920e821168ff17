// Safety around the database: a second process on the same dir, a user
// without access to the dir, and a disk that stops taking writes all turn
// into statuses that name the dir, never a crash or a corrupt entry.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "cache/artifact_store.h"
#include "gtest/gtest.h"
#include "rocksdb/env.h"
#include "rocksdb/file_system.h"
#include "tests/cache/cache_test_util.h"
#include "tests/cache/child_process.h"

namespace kiln {
namespace {

using cache_test::ChildProcess;
using cache_test::KeyFor;
using cache_test::OpenOrDie;
using cache_test::PayloadFor;
using cache_test::TempDir;
using cache_test::TestOptions;

constexpr uint64_t kLarge = uint64_t{1} << 30;

// Runs `cache_crash_writer open <dir>` and returns (exit code, output).
struct OpenResult {
  int exit_code = -1;
  std::string output;
};
OpenResult OpenInChild(const std::string& writer, const std::string& dir,
                       bool as_nobody) {
  OpenResult result;
  std::unique_ptr<ChildProcess> child =
      ChildProcess::Spawn({writer, "open", dir}, as_nobody);
  if (child == nullptr) return result;
  const int status = child->Wait();
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  result.output = child->output();
  return result;
}

int ExitCodeFor(absl::StatusCode code) { return 10 + static_cast<int>(code); }

TEST(ArtifactStoreSafetyTest, SecondProcessOnTheSameDirGetsAnErrorNamingIt) {
  TempDir dir;
  const std::string data_dir = dir.Sub("db");
  auto store = OpenOrDie(TestOptions(data_dir, kLarge));
  ASSERT_NE(store, nullptr);
  const OpenResult second =
      OpenInChild(KILN_CACHE_CRASH_WRITER, data_dir, /*as_nobody=*/false);
  EXPECT_EQ(second.exit_code,
            ExitCodeFor(absl::StatusCode::kFailedPrecondition))
      << second.output;
  EXPECT_TRUE(absl::StrContains(second.output, data_dir)) << second.output;
  EXPECT_TRUE(absl::StrContains(second.output, "in use")) << second.output;
  // The holder is unaffected; once it closes, another process can open.
  EXPECT_TRUE(store->Put(KeyFor("a"), "x", {}).ok());
  store.reset();
  const OpenResult after =
      OpenInChild(KILN_CACHE_CRASH_WRITER, data_dir, /*as_nobody=*/false);
  EXPECT_EQ(after.exit_code, 0) << after.output;
}

// A user that may not write the dir gets PERMISSION_DENIED naming it. Tests
// run as root, for whom permission bits do not stop writes, so as root the
// open runs in a child that drops to user nobody; as another user, in-process
// on a chmod 0500 parent.
TEST(ArtifactStoreSafetyTest, UnwritableDirIsPermissionDeniedNamingIt) {
  TempDir dir;
  if (geteuid() != 0) {
    ASSERT_EQ(mkdir(dir.Sub("locked").c_str(), 0500), 0);
    const std::string data_dir = dir.Sub("locked/db");
    absl::StatusOr<std::unique_ptr<ArtifactStore>> store =
        ArtifactStore::Open(TestOptions(data_dir, kLarge));
    ASSERT_FALSE(store.ok());
    EXPECT_EQ(store.status().code(), absl::StatusCode::kPermissionDenied)
        << store.status();
    EXPECT_TRUE(absl::StrContains(store.status().message(), data_dir));
    chmod(dir.Sub("locked").c_str(), 0700);
    return;
  }
  // nobody must reach the helper and the dirs: copy the helper into the
  // (root-owned) temp dir opened up to 0755.
  ASSERT_EQ(chmod(dir.path().c_str(), 0755), 0);
  const std::string writer = dir.Sub("cache_crash_writer");
  std::filesystem::copy_file(KILN_CACHE_CRASH_WRITER, writer);
  ASSERT_EQ(chmod(writer.c_str(), 0755), 0);

  // An existing store of root's (0700).
  const std::string store_dir = dir.Sub("store");
  { ASSERT_NE(OpenOrDie(TestOptions(store_dir, kLarge)), nullptr); }
  OpenResult result = OpenInChild(writer, store_dir, /*as_nobody=*/true);
  if (result.exit_code == cache_test::kCannotDropPrivileges) {
    GTEST_SKIP() << "cannot switch to user nobody here";
  }
  EXPECT_EQ(result.exit_code, ExitCodeFor(absl::StatusCode::kPermissionDenied))
      << result.output;
  EXPECT_TRUE(absl::StrContains(result.output, store_dir)) << result.output;

  // A new dir under a root-owned 0755 parent.
  ASSERT_EQ(mkdir(dir.Sub("rootonly").c_str(), 0755), 0);
  const std::string new_dir = dir.Sub("rootonly/db");
  result = OpenInChild(writer, new_dir, /*as_nobody=*/true);
  EXPECT_EQ(result.exit_code, ExitCodeFor(absl::StatusCode::kPermissionDenied))
      << result.output;
  EXPECT_TRUE(absl::StrContains(result.output, new_dir)) << result.output;

  // root's store is intact.
  auto store = OpenOrDie(TestOptions(store_dir, kLarge));
  EXPECT_NE(store, nullptr);
}

// Lowers this process's file-size limit (RLIMIT_FSIZE, which binds root too)
// so that writes past `bytes` in any file fail with EFBIG, as on a full disk;
// SIGXFSZ is ignored so the write returns the error instead of killing us.
// Restores both on destruction.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ok_ = getrlimit(RLIMIT_FSIZE, &saved_) == 0;
    struct sigaction ignore = {};
    ignore.sa_handler = SIG_IGN;
    ok_ = ok_ && sigaction(SIGXFSZ, &ignore, &saved_action_) == 0;
    rlimit lowered = saved_;
    lowered.rlim_cur = bytes;
    ok_ = ok_ && setrlimit(RLIMIT_FSIZE, &lowered) == 0;
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &saved_);
    sigaction(SIGXFSZ, &saved_action_, nullptr);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;
  bool ok() const { return ok_; }

 private:
  bool ok_ = false;
  rlimit saved_ = {};
  struct sigaction saved_action_ = {};
};

// RLIMIT_FSIZE fails the WAL append with EFBIG, a write error RocksDB does not
// resume from: the store reopens the database by itself on a later write.
TEST(ArtifactStoreSafetyTest, FileTooLargeIsAnErrorAndTheStoreReopens) {
  TempDir dir;
  const std::string data_dir = dir.Sub("db");
  const ArtifactStoreOptions options = TestOptions(data_dir, kLarge);
  constexpr size_t kSize = 1 << 20;
  std::vector<Sha256Digest> acked;
  auto store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  absl::Status first_error;
  {
    // The WAL takes every put in full: it reaches 4 MB within 5 puts.
    FileSizeLimit limit(4 << 20);
    ASSERT_TRUE(limit.ok());
    for (int i = 0; i < 20; ++i) {
      const Sha256Digest key = KeyFor(absl::StrCat("full", i));
      first_error = store->Put(key, PayloadFor(key, kSize), {});
      if (!first_error.ok()) break;
      acked.push_back(key);
    }
    ASSERT_FALSE(first_error.ok()) << "20 MB went into a 4 MB file limit";
    EXPECT_EQ(first_error.code(), absl::StatusCode::kResourceExhausted)
        << first_error;
    EXPECT_TRUE(absl::StrContains(first_error.message(), data_dir))
        << first_error;
    // No crash, and reads keep working.
    for (const Sha256Digest& key : acked) {
      absl::StatusOr<std::optional<CachedArtifact>> got = store->Get(key);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_TRUE(got->has_value());
    }
    EXPECT_GE(store->Stats().io_errors, 1u);
  }
  ASSERT_FALSE(acked.empty());
  // Room again: the next put reopens the stopped database and succeeds.
  const absl::Status after = store->Put(KeyFor("after"), "x", {});
  EXPECT_TRUE(after.ok()) << after;
  for (const Sha256Digest& key : acked) {
    absl::StatusOr<std::optional<CachedArtifact>> got = store->Get(key);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(got->has_value());
    EXPECT_EQ((*got)->payload, PayloadFor(key, kSize));
  }
  EXPECT_EQ(store->Stats().entries, acked.size() + 1);
  // And everything is there after a close and open.
  store.reset();
  store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  for (const Sha256Digest& key : acked) EXPECT_TRUE(store->Contains(key));
  EXPECT_TRUE(store->Contains(KeyFor("after")));
  EXPECT_EQ(store->Stats().corrupt_dropped, 0u);
}

// The real file system, except that appends fail while `failure` is set:
// with ENOSPC (RocksDB's IOStatus::NoSpace), as a disk that fills up and then
// has room again, or with EIO. Root cannot otherwise arrange either without
// a small mount.
enum class Failure { kNone, kNoSpace, kIoError };

class FailingFileSystem : public rocksdb::FileSystemWrapper {
 public:
  FailingFileSystem()
      : rocksdb::FileSystemWrapper(rocksdb::FileSystem::Default()) {}
  const char* Name() const override { return "FailingFileSystem"; }

  rocksdb::IOStatus NewWritableFile(
      const std::string& name, const rocksdb::FileOptions& options,
      std::unique_ptr<rocksdb::FSWritableFile>* result,
      rocksdb::IODebugContext* debug) override {
    std::unique_ptr<rocksdb::FSWritableFile> file;
    rocksdb::IOStatus status =
        target()->NewWritableFile(name, options, &file, debug);
    if (status.ok()) {
      *result = std::make_unique<File>(std::move(file), &failure);
    }
    return status;
  }

  std::atomic<Failure> failure{Failure::kNone};

 private:
  class File : public rocksdb::FSWritableFileOwnerWrapper {
   public:
    File(std::unique_ptr<rocksdb::FSWritableFile> file,
         std::atomic<Failure>* failure)
        : rocksdb::FSWritableFileOwnerWrapper(std::move(file)),
          failure_(failure) {}
    rocksdb::IOStatus Append(const rocksdb::Slice& data,
                             const rocksdb::IOOptions& options,
                             rocksdb::IODebugContext* debug) override {
      if (rocksdb::IOStatus s = Injected(); !s.ok()) return s;
      return target()->Append(data, options, debug);
    }
    rocksdb::IOStatus Append(const rocksdb::Slice& data,
                             const rocksdb::IOOptions& options,
                             const rocksdb::DataVerificationInfo& info,
                             rocksdb::IODebugContext* debug) override {
      if (rocksdb::IOStatus s = Injected(); !s.ok()) return s;
      return target()->Append(data, options, info, debug);
    }

   private:
    rocksdb::IOStatus Injected() const {
      switch (failure_->load()) {
        case Failure::kNoSpace:
          return rocksdb::IOStatus::NoSpace("injected: disk full");
        case Failure::kIoError:
          return rocksdb::IOStatus::IOError("injected: EIO");
        case Failure::kNone:
          break;
      }
      return rocksdb::IOStatus::OK();
    }

    std::atomic<Failure>* failure_;
  };
};

TEST(ArtifactStoreSafetyTest, DiskFullIsAnErrorAndWritesResumeWhenSpaceIsBack) {
  TempDir dir;
  const std::string data_dir = dir.Sub("db");
  auto file_system = std::make_shared<FailingFileSystem>();
  std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(file_system);
  ArtifactStoreOptions options = TestOptions(data_dir, kLarge);
  options.rocksdb_env = env.get();
  options.flush_interval = absl::Hours(1);  // only the puts below write
  auto store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  const Sha256Digest before = KeyFor("before"), during = KeyFor("during"),
                     after = KeyFor("after");
  ASSERT_TRUE(store->Put(before, "acked", {}).ok());

  file_system->failure = Failure::kNoSpace;
  const absl::Status full = store->Put(during, "lost", {});
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_TRUE(absl::StrContains(full.message(), data_dir)) << full;
  EXPECT_FALSE(store->Contains(during));
  EXPECT_FALSE(store->Put(during, "lost", {}).ok());
  auto got = store->Get(before);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->has_value());

  // Space is back: a later put resumes the database (RocksDB may also be
  // recovering by itself, then puts are UNAVAILABLE for a moment: 2 s was
  // too short once on a loaded 2-core CI box; 30 s at most).
  file_system->failure = Failure::kNone;
  absl::Status status = store->Put(after, "written", {});
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  for (int attempt = 0;
       attempt < 3000 && !status.ok() && absl::Now() < deadline; ++attempt) {
    ASSERT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    absl::SleepFor(absl::Milliseconds(10));
    status = store->Put(after, "written", {});
  }
  ASSERT_TRUE(status.ok()) << status;
  store.reset();

  store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  for (const Sha256Digest& key : {before, after}) {
    got = store->Get(key);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(got->has_value());
  }
  EXPECT_EQ(store->Stats().corrupt_dropped, 0u);
}

// EIO on the WAL stops RocksDB for good (Resume() refuses): the store closes
// and reopens the database, read-only while writes keep failing (so reads go
// on), and for writing once they work again.
TEST(ArtifactStoreSafetyTest, UnresumableWriteErrorReopensTheDatabase) {
  TempDir dir;
  const std::string data_dir = dir.Sub("db");
  auto file_system = std::make_shared<FailingFileSystem>();
  std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(file_system);
  ArtifactStoreOptions options = TestOptions(data_dir, kLarge);
  options.rocksdb_env = env.get();
  options.flush_interval = absl::Hours(1);  // only the puts below write
  auto store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  const Sha256Digest before = KeyFor("before"), after = KeyFor("after");
  ASSERT_TRUE(store->Put(before, PayloadFor(before, 50000), {}).ok());

  file_system->failure = Failure::kIoError;
  const absl::Status failed = store->Put(KeyFor("x"), "lost", {});
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  // The next write cannot resume; reopening for writing fails too (opening
  // writes a manifest), so the store reopens read-only.
  const absl::Status reopened = store->Put(KeyFor("y"), "lost", {});
  EXPECT_EQ(reopened.code(), absl::StatusCode::kUnavailable) << reopened;
  auto got = store->Get(before);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->payload, PayloadFor(before, 50000));

  // Writes work again: within the reopen throttle (1 s) puts stay
  // UNAVAILABLE, then one reopens the database for writing.
  file_system->failure = Failure::kNone;
  absl::Status status = store->Put(after, "written", {});
  for (int attempt = 0; attempt < 300 && !status.ok(); ++attempt) {
    ASSERT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    absl::SleepFor(absl::Milliseconds(10));
    status = store->Put(after, "written", {});
  }
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(store->Contains(before));
  EXPECT_FALSE(store->Contains(KeyFor("x")));
  store.reset();

  store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  for (const Sha256Digest& key : {before, after}) {
    got = store->Get(key);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(got->has_value());
  }
  EXPECT_EQ(store->Stats().corrupt_dropped, 0u);
}

// Reopens happen under readers: every Get during them returns the right
// bytes (the database is closed only while no Get holds it).
TEST(ArtifactStoreSafetyTest, ReopenUnderConcurrentGetsServesOnlyGoodBytes) {
  TempDir dir;
  auto file_system = std::make_shared<FailingFileSystem>();
  std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(file_system);
  ArtifactStoreOptions options = TestOptions(dir.Sub("db"), kLarge);
  options.rocksdb_env = env.get();
  options.flush_interval = absl::Hours(1);
  auto store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  constexpr int kKeys = 40;
  auto size_of = [](int i) -> size_t { return i % 4 == 0 ? 40000 : 700; };
  for (int i = 0; i < kKeys; ++i) {
    const Sha256Digest key = KeyFor(absl::StrCat("r", i));
    ASSERT_TRUE(store->Put(key, PayloadFor(key, size_of(i)), {}).ok());
  }
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0}, errors{0}, gets{0};
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&, r] {
      for (int n = 0; n < 200000 && !stop && absl::Now() < deadline; ++n) {
        const int i = (n * 7 + r) % kKeys;
        const Sha256Digest key = KeyFor(absl::StrCat("r", i));
        absl::StatusOr<std::optional<CachedArtifact>> got = store->Get(key);
        ++gets;
        if (!got.ok()) {
          ++errors;
        } else if (!got->has_value() ||
                   (*got)->payload != PayloadFor(key, size_of(i))) {
          ++bad;
        }
      }
    });
  }
  // Two reopens: read-only while appends fail, writable once they work.
  file_system->failure = Failure::kIoError;
  EXPECT_FALSE(store->Put(KeyFor("x"), "lost", {}).ok());
  EXPECT_FALSE(store->Put(KeyFor("y"), "lost", {}).ok());
  file_system->failure = Failure::kNone;
  absl::Status status = store->Put(KeyFor("z"), "written", {});
  for (int attempt = 0; attempt < 300 && !status.ok(); ++attempt) {
    absl::SleepFor(absl::Milliseconds(10));
    status = store->Put(KeyFor("z"), "written", {});
  }
  stop = true;
  for (std::thread& reader : readers) reader.join();
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_GT(gets.load(), 0);
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(errors.load(), 0);
}

}  // namespace
}  // namespace kiln
