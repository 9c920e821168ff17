// kilnctl: the command line for kilnd.
//
//   kilnctl [--server=HOST:PORT] health
//   kilnctl stats [--json]
//   kilnctl compile GRAPH.json [--target=cpu|sm_XX] [--fast_math] [--run]
//                              [--sizes=s0=8,..]
//   kilnctl explain GRAPH.json [--target=...]
//   kilnctl info
//   kilnctl public-key
//   kilnctl ls [--limit=N]
//   kilnctl evict KEY|--all
//   kilnctl bench GRAPH.json [--seconds=5] [--concurrency=4] [--requests=N]
//                            [--mode=raw|proto|client] [--verify=true]
//                            [--hit_socket=true]
//
// The server is --server, else $KILN_SERVER, else 127.0.0.1:7733 (kilnd's
// default). Errors print the server's status and message and exit 1; usage
// errors exit 2. kilnctl does not link LLVM: `--target=cpu` is the target
// kiln::Client uses for requests that name none (Client::DefaultTarget(), the
// host's x86-64 level from client/host_target.h), so both compute the same
// key for a graph; `--run` uses the CPU runtime and the reference evaluator.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "runtime/cpu_executable.h"
#include "client/connection.h"
#include "client/hit_socket_client.h"
#include "client/kiln_client.h"
#include "client/raw_lookup.h"
#include "client/request_json.h"
#include "graph/guard_key.h"
#include "graph/import.h"
#include "compiler/numerics.h"
#include "compiler/reference.h"
#include "google/protobuf/unknown_field_set.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "kiln/v1/service.grpc.pb.h"
#include "support/artifact_signature.h"
#include "support/sha256.h"

    ABSL_FLAG(std::string, server, "",
              "kilnd address HOST:PORT (default: $KILN_SERVER, else "
              "127.0.0.1:7733)");
ABSL_FLAG(std::string, token, "",
          "bearer token for kilnd with tokens (default: $KILN_TOKEN, else the "
          "first line of --token_file / $KILN_TOKEN_FILE)");
ABSL_FLAG(std::string, token_file, "",
          "file whose first line is the token (default: $KILN_TOKEN_FILE)");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle to verify kilnd's certificate with; set: TLS "
          "(default: $KILN_TLS_CA; $KILN_TLS=1: TLS with the system's roots)");
ABSL_FLAG(std::string, tls_cert, "",
          "client certificate for mTLS, PEM (default: $KILN_TLS_CERT)");
ABSL_FLAG(std::string, tls_key, "",
          "its private key, PEM (default: $KILN_TLS_KEY)");
ABSL_FLAG(std::string, tls_server_name, "",
          "the name to expect in kilnd's certificate (default: the server's "
          "host; $KILN_TLS_SERVER_NAME)");
ABSL_FLAG(double, timeout, 300,
          "deadline of each request, in seconds (health: at most 10)");
ABSL_FLAG(bool, json, false, "stats: print one JSON object");
ABSL_FLAG(std::string, target, "cpu",
          "compile/explain/bench: cpu (this host) or a CUDA arch sm_XX");
ABSL_FLAG(std::string, cpu, "",
          "--target=cpu: LLVM CPU name instead of the host's x86-64 level");
ABSL_FLAG(std::string, features, "",
          "--target=cpu: LLVM feature string, e.g. +avx2,+fma");
ABSL_FLAG(bool, fast_math, false,
          "compile/explain/bench: CompileOptions.fast_math (approximate "
          "exp/log/division, FTZ on GPUs; part of the key)");
ABSL_FLAG(bool, run, false,
          "compile: run the artifact on seeded random inputs and compare "
          "with the reference evaluator");
ABSL_FLAG(std::string, sizes, "",
          "compile --run: symbol values, e.g. s0=8,s1=3 (others are 4)");
ABSL_FLAG(uint64_t, seed, 1, "compile --run: random input seed");
ABSL_FLAG(int32_t, limit, 0, "ls: at most this many entries (0: all)");
ABSL_FLAG(bool, all, false, "evict: every entry");
ABSL_FLAG(double, seconds, 5, "bench: at most this long, in seconds");
ABSL_FLAG(int32_t, concurrency, 4, "bench: client threads");
ABSL_FLAG(int64_t, requests, 1000000,
          "bench: at most this many Lookups in all");
ABSL_FLAG(std::string, trusted_keys, "",
          "public keys of the kilnds whose artifacts compile --run and bench "
          "--mode=client load (64 hex digits each, comma-separated; empty: "
          "$KILN_TRUSTED_KEYS); unsigned or foreign artifacts are refused");
ABSL_FLAG(bool, verify, true,
          "bench --mode=proto|raw: check each artifact's binary against its "
          "SHA-256, as a client does before loading it");
ABSL_FLAG(bool, hit_socket, true,
          "bench --mode=raw|client: look up on kilnd's hit socket when it has "
          "one, as kiln::Client does (false: gRPC's Lookup)");
ABSL_FLAG(std::string, mode, "raw",
          "bench: proto (generated stub, protobuf parse), raw (kiln::Client's "
          "zero-copy receive) or client (kiln::Client's whole hit: key, "
          "Lookup, verify and load)");

namespace kiln {
namespace {

// "hit", "compiled" or "joined" (the generated enum name, lower-cased).
std::string OutcomeText(v1::CompileResponse::Outcome o) {
  return absl::AsciiStrToLower(v1::CompileResponse::Outcome_Name(o));
}

constexpr char kDefaultServer[] = "127.0.0.1:7733";
constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

std::string ServerAddress() {
  std::string server = absl::GetFlag(FLAGS_server);
  if (server.empty()) {
    const char* env = std::getenv("KILN_SERVER");
    server = env != nullptr && *env != '\0' ? env : kDefaultServer;
  }
  return server;
}

// --token.. and --tls_.. flags (each falls back to its environment
// variable in ResolveConnection).
ConnectionOptions ConnectionFlags() {
  ConnectionOptions o;
  o.token = absl::GetFlag(FLAGS_token);
  o.token_file = absl::GetFlag(FLAGS_token_file);
  o.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  o.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key = absl::GetFlag(FLAGS_tls_key);
  o.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  return o;
}

// The flags' connection, resolved once (Main checks it before any call).
const absl::StatusOr<Connection>& TheConnection() {
  static const absl::StatusOr<Connection>* connection =
      new absl::StatusOr<Connection>(ResolveConnection(ConnectionFlags()));
  return *connection;
}

// `own_connection`: a TCP connection of its own, not shared with other
// channels of this process (as a separate client process would have).
std::shared_ptr<grpc::Channel> MakeChannel(bool own_connection = false) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  if (own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return CreateKilnChannel(ServerAddress(), *TheConnection(), args);
}

// --timeout from now, and at most `cap_seconds`; and the token, if any
// (every call's context passes here).
void SetDeadline(grpc::ClientContext& ctx, double cap_seconds = 1e9) {
  AddAuthorization(*TheConnection(), &ctx);
  const double seconds = std::min(absl::GetFlag(FLAGS_timeout), cap_seconds);
  ctx.set_deadline(
      std::chrono::system_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
}

std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

// Prints "kilnctl: WHAT: CODE: message" and returns the error exit status.
int Fail(absl::string_view what, const grpc::Status& s) {
  std::cerr << "kilnctl: " << what << ": " << CodeName(s.error_code()) << ": "
            << s.error_message();
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
    std::cerr << "\nkilnctl: is kilnd running at " << ServerAddress()
              << "? (--server or $KILN_SERVER)";
  }
  std::cerr << "\n";
  return kExitError;
}

int FailMessage(absl::string_view message) {
  std::cerr << "kilnctl: " << message << "\n";
  return kExitError;
}

int Usage(absl::string_view message) {
  std::cerr << "kilnctl: " << message << "\n"
            << "run kilnctl --help for the subcommands and flags\n";
  return kExitUsage;
}

std::string Hex(const std::string& bytes) {
  return absl::BytesToHexString(bytes);
}

std::string HumanBytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrCat(bytes, " B")
                : absl::StrFormat("%.1f %s", v, units[u]);
}

// ---------------------------------------------------------------------------
// Requests from graph files.

absl::StatusOr<v1::Target> TargetFromFlags() {
  absl::StatusOr<v1::Target> target =
      TargetFromName(absl::GetFlag(FLAGS_target), absl::GetFlag(FLAGS_cpu),
                     absl::GetFlag(FLAGS_features));
  if (!target.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", target.status().message()));
  }
  return target;
}

// The same request as the C API and the Python binding build from a graph
// in JSON (client/request_json.h).
absl::StatusOr<v1::CompileRequest> RequestFromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<v1::Target> target = TargetFromFlags();
  if (!target.ok()) return target.status();
  absl::StatusOr<v1::CompileRequest> req =
      RequestFromGraphJson(text.str(), *target, absl::GetFlag(FLAGS_fast_math));
  if (!req.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is ", req.status().message()));
  }
  return req;
}

// ---------------------------------------------------------------------------
// health: grpc.health.v1.Health/Check through a generic stub (Debian's gRPC
// ships no generated health stubs). The request {service: ""} is empty; the
// response's field 1 is the status enum.

int Health() {
  grpc::GenericStub stub(MakeChannel());
  grpc::ClientContext ctx;
  SetDeadline(ctx, /*cap_seconds=*/10);
  grpc::CompletionQueue cq;
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  auto call =
      stub.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", request, &cq);
  call->StartCall();
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  if (!status.ok()) return Fail("health", status);
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (response.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  google::protobuf::UnknownFieldSet fields;
  int64_t serving = 0;  // UNKNOWN
  if (fields.ParseFromString(bytes)) {
    for (int i = 0; i < fields.field_count(); ++i) {
      if (fields.field(i).number() == 1 &&
          fields.field(i).type() == google::protobuf::UnknownField::TYPE_VARINT)
        serving = static_cast<int64_t>(fields.field(i).varint());
    }
  }
  constexpr const char* kNames[] = {"UNKNOWN", "SERVING", "NOT_SERVING",
                                    "SERVICE_UNKNOWN"};
  const std::string name = serving >= 0 && serving < 4
                               ? kNames[serving]
                               : absl::StrCat("status ", serving);
  std::cout << name << " " << ServerAddress() << "\n";
  return serving == 1 ? 0 : kExitError;
}

// ---------------------------------------------------------------------------
// stats

// info: kilnd's version and its hit socket (GetServerInfo).
int Info(v1::Kiln::Stub& stub) {
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  v1::ServerInfo info;
  if (grpc::Status st =
          stub.GetServerInfo(&ctx, v1::GetServerInfoRequest(), &info);
      !st.ok())
    return Fail("info", st);
  const v1::HitSocket& hit = info.hit_socket();
  std::cout << "version     " << info.version() << "\n"
            << "hit socket  "
            << (!hit.unix_path().empty()
                    ? absl::StrCat("unix:", hit.unix_path())
                : hit.tcp_port() != 0
                    ? absl::StrCat("TCP port ", hit.tcp_port())
                    : std::string("none (Lookups go through gRPC)"))
            << "\n";
  return 0;
}

int Stats(v1::Kiln::Stub& stub) {
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  v1::Stats s;
  if (grpc::Status st = stub.GetStats(&ctx, v1::GetStatsRequest(), &s);
      !st.ok())
    return Fail("stats", st);
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << absl::StrCat(
        "{\"entries\":", s.entries(), ",\"bytes\":", s.bytes(),
        ",\"capacity_bytes\":", s.capacity_bytes(), ",\"hits\":", s.hits(),
        ",\"misses\":", s.misses(), ",\"compiles\":", s.compiles(),
        ",\"joins\":", s.joins(), ",\"compile_errors\":", s.compile_errors(),
        ",\"evictions\":", s.evictions(), ",\"corrupt\":", s.corrupt(),
        ",\"compile_seconds_saved\":",
        absl::StrFormat("%.6f", s.compile_seconds_saved()),
        ",\"queue_depth\":", s.queue_depth(), ",\"hot_hits\":", s.hot_hits(),
        ",\"hot_entries\":", s.hot_entries(), ",\"hot_bytes\":", s.hot_bytes(),
        ",\"hot_capacity_bytes\":", s.hot_capacity_bytes(),
        ",\"shared_cache_configured\":",
        s.shared_cache_configured() ? "true" : "false",
        ",\"shared_cache_up\":", s.shared_cache_up() ? "true" : "false",
        ",\"shared_hits\":", s.shared_hits(),
        ",\"shared_misses\":", s.shared_misses(),
        ",\"shared_lease_waits\":", s.shared_lease_waits(),
        ",\"shared_takeovers\":", s.shared_takeovers(),
        ",\"shared_bytes_read\":", s.shared_bytes_read(),
        ",\"shared_bytes_written\":", s.shared_bytes_written(),
        ",\"shared_corrupt\":", s.shared_corrupt(),
        ",\"shared_error_hits\":", s.shared_error_hits(),
        ",\"shared_failures\":", s.shared_failures(),
        ",\"store_recoveries\":", s.store_recoveries(),
        ",\"store_recovery_dropped\":", s.store_recovery_dropped(),
        ",\"reload_failures\":", s.reload_failures(), "}\n");
    return 0;
  }
  const uint64_t lookups = s.hits() + s.misses();
  std::vector<std::pair<std::string, std::string>> rows = {
      {"server", ServerAddress()},
      {"entries", absl::StrCat(s.entries())},
      {"bytes", absl::StrCat(HumanBytes(s.bytes()), " of ",
                             HumanBytes(s.capacity_bytes()))},
      {"hits", absl::StrCat(s.hits())},
      {"misses", absl::StrCat(s.misses())},
      {"hit rate", lookups == 0
                       ? "-"
                       : absl::StrFormat("%.1f%%", 100.0 * s.hits() / lookups)},
      {"compiles", absl::StrCat(s.compiles())},
      {"joins", absl::StrCat(s.joins())},
      {"compile errors", absl::StrCat(s.compile_errors())},
      {"evictions", absl::StrCat(s.evictions())},
      {"corrupt", absl::StrCat(s.corrupt())},
      {"compile time saved",
       absl::StrFormat("%.3f s", s.compile_seconds_saved())},
      {"queued compiles", absl::StrCat(s.queue_depth())},
      {"hits from memory", absl::StrCat(s.hot_hits())},
      {"in memory",
       absl::StrCat(s.hot_entries(), " entries, ", HumanBytes(s.hot_bytes()),
                    " of ", HumanBytes(s.hot_capacity_bytes()))},
  };
  if (s.shared_cache_configured()) {
    rows.insert(
        rows.end(),
        {
            {"shared tier",
             s.shared_cache_up() ? "up" : "DOWN (serving locally)"},
            {"shared hits", absl::StrCat(s.shared_hits())},
            {"shared misses", absl::StrCat(s.shared_misses())},
            {"lease waits", absl::StrCat(s.shared_lease_waits())},
            {"lease takeovers", absl::StrCat(s.shared_takeovers())},
            {"shared bytes",
             absl::StrCat(HumanBytes(s.shared_bytes_read()), " read, ",
                          HumanBytes(s.shared_bytes_written()), " written")},
            {"shared corrupt", absl::StrCat(s.shared_corrupt())},
            {"shared errors",
             absl::StrCat(s.shared_error_hits(), " cached, ",
                          s.shared_failures(), " failed calls")},
        });
  }
  for (const auto& [name, value] : rows) {
    std::cout << absl::StrFormat("%-20s %s\n", name, value);
  }
  if (s.store_recoveries() > 0) {
    std::cout << absl::StrFormat("%-20s %s\n", "store damaged at start",
                                 s.store_last_recovery());
  }
  if (s.reload_failures() > 0) {
    std::cout << absl::StrFormat("%-20s %d (token or TLS files; see log)\n",
                                 "reload failures", s.reload_failures());
  }
  return 0;
}

// public-key: the public key kilnd signs artifacts with, as 64 hex digits
// (what clients put in KILN_TRUSTED_KEYS). Shown as this server reports it:
// compare it with `kilnd --print_public_key` on kilnd's host before
// trusting it.
int PublicKey(v1::Kiln::Stub& stub) {
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  v1::ServerInfo info;
  if (grpc::Status st =
          stub.GetServerInfo(&ctx, v1::GetServerInfoRequest(), &info);
      !st.ok())
    return Fail("public-key", st);
  if (info.signing_public_key().empty()) {
    std::cerr << "public-key: kilnd at " << ServerAddress()
              << " signs no artifacts (--signing_key=off)\n";
    return 1;
  }
  std::cout << absl::BytesToHexString(info.signing_public_key()) << "\n";
  return 0;
}

// ---------------------------------------------------------------------------
// compile [--run]

// Symbol values for --run: --sizes, else 4, kept within each symbol's
// declared bounds.
absl::StatusOr<std::vector<int64_t>> SymbolValues(const Graph& graph) {
  std::vector<int64_t> values;
  for (const SymbolInfo& s : graph.symbols) {
    int64_t v = 4;
    if (s.multiple_of > 1)
      v = (v + s.multiple_of - 1) / s.multiple_of * s.multiple_of;
    if (s.max_value > 0 && v > s.max_value) v = s.max_value;
    values.push_back(v);
  }
  const std::string sizes = absl::GetFlag(FLAGS_sizes);
  for (absl::string_view item :
       absl::StrSplit(sizes, ',', absl::SkipWhitespace())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, '=');
    int64_t v = 0;
    if (!absl::SimpleAtoi(kv.second, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--sizes: \"", item, "\" is not NAME=VALUE"));
    }
    bool found = false;
    for (size_t i = 0; i < graph.symbols.size(); ++i) {
      if (graph.symbols[i].name == absl::StripAsciiWhitespace(kv.first)) {
        values[i] = v;
        found = true;
      }
    }
    if (!found) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--sizes: the graph has no symbol \"", kv.first,
          "\" (it has: ", absl::StrJoin(graph.SymbolNames(), ", "), ")"));
    }
  }
  return values;
}

std::string Describe(const HostTensor& t) {
  return absl::StrCat(DTypeName(t.dtype()), "[", absl::StrJoin(t.sizes(), ","),
                      "]");
}

// Runs the artifact and the reference evaluator on the same seeded inputs;
// prints the max abs error per output. Returns true when all pass.
absl::StatusOr<bool> RunAndCompare(const v1::CompileRequest& req,
                                   const v1::Artifact& artifact) {
  absl::StatusOr<Graph> graph = ImportGraph(req.graph());
  if (!graph.ok()) return graph.status();
  absl::StatusOr<std::vector<int64_t>> symbols = SymbolValues(*graph);
  if (!symbols.ok()) return symbols.status();
  absl::StatusOr<std::unique_ptr<CpuExecutable>> exe =
      CpuExecutable::Load(artifact);
  if (!exe.ok()) return exe.status();
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  const std::vector<HostTensor> inputs =
      numerics::RandomInputs(*graph, *symbols, rng);
  std::vector<std::string> bound;
  for (size_t i = 0; i < graph->symbols.size(); ++i) {
    bound.push_back(absl::StrCat(graph->symbols[i].name, "=", (*symbols)[i]));
  }
  std::vector<std::string> shapes;
  for (const HostTensor& t : inputs) shapes.push_back(Describe(t));
  std::cout << "run      seed " << absl::GetFlag(FLAGS_seed)
            << (bound.empty() ? "" : ", ") << absl::StrJoin(bound, " ")
            << ", inputs " << absl::StrJoin(shapes, " ") << "\n";
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<HostTensor>> got = (*exe)->Run(inputs);
  const absl::Duration run_time = absl::Now() - start;
  if (!got.ok()) return got.status();
  absl::StatusOr<std::vector<HostTensor>> want =
      EvaluateReference(*graph, inputs);
  if (!want.ok()) return want.status();
  bool all_pass = true;
  for (size_t o = 0; o < want->size(); ++o) {
    double max_err = 0;
    const std::string mismatch =
        numerics::Compare((*got)[o], (*want)[o], &max_err);
    const numerics::Tolerance tol = numerics::ToleranceFor((*want)[o].dtype());
    all_pass &= mismatch.empty();
    std::cout << absl::StrFormat(
        "output %d %-8s %-16s max abs err %.3g (atol %g, rtol %g) %s%s\n", o,
        graph->values[graph->outputs[o]].name, Describe((*want)[o]), max_err,
        tol.atol, tol.rtol, mismatch.empty() ? "PASS" : "FAIL",
        mismatch.empty() ? "" : absl::StrCat(": ", mismatch));
  }
  std::cout << absl::StrFormat("%s    ran in %.3f ms\n",
                               all_pass ? "PASS" : "FAIL",
                               absl::ToDoubleMilliseconds(run_time));
  return all_pass;
}

// The loadable binary and its size: the CPU shared object, or the CUDA cubin
// (the PTX kept beside it for inspection is not counted).
std::string BinaryText(const v1::Artifact& a) {
  if (a.has_cuda()) {
    return absl::StrCat("cubin ", HumanBytes(a.cuda().cubin().size()), " (",
                        a.cuda().arch(), ")");
  }
  return absl::StrCat("binary ", HumanBytes(a.cpu().shared_object().size()));
}

void PrintCompileResponse(const v1::CompileResponse& resp) {
  const v1::Artifact& a = resp.artifact();
  int launches = 0;
  for (const v1::Step& s : a.program().steps()) launches += s.has_launch();
  std::cout << "key      " << Hex(resp.guard_key()) << "\n"
            << absl::StrFormat(
                   "outcome  %s (server %.3f ms, compile %.1f ms)\n",
                   OutcomeText(resp.outcome()), resp.server_seconds() * 1e3,
                   resp.compile_seconds() * 1e3)
            << absl::StrFormat("artifact %s, %d kernel launch%s, %s\n",
                               HumanBytes(a.ByteSizeLong()), launches,
                               launches == 1 ? "" : "es", BinaryText(a));
}

grpc::Status CallCompile(v1::Kiln::Stub& stub, const v1::CompileRequest& req,
                         v1::CompileResponse* resp) {
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  return stub.Compile(&ctx, req, resp);
}

int Compile(v1::Kiln::Stub& stub, const std::string& path) {
  absl::StatusOr<v1::CompileRequest> req = RequestFromFile(path);
  if (!req.ok()) return FailMessage(req.status().message());
  v1::CompileResponse resp;
  if (grpc::Status s = CallCompile(stub, *req, &resp); !s.ok())
    return Fail(absl::StrCat("compile ", path), s);
  PrintCompileResponse(resp);
  if (!absl::GetFlag(FLAGS_run)) return 0;
  // As kiln::Client does: with trusted keys, the signature is checked
  // before the artifact's code is loaded.
  std::string trusted_text = absl::GetFlag(FLAGS_trusted_keys);
  if (const char* env = std::getenv("KILN_TRUSTED_KEYS");
      trusted_text.empty() && env != nullptr)
    trusted_text = env;
  absl::StatusOr<TrustedKeys> trusted = TrustedKeys::Parse(trusted_text);
  if (!trusted.ok()) return FailMessage(trusted.status().ToString());
  if (!trusted->empty()) {
    if (absl::Status v =
            trusted->Verify(Sha256(resp.artifact().SerializeAsString()),
                            resp.artifact_signature());
        !v.ok())
      return FailMessage(absl::StrCat("run: ", v.ToString()));
    std::cout << "signed   by a trusted key\n";
  }
  absl::StatusOr<bool> pass = RunAndCompare(*req, resp.artifact());
  if (!pass.ok()) {
    return FailMessage(absl::StrCat("run: ", pass.status().ToString()));
  }
  return *pass ? 0 : kExitError;
}

// ---------------------------------------------------------------------------
// explain, ls, evict

int Explain(v1::Kiln::Stub& stub, const std::string& path) {
  absl::StatusOr<v1::CompileRequest> req = RequestFromFile(path);
  if (!req.ok()) return FailMessage(req.status().message());
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  v1::ExplainKeyResponse resp;
  if (grpc::Status s = stub.ExplainKey(&ctx, *req, &resp); !s.ok())
    return Fail(absl::StrCat("explain ", path), s);
  // The request key (what any client computes), then what kilnd adds.
  std::cout << "key " << Hex(resp.guard_key()) << "\n"
            << "compiler " << resp.compiler_identity() << "\n"
            << "store key " << Hex(resp.store_key()) << "\n";
  for (const auto& c : resp.components()) {
    std::cout << "\n"
              << c.name() << "  " << Hex(c.hash()).substr(0, 16) << "\n";
    for (absl::string_view line : absl::StrSplit(c.canonical(), '\n')) {
      if (!line.empty()) std::cout << "    " << line << "\n";
    }
  }
  return 0;
}

grpc::Status ListEntries(v1::Kiln::Stub& stub, int limit,
                         v1::ListEntriesResponse* resp) {
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  v1::ListEntriesRequest req;
  req.set_limit(limit);
  return stub.ListEntries(&ctx, req, resp);
}

int Ls(v1::Kiln::Stub& stub) {
  v1::ListEntriesResponse resp;
  if (grpc::Status s = ListEntries(stub, absl::GetFlag(FLAGS_limit), &resp);
      !s.ok())
    return Fail("ls", s);
  std::cout << absl::StrFormat("%-64s %10s %11s  %s\n", "KEY", "BYTES",
                               "COMPILE_MS", "LAST ACCESS (UTC)");
  uint64_t total = 0;
  for (const auto& e : resp.entries()) {
    total += e.bytes();
    std::cout << absl::StrFormat(
        "%-64s %10d %11.1f  %s%s\n", Hex(e.guard_key()), e.bytes(),
        e.compile_seconds() * 1e3,
        absl::FormatTime("%Y-%m-%d %H:%M:%S",
                         absl::FromUnixMillis(e.last_access_unix_ms()),
                         absl::UTCTimeZone()),
        e.other_compiler() ? "  (another compiler build: not served)" : "");
  }
  std::cout << resp.entries_size()
            << (resp.entries_size() == 1 ? " entry, " : " entries, ")
            << HumanBytes(total) << "\n";
  return 0;
}

// KEY is the 64 hex digits `ls` prints, or a unique prefix of them.
int Evict(v1::Kiln::Stub& stub, const std::vector<std::string>& args) {
  v1::EvictRequest req;
  if (absl::GetFlag(FLAGS_all)) {
    if (!args.empty()) return Usage("evict takes KEY or --all, not both");
    req.set_all(true);
  } else {
    if (args.size() != 1) return Usage("evict takes one KEY (or --all)");
    const std::string prefix = absl::AsciiStrToLower(args[0]);
    if (prefix.empty() ||
        !std::all_of(prefix.begin(), prefix.end(),
                     [](char c) { return absl::ascii_isxdigit(c); })) {
      return Usage(absl::StrCat("evict: \"", args[0],
                                "\" is not a key in hex (as `ls` prints)"));
    }
    if (prefix.size() == 64) {
      req.set_guard_key(absl::HexStringToBytes(prefix));
    } else {
      v1::ListEntriesResponse list;
      if (grpc::Status s = ListEntries(stub, 0, &list); !s.ok())
        return Fail("evict", s);
      int matches = 0;
      for (const auto& e : list.entries()) {
        if (absl::StartsWith(Hex(e.guard_key()), prefix)) {
          req.set_guard_key(e.guard_key());
          ++matches;
        }
      }
      if (matches == 0)
        return FailMessage(absl::StrCat("evict: no entry with key ", prefix));
      if (matches > 1) {
        return FailMessage(absl::StrCat("evict: key prefix ", prefix,
                                        " matches ", matches,
                                        " entries; give more digits"));
      }
    }
  }
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  v1::EvictResponse resp;
  if (grpc::Status s = stub.Evict(&ctx, req, &resp); !s.ok())
    return Fail("evict", s);
  std::cout << "evicted " << resp.evicted()
            << (resp.evicted() == 1 ? " entry" : " entries") << "\n";
  if (!req.all() && resp.evicted() == 0) {
    return FailMessage(
        absl::StrCat("evict: no entry with key ", Hex(req.guard_key())));
  }
  return 0;
}

// ---------------------------------------------------------------------------
// bench: Lookup latency and throughput of a cached key, from --concurrency
// client threads, each with its own connection. Each request is timed as a
// client sees it, phase by phase (--mode):
//   proto   the generated stub: round trip, then protobuf parse (copies the
//           binary into a string); --verify: SHA-256 of that string.
//   raw     what kiln::Client receives: round trip as raw slices, then the
//           zero-copy parse (client/raw_lookup.h); --verify: SHA-256 of the
//           binary's pieces where they lie.
//   client  what kiln::Client pays for a Lookup hit, end to end: the guard
//           key computed locally (import + key), the raw round trip and
//           parse, then CpuExecutable::LoadFromPieces (SHA-256 check, memfd,
//           dlopen, symbols) and unloading it again. A Client does this once
//           per key; later calls are served from its in-process cache.

// Per-thread samples of one phase, in microseconds.
using Samples = std::vector<std::vector<double>>;

std::vector<double> Merged(const Samples& per_thread) {
  std::vector<double> all;
  for (const auto& l : per_thread) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  return all;
}

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0.0;
  const size_t i = static_cast<size_t>(p * (sorted.size() - 1) + 0.5);
  return sorted[std::min(i, sorted.size() - 1)];
}

double Micros(std::chrono::steady_clock::time_point from,
              std::chrono::steady_clock::time_point to) {
  return std::chrono::duration<double, std::micro>(to - from).count();
}

bool DigestMatches(const std::string& expected, const Sha256Digest& digest) {
  return expected ==
         absl::string_view(reinterpret_cast<const char*>(digest.data()),
                           digest.size());
}

int Bench(v1::Kiln::Stub& stub, const std::string& path) {
  const int threads = absl::GetFlag(FLAGS_concurrency);
  const double seconds = absl::GetFlag(FLAGS_seconds);
  const int64_t max_requests = absl::GetFlag(FLAGS_requests);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (threads < 1 || seconds <= 0 || max_requests < 1) {
    return Usage(
        "bench needs --concurrency >= 1, --seconds > 0, --requests >= 1");
  }
  if (mode != "proto" && mode != "raw" && mode != "client") {
    return Usage(
        absl::StrCat("bench --mode=", mode, ": expected proto, raw or client"));
  }
  absl::StatusOr<v1::CompileRequest> req = RequestFromFile(path);
  if (!req.ok()) return FailMessage(req.status().message());
  if (mode == "client" && !req->target().has_cpu()) {
    return Usage("bench --mode=client loads the artifact: needs --target=cpu");
  }
  v1::CompileResponse compiled;
  if (grpc::Status s = CallCompile(stub, *req, &compiled); !s.ok())
    return Fail(absl::StrCat("compile ", path), s);
  PrintCompileResponse(compiled);

  // --verify=false only in proto and raw modes: a client always verifies.
  const bool verify = mode == "client" || absl::GetFlag(FLAGS_verify);
  v1::LookupRequest lookup;
  lookup.set_guard_key(compiled.guard_key());
  std::atomic<int64_t> issued{0};
  std::atomic<int64_t> errors{0};
  // Phases, per thread, in microseconds; `total` is the request as timed.
  Samples total(threads), key_times(threads), round_trips(threads),
      parses(threads), verifies(threads), loads(threads);
  std::vector<std::string> first_error(threads);
  std::string road = mode == "proto" ? "gRPC Lookup" : "";  // thread 0 sets
  auto record_error = [&](int t, std::string message) {
    if (errors.fetch_add(1) == 0) first_error[t] = std::move(message);
  };
  const auto start = std::chrono::steady_clock::now();
  const auto end =
      start + std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      // Each thread is one client, with its own connection.
      std::shared_ptr<grpc::Channel> channel =
          MakeChannel(/*own_connection=*/true);
      auto proto_stub = v1::Kiln::NewStub(channel);
      LookupChannel lookup_channel(channel, ServerAddress(),
                                   absl::GetFlag(FLAGS_hit_socket),
                                   TheConnection()->authorization);
      using Clock = std::chrono::steady_clock;
      while (Clock::now() < end && issued.fetch_add(1) < max_requests) {
        grpc::ClientContext ctx;
        SetDeadline(ctx);
        const auto t0 = Clock::now();
        std::string key = compiled.guard_key();
        if (mode == "client") {
          // What GetExecutable does before it asks the daemon.
          absl::StatusOr<Graph> graph = ImportGraph(req->graph());
          if (!graph.ok()) {
            record_error(t, graph.status().ToString());
            continue;
          }
          const GuardKey digest =
              ComputeGuardKey(*graph, req->target(), req->options());
          key.assign(reinterpret_cast<const char*>(digest.data()),
                     digest.size());
        }
        const auto t1 = Clock::now();
        if (mode == "proto") {
          v1::LookupResponse resp;
          const grpc::Status s = proto_stub->Lookup(&ctx, lookup, &resp);
          const auto t2 = Clock::now();
          if (!s.ok()) {
            record_error(t, absl::StrCat(CodeName(s.error_code()), ": ",
                                         s.error_message()));
            continue;
          }
          // The generated stub parses inside the call: the round trip
          // includes the parse here.
          round_trips[t].push_back(Micros(t1, t2));
          auto t3 = t2;
          if (verify) {
            const v1::Artifact& a = resp.artifact();
            const Sha256Digest digest = Sha256(a.cpu().shared_object());
            t3 = Clock::now();
            if (!DigestMatches(a.binary_sha256(), digest)) {
              record_error(t,
                           "DATA_LOSS: the binary does not match its SHA-256");
              continue;
            }
            verifies[t].push_back(Micros(t2, t3));
          }
          total[t].push_back(Micros(t0, t3));
          continue;
        }
        std::vector<grpc::Slice> slices;
        const grpc::Status s = lookup_channel.Lookup(&ctx, key, &slices);
        if (t == 0 && road.empty()) {
          const std::string hit = lookup_channel.hit_socket_address();
          road = hit.empty() ? "gRPC Lookup" : absl::StrCat("hit socket ", hit);
        }
        const auto t2 = Clock::now();
        if (!s.ok()) {
          record_error(t, absl::StrCat(CodeName(s.error_code()), ": ",
                                       s.error_message()));
          continue;
        }
        absl::StatusOr<ReceivedArtifact> got =
            ParseLookupResponse(std::move(slices));
        const auto t3 = Clock::now();
        if (!got.ok()) {
          record_error(t, got.status().ToString());
          continue;
        }
        round_trips[t].push_back(Micros(t1, t2));
        parses[t].push_back(Micros(t2, t3));
        auto t4 = t3;
        if (mode == "client") {
          absl::StatusOr<std::unique_ptr<CpuExecutable>> exe =
              CpuExecutable::LoadFromPieces(got->TakeArtifact(), got->binary());
          t4 = Clock::now();
          if (!exe.ok()) {
            record_error(t, exe.status().ToString());
            continue;
          }
          exe->reset();  // unloads (dlclose), untimed
          key_times[t].push_back(Micros(t0, t1));
          loads[t].push_back(Micros(t3, t4));
        } else if (verify) {
          Sha256Hasher hasher;
          for (absl::string_view piece : got->binary()) hasher.Update(piece);
          const Sha256Digest digest = hasher.Finish();
          t4 = Clock::now();
          if (!DigestMatches(got->artifact().binary_sha256(), digest)) {
            record_error(t, "DATA_LOSS: the binary does not match its SHA-256");
            continue;
          }
          verifies[t].push_back(Micros(t3, t4));
        }
        total[t].push_back(Micros(t0, t4));
      }
    });
  }
  for (std::thread& t : pool) t.join();
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  const std::vector<double> all = Merged(total);
  std::string measured;
  if (mode == "proto") {
    measured = verify ? "round trip with protobuf parse, SHA-256 check"
                      : "round trip with protobuf parse; --verify=false";
  } else if (mode == "raw") {
    measured = verify ? "raw round trip, zero-copy parse, SHA-256 check"
                      : "raw round trip, zero-copy parse; --verify=false";
  } else {
    measured =
        "kiln::Client's hit: key, raw round trip, parse, verify and load";
  }
  std::cout << absl::StrFormat(
      "bench    %d Lookups of %s from %d thread%s in %.2f s: %.0f requests/s "
      "(--mode=%s)\n"
      "latency  median %.1f us, p99 %.1f us, max %.1f us (%s)\n"
      "road     %s\n",
      all.size(), HumanBytes(compiled.artifact().ByteSizeLong()), threads,
      threads == 1 ? "" : "s", elapsed, all.size() / elapsed, mode,
      Percentile(all, 0.5), Percentile(all, 0.99),
      all.empty() ? 0.0 : all.back(), measured, road);
  std::vector<std::string> phases;
  auto phase = [&](const Samples& samples, absl::string_view name) {
    const std::vector<double> sorted = Merged(samples);
    if (!sorted.empty()) {
      phases.push_back(
          absl::StrFormat("%s %.1f us", name, Percentile(sorted, 0.5)));
    }
  };
  phase(key_times, "key");
  phase(round_trips, mode == "proto" ? "round trip+parse" : "round trip");
  phase(parses, "parse");
  phase(verifies, "verify");
  phase(loads, "verify+load");
  std::cout << "phases   medians: " << absl::StrJoin(phases, ", ") << "\n";
  if (verify) {
    std::cout << absl::StrFormat(
        "binary   %s, SHA-256-checked on every request%s\n",
        HumanBytes(compiled.artifact().cpu().shared_object().size()),
        mode == "client" ? " (as on a Client's first use of a key)" : "");
  }
  if (errors.load() > 0) {
    std::string message;
    for (const std::string& e : first_error) {
      if (!e.empty()) message = e;
    }
    return FailMessage(
        absl::StrCat("bench: ", errors.load(), " Lookups failed: ", message));
  }
  if (mode == "client") {
    // After its first use of a key, what a real kiln::Client pays per call:
    // one GetExecutable (a Lookup hit, above) then repeats of it.
    ClientOptions options;
    options.server = ServerAddress();
    options.use_hit_socket = absl::GetFlag(FLAGS_hit_socket);
    options.runtime_threads = 1;
    options.connection = ConnectionFlags();
    options.trusted_keys = absl::GetFlag(FLAGS_trusted_keys);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    if (!client.ok()) return FailMessage(client.status().ToString());
    auto first = (*client)->GetExecutable(*req);
    if (!first.ok()) return FailMessage(first.status().ToString());
    std::vector<double> repeats;
    for (int i = 0; i < 100; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      auto again = (*client)->GetExecutable(*req);
      const auto t1 = std::chrono::steady_clock::now();
      if (!again.ok()) return FailMessage(again.status().ToString());
      repeats.push_back(Micros(t0, t1));
    }
    std::sort(repeats.begin(), repeats.end());
    std::cout << absl::StrFormat(
        "repeat   median %.1f us per later GetExecutable of the key (%d "
        "calls, one kiln::Client: in-process cache, no Lookup)\n",
        Percentile(repeats, 0.5), repeats.size());
  }
  return 0;
}

constexpr char kUsage[] = R"(kilnctl: the command line for kilnd.

usage: kilnctl [--server=HOST:PORT] SUBCOMMAND [ARGS] [FLAGS]

  health                 grpc.health.v1 check; prints SERVING, exit 0
  stats [--json]         cache and compile counters (--json: one object)
  info                   kilnd's version and where its hit socket listens
  public-key             the Ed25519 public key kilnd signs artifacts with
                         (64 hex digits, for KILN_TRUSTED_KEYS)
  compile GRAPH.json [--target=cpu|sm_XX] [--fast_math] [--run]
                     [--sizes=s0=8] [--seed=N]
                         key and outcome (hit, compiled, joined); --run runs
                         the artifact on seeded random inputs and compares
                         with the reference evaluator (PASS/FAIL); with
                         --trusted_keys or $KILN_TRUSTED_KEYS, only if kilnd's
                         signature verifies
  explain GRAPH.json     the guard key's components and canonical text
  ls [--limit=N]         cached entries: key, bytes, compile ms, last access
  evict KEY|--all        drop one entry (KEY or a unique prefix) or all
  bench GRAPH.json [--seconds=5] [--concurrency=4] [--requests=1000000]
                         [--mode=raw|proto|client] [--verify=true]
                         [--hit_socket=true]
                         compile once, then Lookup latency and requests/s,
                         with the median of each phase. raw: kiln::Client's
                         zero-copy receive; proto: the generated stub's
                         parse; client: kiln::Client's whole hit (key,
                         Lookup, SHA-256 check, load). --verify=false (raw,
                         proto): skip the SHA-256 check. --hit_socket=false
                         (raw, client): gRPC's Lookup, not the hit socket

The server is --server, else $KILN_SERVER, else 127.0.0.1:7733. Errors print
the server's status and message and exit 1; usage errors exit 2.

kilnd with TLS and tokens (README.md, "Running kilnd for a team"):
  --token / $KILN_TOKEN, --token_file / $KILN_TOKEN_FILE: the bearer token;
  --tls_ca / $KILN_TLS_CA (or $KILN_TLS=1): TLS; --tls_cert, --tls_key /
  $KILN_TLS_CERT, $KILN_TLS_KEY: a client certificate (mTLS);
  --tls_server_name / $KILN_TLS_SERVER_NAME: the name in kilnd's certificate.
Roles: compile (compile, explain, info, bench), read-stats (stats), admin
(ls, evict, everything).)";

int Main(int argc, char** argv) {
  // Before gRPC starts: each thread polls its own connection (gRPC's poll
  // engine), as separate client processes would. With the default (epoll1)
  // the threads of one process share one epoll set and one active poller,
  // which reads every connection's responses and wakes the thread each is
  // for: `bench --concurrency=16` then pays twice the context switches per
  // request and gets half the requests/s (bench/README.md). Set
  // GRPC_POLL_STRATEGY to choose another engine.
  setenv("GRPC_POLL_STRATEGY", "poll", /*overwrite=*/0);
  // As in kilnd (kilnd_main.cc): Debian's Abseil runs absl::Mutex's deadlock
  // detector by default, a few percent of every request's CPU.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::SetProgramUsageMessage(kUsage);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() < 2) return Usage("missing subcommand");
  const std::string command = positional[1];
  const std::vector<std::string> args(positional.begin() + 2, positional.end());
  if (!TheConnection().ok()) return FailMessage(TheConnection().status().ToString());
  if (command == "health") {
    if (!args.empty()) return Usage("health takes no arguments");
    return Health();
  }
  auto stub = v1::Kiln::NewStub(MakeChannel());
  if (command == "stats" || command == "ls" || command == "info" ||
      command == "public-key") {
    if (!args.empty())
      return Usage(absl::StrCat(command, " takes no arguments"));
    if (command == "info") return Info(*stub);
    if (command == "public-key") return PublicKey(*stub);
    return command == "stats" ? Stats(*stub) : Ls(*stub);
  }
  if (command == "evict") return Evict(*stub, args);
  if (command == "compile" || command == "explain" || command == "bench") {
    if (args.size() != 1)
      return Usage(absl::StrCat(command, " takes GRAPH.json"));
    if (command == "compile") return Compile(*stub, args[0]);
    if (command == "explain") return Explain(*stub, args[0]);
    return Bench(*stub, args[0]);
  }
  return Usage(absl::StrCat("unknown subcommand \"", command, "\""));
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) { return kiln::Main(argc, argv); }
