// kiln::Client against a real kilnd: compile on first use, Lookup (no graph
// sent) from a fresh client, the in-process cache after that, and errors.
#include <random>

#include "absl/strings/match.h"
#include "runtime/cuda_driver.h"
#include "client/kiln_client.h"
#include "graph/import.h"
#include "compiler/reference.h"
#include "gtest/gtest.h"
#include "tests/server/daemon.h"
#include "tests/unit/numerics.h"

namespace kiln::testing {
namespace {

class ClientTest : public DaemonTest {
 protected:
  std::unique_ptr<Client> NewClient() {
    ClientOptions o;
    o.server = absl::StrCat("127.0.0.1:", daemon_->port());
    o.runtime_threads = 2;
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return *std::move(c);
  }
};

TEST_F(ClientTest, CompilesThenLooksUpThenServesLocally) {
  const v1::CompileRequest req = Request("dynamic_batch.json");
  auto first = NewClient();
  auto exe = first->GetExecutable(req);
  ASSERT_TRUE(exe.ok()) << exe.status();
  EXPECT_EQ(first->counters().compiles, 1u);
  auto again = first->GetExecutable(req);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->get(), exe->get());  // the same loaded executable
  EXPECT_EQ(first->counters().local_hits, 1u);

  auto second = NewClient();  // another process would look the same
  auto looked_up = second->GetExecutable(req);
  ASSERT_TRUE(looked_up.ok()) << looked_up.status();
  EXPECT_EQ(second->counters().lookup_hits, 1u);
  EXPECT_EQ(second->counters().compiles, 0u);
  EXPECT_EQ((*looked_up)->guard_key(), (*exe)->guard_key());

  auto graph = ImportGraph(req.graph());
  std::mt19937_64 rng(3);
  for (int64_t batch : {2, 9}) {
    auto inputs = RandomInputs(*graph, {batch}, rng);
    auto got = (*looked_up)->Run(inputs);
    auto want = EvaluateReference(*graph, inputs);
    ASSERT_TRUE(got.ok() && want.ok()) << got.status();
    EXPECT_EQ(Compare((*got)[0], (*want)[0]), "");
  }
}

TEST_F(ClientTest, ErrorsCarryTheServersMessage) {
  auto client = NewClient();
  v1::CompileRequest req = Request("chain10.json");
  req.mutable_graph()->mutable_nodes(0)->mutable_args(0)->set_ref("missing");
  auto r = client->GetExecutable(req);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("node 0"), std::string::npos)
      << r.status();
}

// Keys are remembered per request bytes: a repeat is served locally, and a
// request that differs in any way gets its own key.
TEST_F(ClientTest, RememberedKeysNeverMixUpRequests) {
  auto client = NewClient();
  const v1::CompileRequest a = Request("chain10.json");
  v1::CompileRequest b = a;
  b.mutable_graph()->mutable_nodes(1)->set_op("aten.cos.default");
  auto exe_a = client->GetExecutable(a);
  auto exe_b = client->GetExecutable(b);
  ASSERT_TRUE(exe_a.ok()) << exe_a.status();
  ASSERT_TRUE(exe_b.ok()) << exe_b.status();
  EXPECT_NE((*exe_a)->guard_key(), (*exe_b)->guard_key());
  EXPECT_EQ(client->counters().compiles, 2u);
  auto again_a = client->GetExecutable(a);
  auto again_b = client->GetExecutable(b);
  ASSERT_TRUE(again_a.ok() && again_b.ok());
  EXPECT_EQ(again_a->get(), exe_a->get());
  EXPECT_EQ(again_b->get(), exe_b->get());
  EXPECT_EQ(client->counters().local_hits, 2u);
  // A broken request after good ones is still checked, every time.
  v1::CompileRequest bad = a;
  bad.mutable_graph()->mutable_nodes(0)->mutable_args(0)->set_ref("missing");
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(client->GetExecutable(bad).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

v1::CompileRequest CudaRequest(const std::string& file,
                               const std::string& arch = "sm_90") {
  v1::CompileRequest req = Request(file);
  req.mutable_target()->mutable_cuda()->set_arch(arch);
  return req;
}

uint64_t DaemonCompiles(const Daemon& daemon) {
  grpc::ClientContext ctx;
  v1::Stats stats;
  EXPECT_TRUE(
      daemon.Stub()->GetStats(&ctx, v1::GetStatsRequest(), &stats).ok());
  return stats.compiles();
}

// What loading gives on this machine: OK with a CUDA device, else the
// driver's FAILED_PRECONDITION (no driver, or no device).
void ExpectLoadOutcome(
    const absl::StatusOr<std::shared_ptr<const CudaExecutable>>& exe) {
  const auto driver = cuda::Driver::Get();
  if (driver.ok()) {
    // A GPU machine: sm_90 loads on sm_90 and newer, or names the arch.
    if (!exe.ok()) {
      EXPECT_EQ(exe.status().code(), absl::StatusCode::kFailedPrecondition)
          << exe.status();
    }
    return;
  }
  ASSERT_FALSE(exe.ok());
  EXPECT_EQ(exe.status().code(), absl::StatusCode::kFailedPrecondition)
      << exe.status();
  EXPECT_EQ(exe.status().message(), driver.status().message());
  EXPECT_TRUE(absl::StrContains(exe.status().message(), "CUDA driver") ||
              absl::StrContains(exe.status().message(), "cuInit"))
      << exe.status();
}

// A CUDA request compiles on the daemon (a cubin, no GPU needed there); a
// second client gets it by Lookup; loading needs a GPU, and without one
// fails cleanly with FAILED_PRECONDITION, after which the artifact is still
// served (no local entry was made for the failed load).
TEST_F(ClientTest, CudaCompilesThenLooksUpAndLoadsOnlyWithADriver) {
  const v1::CompileRequest req = CudaRequest("softmax.json");
  auto first = NewClient();
  auto exe = first->GetCudaExecutable(req);
  ExpectLoadOutcome(exe);
  EXPECT_EQ(first->counters().compiles, 1u);
  EXPECT_EQ(first->counters().lookup_hits, 0u);
  EXPECT_EQ(DaemonCompiles(*daemon_), 1u);

  auto second = NewClient();
  auto looked_up = second->GetCudaExecutable(req);
  ExpectLoadOutcome(looked_up);
  EXPECT_EQ(second->counters().lookup_hits, 1u);
  EXPECT_EQ(second->counters().compiles, 0u);
  EXPECT_EQ(DaemonCompiles(*daemon_), 1u);

  // Again on the first client: a local hit where it loaded, else a Lookup
  // (a failed load is not cached); never another compile.
  auto again = first->GetCudaExecutable(req);
  ExpectLoadOutcome(again);
  EXPECT_EQ(first->counters().compiles, 1u);
  EXPECT_EQ(first->counters().local_hits + first->counters().lookup_hits, 1u);
  if (exe.ok()) {
    EXPECT_EQ(again->get(), exe->get());
  }
  EXPECT_EQ(DaemonCompiles(*daemon_), 1u);

  // The CUDA artifact is the daemon's, under the key the client computed:
  // the same request through the plain stub is a hit with a cubin in it.
  grpc::ClientContext ctx;
  v1::CompileResponse resp;
  ASSERT_TRUE(daemon_->Stub()->Compile(&ctx, req, &resp).ok());
  EXPECT_TRUE(resp.artifact().has_cuda());
  EXPECT_EQ(resp.artifact().cuda().cubin().substr(0, 4),
            "\x7f"
            "ELF");
  EXPECT_EQ(DaemonCompiles(*daemon_), 1u);
}

TEST_F(ClientTest, CudaAndCpuEntryPointsRefuseTheOtherTarget) {
  auto client = NewClient();
  // A CPU target, or none, is not a CUDA request.
  v1::CompileRequest cpu = Request("chain10.json");
  auto r = client->GetCudaExecutable(cpu);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "CUDA target"))
      << r.status();
  v1::CompileRequest none = cpu;
  none.clear_target();
  EXPECT_EQ(client->GetCudaExecutable(none).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::CompileRequest no_arch = cpu;
  no_arch.mutable_target()->mutable_cuda();
  EXPECT_EQ(client->GetCudaExecutable(no_arch).status().code(),
            absl::StatusCode::kInvalidArgument);
  // GetExecutable points CUDA requests to GetCudaExecutable.
  auto c = client->GetExecutable(CudaRequest("chain10.json"));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(absl::StrContains(c.status().message(), "GetCudaExecutable"))
      << c.status();
  // Nothing was sent.
  EXPECT_EQ(client->counters().compiles, 0u);
  EXPECT_EQ(client->counters().lookup_hits, 0u);
  EXPECT_EQ(DaemonCompiles(*daemon_), 0u);
}

TEST_F(ClientTest, CudaErrorsCarryTheNodeAndTheDaemonsMessage) {
  auto client = NewClient();
  v1::CompileRequest req = CudaRequest("chain10.json");
  req.mutable_graph()->mutable_nodes(0)->mutable_args(0)->set_ref("missing");
  auto r = client->GetCudaExecutable(req);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "node 0")) << r.status();
  // An op the compiler does not know, found by the local import already.
  v1::CompileRequest unknown = CudaRequest("chain10.json");
  unknown.mutable_graph()->mutable_nodes(1)->set_op("aten.frobnicate.default");
  auto u = client->GetCudaExecutable(unknown);
  EXPECT_EQ(u.status().code(), absl::StatusCode::kUnimplemented) << u.status();
  EXPECT_TRUE(absl::StrContains(u.status().message(), "aten.frobnicate"))
      << u.status();
}

TEST(ClientNoServer, UnavailableAfterBoundedRetries) {
  ClientOptions o;
  o.server = "127.0.0.1:1";  // nothing listens there
  o.max_retries = 2;
  o.initial_backoff = absl::Milliseconds(10);
  o.rpc_deadline = absl::Seconds(2);
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok());
  auto r = (*client)->GetExecutable(Request("chain10.json"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
}

}  // namespace
}  // namespace kiln::testing
