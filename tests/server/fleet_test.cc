// A fleet of kilnd replicas sharing a Redis tier (issue 19), end to end: a
// real redis-server started by the test on a Unix socket in a temp dir,
// real kilnd processes (--shared_cache=unix:...), real compiles.
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cache/artifact_format.h"
#include "cache/shared_tier.h"
#include "client/kiln_client.h"
#include "gtest/gtest.h"
#include "tests/server/daemon.h"
#include "tests/unit/example_graphs.h"

extern char** environ;

namespace kiln {
namespace {

using testing::Daemon;
using testing::Call;
using testing::Stats;
using testing::LayerNormRequest;
using testing::Request;

std::string RedisServerPath() {
  for (const char* p : {"/usr/bin/redis-server", "/usr/local/bin/redis-server",
                        "/usr/sbin/redis-server"})
    if (access(p, X_OK) == 0) return p;
  return "";
}

// redis-server on a Unix socket only (--port 0: no TCP), no persistence.
class RedisProcess {
 public:
  RedisProcess(std::string socket, std::string log)
      : socket_(std::move(socket)), log_(std::move(log)) {}
  ~RedisProcess() { Kill(); }
  // Starts it and waits (up to 10 s) until it answers PING.
  bool Start() {
    std::filesystem::remove(socket_);
    std::vector<std::string> args = {
        RedisServerPath(), "--port", "0", "--unixsocket", socket_, "--save", "",
        "--appendonly", "no", "--logfile", log_, "--daemonize", "no",
        // DEBUG SLEEP: a Redis that hangs.
        "--enable-debug-command", "yes"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), environ) !=
        0) {
      pid_ = -1;
      return false;
    }
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (absl::Now() < until) {
      if (Command({"PING"}) == "PONG") return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  std::string address() const { return "unix:" + socket_; }
  // One command on a fresh connection: the string or status reply, "(nil)",
  // "(int N)", "(error ...)" or "(no connection)".
  std::string Command(const std::vector<std::string>& args) const {
    redisContext* c = redisConnectUnix(socket_.c_str());
    if (!c || c->err) {
      if (c) redisFree(c);
      return "(no connection)";
    }
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const std::string& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(redisCommandArgv(
        c, static_cast<int>(argv.size()), argv.data(), lens.data()));
    std::string out = "(no connection)";
    if (r) {
      switch (r->type) {
        case REDIS_REPLY_STRING:
        case REDIS_REPLY_STATUS:
          out.assign(r->str, r->len);
          break;
        case REDIS_REPLY_NIL:
          out = "(nil)";
          break;
        case REDIS_REPLY_INTEGER:
          out = absl::StrCat("(int ", r->integer, ")");
          break;
        case REDIS_REPLY_ERROR:
          out = absl::StrCat("(error ", std::string(r->str, r->len), ")");
          break;
        default:
          out = "(other)";
      }
      freeReplyObject(r);
    }
    redisFree(c);
    return out;
  }

 private:
  std::string socket_, log_;
  pid_t pid_ = -1;
};

// The store key (request key + compiler identity) as 64 hex digits.
std::string StoreKeyHex(v1::Kiln::Stub& stub, const v1::CompileRequest& req) {
  grpc::ClientContext ctx;
  v1::ExplainKeyResponse resp;
  EXPECT_TRUE(stub.ExplainKey(&ctx, req, &resp).ok());
  Sha256Digest key{};
  EXPECT_EQ(resp.store_key().size(), key.size());
  std::memcpy(key.data(), resp.store_key().data(), key.size());
  return DigestToHex(key);
}

Sha256Digest FromHex(const std::string& hex) {
  Sha256Digest key{};
  for (size_t i = 0; i < key.size(); ++i)
    key[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return key;
}

class FleetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (RedisServerPath().empty()) {
      GTEST_SKIP() << "redis-server is not installed (deploy/install-deps.sh "
                      "installs it): the fleet tests need a real Redis";
    }
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("kiln_fleet_", getpid(), "_", rand());
    std::filesystem::create_directories(dir_);
    redis_ = std::make_unique<RedisProcess>((dir_ / "redis.sock").string(),
                                            (dir_ / "redis.log").string());
    ASSERT_TRUE(redis_->Start()) << "redis-server did not start";
  }
  void TearDown() override {
    replicas_.clear();
    redis_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  // Starts replica i with the shared tier and `extra` flags.
  Daemon& StartReplica(int i, std::vector<std::string> extra = {}) {
    extra.insert(extra.begin(), "--shared_cache=" + redis_->address());
    auto d = std::make_unique<Daemon>((dir_ / absl::StrCat("data", i)).string(),
                                      (dir_ / absl::StrCat("port", i)).string(),
                                      extra);
    EXPECT_GT(d->port(), 0);
    if (static_cast<int>(replicas_.size()) <= i) replicas_.resize(i + 1);
    replicas_[i] = std::move(d);
    return *replicas_[i];
  }
  std::filesystem::path dir_;
  std::unique_ptr<RedisProcess> redis_;
  std::vector<std::unique_ptr<Daemon>> replicas_;
};

// 3 replicas, 48 concurrent compiles of one graph spread over them: one
// compile fleet-wide, the same artifact bytes everywhere.
TEST_F(FleetTest, ThreeReplicasCompileOneGraphOnce) {
  std::vector<std::unique_ptr<v1::Kiln::Stub>> stubs;
  for (int i = 0; i < 3; ++i)
    // The compile is slow enough that all 48 requests arrive while it runs.
    stubs.push_back(StartReplica(i, {"--test_compile_delay_ms=700"}).Stub());
  const v1::CompileRequest req = Request("softmax.json");
  constexpr int kClients = 48;
  std::vector<v1::CompileResponse> resp(kClients);
  std::vector<grpc::Status> status(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back(
        [&, i] { status[i] = Call(*stubs[i % 3], req, &resp[i]); });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kClients; ++i) {
    ASSERT_TRUE(status[i].ok()) << i << ": " << status[i].error_message();
    EXPECT_EQ(resp[i].artifact().SerializeAsString(),
              resp[0].artifact().SerializeAsString())
        << "client " << i;
  }
  uint64_t compiles = 0, shared_hits = 0, waits = 0;
  for (auto& stub : stubs) {
    const v1::Stats s = Stats(*stub);
    EXPECT_TRUE(s.shared_cache_up());
    compiles += s.compiles();
    shared_hits += s.shared_hits();
    waits += s.shared_lease_waits();
  }
  EXPECT_EQ(compiles, 1u);
  EXPECT_EQ(shared_hits, 2u);  // the two replicas that did not compile
  // The replicas that found the lease taken (a replica whose first request
  // came after the publish fetched without waiting).
  EXPECT_LE(waits, 2u);
  // Every replica now holds it locally, byte for byte.
  for (auto& stub : stubs) {
    v1::CompileResponse again;
    ASSERT_TRUE(Call(*stub, req, &again).ok());
    EXPECT_EQ(again.outcome(), v1::CompileResponse::HIT);
    EXPECT_EQ(again.artifact().SerializeAsString(),
              resp[0].artifact().SerializeAsString());
  }
}

// The lease holder dies mid-compile: another replica takes the lease over
// once it expires, compiles once, and every caller gets the artifact.
TEST_F(FleetTest, DeadLeaseHolderIsReplacedAfterExpiry) {
  constexpr char kLease[] = "--shared_cache_lease_ms=2500";
  auto holder =
      StartReplica(0, {kLease, "--test_compile_delay_ms=60000"}).Stub();
  std::vector<std::unique_ptr<v1::Kiln::Stub>> others;
  for (int i = 1; i <= 2; ++i)
    others.push_back(StartReplica(i, {kLease}).Stub());
  const v1::CompileRequest req = Request("layer_norm.json");
  std::thread doomed([&] {
    v1::CompileResponse resp;
    (void)Call(*holder, req, &resp);  // fails when its kilnd is killed
  });
  const absl::Time until = absl::Now() + absl::Seconds(20);
  while (absl::Now() < until && Stats(*holder).compiles() == 0)
    absl::SleepFor(absl::Milliseconds(20));
  ASSERT_EQ(Stats(*holder).compiles(), 1u) << "the holder never compiled";
  const std::string lease_key =
      absl::StrCat("kiln:{", StoreKeyHex(*holder, req), "}:l");
  EXPECT_NE(redis_->Command({"GET", lease_key}), "(nil)");
  replicas_[0].reset();  // SIGKILL mid-compile, the lease still held
  holder.reset();
  doomed.join();

  constexpr int kClients = 8;
  std::vector<v1::CompileResponse> resp(kClients);
  std::vector<grpc::Status> status(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back(
        [&, i] { status[i] = Call(*others[i % 2], req, &resp[i]); });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kClients; ++i) {
    ASSERT_TRUE(status[i].ok()) << status[i].error_message();
    EXPECT_EQ(resp[i].artifact().SerializeAsString(),
              resp[0].artifact().SerializeAsString());
  }
  uint64_t compiles = 0, takeovers = 0;
  for (auto& stub : others) {
    const v1::Stats s = Stats(*stub);
    compiles += s.compiles();
    takeovers += s.shared_takeovers();
  }
  EXPECT_EQ(compiles, 1u);
  EXPECT_EQ(takeovers, 1u);
  EXPECT_EQ(redis_->Command({"GET", lease_key}), "(nil)");  // released
}

// Redis killed and restarted under load: every request is served (locally
// while it is down), and afterwards the shared tier fills again.
TEST_F(FleetTest, RedisRestartUnderLoadFailsNoRequest) {
  std::vector<std::unique_ptr<v1::Kiln::Stub>> stubs;
  for (int i = 0; i < 2; ++i)
    stubs.push_back(StartReplica(i, {"--shared_cache_timeout_ms=300"}).Stub());
  // Phase 0: Redis up; 1: down; 2: back. Each phase compiles new graphs.
  std::vector<v1::CompileRequest> graphs;
  for (int i = 0; i < 18; ++i) graphs.push_back(LayerNormRequest(2 + i, 16));
  std::atomic<int> phase{0};
  std::atomic<bool> stop{false};
  std::atomic<int> served{0}, failed{0};
  std::string first_failure;
  std::mutex mu;
  std::vector<std::thread> clients;
  for (int t = 0; t < 8; ++t) {
    clients.emplace_back([&, t] {
      for (int n = 0; !stop; ++n) {
        const int g = phase * 6 + (t + n) % 6;
        v1::CompileResponse resp;
        grpc::Status s = Call(*stubs[(t + n) % 2], graphs[g], &resp);
        if (s.ok()) {
          served.fetch_add(1);
        } else {
          failed.fetch_add(1);
          std::lock_guard<std::mutex> lock(mu);
          if (first_failure.empty()) first_failure = s.error_message();
        }
      }
    });
  }
  absl::SleepFor(absl::Milliseconds(1500));
  redis_->Kill();
  phase = 1;
  absl::SleepFor(absl::Milliseconds(2000));
  for (auto& stub : stubs) EXPECT_FALSE(Stats(*stub).shared_cache_up());
  ASSERT_TRUE(redis_->Start());
  // Both reconnect in the background (every 0.5 s) while serving.
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (absl::Now() < until && !(Stats(*stubs[0]).shared_cache_up() &&
                                  Stats(*stubs[1]).shared_cache_up()))
    absl::SleepFor(absl::Milliseconds(50));
  phase = 2;
  absl::SleepFor(absl::Milliseconds(2500));
  stop = true;
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(failed.load(), 0) << first_failure;
  EXPECT_GT(served.load(), 50);
  for (auto& stub : stubs) {
    const v1::Stats s = Stats(*stub);
    EXPECT_TRUE(s.shared_cache_up());
    EXPECT_GT(s.shared_failures(), 0u);
  }
  // Filled again: phase 2's graphs are in Redis, and a new graph compiled
  // on one replica is a shared hit on the other.
  EXPECT_NE(
      redis_->Command(
          {"EXISTS",
           absl::StrCat("kiln:{", StoreKeyHex(*stubs[0], graphs[12]), "}:a")}),
      "(int 0)");
  const v1::CompileRequest fresh = LayerNormRequest(40, 16);
  v1::CompileResponse a, b;
  ASSERT_TRUE(Call(*stubs[0], fresh, &a).ok());
  const uint64_t compiles_before = Stats(*stubs[1]).compiles();
  const uint64_t hits_before = Stats(*stubs[1]).shared_hits();
  ASSERT_TRUE(Call(*stubs[1], fresh, &b).ok());
  EXPECT_EQ(Stats(*stubs[1]).compiles(), compiles_before);
  EXPECT_EQ(Stats(*stubs[1]).shared_hits(), hits_before + 1);
  EXPECT_EQ(a.artifact().SerializeAsString(), b.artifact().SerializeAsString());
}

// Values planted in Redis that are not the artifact of their key (garbage,
// another key's value, a well-formed value holding another request's
// artifact) are detected, deleted and never served.
TEST_F(FleetTest, CorruptOrForeignValuesAreNeverServed) {
  auto a = StartReplica(0).Stub();
  auto b = StartReplica(1).Stub();
  const v1::CompileRequest x = LayerNormRequest(3, 8);
  v1::CompileResponse xr;
  ASSERT_TRUE(Call(*a, x, &xr).ok());
  const std::string x_value = redis_->Command(
      {"GET", absl::StrCat("kiln:{", StoreKeyHex(*a, x), "}:a")});
  ASSERT_GT(x_value.size(), cache_format::kValueHeaderSize);

  struct Plant {
    v1::CompileRequest req;
    std::string value;
  };
  std::vector<Plant> plants;
  plants.push_back({LayerNormRequest(5, 8), "not an artifact at all"});
  plants.push_back({LayerNormRequest(6, 8), x_value});  // another key's value
  {
    // Well-formed for its own key, but x's artifact inside.
    const v1::CompileRequest w = LayerNormRequest(7, 8);
    plants.push_back(
        {w, cache_format::EncodeValue(FromHex(StoreKeyHex(*b, w)),
                                      absl::string_view(x_value).substr(
                                          cache_format::kValueHeaderSize),
                                      0.1, absl::Now())});
  }
  uint64_t expected_compiles = 0;
  for (const Plant& p : plants) {
    const std::string name =
        absl::StrCat("kiln:{", StoreKeyHex(*b, p.req), "}:a");
    ASSERT_EQ(redis_->Command({"SET", name, p.value}), "OK");
    v1::CompileResponse resp;
    ASSERT_TRUE(Call(*b, p.req, &resp).ok());
    EXPECT_EQ(resp.outcome(), v1::CompileResponse::COMPILED);
    EXPECT_NE(resp.guard_key(), xr.guard_key());
    EXPECT_EQ(resp.artifact().guard_key(), resp.guard_key());
    EXPECT_EQ(Stats(*b).compiles(), ++expected_compiles);
    // Replaced by b's own artifact.
    EXPECT_NE(redis_->Command({"GET", name}), p.value);
  }
  EXPECT_EQ(Stats(*b).shared_corrupt(), 3u);
  EXPECT_EQ(Stats(*b).shared_hits(), 0u);
}

// A compile error is cached fleet-wide: the second replica does not compile
// the bad graph again.
TEST_F(FleetTest, CompileErrorsAreCachedBriefly) {
  auto a = StartReplica(0).Stub();
  auto b = StartReplica(1).Stub();
  // A sort along a symbolic size: imported fine, refused by the compiler
  // with UNIMPLEMENTED (its quadratic reduction has no size bound).
  v1::CompileRequest bad;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(
                  R"({"symbols": [{"name": "s0"}], "inputs": [
      {"name": "x", "meta": {"dtype": "FLOAT32", "sizes": [{"symbol": "s0"}, {"value": "4"}]}}],
    "nodes": [{"op": "aten.sort.default", "args": [{"ref": "x"}, {"i": "0"}], "outputs": ["y", "i"]}],
    "outputs": ["y"]})",
                  bad.mutable_graph())
                  .ok());
  *bad.mutable_target()->mutable_cpu() = HostCpuTarget();
  v1::CompileResponse ra, rb;
  const grpc::Status sa = Call(*a, bad, &ra);
  ASSERT_EQ(sa.error_code(), grpc::StatusCode::UNIMPLEMENTED)
      << sa.error_message();
  ASSERT_EQ(Stats(*a).compile_errors(), 1u);
  const grpc::Status sb = Call(*b, bad, &rb);
  EXPECT_FALSE(sb.ok());
  EXPECT_EQ(sb.error_code(), sa.error_code());
  EXPECT_EQ(Stats(*b).compiles(), 0u);
  EXPECT_EQ(Stats(*b).shared_error_hits(), 1u);
}

// kiln::Client over the replicas ("A,B,C"): keys spread over them, one
// compile per key fleet-wide, and the keys of a replica that goes away are
// served by the others (from the shared tier, not compiled again).
TEST_F(FleetTest, ClientSpreadsKeysAndFailsOver) {
  std::vector<std::unique_ptr<v1::Kiln::Stub>> stubs;
  std::string servers;
  for (int i = 0; i < 3; ++i) {
    stubs.push_back(StartReplica(i).Stub());
    servers += (i ? "," : "") + replicas_[i]->address();
  }
  std::vector<v1::CompileRequest> graphs;
  for (int i = 0; i < 12; ++i) graphs.push_back(LayerNormRequest(2 + i, 8));
  ClientOptions options;
  options.server = servers;
  options.runtime_threads = 1;
  options.use_hit_socket = false;
  {
    auto client = Client::Connect(options);
    ASSERT_TRUE(client.ok()) << client.status();
    for (const auto& g : graphs) ASSERT_TRUE((*client)->GetExecutable(g).ok());
  }
  int replicas_that_compiled = 0;
  uint64_t compiles = 0;
  for (auto& stub : stubs) {
    const uint64_t c = Stats(*stub).compiles();
    replicas_that_compiled += c > 0;
    compiles += c;
  }
  EXPECT_EQ(compiles, graphs.size());
  EXPECT_GE(replicas_that_compiled, 2);
  const uint64_t survivors_compiles =
      Stats(*stubs[1]).compiles() + Stats(*stubs[2]).compiles();
  replicas_[0].reset();  // SIGKILL
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok());
  for (const auto& g : graphs) {
    auto exe = (*client)->GetExecutable(g);
    ASSERT_TRUE(exe.ok()) << exe.status();
  }
  EXPECT_EQ(Stats(*stubs[1]).compiles() + Stats(*stubs[2]).compiles(),
            survivors_compiles);
}

// A Redis that hangs (DEBUG SLEEP) costs a Compile one call's timeout, not
// the hang: the tier is marked down, the compile runs locally, and the tier
// comes back when Redis answers again.
TEST_F(FleetTest, HungRedisCostsOneTimeout) {
  auto a = StartReplica(0, {"--shared_cache_timeout_ms=200"}).Stub();
  ASSERT_TRUE(Stats(*a).shared_cache_up());
  std::thread hang([&] { redis_->Command({"DEBUG", "SLEEP", "5"}); });
  absl::SleepFor(absl::Milliseconds(200));
  const absl::Time t0 = absl::Now();
  v1::CompileResponse resp;
  const grpc::Status s = Call(*a, Request("chain10.json"), &resp);
  const absl::Duration took = absl::Now() - t0;
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.outcome(), v1::CompileResponse::COMPILED);
  EXPECT_LT(took, absl::Seconds(4)) << "waited for the hung Redis";
  const v1::Stats during = Stats(*a);
  EXPECT_FALSE(during.shared_cache_up());
  EXPECT_GT(during.shared_failures(), 0u);
  hang.join();
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (absl::Now() < until && !Stats(*a).shared_cache_up())
    absl::SleepFor(absl::Milliseconds(50));
  EXPECT_TRUE(Stats(*a).shared_cache_up());
}

// A kilnd whose Redis is not there serves anyway, and reports it.
TEST_F(FleetTest, ReplicaWithoutRedisServesLocally) {
  redis_->Kill();
  auto a = StartReplica(0, {"--shared_cache_timeout_ms=200"}).Stub();
  const v1::CompileRequest req = Request("chain10.json");
  v1::CompileResponse first, second;
  const absl::Time t0 = absl::Now();
  ASSERT_TRUE(Call(*a, req, &first).ok());
  ASSERT_TRUE(Call(*a, req, &second).ok());
  EXPECT_EQ(second.outcome(), v1::CompileResponse::HIT);
  EXPECT_LT(absl::Now() - t0, absl::Seconds(20));
  const v1::Stats s = Stats(*a);
  EXPECT_TRUE(s.shared_cache_configured());
  EXPECT_FALSE(s.shared_cache_up());
  EXPECT_EQ(s.compiles(), 1u);
}

// SharedTier on its own: down is fast, comes up with Redis, leases exclude.
TEST_F(FleetTest, SharedTierLeasesAndReconnect) {
  redis_->Kill();
  SharedTierOptions options;
  options.address = redis_->address();
  options.reconnect_interval = absl::Milliseconds(50);
  auto tier = SharedTier::Open(options);
  ASSERT_TRUE(tier.ok()) << tier.status();
  EXPECT_FALSE((*tier)->up());
  Sha256Digest key = Sha256("some request");
  const absl::Time t0 = absl::Now();
  EXPECT_EQ((*tier)->GetArtifact(key).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - t0, absl::Milliseconds(50));  // no socket touched
  ASSERT_TRUE(redis_->Start());
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (absl::Now() < until && !(*tier)->up())
    absl::SleepFor(absl::Milliseconds(10));
  ASSERT_TRUE((*tier)->up());
  EXPECT_EQ((*tier)->TryLease(key).value_or(false), true);
  EXPECT_EQ((*tier)->TryLease(key).value_or(true), false);
  (*tier)->ReleaseLease(key);
  EXPECT_EQ(redis_->Command({"EXISTS", (*tier)->LeaseKey(key)}), "(int 0)");
  EXPECT_EQ((*tier)->TryLease(key).value_or(false), true);
  (*tier)->ReleaseLease(key);
  ASSERT_TRUE((*tier)->PutArtifact(key, "payload bytes", 1.5).ok());
  auto got = (*tier)->GetArtifact(key);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ(**got, "payload bytes");
  // Keys carry the hash tag: one Redis Cluster slot per entry.
  EXPECT_EQ(redis_->Command({"CLUSTER", "KEYSLOT", (*tier)->ArtifactKey(key)}),
            redis_->Command({"CLUSTER", "KEYSLOT", (*tier)->LeaseKey(key)}));
  ASSERT_TRUE(
      (*tier)->PutError(key, absl::InvalidArgumentError("bad graph")).ok());
  auto error = (*tier)->GetError(key);
  ASSERT_TRUE(error.ok()) << error.status();
  ASSERT_TRUE(error->has_value())
      << redis_->Command({"GET", (*tier)->ErrorKey(key)});
  EXPECT_EQ((*error)->code(), absl::StatusCode::kInvalidArgument);
}

// An ACL user with a password from a file: the right one connects, a wrong
// one leaves the tier down (and Open still succeeds: degraded, not fatal).
TEST_F(FleetTest, SharedTierAuthenticatesAsAnAclUser) {
  ASSERT_EQ(redis_->Command({"ACL", "SETUSER", "kilnd", "on", ">s3cret",
                             "~kiln:*", "&kiln:*", "+@all"}),
            "OK");
  const std::string good = (dir_ / "good").string();
  const std::string bad = (dir_ / "bad").string();
  std::ofstream(good) << "s3cret\n";
  std::ofstream(bad) << "wrong\n";
  SharedTierOptions options;
  options.address = redis_->address();
  options.user = "kilnd";
  options.password_file = good;
  auto tier = SharedTier::Open(options);
  ASSERT_TRUE(tier.ok()) << tier.status();
  EXPECT_TRUE((*tier)->up());
  Sha256Digest key = Sha256("acl");
  ASSERT_TRUE((*tier)->PutArtifact(key, "bytes", 0.5).ok());
  options.password_file = bad;
  auto refused = SharedTier::Open(options);
  ASSERT_TRUE(refused.ok());
  EXPECT_FALSE((*refused)->up());
  options.password_file = (dir_ / "missing").string();
  EXPECT_EQ(SharedTier::Open(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.password_file.clear();
  options.address = "redis://no-port";
  EXPECT_EQ(SharedTier::Open(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Spawns argv (its stdout to /dev/null) and returns its pid (-1 on
// failure).
pid_t Spawn(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null",
                                   O_WRONLY, 0);
  pid_t pid = -1;
  if (posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ) != 0)
    pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

// One command to 127.0.0.1:port: the string/status reply or "".
std::string TcpCommand(int port, const std::vector<std::string>& args) {
  redisContext* c = redisConnect("127.0.0.1", port);
  std::string out;
  if (c && !c->err) {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const std::string& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(redisCommandArgv(
        c, static_cast<int>(argv.size()), argv.data(), lens.data()));
    if (r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS))
      out.assign(r->str, r->len);
    if (r && r->type == REDIS_REPLY_INTEGER) out = absl::StrCat(r->integer);
    if (r) freeReplyObject(r);
  }
  if (c) redisFree(c);
  return out;
}

// Redis Cluster, 3 masters on loopback made by redis-cli --cluster create:
// the replicas talk to one node and follow MOVED to the others; one compile
// per key fleet-wide, entries spread over the masters.
TEST(FleetClusterTest, ThreeMastersOneCompilePerKey) {
  if (RedisServerPath().empty() || access("/usr/bin/redis-cli", X_OK) != 0)
    GTEST_SKIP() << "redis-server/redis-cli are not installed";
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      absl::StrCat("kiln_fleet_cluster_", getpid(), "_", rand());
  std::filesystem::create_directories(dir);
  // Ports (and their cluster bus ports, +10000) from the pid.
  const int base = 21000 + (getpid() * 7) % 20000;
  std::vector<pid_t> nodes;
  std::vector<std::string> create = {"redis-cli", "--cluster", "create"};
  for (int i = 0; i < 3; ++i) {
    const int port = base + i;
    const std::filesystem::path node_dir = dir / absl::StrCat(port);
    std::filesystem::create_directories(node_dir);
    nodes.push_back(
        Spawn({RedisServerPath(), "--port", absl::StrCat(port), "--bind",
               "127.0.0.1", "--cluster-enabled", "yes", "--cluster-config-file",
               (node_dir / "nodes.conf").string(), "--dir", node_dir.string(),
               "--save", "", "--appendonly", "no", "--logfile",
               (node_dir / "log").string()}));
    create.push_back(absl::StrCat("127.0.0.1:", port));
  }
  auto stop_nodes = [&] {
    for (pid_t pid : nodes) {
      if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
  };
  for (int i = 0; i < 3; ++i) {
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (absl::Now() < until && TcpCommand(base + i, {"PING"}) != "PONG")
      absl::SleepFor(absl::Milliseconds(20));
  }
  create.push_back("--cluster-yes");
  const pid_t cli = Spawn(create);
  int status = -1;
  if (cli > 0) waitpid(cli, &status, 0);
  bool ok = false;
  const absl::Time until = absl::Now() + absl::Seconds(20);
  while (!ok && absl::Now() < until) {
    ok = true;
    for (int i = 0; i < 3; ++i)
      ok = ok && absl::StrContains(TcpCommand(base + i, {"CLUSTER", "INFO"}),
                                   "cluster_state:ok");
    if (!ok) absl::SleepFor(absl::Milliseconds(100));
  }
  if (!ok) {
    stop_nodes();
    std::filesystem::remove_all(dir);
    GTEST_SKIP() << "redis-cli --cluster create did not make a cluster here";
  }
  {
    std::vector<std::unique_ptr<Daemon>> replicas;
    std::vector<std::unique_ptr<v1::Kiln::Stub>> stubs;
    for (int i = 0; i < 3; ++i) {
      replicas.push_back(std::make_unique<Daemon>(
          (dir / absl::StrCat("data", i)).string(),
          (dir / absl::StrCat("port", i)).string(),
          std::vector<std::string>{
              absl::StrCat("--shared_cache=redis://127.0.0.1:", base)}));
      ASSERT_GT(replicas.back()->port(), 0);
      stubs.push_back(replicas.back()->Stub());
    }
    constexpr int kGraphs = 12;
    for (int g = 0; g < kGraphs; ++g) {
      const v1::CompileRequest req = LayerNormRequest(2 + g, 8);
      for (int k = 0; k < 3; ++k) {
        v1::CompileResponse resp;
        const grpc::Status s = Call(*stubs[(g + k) % 3], req, &resp);
        ASSERT_TRUE(s.ok()) << s.error_message();
      }
    }
    uint64_t compiles = 0, shared_hits = 0;
    for (auto& stub : stubs) {
      const v1::Stats st = Stats(*stub);
      EXPECT_TRUE(st.shared_cache_up());
      compiles += st.compiles();
      shared_hits += st.shared_hits();
    }
    EXPECT_EQ(compiles, static_cast<uint64_t>(kGraphs));
    EXPECT_EQ(shared_hits, static_cast<uint64_t>(2 * kGraphs));
    int nodes_with_keys = 0;
    for (int i = 0; i < 3; ++i)
      nodes_with_keys += TcpCommand(base + i, {"DBSIZE"}) != "0";
    EXPECT_GE(nodes_with_keys, 2);
  }
  stop_nodes();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kiln
