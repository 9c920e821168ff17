// Issue 18 items 1, 2 and 4 against a real kilnd: TLS and mTLS handshakes
// (certificates made here, tests/server/test_certs.h), certificate reload,
// every RPC x each role x {missing, wrong, removed-after-SIGHUP, right}
// token, the hit socket with tokens and with TLS, kiln::Client and kilnctl
// with a token, the refusal to serve off loopback unprotected, and the
// per-token compile queue limit.
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/connection.h"
#include "client/hit_socket_client.h"
#include "client/kiln_client.h"
#include "gtest/gtest.h"
#include "server/auth.h"
#include "support/sha256.h"
#include "tests/server/daemon.h"
#include "tests/server/test_certs.h"

namespace kiln::testing {
namespace {

// The tokens the tests hand out, by role.
constexpr char kCompileToken[] = "compile-token-0123456789";
constexpr char kStatsToken[] = "stats-token-0123456789";
constexpr char kAdminToken[] = "admin-token-0123456789";

std::string TokenLine(absl::string_view token, absl::string_view roles,
                      absl::string_view name) {
  return absl::StrCat(DigestToHex(Sha256(token)), " ", roles, " ", name, "\n");
}

std::string AllTokens() {
  return absl::StrCat(TokenLine(kCompileToken, "compile", "ci"),
                      TokenLine(kStatsToken, "read-stats", "grafana"),
                      TokenLine(kAdminToken, "admin", "ops"));
}

absl::Time Soon() { return absl::Now() + absl::Seconds(20); }

// A stub over `credentials` (plaintext when null).
std::unique_ptr<v1::Kiln::Stub> StubFor(
    const std::string& address,
    std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection each
  return v1::Kiln::NewStub(grpc::CreateCustomChannel(
      address, credentials ? credentials : grpc::InsecureChannelCredentials(),
      args));
}

// chain30 over `rows` rows: a graph of its own key per `rows`.
v1::CompileRequest Chain30(int rows) {
  v1::CompileRequest req = Request("chain30.json");
  req.mutable_graph()
      ->mutable_inputs(0)
      ->mutable_meta()
      ->mutable_sizes(0)
      ->set_value(rows);
  return req;
}

// Sends `requests` together: each on a connection of its own, made and
// connected (TLS handshake done) before any is sent, so that they reach
// kilnd within a moment of each other and not one compile apart.
std::vector<grpc::Status> CompileAtOnce(
    const std::string& address,
    std::shared_ptr<grpc::ChannelCredentials> credentials,
    const std::string& token, const std::vector<v1::CompileRequest>& requests) {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<v1::Kiln::Stub>> stubs;
  for (size_t i = 0; i < requests.size(); ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    channels.push_back(grpc::CreateCustomChannel(
        address, credentials ? credentials : grpc::InsecureChannelCredentials(),
        args));
    EXPECT_TRUE(channels.back()->WaitForConnected(
        absl::ToChronoTime(absl::Now() + absl::Seconds(20))));
    stubs.push_back(v1::Kiln::NewStub(channels.back()));
  }
  std::atomic<bool> go{false};
  std::vector<grpc::Status> statuses(requests.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < requests.size(); ++i) {
    threads.emplace_back([&, i] {
      grpc::ClientContext ctx;
      if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
      v1::CompileResponse r;
      while (!go.load()) std::this_thread::yield();
      statuses[i] = stubs[i]->Compile(&ctx, requests[i], &r);
    });
  }
  go.store(true);
  for (std::thread& t : threads) t.join();
  return statuses;
}

class AuthDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("kiln_auth_daemon_test_", getpid(), "_", rand());
    std::filesystem::create_directories(dir_);
    WriteFile("tokens", AllTokens());
  }
  void TearDown() override {
    daemon_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::string Path(absl::string_view name) const {
    return (dir_ / std::string(name)).string();
  }
  // Written whole, then renamed into place (as an operator should).
  void WriteFile(absl::string_view name, absl::string_view text) {
    const std::string tmp = Path(absl::StrCat(name, ".tmp"));
    std::ofstream(tmp) << text;
    std::filesystem::rename(tmp, Path(name));
  }
  void Start(std::vector<std::string> flags) {
    daemon_ = std::make_unique<Daemon>(Path("data"), Path("port"), flags);
  }
  std::string TokensFlag() const { return "--auth_tokens=" + Path("tokens"); }

  std::filesystem::path dir_;
  std::unique_ptr<Daemon> daemon_;
};

// One RPC of kiln.v1.Kiln, called with `ctx`.
struct Rpc {
  std::string name;
  Role role;
  std::function<grpc::Status(v1::Kiln::Stub&, grpc::ClientContext*)> call;
};

std::vector<Rpc> EveryRpc(const std::string& key) {
  const v1::CompileRequest chain = Request("chain10.json");
  return {
      {"Compile", Role::kCompile,
       [chain](v1::Kiln::Stub& s, grpc::ClientContext* ctx) {
         v1::CompileResponse r;
         return s.Compile(ctx, chain, &r);
       }},
      {"Lookup", Role::kCompile,
       [key](v1::Kiln::Stub& s, grpc::ClientContext* ctx) {
         v1::LookupRequest req;
         req.set_guard_key(key);
         v1::LookupResponse r;
         return s.Lookup(ctx, req, &r);
       }},
      {"ExplainKey", Role::kCompile,
       [chain](v1::Kiln::Stub& s, grpc::ClientContext* ctx) {
         v1::ExplainKeyResponse r;
         return s.ExplainKey(ctx, chain, &r);
       }},
      {"GetServerInfo", Role::kCompile,
       [](v1::Kiln::Stub& s, grpc::ClientContext* ctx) {
         v1::ServerInfo r;
         return s.GetServerInfo(ctx, v1::GetServerInfoRequest(), &r);
       }},
      {"GetStats", Role::kReadStats,
       [](v1::Kiln::Stub& s, grpc::ClientContext* ctx) {
         v1::Stats r;
         return s.GetStats(ctx, v1::GetStatsRequest(), &r);
       }},
      {"ListEntries", Role::kAdmin,
       [](v1::Kiln::Stub& s, grpc::ClientContext* ctx) {
         v1::ListEntriesResponse r;
         return s.ListEntries(ctx, v1::ListEntriesRequest(), &r);
       }},
      {"Evict", Role::kAdmin,
       [](v1::Kiln::Stub& s, grpc::ClientContext* ctx) {
         v1::EvictRequest req;
         req.set_guard_key(std::string(32, '\x01'));  // none such: evicts 0
         v1::EvictResponse r;
         return s.Evict(ctx, req, &r);
       }},
  };
}

grpc::Status CallWith(const Rpc& rpc, v1::Kiln::Stub& stub,
                      const std::string& token) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(Soon()));
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  return rpc.call(stub, &ctx);
}

std::string CompileWith(v1::Kiln::Stub& stub, const std::string& token) {
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer " + token);
  v1::CompileResponse r;
  grpc::Status s = stub.Compile(&ctx, Request("chain10.json"), &r);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return r.guard_key();
}

TEST_F(AuthDaemonTest, EveryRpcChecksEachRoleAndToken) {
  Start({TokensFlag()});
  ASSERT_GT(daemon_->port(), 0);
  auto stub = StubFor(daemon_->address());
  const std::string key = CompileWith(*stub, kCompileToken);
  const std::map<std::string, uint32_t> tokens = {
      {kCompileToken, static_cast<uint32_t>(Role::kCompile)},
      {kStatsToken, static_cast<uint32_t>(Role::kReadStats)},
      {kAdminToken, 7u}};
  for (const Rpc& rpc : EveryRpc(key)) {
    SCOPED_TRACE(rpc.name);
    grpc::Status missing = CallWith(rpc, *stub, "");
    EXPECT_EQ(missing.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_NE(missing.error_message().find(rpc.name + " needs a token"),
              std::string::npos)
        << missing.error_message();
    grpc::Status wrong = CallWith(rpc, *stub, "not-a-token");
    EXPECT_EQ(wrong.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_NE(wrong.error_message().find("unknown token"), std::string::npos);
    for (const auto& [token, roles] : tokens) {
      grpc::Status s = CallWith(rpc, *stub, token);
      if (roles & static_cast<uint32_t>(rpc.role)) {
        EXPECT_TRUE(s.ok()) << token << ": " << s.error_message();
      } else {
        EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << token;
        EXPECT_NE(s.error_message().find(absl::StrCat("needs the role '",
                                                      RoleName(rpc.role), "'")),
                  std::string::npos)
            << s.error_message();
      }
    }
  }
  // SIGHUP: the compile token removed, a new one added; a broken file
  // afterwards keeps what was in force.
  WriteFile("tokens", absl::StrCat(TokenLine(kAdminToken, "admin", "ops"),
                                   TokenLine("fresh-token", "compile", "new")));
  daemon_->Signal(SIGHUP);
  const std::vector<Rpc> rpcs = EveryRpc(key);
  const absl::Time until = absl::Now() + absl::Seconds(20);
  while (CallWith(rpcs[3], *stub, kCompileToken).ok() && absl::Now() < until)
    absl::SleepFor(absl::Milliseconds(20));
  for (const Rpc& rpc : rpcs) {
    SCOPED_TRACE(rpc.name);
    EXPECT_EQ(CallWith(rpc, *stub, kCompileToken).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(CallWith(rpc, *stub, kStatsToken).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_TRUE(CallWith(rpc, *stub, kAdminToken).ok());
  }
  EXPECT_TRUE(CallWith(rpcs[0], *stub, "fresh-token").ok());
  WriteFile("tokens", "garbage\n");
  daemon_->Signal(SIGHUP);
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_TRUE(CallWith(rpcs[0], *stub, "fresh-token").ok());
  EXPECT_EQ(daemon_->Stop(), 0);
}

TEST_F(AuthDaemonTest, HitSocketNeedsACompileTokenInTheRequest) {
  Start({TokensFlag()});
  ASSERT_GT(daemon_->port(), 0);
  auto stub = StubFor(daemon_->address());
  const std::string key = CompileWith(*stub, kCompileToken);
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kCompileToken));
  v1::ServerInfo info;
  ASSERT_TRUE(
      stub->GetServerInfo(&ctx, v1::GetServerInfoRequest(), &info).ok());
  ASSERT_GT(info.hit_socket().tcp_port(), 0u);
  const std::string address =
      absl::StrCat("127.0.0.1:", info.hit_socket().tcp_port());
  std::vector<grpc::Slice> response;
  absl::Status none = HitSocketClient(address).Lookup(key, Soon(), &response);
  EXPECT_TRUE(absl::IsUnauthenticated(none)) << none;
  absl::Status wrong =
      HitSocketClient(address, "Bearer nope").Lookup(key, Soon(), &response);
  EXPECT_TRUE(absl::IsUnauthenticated(wrong)) << wrong;
  absl::Status stats =
      HitSocketClient(address, absl::StrCat("Bearer ", kStatsToken))
          .Lookup(key, Soon(), &response);
  EXPECT_TRUE(absl::IsPermissionDenied(stats)) << stats;
  EXPECT_NE(stats.message().find("HitSocketLookup needs the role 'compile'"),
            std::string::npos);
  EXPECT_TRUE(HitSocketClient(address, absl::StrCat("Bearer ", kCompileToken))
                  .Lookup(key, Soon(), &response)
                  .ok());

  // kiln::Client with a token: compiles, then a second client hits on the
  // hit socket; without one: UNAUTHENTICATED.
  ClientOptions options;
  options.server = daemon_->address();
  options.connection.token = kCompileToken;
  options.max_retries = 0;
  v1::CompileRequest chain30 = Request("chain30.json");
  auto first = Client::Connect(options);
  ASSERT_TRUE(first.ok());
  auto exe = (*first)->GetExecutable(chain30);
  ASSERT_TRUE(exe.ok()) << exe.status();
  auto second = Client::Connect(options);
  ASSERT_TRUE((*second)->GetExecutable(chain30).ok());
  EXPECT_EQ((*second)->counters().lookup_hits, 1u);
  ClientOptions anonymous = options;
  anonymous.connection.token.clear();
  auto refused = (*Client::Connect(anonymous))->GetExecutable(chain30);
  EXPECT_TRUE(absl::IsUnauthenticated(refused.status())) << refused.status();
  // A token file works as the token does.
  WriteFile("my-token", absl::StrCat(kCompileToken, "\n"));
  ClientOptions from_file = anonymous;
  from_file.connection.token_file = Path("my-token");
  EXPECT_TRUE((*Client::Connect(from_file))->GetExecutable(chain30).ok());
}

TEST_F(AuthDaemonTest, KilnctlTakesATokenFromAFlagOrTheEnvironment) {
  Start({TokensFlag()});
  ASSERT_GT(daemon_->port(), 0);
  auto run = [&](const std::string& args) {
    const std::string command =
        absl::StrCat(KILN_KILNCTL, " --server=", daemon_->address(), " ", args,
                     " > ", Path("out"), " 2>&1");
    const int status = std::system(command.c_str());
    std::ifstream in(Path("out"));
    std::string text((std::istreambuf_iterator<char>(in)), {});
    return std::make_pair(WEXITSTATUS(status), text);
  };
  // The standard health service stays open (load balancers' probes).
  auto [code, text] = run("health");
  EXPECT_EQ(code, 0) << text;
  std::tie(code, text) = run("stats");
  EXPECT_EQ(code, 1);
  EXPECT_NE(text.find("UNAUTHENTICATED"), std::string::npos) << text;
  std::tie(code, text) = run(absl::StrCat("--token=", kStatsToken, " stats"));
  EXPECT_EQ(code, 0) << text;
  std::tie(code, text) = run(absl::StrCat("--token=", kStatsToken, " ls"));
  EXPECT_EQ(code, 1);
  EXPECT_NE(text.find("PERMISSION_DENIED: ListEntries needs the role 'admin'"),
            std::string::npos)
      << text;
  std::tie(code, text) =
      run(absl::StrCat("--token=", kAdminToken, " evict --all"));
  EXPECT_EQ(code, 0) << text;
  setenv("KILN_TOKEN", kCompileToken, 1);
  std::tie(code, text) =
      run(absl::StrCat("compile ", ExamplesDir(), "/chain10.json"));
  unsetenv("KILN_TOKEN");
  EXPECT_EQ(code, 0) << text;
}

TEST_F(AuthDaemonTest, RefusesToServeOffLoopbackUnprotected) {
  struct Case {
    std::vector<std::string> flags;
    int exit_code;
  };
  TestCert ca = MakeCert("kiln test ca", nullptr, false);
  MakeCert("kilnd", &ca, true).Write(Path("server"));
  MakeCert("kilnd", &ca, true, -7200, -3600).Write(Path("expired"));
  const std::string tls_flags[] = {"--tls_cert=" + Path("server.crt"),
                                   "--tls_key=" + Path("server.key")};
  const Case cases[] = {
      {{"--listen=0.0.0.0:0"}, 2},
      {{"--listen=0.0.0.0:0", TokensFlag()}, 2},  // tokens, no TLS
      {{"--listen=0.0.0.0:0", tls_flags[0], tls_flags[1]}, 2},  // no tokens
      {{TokensFlag(), "--metrics_listen=0.0.0.0:0"}, 2},
      {{TokensFlag(), "--hit_listen=0.0.0.0:0"}, 2},
      {{"--tls_client_ca=" + Path("server.crt")}, 2},  // mTLS without TLS
      {{"--tls_cert=" + Path("server.crt")}, 2},       // no key
      {{"--tls_cert=" + Path("expired.crt"),
        "--tls_key=" + Path("expired.key")},
       1},
      {{"--auth_tokens=" + Path("no-such-file")}, 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrJoin(c.flags, " "));
    Start(c.flags);
    EXPECT_EQ(daemon_->port(), 0);
    EXPECT_EQ(daemon_->early_exit(), c.exit_code);
  }
  // TLS and tokens: off loopback is fine, the hit socket moves to loopback.
  Start({"--listen=0.0.0.0:0", tls_flags[0], tls_flags[1], TokensFlag()});
  ASSERT_GT(daemon_->port(), 0);
  EXPECT_EQ(daemon_->Stop(), 0);
  // --insecure_listen: the operator's explicit word.
  Start({"--listen=0.0.0.0:0", "--insecure_listen", "--hit_listen=off"});
  ASSERT_GT(daemon_->port(), 0);
}

TEST_F(AuthDaemonTest, TlsAndMtlsHandshakesAndCertificateReload) {
  TestCert ca = MakeCert("kiln test ca", nullptr, false);
  TestCert other_ca = MakeCert("another ca", nullptr, false);
  ca.Write(Path("ca"));
  other_ca.Write(Path("other_ca"));
  MakeCert("kilnd", &ca, true).Write(Path("server"));
  MakeCert("alice", &ca, false).Write(Path("client"));
  MakeCert("mallory", &other_ca, false).Write(Path("foreign_client"));
  MakeCert("bob", &ca, false, -7200, -3600).Write(Path("expired_client"));
  Start({TokensFlag(), "--tls_cert=" + Path("server.crt"),
         "--tls_key=" + Path("server.key"),
         "--tls_client_ca=" + Path("ca.crt")});
  ASSERT_GT(daemon_->port(), 0);

  auto tls_client = [&](const std::string& ca_name,
                        const std::string& client_name) {
    ConnectionOptions o;
    o.tls_ca = Path(ca_name + ".crt");
    if (!client_name.empty()) {
      o.tls_cert = Path(client_name + ".crt");
      o.tls_key = Path(client_name + ".key");
    }
    o.token = kAdminToken;
    absl::StatusOr<Connection> c = ResolveConnection(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c;
  };
  auto info = [&](const absl::StatusOr<Connection>& c, v1::ServerInfo* out) {
    auto stub = StubFor(daemon_->address(), c->credentials);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    AddAuthorization(*c, &ctx);
    return stub->GetServerInfo(&ctx, v1::GetServerInfoRequest(), out);
  };
  v1::ServerInfo server_info;
  grpc::Status ok = info(tls_client("ca", "client"), &server_info);
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  // Over loopback the hit socket is advertised (served on loopback only).
  EXPECT_GT(server_info.hit_socket().tcp_port(), 0u);

  struct Refused {
    std::string what, ca, client;
  } refused[] = {
      {"server certificate from another CA", "other_ca", "client"},
      {"no client certificate", "ca", ""},
      {"client certificate from another CA", "ca", "foreign_client"},
      {"expired client certificate", "ca", "expired_client"},
  };
  for (const Refused& r : refused) {
    SCOPED_TRACE(r.what);
    v1::ServerInfo unused;
    EXPECT_EQ(info(tls_client(r.ca, r.client), &unused).error_code(),
              grpc::StatusCode::UNAVAILABLE);
  }
  {
    SCOPED_TRACE("plaintext");
    auto stub = StubFor(daemon_->address());
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::ServerInfo unused;
    EXPECT_EQ(stub->GetServerInfo(&ctx, v1::GetServerInfoRequest(), &unused)
                  .error_code(),
              grpc::StatusCode::UNAVAILABLE);
  }

  // kiln::Client over mTLS with a token, its hits on the loopback socket.
  ClientOptions options;
  options.server = daemon_->address();
  options.max_retries = 0;
  options.connection.tls_ca = Path("ca.crt");
  options.connection.tls_cert = Path("client.crt");
  options.connection.tls_key = Path("client.key");
  options.connection.token = kCompileToken;
  const v1::CompileRequest chain10 = Request("chain10.json");
  ASSERT_TRUE((*Client::Connect(options))->GetExecutable(chain10).ok());
  auto again = Client::Connect(options);
  auto exe = (*again)->GetExecutable(chain10);
  ASSERT_TRUE(exe.ok()) << exe.status();
  EXPECT_EQ((*again)->counters().lookup_hits, 1u);

  // Reload: the server's certificate and key replaced by one from another
  // CA; new handshakes use it soon after SIGHUP.
  MakeCert("kilnd", &other_ca, true).Write(Path("next"));
  std::filesystem::rename(Path("next.key"), Path("server.key.tmp"));
  std::filesystem::rename(Path("next.crt"), Path("server.crt.tmp"));
  std::filesystem::rename(Path("server.key.tmp"), Path("server.key"));
  std::filesystem::rename(Path("server.crt.tmp"), Path("server.crt"));
  daemon_->Signal(SIGHUP);  // checks and installs them
  const absl::Time until = absl::Now() + absl::Seconds(20);
  grpc::Status with_new_ca;
  do {
    absl::SleepFor(absl::Milliseconds(200));
    with_new_ca = info(tls_client("other_ca", "client"), &server_info);
  } while (!with_new_ca.ok() && absl::Now() < until);
  EXPECT_TRUE(with_new_ca.ok()) << with_new_ca.error_message();
  v1::ServerInfo unused;
  EXPECT_EQ(info(tls_client("ca", "client"), &unused).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(daemon_->Stop(), 0);
}

// SIGHUP installs new TLS files, and only then: files rotated on disk are
// not served before it (a client trusting only the new CA fails), are
// within a few seconds after it (server certificate and mTLS client CA
// together), and files that fail the check (garbage, an expired
// certificate, a key of another certificate) are never served: the old
// certificate stays, the failure is counted.
TEST_F(AuthDaemonTest, SighupInstallsCheckedTlsFilesAndOnlyThen) {
  TestCert ca_a = MakeCert("ca A", nullptr, false);
  TestCert ca_b = MakeCert("ca B", nullptr, false);
  TestCert clients_x = MakeCert("client ca X", nullptr, false);
  TestCert clients_y = MakeCert("client ca Y", nullptr, false);
  ca_a.Write(Path("ca_a"));
  ca_b.Write(Path("ca_b"));
  MakeCert("alice", &clients_x, false).Write(Path("alice_x"));
  MakeCert("bob", &clients_y, false).Write(Path("bob_y"));
  MakeCert("kilnd", &ca_a, true).Write(Path("a"));
  MakeCert("kilnd", &ca_b, true).Write(Path("b"));
  MakeCert("kilnd", &ca_b, true, -7200, -3600).Write(Path("expired"));
  clients_x.Write(Path("clients_x"));
  clients_y.Write(Path("clients_y"));
  auto install = [&](const std::string& cert, const std::string& key,
                     const std::string& client_ca) {
    std::filesystem::copy_file(
        Path(key), Path("server.key.tmp"),
        std::filesystem::copy_options::overwrite_existing);
    std::filesystem::copy_file(
        Path(cert), Path("server.crt.tmp"),
        std::filesystem::copy_options::overwrite_existing);
    std::filesystem::copy_file(
        Path(client_ca), Path("clients.crt.tmp"),
        std::filesystem::copy_options::overwrite_existing);
    std::filesystem::rename(Path("server.key.tmp"), Path("server.key"));
    std::filesystem::rename(Path("server.crt.tmp"), Path("server.crt"));
    std::filesystem::rename(Path("clients.crt.tmp"), Path("clients.crt"));
  };
  install("a.crt", "a.key", "clients_x.crt");
  Start({TokensFlag(), "--tls_cert=" + Path("server.crt"),
         "--tls_key=" + Path("server.key"),
         "--tls_client_ca=" + Path("clients.crt")});
  ASSERT_GT(daemon_->port(), 0);

  // GetServerInfo (or, with `stats`, GetStats) over a fresh connection that
  // trusts only `ca` and presents `client`.
  auto call = [&](const std::string& ca, const std::string& client,
                  v1::Stats* stats = nullptr) {
    ConnectionOptions o;
    o.tls_ca = Path(ca + ".crt");
    o.tls_cert = Path(client + ".crt");
    o.tls_key = Path(client + ".key");
    o.token = kAdminToken;
    absl::StatusOr<Connection> c = ResolveConnection(o);
    EXPECT_TRUE(c.ok()) << c.status();
    auto stub = StubFor(daemon_->address(), c->credentials);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    AddAuthorization(*c, &ctx);
    if (stats != nullptr)
      return stub->GetStats(&ctx, v1::GetStatsRequest(), stats);
    v1::ServerInfo unused;
    return stub->GetServerInfo(&ctx, v1::GetServerInfoRequest(), &unused);
  };
  // Polls `call(ca, client)` until it succeeds or `within` passes.
  auto ok_within = [&](const std::string& ca, const std::string& client,
                       absl::Duration within) {
    const absl::Time until = absl::Now() + within;
    grpc::Status s;
    do {
      s = call(ca, client);
      if (s.ok()) break;
      absl::SleepFor(absl::Milliseconds(100));
    } while (absl::Now() < until);
    return s;
  };
  grpc::Status first = call("ca_a", "alice_x");
  ASSERT_TRUE(first.ok()) << first.error_message();

  // kilnd's private copies: a directory only it can read.
  struct stat st = {};
  ASSERT_EQ(stat(Path("data-tls").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(stat(Path("data-tls/current/key.pem").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  // Rotated on disk, no signal: gRPC (which re-reads what it watches every
  // second) still serves A and takes only X's clients.
  install("b.crt", "b.key", "clients_y.crt");
  absl::SleepFor(absl::Milliseconds(2500));
  EXPECT_EQ(call("ca_b", "bob_y").error_code(), grpc::StatusCode::UNAVAILABLE);
  grpc::Status still_a = call("ca_a", "alice_x");
  EXPECT_TRUE(still_a.ok()) << still_a.error_message();

  // SIGHUP: B and client CA Y within a few seconds; A and X no more.
  daemon_->Signal(SIGHUP);
  grpc::Status now_b = ok_within("ca_b", "bob_y", absl::Seconds(5));
  ASSERT_TRUE(now_b.ok()) << now_b.error_message();
  EXPECT_EQ(call("ca_a", "alice_x").error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(call("ca_b", "alice_x").error_code(),
            grpc::StatusCode::UNAVAILABLE);

  // Files that fail the check, each followed by SIGHUP: B stays.
  struct Bad {
    std::string what, cert, key;
  } bad[] = {
      {"garbage certificate", "garbage.crt", "b.key"},
      {"expired certificate", "expired.crt", "expired.key"},
      {"key of another certificate", "a.crt", "b.key"},
  };
  std::ofstream(Path("garbage.crt")) << "not a certificate\n";
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what);
    install(b.cert, b.key, "clients_y.crt");
    daemon_->Signal(SIGHUP);
    absl::SleepFor(absl::Milliseconds(2500));
    grpc::Status kept = call("ca_b", "bob_y");
    EXPECT_TRUE(kept.ok()) << kept.error_message();
  }
  v1::Stats stats;
  grpc::Status got = call("ca_b", "bob_y", &stats);
  ASSERT_TRUE(got.ok()) << got.error_message();
  EXPECT_EQ(stats.reload_failures(), 3u);

  // Good files again: served after the next SIGHUP.
  install("a.crt", "a.key", "clients_x.crt");
  daemon_->Signal(SIGHUP);
  grpc::Status back_to_a = ok_within("ca_a", "alice_x", absl::Seconds(5));
  EXPECT_TRUE(back_to_a.ok()) << back_to_a.error_message();
  EXPECT_EQ(daemon_->Stop(), 0);
  EXPECT_FALSE(std::filesystem::exists(Path("data-tls")));  // removed at exit
}

// --tls_refresh_seconds=N: files renewed without a signal (a mounted
// Kubernetes Secret) are checked every N seconds and installed if valid.
TEST_F(AuthDaemonTest, TlsRefreshSecondsInstallsRenewedFilesWithoutASignal) {
  TestCert ca_a = MakeCert("ca A", nullptr, false);
  TestCert ca_b = MakeCert("ca B", nullptr, false);
  ca_a.Write(Path("ca_a"));
  ca_b.Write(Path("ca_b"));
  MakeCert("kilnd", &ca_a, true).Write(Path("server"));
  Start({TokensFlag(), "--tls_cert=" + Path("server.crt"),
         "--tls_key=" + Path("server.key"), "--tls_refresh_seconds=1"});
  ASSERT_GT(daemon_->port(), 0);
  auto call = [&](const std::string& ca) {
    ConnectionOptions o;
    o.tls_ca = Path(ca + ".crt");
    o.token = kCompileToken;
    absl::StatusOr<Connection> c = ResolveConnection(o);
    EXPECT_TRUE(c.ok()) << c.status();
    auto stub = StubFor(daemon_->address(), c->credentials);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    AddAuthorization(*c, &ctx);
    v1::ServerInfo unused;
    return stub->GetServerInfo(&ctx, v1::GetServerInfoRequest(), &unused);
  };
  ASSERT_TRUE(call("ca_a").ok());
  MakeCert("kilnd", &ca_b, true).Write(Path("next"));
  std::filesystem::rename(Path("next.key"), Path("server.key"));
  std::filesystem::rename(Path("next.crt"), Path("server.crt"));
  const absl::Time until = absl::Now() + absl::Seconds(10);
  grpc::Status with_b;
  do {
    absl::SleepFor(absl::Milliseconds(200));
    with_b = call("ca_b");
  } while (!with_b.ok() && absl::Now() < until);
  EXPECT_TRUE(with_b.ok()) << with_b.error_message();
  EXPECT_EQ(daemon_->Stop(), 0);
}

// A token line's expires= (RFC 3339 or unix seconds): past it, the token
// gets UNAUTHENTICATED naming the token and the time.
TEST_F(AuthDaemonTest, AnExpiredTokenIsRefused) {
  const std::string future = absl::FormatTime(
      absl::RFC3339_sec, absl::Now() + absl::Hours(24), absl::UTCTimeZone());
  WriteFile("tokens", absl::StrCat(DigestToHex(Sha256("old-token")),
                                   " compile old expires=1700000000\n",
                                   DigestToHex(Sha256("new-token")),
                                   " compile new expires=", future, "\n"));
  Start({TokensFlag()});
  ASSERT_GT(daemon_->port(), 0);
  auto stub = StubFor(daemon_->address());
  const Rpc info = EveryRpc("")[3];
  ASSERT_EQ(info.name, "GetServerInfo");
  grpc::Status expired = CallWith(info, *stub, "old-token");
  EXPECT_EQ(expired.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(expired.error_message(),
            "GetServerInfo: token 'old' expired at 2023-11-14T22:13:20Z");
  grpc::Status valid = CallWith(info, *stub, "new-token");
  EXPECT_TRUE(valid.ok()) << valid.error_message();
  EXPECT_EQ(daemon_->Stop(), 0);
}

// --client_cert_roles under mTLS: a caller without a token gets the roles
// of its client certificate's common name; an unlisted certificate is
// UNAUTHENTICATED; a token still counts when kilnd has tokens; SIGHUP
// re-reads the file (a broken one keeps the previous roles).
TEST_F(AuthDaemonTest, ClientCertificateRolesUnderMtls) {
  TestCert ca = MakeCert("kiln test ca", nullptr, false);
  ca.Write(Path("ca"));
  MakeCert("kilnd", &ca, true).Write(Path("server"));
  for (const char* name : {"alice", "ops", "mallory"})
    MakeCert(name, &ca, false).Write(Path(name));
  WriteFile("roles", "compile alice\nadmin ops\n");
  Start({TokensFlag(), "--tls_cert=" + Path("server.crt"),
         "--tls_key=" + Path("server.key"), "--tls_client_ca=" + Path("ca.crt"),
         "--client_cert_roles=" + Path("roles")});
  ASSERT_GT(daemon_->port(), 0);
  std::map<std::string, std::unique_ptr<v1::Kiln::Stub>> stubs;
  for (const char* name : {"alice", "ops", "mallory"}) {
    ConnectionOptions o;
    o.tls_ca = Path("ca.crt");
    o.tls_cert = Path(absl::StrCat(name, ".crt"));
    o.tls_key = Path(absl::StrCat(name, ".key"));
    absl::StatusOr<Connection> c = ResolveConnection(o);
    ASSERT_TRUE(c.ok()) << c.status();
    stubs[name] = StubFor(daemon_->address(), c->credentials);
  }
  const std::vector<Rpc> rpcs = EveryRpc(std::string(32, '\x02'));
  auto rpc = [&](const std::string& name) {
    for (const Rpc& r : rpcs)
      if (r.name == name) return r;
    ADD_FAILURE() << name;
    return rpcs[0];
  };
  auto call = [&](const std::string& who, const std::string& method,
                  const std::string& token = "") {
    return CallWith(rpc(method), *stubs[who], token);
  };
  // alice: compile only.
  for (const char* method : {"Compile", "Lookup", "GetServerInfo"}) {
    grpc::Status s = call("alice", method);
    EXPECT_NE(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << method;
    EXPECT_NE(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << method;
  }
  grpc::Status denied = call("alice", "Evict");
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(denied.error_message(),
            "Evict needs the role 'admin', which client certificate 'alice' "
            "does not have");
  // ops: admin.
  for (const char* method : {"Evict", "ListEntries", "GetStats"}) {
    grpc::Status s = call("ops", method);
    EXPECT_TRUE(s.ok()) << method << ": " << s.error_message();
  }
  // mallory: a valid certificate, not listed; a token still counts.
  grpc::Status unlisted = call("mallory", "GetServerInfo");
  EXPECT_EQ(unlisted.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(unlisted.error_message(),
            "GetServerInfo: client certificate 'mallory' is not in kilnd's "
            "client certificate roles file");
  grpc::Status with_token = call("mallory", "Evict", kAdminToken);
  EXPECT_TRUE(with_token.ok()) << with_token.error_message();
  EXPECT_EQ(call("mallory", "Evict", "wrong-token").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  // SIGHUP: a broken file keeps the roles; a good one replaces them.
  WriteFile("roles", "superuser alice\n");
  daemon_->Signal(SIGHUP);
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_TRUE(call("alice", "GetServerInfo").ok());
  WriteFile("roles", "read-stats mallory\n");
  daemon_->Signal(SIGHUP);
  const absl::Time until = absl::Now() + absl::Seconds(5);
  grpc::Status mallory_stats;
  do {
    absl::SleepFor(absl::Milliseconds(100));
    mallory_stats = call("mallory", "GetStats");
  } while (!mallory_stats.ok() && absl::Now() < until);
  EXPECT_TRUE(mallory_stats.ok()) << mallory_stats.error_message();
  EXPECT_EQ(call("alice", "GetServerInfo").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  v1::Stats stats;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(
        stubs["mallory"]->GetStats(&ctx, v1::GetStatsRequest(), &stats).ok());
  }
  EXPECT_EQ(stats.reload_failures(), 1u);
  EXPECT_EQ(daemon_->Stop(), 0);
}

TEST_F(AuthDaemonTest, OneTokensBurstIsCappedAndOthersStillCompile) {
  WriteFile("tokens", absl::StrCat(TokenLine("alice-token", "compile", "alice"),
                                   TokenLine("bob-token", "compile", "bob")));
  Start({TokensFlag(), "--compile_threads=1",
         "--max_queued_compiles_per_token=1"});
  ASSERT_GT(daemon_->port(), 0);
  // Distinct graphs (distinct keys), sent together.
  std::vector<v1::CompileRequest> burst;
  for (int i = 0; i < 6; ++i) burst.push_back(Chain30(100 + i));
  // bob compiles while alice's burst is refused: his own queue is empty.
  grpc::Status bob;
  std::thread bob_thread([&] {
    bob = CompileAtOnce(daemon_->address(), nullptr, "bob-token",
                        {Chain30(200)})[0];
  });
  const std::vector<grpc::Status> alice =
      CompileAtOnce(daemon_->address(), nullptr, "alice-token", burst);
  bob_thread.join();
  int exhausted = 0, compiled = 0;
  for (const grpc::Status& s : alice) {
    if (s.ok()) ++compiled;
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++exhausted;
      EXPECT_NE(s.error_message().find("token 'alice' already has 1 compiles "
                                       "queued"),
                std::string::npos)
          << s.error_message();
    }
  }
  // At most one queued (and one running) at a time: of six sent together,
  // some are refused; those that got in compiled.
  EXPECT_GE(exhausted, 1);
  EXPECT_GE(compiled, 1);
  EXPECT_EQ(exhausted + compiled, 6);
  EXPECT_TRUE(bob.ok()) << bob.error_message();
}

TEST_F(AuthDaemonTest, UnderMtlsWithoutTokensLimitsArePerCertificate) {
  TestCert ca = MakeCert("kiln test ca", nullptr, false);
  ca.Write(Path("ca"));
  MakeCert("kilnd", &ca, true).Write(Path("server"));
  MakeCert("alice", &ca, false).Write(Path("alice"));
  MakeCert("bob", &ca, false).Write(Path("bob"));
  Start({"--tls_cert=" + Path("server.crt"), "--tls_key=" + Path("server.key"),
         "--tls_client_ca=" + Path("ca.crt"), "--compile_threads=1",
         "--max_queued_compiles_per_token=1"});
  ASSERT_GT(daemon_->port(), 0);
  auto stub_for = [&](const std::string& who) {
    ConnectionOptions o;
    o.tls_ca = Path("ca.crt");
    o.tls_cert = Path(who + ".crt");
    o.tls_key = Path(who + ".key");
    return StubFor(daemon_->address(), ResolveConnection(o)->credentials);
  };
  // The hit socket stays off: it would let local callers skip the
  // certificate check.
  {
    grpc::ClientContext ctx;
    v1::ServerInfo info;
    ASSERT_TRUE(stub_for("alice")
                    ->GetServerInfo(&ctx, v1::GetServerInfoRequest(), &info)
                    .ok());
    EXPECT_FALSE(info.has_hit_socket());
  }
  auto credentials = [&](const std::string& who) {
    ConnectionOptions o;
    o.tls_ca = Path("ca.crt");
    o.tls_cert = Path(who + ".crt");
    o.tls_key = Path(who + ".key");
    return ResolveConnection(o)->credentials;
  };
  std::vector<v1::CompileRequest> burst;
  for (int i = 0; i < 6; ++i) burst.push_back(Chain30(300 + i));
  const std::vector<grpc::Status> alice =
      CompileAtOnce(daemon_->address(), credentials("alice"), "", burst);
  int exhausted = 0;
  for (const grpc::Status& s : alice) {
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++exhausted;
      EXPECT_NE(s.error_message().find("client certificate 'alice' already "
                                       "has 1 compiles queued"),
                std::string::npos)
          << s.error_message();
    } else {
      EXPECT_TRUE(s.ok()) << s.error_message();
    }
  }
  EXPECT_GE(exhausted, 1);
  grpc::Status bob = CompileAtOnce(daemon_->address(), credentials("bob"), "",
                                   {Chain30(400)})[0];
  EXPECT_TRUE(bob.ok()) << bob.error_message();
}

}  // namespace
}  // namespace kiln::testing
