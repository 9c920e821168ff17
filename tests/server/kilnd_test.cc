// kilnd end to end: a real daemon process on an ephemeral loopback port with
// a temporary data dir; real compiles, real RocksDB, real execution of the
// returned artifacts against the reference evaluator.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/cpu_executable.h"
#include "compiler/cpu_backend.h"
#include "graph/guard_key.h"
#include "graph/import.h"
#include "compiler/reference.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kiln/v1/service.grpc.pb.h"
#include "tests/server/daemon.h"
#include "tests/unit/numerics.h"

namespace kiln {
namespace {

using testing::Daemon;
using testing::Call;
using testing::Stats;
using testing::Request;

// Runs the artifact on seeded inputs and compares with the reference.
void ExpectMatchesReference(const v1::CompileRequest& req,
                            const v1::Artifact& artifact) {
  auto exe = CpuExecutable::Load(artifact);
  ASSERT_TRUE(exe.ok()) << exe.status();
  auto graph = ImportGraph(req.graph());
  ASSERT_TRUE(graph.ok());
  std::mt19937_64 rng(7);
  auto inputs = testing::RandomInputs(
      *graph, std::vector<int64_t>(graph->symbols.size(), 3), rng);
  auto got = (*exe)->Run(inputs);
  auto want = EvaluateReference(*graph, inputs);
  ASSERT_TRUE(got.ok() && want.ok());
  for (size_t o = 0; o < want->size(); ++o)
    EXPECT_EQ(testing::Compare((*got)[o], (*want)[o]), "");
}

class KilndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("kilnd_test_", getpid(), "_", rand());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string data_dir() const { return (dir_ / "data").string(); }
  std::string port_file() const { return (dir_ / "port").string(); }
  std::filesystem::path dir_;
};

TEST_F(KilndTest, CompileThenHitThenHitAfterRestart) {
  const v1::CompileRequest req = Request("chain10.json");
  {
    Daemon d(data_dir(), port_file());
    ASSERT_GT(d.port(), 0);
    auto stub = d.Stub();
    v1::CompileResponse first, second;
    ASSERT_TRUE(Call(*stub, req, &first).ok());
    EXPECT_EQ(first.outcome(), v1::CompileResponse::COMPILED);
    EXPECT_EQ(first.guard_key().size(), 32u);
    ExpectMatchesReference(req, first.artifact());
    ASSERT_TRUE(Call(*stub, req, &second).ok());
    EXPECT_EQ(second.outcome(), v1::CompileResponse::HIT);
    EXPECT_EQ(second.guard_key(), first.guard_key());
    const v1::Stats s = Stats(*stub);
    EXPECT_EQ(s.compiles(), 1u);
    EXPECT_EQ(s.hits(), 1u);
    EXPECT_EQ(s.entries(), 1u);
    EXPECT_EQ(d.Stop(), 0);  // SIGTERM drains and closes RocksDB cleanly
  }
  Daemon d(data_dir(), port_file());
  auto stub = d.Stub();
  v1::CompileResponse again;
  ASSERT_TRUE(Call(*stub, req, &again).ok());
  EXPECT_EQ(again.outcome(), v1::CompileResponse::HIT);
  EXPECT_EQ(Stats(*stub).compiles(), 0u);
  ExpectMatchesReference(req, again.artifact());
}

TEST_F(KilndTest, ConcurrentIdenticalRequestsCompileOnce) {
  Daemon d(data_dir(), port_file());
  auto stub = d.Stub();
  const v1::CompileRequest req = Request("softmax.json");
  constexpr int kClients = 16;
  std::vector<v1::CompileResponse> resp(kClients);
  std::vector<grpc::Status> status(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] { status[i] = Call(*stub, req, &resp[i]); });
  }
  for (std::thread& t : threads) t.join();
  int compiled = 0;
  for (int i = 0; i < kClients; ++i) {
    ASSERT_TRUE(status[i].ok()) << status[i].error_message();
    compiled += resp[i].outcome() == v1::CompileResponse::COMPILED;
    EXPECT_EQ(resp[i].artifact().binary_sha256(),
              resp[0].artifact().binary_sha256());
  }
  EXPECT_EQ(compiled, 1);
  EXPECT_EQ(Stats(*stub).compiles(), 1u);
  ExpectMatchesReference(req, resp[0].artifact());
}

TEST_F(KilndTest, BadInputIsRejectedPreciselyAndChangesNothing) {
  Daemon d(data_dir(), port_file());
  auto stub = d.Stub();
  v1::CompileRequest req = Request("chain10.json");
  req.mutable_graph()->mutable_nodes(3)->set_op("aten.frobnicate.default");
  v1::CompileResponse resp;
  grpc::Status s = Call(*stub, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_NE(s.error_message().find("node 3"), std::string::npos)
      << s.error_message();
  EXPECT_NE(s.error_message().find("aten.frobnicate.default"),
            std::string::npos);
  v1::CompileRequest bad_shape = Request("chain10.json");
  bad_shape.mutable_graph()
      ->mutable_inputs(0)
      ->mutable_meta()
      ->mutable_sizes(0)
      ->set_value(-3);
  s = Call(*stub, bad_shape, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("negative"), std::string::npos)
      << s.error_message();
  v1::CompileRequest cuda = Request("chain10.json");
  cuda.mutable_target()->mutable_cuda()->set_arch("sm_9x");
  s = Call(*stub, cuda, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("sm_9x"), std::string::npos)
      << s.error_message();
  const v1::Stats stats = Stats(*stub);  // still up, nothing cached
  EXPECT_EQ(stats.entries(), 0u);
  // A good request still works afterwards.
  ASSERT_TRUE(Call(*stub, Request("chain10.json"), &resp).ok());
  EXPECT_EQ(resp.outcome(), v1::CompileResponse::COMPILED);
}

TEST_F(KilndTest, LookupListEvictExplain) {
  Daemon d(data_dir(), port_file());
  auto stub = d.Stub();
  const v1::CompileRequest req = Request("layer_norm.json");
  v1::CompileResponse resp;
  ASSERT_TRUE(Call(*stub, req, &resp).ok());
  {
    grpc::ClientContext ctx;
    v1::LookupRequest lookup;
    lookup.set_guard_key(resp.guard_key());
    v1::LookupResponse found;
    ASSERT_TRUE(stub->Lookup(&ctx, lookup, &found).ok());
    EXPECT_EQ(found.artifact().binary_sha256(),
              resp.artifact().binary_sha256());
  }
  {
    grpc::ClientContext ctx;
    v1::LookupRequest lookup;
    lookup.set_guard_key(std::string(32, 'x'));
    v1::LookupResponse found;
    EXPECT_EQ(stub->Lookup(&ctx, lookup, &found).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    v1::ExplainKeyResponse explain;
    ASSERT_TRUE(stub->ExplainKey(&ctx, req, &explain).ok());
    EXPECT_EQ(explain.guard_key(), resp.guard_key());
    EXPECT_GE(explain.components_size(), 5);
  }
  {
    grpc::ClientContext ctx;
    v1::ListEntriesResponse list;
    ASSERT_TRUE(stub->ListEntries(&ctx, v1::ListEntriesRequest(), &list).ok());
    ASSERT_EQ(list.entries_size(), 1);
    EXPECT_EQ(list.entries(0).guard_key(), resp.guard_key());
  }
  {
    grpc::ClientContext ctx;
    v1::EvictRequest evict;
    evict.set_all(true);
    v1::EvictResponse evicted;
    ASSERT_TRUE(stub->Evict(&ctx, evict, &evicted).ok());
    EXPECT_EQ(evicted.evicted(), 1u);
  }
  EXPECT_EQ(Stats(*stub).entries(), 0u);
  ASSERT_TRUE(Call(*stub, req, &resp).ok());
  EXPECT_EQ(resp.outcome(), v1::CompileResponse::COMPILED);
}

// The request key is the client's; the compiler identity is the server's
// (issue 14, DESIGN.md decision 11). This test binary computes request keys
// with its own build while kilnd runs as another build (--compiler_identity):
// the keys agree and Lookup hits. A kilnd of yet another build on the same
// data dir never serves the first build's artifact: it compiles its own, and
// lists the other as another compiler's entry.
// ServerInfo lists the ops this kilnd compiles, sorted: what front ends
// partition by (issue 15). Every listed op compiles; an op outside it is
// rejected as UNIMPLEMENTED naming it.
TEST_F(KilndTest, ServerInfoListsTheOpsItCompiles) {
  Daemon d(data_dir(), port_file());
  auto stub = d.Stub();
  grpc::ClientContext ctx;
  v1::ServerInfo info;
  ASSERT_TRUE(stub->GetServerInfo(&ctx, v1::GetServerInfoRequest(), &info).ok());
  std::vector<std::string> ops(info.supported_ops().begin(),
                               info.supported_ops().end());
  EXPECT_GT(ops.size(), 100u);
  EXPECT_TRUE(std::is_sorted(ops.begin(), ops.end()));
  for (const char* op : {"aten.add.Tensor", "aten._softmax.default",
                         "aten.native_layer_norm.default", "aten.sum.dim_IntList",
                         "aten.view.default", "aten.cat.default"}) {
    EXPECT_TRUE(std::binary_search(ops.begin(), ops.end(), op)) << op;
  }
  EXPECT_FALSE(std::binary_search(ops.begin(), ops.end(), "aten.kthvalue.default"));
  v1::CompileRequest req = Request("softmax.json");
  req.mutable_graph()->mutable_nodes(0)->set_op("aten.kthvalue.default");
  v1::CompileResponse resp;
  const grpc::Status s = Call(*stub, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_NE(s.error_message().find("aten.kthvalue.default"), std::string::npos)
      << s.error_message();
}

TEST_F(KilndTest, RequestKeyIsTheClientsCompilerIdentityTheServers) {
  const v1::CompileRequest req = Request("softmax.json");
  absl::StatusOr<Graph> graph = ImportGraph(req.graph());
  ASSERT_TRUE(graph.ok());
  const GuardKey local = ComputeGuardKey(*graph, req.target(), req.options());
  const std::string key(reinterpret_cast<const char*>(local.data()),
                        local.size());
  auto lookup = [&](v1::Kiln::Stub& stub) {
    grpc::ClientContext ctx;
    v1::LookupRequest lookup;
    lookup.set_guard_key(key);
    v1::LookupResponse found;
    return stub.Lookup(&ctx, lookup, &found).error_code();
  };
  auto list = [&](v1::Kiln::Stub& stub) {
    grpc::ClientContext ctx;
    v1::ListEntriesResponse list;
    EXPECT_TRUE(stub.ListEntries(&ctx, v1::ListEntriesRequest(), &list).ok());
    return list;
  };
  std::string a_store_key;
  {
    Daemon a(data_dir(), port_file(), {"--compiler_identity=build-a"});
    auto stub = a.Stub();
    EXPECT_EQ(lookup(*stub), grpc::StatusCode::NOT_FOUND);
    v1::CompileResponse resp;
    ASSERT_TRUE(Call(*stub, req, &resp).ok());
    EXPECT_EQ(resp.guard_key(), key);
    EXPECT_EQ(lookup(*stub), grpc::StatusCode::OK);
    grpc::ClientContext ctx;
    v1::ExplainKeyResponse explain;
    ASSERT_TRUE(stub->ExplainKey(&ctx, req, &explain).ok());
    EXPECT_EQ(explain.guard_key(), key);
    EXPECT_EQ(explain.compiler_identity(), "build-a");
    EXPECT_EQ(explain.store_key().size(), 32u);
    EXPECT_NE(explain.store_key(), key);
    a_store_key = explain.store_key();
  }
  {
    Daemon b(data_dir(), port_file(), {"--compiler_identity=build-b"});
    auto stub = b.Stub();
    EXPECT_EQ(lookup(*stub), grpc::StatusCode::NOT_FOUND);
    v1::CompileResponse resp;
    ASSERT_TRUE(Call(*stub, req, &resp).ok());
    EXPECT_EQ(resp.outcome(), v1::CompileResponse::COMPILED);
    EXPECT_EQ(resp.guard_key(), key);
    const v1::ListEntriesResponse entries = list(*stub);
    ASSERT_EQ(entries.entries_size(), 2);
    int ours = 0, others = 0;
    for (const auto& e : entries.entries()) {
      if (e.other_compiler()) {
        ++others;
        EXPECT_EQ(e.guard_key(), a_store_key);
      } else {
        ++ours;
        EXPECT_EQ(e.guard_key(), key);
      }
    }
    EXPECT_EQ(ours, 1);
    EXPECT_EQ(others, 1);
  }
  {
    Daemon a(data_dir(), port_file(), {"--compiler_identity=build-a"});
    auto stub = a.Stub();
    EXPECT_EQ(lookup(*stub), grpc::StatusCode::OK);
    // Evict by request key removes this build's entry only.
    grpc::ClientContext ctx;
    v1::EvictRequest evict;
    evict.set_guard_key(key);
    v1::EvictResponse evicted;
    ASSERT_TRUE(stub->Evict(&ctx, evict, &evicted).ok());
    EXPECT_EQ(evicted.evicted(), 1u);
    EXPECT_EQ(lookup(*stub), grpc::StatusCode::NOT_FOUND);
    const v1::ListEntriesResponse entries = list(*stub);
    ASSERT_EQ(entries.entries_size(), 1);
    EXPECT_TRUE(entries.entries(0).other_compiler());
    // ... and another build's entry goes by the key ListEntries gives.
    grpc::ClientContext ctx2;
    v1::EvictRequest evict_other;
    evict_other.set_guard_key(entries.entries(0).guard_key());
    ASSERT_TRUE(stub->Evict(&ctx2, evict_other, &evicted).ok());
    EXPECT_EQ(evicted.evicted(), 1u);
    EXPECT_EQ(list(*stub).entries_size(), 0);
  }
}

// --idle_exit_seconds: a daemon nobody calls exits by itself, cleanly (the
// same drain as SIGTERM: the cache it wrote opens again); one that serves
// RPCs more often than that stays up, and exits once they stop.
TEST_F(KilndTest, IdleDaemonExitsByItself) {
  const v1::CompileRequest req = Request("chain10.json");
  const absl::Time start = absl::Now();
  {
    Daemon d(data_dir(), port_file(), {"--idle_exit_seconds=1"});
    ASSERT_GT(d.port(), 0);
    v1::CompileResponse resp;
    ASSERT_TRUE(Call(*d.Stub(), req, &resp).ok());
    const std::optional<int> status = d.WaitForExit(absl::Seconds(30));
    ASSERT_TRUE(status.has_value()) << "kilnd still runs after 30 s idle";
    EXPECT_EQ(*status, 0);
    EXPECT_GE(absl::Now() - start, absl::Seconds(1));
  }
  Daemon again(data_dir(), port_file());
  v1::CompileResponse hit;
  ASSERT_TRUE(Call(*again.Stub(), req, &hit).ok());
  EXPECT_EQ(hit.outcome(), v1::CompileResponse::HIT);
}

TEST_F(KilndTest, BusyDaemonDoesNotExitUntilIdle) {
  Daemon d(data_dir(), port_file(), {"--idle_exit_seconds=2"});
  ASSERT_GT(d.port(), 0);
  auto stub = d.Stub();
  // 5 s of GetStats every 0.3 s: never 2 s without an RPC.
  const absl::Time busy_until = absl::Now() + absl::Seconds(5);
  while (absl::Now() < busy_until) {
    Stats(*stub);
    ASSERT_FALSE(d.WaitForExit(absl::Milliseconds(300)).has_value())
        << "kilnd exited while served RPCs";
  }
  const absl::Time quiet = absl::Now();
  const std::optional<int> status = d.WaitForExit(absl::Seconds(30));
  ASSERT_TRUE(status.has_value()) << "kilnd still runs after 30 s idle";
  EXPECT_EQ(*status, 0);
  EXPECT_GE(absl::Now() - quiet, absl::Milliseconds(1500));
}

// Flips 20 bytes in the middle of every file of the data dir whose name
// starts with `prefix` or ends with `suffix`; returns how many files.
int DamageFiles(const std::string& dir, const std::string& prefix,
                const std::string& suffix) {
  int damaged = 0;
  for (const auto& file : std::filesystem::directory_iterator(dir)) {
    const std::string name = file.path().filename().string();
    const bool match =
        name.rfind(prefix, 0) == 0 ||
        (name.size() >= suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0);
    if (!match) continue;
    const int fd = open(file.path().c_str(), O_RDWR);
    if (fd < 0) continue;
    const off_t size = lseek(fd, 0, SEEK_END);
    for (off_t at = std::max<off_t>(0, size / 2 - 10);
         at < size && at < size / 2 + 10; ++at) {
      char byte;
      if (pread(fd, &byte, 1, at) == 1) {
        byte = static_cast<char>(byte ^ 0x5a);
        (void)!pwrite(fd, &byte, 1, at);
      }
    }
    close(fd);
    ++damaged;
  }
  return damaged;
}

// Issue 18.5: bytes flipped in the store's MANIFEST and write-ahead log at
// rest: kilnd still starts, reports the recovery (stats and /metrics), and
// serves a correct artifact (kept by the repair, or compiled again).
TEST_F(KilndTest, DamagedStoreIsRecoveredAndServiceGoesOn) {
  const v1::CompileRequest req = Request("chain10.json");
  {
    Daemon d(data_dir(), port_file());
    ASSERT_GT(d.port(), 0);
    v1::CompileResponse resp;
    ASSERT_TRUE(Call(*d.Stub(), req, &resp).ok());
    EXPECT_EQ(d.Stop(), 0);
  }
  ASSERT_GE(DamageFiles(data_dir(), "MANIFEST", ".log"), 2);
  Daemon d(data_dir(), port_file());
  ASSERT_GT(d.port(), 0) << "kilnd did not start on a damaged store";
  auto stub = d.Stub();
  const v1::Stats s = Stats(*stub);
  EXPECT_EQ(s.store_recoveries(), 1u);
  EXPECT_FALSE(s.store_last_recovery().empty());
  v1::CompileResponse resp;
  ASSERT_TRUE(Call(*stub, req, &resp).ok());
  ExpectMatchesReference(req, resp.artifact());
  v1::CompileResponse hit;
  ASSERT_TRUE(Call(*stub, req, &hit).ok());
  EXPECT_EQ(hit.outcome(), v1::CompileResponse::HIT);
}

// Issue 18.7: the port file names the gRPC, /metrics and hit socket ports,
// one a line (the first line alone is what older readers take).
TEST_F(KilndTest, PortFileNamesEveryPort) {
  Daemon d(data_dir(), port_file());
  ASSERT_GT(d.port(), 0);
  std::ifstream in(port_file());
  int grpc_port = 0, metrics_port = 0, hit_port = 0;
  in >> grpc_port >> metrics_port >> hit_port;
  EXPECT_EQ(grpc_port, d.port());
  EXPECT_GT(metrics_port, 0);  // --metrics_listen=127.0.0.1:0
  grpc::ClientContext ctx;
  v1::ServerInfo info;
  ASSERT_TRUE(
      d.Stub()->GetServerInfo(&ctx, v1::GetServerInfoRequest(), &info).ok());
  EXPECT_GT(hit_port, 0);
  EXPECT_EQ(hit_port, static_cast<int>(info.hit_socket().tcp_port()));
  EXPECT_NE(hit_port, metrics_port);
  EXPECT_NE(hit_port, grpc_port);

  // A second kilnd asked for the first one's /metrics port does not start
  // without it: it exits with an error before serving (no port file).
  const std::string second_port_file = (dir_ / "port2").string();
  Daemon second((dir_ / "data2").string(), second_port_file,
                {absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port)});
  EXPECT_EQ(second.port(), 0);
  const std::optional<int> status = second.WaitForExit(absl::Seconds(30));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(*status, 1);
  EXPECT_FALSE(std::filesystem::exists(second_port_file));
  // --metrics_listen= (none): the port file says 0 for it.
  Daemon third((dir_ / "data3").string(), (dir_ / "port3").string(),
               {"--metrics_listen="});
  ASSERT_GT(third.port(), 0);
  std::ifstream in3((dir_ / "port3").string());
  int p1 = 0, p2 = -1;
  in3 >> p1 >> p2;
  EXPECT_EQ(p2, 0);
}

}  // namespace
}  // namespace kiln
