// kilnctl end to end: the real kilnctl binary, run as a subprocess against a
// real kilnd on an ephemeral loopback port (tests/server/daemon.h).
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/host_target.h"
#include "client/kiln_client.h"
#include "compiler/cpu_backend.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "kiln/v1/service.pb.h"
#include "tests/server/daemon.h"

namespace kiln::testing {
namespace {

struct Result {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

std::ostream& operator<<(std::ostream& os, const Result& r) {
  return os << "exit " << r.exit_code << ", output:\n" << r.output;
}

// Runs `binary` with `args`; returns its exit status and output.
Result RunBinary(const std::string& binary,
                 const std::vector<std::string>& args) {
  std::vector<std::string> all = {binary};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  int fds[2];
  Result result;
  if (pipe2(fds, O_CLOEXEC) != 0) return result;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  pid_t pid = -1;
  const int spawned =
      posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (spawned != 0) {
    close(fds[0]);
    result.output = absl::StrCat("posix_spawn failed: ", spawned);
    return result;
  }
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) result.output.append(buf, n);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// Runs kilnctl with `args`; returns its exit status and output.
Result Kilnctl(const std::vector<std::string>& args) {
  return RunBinary(KILN_KILNCTL, args);
}

// The 64 hex digits after "key" at the start of a line, or "".
std::string KeyIn(const std::string& output) {
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    if (absl::ConsumePrefix(&line, "key")) {
      line = absl::StripAsciiWhitespace(line);
      if (line.size() == 64) return std::string(line);
    }
  }
  return "";
}

std::string Example(const std::string& file) {
  return absl::StrCat(KILN_EXAMPLES_DIR, "/", file);
}

class KilnctlTest : public DaemonTest {
 protected:
  // kilnctl --server=<the daemon> args...
  Result Run(std::vector<std::string> args) {
    args.insert(args.begin(), "--server=" + daemon_->address());
    return Kilnctl(args);
  }
  v1::Stats StatsJson() {
    const Result r = Run({"stats", "--json"});
    EXPECT_EQ(r.exit_code, 0) << r;
    for (const char* key :
         {"entries", "bytes", "hits", "misses", "compiles", "joins",
          "evictions", "corrupt", "compile_seconds_saved"}) {
      EXPECT_TRUE(absl::StrContains(r.output, absl::StrCat("\"", key, "\":")))
          << key << " missing: " << r;
    }
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r;
    v1::Stats stats;
    EXPECT_TRUE(
        google::protobuf::util::JsonStringToMessage(r.output, &stats).ok())
        << r;
    return stats;
  }
  std::string WriteFile(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
};

// public-key prints what kilnd signs with: the key `kilnd --print_public_key`
// prints on kilnd's host (the daemon's key next to its data dir).
TEST_F(KilnctlTest, PublicKeyIsKilndsSigningKey) {
  const Result r = Run({"public-key"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const std::string printed(absl::StripAsciiWhitespace(r.output));
  EXPECT_EQ(printed.size(), 64u) << r;
  const Result local = RunBinary(
      KILN_KILND,
      {"--data_dir=" + (dir_ / "data").string(), "--print_public_key"});
  ASSERT_EQ(local.exit_code, 0) << local;
  EXPECT_EQ(std::string(absl::StripAsciiWhitespace(local.output)), printed);
  EXPECT_EQ(Run({"public-key", "extra"}).exit_code, 2);

  // compile --run loads the artifact only if it is signed by a trusted key.
  const Result trusted = Run({"compile", Example("chain10.json"), "--run",
                              "--trusted_keys=" + printed});
  EXPECT_EQ(trusted.exit_code, 0) << trusted;
  EXPECT_TRUE(absl::StrContains(trusted.output, "signed   by a trusted key"))
      << trusted;
  const Result stranger = Run({"compile", Example("chain10.json"), "--run",
                               "--trusted_keys=" + std::string(64, 'a')});
  EXPECT_EQ(stranger.exit_code, 1) << stranger;
  EXPECT_TRUE(absl::StrContains(stranger.output, "PERMISSION_DENIED"))
      << stranger;
  EXPECT_FALSE(absl::StrContains(stranger.output, "PASS")) << stranger;
}

TEST_F(KilnctlTest, Health) {
  const Result r = Run({"health"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(absl::StrContains(r.output, "SERVING")) << r;
}

// info names the hit socket; bench takes it by default and gRPC with
// --hit_socket=false, and says which road it took.
TEST_F(KilnctlTest, InfoAndBenchRoads) {
  const Result info = Run({"info"});
  ASSERT_EQ(info.exit_code, 0) << info;
  EXPECT_TRUE(absl::StrContains(info.output, "hit socket  TCP port ")) << info;
  const Result hit = Run({"bench", Example("chain10.json"), "--requests=20"});
  ASSERT_EQ(hit.exit_code, 0) << hit;
  EXPECT_TRUE(absl::StrContains(hit.output, "road     hit socket 127.0.0.1:"))
      << hit;
  const Result grpc = Run({"bench", Example("chain10.json"), "--requests=20",
                           "--hit_socket=false"});
  ASSERT_EQ(grpc.exit_code, 0) << grpc;
  EXPECT_TRUE(absl::StrContains(grpc.output, "road     gRPC Lookup")) << grpc;
}

TEST_F(KilnctlTest, CompileRunHitStatsExplainLsEvict) {
  const Result compiled = Run({"compile", Example("chain10.json"), "--run"});
  ASSERT_EQ(compiled.exit_code, 0) << compiled;
  EXPECT_TRUE(absl::StrContains(compiled.output, "compiled")) << compiled;
  EXPECT_TRUE(absl::StrContains(compiled.output, "PASS")) << compiled;
  EXPECT_FALSE(absl::StrContains(compiled.output, "FAIL")) << compiled;
  const std::string key = KeyIn(compiled.output);
  ASSERT_EQ(key.size(), 64u) << compiled;

  // The key is the server's.
  {
    grpc::ClientContext ctx;
    v1::ListEntriesResponse list;
    ASSERT_TRUE(daemon_->Stub()
                    ->ListEntries(&ctx, v1::ListEntriesRequest(), &list)
                    .ok());
    ASSERT_EQ(list.entries_size(), 1);
    EXPECT_EQ(absl::BytesToHexString(list.entries(0).guard_key()), key);
  }

  const Result hit = Run({"compile", Example("chain10.json"), "--run"});
  ASSERT_EQ(hit.exit_code, 0) << hit;
  EXPECT_TRUE(absl::StrContains(hit.output, "hit")) << hit;
  EXPECT_TRUE(absl::StrContains(hit.output, "PASS")) << hit;
  EXPECT_EQ(KeyIn(hit.output), key);

  const v1::Stats stats = StatsJson();
  EXPECT_EQ(stats.compiles(), 1u);
  EXPECT_GE(stats.hits(), 1u);
  EXPECT_EQ(stats.entries(), 1u);

  const Result table = Run({"stats"});
  EXPECT_EQ(table.exit_code, 0) << table;
  for (const char* row : {"entries", "hits", "misses", "compiles", "joins",
                          "evictions", "corrupt", "compile time saved"}) {
    EXPECT_TRUE(absl::StrContains(table.output, row)) << row << table;
  }

  const Result explain = Run({"explain", Example("chain10.json")});
  EXPECT_EQ(explain.exit_code, 0) << explain;
  EXPECT_EQ(KeyIn(explain.output), key) << explain;
  for (const char* part : {"graph", "compiler", "aten.sin.default"}) {
    EXPECT_TRUE(absl::StrContains(explain.output, part)) << part << explain;
  }

  const Result ls = Run({"ls"});
  EXPECT_EQ(ls.exit_code, 0) << ls;
  EXPECT_TRUE(absl::StrContains(ls.output, key)) << ls;
  EXPECT_TRUE(absl::StrContains(ls.output, "1 entry")) << ls;

  const Result evict = Run({"evict", "--all"});
  EXPECT_EQ(evict.exit_code, 0) << evict;
  EXPECT_TRUE(absl::StrContains(evict.output, "evicted 1")) << evict;
  EXPECT_EQ(StatsJson().entries(), 0u);
  const Result empty = Run({"ls"});
  EXPECT_FALSE(absl::StrContains(empty.output, key)) << empty;

  // Evict one entry by a key prefix; an unknown key fails.
  ASSERT_EQ(Run({"compile", Example("chain10.json")}).exit_code, 0);
  const Result by_prefix = Run({"evict", key.substr(0, 12)});
  EXPECT_EQ(by_prefix.exit_code, 0) << by_prefix;
  EXPECT_TRUE(absl::StrContains(by_prefix.output, "evicted 1")) << by_prefix;
  const Result again = Run({"evict", key});
  EXPECT_NE(again.exit_code, 0) << again;
  EXPECT_TRUE(absl::StrContains(again.output, "no entry")) << again;
}

TEST_F(KilnctlTest, MalformedGraphNamesTheNodeAndOp) {
  const std::string path = WriteFile("bad.json", R"({
    "inputs": [{"name": "x", "meta": {"dtype": "FLOAT32",
                "sizes": [{"value": "4"}]}}],
    "nodes": [
      {"op": "aten.sin.default", "args": [{"ref": "x"}], "outputs": ["y"]},
      {"op": "aten.frobnicate.default", "args": [{"ref": "y"}],
       "outputs": ["z"]}],
    "outputs": ["z"]})");
  const Result r = Run({"compile", path});
  EXPECT_NE(r.exit_code, 0) << r;
  EXPECT_TRUE(absl::StrContains(r.output, "UNIMPLEMENTED")) << r;
  EXPECT_TRUE(absl::StrContains(r.output, "node 1")) << r;
  EXPECT_TRUE(absl::StrContains(r.output, "aten.frobnicate.default")) << r;
  const Result explain = Run({"explain", path});
  EXPECT_NE(explain.exit_code, 0) << explain;
  EXPECT_TRUE(absl::StrContains(explain.output, "aten.frobnicate.default"))
      << explain;

  const Result syntax =
      Run({"compile", WriteFile("syntax.json", "{\"nodes\": [")});
  EXPECT_NE(syntax.exit_code, 0) << syntax;
  EXPECT_TRUE(absl::StrContains(syntax.output, "not a kiln.v1.Graph"))
      << syntax;
  const Result missing = Run({"compile", (dir_ / "none.json").string()});
  EXPECT_NE(missing.exit_code, 0) << missing;
  EXPECT_TRUE(absl::StrContains(missing.output, "cannot read")) << missing;
  EXPECT_EQ(StatsJson().entries(), 0u);
}

// kilnd cross-compiles for a GPU it does not have (this machine has none).
TEST_F(KilnctlTest, CudaTargetCompilesWithoutAGpu) {
  const Result r = Run({"compile", Example("chain10.json"), "--target=sm_90"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(absl::StrContains(r.output, "compiled")) << r;
  // The size shown is the cubin's (the CPU shared object is empty here).
  EXPECT_TRUE(absl::StrContains(r.output, "cubin ")) << r;
  EXPECT_TRUE(absl::StrContains(r.output, "(sm_90)")) << r;
  EXPECT_FALSE(absl::StrContains(r.output, "cubin 0 B")) << r;
  EXPECT_FALSE(absl::StrContains(r.output, "binary 0 B")) << r;
  const Result again =
      Run({"compile", Example("chain10.json"), "--target=sm_90"});
  EXPECT_EQ(again.exit_code, 0) << again;
  EXPECT_TRUE(absl::StrContains(again.output, "hit")) << again;
  const Result old_arch =
      Run({"compile", Example("chain10.json"), "--target=sm_40"});
  EXPECT_NE(old_arch.exit_code, 0) << old_arch;
  EXPECT_TRUE(absl::StrContains(old_arch.output, "INVALID_ARGUMENT"))
      << old_arch;
  const Result bad = Run({"compile", Example("chain10.json"), "--target=tpu"});
  EXPECT_NE(bad.exit_code, 0) << bad;
  EXPECT_TRUE(absl::StrContains(bad.output, "--target=tpu")) << bad;
}

TEST_F(KilnctlTest, BenchIsBoundedInCountAndTime) {
  const Result r = Run({"bench", Example("chain10.json"), "--seconds=20",
                        "--concurrency=2", "--requests=200"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(absl::StrContains(r.output, "requests/s")) << r;
  EXPECT_TRUE(absl::StrContains(r.output, "median")) << r;
  EXPECT_TRUE(absl::StrContains(r.output, "p99")) << r;
  int64_t lookups = 0;
  const size_t at = r.output.find("bench ");
  ASSERT_NE(at, std::string::npos) << r;
  std::vector<absl::string_view> words = absl::StrSplit(
      absl::string_view(r.output).substr(at), ' ', absl::SkipEmpty());
  ASSERT_GE(words.size(), 2u);
  ASSERT_TRUE(absl::SimpleAtoi(words[1], &lookups)) << r;
  EXPECT_EQ(lookups, 200) << r;
  // Time-bounded too: 0.3 s cannot run a million lookups.
  const absl::Time start = absl::Now();
  const Result timed = Run(
      {"bench", Example("chain10.json"), "--seconds=0.3", "--concurrency=2"});
  EXPECT_EQ(timed.exit_code, 0) << timed;
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  EXPECT_GE(StatsJson().hits(), 200u);
}

// Every bench mode runs and names what it measured, phase by phase; the
// client mode verifies and loads each artifact as kiln::Client does.
TEST_F(KilnctlTest, BenchModesReportTheirPhases) {
  const struct {
    const char* mode;
    std::vector<const char*> phases;
  } kCases[] = {
      {"proto", {"round trip+parse", "verify"}},
      {"raw", {"round trip", "parse", "verify"}},
      {"client", {"key", "round trip", "parse", "verify+load"}},
  };
  for (const auto& c : kCases) {
    const Result r =
        Run({"bench", Example("chain10.json"), absl::StrCat("--mode=", c.mode),
             "--requests=20", "--concurrency=2"});
    ASSERT_EQ(r.exit_code, 0) << r;
    EXPECT_TRUE(absl::StrContains(r.output, absl::StrCat("--mode=", c.mode)))
        << r;
    EXPECT_TRUE(absl::StrContains(r.output, "phases   medians:")) << r;
    for (const char* phase : c.phases) {
      EXPECT_TRUE(absl::StrContains(r.output, absl::StrCat(phase, " "))) << r;
    }
    EXPECT_TRUE(absl::StrContains(r.output, "SHA-256-checked")) << r;
    EXPECT_EQ(absl::StrContains(r.output, "later GetExecutable"),
              std::string(c.mode) == "client")
        << r;
  }
  const Result unverified = Run({"bench", Example("chain10.json"), "--mode=raw",
                                 "--verify=false", "--requests=10"});
  ASSERT_EQ(unverified.exit_code, 0) << unverified;
  EXPECT_TRUE(absl::StrContains(unverified.output, "--verify=false"))
      << unverified;
  EXPECT_FALSE(absl::StrContains(unverified.output, "SHA-256-checked"))
      << unverified;
  EXPECT_EQ(Run({"bench", Example("chain10.json"), "--mode=fast"}).exit_code,
            2);
}

// kilnctl --target=cpu (its default) is kiln::Client's default target: the
// same graph gets the same key from both, so the library finds what kilnctl
// compiled with a Lookup, without compiling again.
TEST_F(KilnctlTest, SameKeyAsTheClientLibrary) {
  EXPECT_EQ(Client::DefaultTarget().cpu().SerializeAsString(),
            HostCpuTargetFromCpuinfo().SerializeAsString());
  ClientOptions options;
  options.server = daemon_->address();
  options.runtime_threads = 1;
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  uint64_t lookups = 0;
  for (const char* graph : {"chain10.json", "dynamic_batch.json"}) {
    const Result compiled = Run({"compile", Example(graph)});
    ASSERT_EQ(compiled.exit_code, 0) << compiled;
    const std::string key = KeyIn(compiled.output);
    ASSERT_EQ(key.size(), 64u) << compiled;
    EXPECT_EQ(KeyIn(Run({"explain", Example(graph)}).output), key);

    v1::CompileRequest request = Request(graph);
    request.clear_target();  // the library's default
    auto exe = (*client)->GetExecutable(request);
    ASSERT_TRUE(exe.ok()) << exe.status();
    EXPECT_EQ(absl::BytesToHexString((*exe)->guard_key()), key) << graph;
    EXPECT_EQ((*client)->counters().lookup_hits, ++lookups) << graph;
  }
  EXPECT_EQ((*client)->counters().compiles, 0u);
  EXPECT_EQ(StatsJson().compiles(), 2u);  // kilnctl's two, nothing more
}

TEST_F(KilnctlTest, UsageErrors) {
  EXPECT_EQ(Run({"frobnicate"}).exit_code, 2);
  EXPECT_EQ(Run({}).exit_code, 2);
  EXPECT_EQ(Run({"evict"}).exit_code, 2);
  EXPECT_EQ(Run({"evict", "not-hex"}).exit_code, 2);
  EXPECT_EQ(Run({"compile"}).exit_code, 2);
}

TEST(KilnctlNoServer, UnreachableServerFailsReadably) {
  for (const char* command : {"health", "stats", "ls"}) {
    const Result r = Kilnctl({"--server=127.0.0.1:1", command});
    EXPECT_NE(r.exit_code, 0) << command << r;
    EXPECT_TRUE(absl::StrContains(r.output, "UNAVAILABLE")) << command << r;
    EXPECT_TRUE(absl::StrContains(r.output, "is kilnd running at 127.0.0.1:1"))
        << command << r;
  }
  const Result compile = Kilnctl(
      {"--server=127.0.0.1:1", "compile", Example("chain10.json"), "--run"});
  EXPECT_NE(compile.exit_code, 0) << compile;
  EXPECT_TRUE(absl::StrContains(compile.output, "UNAVAILABLE")) << compile;
}

TEST(HostTarget, LevelsFromCpuinfoFlags) {
  const std::string v2 =
      "flags : fpu cx16 lahf_lm popcnt pni sse4_1 sse4_2 ssse3";
  EXPECT_EQ(X86LevelFromCpuinfoFlags("flags : fpu sse2"), "x86-64");
  EXPECT_EQ(X86LevelFromCpuinfoFlags(v2), "x86-64-v2");
  const std::string v3 = v2 + " avx avx2 bmi1 bmi2 f16c fma abm movbe xsave";
  EXPECT_EQ(X86LevelFromCpuinfoFlags(v3), "x86-64-v3");
  EXPECT_EQ(X86LevelFromCpuinfoFlags(v3 + " avx512f avx512bw avx512cd"),
            "x86-64-v3");  // no avx512dq/vl
  EXPECT_EQ(X86LevelFromCpuinfoFlags(
                v3 + " avx512f avx512bw avx512cd avx512dq avx512vl"),
            "x86-64-v4");
}

TEST(HostTarget, TheCompilerAcceptsTheHostTarget) {
  for (const char* cpu : {"x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4"}) {
    v1::CpuTarget target = HostCpuTargetFromCpuinfo();
    target.set_cpu(cpu);
    EXPECT_TRUE(MakeTargetMachine(target).ok()) << cpu;
  }
  const v1::CpuTarget host = HostCpuTargetFromCpuinfo();
  auto tm = MakeTargetMachine(host);
  EXPECT_TRUE(tm.ok()) << host.ShortDebugString() << " " << tm.status();
}

}  // namespace
}  // namespace kiln::testing
