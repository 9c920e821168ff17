// The kiln.v1.Kiln gRPC service: compile-or-serve with single-flight per
// guard key over the RocksDB ArtifactStore, lookup by key, stats and cache
// administration.
//
// Hits are served from HotArtifacts (server/hot_artifacts.h), an in-memory
// LRU of verified, serialized artifacts, before the store: no RocksDB read,
// SHA-256 or parse. Lookup, the hit path of kiln::Client, uses gRPC's
// callback API with raw ByteBuffers: its response is the 1-6 byte header of
// LookupResponse.artifact followed by the cached slice itself, so the
// artifact is never parsed nor copied per request (the wire format is
// exactly LookupResponse's).
//
// With a shared tier (KilnServiceOptions::shared, issue 19) a Compile that
// misses locally goes: join a local compile in flight, else (the flight's
// leader, on a shared-tier thread) fetch the artifact from the shared tier
// (verified, then stored locally) -> a cached compile error -> take the
// key's lease and compile (then store, publish, release) -> or wait for the
// lease holder's publish and fetch again; a lease that expires unpublished
// is taken over. Whenever the shared tier is down or a call fails, the
// flight compiles locally. Lookup (the hit path) reads the local tier only:
// clients send Compile on its miss.
//
// Thread-safety: every RPC may run concurrently (the sync methods on gRPC's
// sync server threads, Lookup on its callback threads).
#ifndef KILN_SERVER_KILN_SERVICE_H_
#define KILN_SERVER_KILN_SERVICE_H_

#include <atomic>
#include <memory>

#include "absl/time/time.h"
#include "cache/artifact_store.h"
#include "cache/shared_tier.h"
#include "server/activity_tracker.h"
#include "server/auth.h"
#include "graph/imported_request.h"
#include "kiln/v1/service.grpc.pb.h"
#include "server/compile_pool.h"
#include "server/hit_socket_server.h"
#include "server/hot_artifacts.h"
#include "server/inflight_compiles.h"
#include "server/metrics.h"
#include "support/artifact_signature.h"

namespace kiln {

struct KilnServiceOptions {
  int compile_threads = 2;
  size_t max_queued_compiles = 64;
  // Longest a Compile waits, whatever deadline the caller set.
  absl::Duration max_deadline = absl::Minutes(5);
  // Budget of HotArtifacts (artifact bytes plus a small per-entry charge);
  // 0 serves every hit from the store.
  uint64_t hot_cache_bytes = uint64_t{256} << 20;
  // The identity artifacts are stored under, with the request key
  // (compiler/compiler_identity.h). Empty: this build's CompilerIdentity().
  // Tests set another to stand for a kilnd of another build.
  std::string compiler_identity;
  // The fleet's shared tier (cache/shared_tier.h), or null: between a local
  // miss and a local compile (see KilnService). Must outlive the service.
  SharedTier* shared = nullptr;
  // Threads that resolve local misses against the shared tier (fetch, take
  // the lease or wait for another replica's publish).
  int shared_threads = 16;
  // Test only: every compile sleeps this long first (a slow compile, for the
  // lease tests).
  absl::Duration test_compile_delay = absl::ZeroDuration();
  // Fair use: per-token limits on queued and running compiles
  // (server/compile_pool.h); apply to callers named by a token or, without
  // tokens, by a verified client certificate (mTLS).
  CompilePoolLimits per_token_limits;
  // Signs every artifact served (support/artifact_signature.h); null: none
  // is signed. Not owned; must outlive the service.
  const ArtifactSigner* signer = nullptr;
};

class KilnService final
    : public v1::Kiln::WithRawCallbackMethod_Lookup<v1::Kiln::Service> {
 public:
  KilnService(ArtifactStore* store, const KilnServiceOptions& options);
  ~KilnService() override;

  grpc::Status Compile(grpc::ServerContext* ctx, const v1::CompileRequest* req,
                       v1::CompileResponse* resp) override;
  // Raw Lookup: the request bytes are a LookupRequest, the response bytes a
  // LookupResponse (see the file comment).
  grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext* ctx,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::Status GetStats(grpc::ServerContext* ctx,
                        const v1::GetStatsRequest* req,
                        v1::Stats* resp) override;
  grpc::Status ListEntries(grpc::ServerContext* ctx,
                           const v1::ListEntriesRequest* req,
                           v1::ListEntriesResponse* resp) override;
  grpc::Status Evict(grpc::ServerContext* ctx, const v1::EvictRequest* req,
                     v1::EvictResponse* resp) override;
  grpc::Status ExplainKey(grpc::ServerContext* ctx,
                          const v1::CompileRequest* req,
                          v1::ExplainKeyResponse* resp) override;
  grpc::Status GetServerInfo(grpc::ServerContext* ctx,
                             const v1::GetServerInfoRequest* req,
                             v1::ServerInfo* resp) override;

  // A Lookup on the hit socket (server/hit_socket_server.h): `request` is a
  // LookupRequest's bytes; the reply's pieces are the LookupResponse's
  // bytes, the artifact's shared with HotArtifacts. Counted in the stats as
  // a gRPC Lookup is, and in /metrics under method "HitSocketLookup".
  HitReply LookupOnHitSocket(absl::string_view request);
  // What GetServerInfo advertises as the hit socket (call before serving).
  void set_hit_socket(const v1::HitSocket& hit_socket) {
    hit_socket_ = hit_socket;
  }
  // Advertise the hit socket only to callers on this host (gRPC over
  // loopback or a Unix socket): kilnd with TLS serves it on loopback only.
  void set_hit_socket_local_only(bool local_only) {
    hit_socket_local_only_ = local_only;
  }

  // Tokens and roles (server/auth.h): with one set, every RPC checks the
  // caller's "authorization" metadata (the hit socket: the request's
  // `authorization` field) for the role it needs; without, every caller
  // may do everything (kilnd on loopback). Call before serving; must
  // outlive the service.
  void set_authenticator(const Authenticator* auth) { auth_ = auth; }
  // Roles by client certificate (server/auth.h, kilnd under mTLS with
  // --client_cert_roles): set, an RPC without a token (or every RPC, when
  // there is no authenticator) is authorized by the common name of the
  // caller's verified client certificate. The hit socket, which sees no
  // certificate, is unaffected. Call before serving; must outlive the
  // service.
  void set_cert_roles(const CertRoles* roles) { cert_roles_ = roles; }
  // Counts a re-read of the token or TLS files that failed (Stats
  // .reload_failures, kiln_reload_failures_total). Thread-safe.
  void CountReloadFailure() { reload_failures_.fetch_add(1); }

  // Finishes queued and running compiles (they land in the cache).
  void Drain();

  // The counters GetStats returns (also what /metrics publishes).
  v1::Stats CurrentStats() const;
  // Where RPC outcomes and compile latencies are recorded (may be null;
  // must outlive the service).
  void set_metrics(ServerMetrics* metrics) { metrics_ = metrics; }

  // Every RPC (gRPC or hit socket) is in flight here while it runs: how
  // long the service has been idle (kilnd's --idle_exit_seconds).
  const ActivityTracker& activity() const { return activity_; }

 private:
  // Keys here are store keys: (request key, compiler identity) as
  // StoreKeyOf makes them.
  // The cached artifact for key, if any (a corrupt entry reads as none),
  // from HotArtifacts when the store still holds that entry (then sets
  // *from_memory), else read from the store and kept in HotArtifacts. Counts
  // the hit in the store; the caller counts it in the service's stats.
  std::shared_ptr<const HotArtifact> FindHot(const Sha256Digest& key,
                                             bool* from_memory);
  // The cached artifact for key, parsed (the compile threads' re-check).
  std::shared_ptr<const v1::Artifact> FromCache(const Sha256Digest& key);
  // The artifact a LookupRequest's bytes ask for; counts the hit or miss.
  // Errors: INVALID_ARGUMENT for a malformed request, NOT_FOUND.
  absl::StatusOr<std::shared_ptr<const HotArtifact>> LookupKey(
      absl::string_view request_bytes);
  // Runs on a compile thread: compile, store, publish to the flight (and to
  // the shared tier, if any); releases the shared lease if `leased`.
  void RunCompile(const ImportedRequest& request, const Sha256Digest& store_key,
                  bool leased);
  // Runs on a shared-tier thread for a flight's leader (see the file
  // comment); ends by finishing the flight or submitting RunCompile.
  void ResolveShared(std::shared_ptr<const ImportedRequest> request,
                     const Sha256Digest& store_key,
                     const std::string& fair_use_key);
  // Submits RunCompile to the compile pool as `fair_use_key`'s (the
  // caller's per-token share, CompilePool::SubmitFor), or finishes the
  // flight with its refusal (releasing the lease).
  void SubmitCompile(std::shared_ptr<const ImportedRequest> request,
                     const Sha256Digest& store_key, bool leased,
                     const std::string& fair_use_key);
  // The shared tier's artifact for the request, checked (parsed, its guard
  // key, its binary's SHA-256) and stored locally; null if absent or bad
  // (a bad one is deleted from the shared tier). UNAVAILABLE when the call
  // failed.
  absl::StatusOr<std::shared_ptr<const v1::Artifact>> FetchShared(
      const ImportedRequest& request, const Sha256Digest& store_key);
  // Where this kilnd stores the artifact for a request key.
  Sha256Digest StoreKeyOf(const Sha256Digest& request_key) const;

  grpc::Status Done(const char* method, grpc::Status status);
  // The caller's identity if it may call `method`, which needs `role`;
  // logs refusals. Without an authenticator: the anonymous identity.
  absl::StatusOr<Identity> Authorize(const grpc::ServerContextBase& ctx,
                                     Role role, const char* method) const;
  // The signature of an artifact serialized as `artifact_bytes` (empty when
  // kilnd has no signer).
  std::string SignArtifact(absl::string_view artifact_bytes) const;

  ArtifactStore* const store_;
  ServerMetrics* metrics_ = nullptr;
  const Authenticator* auth_ = nullptr;
  const CertRoles* cert_roles_ = nullptr;
  const KilnServiceOptions options_;
  const std::string identity_;  // options_.compiler_identity or the build's
  InflightCompiles inflight_;
  std::unique_ptr<CompilePool> pool_;
  std::unique_ptr<CompilePool> shared_pool_;  // with options_.shared only
  std::atomic<bool> draining_{false};
  HotArtifacts hot_;
  v1::HitSocket hit_socket_;
  bool hit_socket_local_only_ = false;
  ActivityTracker activity_;
  std::atomic<uint64_t> hits_{0}, misses_{0}, compiles_{0}, joins_{0},
      compile_errors_{0}, hot_hits_{0}, lease_waits_{0}, takeovers_{0},
      shared_rejected_{0}, reload_failures_{0};
};

}  // namespace kiln

#endif  // KILN_SERVER_KILN_SERVICE_H_
