// HotArtifacts: kilnd's in-memory, size-bounded LRU of artifacts already read
// from the ArtifactStore and verified there, kept as the serialized
// kiln.v1.Artifact bytes in a reference-counted gRPC slice. A hit on it skips
// the RocksDB read, the SHA-256 check and the protobuf parse, and the bytes go
// to the socket without a copy (a response references the slice).
//
// It is only a copy: the ArtifactStore stays the truth. Before serving an
// entry the caller confirms with ArtifactStore::RecordHit (which also counts
// the hit and updates the store's LRU) that the same entry is still stored,
// so whatever removed it from the store (Evict, LRU eviction for the
// capacity, a corrupt read, a replacing Put) also stops it being served from
// here. Erase/Clear on Evict only free the memory sooner.
//
// Thread-safety: every method may be called concurrently.
#ifndef KILN_SERVER_HOT_ARTIFACTS_H_
#define KILN_SERVER_HOT_ARTIFACTS_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/support/slice.h"
#include "support/sha256.h"

namespace kiln {

// One verified artifact. Immutable once made; shared by the cache and by the
// responses that are still being sent.
struct HotArtifact {
  grpc::Slice artifact_bytes;  // a serialized kiln.v1.Artifact
  absl::Time created;          // the store entry's CachedArtifact::created
  // kilnd's signature of artifact_bytes (support/artifact_signature.h), and
  // LookupResponse's field artifact_signature holding it, as sent after
  // the artifact; both empty when kilnd signs nothing.
  std::string signature;
  grpc::Slice signature_field;
};

class HotArtifacts {
 public:
  // Bytes an entry is charged beyond its artifact bytes (key, list node,
  // map slot, the HotArtifact itself), so that many tiny entries still
  // respect the budget.
  static constexpr uint64_t kEntryOverheadBytes = 256;

  // `capacity_bytes` 0 disables the cache (Insert keeps nothing).
  explicit HotArtifacts(uint64_t capacity_bytes);

  HotArtifacts(const HotArtifacts&) = delete;
  HotArtifacts& operator=(const HotArtifacts&) = delete;

  // The entry for `key`, made the most recently used; null if absent.
  std::shared_ptr<const HotArtifact> Find(const Sha256Digest& key);

  // Adds or replaces the entry for `key`, then drops least recently used
  // entries until the total is within the capacity. An artifact larger than
  // the whole capacity is not kept.
  void Insert(const Sha256Digest& key,
              std::shared_ptr<const HotArtifact> artifact);

  void Erase(const Sha256Digest& key);
  void Clear();

  // What the entries are charged, in total, and how many there are.
  uint64_t bytes() const;
  uint64_t entries() const;
  uint64_t capacity_bytes() const { return capacity_bytes_; }

  // Bytes charged for an artifact of `artifact_bytes` bytes.
  static uint64_t ChargedBytes(uint64_t artifact_bytes) {
    return artifact_bytes + kEntryOverheadBytes;
  }

 private:
  struct Node {
    Sha256Digest key;
    std::shared_ptr<const HotArtifact> artifact;
  };
  using Lru = std::list<Node>;  // most recently used first

  void EraseLocked(Lru::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t capacity_bytes_;
  mutable absl::Mutex mu_;
  Lru lru_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Sha256Digest, Lru::iterator> index_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kiln

#endif  // KILN_SERVER_HOT_ARTIFACTS_H_
