// SharedTier: the artifact cache shared by a fleet of kilnd replicas, on
// Redis (issue 19). RocksDB (artifact_store.h) stays each replica's local
// tier; this is the tier between a local miss and a local compile.
//
// What lives in Redis, per store key K (64 hex digits), all keys carrying
// the hash tag {K} so that one entry's keys share a Redis Cluster slot:
//   PREFIX:{K}:a   the artifact: the local store's value encoding
//                  (artifact_format.h: header with SHA-256 over the key, the
//                  header and the payload, then the serialized artifact).
//                  GetArtifact verifies it against K, so a corrupt value or
//                  one copied from another key is detected, deleted and
//                  counted, never returned. No TTL: size Redis with
//                  maxmemory and an LRU policy.
//   PREFIX:{K}:l   the compile lease: a random token, SET NX PX lease_ttl,
//                  renewed every lease_ttl/3 while the holder compiles
//                  (compare-and-pexpire script), released by
//                  compare-and-delete (the pattern of Redis's SET page; a
//                  single Redis, not Redlock: the lease only saves duplicate
//                  compiles, artifacts are verified whoever wrote them).
//   PREFIX:{K}:e   a compile error ("CODE MESSAGE"), PX error_ttl, so a bad
//                  graph is not compiled on every replica.
//   channel PREFIX:published   K is published on it after :a or :e is set;
//                  waiters wake on it and poll every poll_interval anyway
//                  (a lost message or subscriber costs latency, not
//                  correctness).
//
// Degraded mode: every Redis call runs with op_timeout (connect with
// connect_timeout). The first failure marks the tier down, logs once
// (event=shared_cache_down) and every call then fails at once with
// UNAVAILABLE, touching no socket, while a background thread reconnects
// every reconnect_interval (event=shared_cache_up when back). Callers serve
// and compile locally meanwhile; up() is the kiln_shared_cache_up gauge.
//
// Redis Cluster: point address at any master; calls follow MOVED/ASK
// replies to the slot's node (the hash tag keeps an entry's keys in one
// slot, so the lease scripts run on one node); PUBLISH is cluster-wide.
//
// Thread-safety: all methods are thread-safe (a pool of connections, one
// per call in flight).
#ifndef KILN_CACHE_SHARED_TIER_H_
#define KILN_CACHE_SHARED_TIER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "support/sha256.h"

namespace kiln {

struct SharedTierOptions {
  // "redis://HOST:PORT" (also "HOST:PORT") or "unix:PATH".
  std::string address;
  // ACL user (empty: the default user) and the file holding its password
  // (empty: no AUTH). The file's trailing newline is ignored.
  std::string user;
  std::string password_file;
  std::string key_prefix = "kiln";
  absl::Duration connect_timeout = absl::Milliseconds(500);
  absl::Duration op_timeout = absl::Seconds(1);
  absl::Duration reconnect_interval = absl::Milliseconds(500);
  absl::Duration lease_ttl = absl::Seconds(10);
  absl::Duration error_ttl = absl::Seconds(30);
  // Longest a waiter sleeps between looks at the entry.
  absl::Duration poll_interval = absl::Milliseconds(100);
  // Idle connections kept for reuse.
  int max_idle_connections = 8;
};

// Counters since start (what GetStats reports as shared_*).
struct SharedTierStats {
  bool up = false;
  uint64_t hits = 0;           // GetArtifact found a verified artifact
  uint64_t misses = 0;         // GetArtifact found none
  uint64_t error_hits = 0;     // GetError found a cached compile error
  uint64_t corrupt = 0;        // values that failed verification (deleted)
  uint64_t leases = 0;         // leases taken
  uint64_t published = 0;      // artifacts written
  uint64_t bytes_read = 0;     // artifact bytes fetched (verified or not)
  uint64_t bytes_written = 0;  // artifact bytes published
  uint64_t failures = 0;       // Redis calls that failed (down, timeout)
};

class SharedTier {
 public:
  // Parses the address and starts the background threads (reconnect,
  // lease renewal, subscriber). Never fails for an unreachable Redis: the
  // tier starts down and comes up when Redis does. INVALID_ARGUMENT for a
  // malformed address, an unreadable password file.
  static absl::StatusOr<std::unique_ptr<SharedTier>> Open(
      const SharedTierOptions& options);
  ~SharedTier();
  SharedTier(const SharedTier&) = delete;
  SharedTier& operator=(const SharedTier&) = delete;

  // The kiln_shared_cache_up gauge: connected, calls go to Redis.
  bool up() const;

  // The verified payload (a serialized artifact) under `key`, or nullopt.
  // A value that fails verification is deleted and reads as nullopt.
  // UNAVAILABLE while down or on a failed call.
  absl::StatusOr<std::optional<std::string>> GetArtifact(
      const Sha256Digest& key);
  // Writes the artifact and publishes the key.
  absl::Status PutArtifact(const Sha256Digest& key, absl::string_view payload,
                           double compile_seconds);
  // Deletes the artifact (one that failed a check above this tier); counts
  // it as corrupt.
  absl::Status DeleteArtifact(const Sha256Digest& key);
  // A compile error cached under `key` (as the status it was), or nullopt.
  absl::StatusOr<std::optional<absl::Status>> GetError(const Sha256Digest& key);
  // Caches `error` for error_ttl and publishes the key.
  absl::Status PutError(const Sha256Digest& key, const absl::Status& error);

  // Takes the compile lease of `key`: true if taken (it is then renewed in
  // the background until ReleaseLease), false if another holder has it.
  absl::StatusOr<bool> TryLease(const Sha256Digest& key);
  // Stops renewing and deletes the lease if it is still ours.
  void ReleaseLease(const Sha256Digest& key);

  // Sleeps until `key` is published, poll_interval passes or `deadline`,
  // whichever comes first.
  void WaitForPublish(const Sha256Digest& key, absl::Time deadline);

  SharedTierStats Stats() const;

  // Redis key names (for tests and tools).
  std::string ArtifactKey(const Sha256Digest& key) const;
  std::string LeaseKey(const Sha256Digest& key) const;
  std::string ErrorKey(const Sha256Digest& key) const;

  class Impl;

 private:
  explicit SharedTier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln

#endif  // KILN_CACHE_SHARED_TIER_H_
