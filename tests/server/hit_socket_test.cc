// kilnd's hit socket (server/hit_socket_server.h, client/hit_socket_client.h)
// against a real kilnd: it answers what gRPC's Lookup answers, byte for
// byte; bad input closes only that connection; LookupChannel finds it,
// falls back to gRPC when it fails or is off, and the daemon stops cleanly
// with connections open.
#include <sys/socket.h>

#include <filesystem>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/hit_socket_client.h"
#include "gtest/gtest.h"
#include "kiln/v1/service.grpc.pb.h"
#include "support/hit_wire.h"
#include "tests/server/daemon.h"

namespace kiln::testing {
namespace {

std::string Joined(const std::vector<grpc::Slice>& slices) {
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

absl::Time Soon() { return absl::Now() + absl::Seconds(30); }

TEST(HitWireTest, HeadersRoundTripAndBadOnesAreDataLoss) {
  char request[hit_wire::kRequestHeaderBytes];
  hit_wire::EncodeRequestHeader(34, request);
  uint32_t length = 0;
  ASSERT_TRUE(hit_wire::DecodeRequestHeader(request, &length).ok());
  EXPECT_EQ(length, 34u);
  hit_wire::EncodeRequestHeader(hit_wire::kMaxRequestBytes + 1, request);
  EXPECT_TRUE(
      absl::IsDataLoss(hit_wire::DecodeRequestHeader(request, &length)));
  char bad[hit_wire::kRequestHeaderBytes] = {'G', 'E', 'T', ' ',
                                             '/', ' ', 'H', 'T'};
  EXPECT_TRUE(absl::IsDataLoss(hit_wire::DecodeRequestHeader(bad, &length)));

  char response[hit_wire::kResponseHeaderBytes];
  uint32_t code = 0;
  hit_wire::EncodeResponseHeader(5, 1000, response);
  ASSERT_TRUE(
      hit_wire::DecodeResponseHeader(response, 1000, &code, &length).ok());
  EXPECT_EQ(code, 5u);
  EXPECT_EQ(length, 1000u);
  EXPECT_TRUE(absl::IsDataLoss(
      hit_wire::DecodeResponseHeader(response, 999, &code, &length)));
  hit_wire::EncodeResponseHeader(17, 0, response);
  EXPECT_TRUE(absl::IsDataLoss(
      hit_wire::DecodeResponseHeader(response, 10, &code, &length)));

  std::string host, port;
  ASSERT_TRUE(hit_wire::SplitHostPort("127.0.0.1:7733", &host, &port));
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, "7733");
  ASSERT_TRUE(hit_wire::SplitHostPort("dns:///kilnd.svc:7733", &host, &port));
  EXPECT_EQ(host, "kilnd.svc");
  ASSERT_TRUE(hit_wire::SplitHostPort("[::1]:80", &host, &port));
  EXPECT_EQ(host, "::1");
  EXPECT_FALSE(hit_wire::SplitHostPort("::1:80", &host, &port));
  EXPECT_FALSE(hit_wire::SplitHostPort("unix:/tmp/x", &host, &port));
  EXPECT_FALSE(hit_wire::SplitHostPort("host:99999", &host, &port));
}

class HitSocketTest : public DaemonTest {
 protected:
  // The guard key of a compiled example graph.
  std::string CompileExample() {
    grpc::ClientContext ctx;
    v1::CompileResponse compiled;
    EXPECT_TRUE(daemon_->Stub()
                    ->Compile(&ctx, Request("chain10.json"), &compiled)
                    .ok());
    return compiled.guard_key();
  }
  v1::ServerInfo Info() {
    grpc::ClientContext ctx;
    v1::ServerInfo info;
    EXPECT_TRUE(daemon_->Stub()
                    ->GetServerInfo(&ctx, v1::GetServerInfoRequest(), &info)
                    .ok());
    return info;
  }
  std::string HitAddress() {
    return absl::StrCat("127.0.0.1:", Info().hit_socket().tcp_port());
  }
  v1::Stats Stats() {
    grpc::ClientContext ctx;
    v1::Stats stats;
    EXPECT_TRUE(
        daemon_->Stub()->GetStats(&ctx, v1::GetStatsRequest(), &stats).ok());
    return stats;
  }
};

TEST_F(HitSocketTest, AnswersWhatGrpcLookupAnswers) {
  const v1::ServerInfo info = Info();
  EXPECT_FALSE(info.version().empty());
  // --listen=127.0.0.1:0 in auto mode: a free port of its own.
  ASSERT_GT(info.hit_socket().tcp_port(), 0u);
  EXPECT_NE(static_cast<int>(info.hit_socket().tcp_port()), daemon_->port());
  const std::string key = CompileExample();

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  RawLookupStub raw(grpc::CreateCustomChannel(
      daemon_->address(), grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext ctx;
  std::vector<grpc::Slice> via_grpc;
  ASSERT_TRUE(raw.Lookup(&ctx, key, &via_grpc).ok());

  const uint64_t hits_before = Stats().hits();
  HitSocketClient hit(HitAddress());
  for (int i = 0; i < 3; ++i) {  // the connection is kept and reused
    std::vector<grpc::Slice> via_socket;
    ASSERT_TRUE(hit.Lookup(key, Soon(), &via_socket).ok());
    EXPECT_EQ(Joined(via_socket), Joined(via_grpc));
    absl::StatusOr<ReceivedArtifact> got =
        ParseLookupResponse(std::move(via_socket));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->artifact().guard_key(), key);
  }
  EXPECT_EQ(Stats().hits(), hits_before + 3);

  std::vector<grpc::Slice> none;
  absl::Status missing = hit.Lookup(std::string(32, '\0'), Soon(), &none);
  EXPECT_TRUE(absl::IsNotFound(missing)) << missing;
  absl::Status short_key = hit.Lookup("abc", Soon(), &none);
  EXPECT_TRUE(absl::IsInvalidArgument(short_key)) << short_key;
  EXPECT_NE(short_key.message().find("32 bytes"), std::string::npos);
  // Errors leave the connection usable.
  std::vector<grpc::Slice> again;
  EXPECT_TRUE(hit.Lookup(key, Soon(), &again).ok());
}

// Bytes that are not the protocol close that connection only: the hit
// socket and gRPC keep serving, the cache is unchanged.
TEST_F(HitSocketTest, BadInputClosesTheConnectionOnly) {
  const std::string key = CompileExample();
  const std::string address = HitAddress();
  const uint64_t entries = Stats().entries();
  const std::vector<std::string> bad_inputs = {
      "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
      // A header announcing more than kMaxRequestBytes.
      std::string("KLQ1\xff\xff\xff\x7f", 8),
      // A valid header, then bytes that are not a LookupRequest.
      std::string("KLQ1\x04\0\0\0\xff\xff\xff\xff", 12),
  };
  for (const std::string& input : bad_inputs) {
    absl::StatusOr<hit_wire::UniqueFd> fd = hit_wire::Connect(address, Soon());
    ASSERT_TRUE(fd.ok()) << fd.status();
    const absl::string_view pieces[] = {input};
    ASSERT_TRUE(hit_wire::WriteFull(fd->get(), pieces, Soon()).ok());
    char reply[hit_wire::kResponseHeaderBytes];
    absl::Status s =
        hit_wire::ReadFull(fd->get(), reply, sizeof(reply), Soon());
    if (s.ok()) {
      // Parsed framing with a bad body gets an error response, not a close.
      uint32_t code = 0, length = 0;
      ASSERT_TRUE(
          hit_wire::DecodeResponseHeader(reply, 1 << 20, &code, &length).ok());
      EXPECT_EQ(code,
                static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
    } else {
      EXPECT_TRUE(absl::IsOutOfRange(s) || absl::IsUnavailable(s)) << s;
    }
  }
  HitSocketClient hit(address);
  std::vector<grpc::Slice> got;
  EXPECT_TRUE(hit.Lookup(key, Soon(), &got).ok());
  EXPECT_EQ(Stats().entries(), entries);
}

TEST_F(HitSocketTest, LookupChannelUsesTheHitSocketAndFallsBackToGrpc) {
  const std::string key = CompileExample();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  auto channel = grpc::CreateCustomChannel(
      daemon_->address(), grpc::InsecureChannelCredentials(), args);
  LookupChannel channel_lookup(channel, daemon_->address(), true);
  auto lookup = [&](LookupChannel& l, const std::string& k) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(30));
    std::vector<grpc::Slice> slices;
    return l.Lookup(&ctx, k, &slices);
  };
  ASSERT_TRUE(lookup(channel_lookup, key).ok());
  EXPECT_EQ(channel_lookup.hit_socket_address(), HitAddress());
  EXPECT_EQ(lookup(channel_lookup, std::string(32, '\0')).error_code(),
            grpc::StatusCode::NOT_FOUND);

  LookupChannel grpc_only(channel, daemon_->address(), false);
  ASSERT_TRUE(lookup(grpc_only, key).ok());
  EXPECT_EQ(grpc_only.hit_socket_address(), "");
}

// A full hit socket (--hit_max_connections) closes new connections at once;
// their Lookups are served through gRPC instead.
TEST(HitSocketLimitsTest, FullOrOffHitSocketFallsBackToGrpc) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      absl::StrCat("kiln_hit_socket_", getpid(), "_", rand());
  std::filesystem::create_directories(dir);
  for (const std::string flag :
       {"--hit_max_connections=1", "--hit_listen=off"}) {
    Daemon daemon((dir / "data").string(), (dir / "port").string(), {flag});
    ASSERT_GT(daemon.port(), 0);
    grpc::ClientContext compile_ctx;
    v1::CompileResponse compiled;
    ASSERT_TRUE(daemon.Stub()
                    ->Compile(&compile_ctx, Request("chain10.json"), &compiled)
                    .ok());
    grpc::ClientContext info_ctx;
    v1::ServerInfo info;
    ASSERT_TRUE(
        daemon.Stub()
            ->GetServerInfo(&info_ctx, v1::GetServerInfoRequest(), &info)
            .ok());
    // With --hit_max_connections=1 this client holds the only connection.
    std::unique_ptr<HitSocketClient> holder;
    if (flag == "--hit_listen=off") {
      EXPECT_FALSE(info.has_hit_socket());
    } else {
      const std::string address =
          absl::StrCat("127.0.0.1:", info.hit_socket().tcp_port());
      holder = std::make_unique<HitSocketClient>(address);
      std::vector<grpc::Slice> held;
      ASSERT_TRUE(holder->Lookup(compiled.guard_key(), Soon(), &held).ok());
      HitSocketClient second(address);
      std::vector<grpc::Slice> refused;
      absl::Status s = second.Lookup(compiled.guard_key(), Soon(), &refused);
      EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    }
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(256 << 20);
    LookupChannel lookup(
        grpc::CreateCustomChannel(daemon.address(),
                                  grpc::InsecureChannelCredentials(), args),
        daemon.address(), true);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(30));
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(lookup.Lookup(&ctx, compiled.guard_key(), &slices).ok())
        << flag;
    EXPECT_EQ(lookup.hit_socket_address(), "") << flag;
    absl::StatusOr<ReceivedArtifact> got =
        ParseLookupResponse(std::move(slices));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->artifact().guard_key(), compiled.guard_key());
  }
  std::filesystem::remove_all(dir);
}

// A started daemon with `flags`, the guard key of a compiled example, and its
// hit socket's address.
struct HitDaemon {
  explicit HitDaemon(const std::vector<std::string>& flags)
      : dir(MadeDir(std::filesystem::temp_directory_path() /
                    absl::StrCat("kiln_hit_limits_", getpid(), "_", rand()))),
        daemon((dir / "data").string(), (dir / "port").string(), flags) {
    if (daemon.port() == 0) return;
    grpc::ClientContext compile_ctx;
    v1::CompileResponse compiled;
    EXPECT_TRUE(daemon.Stub()
                    ->Compile(&compile_ctx, Request("chain10.json"), &compiled)
                    .ok());
    key = compiled.guard_key();
    grpc::ClientContext info_ctx;
    v1::ServerInfo info;
    EXPECT_TRUE(
        daemon.Stub()
            ->GetServerInfo(&info_ctx, v1::GetServerInfoRequest(), &info)
            .ok());
    address = absl::StrCat("127.0.0.1:", info.hit_socket().tcp_port());
  }
  ~HitDaemon() { std::filesystem::remove_all(dir); }
  static std::filesystem::path MadeDir(const std::filesystem::path& path) {
    std::filesystem::create_directories(path);
    return path;
  }
  std::filesystem::path dir;
  Daemon daemon;
  std::string key;
  std::string address;
};

// `count` connections to `address` that each send `sent` (nothing if empty)
// and then nothing more.
std::vector<hit_wire::UniqueFd> Stalled(const std::string& address, int count,
                                        absl::string_view sent) {
  std::vector<hit_wire::UniqueFd> fds;
  for (int i = 0; i < count; ++i) {
    absl::StatusOr<hit_wire::UniqueFd> fd = hit_wire::Connect(address, Soon());
    EXPECT_TRUE(fd.ok()) << fd.status();
    if (!fd.ok()) break;
    if (!sent.empty()) {
      const absl::string_view pieces[] = {sent};
      EXPECT_TRUE(hit_wire::WriteFull(fd->get(), pieces, Soon()).ok());
    }
    fds.push_back(*std::move(fd));
  }
  return fds;
}

// Whether the server closed `fd` (end of file or reset) within `timeout`.
bool ClosedByServer(int fd, absl::Duration timeout) {
  char byte;
  absl::Status s = hit_wire::ReadFull(fd, &byte, 1, absl::Now() + timeout);
  return absl::IsOutOfRange(s) || absl::IsUnavailable(s);
}

// Issue 18.6: 300 connections that send one byte of a request and then
// nothing (slow-loris) hold every slot only until the request limit
// (--hit_request_timeout_ms, 1 s here, 10 s by default) passes: then they
// are closed and a client gets its hits on the hit socket again.
TEST(HitSocketLimitsTest, SlowConnectionsDoNotHoldTheSlots) {
  HitDaemon d({"--hit_request_timeout_ms=1000"});
  ASSERT_GT(d.daemon.port(), 0);
  ASSERT_FALSE(d.key.empty());
  const absl::Time start = absl::Now();
  std::vector<hit_wire::UniqueFd> slow = Stalled(d.address, 300, "K");
  ASSERT_EQ(slow.size(), 300u);
  // Hits through the hit socket itself (no gRPC fallback) within the bound:
  // the request limit plus slack for the 2-core box.
  const absl::Duration bound = absl::Seconds(1) + absl::Seconds(4);
  absl::Status last;
  int attempts = 0;
  for (;;) {
    HitSocketClient hit(d.address);
    std::vector<grpc::Slice> got;
    ++attempts;
    last = hit.Lookup(d.key, absl::Now() + absl::Seconds(5), &got);
    if (last.ok()) {
      absl::StatusOr<ReceivedArtifact> parsed =
          ParseLookupResponse(std::move(got));
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      EXPECT_EQ(parsed->artifact().guard_key(), d.key);
      break;
    }
    ASSERT_LT(absl::Now() - start, bound)
        << "no hit on the hit socket while 300 slow connections were open: "
        << last;
    absl::SleepFor(absl::Milliseconds(50));
  }
  std::cout << "hit after " << absl::Now() - start << " (" << attempts
            << " attempts)\n";
  // The slow connections were closed by the server, not left open.
  int closed = 0;
  for (const hit_wire::UniqueFd& fd : slow)
    closed += ClosedByServer(fd.get(), absl::Seconds(3)) ? 1 : 0;
  EXPECT_EQ(closed, 300);
}

// A request that trickles in (a byte every 200 ms) is cut at the limit too:
// the limit runs from its first byte, not from the last one.
TEST(HitSocketLimitsTest, TricklingRequestIsClosedAtTheLimit) {
  HitDaemon d({"--hit_request_timeout_ms=1000"});
  ASSERT_GT(d.daemon.port(), 0);
  std::vector<hit_wire::UniqueFd> fds = Stalled(d.address, 1, "");
  ASSERT_EQ(fds.size(), 1u);
  const absl::Time start = absl::Now();
  // A header announcing 1000 bytes, then its body one byte at a time.
  char header[hit_wire::kRequestHeaderBytes];
  hit_wire::EncodeRequestHeader(1000, header);
  std::string stream(header, sizeof(header));
  stream.append(1000, 'x');
  bool closed = false;
  for (size_t i = 0; i < stream.size() && !closed; ++i) {
    if (::send(fds[0].get(), &stream[i], 1, MSG_NOSIGNAL) != 1) {
      closed = true;
      break;
    }
    closed = ClosedByServer(fds[0].get(), absl::Milliseconds(200));
    ASSERT_LT(absl::Now() - start, absl::Seconds(5)) << "never closed";
  }
  EXPECT_TRUE(closed);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(900));
}

// With every slot taken by idle connections, a new one closes the
// longest-idle one (idle connections beyond half of the slots go first)
// and gets its hit on the hit socket.
TEST(HitSocketLimitsTest, IdleConnectionsMakeRoomWhenSlotsRunOut) {
  HitDaemon d({"--hit_max_connections=8"});
  ASSERT_GT(d.daemon.port(), 0);
  std::vector<hit_wire::UniqueFd> idle;
  for (int i = 0; i < 8; ++i) {
    std::vector<hit_wire::UniqueFd> one = Stalled(d.address, 1, "");
    ASSERT_EQ(one.size(), 1u);
    idle.push_back(std::move(one[0]));
    absl::SleepFor(absl::Milliseconds(30));  // a clear order of idleness
  }
  std::vector<std::unique_ptr<HitSocketClient>> clients;
  for (int i = 0; i < 4; ++i) {
    clients.push_back(std::make_unique<HitSocketClient>(d.address));
    std::vector<grpc::Slice> got;
    absl::Status s = clients.back()->Lookup(d.key, Soon(), &got);
    EXPECT_TRUE(s.ok()) << "client " << i << ": " << s;
  }
  // The four longest idle went, in that order; the others stay.
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(
        ClosedByServer(idle[i].get(), absl::Milliseconds(i < 4 ? 2000 : 100)),
        i < 4)
        << "idle connection " << i;
  }
}

// kilnd on a Unix socket advertises PATH.hits; a client that reaches gRPC
// on a Unix socket uses it. SIGTERM with a hit connection open stops
// cleanly (exit 0) and removes the socket file.
TEST(HitSocketUnixTest, UnixSocketAndCleanStopWithOpenConnections) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      absl::StrCat("kiln_hit_unix_", getpid(), "_", rand());
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "kilnd.sock").string();
  Daemon daemon((dir / "data").string(), (dir / "port").string(),
                {"--listen=unix:" + path});
  ASSERT_GT(daemon.port(), 0);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  auto channel = grpc::CreateCustomChannel(
      "unix:" + path, grpc::InsecureChannelCredentials(), args);
  grpc::ClientContext compile_ctx;
  v1::CompileResponse compiled;
  ASSERT_TRUE(v1::Kiln::NewStub(channel)
                  ->Compile(&compile_ctx, Request("chain10.json"), &compiled)
                  .ok());
  LookupChannel lookup(channel, "unix:" + path, true);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(lookup.Lookup(&ctx, compiled.guard_key(), &slices).ok());
  EXPECT_EQ(lookup.hit_socket_address(), "unix:" + path + ".hits");
  EXPECT_TRUE(std::filesystem::exists(path + ".hits"));
  // The channel's hit connection stays open while the daemon stops.
  EXPECT_EQ(daemon.Stop(), 0);
  EXPECT_FALSE(std::filesystem::exists(path + ".hits"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kiln::testing
