// Issue 18 items 2 and 4 in-process: the token file and its checks
// (server/auth.h), the compile pool's per-token limits and round-robin
// (server/compile_pool.h), and kilnd's TLS file check (server/tls_files.h).
#include "server/auth.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "server/compile_pool.h"
#include "server/tls_files.h"
#include "support/sha256.h"
#include "tests/server/test_certs.h"

namespace kiln {
namespace {

std::string HashOf(absl::string_view token) {
  return DigestToHex(Sha256(token));
}

class TempDir {
 public:
  TempDir()
      : path_(std::filesystem::temp_directory_path() /
              absl::StrCat("kiln_auth_test_", getpid(), "_", rand())) {
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string File(absl::string_view name, absl::string_view text) const {
    const std::string path = (path_ / std::string(name)).string();
    std::ofstream(path) << text;
    return path;
  }
  std::string Path(absl::string_view name) const {
    return (path_ / std::string(name)).string();
  }

 private:
  std::filesystem::path path_;
};

TEST(TokenFileTest, ParsesRolesNamesAndComments) {
  auto entries = ParseTokenFile(
      absl::StrCat("# a comment\n\n", HashOf("a"), " compile ci\n",
                   absl::AsciiStrToUpper(HashOf("b")), "\tcompile,read-stats\n",
                   HashOf("c"), " admin ops\n"),
      "tokens");
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 3u);
  EXPECT_EQ((*entries)[0].name, "ci");
  EXPECT_EQ((*entries)[0].roles, static_cast<uint32_t>(Role::kCompile));
  EXPECT_EQ((*entries)[1].name, "token-" + HashOf("b").substr(0, 8));
  EXPECT_EQ((*entries)[1].roles, static_cast<uint32_t>(Role::kCompile) |
                                     static_cast<uint32_t>(Role::kReadStats));
  EXPECT_EQ((*entries)[2].roles, 7u);  // admin implies the others
}

TEST(TokenFileTest, RefusesBadLinesNamingThem) {
  struct Case {
    std::string text;
    std::string message;
  } cases[] = {
      {"abc compile\n", "tokens:1: the first field is not a SHA-256"},
      {absl::StrCat("\n", HashOf("a"), " compile,root x\n"),
       "tokens:2: unknown role 'root'"},
      {absl::StrCat(HashOf("a"), "\n"), "tokens:1: 1 fields"},
      {absl::StrCat(HashOf("a"), " compile x\n", HashOf("a"), " admin y\n"),
       "tokens:2: a hash listed twice"},
      {absl::StrCat(HashOf("a"), " compile x\n", HashOf("b"), " admin x\n"),
       "tokens:2: the name 'x' is used twice"},
  };
  for (const Case& c : cases) {
    auto entries = ParseTokenFile(c.text, "tokens");
    ASSERT_FALSE(entries.ok()) << c.text;
    EXPECT_TRUE(absl::IsInvalidArgument(entries.status()));
    EXPECT_NE(entries.status().message().find(c.message), std::string::npos)
        << entries.status();
  }
}

TEST(AuthenticatorTest, ChecksTokensAndRolesWithClearErrors) {
  TempDir dir;
  const std::string path =
      dir.File("tokens", absl::StrCat(HashOf("tc"), " compile ci\n",
                                      HashOf("ts"), " read-stats grafana\n",
                                      HashOf("ta"), " admin ops\n"));
  auto auth = Authenticator::Load(path);
  ASSERT_TRUE(auth.ok()) << auth.status();
  const Authenticator& a = **auth;

  auto missing = a.Check("", Role::kCompile, "Compile");
  EXPECT_TRUE(absl::IsUnauthenticated(missing.status()));
  EXPECT_NE(missing.status().message().find("Compile needs a token"),
            std::string::npos);
  EXPECT_TRUE(absl::IsUnauthenticated(
      a.Check("tc", Role::kCompile, "Compile").status()));  // no "Bearer "
  EXPECT_TRUE(absl::IsUnauthenticated(
      a.Check("Bearer ", Role::kCompile, "Compile").status()));
  auto wrong = a.Check("Bearer tX", Role::kCompile, "Compile");
  EXPECT_TRUE(absl::IsUnauthenticated(wrong.status()));
  EXPECT_NE(wrong.status().message().find("unknown token"), std::string::npos);

  auto ci = a.Check("Bearer tc", Role::kCompile, "Compile");
  ASSERT_TRUE(ci.ok());
  EXPECT_EQ(ci->name, "ci");
  auto denied = a.Check("Bearer tc", Role::kAdmin, "Evict");
  EXPECT_TRUE(absl::IsPermissionDenied(denied.status()));
  EXPECT_EQ(denied.status().message(),
            "Evict needs the role 'admin', which token 'ci' does not have");
  EXPECT_TRUE(absl::IsPermissionDenied(
      a.Check("Bearer ts", Role::kCompile, "Lookup").status()));
  EXPECT_TRUE(a.Check("Bearer ts", Role::kReadStats, "GetStats").ok());
  for (Role role : {Role::kCompile, Role::kReadStats, Role::kAdmin})
    EXPECT_TRUE(a.Check("Bearer ta", role, "X").ok()) << RoleName(role);
}

TEST(TokenFileTest, ExpiresTakesRfc3339OrUnixSeconds) {
  auto entries = ParseTokenFile(
      absl::StrCat(HashOf("a"), " compile ci expires=2027-01-31T12:00:00Z\n",
                   HashOf("b"), " admin expires=1800000000\n", HashOf("c"),
                   " read-stats\n"),
      "tokens");
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 3u);
  EXPECT_EQ((*entries)[0].name, "ci");
  EXPECT_EQ((*entries)[0].expires,
            absl::FromCivil(absl::CivilSecond(2027, 1, 31, 12, 0, 0),
                            absl::UTCTimeZone()));
  EXPECT_EQ((*entries)[1].name, "token-" + HashOf("b").substr(0, 8));
  EXPECT_EQ((*entries)[1].expires, absl::FromUnixSeconds(1800000000));
  EXPECT_EQ((*entries)[2].expires, absl::InfiniteFuture());
  auto bad = ParseTokenFile(
      absl::StrCat(HashOf("a"), " compile ci expires=next-week\n"), "tokens");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(std::string(bad.status().message()),
            "tokens:1: expires='next-week' is neither RFC 3339 "
            "(2027-01-31T00:00:00Z) nor unix seconds (expected: sha256-hex "
            "roles [name] [expires=WHEN])");
}

TEST(AuthenticatorTest, AnExpiredTokenIsRefusedNamingWhen) {
  TempDir dir;
  const std::string path = dir.File(
      "tokens", absl::StrCat(HashOf("tc"), " compile ci expires=1800000000\n"));
  auto auth = Authenticator::Load(path);
  ASSERT_TRUE(auth.ok()) << auth.status();
  const absl::Time expires = absl::FromUnixSeconds(1800000000);
  EXPECT_TRUE((*auth)
                  ->Check("Bearer tc", Role::kCompile, "Compile",
                          expires - absl::Seconds(1))
                  .ok());
  auto expired =
      (*auth)->Check("Bearer tc", Role::kCompile, "Compile", expires);
  EXPECT_TRUE(absl::IsUnauthenticated(expired.status()));
  EXPECT_EQ(std::string(expired.status().message()),
            "Compile: token 'ci' expired at 2027-01-15T08:00:00Z");
}

TEST(CertRolesTest, ParsesLinesAndRefusesBadOnesNamingThem) {
  auto entries = ParseCertRolesFile(
      "# roles common-name\ncompile ci-runner\n\nadmin  ops bot \n", "roles");
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 2u);
  EXPECT_EQ((*entries)[0].common_name, "ci-runner");
  EXPECT_EQ((*entries)[0].roles, static_cast<uint32_t>(Role::kCompile));
  EXPECT_EQ((*entries)[1].common_name, "ops bot");
  EXPECT_EQ((*entries)[1].roles, 7u);
  struct Case {
    std::string text, message;
  } cases[] = {
      {"compile\n", "roles:1: no common name (expected: roles common-name)"},
      {"\nroot alice\n", "roles:2: unknown role 'root'"},
      {"compile alice\nadmin alice\n",
       "roles:2: the name 'alice' is listed twice"},
  };
  for (const Case& c : cases) {
    auto bad = ParseCertRolesFile(c.text, "roles");
    ASSERT_FALSE(bad.ok()) << c.text;
    EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
    EXPECT_NE(bad.status().message().find(c.message), std::string::npos)
        << bad.status();
  }
}

TEST(CertRolesTest, ChecksTheCommonNameAndItsRoles) {
  TempDir dir;
  const std::string path = dir.File("roles", "compile alice\nadmin ops\n");
  auto roles = CertRoles::Load(path);
  ASSERT_TRUE(roles.ok()) << roles.status();
  auto alice = (*roles)->Check("alice", Role::kCompile, "Compile");
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_EQ(alice->FairUseKey(), "client certificate 'alice'");
  auto denied = (*roles)->Check("alice", Role::kAdmin, "Evict");
  EXPECT_TRUE(absl::IsPermissionDenied(denied.status()));
  EXPECT_EQ(std::string(denied.status().message()),
            "Evict needs the role 'admin', which client certificate 'alice' "
            "does not have");
  EXPECT_TRUE((*roles)->Check("ops", Role::kAdmin, "Evict").ok());
  auto unknown = (*roles)->Check("mallory", Role::kCompile, "Compile");
  EXPECT_TRUE(absl::IsUnauthenticated(unknown.status()));
  EXPECT_EQ(std::string(unknown.status().message()),
            "Compile: client certificate 'mallory' is not in kilnd's client "
            "certificate roles file");
  EXPECT_TRUE(absl::IsUnauthenticated(
      (*roles)->Check("", Role::kCompile, "Compile").status()));
  dir.File("roles", "not-a-role alice\n");
  EXPECT_TRUE(absl::IsInvalidArgument((*roles)->Reload().status()));
  EXPECT_TRUE((*roles)->Check("alice", Role::kCompile, "Compile").ok());
  dir.File("roles", "read-stats mallory\n");
  ASSERT_TRUE((*roles)->Reload().ok());
  EXPECT_TRUE((*roles)->Check("mallory", Role::kReadStats, "GetStats").ok());
  EXPECT_TRUE(absl::IsUnauthenticated(
      (*roles)->Check("alice", Role::kCompile, "Compile").status()));
  EXPECT_TRUE(absl::IsNotFound(CertRoles::Load(dir.Path("none")).status()));
}

TEST(AuthenticatorTest, ReloadTakesTheNewFileAndKeepsTheOldOnError) {
  TempDir dir;
  const std::string path =
      dir.File("tokens", absl::StrCat(HashOf("old"), " compile old\n"));
  auto auth = Authenticator::Load(path);
  ASSERT_TRUE(auth.ok());
  dir.File("tokens", absl::StrCat(HashOf("new"), " compile new\n"));
  ASSERT_TRUE((*auth)->Reload().ok());
  EXPECT_TRUE(absl::IsUnauthenticated(
      (*auth)->Check("Bearer old", Role::kCompile, "Compile").status()));
  EXPECT_TRUE((*auth)->Check("Bearer new", Role::kCompile, "Compile").ok());
  dir.File("tokens", "not a token file\n");
  EXPECT_TRUE(absl::IsInvalidArgument((*auth)->Reload().status()));
  EXPECT_TRUE((*auth)->Check("Bearer new", Role::kCompile, "Compile").ok());
  std::filesystem::remove(path);
  EXPECT_FALSE((*auth)->Reload().ok());
  EXPECT_TRUE((*auth)->Check("Bearer new", Role::kCompile, "Compile").ok());
  EXPECT_TRUE(absl::IsNotFound(Authenticator::Load(path).status()));
}

// A task that blocks until released, recording when it started.
struct Gate {
  absl::Notification release;
  std::atomic<int> started{0};
};

TEST(CompilePoolFairUseTest, PerTokenQueueLimitRefusesWithTheTokensName) {
  Gate gate;
  CompilePool pool(/*threads=*/1, /*max_queue=*/64,
                   CompilePoolLimits{/*max_queued_per_identity=*/2, 0});
  auto blocker = [&] {
    gate.started.fetch_add(1);
    gate.release.WaitForNotification();
  };
  const std::string alice = "token 'alice'";
  ASSERT_TRUE(pool.SubmitFor(alice, blocker).ok());
  while (gate.started.load() == 0) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_TRUE(pool.SubmitFor(alice, [] {}).ok());
  ASSERT_TRUE(pool.SubmitFor(alice, [] {}).ok());
  absl::Status third = pool.SubmitFor(alice, [] {});
  EXPECT_TRUE(absl::IsResourceExhausted(third));
  EXPECT_NE(third.message().find("token 'alice' already has 2 compiles queued"),
            std::string::npos)
      << third;
  // Others are not refused for alice's burst; nor is the anonymous caller.
  EXPECT_TRUE(pool.SubmitFor("bob", [] {}).ok());
  EXPECT_TRUE(pool.Submit([] {}));
  EXPECT_EQ(pool.queued_for(alice), 2u);
  gate.release.Notify();
}

TEST(CompilePoolFairUseTest, QueuedTasksAreServedRoundRobinOverTokens) {
  Gate gate;
  CompilePool pool(/*threads=*/1, /*max_queue=*/64);
  std::mutex mu;
  std::vector<std::string> order;
  auto record = [&](std::string who) {
    return [&, who] {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(who);
    };
  };
  ASSERT_TRUE(pool.SubmitFor("alice",
                             [&] {
                               gate.started.fetch_add(1);
                               gate.release.WaitForNotification();
                             })
                  .ok());
  while (gate.started.load() == 0) absl::SleepFor(absl::Milliseconds(1));
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE(pool.SubmitFor("alice", record("alice")).ok());
  ASSERT_TRUE(pool.SubmitFor("bob", record("bob")).ok());
  ASSERT_TRUE(pool.SubmitFor("carol", record("carol")).ok());
  gate.release.Notify();
  while (pool.queue_depth() > 0 || pool.running_for("alice") > 0)
    absl::SleepFor(absl::Milliseconds(1));
  std::lock_guard<std::mutex> lock(mu);
  // Not first-come first-served (alice x4, bob, carol): bob and carol each
  // wait behind one of alice's.
  EXPECT_EQ(order, (std::vector<std::string>{"alice", "bob", "carol", "alice",
                                             "alice", "alice"}));
}

TEST(CompilePoolFairUseTest, RunningLimitLetsOthersUseTheThreads) {
  Gate gate;
  CompilePool pool(/*threads=*/2, /*max_queue=*/64,
                   CompilePoolLimits{0, /*max_running_per_identity=*/1});
  auto blocker = [&] {
    gate.started.fetch_add(1);
    gate.release.WaitForNotification();
  };
  ASSERT_TRUE(pool.SubmitFor("alice", blocker).ok());
  ASSERT_TRUE(pool.SubmitFor("alice", blocker).ok());
  absl::Notification bob_ran;
  ASSERT_TRUE(pool.SubmitFor("bob", [&] { bob_ran.Notify(); }).ok());
  // alice's second waits (she is at her limit of 1), so bob gets the
  // other thread at once.
  EXPECT_TRUE(bob_ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(gate.started.load(), 1);
  EXPECT_EQ(pool.running_for("alice"), 1);
  EXPECT_EQ(pool.queued_for("alice"), 1u);
  gate.release.Notify();
}

TEST(TlsFilesTest, AcceptsAMatchingPairAndNamesWhatIsWrong) {
  TempDir dir;
  testing::TestCert ca = testing::MakeCert("kiln test ca", nullptr, false);
  testing::TestCert server = testing::MakeCert("kilnd", &ca, true);
  testing::TestCert other = testing::MakeCert("other", &ca, true);
  testing::TestCert expired = testing::MakeCert("old", &ca, true, -7200, -3600);
  ca.Write(dir.Path("ca"));
  server.Write(dir.Path("server"));
  other.Write(dir.Path("other"));
  expired.Write(dir.Path("expired"));

  auto ok = CheckTlsFiles(
      {dir.Path("server.crt"), dir.Path("server.key"), dir.Path("ca.crt")});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_NE(ok->subject.find("CN=kilnd"), std::string::npos);
  EXPECT_EQ(ok->client_cas, 1);
  EXPECT_GT(ok->not_after, absl::Now());

  auto mismatch =
      CheckTlsFiles({dir.Path("server.crt"), dir.Path("other.key"), ""});
  EXPECT_TRUE(absl::IsInvalidArgument(mismatch.status()));
  EXPECT_NE(mismatch.status().message().find("is not the key of"),
            std::string::npos);
  auto old =
      CheckTlsFiles({dir.Path("expired.crt"), dir.Path("expired.key"), ""});
  EXPECT_TRUE(absl::IsInvalidArgument(old.status()));
  EXPECT_NE(old.status().message().find("expired at"), std::string::npos);
  EXPECT_TRUE(absl::IsNotFound(
      CheckTlsFiles({dir.Path("none.crt"), dir.Path("server.key"), ""})
          .status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      CheckTlsFiles({dir.Path("server.key"), dir.Path("server.key"), ""})
          .status()));
}

// The installer behind SIGHUP reloads: checked copies in a private
// directory, replaced only by files that pass the check.
TEST(TlsFilesTest, InstallerCopiesCheckedFilesPrivatelyAndKeepsThemOnError) {
  TempDir dir;
  testing::TestCert ca = testing::MakeCert("kiln test ca", nullptr, false);
  testing::MakeCert("kilnd", &ca, true).Write(dir.Path("a"));
  testing::MakeCert("kilnd", &ca, true).Write(dir.Path("b"));
  ca.Write(dir.Path("ca"));
  std::filesystem::copy_file(dir.Path("a.crt"), dir.Path("server.crt"));
  std::filesystem::copy_file(dir.Path("a.key"), dir.Path("server.key"));
  const TlsFiles source{dir.Path("server.crt"), dir.Path("server.key"),
                        dir.Path("ca.crt")};
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  TlsFilesInfo info;
  auto installer = TlsFileInstaller::Create(source, dir.Path("copies"), &info);
  ASSERT_TRUE(installer.ok()) << installer.status();
  EXPECT_EQ(info.client_cas, 1);
  const TlsFiles& installed = (*installer)->installed();
  EXPECT_EQ(read(installed.cert_chain), read(dir.Path("a.crt")));
  EXPECT_EQ(read(installed.client_ca), read(dir.Path("ca.crt")));
  struct stat st = {};
  ASSERT_EQ(stat(dir.Path("copies").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(stat(installed.private_key.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  auto same = (*installer)->Reload();
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_FALSE(same->changed);
  EXPECT_EQ((*installer)->generation(), 1);

  // A key of another certificate: refused, the copies stay.
  std::filesystem::copy_file(dir.Path("b.key"), dir.Path("server.key"),
                             std::filesystem::copy_options::overwrite_existing);
  auto mismatch = (*installer)->Reload();
  EXPECT_TRUE(absl::IsInvalidArgument(mismatch.status()));
  EXPECT_EQ(read(installed.private_key), read(dir.Path("a.key")));
  EXPECT_EQ((*installer)->generation(), 1);

  std::filesystem::copy_file(dir.Path("b.crt"), dir.Path("server.crt"),
                             std::filesystem::copy_options::overwrite_existing);
  auto changed = (*installer)->Reload();
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(changed->changed);
  EXPECT_EQ((*installer)->generation(), 2);
  EXPECT_EQ(read(installed.cert_chain), read(dir.Path("b.crt")));
  EXPECT_EQ(read(installed.private_key), read(dir.Path("b.key")));

  // A directory with someone else's files is never emptied.
  auto foreign = TlsFileInstaller::Create(source, dir.Path(""));
  EXPECT_TRUE(absl::IsFailedPrecondition(foreign.status()));
  EXPECT_TRUE(std::filesystem::exists(dir.Path("a.crt")));
  installer->reset();
  EXPECT_FALSE(std::filesystem::exists(dir.Path("copies")));
}

}  // namespace
}  // namespace kiln
