// kilnd: the Kiln compile daemon.
//
//   kilnd [--listen=127.0.0.1:7733] [--data_dir=~/.cache/kiln] ...
//
// Serves kiln.v1.Kiln, the standard gRPC health service and server
// reflection (grpcurl, grpc_health_probe work). SIGTERM/SIGINT drain the
// compiles in flight and close the cache cleanly; so does
// --idle_exit_seconds=N after N seconds without an RPC.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "cache/artifact_store.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "prometheus/exposer.h"
#include "server/hit_socket_server.h"
#include "server/kiln_service.h"
#include "spdlog/spdlog.h"
#include "support/artifact_signature.h"
#include "support/hit_wire.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7733",
          "address:port to serve on (port 0: pick a free one)");
ABSL_FLAG(std::string, data_dir, "",
          "cache directory (default $XDG_CACHE_HOME/kiln or ~/.cache/kiln)");
ABSL_FLAG(int64_t, cache_bytes, int64_t{10} << 30,
          "cache size budget in bytes (LRU eviction past it)");
ABSL_FLAG(int64_t, hot_cache_bytes, int64_t{256} << 20,
          "in-memory copy of hot artifacts, bytes (LRU; 0: off): hits skip "
          "RocksDB, SHA-256 and parsing");
ABSL_FLAG(int32_t, compile_threads, 0, "compile threads (0: number of cores)");
ABSL_FLAG(int32_t, max_queued_compiles, 64,
          "compiles waiting for a thread before RESOURCE_EXHAUSTED");
ABSL_FLAG(int32_t, max_message_bytes, 256 << 20,
          "largest request/response message");
ABSL_FLAG(int32_t, max_deadline_seconds, 300,
          "longest a Compile waits, whatever the caller's deadline");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9733",
          "address:port of the Prometheus /metrics endpoint (empty: off; port "
          "0: pick one)");
ABSL_FLAG(std::string, hit_listen, "auto",
          "the hit socket, Lookup outside gRPC (README.md, \"The hit "
          "socket\"): HOST:PORT, unix:PATH, off, or auto: --listen's host at "
          "its port + 1 (a free port when --listen's is 0), or PATH.hits next "
          "to a unix:PATH");
ABSL_FLAG(int32_t, hit_max_connections, 256,
          "hit socket connections at once (one thread each); more are closed "
          "and those clients use gRPC");
ABSL_FLAG(int32_t, hit_request_timeout_ms, 10000,
          "a hit socket request must arrive whole this long after its first "
          "byte (else its connection is closed); also the limit for writing "
          "a response");
ABSL_FLAG(int32_t, hit_idle_timeout_seconds, 600,
          "hit socket connections idle this long are closed");
ABSL_FLAG(std::string, port_file, "",
          "once serving, write the bound ports here, one a line: gRPC, "
          "/metrics, hit socket (0: off or a Unix socket); for tests and "
          "scripts");
ABSL_FLAG(int32_t, idle_exit_seconds, 0,
          "exit (as on SIGTERM: drain, close the cache) after this many "
          "seconds with no RPC in flight and none served (0: never); the "
          "per-user kilnd that the Python backend starts sets it");
ABSL_FLAG(std::string, signing_key, "",
          "Ed25519 private key (PEM) kilnd signs every artifact with; "
          "created (mode 0600) if absent. Empty: DATA_DIR-signing-key.pem "
          "next to the data dir; off: sign nothing. Clients that trust its "
          "public key (kilnctl public-key) refuse anything else");
ABSL_FLAG(bool, print_public_key, false,
          "print the public key of --signing_key (64 hex digits, what "
          "clients put in KILN_TRUSTED_KEYS) and exit");
ABSL_FLAG(std::string, compiler_identity, "",
          "for tests: store artifacts under this compiler identity instead "
          "of this build's (stands for a kilnd of another build)");

namespace kiln {
namespace {

// --hit_listen=auto: next to --listen (see the flag). Empty when --listen
// has a form this does not know.
std::string AutoHitListen(absl::string_view listen) {
  if (absl::ConsumePrefix(&listen, "unix:"))
    return absl::StrCat("unix:", listen, ".hits");
  std::string host, port;
  int port_number = 0;
  if (!hit_wire::SplitHostPort(listen, &host, &port) ||
      !absl::SimpleAtoi(port, &port_number) || port_number >= 65535)
    return "";
  return hit_wire::JoinHostPort(host, port_number == 0 ? 0 : port_number + 1);
}

std::string DefaultDataDir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return absl::StrCat(xdg, "/kiln");
  if (const char* home = std::getenv("HOME"); home && *home)
    return absl::StrCat(home, "/.cache/kiln");
  return "/var/cache/kiln";
}

// Waits for SIGTERM/SIGINT (blocked in every thread) or, with `idle_exit`
// > 0, until `service` has been idle that long; logs why it returns.
void WaitForStop(const sigset_t& stop_signals, const KilnService& service,
                 absl::Duration idle_exit) {
  if (idle_exit <= absl::ZeroDuration()) {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    spdlog::info("event=stopping signal={}", sig);
    return;
  }
  // Checked a few times per idle period, at least once a second.
  const absl::Duration poll = std::min(
      absl::Seconds(1), std::max(idle_exit / 4, absl::Milliseconds(10)));
  const timespec poll_ts = absl::ToTimespec(poll);
  for (;;) {
    const int sig = sigtimedwait(&stop_signals, nullptr, &poll_ts);
    if (sig > 0) {
      spdlog::info("event=stopping signal={}", sig);
      return;
    }
    const absl::Duration idle = absl::FromChrono(service.activity().IdleFor());
    if (idle >= idle_exit) {
      spdlog::info("event=stopping reason=idle idle_seconds={:.1f}",
                   absl::ToDoubleSeconds(idle));
      return;
    }
  }
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage("kilnd: the Kiln compile daemon");
  absl::ParseCommandLine(argc, argv);
  // Debian's Abseil is built without NDEBUG, so absl::Mutex (gRPC's locks
  // too) runs its deadlock detector by default: a process-wide graph of lock
  // order updated under a global lock on every acquisition, 3-5% of the CPU
  // of a cache hit. A debugging aid, off as in a release build of Abseil.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // Block the stop signals in every thread; one thread waits for them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  ArtifactStoreOptions store_options;
  store_options.data_dir = absl::GetFlag(FLAGS_data_dir).empty()
                               ? DefaultDataDir()
                               : absl::GetFlag(FLAGS_data_dir);
  store_options.capacity_bytes =
      static_cast<uint64_t>(absl::GetFlag(FLAGS_cache_bytes));
  // The signing key first: --print_public_key needs no store.
  std::unique_ptr<ArtifactSigner> signer;
  if (std::string key_path = absl::GetFlag(FLAGS_signing_key);
      key_path != "off") {
    if (key_path.empty()) {
      std::string dir = store_options.data_dir;
      while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
      key_path = dir + "-signing-key.pem";
      // The data dir's parent (~/.cache) may not exist yet.
      std::error_code ignored;
      std::filesystem::create_directories(
          std::filesystem::path(key_path).parent_path(), ignored);
    }
    auto loaded = ArtifactSigner::LoadOrCreate(key_path, /*create=*/true);
    if (!loaded.ok()) {
      spdlog::critical("event=signing_key_failed path={} status=\"{}\"",
                       key_path, loaded.status().ToString());
      return 1;
    }
    signer = *std::move(loaded);
    if (!absl::GetFlag(FLAGS_print_public_key)) {
      spdlog::info("event=signing key={} public_key={}", key_path,
                   signer->public_key_hex());
    }
  }
  if (absl::GetFlag(FLAGS_print_public_key)) {
    if (!signer) {
      spdlog::critical("--print_public_key with --signing_key=off");
      return 1;
    }
    std::printf("%s\n", signer->public_key_hex().c_str());
    return 0;
  }
  auto store = ArtifactStore::Open(store_options);
  if (!store.ok()) {
    spdlog::critical("event=open_failed status=\"{}\"",
                     store.status().ToString());
    return 1;
  }
  if (const CacheStats stats = (*store)->Stats(); stats.recoveries > 0) {
    spdlog::error("event=store_recovered data_dir={} what=\"{}\"",
                  store_options.data_dir, stats.last_recovery);
  }
  KilnServiceOptions options;
  options.compile_threads =
      absl::GetFlag(FLAGS_compile_threads) > 0
          ? absl::GetFlag(FLAGS_compile_threads)
          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  options.max_queued_compiles = static_cast<size_t>(
      std::max(1, absl::GetFlag(FLAGS_max_queued_compiles)));
  options.max_deadline =
      absl::Seconds(absl::GetFlag(FLAGS_max_deadline_seconds));
  options.hot_cache_bytes = static_cast<uint64_t>(
      std::max<int64_t>(0, absl::GetFlag(FLAGS_hot_cache_bytes)));
  options.compiler_identity = absl::GetFlag(FLAGS_compiler_identity);
  options.signer = signer.get();
  KilnService service(store->get(), options);
  // The exposer holds collectables weakly: this shared_ptr keeps it alive.
  auto metrics = std::make_shared<ServerMetrics>(
      [&service] { return service.CurrentStats(); });
  service.set_metrics(metrics.get());
  // A /metrics port that cannot be bound stops the start: skipping it would
  // leave a second kilnd on the host scraped as the first one (same port)
  // with nobody told. Port 0 picks a free one (written to --port_file).
  std::unique_ptr<prometheus::Exposer> exposer;
  int metrics_port = 0;
  if (!absl::GetFlag(FLAGS_metrics_listen).empty()) {
    std::string error;
    try {
      exposer = std::make_unique<prometheus::Exposer>(
          absl::GetFlag(FLAGS_metrics_listen));
      exposer->RegisterCollectable(metrics);
      if (!exposer->GetListeningPorts().empty())
        metrics_port = exposer->GetListeningPorts()[0];
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (metrics_port == 0) {
      spdlog::critical(
          "event=listen_failed what=metrics address={} error=\"{}\" "
          "hint=\"is another kilnd (or something else) serving on this "
          "port? give each kilnd its own --metrics_listen, or HOST:0 for a "
          "free port (written to --port_file), or --metrics_listen= for "
          "none\"",
          absl::GetFlag(FLAGS_metrics_listen),
          error.empty() ? "no port bound" : error);
      return 1;
    }
  }

  // The hit socket is a faster road to what gRPC's Lookup also serves: one
  // that cannot be opened in auto mode is logged and skipped.
  std::unique_ptr<HitSocketServer> hit_socket;
  const std::string hit_flag = absl::GetFlag(FLAGS_hit_listen);
  if (hit_flag != "off") {
    HitSocketOptions hit_options;
    hit_options.listen = hit_flag == "auto"
                             ? AutoHitListen(absl::GetFlag(FLAGS_listen))
                             : hit_flag;
    hit_options.max_connections =
        std::max(1, absl::GetFlag(FLAGS_hit_max_connections));
    hit_options.io_timeout = absl::Milliseconds(
        std::max(1, absl::GetFlag(FLAGS_hit_request_timeout_ms)));
    hit_options.idle_timeout = absl::Seconds(
        std::max(1, absl::GetFlag(FLAGS_hit_idle_timeout_seconds)));
    auto started = HitSocketServer::Start(
        hit_options, [&service](absl::string_view request) {
          return service.LookupOnHitSocket(request);
        });
    if (started.ok()) {
      hit_socket = *std::move(started);
      v1::HitSocket advertised;
      advertised.set_tcp_port(static_cast<uint32_t>(hit_socket->port()));
      advertised.set_unix_path(hit_socket->unix_path());
      service.set_hit_socket(advertised);
    } else if (hit_flag == "auto") {
      spdlog::warn("event=hit_socket_unavailable address={} status=\"{}\"",
                   hit_options.listen, started.status().ToString());
    } else {
      spdlog::critical("event=listen_failed address={} status=\"{}\"", hit_flag,
                       started.status().ToString());
      return 1;
    }
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen),
                           grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(absl::GetFlag(FLAGS_max_message_bytes));
  builder.SetMaxSendMessageSize(absl::GetFlag(FLAGS_max_message_bytes));
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    spdlog::critical("event=listen_failed address={}",
                     absl::GetFlag(FLAGS_listen));
    return 1;
  }
  spdlog::info(
      "event=serving address={} port={} metrics_port={} hit_socket={} "
      "data_dir={} "
      "compile_threads={} hot_cache_bytes={} idle_exit_seconds={}",
      absl::GetFlag(FLAGS_listen), port, metrics_port,
      !hit_socket                       ? std::string("off")
      : hit_socket->unix_path().empty() ? absl::StrCat(hit_socket->port())
                                        : hit_socket->unix_path(),
      store_options.data_dir, options.compile_threads, options.hot_cache_bytes,
      absl::GetFlag(FLAGS_idle_exit_seconds));
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    const std::string tmp = absl::GetFlag(FLAGS_port_file) + ".tmp";
    // Line by line, so that readers of the first line(s) of older kilnds'
    // files keep working.
    std::ofstream(tmp) << port << "\n"
                       << metrics_port << "\n"
                       << (hit_socket ? hit_socket->port() : 0) << "\n";
    std::rename(tmp.c_str(),
                absl::GetFlag(FLAGS_port_file).c_str());  // appears whole
  }
  std::thread stopper([&] {
    WaitForStop(stop_signals, service,
                absl::Seconds(absl::GetFlag(FLAGS_idle_exit_seconds)));
    server->Shutdown(std::chrono::system_clock::now() +
                     std::chrono::seconds(30));
  });
  server->Wait();
  stopper.join();
  hit_socket.reset();  // finishes the hits being answered
  service.Drain();
  if (absl::Status s = (*store)->Flush(); !s.ok())
    spdlog::error("event=flush_failed status=\"{}\"", s.ToString());
  store->reset();
  spdlog::info("event=stopped");
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) { return kiln::Main(argc, argv); }
