// kiln::Client against a real kilnd: compile on first use, Lookup (no graph
// sent) from a fresh client, the in-process cache after that, and errors.
#include <random>

#include "absl/strings/match.h"
#include "client/kiln_client.h"
#include "compiler/reference.h"
#include "graph/import.h"
#include "gtest/gtest.h"
#include "runtime/cpu_conv.h"
#include "runtime/cpu_executable.h"
#include "runtime/cuda_driver.h"
#include "support/artifact_signature.h"
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

// A CPU graph with a convolution gets oneDNN calls where this runtime
// loads oneDNN (the client sets CompileOptions.cpu_library_convolutions),
// im2col kernels and GEMMs elsewhere; either way it matches the reference.
TEST_F(ClientTest, CpuConvolutionsAreOneDnnCallsWhereItLoads) {
  const v1::CompileRequest req = Request("conv1d_broadcast.json");
  auto client = NewClient();
  auto exe = client->GetExecutable(req);
  ASSERT_TRUE(exe.ok()) << exe.status();
  int onednn = 0, calls = 0;
  for (const v1::Step& s :
       (*exe)->cpu_executable().artifact().program().steps()) {
    calls += s.has_call();
    onednn += s.has_call() && s.call().library() == v1::ExternCall::ONEDNN;
  }
  EXPECT_GT(calls, 0);
  EXPECT_EQ(onednn, CpuConv::Available() ? calls : 0) << CpuConv::Describe();
  auto graph = ImportGraph(req.graph());
  ASSERT_TRUE(graph.ok()) << graph.status();
  std::mt19937_64 rng(5);
  auto inputs = RandomInputs(*graph, {}, rng);
  auto got = (*exe)->Run(inputs);
  auto want = EvaluateReference(*graph, inputs);
  ASSERT_TRUE(got.ok() && want.ok()) << got.status();
  for (size_t o = 0; o < want->size(); ++o)
    EXPECT_EQ(Compare((*got)[o], (*want)[o]), "") << "output " << o;
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

// Issue 18.3: a client that trusts kilnd's public key loads its artifacts
// (by Compile, by Lookup over the hit socket and over gRPC); one that
// trusts only other keys, or gets unsigned artifacts, refuses them with
// PERMISSION_DENIED before loading anything.
std::string PublicKeyHex(Daemon& daemon) {
  grpc::ClientContext ctx;
  v1::ServerInfo info;
  EXPECT_TRUE(daemon.Stub()
                  ->GetServerInfo(&ctx, v1::GetServerInfoRequest(), &info)
                  .ok());
  EXPECT_EQ(info.signing_public_key().size(), kEd25519PublicKeyBytes);
  return KeyToHex(info.signing_public_key());
}

std::unique_ptr<Client> TrustingClient(Daemon& daemon,
                                       const std::string& trusted_keys,
                                       bool use_hit_socket = true) {
  ClientOptions o;
  o.server = daemon.address();
  o.runtime_threads = 1;
  o.max_retries = 0;
  o.trusted_keys = trusted_keys;
  o.use_hit_socket = use_hit_socket;
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

TEST_F(ClientTest, SignedArtifactsAreLoadedOnlyFromTrustedKeys) {
  const std::string key = PublicKeyHex(*daemon_);
  const std::string stranger = ArtifactSigner::Generate()->public_key_hex();
  const v1::CompileRequest req = Request("chain10.json");

  // Compiled: the Compile response's signature.
  auto trusting = TrustingClient(*daemon_, key);
  auto compiled = trusting->GetExecutable(req);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  EXPECT_EQ(trusting->counters().compiles, 1u);
  // Looked up: over the hit socket, and over gRPC.
  for (bool hit_socket : {true, false}) {
    auto fresh = TrustingClient(*daemon_, key, hit_socket);
    auto looked_up = fresh->GetExecutable(req);
    ASSERT_TRUE(looked_up.ok()) << looked_up.status();
    EXPECT_EQ(fresh->counters().lookup_hits, 1u);
  }
  // Rotation: the old key and the new one.
  auto rotating = TrustingClient(*daemon_, stranger + "," + key);
  EXPECT_TRUE(rotating->GetExecutable(req).ok());

  // Trusting another key only: refused on Lookup and on Compile.
  for (bool hit_socket : {true, false}) {
    auto refusing = TrustingClient(*daemon_, stranger, hit_socket);
    auto refused = refusing->GetExecutable(req);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied)
        << refused.status();
    EXPECT_TRUE(absl::StrContains(refused.status().message(), "not loaded"));
  }
  auto refusing = TrustingClient(*daemon_, stranger);
  v1::CompileRequest other = req;
  other.mutable_graph()->mutable_nodes(1)->set_op("aten.cos.default");
  auto refused = refusing->GetExecutable(other);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied)
      << refused.status();
  EXPECT_EQ(refusing->counters().compiles, 1u);

  // A client without trusted keys checks nothing (today's behaviour).
  auto plain = TrustingClient(*daemon_, "");
  EXPECT_TRUE(plain->GetExecutable(other).ok());

  // A malformed key list fails at Connect, naming the entry.
  ClientOptions bad;
  bad.server = daemon_->address();
  bad.trusted_keys = "not-a-key";
  auto connect = Client::Connect(bad);
  EXPECT_EQ(connect.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(connect.status().message(), "not-a-key"));
}

TEST(UnsignedArtifactsTest, ClientThatTrustsKeysRefusesUnsignedArtifacts) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      absl::StrCat("kiln_unsigned_", getpid(), "_", rand());
  std::filesystem::create_directories(dir);
  {
    Daemon daemon((dir / "data").string(), (dir / "port").string(),
                  {"--signing_key=off"});
    ASSERT_GT(daemon.port(), 0);
    const std::string any_key = ArtifactSigner::Generate()->public_key_hex();
    const v1::CompileRequest req = Request("chain10.json");
    auto client = TrustingClient(daemon, any_key);
    auto compiled = client->GetExecutable(req);  // by Compile
    EXPECT_EQ(compiled.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_TRUE(absl::StrContains(compiled.status().message(), "unsigned"))
        << compiled.status();
    auto again = TrustingClient(daemon, any_key)->GetExecutable(req);
    EXPECT_EQ(again.status().code(), absl::StatusCode::kPermissionDenied)
        << again.status();  // by Lookup
    EXPECT_TRUE(TrustingClient(daemon, "")->GetExecutable(req).ok());
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kiln::testing
