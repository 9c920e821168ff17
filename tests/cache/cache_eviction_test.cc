// Size cap and LRU eviction: order, budget under overfill, recency across
// restarts, capacity lowered between opens.
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
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
using cache_test::TempDir;
using cache_test::TestOptions;

constexpr size_t kPayload = 1000;
const uint64_t kEntry = cache_format::EntryBytes(kPayload);

Sha256Digest K(int i) { return KeyFor(absl::StrCat("key", i)); }

absl::Status PutN(ArtifactStore& store, int i) {
  return store.Put(K(i), PayloadFor(K(i), kPayload), {.compile_seconds = 1});
}

std::vector<int> Present(const ArtifactStore& store, int universe) {
  std::vector<int> present;
  for (int i = 0; i < universe; ++i) {
    if (store.Contains(K(i))) present.push_back(i);
  }
  return present;
}

TEST(ArtifactStoreEvictionTest, EvictsTheLeastRecentlyUsedFirst) {
  TempDir dir;
  auto store = OpenOrDie(TestOptions(dir.Sub("db"), 4 * kEntry));
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(PutN(*store, i).ok());
  EXPECT_EQ(store->Stats().evictions, 0u);
  EXPECT_EQ(store->Stats().bytes, 4 * kEntry);

  auto hit = store->Get(K(0));  // order, oldest first: 1 2 3 0
  ASSERT_TRUE(hit.ok() && hit->has_value());
  ASSERT_TRUE(PutN(*store, 4).ok());  // evicts 1 -> 2 3 0 4
  EXPECT_EQ(Present(*store, 6), (std::vector<int>{0, 2, 3, 4}));
  EXPECT_EQ(store->Stats().evictions, 1u);

  hit = store->Get(K(2));  // 3 0 4 2
  ASSERT_TRUE(hit.ok() && hit->has_value());
  ASSERT_TRUE(PutN(*store, 5).ok());  // evicts 3 -> 0 4 2 5
  EXPECT_EQ(Present(*store, 6), (std::vector<int>{0, 2, 4, 5}));

  // A miss does not change recency; a put of an existing key does.
  ASSERT_TRUE(store->Get(K(3)).ok());
  ASSERT_TRUE(PutN(*store, 0).ok());  // 4 2 5 0, nothing evicted
  EXPECT_EQ(store->Stats().evictions, 2u);
  ASSERT_TRUE(PutN(*store, 6).ok());  // evicts 4 -> 2 5 0 6
  EXPECT_EQ(Present(*store, 7), (std::vector<int>{0, 2, 5, 6}));
  EXPECT_EQ(store->Stats().evictions, 3u);
  EXPECT_EQ(store->Stats().bytes, 4 * kEntry);
}

TEST(ArtifactStoreEvictionTest, LargeEntryEvictsAsManyAsNeeded) {
  TempDir dir;
  auto store = OpenOrDie(TestOptions(dir.Sub("db"), 4 * kEntry));
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(PutN(*store, i).ok());
  // Needs the room of three small entries (and a bit).
  const Sha256Digest big = KeyFor("big");
  ASSERT_TRUE(store->Put(big, std::string(2 * kEntry + 500, 'b'), {}).ok());
  EXPECT_EQ(Present(*store, 4), (std::vector<int>{3}));
  EXPECT_TRUE(store->Contains(big));
  EXPECT_EQ(store->Stats().evictions, 3u);
  EXPECT_LE(store->Stats().bytes, 4 * kEntry);
}

TEST(ArtifactStoreEvictionTest, ReplacingAnEntryNeverEvictsItself) {
  TempDir dir;
  auto store = OpenOrDie(TestOptions(dir.Sub("db"), 2 * kEntry));
  ASSERT_NE(store, nullptr);
  const Sha256Digest a = KeyFor("a"), b = KeyFor("b");
  ASSERT_TRUE(store->Put(a, std::string(kPayload, 'a'), {}).ok());
  ASSERT_TRUE(store->Put(b, std::string(kPayload, 'b'), {}).ok());
  // a is the least recent; growing it must evict b, not a.
  ASSERT_TRUE(store->Put(a, std::string(kPayload + 500, 'A'), {}).ok());
  EXPECT_TRUE(store->Contains(a));
  EXPECT_FALSE(store->Contains(b));
  auto got = store->Get(a);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->payload, std::string(kPayload + 500, 'A'));
}

TEST(ArtifactStoreEvictionTest,
     BudgetHoldsAndSurvivorsAreTheNewestUnderOverfill) {
  TempDir dir;
  const uint64_t capacity = 1 << 20;
  auto store = OpenOrDie(TestOptions(dir.Sub("db"), capacity));
  ASSERT_NE(store, nullptr);
  std::mt19937 rng(7);
  std::uniform_int_distribution<size_t> size_of(1, 60000);
  std::vector<size_t> sizes;
  constexpr int kPuts = 200;  // about 6 MB through a 1 MB budget
  for (int i = 0; i < kPuts; ++i) {
    sizes.push_back(size_of(rng));
    ASSERT_TRUE(store->Put(K(i), PayloadFor(K(i), sizes.back()), {}).ok());
    const CacheStats stats = store->Stats();
    ASSERT_LE(stats.bytes, capacity) << "after put " << i;
    ASSERT_EQ(stats.entries + stats.evictions, static_cast<uint64_t>(i + 1));
  }
  // With puts only, LRU order is put order: the survivors are exactly the
  // longest suffix that fits.
  uint64_t suffix_bytes = 0;
  int first_survivor = kPuts;
  while (first_survivor > 0 &&
         suffix_bytes + cache_format::EntryBytes(sizes[first_survivor - 1]) <=
             capacity) {
    --first_survivor;
    suffix_bytes += cache_format::EntryBytes(sizes[first_survivor]);
  }
  std::vector<int> expected;
  for (int i = first_survivor; i < kPuts; ++i) expected.push_back(i);
  EXPECT_EQ(Present(*store, kPuts), expected);
  EXPECT_EQ(store->Stats().bytes, suffix_bytes);

  uint64_t listed_bytes = 0;
  for (const EntryInfo& info : store->List()) listed_bytes += info.bytes;
  EXPECT_EQ(listed_bytes, suffix_bytes);
  for (int i = first_survivor; i < kPuts; ++i) {
    auto got = store->Get(K(i));
    ASSERT_TRUE(got.ok() && got->has_value()) << i;
    EXPECT_EQ((*got)->payload, PayloadFor(K(i), sizes[i]));
  }
}

TEST(ArtifactStoreEvictionTest, RecencySurvivesReopen) {
  TempDir dir;
  ArtifactStoreOptions options = TestOptions(dir.Sub("db"), 4 * kEntry);
  // Hits are only persisted by the close (not by a timer or batch) here.
  options.flush_interval = absl::Hours(1);
  options.access_flush_batch = 1000000;
  {
    auto store = OpenOrDie(options);
    ASSERT_NE(store, nullptr);
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(PutN(*store, i).ok());
    ASSERT_TRUE(store->Get(K(0)).ok());
    ASSERT_TRUE(store->Get(K(1)).ok());  // order: 2 3 0 1
  }
  auto store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(PutN(*store, 4).ok());
  ASSERT_TRUE(PutN(*store, 5).ok());
  EXPECT_EQ(Present(*store, 6), (std::vector<int>{0, 1, 4, 5}));
}

TEST(ArtifactStoreEvictionTest, LoweredCapacityEvictsAtOpen) {
  TempDir dir;
  {
    auto store = OpenOrDie(TestOptions(dir.Sub("db"), 100 * kEntry));
    ASSERT_NE(store, nullptr);
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(PutN(*store, i).ok());
    ASSERT_TRUE(store->Get(K(2)).ok());  // keep 2 among the most recent
  }
  auto store = OpenOrDie(TestOptions(dir.Sub("db"), 3 * kEntry));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(Present(*store, 10), (std::vector<int>{2, 8, 9}));
  const CacheStats stats = store->Stats();
  EXPECT_EQ(stats.entries, 3u);
  EXPECT_EQ(stats.evictions, 7u);
  EXPECT_EQ(stats.bytes, 3 * kEntry);
}

TEST(ArtifactStoreEvictionTest, ReclaimSpaceBringsTheDiskBackToTheLiveData) {
  TempDir dir;
  constexpr uint64_t kCapacity = 16 << 20;
  ArtifactStoreOptions options = TestOptions(dir.Sub("db"), kCapacity);
  options.flush_interval = absl::Hours(1);  // no automatic reclaim
  auto store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  // 64 MB of incompressible 100 KB artifacts through a 16 MB budget.
  for (int i = 0; i < 640; ++i) {
    ASSERT_TRUE(store->Put(K(i), PayloadFor(K(i), 100 << 10), {}).ok());
  }
  const CacheStats before = store->Stats();
  ASSERT_LE(before.bytes, kCapacity);
  ASSERT_TRUE(store->ReclaimSpace().ok());
  // RocksDB deletes obsolete files right after the compaction; allow it a
  // bounded moment. What remains beyond the live bytes: the current WAL,
  // the manifest, RocksDB's LOG and SST indexes, a few MB.
  const uint64_t limit = before.bytes + (8 << 20);
  CacheStats after = store->Stats();
  for (int wait = 0; wait < 500 && after.disk_bytes > limit; ++wait) {
    absl::SleepFor(absl::Milliseconds(10));
    after = store->Stats();
  }
  EXPECT_LE(after.disk_bytes, limit)
      << "before the reclaim: " << before.disk_bytes << " bytes on disk";
  EXPECT_EQ(after.bytes, before.bytes);
  for (const EntryInfo& info : store->List()) {
    auto got = store->Get(info.key);
    ASSERT_TRUE(got.ok() && got->has_value());
  }
}

}  // namespace
}  // namespace kiln
