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
#include <functional>
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
#include "cache/shared_tier.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "prometheus/exposer.h"
#include "server/auth.h"
#include "server/hit_socket_server.h"
#include "server/kiln_service.h"
#include "server/tls_files.h"
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
ABSL_FLAG(std::string, shared_cache, "",
          "the fleet's shared artifact tier (README.md, \"Running a fleet\"): "
          "redis://HOST:PORT or unix:PATH of a Redis; empty: none");
ABSL_FLAG(std::string, shared_cache_user, "",
          "Redis ACL user for --shared_cache (empty: the default user)");
ABSL_FLAG(std::string, shared_cache_password_file, "",
          "file holding the Redis password for --shared_cache (empty: no "
          "AUTH)");
ABSL_FLAG(std::string, shared_cache_prefix, "kiln",
          "prefix of every Redis key and channel of --shared_cache");
ABSL_FLAG(int32_t, shared_cache_timeout_ms, 1000,
          "longest any one Redis call may take before the shared tier is "
          "marked down (then served and compiled locally)");
ABSL_FLAG(int32_t, shared_cache_lease_ms, 10000,
          "compile lease TTL: renewed every third of it while compiling; a "
          "dead holder's lease is taken over after it");
ABSL_FLAG(int32_t, shared_cache_error_ttl_ms, 30000,
          "how long a compile error stays cached in the shared tier");
ABSL_FLAG(int32_t, test_compile_delay_ms, 0,
          "for tests: every compile sleeps this long first");
ABSL_FLAG(std::string, tls_cert, "",
          "TLS: the server's certificate chain (PEM); with --tls_key, gRPC "
          "serves TLS only. Checked and installed at start and on SIGHUP "
          "(see --tls_refresh_seconds); a file that fails the check is "
          "logged and the previous one stays in use");
ABSL_FLAG(std::string, tls_key, "", "TLS: the server's private key (PEM)");
ABSL_FLAG(std::string, tls_client_ca, "",
          "mTLS: CA bundle (PEM) that clients' certificates must chain to; "
          "set, every client must present one");
ABSL_FLAG(int32_t, tls_refresh_seconds, 0,
          "0: the TLS files are re-read on SIGHUP only; N > 0: also every N "
          "seconds, and installed when they changed and pass the check (for "
          "files renewed without a signal, e.g. a mounted Kubernetes "
          "Secret). New handshakes use installed files within a second");
ABSL_FLAG(std::string, tls_dir, "",
          "directory (created 0700, removed at exit) where kilnd keeps the "
          "checked copies of the TLS files that gRPC reads; default "
          "DATA_DIR-tls next to the data dir");
ABSL_FLAG(std::string, auth_tokens, "",
          "token file (server/auth.h: `sha256-hex roles [name]` lines, roles "
          "compile, read-stats, admin); set, every RPC needs a token with "
          "its role. Re-read on SIGHUP");
ABSL_FLAG(std::string, client_cert_roles, "",
          "mTLS: file of `roles common-name` lines (server/auth.h): a caller "
          "without a token gets the roles of its verified client "
          "certificate's common name (none listed: UNAUTHENTICATED). Needs "
          "--tls_client_ca. Re-read on SIGHUP");
ABSL_FLAG(bool, insecure_listen, false,
          "serve gRPC, the hit socket or /metrics off loopback without TLS "
          "and tokens (a trusted network only)");
ABSL_FLAG(int32_t, max_queued_compiles_per_token, 16,
          "compiles one token (or, under mTLS without tokens, one client "
          "certificate) may have waiting for a thread before "
          "RESOURCE_EXHAUSTED (0: no limit)");
ABSL_FLAG(int32_t, max_running_compiles_per_token, 0,
          "compiles of one token (or client certificate) running at once; "
          "its others wait while other callers' run (0: no limit)");
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

// Whether `address` ("HOST:PORT" or "unix:PATH") can be reached from this
// host only.
bool IsLocalAddress(absl::string_view address) {
  if (absl::StartsWith(address, "unix:")) return true;
  std::string host, port;
  if (!hit_wire::SplitHostPort(address, &host, &port)) return false;
  return absl::StartsWith(host, "127.") || host == "localhost" ||
         host == "::1" || host == "[::1]";
}

// "HOST:PORT" with HOST replaced by 127.0.0.1 (a unix:PATH as it is).
std::string OnLoopback(absl::string_view address) {
  std::string host, port;
  int port_number = 0;
  if (absl::StartsWith(address, "unix:") ||
      !hit_wire::SplitHostPort(address, &host, &port) ||
      !absl::SimpleAtoi(port, &port_number))
    return std::string(address);
  return hit_wire::JoinHostPort("127.0.0.1", port_number);
}

// gRPC's server credentials: TLS over the files `tls` installs (gRPC's
// file watcher re-reads them every second, so what kilnd installs is in
// use within a second), else plaintext.
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(
    const TlsFileInstaller* tls) {
  if (tls == nullptr) return grpc::InsecureServerCredentials();
  const TlsFiles& files = tls->installed();
  auto provider =
      std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
          files.private_key, files.cert_chain, files.client_ca,
          /*refresh_interval_sec=*/1);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (!files.client_ca.empty()) {
    options.watch_root_certs();
    options.set_cert_request_type(
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

TlsFiles TlsFilesFromFlags() {
  return TlsFiles{absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                  absl::GetFlag(FLAGS_tls_client_ca)};
}

// Re-reads the TLS files (SIGHUP, or every --tls_refresh_seconds) and
// installs them when they changed and pass the check; on failure keeps
// the installed ones, logs and counts it. `periodic`: a timed check, which
// logs and counts each distinct failure once (not every N seconds).
class TlsReloader {
 public:
  TlsReloader(TlsFileInstaller* tls, KilnService* service)
      : tls_(tls), service_(service) {}
  void Run(bool periodic) {
    absl::StatusOr<TlsFileInstaller::Reloaded> r = tls_->Reload();
    if (!r.ok()) {
      const std::string error = r.status().ToString();
      if (periodic && error == last_error_) return;
      last_error_ = error;
      service_->CountReloadFailure();
      spdlog::error(
          "event=tls_reload_failed status=\"{}\" (the installed "
          "certificate, generation {}, stays in use)",
          error, tls_->generation());
      return;
    }
    last_error_.clear();
    if (!r->changed && periodic) return;
    spdlog::info(
        "event={} subject=\"{}\" not_after={} client_cas={} generation={}{}",
        r->changed ? "tls_reloaded" : "tls_unchanged", r->info.subject,
        absl::FormatTime(r->info.not_after, absl::UTCTimeZone()),
        r->info.client_cas, tls_->generation(),
        r->changed ? " (new handshakes use it within a second)" : "");
  }

 private:
  TlsFileInstaller* const tls_;
  KilnService* const service_;
  std::string last_error_;
};

// SIGHUP: the token file and the client certificate roles file again (each
// kept as it was if the new one does not parse), and the TLS files
// (installed only if they pass the check).
void Reload(Authenticator* auth, CertRoles* cert_roles, TlsReloader* tls,
            KilnService* service) {
  if (cert_roles != nullptr) {
    absl::StatusOr<size_t> names = cert_roles->Reload();
    if (names.ok()) {
      spdlog::info("event=client_cert_roles_reloaded file={} names={}",
                   cert_roles->path(), *names);
    } else {
      service->CountReloadFailure();
      spdlog::error(
          "event=client_cert_roles_reload_failed file={} status=\"{}\" (the "
          "previous roles stay in force)",
          cert_roles->path(), names.status().ToString());
    }
  }
  if (auth != nullptr) {
    absl::StatusOr<size_t> tokens = auth->Reload();
    if (tokens.ok()) {
      spdlog::info("event=tokens_reloaded file={} tokens={}", auth->path(),
                   *tokens);
    } else {
      service->CountReloadFailure();
      spdlog::error(
          "event=tokens_reload_failed file={} status=\"{}\" (the previous "
          "tokens stay in force)",
          auth->path(), tokens.status().ToString());
    }
  }
  if (tls != nullptr) tls->Run(/*periodic=*/false);
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
// SIGHUP (also in `stop_signals`) calls `on_hup` and goes on waiting; with
// `tick_every` > 0, `on_tick` is called about that often.
void WaitForStop(const sigset_t& stop_signals, const KilnService& service,
                 absl::Duration idle_exit, const std::function<void()>& on_hup,
                 absl::Duration tick_every = absl::ZeroDuration(),
                 const std::function<void()>& on_tick = nullptr) {
  if (idle_exit <= absl::ZeroDuration() && tick_every <= absl::ZeroDuration()) {
    for (;;) {
      int sig = 0;
      sigwait(&stop_signals, &sig);
      if (sig == SIGHUP) {
        on_hup();
        continue;
      }
      spdlog::info("event=stopping signal={}", sig);
      return;
    }
  }
  // Checked a few times per idle period, at least once a second.
  const absl::Duration poll =
      idle_exit <= absl::ZeroDuration()
          ? absl::Seconds(1)
          : std::min(absl::Seconds(1),
                     std::max(idle_exit / 4, absl::Milliseconds(10)));
  const timespec poll_ts = absl::ToTimespec(poll);
  absl::Time next_tick = absl::Now() + tick_every;
  for (;;) {
    const int sig = sigtimedwait(&stop_signals, nullptr, &poll_ts);
    if (sig == SIGHUP) {
      on_hup();
      continue;
    }
    if (sig > 0) {
      spdlog::info("event=stopping signal={}", sig);
      return;
    }
    if (tick_every > absl::ZeroDuration() && absl::Now() >= next_tick) {
      on_tick();
      next_tick = absl::Now() + tick_every;
    }
    if (idle_exit <= absl::ZeroDuration()) continue;
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
  sigaddset(&stop_signals, SIGHUP);  // reload (tokens, TLS files)
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  ArtifactStoreOptions store_options;
  store_options.data_dir = absl::GetFlag(FLAGS_data_dir).empty()
                               ? DefaultDataDir()
                               : absl::GetFlag(FLAGS_data_dir);
  while (store_options.data_dir.size() > 1 &&
         store_options.data_dir.back() == '/')
    store_options.data_dir.pop_back();

  // Who may reach kilnd, decided before anything listens (README.md,
  // "Running kilnd for a team").
  const bool tls = !absl::GetFlag(FLAGS_tls_cert).empty() ||
                   !absl::GetFlag(FLAGS_tls_key).empty();
  if (tls) {
    if (absl::GetFlag(FLAGS_tls_cert).empty() ||
        absl::GetFlag(FLAGS_tls_key).empty()) {
      spdlog::critical("event=bad_flags reason=\"--tls_cert and --tls_key go "
                       "together\"");
      return 2;
    }
    absl::StatusOr<TlsFilesInfo> files = CheckTlsFiles(TlsFilesFromFlags());
    if (!files.ok()) {
      spdlog::critical("event=tls_files_invalid status=\"{}\"",
                       files.status().ToString());
      return 1;
    }
  } else if (!absl::GetFlag(FLAGS_tls_client_ca).empty()) {
    spdlog::critical(
        "event=bad_flags reason=\"--tls_client_ca needs --tls_cert and "
        "--tls_key\"");
    return 2;
  }
  std::unique_ptr<Authenticator> auth;
  if (!absl::GetFlag(FLAGS_auth_tokens).empty()) {
    auto loaded = Authenticator::Load(absl::GetFlag(FLAGS_auth_tokens));
    if (!loaded.ok()) {
      spdlog::critical("event=tokens_invalid status=\"{}\"",
                       loaded.status().ToString());
      return 1;
    }
    auth = *std::move(loaded);
  }
  std::unique_ptr<CertRoles> cert_roles;
  if (!absl::GetFlag(FLAGS_client_cert_roles).empty()) {
    if (absl::GetFlag(FLAGS_tls_client_ca).empty()) {
      spdlog::critical(
          "event=bad_flags reason=\"--client_cert_roles needs "
          "--tls_client_ca (client certificates are verified against it)\"");
      return 2;
    }
    auto loaded = CertRoles::Load(absl::GetFlag(FLAGS_client_cert_roles));
    if (!loaded.ok()) {
      spdlog::critical("event=client_cert_roles_invalid status=\"{}\"",
                       loaded.status().ToString());
      return 1;
    }
    cert_roles = *std::move(loaded);
  }
  const bool insecure_ok = absl::GetFlag(FLAGS_insecure_listen);
  // Off this host, only TLS with tokens or client certificates, or with the
  // operator's explicit word.
  auto refuse_off_host = [&](absl::string_view flag,
                             absl::string_view address) {
    spdlog::critical(
        "event=refused_insecure_listen flag=--{} address={} reason=\"off "
        "loopback without TLS and tokens (or client certificates), anyone "
        "who reaches the port could compile, list and evict the cache; set "
        "--tls_cert/--tls_key and --auth_tokens (or --tls_client_ca), or "
        "--insecure_listen on a trusted network\"",
        std::string(flag), std::string(address));
    return 2;
  };
  const bool mtls = tls && !absl::GetFlag(FLAGS_tls_client_ca).empty();
  if (!IsLocalAddress(absl::GetFlag(FLAGS_listen)) &&
      !(tls && (auth || mtls)) && !insecure_ok)
    return refuse_off_host("listen", absl::GetFlag(FLAGS_listen));
  // /metrics is plain HTTP without authentication (the counters GetStats
  // gives the read-stats role): with TLS or tokens, on this host only.
  if (!absl::GetFlag(FLAGS_metrics_listen).empty() &&
      !IsLocalAddress(absl::GetFlag(FLAGS_metrics_listen)) &&
      (tls || auth) && !insecure_ok)
    return refuse_off_host("metrics_listen",
                           absl::GetFlag(FLAGS_metrics_listen));

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
  // gRPC reads checked copies of the TLS files (server/tls_files.h). Made
  // after the store is open: its lock keeps a second kilnd on this data
  // dir from replacing the first one's copies in DATA_DIR-tls.
  std::unique_ptr<TlsFileInstaller> tls_files;
  if (tls) {
    const std::string tls_dir = absl::GetFlag(FLAGS_tls_dir).empty()
                                    ? store_options.data_dir + "-tls"
                                    : absl::GetFlag(FLAGS_tls_dir);
    TlsFilesInfo info;
    auto installed =
        TlsFileInstaller::Create(TlsFilesFromFlags(), tls_dir, &info);
    if (!installed.ok()) {
      spdlog::critical("event=tls_files_invalid status=\"{}\"",
                       installed.status().ToString());
      return 1;
    }
    tls_files = *std::move(installed);
    spdlog::info(
        "event=tls subject=\"{}\" not_after={} client_cas={} copies={} "
        "refresh_seconds={}",
        info.subject, absl::FormatTime(info.not_after, absl::UTCTimeZone()),
        info.client_cas, tls_dir, absl::GetFlag(FLAGS_tls_refresh_seconds));
  }
  std::unique_ptr<SharedTier> shared;
  if (!absl::GetFlag(FLAGS_shared_cache).empty()) {
    SharedTierOptions shared_options;
    shared_options.address = absl::GetFlag(FLAGS_shared_cache);
    shared_options.user = absl::GetFlag(FLAGS_shared_cache_user);
    shared_options.password_file =
        absl::GetFlag(FLAGS_shared_cache_password_file);
    shared_options.key_prefix = absl::GetFlag(FLAGS_shared_cache_prefix);
    shared_options.op_timeout = absl::Milliseconds(
        std::max(1, absl::GetFlag(FLAGS_shared_cache_timeout_ms)));
    shared_options.connect_timeout =
        std::min(shared_options.op_timeout, absl::Milliseconds(500));
    shared_options.lease_ttl = absl::Milliseconds(
        std::max(30, absl::GetFlag(FLAGS_shared_cache_lease_ms)));
    shared_options.error_ttl = absl::Milliseconds(
        std::max(1, absl::GetFlag(FLAGS_shared_cache_error_ttl_ms)));
    auto opened = SharedTier::Open(shared_options);
    if (!opened.ok()) {
      spdlog::critical("event=shared_cache_invalid status=\"{}\"",
                       opened.status().ToString());
      return 1;
    }
    shared = *std::move(opened);
  }
  if (const CacheStats stats = (*store)->Stats(); stats.recoveries > 0) {
    spdlog::error("event=store_recovered data_dir={} what=\"{}\"",
                  store_options.data_dir, stats.last_recovery);
  }
  KilnServiceOptions options;
  options.shared = shared.get();
  options.test_compile_delay = absl::Milliseconds(
      std::max(0, absl::GetFlag(FLAGS_test_compile_delay_ms)));
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
  options.per_token_limits.max_queued_per_identity = static_cast<size_t>(
      std::max(0, absl::GetFlag(FLAGS_max_queued_compiles_per_token)));
  options.per_token_limits.max_running_per_identity =
      std::max(0, absl::GetFlag(FLAGS_max_running_compiles_per_token));
  options.signer = signer.get();
  KilnService service(store->get(), options);
  service.set_authenticator(auth.get());
  service.set_cert_roles(cert_roles.get());
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
    // The hit socket speaks plaintext and checks no client certificate:
    // with TLS or tokens it serves this host only (auto: moved to
    // loopback; named off loopback: refused). Tokens travel in its
    // requests; under mTLS without tokens, or with roles by client
    // certificate, auto leaves it off (it would let local callers skip the
    // certificate check, or refuse callers that have only a certificate).
    if ((tls || auth) && !IsLocalAddress(hit_options.listen)) {
      if (hit_flag != "auto" && !insecure_ok)
        return refuse_off_host("hit_listen", hit_flag);
      if (hit_flag == "auto") hit_options.listen = OnLoopback(hit_options.listen);
    }
    if (hit_flag == "auto" && !absl::GetFlag(FLAGS_tls_client_ca).empty() &&
        (!auth || cert_roles)) {
      spdlog::info(
          "event=hit_socket_off reason=\"{}\"",
          cert_roles ? "roles by client certificate" : "mTLS without tokens");
      hit_options.listen.clear();
    }
    hit_options.max_connections =
        std::max(1, absl::GetFlag(FLAGS_hit_max_connections));
    hit_options.io_timeout = absl::Milliseconds(
        std::max(1, absl::GetFlag(FLAGS_hit_request_timeout_ms)));
    hit_options.idle_timeout = absl::Seconds(
        std::max(1, absl::GetFlag(FLAGS_hit_idle_timeout_seconds)));
    auto started =
        hit_options.listen.empty()
            ? absl::StatusOr<std::unique_ptr<HitSocketServer>>(
                  absl::FailedPreconditionError("off under mTLS"))
            : HitSocketServer::Start(
        hit_options, [&service](absl::string_view request) {
          return service.LookupOnHitSocket(request);
        });
    if (started.ok()) {
      hit_socket = *std::move(started);
      v1::HitSocket advertised;
      advertised.set_tcp_port(static_cast<uint32_t>(hit_socket->port()));
      advertised.set_unix_path(hit_socket->unix_path());
      service.set_hit_socket(advertised);
      service.set_hit_socket_local_only(
          (tls || auth) && IsLocalAddress(hit_options.listen));
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
                           ServerCredentials(tls_files.get()), &port);
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
      "data_dir={} compile_threads={} hot_cache_bytes={} idle_exit_seconds={} "
      "shared_cache={} tls={} mtls={} tokens={} client_cert_roles={}",
      absl::GetFlag(FLAGS_listen), port, metrics_port,
      !hit_socket                       ? std::string("off")
      : hit_socket->unix_path().empty() ? absl::StrCat(hit_socket->port())
                                        : hit_socket->unix_path(),
      store_options.data_dir, options.compile_threads, options.hot_cache_bytes,
      absl::GetFlag(FLAGS_idle_exit_seconds),
      shared ? absl::GetFlag(FLAGS_shared_cache) : std::string("off"), tls,
      !absl::GetFlag(FLAGS_tls_client_ca).empty(),
      auth ? absl::GetFlag(FLAGS_auth_tokens) : std::string("off"),
      cert_roles ? absl::GetFlag(FLAGS_client_cert_roles) : std::string("off"));
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
  std::unique_ptr<TlsReloader> tls_reloader;
  if (tls_files) {
    tls_reloader = std::make_unique<TlsReloader>(tls_files.get(), &service);
  }
  std::thread stopper([&] {
    WaitForStop(
        stop_signals, service,
        absl::Seconds(absl::GetFlag(FLAGS_idle_exit_seconds)),
        [&] {
          Reload(auth.get(), cert_roles.get(), tls_reloader.get(), &service);
        },
        tls_reloader ? absl::Seconds(std::max(
                           0, absl::GetFlag(FLAGS_tls_refresh_seconds)))
                     : absl::ZeroDuration(),
        [&] { tls_reloader->Run(/*periodic=*/true); });
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
