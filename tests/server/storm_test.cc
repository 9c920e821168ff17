// Storms of client *processes* against a real kilnd: one compile per key
// however many ask at once; a daemon SIGKILLed mid-storm restarts with a
// cache in which every entry verifies, and clients recover. Also raw bytes
// and an oversized message on the wire.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cstring>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/cpu_executable.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/server/daemon.h"

extern char** environ;

namespace kiln::testing {
namespace {

// Starts storm_client processes, one per graph file, all at once; returns
// their exit codes (-1 for a process that did not finish within the bound).
std::vector<int> Storm(const std::string& address,
                       const std::vector<std::string>& graphs,
                       int max_retries = 5) {
  std::vector<pid_t> pids;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  for (size_t i = 0; i < graphs.size(); ++i) {
    std::vector<std::string> args = {KILN_STORM_CLIENT, address, graphs[i],
                                     std::to_string(i),
                                     std::to_string(max_retries)};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    if (posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) ==
        0)
      pids.push_back(pid);
  }
  posix_spawn_file_actions_destroy(&actions);
  std::vector<int> codes(pids.size(), -1);
  const absl::Time until = absl::Now() + absl::Seconds(240);
  size_t done = 0;
  while (done < pids.size() && absl::Now() < until) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (codes[i] != -1 || pids[i] < 0) continue;
      int status = 0;
      if (waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        codes[i] =
            WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        ++done;
      }
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    if (codes[i] == -1) {
      kill(pids[i], SIGKILL);
      waitpid(pids[i], nullptr, 0);
    }
  }
  return codes;
}

std::string Example(const std::string& file) {
  return std::string(KILN_EXAMPLES_DIR) + "/" + file;
}

v1::Stats GetStats(const Daemon& d) {
  grpc::ClientContext ctx;
  v1::Stats s;
  EXPECT_TRUE(d.Stub()->GetStats(&ctx, v1::GetStatsRequest(), &s).ok());
  return s;
}

class StormTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("storm_test_", getpid(), "_", rand());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string data_dir() const { return (dir_ / "data").string(); }
  std::string port_file() const { return (dir_ / "port").string(); }
  std::filesystem::path dir_;
};

TEST_F(StormTest, SixteenProcessesOneGraphCompileOnce) {
  Daemon d(data_dir(), port_file());
  ASSERT_GT(d.port(), 0);
  const std::vector<int> codes =
      Storm(d.address(), std::vector<std::string>(16, Example("softmax.json")));
  for (size_t i = 0; i < codes.size(); ++i)
    EXPECT_EQ(codes[i], 0) << "client " << i;
  EXPECT_EQ(codes.size(), 16u);
  EXPECT_EQ(GetStats(d).compiles(), 1u);
}

TEST_F(StormTest, MixedStormCompilesOncePerKey) {
  Daemon d(data_dir(), port_file());
  const std::vector<std::string> files = {"chain10.json", "softmax.json",
                                          "layer_norm.json",
                                          "reduce_two_dims.json"};
  std::vector<std::string> graphs;
  for (int i = 0; i < 16; ++i)
    graphs.push_back(Example(files[i % files.size()]));
  const std::vector<int> codes = Storm(d.address(), graphs);
  for (size_t i = 0; i < codes.size(); ++i)
    EXPECT_EQ(codes[i], 0) << "client " << i;
  const v1::Stats s = GetStats(d);
  EXPECT_EQ(s.compiles(), files.size());
  EXPECT_EQ(s.entries(), files.size());
}

TEST_F(StormTest, SigkillDuringAStormLeavesOnlyVerifiedEntries) {
  const std::vector<std::string> files = {
      "chain10.json",      "chain30.json",    "chain30_sum.json",
      "softmax.json",      "layer_norm.json", "reduce_two_dims.json",
      "dynamic_batch.json"};
  std::vector<std::string> graphs;
  for (int i = 0; i < 14; ++i)
    graphs.push_back(Example(files[i % files.size()]));
  {
    auto d = std::make_unique<Daemon>(data_dir(), port_file());
    // Clients of the killed daemon give up quickly (its port dies with it).
    std::thread storm(
        [&] { (void)Storm(d->address(), graphs, /*max_retries=*/1); });
    absl::SleepFor(absl::Milliseconds(150));  // compiles and puts in flight
    d.reset();                                // SIGKILL
    storm.join();                             // clients fail or finish; bounded
  }
  Daemon d(data_dir(), port_file());
  // Every entry that survived verifies: the store checks each Get's hash,
  // and the binary's own SHA-256 is checked again by the loader.
  grpc::ClientContext ctx;
  v1::ListEntriesResponse list;
  ASSERT_TRUE(
      d.Stub()->ListEntries(&ctx, v1::ListEntriesRequest(), &list).ok());
  for (const auto& e : list.entries()) {
    grpc::ClientContext lctx;
    v1::LookupRequest req;
    req.set_guard_key(e.guard_key());
    v1::LookupResponse resp;
    ASSERT_TRUE(d.Stub()->Lookup(&lctx, req, &resp).ok());
    EXPECT_TRUE(CpuExecutable::Load(resp.artifact()).ok());
  }
  EXPECT_EQ(GetStats(d).corrupt(), 0u);
  // Clients recover: the same storm against the restarted daemon succeeds.
  const std::vector<int> codes = Storm(d.address(), graphs);
  for (size_t i = 0; i < codes.size(); ++i)
    EXPECT_EQ(codes[i], 0) << "client " << i;
  EXPECT_LE(GetStats(d).compiles(), files.size());
}

TEST_F(StormTest, GarbageAndOversizedMessagesAreRejectedAndTheDaemonServesOn) {
  Daemon d(data_dir(), port_file(), {"--max_message_bytes=1048576"});
  auto channel =
      grpc::CreateChannel(d.address(), grpc::InsecureChannelCredentials());
  grpc::GenericStub generic(channel);
  {  // Random bytes where a CompileRequest should be.
    std::string garbage(512, '\0');
    for (size_t i = 0; i < garbage.size(); ++i)
      garbage[i] = static_cast<char>((i * 131 + 7) % 251);
    grpc::Slice slice(garbage);
    grpc::ByteBuffer request(&slice, 1), response;
    grpc::ClientContext ctx;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    grpc::Status status;
    generic.UnaryCall(&ctx, "/kiln.v1.Kiln/Compile", grpc::StubOptions(),
                      &request, &response, [&](grpc::Status s) {
                        std::lock_guard<std::mutex> lock(mu);
                        status = s;
                        done = true;
                        cv.notify_one();
                      });
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(
        cv.wait_for(lock, std::chrono::seconds(30), [&] { return done; }));
    EXPECT_FALSE(status.ok());
    EXPECT_NE(status.error_code(), grpc::StatusCode::UNAVAILABLE)
        << status.error_message();
  }
  {  // A message over --max_message_bytes.
    v1::CompileRequest big = Request("chain10.json");
    big.mutable_graph()->mutable_nodes(0)->set_op(std::string(2 << 20, 'x'));
    grpc::ClientContext ctx;
    v1::CompileResponse resp;
    const grpc::Status s = d.Stub()->Compile(&ctx, big, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << s.error_message();
  }
  // Still serving.
  grpc::ClientContext ctx;
  v1::CompileResponse resp;
  EXPECT_TRUE(d.Stub()->Compile(&ctx, Request("chain10.json"), &resp).ok());
}

}  // namespace
}  // namespace kiln::testing
