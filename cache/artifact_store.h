// ArtifactStore: the compiled-artifact cache of kilnd, on RocksDB.
//
// The store maps a guard key (the SHA-256 digest of a compile request's
// canonical encoding, DESIGN.md decision 2) to an opaque payload (the
// serialized artifact) plus the metadata the cache needs: how long the compile
// took. It is payload-agnostic: it never parses the payload.
//
// Guarantees:
//  - Integrity. Every value is stored with a header (format version, payload
//    length, SHA-256 over the key, the header and the payload). Every Get
//    verifies it; an entry that fails (or that RocksDB itself reports as
//    corrupt) is never returned: it is deleted, logged and counted in
//    CacheStats::corrupt_dropped, and the Get reports a miss.
//  - Crash safety. Each Put is one atomic RocksDB write batch (artifact,
//    index record and any evictions it causes) through the write-ahead log, so
//    after a crash an entry is either wholly there or absent. With the default
//    `sync_writes = false` a process crash (SIGKILL, abort) loses nothing that
//    Put acknowledged; a power loss or kernel crash may lose the last
//    acknowledged writes, but never tears one.
//  - Size cap. The logical size of all entries (key + header + payload) stays
//    within `capacity_bytes`; a Put that would exceed it first evicts the
//    least recently used entries, in the same write batch. "Recently used" is a
//    logical clock (a sequence number bumped by every Put and every hit), so
//    eviction order is deterministic. Access times live in their own column
//    family and hits update them in batches (every `access_flush_batch` hits,
//    every `flush_interval`, on Flush() and on close), not with a write per
//    hit.
//    Disk usage (CacheStats::disk_bytes) is larger than the logical size by
//    RocksDB's overheads: the WAL (at most 4 memtables, each 1/16 of the
//    capacity clamped to [4, 64] MiB) and evicted artifacts' space awaiting
//    compaction. The store compacts when the files pass 1.5x the live bytes
//    plus the WAL allowance (see ReclaimSpace).
//  - Damage. A store whose files RocksDB finds corrupt at open (a flipped
//    byte in a table file, a blob file's header, the MANIFEST...) does not
//    stop the open: the store runs RocksDB's RepairDB (unreadable files go
//    to <data_dir>/lost), then reads back and verifies every indexed entry,
//    dropping those that fail and artifacts that lost their index record.
//    If the repair fails or the repaired database cannot be opened, the dir
//    is renamed to <data_dir>.damaged-<UTC time> and the store starts
//    empty. Either way it logs at error level and reports it in
//    CacheStats::recoveries / recovery_dropped / last_recovery. Corruption
//    RocksDB finds only on a read (data blocks, blob values) drops that
//    entry (see Integrity). Read-only opens never repair. Limits: RocksDB
//    7.8's repair does not take blob files back, so entries stored in them
//    (payloads of blob_min_bytes or more) are dropped by the sweep; entries
//    in a table file the repair cannot read, and writes after a damaged
//    WAL record (point-in-time recovery, as after a crash), are lost without
//    being counted.
//  - Stats. Counters live in memory and are persisted with the access batches
//    and on close. After a crash the counters (hits, misses, puts, evictions,
//    corrupt_dropped, deletes, compile_seconds_saved) may lag by at most one
//    flush interval; `entries` and `bytes` are always exact (recomputed at open
//    from the index, which is written in the same batch as the artifacts).
//  - Safety. The data dir is created owner-only (0700; an existing dir with
//    wider permissions is narrowed to 0700). A second ArtifactStore (in this
//    or another process) on the same dir fails with FAILED_PRECONDITION naming
//    the dir (RocksDB's LOCK file). I/O failures (full disk, read-only or
//    unwritable files) come back as statuses, never as a crash. After a
//    failed write the store asks RocksDB to resume before the next one: a
//    full disk (ENOSPC) recovers that way once space is back. Write errors
//    RocksDB cannot resume from (EIO, EFBIG...) make the next write close and
//    reopen the database (at most once a second; read-only while opening for
//    writing fails, so reads go on). Meanwhile writes fail with UNAVAILABLE;
//    nothing acknowledged is lost.
//
// Errors (absl::Status codes used by this API):
//  INVALID_ARGUMENT     bad options.
//  NOT_FOUND            read-only open of a dir that holds no store.
//  FAILED_PRECONDITION  dir locked by another store; write to a read-only
//                       store; dir written by a newer, unknown format.
//  PERMISSION_DENIED    the dir or its files are not accessible to this user.
//  RESOURCE_EXHAUSTED   disk full, or a single entry larger than the capacity.
//  UNAVAILABLE          other I/O errors; the database stopped after a write
//                       error and not reopened yet (the operation may
//                       succeed later).
//  DATA_LOSS            the database's own files are corrupt beyond one entry
//                       (read-only open; or a damaged store that could be
//                       neither repaired nor moved aside).
//  INTERNAL             anything RocksDB reports that fits none of the above.
//
// Thread-safety: every method of ArtifactStore may be called concurrently from
// any number of threads. Gets never wait for Puts' disk writes; mutations
// (Put, Delete, EvictAll, the access-time flush) are serialized.
#ifndef KILN_CACHE_ARTIFACT_STORE_H_
#define KILN_CACHE_ARTIFACT_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "support/sha256.h"

namespace rocksdb {
class Env;
}  // namespace rocksdb

namespace kiln {

// Keys are guard keys: SHA-256 digests of a compile request's canonical
// encoding (graph/guard_key.h's GuardKey, an alias of Sha256Digest). The
// store takes the digest type itself so as not to depend on the compiler.

struct ArtifactStoreOptions {
  // Directory of the RocksDB database. Created (with missing parents) with
  // mode 0700 unless `read_only`.
  std::string data_dir;

  // Budget for the logical size of all entries (32-byte key + 64-byte header
  // + payload each). Must be > 0.
  uint64_t capacity_bytes = uint64_t{10} << 30;

  // Open without taking the write path: Put/Delete/EvictAll fail with
  // FAILED_PRECONDITION, hits are counted in memory only. Fails with
  // NOT_FOUND if the dir holds no store. Used by tools that inspect a dir.
  bool read_only = false;

  // fsync the write-ahead log on every Put/Delete. Off by default: a cache
  // entry lost to a power failure costs one recompile, while an fsync per Put
  // costs 0.1-1.5 ms (bench/README.md). A crash of the process never loses
  // acknowledged puts either way.
  bool sync_writes = false;

  // Shared RocksDB cache for SST blocks and blob values (hot artifacts are
  // served from memory). 0 disables caching of data blocks and blobs.
  uint64_t block_cache_bytes = uint64_t{256} << 20;

  // Payloads of at least this many bytes go to RocksDB blob files instead of
  // SST files, so compactions do not rewrite them.
  uint64_t blob_min_bytes = 16 << 10;

  // Access times and counters are persisted every `flush_interval`, and as
  // soon as `access_flush_batch` hits are pending.
  absl::Duration flush_interval = absl::Seconds(1);
  uint32_t access_flush_batch = 1024;

  // RocksDB's environment (file system, background threads); nullptr is
  // RocksDB's default. Tests wrap the file system to inject I/O errors. Not
  // owned: it must outlive the store.
  rocksdb::Env* rocksdb_env = nullptr;
};

// Caller-provided metadata stored with a payload.
struct PutMetadata {
  // How long the compile that produced the payload took. Each hit adds it to
  // CacheStats::compile_seconds_saved.
  double compile_seconds = 0;
  // An optional 32-byte label kept in the entry's index record and returned
  // by List() (kilnd: the request key the entry was compiled for, where the
  // entry's own key also covers the compiler's identity).
  std::optional<Sha256Digest> label;
};

// A verified entry returned by Get.
struct CachedArtifact {
  std::string payload;
  double compile_seconds = 0;
  absl::Time created;  // when it was Put
};

// One entry as listed by List(): metadata only, unverified.
struct EntryInfo {
  Sha256Digest key;
  uint64_t bytes = 0;       // logical size counted against the capacity
  uint64_t access_seq = 0;  // logical clock of the last Put or hit
  absl::Time last_access;   // wall time of the last Put or hit
  double compile_seconds = 0;
  std::optional<Sha256Digest> label;  // PutMetadata::label
};

// Counters, as the server publishes them. A plain value: a snapshot.
struct CacheStats {
  uint64_t entries = 0;         // entries in the store (exact)
  uint64_t bytes = 0;           // their logical size (exact)
  uint64_t capacity_bytes = 0;  // the configured budget
  // Size of all files in the data dir (SST, blob, WAL, manifest, logs): what
  // the cache takes on disk, for comparison with `bytes`.
  uint64_t disk_bytes = 0;
  uint64_t hits = 0;             // Gets that returned an entry
  uint64_t misses = 0;           // Gets that did not (absent or corrupt)
  uint64_t puts = 0;             // acknowledged Puts
  uint64_t deletes = 0;          // Deletes that removed an entry
  uint64_t evictions = 0;        // entries removed for the budget or EvictAll
  uint64_t corrupt_dropped = 0;  // entries that failed verification
  uint64_t io_errors = 0;        // operations that failed with an I/O error
  double compile_seconds_saved = 0;  // sum of compile_seconds over all hits
  // Damage found at open (see "Damage" in the file comment), for this open
  // only (not persisted): recoveries (0 or 1), the entries the repair's
  // sweep dropped (also counted in corrupt_dropped; entries in files the
  // repair could not read, or in a store moved aside, are gone uncounted)
  // and what was done, in words (empty if nothing).
  uint64_t recoveries = 0;
  uint64_t recovery_dropped = 0;
  std::string last_recovery;
};

class ArtifactStore {
 public:
  // Opens (creating if needed) the store in `options.data_dir`. Entries over
  // the capacity (e.g. after the capacity was lowered) are evicted at open.
  // Errors: see the file comment; every message names the data dir.
  static absl::StatusOr<std::unique_ptr<ArtifactStore>> Open(
      const ArtifactStoreOptions& options);

  // Persists access times and counters, syncs the WAL and closes the
  // database. Errors at close are logged.
  ~ArtifactStore();

  // Only Open() can make the key that this constructor takes; use Open().
  class Impl;
  class OpenKey {
    friend class ArtifactStore;
    OpenKey() = default;
  };
  ArtifactStore(OpenKey, std::unique_ptr<Impl> impl);

  ArtifactStore(const ArtifactStore&) = delete;
  ArtifactStore& operator=(const ArtifactStore&) = delete;

  // Stores `payload` under `key`, replacing any entry with that key, after
  // evicting least recently used entries as needed to stay within the
  // capacity. On OK the entry is durable against process crashes (and against
  // power loss if `sync_writes`). On error nothing changed.
  // Errors: RESOURCE_EXHAUSTED (entry larger than the capacity, disk full),
  // FAILED_PRECONDITION (read-only store), UNAVAILABLE and PERMISSION_DENIED
  // (I/O, database stopped).
  absl::Status Put(const Sha256Digest& key, absl::string_view payload,
                   const PutMetadata& metadata);

  // Returns the verified entry, or std::nullopt on a miss. An entry that fails
  // verification is removed, logged and counted, and reported as a miss.
  // A hit makes the entry the most recently used.
  // Errors: only I/O errors reading the database, or no database while it
  // could not be reopened after a write error (UNAVAILABLE...).
  absl::StatusOr<std::optional<CachedArtifact>> Get(const Sha256Digest& key);

  // Counts a hit on an entry whose payload the caller already holds from an
  // earlier Get (a server's in-memory copy of hot artifacts), exactly as a
  // Get would count it: the entry becomes the most recently used (its access
  // time is persisted with the next batch), `hits` and
  // `compile_seconds_saved` grow. No I/O, no verification.
  // Returns false, counting nothing, when no entry with `key` created at
  // `created` (CachedArtifact::created of that Get) is present any more: it
  // was deleted, evicted, dropped as corrupt or replaced since, and the
  // caller must not serve its copy.
  bool RecordHit(const Sha256Digest& key, absl::Time created);

  // Whether an entry with `key` is present, from the in-memory index: no I/O,
  // no verification (a Get may still find it corrupt), no effect on recency
  // or counters.
  bool Contains(const Sha256Digest& key) const;

  // Removes the entry with `key`, if any (OK either way).
  absl::Status Delete(const Sha256Digest& key);

  // Removes every entry (counted as evictions). Counters other than entries
  // and bytes are kept.
  absl::Status EvictAll();

  // All entries, least recently used first (the eviction order).
  std::vector<EntryInfo> List() const;

  // A snapshot of the counters (disk_bytes lists the data dir: a few dozen
  // files).
  CacheStats Stats() const;

  // Persists pending access times and the counters now (they are otherwise
  // persisted every `flush_interval` and on close).
  absl::Status Flush();

  // Returns the disk space of evicted and deleted entries now: flushes the
  // memtables (so old WAL files go) and compacts the artifacts with forced
  // blob garbage collection. Space otherwise comes back through RocksDB's
  // background compactions, and the store runs this itself, from its
  // background thread, when the data dir grows beyond 1.5x the live bytes
  // plus the WAL allowance and at least half the live bytes were put since
  // the last time (so its rewrites of the live data at most double the
  // writes). Errors: FAILED_PRECONDITION (read-only store), I/O errors.
  absl::Status ReclaimSpace();

  // The options the store was opened with.
  const ArtifactStoreOptions& options() const;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln

#endif  // KILN_CACHE_ARTIFACT_STORE_H_
