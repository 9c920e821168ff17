// Crash safety: a child process putting artifacts in a loop is killed with
// SIGKILL at random moments, many times, on the same data dir. After each kill
// the store reopens, every entry in it verifies, and every Put the child
// acknowledged before dying is there.
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "cache/artifact_format.h"
#include "cache/artifact_store.h"
#include "gtest/gtest.h"
#include "tests/cache/cache_test_util.h"
#include "tests/cache/child_process.h"
#include "tests/cache/crash_payload.h"

namespace kiln {
namespace {

using cache_test::ChildProcess;
using cache_test::OpenOrDie;
using cache_test::TempDir;

constexpr int kRounds = 24;
constexpr absl::Duration kTestDeadline = absl::Seconds(120);
// Even rounds never evict (so every acknowledged put must be present); odd
// rounds run at a 2 MB budget (so evictions race with the kill too).
constexpr uint64_t kRoomy = uint64_t{1} << 30;
constexpr uint64_t kTight = 2 << 20;

// The indices the child acknowledged: complete lines only (a write of "i\n"
// to a pipe is atomic, but stop at anything unexpected).
std::vector<int> ParseAcks(const std::string& output) {
  std::vector<int> acks;
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    int i;
    if (!absl::SimpleAtoi(line, &i)) break;
    acks.push_back(i);
  }
  return acks;
}

TEST(ArtifactStoreCrashTest, SigkilledWriterLosesNothingAcknowledged) {
  TempDir dir;
  const std::string data_dir = dir.Sub("db");
  const unsigned seed = std::random_device()();
  RecordProperty("seed", std::to_string(seed));
  std::mt19937 rng(seed);
  // Three rounds in four wait for the writer's first acknowledgement, then
  // kill it within 300 ms, in the middle of puts; the fourth kills it up to
  // 300 ms after the start, often while it opens the store and replays the
  // previous round's WAL. (Waiting for the first put keeps the rounds useful
  // on a loaded machine, where starting may take longer than the delay.)
  std::uniform_int_distribution<int> kill_after_ms(0, 300);

  const absl::Time deadline = absl::Now() + kTestDeadline;
  int rounds = 0;
  int rounds_with_acks = 0;
  for (int round = 0; round < kRounds && absl::Now() < deadline; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round, ", seed ", seed));
    const uint64_t capacity = round % 2 == 0 ? kRoomy : kTight;
    std::unique_ptr<ChildProcess> child =
        ChildProcess::Spawn({KILN_CACHE_CRASH_WRITER, "write", data_dir,
                             absl::StrCat(round), absl::StrCat(capacity)});
    ASSERT_NE(child, nullptr);
    if (round % 4 != 3) child->ReadUntilLine(absl::Now() + absl::Seconds(20));
    child->ReadUntil(absl::Now() + absl::Milliseconds(kill_after_ms(rng)));
    child->Kill();
    const int status = child->Wait();
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << "the writer ended by itself (wait status " << status
        << "): see its stderr";
    const std::vector<int> acks = ParseAcks(child->output());
    ++rounds;
    if (!acks.empty()) ++rounds_with_acks;

    ArtifactStoreOptions options;
    options.data_dir = data_dir;
    options.capacity_bytes = capacity;
    auto store = OpenOrDie(options);
    ASSERT_NE(store, nullptr);

    // Everything acknowledged is there (in tight rounds, only the newest is
    // safe from eviction).
    const size_t first_checked =
        capacity == kRoomy || acks.empty() ? 0 : acks.size() - 1;
    for (size_t n = first_checked; n < acks.size(); ++n) {
      const Sha256Digest key = crash_test::Key(round, acks[n]);
      absl::StatusOr<std::optional<CachedArtifact>> got = store->Get(key);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_TRUE(got->has_value())
          << "acknowledged put " << acks[n] << " lost";
      ASSERT_EQ((*got)->payload,
                crash_test::Payload(key, crash_test::SizeOf(acks[n])));
    }

    // Everything present verifies, and the index matches it.
    const std::vector<EntryInfo> listed = store->List();
    uint64_t listed_bytes = 0;
    for (const EntryInfo& info : listed) {
      absl::StatusOr<std::optional<CachedArtifact>> got = store->Get(info.key);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_TRUE(got->has_value()) << DigestToHex(info.key);
      EXPECT_EQ(cache_format::EntryBytes((*got)->payload.size()), info.bytes);
      listed_bytes += info.bytes;
    }
    const CacheStats stats = store->Stats();
    EXPECT_EQ(stats.entries, listed.size());
    EXPECT_EQ(stats.bytes, listed_bytes);
    EXPECT_LE(stats.bytes, capacity);
    ASSERT_EQ(stats.corrupt_dropped, 0u);
  }
  // The kills must have hit running writers, not only starting ones.
  EXPECT_GE(rounds, kRounds / 2) << "ran out of time";
  EXPECT_GE(rounds_with_acks, rounds / 2);
  RecordProperty("rounds", rounds);
  RecordProperty("rounds_with_acks", rounds_with_acks);
}

}  // namespace
}  // namespace kiln
