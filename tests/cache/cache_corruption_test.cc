// Integrity: entries altered underneath the store (through raw RocksDB, or in
// its files on disk) are detected on Get, dropped, counted and never returned.
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

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

// Expects `key` to read as a dropped corrupt entry: a miss, removed from the
// index and from the database.
void ExpectDropped(ArtifactStore& store, const Sha256Digest& key,
                   const std::string& what) {
  absl::StatusOr<std::optional<CachedArtifact>> got = store.Get(key);
  ASSERT_TRUE(got.ok()) << what << ": " << got.status();
  EXPECT_FALSE(got->has_value()) << what << ": a corrupt entry was returned";
  EXPECT_FALSE(store.Contains(key)) << what;
  got = store.Get(key);  // now an ordinary miss
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());
}

class CorruptionTest : public ::testing::TestWithParam<size_t> {};

// One entry per position in the value (header fields, digest, payload start,
// middle and end): flipping a single bit anywhere must be caught.
TEST_P(CorruptionTest, FlippedBitAnywhereInTheValueIsDetectedAndDropped) {
  const size_t payload_size = GetParam();
  TempDir dir;
  const ArtifactStoreOptions options = TestOptions(dir.Sub("db"), kLarge);
  const std::vector<size_t> offsets = {
      0,
      4,
      8,
      16,
      24,
      32,
      63,
      cache_format::kValueHeaderSize,
      cache_format::kValueHeaderSize + payload_size / 2,
      cache_format::kValueHeaderSize + payload_size - 1};
  std::vector<Sha256Digest> keys;
  const Sha256Digest control = KeyFor("control");
  {
    auto store = OpenOrDie(options);
    ASSERT_NE(store, nullptr);
    for (size_t i = 0; i < offsets.size(); ++i) {
      keys.push_back(KeyFor(absl::StrCat("victim", i)));
      ASSERT_TRUE(
          store->Put(keys[i], PayloadFor(keys[i], payload_size), {}).ok());
    }
    ASSERT_TRUE(
        store->Put(control, PayloadFor(control, payload_size), {}).ok());
  }
  {
    RawDb raw(dir.Sub("db"));
    ASSERT_TRUE(raw.ok());
    for (size_t i = 0; i < offsets.size(); ++i) {
      std::string value;
      ASSERT_TRUE(raw.Read(raw.artifacts(), RawDb::Key(keys[i]), &value));
      ASSERT_LT(offsets[i], value.size());
      value[offsets[i]] ^= 0x10;
      raw.Write(raw.artifacts(), RawDb::Key(keys[i]), value);
    }
  }
  {
    auto store = OpenOrDie(options);
    ASSERT_NE(store, nullptr);
    for (size_t i = 0; i < offsets.size(); ++i) {
      ExpectDropped(*store, keys[i], absl::StrCat("offset ", offsets[i]));
    }
    auto got = store->Get(control);
    ASSERT_TRUE(got.ok() && got->has_value());
    EXPECT_EQ((*got)->payload, PayloadFor(control, payload_size));
    const CacheStats stats = store->Stats();
    EXPECT_EQ(stats.corrupt_dropped, offsets.size());
    EXPECT_EQ(stats.misses, 2 * offsets.size());
    EXPECT_EQ(stats.hits, 1u);
    EXPECT_EQ(stats.entries, 1u);
    EXPECT_EQ(stats.bytes, cache_format::EntryBytes(payload_size));
  }
  // Dropped for good, in the database too, and the count persisted.
  {
    auto store = OpenOrDie(options);
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->Stats().corrupt_dropped, offsets.size());
    EXPECT_EQ(store->Stats().entries, 1u);
  }
  RawDb raw(dir.Sub("db"));
  ASSERT_TRUE(raw.ok());
  for (const Sha256Digest& key : keys) {
    std::string value;
    EXPECT_FALSE(raw.Read(raw.artifacts(), RawDb::Key(key), &value));
    EXPECT_FALSE(raw.Read(raw.access(), RawDb::Key(key), &value));
  }
}

// 1000 bytes are stored inline in SST files, 100000 in blob files.
INSTANTIATE_TEST_SUITE_P(InlineAndBlob, CorruptionTest,
                         ::testing::Values(1000, 100000));

TEST(ArtifactStoreCorruptionTest, TruncatedExtendedAndMovedValuesAreDropped) {
  TempDir dir;
  const ArtifactStoreOptions options = TestOptions(dir.Sub("db"), kLarge);
  const Sha256Digest truncated = KeyFor("truncated"),
                     short_header = KeyFor("hdr"),
                     extended = KeyFor("extended"), source = KeyFor("source"),
                     moved = KeyFor("moved");
  {
    auto store = OpenOrDie(options);
    ASSERT_NE(store, nullptr);
    for (const Sha256Digest& key :
         {truncated, short_header, extended, source, moved}) {
      ASSERT_TRUE(store->Put(key, PayloadFor(key, 3000), {}).ok());
    }
  }
  {
    RawDb raw(dir.Sub("db"));
    ASSERT_TRUE(raw.ok());
    std::string value;
    ASSERT_TRUE(raw.Read(raw.artifacts(), RawDb::Key(truncated), &value));
    raw.Write(raw.artifacts(), RawDb::Key(truncated),
              value.substr(0, value.size() - 1));
    raw.Write(raw.artifacts(), RawDb::Key(short_header), value.substr(0, 10));
    ASSERT_TRUE(raw.Read(raw.artifacts(), RawDb::Key(extended), &value));
    raw.Write(raw.artifacts(), RawDb::Key(extended), value + "x");
    // A valid value of another key: the digest covers the key.
    ASSERT_TRUE(raw.Read(raw.artifacts(), RawDb::Key(source), &value));
    raw.Write(raw.artifacts(), RawDb::Key(moved), value);
  }
  auto store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  ExpectDropped(*store, truncated, "truncated");
  ExpectDropped(*store, short_header, "shorter than the header");
  ExpectDropped(*store, extended, "extended");
  ExpectDropped(*store, moved, "moved");
  auto got = store->Get(source);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ(store->Stats().corrupt_dropped, 4u);
}

TEST(ArtifactStoreCorruptionTest, ArtifactMissingUnderItsIndexRecordIsDropped) {
  TempDir dir;
  const ArtifactStoreOptions options = TestOptions(dir.Sub("db"), kLarge);
  const Sha256Digest key = KeyFor("gone");
  {
    auto store = OpenOrDie(options);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Put(key, "payload", {}).ok());
  }
  {
    // Delete through raw RocksDB, leaving the index record behind.
    RawDb raw(dir.Sub("db"));
    ASSERT_TRUE(raw.ok());
    raw.Delete(raw.artifacts(), RawDb::Key(key));
  }
  auto store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(store->Contains(key));
  ExpectDropped(*store, key, "missing artifact");
  EXPECT_EQ(store->Stats().corrupt_dropped, 1u);
  EXPECT_EQ(store->Stats().entries, 0u);
  EXPECT_EQ(store->Stats().bytes, 0u);
}

// A bit flipped in a blob file on disk: RocksDB's own checksum reports
// corruption, which the store handles like a bad digest.
TEST(ArtifactStoreCorruptionTest, CorruptBlobFileOnDiskIsDetectedAndDropped) {
  TempDir dir;
  const ArtifactStoreOptions options = TestOptions(dir.Sub("db"), kLarge);
  const Sha256Digest key = KeyFor("blob"), control = KeyFor("control");
  constexpr size_t kSize = 1 << 20;
  {
    auto store = OpenOrDie(options);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Put(key, PayloadFor(key, kSize), {}).ok());
  }
  {
    // Move the value out of the memtable (and the WAL) into a blob file.
    RawDb raw(dir.Sub("db"));
    ASSERT_TRUE(raw.ok());
    raw.FlushAll();
  }
  std::vector<std::filesystem::path> blobs;
  for (const auto& file : std::filesystem::directory_iterator(dir.Sub("db"))) {
    if (file.path().extension() == ".blob") blobs.push_back(file.path());
  }
  ASSERT_EQ(blobs.size(), 1u);
  {
    const int fd = open(blobs[0].c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    const off_t size = lseek(fd, 0, SEEK_END);
    ASSERT_GT(size, static_cast<off_t>(kSize / 2));
    char byte;
    ASSERT_EQ(pread(fd, &byte, 1, size / 2), 1);
    byte ^= 0x01;
    ASSERT_EQ(pwrite(fd, &byte, 1, size / 2), 1);
    close(fd);
  }
  auto store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Put(control, "fine", {}).ok());
  ExpectDropped(*store, key, "blob file");
  EXPECT_EQ(store->Stats().corrupt_dropped, 1u);
  auto got = store->Get(control);
  ASSERT_TRUE(got.ok() && got->has_value());
}

}  // namespace
}  // namespace kiln
