// kilnd's in-memory copy of hot artifacts (--hot_cache_bytes) against a real
// daemon on loopback: hits are served from memory after the first, with the
// same bytes and exact stats; what the store evicts (Evict, EvictAll, its
// own LRU for --cache_bytes) is never served from memory; the budget holds;
// memory hits still move the store's LRU; a restart is still a hit. No
// timing assertions: the Stats counters say where a hit was served from.
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kiln/v1/service.grpc.pb.h"
#include "server/hot_artifacts.h"
#include "tests/server/daemon.h"

namespace kiln {
namespace {

using testing::Daemon;
using testing::Stats;
using testing::Request;

v1::CompileResponse Compile(v1::Kiln::Stub& stub, const std::string& graph) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::seconds(120));
  v1::CompileResponse resp;
  const grpc::Status s = stub.Compile(&ctx, Request(graph), &resp);
  EXPECT_TRUE(s.ok()) << graph << ": " << s.error_message();
  return resp;
}

grpc::Status Lookup(v1::Kiln::Stub& stub, const std::string& key,
                    v1::LookupResponse* found) {
  grpc::ClientContext ctx;
  v1::LookupRequest lookup;
  lookup.set_guard_key(key);
  return stub.Lookup(&ctx, lookup, found);
}

void Evict(v1::Kiln::Stub& stub, const std::string& key) {
  grpc::ClientContext ctx;
  v1::EvictRequest req;
  if (key.empty()) {
    req.set_all(true);
  } else {
    req.set_guard_key(key);
  }
  v1::EvictResponse resp;
  ASSERT_TRUE(stub.Evict(&ctx, req, &resp).ok());
}

std::vector<std::string> KeysLeastRecentFirst(v1::Kiln::Stub& stub) {
  grpc::ClientContext ctx;
  v1::ListEntriesResponse list;
  EXPECT_TRUE(stub.ListEntries(&ctx, v1::ListEntriesRequest(), &list).ok());
  std::vector<std::string> keys;
  for (const auto& e : list.entries()) keys.push_back(e.guard_key());
  return keys;
}

class HotCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("kiln_hot_cache_test_", getpid(), "_", rand());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::unique_ptr<Daemon> Start(const std::vector<std::string>& flags = {}) {
    auto d = std::make_unique<Daemon>((dir_ / "data").string(),
                                      (dir_ / "port").string(), flags);
    EXPECT_GT(d->port(), 0);
    return d;
  }
  std::filesystem::path dir_;
};

TEST_F(HotCacheTest, HitsAfterTheFirstAreServedFromMemoryWithExactStats) {
  auto d = Start();
  auto stub = d->Stub();
  const v1::CompileResponse compiled = Compile(*stub, "chain10.json");
  ASSERT_EQ(compiled.outcome(), v1::CompileResponse::COMPILED);
  const std::string artifact = compiled.artifact().SerializeAsString();
  const double compile_seconds = compiled.compile_seconds();

  v1::LookupResponse found;
  ASSERT_TRUE(Lookup(*stub, compiled.guard_key(), &found).ok());
  EXPECT_EQ(found.artifact().SerializeAsString(), artifact);
  v1::Stats s = Stats(*stub);
  EXPECT_EQ(s.hot_hits(), 0u);  // read from the store, kept in memory
  EXPECT_EQ(s.hot_entries(), 1u);
  EXPECT_EQ(s.hot_bytes(), HotArtifacts::ChargedBytes(artifact.size()));

  for (int i = 0; i < 3; ++i) {
    v1::LookupResponse again;
    ASSERT_TRUE(Lookup(*stub, compiled.guard_key(), &again).ok());
    EXPECT_EQ(again.artifact().SerializeAsString(), artifact);
  }
  const v1::CompileResponse hit = Compile(*stub, "chain10.json");
  EXPECT_EQ(hit.outcome(), v1::CompileResponse::HIT);
  EXPECT_EQ(hit.guard_key(), compiled.guard_key());
  EXPECT_EQ(hit.artifact().SerializeAsString(), artifact);
  EXPECT_EQ(hit.compile_seconds(), compile_seconds);

  s = Stats(*stub);
  EXPECT_EQ(s.hits(), 5u);      // 4 Lookups + 1 Compile
  EXPECT_EQ(s.hot_hits(), 4u);  // all but the first
  EXPECT_EQ(s.misses(), 1u);
  EXPECT_EQ(s.compiles(), 1u);
  EXPECT_EQ(s.hot_entries(), 1u);
  EXPECT_NEAR(s.compile_seconds_saved(), 5 * compile_seconds, 1e-9);
}

TEST_F(HotCacheTest, MemoryHitsMoveTheStoresLruAndItPersists) {
  std::string a, b;
  {
    auto d = Start();
    auto stub = d->Stub();
    a = Compile(*stub, "chain10.json").guard_key();
    b = Compile(*stub, "softmax.json").guard_key();
    v1::LookupResponse found;
    ASSERT_TRUE(Lookup(*stub, a, &found).ok());  // from the store
    ASSERT_TRUE(Lookup(*stub, b, &found).ok());
    ASSERT_TRUE(Lookup(*stub, a, &found).ok());  // from memory
    EXPECT_EQ(Stats(*stub).hot_hits(), 1u);
    EXPECT_EQ(KeysLeastRecentFirst(*stub), (std::vector<std::string>{b, a}));
    EXPECT_EQ(d->Stop(), 0);
  }
  auto d = Start();
  auto stub = d->Stub();
  EXPECT_EQ(KeysLeastRecentFirst(*stub), (std::vector<std::string>{b, a}));
}

TEST_F(HotCacheTest, EvictedEntriesAreNotServedFromMemory) {
  auto d = Start();
  auto stub = d->Stub();
  const std::string a = Compile(*stub, "chain10.json").guard_key();
  const std::string b = Compile(*stub, "softmax.json").guard_key();
  v1::LookupResponse found;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(Lookup(*stub, a, &found).ok());
    ASSERT_TRUE(Lookup(*stub, b, &found).ok());
  }
  ASSERT_EQ(Stats(*stub).hot_entries(), 2u);

  Evict(*stub, a);
  EXPECT_EQ(Lookup(*stub, a, &found).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(Lookup(*stub, b, &found).ok());
  EXPECT_EQ(Stats(*stub).hot_entries(), 1u);
  EXPECT_EQ(Compile(*stub, "chain10.json").outcome(),
            v1::CompileResponse::COMPILED);

  Evict(*stub, "");  // all
  EXPECT_EQ(Lookup(*stub, a, &found).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Lookup(*stub, b, &found).error_code(), grpc::StatusCode::NOT_FOUND);
  const v1::Stats s = Stats(*stub);
  EXPECT_EQ(s.hot_entries(), 0u);
  EXPECT_EQ(s.hot_bytes(), 0u);
  EXPECT_EQ(s.entries(), 0u);
  EXPECT_EQ(Compile(*stub, "softmax.json").outcome(),
            v1::CompileResponse::COMPILED);
}

// The store's own LRU eviction (--cache_bytes) happens inside a Put, without
// the service being told: the entry must still not be served from memory.
TEST_F(HotCacheTest, EntriesTheStoreEvictsForItsBudgetAreNotServed) {
  uint64_t largest = 0, smallest = ~uint64_t{0};
  {
    auto d = Start();
    auto stub = d->Stub();
    Compile(*stub, "chain10.json");
    Compile(*stub, "softmax.json");
    grpc::ClientContext ctx;
    v1::ListEntriesResponse list;
    ASSERT_TRUE(stub->ListEntries(&ctx, v1::ListEntriesRequest(), &list).ok());
    ASSERT_EQ(list.entries_size(), 2);
    for (const auto& e : list.entries()) {
      largest = std::max<uint64_t>(largest, e.bytes());
      smallest = std::min<uint64_t>(smallest, e.bytes());
    }
    Evict(*stub, "");
  }
  // Room for either entry alone, never for both.
  auto d = Start({absl::StrCat("--cache_bytes=", largest + smallest / 2)});
  auto stub = d->Stub();
  const std::string a = Compile(*stub, "chain10.json").guard_key();
  v1::LookupResponse found;
  ASSERT_TRUE(Lookup(*stub, a, &found).ok());
  ASSERT_TRUE(Lookup(*stub, a, &found).ok());
  ASSERT_EQ(Stats(*stub).hot_hits(), 1u);
  Compile(*stub, "softmax.json");  // the store evicts a to fit
  EXPECT_EQ(Lookup(*stub, a, &found).error_code(), grpc::StatusCode::NOT_FOUND);
  const v1::Stats s = Stats(*stub);
  EXPECT_EQ(s.entries(), 1u);
  EXPECT_EQ(s.hot_hits(), 1u);
}

TEST_F(HotCacheTest, TheMemoryBudgetIsRespected) {
  // Learn each artifact's charge with an ample budget.
  const std::vector<std::string> graphs = {"chain10.json", "softmax.json",
                                           "layer_norm.json"};
  std::vector<std::string> keys;
  std::vector<uint64_t> charged;
  {
    auto d = Start();
    auto stub = d->Stub();
    for (const std::string& g : graphs) {
      keys.push_back(Compile(*stub, g).guard_key());
      const uint64_t before = Stats(*stub).hot_bytes();
      v1::LookupResponse found;
      ASSERT_TRUE(Lookup(*stub, keys.back(), &found).ok());
      charged.push_back(Stats(*stub).hot_bytes() - before);
      EXPECT_EQ(charged.back(),
                HotArtifacts::ChargedBytes(
                    found.artifact().SerializeAsString().size()));
    }
    EXPECT_EQ(d->Stop(), 0);
  }
  // Room for the first two, not for all three.
  const uint64_t budget = charged[0] + charged[1];
  auto d = Start({absl::StrCat("--hot_cache_bytes=", budget)});
  auto stub = d->Stub();
  v1::LookupResponse found;
  for (int round = 0; round < 2; ++round) {
    for (const std::string& key : keys) {
      ASSERT_TRUE(Lookup(*stub, key, &found).ok());  // always served
      const v1::Stats s = Stats(*stub);
      EXPECT_LE(s.hot_bytes(), budget);
      EXPECT_EQ(s.hot_capacity_bytes(), budget);
    }
  }
  v1::Stats s = Stats(*stub);
  EXPECT_LT(s.hot_entries(), 3u);
  EXPECT_EQ(s.hits(), 6u);
  // Cycling over more than fits evicts each entry before its next use.
  EXPECT_EQ(s.hot_hits(), 0u);
  // The most recent entry is kept: it is served from memory.
  ASSERT_TRUE(Lookup(*stub, keys[2], &found).ok());
  EXPECT_EQ(Stats(*stub).hot_hits(), 1u);
  EXPECT_EQ(d->Stop(), 0);

  // An artifact over the whole budget is never kept; hits still work.
  d = Start({"--hot_cache_bytes=1"});
  stub = d->Stub();
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(Lookup(*stub, keys[0], &found).ok());
  s = Stats(*stub);
  EXPECT_EQ(s.hits(), 2u);
  EXPECT_EQ(s.hot_hits(), 0u);
  EXPECT_EQ(s.hot_entries(), 0u);
  EXPECT_EQ(s.hot_bytes(), 0u);
}

TEST_F(HotCacheTest, RestartIsStillAHit) {
  std::string key, artifact;
  {
    auto d = Start();
    auto stub = d->Stub();
    const v1::CompileResponse compiled = Compile(*stub, "layer_norm.json");
    key = compiled.guard_key();
    artifact = compiled.artifact().SerializeAsString();
    v1::LookupResponse found;
    ASSERT_TRUE(Lookup(*stub, key, &found).ok());
    ASSERT_TRUE(Lookup(*stub, key, &found).ok());
    EXPECT_EQ(Stats(*stub).hot_hits(), 1u);
    EXPECT_EQ(d->Stop(), 0);
  }
  auto d = Start();
  auto stub = d->Stub();
  EXPECT_EQ(Stats(*stub).hot_entries(), 0u);  // memory starts empty
  v1::LookupResponse found;
  ASSERT_TRUE(Lookup(*stub, key, &found).ok());
  EXPECT_EQ(found.artifact().SerializeAsString(), artifact);
  const v1::CompileResponse hit = Compile(*stub, "layer_norm.json");
  EXPECT_EQ(hit.outcome(), v1::CompileResponse::HIT);
  EXPECT_EQ(hit.artifact().SerializeAsString(), artifact);
  const v1::Stats s = Stats(*stub);
  EXPECT_EQ(s.hits(), 2u);
  EXPECT_EQ(s.hot_hits(), 1u);
  EXPECT_EQ(s.compiles(), 0u);
}

TEST_F(HotCacheTest, MalformedLookupsAreRejected) {
  auto d = Start();
  auto stub = d->Stub();
  v1::LookupResponse found;
  EXPECT_EQ(Lookup(*stub, "short", &found).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Lookup(*stub, std::string(32, 'k'), &found).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Stats(*stub).misses(), 1u);
}

}  // namespace
}  // namespace kiln
