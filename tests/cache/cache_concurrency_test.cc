// Concurrency: threads doing puts, gets, deletes, flushes and evictions at
// once. Nothing acknowledged is lost (unless counted as evicted or deleted),
// nothing corrupt is returned, and the counters add up exactly.
#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
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

// Keys are named by (writer, index); the payload size is a function of the
// index, so any reader can check any value it gets.
Sha256Digest K(int writer, int i) {
  return KeyFor(absl::StrCat(writer, "/", i));
}
size_t SizeOf(int i) { return i % 10 == 0 ? 50000 + i : 200 + 37 * i; }

constexpr int kWriters = 2;
constexpr int kPerWriter = 150;
constexpr int kReaderGets = 1500;
// Every thread also stops at this deadline, so a livelock cannot hang ctest.
constexpr absl::Duration kDeadline = absl::Seconds(60);

struct Outcome {
  std::atomic<uint64_t> gets{0};
  std::atomic<uint64_t> bad_values{0};
  std::atomic<uint64_t> errors{0};
};

void Writer(ArtifactStore& store, int writer, absl::Time deadline,
            Outcome& outcome) {
  for (int i = 0; i < kPerWriter && absl::Now() < deadline; ++i) {
    const Sha256Digest key = K(writer, i);
    const absl::Status status =
        store.Put(key, PayloadFor(key, SizeOf(i)), {.compile_seconds = 1});
    if (!status.ok()) {
      ADD_FAILURE() << status;
      ++outcome.errors;
    }
  }
}

void Reader(ArtifactStore& store, int seed, absl::Time deadline,
            Outcome& outcome) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> writer_of(0, kWriters - 1);
  std::uniform_int_distribution<int> index_of(0, kPerWriter - 1);
  for (int n = 0; n < kReaderGets && absl::Now() < deadline; ++n) {
    const int i = index_of(rng);
    const Sha256Digest key = K(writer_of(rng), i);
    absl::StatusOr<std::optional<CachedArtifact>> got = store.Get(key);
    ++outcome.gets;
    if (!got.ok()) {
      ADD_FAILURE() << got.status();
      ++outcome.errors;
      continue;
    }
    if (got->has_value() && (*got)->payload != PayloadFor(key, SizeOf(i))) {
      ++outcome.bad_values;
    }
  }
}

TEST(ArtifactStoreConcurrencyTest, ConcurrentPutsAndGetsLoseNothing) {
  TempDir dir;
  ArtifactStoreOptions options = TestOptions(dir.Sub("db"), uint64_t{1} << 30);
  options.access_flush_batch = 16;  // many background access flushes
  options.flush_interval = absl::Milliseconds(5);
  auto store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  const absl::Time deadline = absl::Now() + kDeadline;
  Outcome outcome;
  {
    std::vector<std::thread> threads;
    for (int w = 0; w < kWriters; ++w) {
      threads.emplace_back([&, w] { Writer(*store, w, deadline, outcome); });
    }
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back(
          [&, r] { Reader(*store, 100 + r, deadline, outcome); });
    }
    for (std::thread& thread : threads) thread.join();
  }
  ASSERT_LT(absl::Now(), deadline) << "ran out of time; counts are partial";
  EXPECT_EQ(outcome.bad_values.load(), 0u);
  EXPECT_EQ(outcome.errors.load(), 0u);
  const CacheStats stats = store->Stats();
  EXPECT_EQ(stats.puts, uint64_t{kWriters * kPerWriter});
  EXPECT_EQ(stats.entries, uint64_t{kWriters * kPerWriter});
  EXPECT_EQ(stats.hits + stats.misses, outcome.gets.load());
  EXPECT_EQ(stats.corrupt_dropped, 0u);
  EXPECT_EQ(stats.evictions, 0u);
  EXPECT_DOUBLE_EQ(stats.compile_seconds_saved,
                   static_cast<double>(stats.hits));

  // Every acknowledged put is there, now and after a reopen.
  for (int pass = 0; pass < 2; ++pass) {
    for (int w = 0; w < kWriters; ++w) {
      for (int i = 0; i < kPerWriter; ++i) {
        auto got = store->Get(K(w, i));
        ASSERT_TRUE(got.ok()) << got.status();
        ASSERT_TRUE(got->has_value()) << "lost " << w << "/" << i;
        ASSERT_EQ((*got)->payload, PayloadFor(K(w, i), SizeOf(i)));
      }
    }
    store.reset();
    store = OpenOrDie(options);
    ASSERT_NE(store, nullptr);
  }
}

TEST(ArtifactStoreConcurrencyTest, PutsGetsDeletesAndEvictionsAddUp) {
  TempDir dir;
  // About 15 of the ~5-50 KB entries fit: most puts evict.
  ArtifactStoreOptions options = TestOptions(dir.Sub("db"), 300000);
  options.access_flush_batch = 8;
  options.flush_interval = absl::Milliseconds(5);
  auto store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  const absl::Time deadline = absl::Now() + kDeadline;
  Outcome outcome;
  std::atomic<uint64_t> budget_violations{0};
  {
    std::vector<std::thread> threads;
    for (int w = 0; w < kWriters; ++w) {
      threads.emplace_back([&, w] { Writer(*store, w, deadline, outcome); });
    }
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back(
          [&, r] { Reader(*store, 200 + r, deadline, outcome); });
    }
    // Deletes, an EvictAll, flushes, and budget checks.
    threads.emplace_back([&] {
      std::mt19937 rng(300);
      std::uniform_int_distribution<int> index_of(0, kPerWriter - 1);
      for (int n = 0; n < 300 && absl::Now() < deadline; ++n) {
        if (!store->Delete(K(n % kWriters, index_of(rng))).ok()) {
          ++outcome.errors;
        }
        if (n == 150 && !store->EvictAll().ok()) ++outcome.errors;
        if (n % 10 == 0 && !store->Flush().ok()) ++outcome.errors;
        if (store->Stats().bytes > options.capacity_bytes) {
          ++budget_violations;
        }
      }
    });
    for (std::thread& thread : threads) thread.join();
  }
  ASSERT_LT(absl::Now(), deadline) << "ran out of time; counts are partial";
  EXPECT_EQ(outcome.bad_values.load(), 0u);
  EXPECT_EQ(outcome.errors.load(), 0u);
  EXPECT_EQ(budget_violations.load(), 0u);

  const CacheStats stats = store->Stats();
  EXPECT_LE(stats.bytes, options.capacity_bytes);
  EXPECT_GT(stats.evictions, 0u);
  // Each key is put once: every put is still there, evicted or deleted.
  EXPECT_EQ(stats.puts, uint64_t{kWriters * kPerWriter});
  EXPECT_EQ(stats.entries + stats.evictions + stats.deletes, stats.puts);
  EXPECT_EQ(stats.hits + stats.misses, outcome.gets.load());
  EXPECT_EQ(stats.corrupt_dropped, 0u);

  // The index agrees with the database: every listed entry reads back.
  const std::vector<EntryInfo> listed = store->List();
  EXPECT_EQ(listed.size(), stats.entries);
  uint64_t listed_bytes = 0;
  for (const EntryInfo& info : listed) {
    listed_bytes += info.bytes;
    auto got = store->Get(info.key);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(got->has_value());
    EXPECT_EQ(cache_format::EntryBytes((*got)->payload.size()), info.bytes);
  }
  EXPECT_EQ(listed_bytes, stats.bytes);

  // And the same entries come back after a reopen.
  store.reset();
  store = OpenOrDie(options);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Stats().entries, listed.size());
  for (const EntryInfo& info : listed) EXPECT_TRUE(store->Contains(info.key));
}

}  // namespace
}  // namespace kiln
