// The on-disk format of the artifact store: column families and the byte
// layout of their values. Internal to cache/ (and its tests, which write
// through raw RocksDB to corrupt entries); callers use artifact_store.h.
//
// Column families:
//   "artifacts"  guard key (32 bytes) -> value header + payload. Large values
//                live in blob files.
//   "access"     guard key -> IndexRecord: the LRU clock and the size and
//                compile time of the entry. Written in the same batch as the
//                artifact on Put; hits rewrite it in batches.
//   "meta"       "format" -> fixed32 store format version
//                "stats"  -> StatsRecord (the persisted counters)
//
// All integers are little-endian.
#ifndef KILN_CACHE_ARTIFACT_FORMAT_H_
#define KILN_CACHE_ARTIFACT_FORMAT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "support/sha256.h"

namespace kiln::cache_format {

inline constexpr char kArtifactsFamily[] = "artifacts";
inline constexpr char kAccessFamily[] = "access";
inline constexpr char kMetaFamily[] = "meta";
inline constexpr char kFormatKey[] = "format";
inline constexpr char kStatsKey[] = "stats";

// Version of the whole data dir layout (the "format" key in "meta").
inline constexpr uint32_t kStoreFormatVersion = 1;

// Value header, 64 bytes:
//   0  magic "KLNA"
//   4  fixed32 value format version (kValueFormatVersion)
//   8  fixed64 payload length
//  16  fixed64 compile seconds (IEEE-754 bits of a double)
//  24  fixed64 created, microseconds since the Unix epoch
//  32  SHA-256 of key || header bytes [0, 32) || payload
// The digest covers the key so that a value copied under another key fails,
// and the header fields so that a flipped bit anywhere is detected.
inline constexpr char kValueMagic[4] = {'K', 'L', 'N', 'A'};
inline constexpr uint32_t kValueFormatVersion = 1;
inline constexpr size_t kDigestOffset = 32;
inline constexpr size_t kValueHeaderSize = 64;
inline constexpr size_t kKeySize = 32;

// Bytes counted against the capacity for an entry with `payload_size`.
inline constexpr uint64_t EntryBytes(uint64_t payload_size) {
  return kKeySize + kValueHeaderSize + payload_size;
}

// Encodes a complete value (header + payload).
std::string EncodeValue(const Sha256Digest& key, absl::string_view payload,
                        double compile_seconds, absl::Time created);

struct DecodedValue {
  absl::string_view payload;  // points into the decoded bytes
  double compile_seconds = 0;
  absl::Time created;
};

// Verifies and decodes `value` stored under `key`. DATA_LOSS with the reason
// (bad magic, unknown version, length mismatch, digest mismatch) on failure.
absl::Status DecodeValue(const Sha256Digest& key, absl::string_view value,
                         DecodedValue* decoded);

// "access" column family value, 40 bytes, or 72 with a label:
//   0 fixed64 access sequence (LRU clock)  8 fixed64 last access, unix micros
//  16 fixed64 entry bytes                 24 fixed64 compile seconds (double)
//  32 fixed64 created, unix micros        40 label (32 bytes, optional)
struct IndexRecord {
  uint64_t access_seq = 0;
  int64_t access_unix_micros = 0;
  uint64_t bytes = 0;
  double compile_seconds = 0;
  int64_t created_unix_micros = 0;
  std::optional<Sha256Digest> label;  // PutMetadata::label
};
std::string EncodeIndexRecord(const IndexRecord& record);
std::optional<IndexRecord> DecodeIndexRecord(absl::string_view bytes);

// "stats" value: fixed32 version, then fixed64 hits, misses, puts, deletes,
// evictions, corrupt_dropped, io_errors, compile_seconds_saved (double).
struct StatsRecord {
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t puts = 0;
  uint64_t deletes = 0;
  uint64_t evictions = 0;
  uint64_t corrupt_dropped = 0;
  uint64_t io_errors = 0;
  double compile_seconds_saved = 0;
};
std::string EncodeStatsRecord(const StatsRecord& stats);
std::optional<StatsRecord> DecodeStatsRecord(absl::string_view bytes);

std::string EncodeFixed32(uint32_t value);
std::optional<uint32_t> DecodeFixed32(absl::string_view bytes);

}  // namespace kiln::cache_format

#endif  // KILN_CACHE_ARTIFACT_FORMAT_H_
