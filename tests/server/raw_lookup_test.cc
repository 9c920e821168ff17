// kiln::Client's Lookup receive path (client/raw_lookup.h): the zero-copy
// parse of LookupResponse bytes however the transport splits them, its errors,
// and, against a real kilnd, loading a looked-up binary from its pieces with
// the SHA-256 check still in force.
#include "client/raw_lookup.h"

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "gtest/gtest.h"
#include "kiln/v1/service.pb.h"
#include "runtime/cpu_executable.h"
#include "support/artifact_signature.h"
#include "support/sha256.h"
#include "tests/server/daemon.h"

namespace kiln::testing {
namespace {

v1::Artifact FakeCpuArtifact() {
  v1::Artifact a;
  a.set_format_version(1);
  a.set_guard_key(std::string(32, '\x07'));
  a.mutable_target()->mutable_cpu()->set_cpu("x86-64-v3");
  a.add_symbols()->set_name("s0");
  a.mutable_program()->add_steps()->mutable_launch()->set_kernel("kernel_0");
  std::string so(5000, '\0');
  for (size_t i = 0; i < so.size(); ++i) so[i] = static_cast<char>(i * 31);
  a.mutable_cpu()->set_shared_object(so);
  const Sha256Digest digest = Sha256(so);
  a.set_binary_sha256(
      std::string(reinterpret_cast<const char*>(digest.data()), 32));
  a.set_compile_seconds(0.25);
  return a;
}

std::string ResponseBytes(const v1::Artifact& a) {
  v1::LookupResponse r;
  *r.mutable_artifact() = a;
  return r.SerializeAsString();
}

// `bytes` as slices of `chunk` bytes (the last may be shorter).
std::vector<grpc::Slice> Split(const std::string& bytes, size_t chunk) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += chunk) {
    slices.emplace_back(bytes.data() + at, std::min(chunk, bytes.size() - at));
  }
  return slices;
}

std::string Joined(absl::Span<const absl::string_view> pieces) {
  std::string out;
  for (absl::string_view p : pieces) out.append(p.data(), p.size());
  return out;
}

TEST(ParseLookupResponseTest, AnySplitGivesTheArtifactAndItsBinary) {
  const v1::Artifact want = FakeCpuArtifact();
  v1::Artifact want_meta = want;
  want_meta.mutable_cpu()->clear_shared_object();
  const std::string bytes = ResponseBytes(want);
  for (size_t chunk : {size_t{1}, size_t{2}, size_t{7}, size_t{16},
                       size_t{1000}, size_t{4096}, bytes.size()}) {
    SCOPED_TRACE(absl::StrCat("slices of ", chunk, " bytes"));
    absl::StatusOr<ReceivedArtifact> got =
        ParseLookupResponse(Split(bytes, chunk));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->binary_size(), want.cpu().shared_object().size());
    EXPECT_EQ(Joined(got->binary()), want.cpu().shared_object());
    EXPECT_TRUE(got->artifact().has_cpu());
    EXPECT_EQ(got->artifact().SerializeAsString(),
              want_meta.SerializeAsString());
    // Moving the result keeps the pieces valid (they point into its slices).
    ReceivedArtifact moved = *std::move(got);
    EXPECT_EQ(Joined(moved.binary()), want.cpu().shared_object());
  }
}

TEST(ParseLookupResponseTest, OneSliceIsNotCopied) {
  const v1::Artifact want = FakeCpuArtifact();
  std::vector<grpc::Slice> slices;
  slices.emplace_back(ResponseBytes(want));
  const uint8_t* begin = slices[0].begin();
  const uint8_t* end = slices[0].end();
  absl::StatusOr<ReceivedArtifact> got = ParseLookupResponse(std::move(slices));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->binary().size(), 1u);
  const auto* data = reinterpret_cast<const uint8_t*>(got->binary()[0].data());
  EXPECT_GE(data, begin);
  EXPECT_LE(data + got->binary()[0].size(), end);
}

TEST(ParseLookupResponseTest, CudaArtifactsParseWhole) {
  v1::Artifact want;
  want.set_format_version(1);
  want.mutable_cuda()->set_cubin(std::string(300, 'c'));
  want.mutable_cuda()->set_arch("sm_90");
  absl::StatusOr<ReceivedArtifact> got =
      ParseLookupResponse(Split(ResponseBytes(want), 10));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->binary().empty());
  EXPECT_EQ(got->artifact().SerializeAsString(), want.SerializeAsString());
}

TEST(ParseLookupResponseTest, MalformedBytesAreDataLoss) {
  const std::string bytes = ResponseBytes(FakeCpuArtifact());
  // Cut in the middle of the shared object.
  const std::string cut = bytes.substr(0, bytes.size() / 2);
  for (const std::string& bad :
       {cut, std::string(""), std::string("\xff\xff\xff", 3),
        std::string("\x0a\x05\x08", 3)}) {
    absl::StatusOr<ReceivedArtifact> got = ParseLookupResponse(Split(bad, 3));
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
  }
  // A CPU and a CUDA binary at once (kilnd never sends that).
  v1::Artifact cpu = FakeCpuArtifact();
  v1::Artifact cuda;
  cuda.mutable_cuda()->set_arch("sm_90");
  const std::string both = cpu.SerializeAsString() + cuda.SerializeAsString();
  std::string response = "\x0a";
  google::protobuf::io::StringOutputStream stream(&response);
  {
    google::protobuf::io::CodedOutputStream out(&stream);
    out.WriteVarint32(static_cast<uint32_t>(both.size()));
    out.WriteString(both);
  }
  absl::StatusOr<ReceivedArtifact> got =
      ParseLookupResponse(Split(response, 64));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
}

class RawLookupTest : public DaemonTest {};

TEST_F(RawLookupTest, LoadsVerifiedPiecesAndRefusesCorruptOnes) {
  auto stub = daemon_->Stub();
  const v1::CompileRequest req = Request("chain10.json");
  grpc::ClientContext compile_ctx;
  v1::CompileResponse compiled;
  ASSERT_TRUE(stub->Compile(&compile_ctx, req, &compiled).ok());

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  RawLookupStub raw(grpc::CreateCustomChannel(
      daemon_->address(), grpc::InsecureChannelCredentials(), args));
  std::vector<grpc::Slice> slices;
  grpc::ClientContext ctx;
  ASSERT_TRUE(raw.Lookup(&ctx, compiled.guard_key(), &slices).ok());
  absl::StatusOr<ReceivedArtifact> got = ParseLookupResponse(std::move(slices));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(Joined(got->binary()), compiled.artifact().cpu().shared_object());

  // The signature kilnd sent after the artifact covers the artifact's bytes
  // as received; a flipped byte anywhere in them breaks it.
  {
    grpc::ClientContext info_ctx;
    v1::ServerInfo info;
    ASSERT_TRUE(
        stub->GetServerInfo(&info_ctx, v1::GetServerInfoRequest(), &info).ok());
    TrustedKeys trusted;
    ASSERT_TRUE(trusted.Add(info.signing_public_key()).ok());
    ASSERT_EQ(got->signature().size(), kEd25519SignatureBytes);
    EXPECT_TRUE(trusted.Verify(got->ArtifactDigest(), got->signature()).ok());
    EXPECT_EQ(got->ArtifactDigest(),
              Sha256(compiled.artifact().SerializeAsString()));
    grpc::ClientContext again_ctx;
    std::vector<grpc::Slice> again;
    ASSERT_TRUE(raw.Lookup(&again_ctx, compiled.guard_key(), &again).ok());
    std::string bytes;
    for (const grpc::Slice& s : again)
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    for (size_t at : {size_t{8}, bytes.size() / 2, bytes.size() - 80}) {
      std::string forged = bytes;
      forged[at] ^= 0x01;
      std::vector<grpc::Slice> forged_slices;
      forged_slices.emplace_back(forged);
      absl::StatusOr<ReceivedArtifact> parsed =
          ParseLookupResponse(std::move(forged_slices));
      if (!parsed.ok()) continue;  // not even a LookupResponse any more
      EXPECT_EQ(
          trusted.Verify(parsed->ArtifactDigest(), parsed->signature()).code(),
          absl::StatusCode::kPermissionDenied)
          << "flipped byte at " << at;
    }
  }

  // One flipped byte in a copy of the pieces: refused, nothing loaded.
  std::string corrupt = Joined(got->binary());
  corrupt[corrupt.size() / 2] ^= 1;
  const absl::string_view halves[] = {absl::string_view(corrupt).substr(0, 100),
                                      absl::string_view(corrupt).substr(100)};
  auto bad = CpuExecutable::LoadFromPieces(got->artifact(), halves);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss) << bad.status();

  auto exe = CpuExecutable::LoadFromPieces(got->TakeArtifact(), got->binary());
  ASSERT_TRUE(exe.ok()) << exe.status();
  EXPECT_TRUE((*exe)->artifact().cpu().shared_object().empty());
  EXPECT_EQ((*exe)->artifact().guard_key(), compiled.guard_key());

  // Load(Artifact&&) takes the binary without a copy, same checks.
  v1::Artifact tampered = compiled.artifact();
  (*tampered.mutable_cpu()->mutable_shared_object())[10] ^= 1;
  EXPECT_EQ(CpuExecutable::Load(std::move(tampered)).status().code(),
            absl::StatusCode::kDataLoss);

  grpc::ClientContext missing_ctx;
  std::vector<grpc::Slice> none;
  EXPECT_EQ(raw.Lookup(&missing_ctx, std::string(32, '\0'), &none).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

// The stub reuses completion queues across calls: calls in turn, calls from
// several threads at once, and calls after failed ones (NOT_FOUND, an
// expired deadline) each get their own, complete response.
TEST_F(RawLookupTest, ReusedQueuesServeSequentialConcurrentAndFailedCalls) {
  auto stub = daemon_->Stub();
  const v1::CompileRequest req = Request("chain10.json");
  grpc::ClientContext compile_ctx;
  v1::CompileResponse compiled;
  ASSERT_TRUE(stub->Compile(&compile_ctx, req, &compiled).ok());
  const std::string& binary = compiled.artifact().cpu().shared_object();

  RawLookupStub raw(grpc::CreateChannel(daemon_->address(),
                                        grpc::InsecureChannelCredentials()));
  auto lookup_ok = [&](const std::string& key) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(30));
    std::vector<grpc::Slice> slices;
    const grpc::Status s = raw.Lookup(&ctx, key, &slices);
    if (!s.ok()) return false;
    absl::StatusOr<ReceivedArtifact> got =
        ParseLookupResponse(std::move(slices));
    return got.ok() && Joined(got->binary()) == binary;
  };
  for (int i = 0; i < 20; ++i) EXPECT_TRUE(lookup_ok(compiled.guard_key()));

  // Failed calls leave their queue reusable.
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext missing_ctx;
    std::vector<grpc::Slice> none;
    EXPECT_EQ(
        raw.Lookup(&missing_ctx, std::string(32, '\0'), &none).error_code(),
        grpc::StatusCode::NOT_FOUND);
    grpc::ClientContext expired_ctx;
    expired_ctx.set_deadline(std::chrono::system_clock::now() -
                             std::chrono::seconds(1));
    EXPECT_EQ(
        raw.Lookup(&expired_ctx, compiled.guard_key(), &none).error_code(),
        grpc::StatusCode::DEADLINE_EXCEEDED);
    EXPECT_TRUE(lookup_ok(compiled.guard_key()));
  }

  constexpr int kThreads = 8;
  constexpr int kCallsEach = 10;
  std::atomic<int> good{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kCallsEach; ++i) {
        if (lookup_ok(compiled.guard_key())) good.fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(good.load(), kThreads * kCallsEach);
}

// kilnd on a Unix socket (--listen=unix:PATH): compile, then the raw Lookup
// hit, through a channel to unix:PATH (as --server/KILN_SERVER name it).
TEST(RawLookupUnixSocketTest, CompileAndLookupOverAUnixSocket) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      absl::StrCat("kiln_raw_lookup_unix_", getpid(), "_", rand());
  std::filesystem::create_directories(dir);
  const std::string address = "unix:" + (dir / "kilnd.sock").string();
  {
    Daemon daemon((dir / "data").string(), (dir / "port").string(),
                  {"--listen=" + address});
    ASSERT_GT(daemon.port(), 0) << "kilnd did not serve on " << address;
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(256 << 20);
    auto channel = grpc::CreateCustomChannel(
        address, grpc::InsecureChannelCredentials(), args);
    auto stub = v1::Kiln::NewStub(channel);
    grpc::ClientContext compile_ctx;
    v1::CompileResponse compiled;
    ASSERT_TRUE(
        stub->Compile(&compile_ctx, Request("chain10.json"), &compiled).ok());

    RawLookupStub raw(channel);
    grpc::ClientContext ctx;
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(raw.Lookup(&ctx, compiled.guard_key(), &slices).ok());
    absl::StatusOr<ReceivedArtifact> got =
        ParseLookupResponse(std::move(slices));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(Joined(got->binary()), compiled.artifact().cpu().shared_object());
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kiln::testing
