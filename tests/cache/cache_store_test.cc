// ArtifactStore basics: round trips, persistence across reopen, listing,
// deletes, exact stats, options and data-dir handling, read-only opens.
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "cache/artifact_format.h"
#include "cache/artifact_store.h"
#include "gtest/gtest.h"
#include "tests/cache/cache_test_util.h"

namespace kiln {
namespace {

using cache_test::KeyFor;
using cache_test::OpenOrDie;
using cache_test::PayloadFor;
using cache_test::RawDb;
using cache_test::TempDir;
using cache_test::TestOptions;

constexpr uint64_t kLarge = uint64_t{1} << 30;

uint64_t Bytes(size_t payload_size) {
  return cache_format::EntryBytes(payload_size);
}

TEST(ArtifactStoreTest, PutThenGetReturnsThePayloadAndMetadata) {
  TempDir dir;
  auto store = OpenOrDie(TestOptions(dir.Sub("db"), kLarge));
  ASSERT_NE(store, nullptr);
  const Sha256Digest key = KeyFor("a");
  const std::string payload = PayloadFor(key, 5000);
  const absl::Time before = absl::Now();
  ASSERT_TRUE(store->Put(key, payload, {.compile_seconds = 2.5}).ok());

  EXPECT_TRUE(store->Contains(key));
  absl::StatusOr<std::optional<CachedArtifact>> got = store->Get(key);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->payload, payload);
  EXPECT_EQ((*got)->compile_seconds, 2.5);
  EXPECT_GE((*got)->created, before - absl::Seconds(1));
  EXPECT_LE((*got)->created, absl::Now() + absl::Seconds(1));

  absl::StatusOr<std::optional<CachedArtifact>> missing =
      store->Get(KeyFor("b"));
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_FALSE(missing->has_value());
  EXPECT_FALSE(store->Contains(KeyFor("b")));
}

TEST(ArtifactStoreTest, EmptyPayloadRoundTrips) {
  TempDir dir;
  auto store = OpenOrDie(TestOptions(dir.Sub("db"), kLarge));
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Put(KeyFor("empty"), "", {}).ok());
  auto got = store->Get(KeyFor("empty"));
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->payload, "");
}

TEST(ArtifactStoreTest, EntriesSurviveCloseAndReopen) {
  TempDir dir;
  const ArtifactStoreOptions options = TestOptions(dir.Sub("db"), kLarge);
  // Sizes on both sides of blob_min_bytes (16 KiB): inline and blob values.
  const std::vector<size_t> sizes = {1,     100,    4096,   16383,
                                     16384, 100000, 1 << 20};
  std::vector<Sha256Digest> keys;
  uint64_t total = 0;
  {
    auto store = OpenOrDie(options);
    ASSERT_NE(store, nullptr);
    for (size_t i = 0; i < 40; ++i) {
      const Sha256Digest key = KeyFor(absl::StrCat("entry", i));
      const size_t size = sizes[i % sizes.size()];
      ASSERT_TRUE(
          store->Put(key, PayloadFor(key, size), {.compile_seconds = 0.5 * i})
              .ok());
      keys.push_back(key);
      total += Bytes(size);
    }
  }
  for (int reopen = 0; reopen < 2; ++reopen) {
    auto store = OpenOrDie(options);
    ASSERT_NE(store, nullptr);
    const CacheStats stats = store->Stats();
    EXPECT_EQ(stats.entries, keys.size());
    EXPECT_EQ(stats.bytes, total);
    EXPECT_EQ(stats.puts, keys.size());
    const std::vector<EntryInfo> listed = store->List();
    ASSERT_EQ(listed.size(), keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      const size_t size = sizes[i % sizes.size()];
      auto got = store->Get(keys[i]);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_TRUE(got->has_value()) << "entry " << i;
      EXPECT_EQ((*got)->payload, PayloadFor(keys[i], size)) << "entry " << i;
      EXPECT_EQ((*got)->compile_seconds, 0.5 * i);
    }
  }
}

// A Put's label comes back from List(), across hits (which rewrite the
// index record) and reopening; entries put without one list none.
TEST(ArtifactStoreTest, LabelsSurviveHitsAndReopen) {
  TempDir dir;
  const ArtifactStoreOptions options = TestOptions(dir.Sub("db"), kLarge);
  const Sha256Digest labelled = KeyFor("labelled"), plain = KeyFor("plain");
  const Sha256Digest label = KeyFor("the request key");
  {
    auto store = OpenOrDie(options);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store
                    ->Put(labelled, PayloadFor(labelled, 100),
                          {.compile_seconds = 1, .label = label})
                    .ok());
    ASSERT_TRUE(store->Put(plain, PayloadFor(plain, 100), {}).ok());
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(store->Get(labelled).ok());
    ASSERT_TRUE(store->Flush().ok());
  }
  for (int reopen = 0; reopen < 2; ++reopen) {
    auto store = OpenOrDie(options);
    ASSERT_NE(store, nullptr);
    int seen = 0;
    for (const EntryInfo& info : store->List()) {
      if (info.key == labelled) {
        ASSERT_TRUE(info.label.has_value());
        EXPECT_EQ(*info.label, label);
        ++seen;
      } else {
        EXPECT_EQ(info.key, plain);
        EXPECT_FALSE(info.label.has_value());
        ++seen;
      }
    }
    EXPECT_EQ(seen, 2);
    ASSERT_TRUE(store->Get(labelled).ok());
  }
}

TEST(ArtifactStoreTest, ListReportsEntriesLeastRecentlyUsedFirst) {
  TempDir dir;
  auto store = OpenOrDie(TestOptions(dir.Sub("db"), kLarge));
  ASSERT_NE(store, nullptr);
  const Sha256Digest a = KeyFor("a"), b = KeyFor("b"), c = KeyFor("c");
  ASSERT_TRUE(store->Put(a, "aaaa", {.compile_seconds = 1}).ok());
  ASSERT_TRUE(store->Put(b, "bbbbbbbb", {.compile_seconds = 2}).ok());
  ASSERT_TRUE(store->Put(c, "cc", {.compile_seconds = 3}).ok());
  ASSERT_TRUE(store->Get(a).ok());

  const std::vector<EntryInfo> listed = store->List();
  ASSERT_EQ(listed.size(), 3u);
  EXPECT_EQ(listed[0].key, b);
  EXPECT_EQ(listed[1].key, c);
  EXPECT_EQ(listed[2].key, a);
  EXPECT_EQ(listed[0].bytes, Bytes(8));
  EXPECT_EQ(listed[0].compile_seconds, 2);
  EXPECT_LT(listed[0].access_seq, listed[1].access_seq);
  EXPECT_LT(listed[1].access_seq, listed[2].access_seq);
}

// RecordHit: a hit on a payload the caller kept from an earlier Get (kilnd's
// in-memory copy) counts and reorders exactly as a Get, and is refused once
// that entry is gone or replaced.
TEST(ArtifactStoreTest, RecordHitCountsLikeAGetWhileTheSameEntryIsStored) {
  TempDir dir;
  const ArtifactStoreOptions options = TestOptions(dir.Sub("db"), kLarge);
  const Sha256Digest a = KeyFor("a"), b = KeyFor("b");
  absl::Time a_created;
  {
    auto store = OpenOrDie(options);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(
        store->Put(a, PayloadFor(a, 100), {.compile_seconds = 1.5}).ok());
    ASSERT_TRUE(store->Put(b, PayloadFor(b, 100), {.compile_seconds = 2}).ok());
    auto got = store->Get(a);
    ASSERT_TRUE(got.ok() && got->has_value());
    a_created = (*got)->created;
    ASSERT_TRUE(store->Put(b, PayloadFor(b, 100), {.compile_seconds = 2}).ok());
    EXPECT_EQ(store->List().front().key, a);  // b was put after a's Get

    EXPECT_TRUE(store->RecordHit(a, a_created));
    EXPECT_TRUE(store->RecordHit(a, a_created));
    EXPECT_EQ(store->List().back().key, a);  // most recently used
    EXPECT_FALSE(store->RecordHit(a, a_created + absl::Microseconds(1)));
    EXPECT_FALSE(store->RecordHit(KeyFor("absent"), a_created));
    const CacheStats stats = store->Stats();
    EXPECT_EQ(stats.hits, 3u);  // one Get, two RecordHits
    EXPECT_DOUBLE_EQ(stats.compile_seconds_saved, 3 * 1.5);
  }
  {
    // The access times of RecordHit persist like those of Get.
    auto store = OpenOrDie(options);
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->List().back().key, a);
    EXPECT_EQ(store->Stats().hits, 3u);
    EXPECT_TRUE(store->RecordHit(a, a_created));
    // Replaced by a new Put: the caller's copy is stale.
    absl::SleepFor(absl::Milliseconds(2));
    ASSERT_TRUE(
        store->Put(a, PayloadFor(a, 100), {.compile_seconds = 1.5}).ok());
    EXPECT_FALSE(store->RecordHit(a, a_created));
    auto got = store->Get(a);
    ASSERT_TRUE(got.ok() && got->has_value());
    EXPECT_TRUE(store->RecordHit(a, (*got)->created));
    // Deleted, evicted: refused.
    ASSERT_TRUE(store->Delete(a).ok());
    EXPECT_FALSE(store->RecordHit(a, (*got)->created));
    got = store->Get(b);
    ASSERT_TRUE(got.ok() && got->has_value());
    ASSERT_TRUE(store->EvictAll().ok());
    EXPECT_FALSE(store->RecordHit(b, (*got)->created));
    EXPECT_EQ(store->Stats().hits, 7u);  // 3 before, 2 RecordHits, 2 Gets
  }
}

TEST(ArtifactStoreTest, PutReplacesAnExistingEntry) {
  TempDir dir;
  auto store = OpenOrDie(TestOptions(dir.Sub("db"), kLarge));
  ASSERT_NE(store, nullptr);
  const Sha256Digest key = KeyFor("k");
  ASSERT_TRUE(
      store->Put(key, std::string(100, 'x'), {.compile_seconds = 1}).ok());
  ASSERT_TRUE(
      store->Put(key, std::string(300, 'y'), {.compile_seconds = 2}).ok());
  auto got = store->Get(key);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->payload, std::string(300, 'y'));
  EXPECT_EQ((*got)->compile_seconds, 2);
  const CacheStats stats = store->Stats();
  EXPECT_EQ(stats.entries, 1u);
  EXPECT_EQ(stats.bytes, Bytes(300));
  EXPECT_EQ(stats.puts, 2u);
}

TEST(ArtifactStoreTest, DeleteAndEvictAllRemoveEntriesDurably) {
  TempDir dir;
  const ArtifactStoreOptions options = TestOptions(dir.Sub("db"), kLarge);
  {
    auto store = OpenOrDie(options);
    ASSERT_NE(store, nullptr);
    for (int i = 0; i < 5; ++i) {
      ASSERT_TRUE(store->Put(KeyFor(absl::StrCat(i)), "payload", {}).ok());
    }
    ASSERT_TRUE(store->Delete(KeyFor("0")).ok());
    ASSERT_TRUE(store->Delete(KeyFor("0")).ok());  // absent: still OK
    EXPECT_FALSE(store->Contains(KeyFor("0")));
    auto got = store->Get(KeyFor("0"));
    ASSERT_TRUE(got.ok());
    EXPECT_FALSE(got->has_value());
    CacheStats stats = store->Stats();
    EXPECT_EQ(stats.deletes, 1u);
    EXPECT_EQ(stats.entries, 4u);
  }
  {
    auto store = OpenOrDie(options);
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->Stats().entries, 4u);
    EXPECT_FALSE(store->Contains(KeyFor("0")));
    EXPECT_TRUE(store->Contains(KeyFor("1")));
    ASSERT_TRUE(store->EvictAll().ok());
    const CacheStats stats = store->Stats();
    EXPECT_EQ(stats.entries, 0u);
    EXPECT_EQ(stats.bytes, 0u);
    EXPECT_EQ(stats.evictions, 4u);
  }
  auto store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Stats().entries, 0u);
  EXPECT_TRUE(store->List().empty());
  auto got = store->Get(KeyFor("1"));
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());
}

TEST(ArtifactStoreTest, StatsAreExactAfterAScriptedSequenceAndPersist) {
  TempDir dir;
  const Sha256Digest a = KeyFor("a"), b = KeyFor("b"), c = KeyFor("c"),
                     x = KeyFor("x");
  // Room for exactly two 1000-byte entries.
  const ArtifactStoreOptions options =
      TestOptions(dir.Sub("db"), 2 * Bytes(1000));
  CacheStats expected;
  {
    auto store = OpenOrDie(options);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(
        store->Put(a, std::string(1000, 'a'), {.compile_seconds = 1.5}).ok());
    ASSERT_TRUE(
        store->Put(b, std::string(1000, 'b'), {.compile_seconds = 4}).ok());
    ASSERT_TRUE(store->Get(a).ok());  // hit, +1.5
    ASSERT_TRUE(store->Get(a).ok());  // hit, +1.5
    ASSERT_TRUE(store->Get(b).ok());  // hit, +4
    ASSERT_TRUE(store->Get(x).ok());  // miss
    // c evicts the least recently used: a (b was read last).
    ASSERT_TRUE(
        store->Put(c, std::string(1000, 'c'), {.compile_seconds = 9}).ok());
    ASSERT_TRUE(store->Get(a).ok());  // miss: evicted
    ASSERT_TRUE(store->Delete(b).ok());
    ASSERT_TRUE(store->Get(b).ok());  // miss: deleted
    ASSERT_TRUE(store->Get(c).ok());  // hit, +9

    const CacheStats stats = store->Stats();
    EXPECT_EQ(stats.entries, 1u);
    EXPECT_EQ(stats.bytes, Bytes(1000));
    EXPECT_EQ(stats.capacity_bytes, 2 * Bytes(1000));
    EXPECT_EQ(stats.hits, 4u);
    EXPECT_EQ(stats.misses, 3u);
    EXPECT_EQ(stats.puts, 3u);
    EXPECT_EQ(stats.deletes, 1u);
    EXPECT_EQ(stats.evictions, 1u);
    EXPECT_EQ(stats.corrupt_dropped, 0u);
    EXPECT_EQ(stats.io_errors, 0u);
    EXPECT_DOUBLE_EQ(stats.compile_seconds_saved, 1.5 + 1.5 + 4 + 9);
    expected = stats;
  }
  auto store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  const CacheStats stats = store->Stats();
  EXPECT_EQ(stats.entries, expected.entries);
  EXPECT_EQ(stats.bytes, expected.bytes);
  EXPECT_EQ(stats.hits, expected.hits);
  EXPECT_EQ(stats.misses, expected.misses);
  EXPECT_EQ(stats.puts, expected.puts);
  EXPECT_EQ(stats.deletes, expected.deletes);
  EXPECT_EQ(stats.evictions, expected.evictions);
  EXPECT_EQ(stats.corrupt_dropped, expected.corrupt_dropped);
  EXPECT_DOUBLE_EQ(stats.compile_seconds_saved, expected.compile_seconds_saved);
}

TEST(ArtifactStoreTest, FlushPersistsCountersWhileOpen) {
  TempDir dir;
  ArtifactStoreOptions options = TestOptions(dir.Sub("db"), kLarge);
  options.flush_interval = absl::Hours(1);  // only the explicit Flush
  auto store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Put(KeyFor("a"), "x", {.compile_seconds = 3}).ok());
  ASSERT_TRUE(store->Get(KeyFor("a")).ok());
  ASSERT_TRUE(store->Flush().ok());
  // A read-only open (which takes no lock) sees what the store persisted.
  ArtifactStoreOptions read_only = options;
  read_only.read_only = true;
  auto reader = OpenOrDie(read_only);
  ASSERT_NE(reader, nullptr);
  const CacheStats stats = reader->Stats();
  EXPECT_EQ(stats.puts, 1u);
  EXPECT_EQ(stats.hits, 1u);
  EXPECT_DOUBLE_EQ(stats.compile_seconds_saved, 3);
}

// Hits move an entry's recency in memory at once, but reach the "access"
// column family only in batches: a read-only view of the database (which
// replays the WAL, so it sees every write made so far) shows the put-time
// order until the batch is written.
TEST(ArtifactStoreTest, HitsUpdateAccessTimesInBatchesNotPerHit) {
  TempDir dir;
  ArtifactStoreOptions options = TestOptions(dir.Sub("db"), kLarge);
  options.flush_interval = absl::Hours(1);
  options.access_flush_batch = 50;
  ArtifactStoreOptions view = options;
  view.read_only = true;
  auto persisted_order = [&view] {
    auto reader = OpenOrDie(view);
    std::vector<std::string> keys;
    if (reader != nullptr) {
      for (const EntryInfo& info : reader->List()) {
        keys.push_back(DigestToHex(info.key).substr(0, 8));
      }
    }
    return keys;
  };
  auto store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  std::vector<Sha256Digest> put_order;
  std::vector<std::string> put_order_hex;
  for (int i = 0; i < 10; ++i) {
    put_order.push_back(KeyFor(absl::StrCat(i)));
    put_order_hex.push_back(DigestToHex(put_order.back()).substr(0, 8));
    ASSERT_TRUE(store->Put(put_order.back(), "x", {}).ok());
  }
  // 49 hits on the oldest entries, below the batch of 50: nothing written.
  for (int n = 0; n < 49; ++n) ASSERT_TRUE(store->Get(put_order[n % 5]).ok());
  EXPECT_EQ(store->List().front().key, put_order[5]);  // in memory: moved
  EXPECT_EQ(persisted_order(), put_order_hex);         // on disk: not yet

  // The 50th hit wakes the background thread, which writes the batch.
  // Poll, bounded, for it to land.
  ASSERT_TRUE(store->Get(put_order[4]).ok());
  std::vector<std::string> in_memory;
  for (const EntryInfo& info : store->List()) {
    in_memory.push_back(DigestToHex(info.key).substr(0, 8));
  }
  std::vector<std::string> on_disk = persisted_order();
  for (int wait = 0; wait < 300 && on_disk != in_memory; ++wait) {
    absl::SleepFor(absl::Milliseconds(10));
    on_disk = persisted_order();
  }
  EXPECT_EQ(on_disk, in_memory);
}

TEST(ArtifactStoreTest, OversizedEntryIsRejectedAndChangesNothing) {
  TempDir dir;
  auto store = OpenOrDie(TestOptions(dir.Sub("db"), 10000));
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Put(KeyFor("small"), "x", {}).ok());
  const absl::Status status =
      store->Put(KeyFor("big"), std::string(10000, 'b'), {});
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), dir.Sub("db"))) << status;
  EXPECT_TRUE(store->Contains(KeyFor("small")));
  EXPECT_FALSE(store->Contains(KeyFor("big")));
  EXPECT_EQ(store->Stats().puts, 1u);
}

TEST(ArtifactStoreTest, RejectsBadOptions) {
  TempDir dir;
  EXPECT_EQ(ArtifactStore::Open(TestOptions("", kLarge)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ArtifactStore::Open(TestOptions(dir.Sub("db"), 0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  ArtifactStoreOptions options = TestOptions(dir.Sub("db"), kLarge);
  options.access_flush_batch = 0;
  EXPECT_EQ(ArtifactStore::Open(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ArtifactStoreTest, DataDirIsCreatedOwnerOnlyWithParents) {
  TempDir dir;
  const mode_t old_umask = umask(0);  // the widest umask: mkdir must not care
  const std::string data_dir = dir.Sub("a/b/db");
  auto store = OpenOrDie(TestOptions(data_dir, kLarge));
  umask(old_umask);
  ASSERT_NE(store, nullptr);
  struct stat st;
  ASSERT_EQ(stat(data_dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(stat(dir.Sub("a").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0077, 0u);
}

TEST(ArtifactStoreTest, ExistingWideDataDirIsNarrowedToOwnerOnly) {
  TempDir dir;
  const std::string data_dir = dir.Sub("db");
  ASSERT_EQ(mkdir(data_dir.c_str(), 0755), 0);
  ASSERT_EQ(chmod(data_dir.c_str(), 0755), 0);
  auto store = OpenOrDie(TestOptions(data_dir, kLarge));
  ASSERT_NE(store, nullptr);
  struct stat st;
  ASSERT_EQ(stat(data_dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

TEST(ArtifactStoreTest, DataDirThatIsAFileIsAnErrorNamingIt) {
  TempDir dir;
  const std::string path = dir.Sub("file");
  std::ofstream(path) << "not a dir";
  absl::StatusOr<std::unique_ptr<ArtifactStore>> store =
      ArtifactStore::Open(TestOptions(path, kLarge));
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(store.status().message(), path))
      << store.status();

  // A file where a parent should be.
  store = ArtifactStore::Open(TestOptions(path + "/db", kLarge));
  ASSERT_FALSE(store.ok());
  EXPECT_TRUE(absl::StrContains(store.status().message(), path + "/db"))
      << store.status();
}

TEST(ArtifactStoreTest, SecondOpenOfTheSameDirFailsNamingTheDir) {
  TempDir dir;
  const ArtifactStoreOptions options = TestOptions(dir.Sub("db"), kLarge);
  auto store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  absl::StatusOr<std::unique_ptr<ArtifactStore>> second =
      ArtifactStore::Open(options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition)
      << second.status();
  EXPECT_TRUE(absl::StrContains(second.status().message(), dir.Sub("db")))
      << second.status();
  EXPECT_TRUE(absl::StrContains(second.status().message(), "in use"))
      << second.status();
  // The first store is unaffected.
  EXPECT_TRUE(store->Put(KeyFor("a"), "x", {}).ok());
}

TEST(ArtifactStoreTest, ReadOnlyOpenServesReadsAndRefusesWrites) {
  TempDir dir;
  ArtifactStoreOptions options = TestOptions(dir.Sub("db"), kLarge);
  options.read_only = true;
  absl::StatusOr<std::unique_ptr<ArtifactStore>> missing =
      ArtifactStore::Open(options);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), dir.Sub("db")));

  options.read_only = false;
  {
    auto store = OpenOrDie(options);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Put(KeyFor("a"), "payload", {}).ok());
  }
  options.read_only = true;
  auto store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  auto got = store->Get(KeyFor("a"));
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->payload, "payload");
  const absl::Status put = store->Put(KeyFor("b"), "x", {});
  EXPECT_EQ(put.code(), absl::StatusCode::kFailedPrecondition) << put;
  EXPECT_TRUE(absl::StrContains(put.message(), "read-only")) << put;
  EXPECT_EQ(store->Delete(KeyFor("a")).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->EvictAll().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(store->Contains(KeyFor("a")));
}

TEST(ArtifactStoreTest, NewerStoreFormatIsRefused) {
  TempDir dir;
  const ArtifactStoreOptions options = TestOptions(dir.Sub("db"), kLarge);
  { ASSERT_NE(OpenOrDie(options), nullptr); }
  {
    RawDb raw(dir.Sub("db"));
    ASSERT_TRUE(raw.ok());
    raw.Write(
        raw.meta(), cache_format::kFormatKey,
        cache_format::EncodeFixed32(cache_format::kStoreFormatVersion + 1));
  }
  absl::StatusOr<std::unique_ptr<ArtifactStore>> store =
      ArtifactStore::Open(options);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(store.status().message(), "format"))
      << store.status();
}

}  // namespace
}  // namespace kiln
