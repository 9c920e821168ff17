#include "cache/artifact_format.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace kiln::cache_format {
namespace {

// Explicit little-endian encoding, independent of the host byte order.
void PutFixed64(std::string* out, uint64_t value) {
  char bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(value >> (8 * i));
  out->append(bytes, 8);
}

void PutFixed32(std::string* out, uint32_t value) {
  char bytes[4];
  for (int i = 0; i < 4; ++i) bytes[i] = static_cast<char>(value >> (8 * i));
  out->append(bytes, 4);
}

uint64_t GetFixed64(const char* p) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) {
    value |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  }
  return value;
}

uint32_t GetFixed32(const char* p) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) {
    value |= uint32_t{static_cast<unsigned char>(p[i])} << (8 * i);
  }
  return value;
}

uint64_t DoubleBits(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

double BitsDouble(uint64_t bits) {
  double value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

Sha256Digest ValueDigest(const Sha256Digest& key, absl::string_view header,
                         absl::string_view payload) {
  Sha256Hasher hasher;
  hasher.Update(
      absl::string_view(reinterpret_cast<const char*>(key.data()), key.size()));
  hasher.Update(header.substr(0, kDigestOffset));
  hasher.Update(payload);
  return hasher.Finish();
}

}  // namespace

std::string EncodeValue(const Sha256Digest& key, absl::string_view payload,
                        double compile_seconds, absl::Time created) {
  std::string value;
  value.reserve(kValueHeaderSize + payload.size());
  value.append(kValueMagic, sizeof(kValueMagic));
  PutFixed32(&value, kValueFormatVersion);
  PutFixed64(&value, payload.size());
  PutFixed64(&value, DoubleBits(compile_seconds));
  PutFixed64(&value, static_cast<uint64_t>(absl::ToUnixMicros(created)));
  const Sha256Digest digest = ValueDigest(key, value, payload);
  value.append(reinterpret_cast<const char*>(digest.data()), digest.size());
  value.append(payload.data(), payload.size());
  return value;
}

absl::Status DecodeValue(const Sha256Digest& key, absl::string_view value,
                         DecodedValue* decoded) {
  if (value.size() < kValueHeaderSize) {
    return absl::DataLossError(absl::StrCat("value of ", value.size(),
                                            " bytes is shorter than the ",
                                            kValueHeaderSize, "-byte header"));
  }
  if (std::memcmp(value.data(), kValueMagic, sizeof(kValueMagic)) != 0) {
    return absl::DataLossError("bad magic in value header");
  }
  const uint32_t version = GetFixed32(value.data() + 4);
  if (version != kValueFormatVersion) {
    return absl::DataLossError(absl::StrCat("unknown value format version ",
                                            version, " (expected ",
                                            kValueFormatVersion, ")"));
  }
  const uint64_t payload_length = GetFixed64(value.data() + 8);
  if (payload_length != value.size() - kValueHeaderSize) {
    return absl::DataLossError(absl::StrCat("header says ", payload_length,
                                            " payload bytes, value holds ",
                                            value.size() - kValueHeaderSize));
  }
  const absl::string_view payload = value.substr(kValueHeaderSize);
  const Sha256Digest digest = ValueDigest(key, value, payload);
  if (std::memcmp(digest.data(), value.data() + kDigestOffset, digest.size()) !=
      0) {
    return absl::DataLossError("SHA-256 mismatch");
  }
  decoded->payload = payload;
  decoded->compile_seconds = BitsDouble(GetFixed64(value.data() + 16));
  decoded->created =
      absl::FromUnixMicros(static_cast<int64_t>(GetFixed64(value.data() + 24)));
  return absl::OkStatus();
}

std::string EncodeIndexRecord(const IndexRecord& record) {
  std::string out;
  out.reserve(40 + kKeySize);
  PutFixed64(&out, record.access_seq);
  PutFixed64(&out, static_cast<uint64_t>(record.access_unix_micros));
  PutFixed64(&out, record.bytes);
  PutFixed64(&out, DoubleBits(record.compile_seconds));
  PutFixed64(&out, static_cast<uint64_t>(record.created_unix_micros));
  if (record.label) {
    out.append(reinterpret_cast<const char*>(record.label->data()),
               record.label->size());
  }
  return out;
}

std::optional<IndexRecord> DecodeIndexRecord(absl::string_view bytes) {
  if (bytes.size() != 40 && bytes.size() != 40 + kKeySize) return std::nullopt;
  IndexRecord record;
  if (bytes.size() == 40 + kKeySize) {
    record.label.emplace();
    std::memcpy(record.label->data(), bytes.data() + 40, kKeySize);
  }
  record.access_seq = GetFixed64(bytes.data());
  record.access_unix_micros =
      static_cast<int64_t>(GetFixed64(bytes.data() + 8));
  record.bytes = GetFixed64(bytes.data() + 16);
  record.compile_seconds = BitsDouble(GetFixed64(bytes.data() + 24));
  record.created_unix_micros =
      static_cast<int64_t>(GetFixed64(bytes.data() + 32));
  return record;
}

namespace {
constexpr uint32_t kStatsRecordVersion = 1;
constexpr size_t kStatsRecordSize = 4 + 8 * 8;
}  // namespace

std::string EncodeStatsRecord(const StatsRecord& stats) {
  std::string out;
  out.reserve(kStatsRecordSize);
  PutFixed32(&out, kStatsRecordVersion);
  PutFixed64(&out, stats.hits);
  PutFixed64(&out, stats.misses);
  PutFixed64(&out, stats.puts);
  PutFixed64(&out, stats.deletes);
  PutFixed64(&out, stats.evictions);
  PutFixed64(&out, stats.corrupt_dropped);
  PutFixed64(&out, stats.io_errors);
  PutFixed64(&out, DoubleBits(stats.compile_seconds_saved));
  return out;
}

std::optional<StatsRecord> DecodeStatsRecord(absl::string_view bytes) {
  if (bytes.size() != kStatsRecordSize ||
      GetFixed32(bytes.data()) != kStatsRecordVersion) {
    return std::nullopt;
  }
  const char* p = bytes.data() + 4;
  StatsRecord stats;
  stats.hits = GetFixed64(p);
  stats.misses = GetFixed64(p + 8);
  stats.puts = GetFixed64(p + 16);
  stats.deletes = GetFixed64(p + 24);
  stats.evictions = GetFixed64(p + 32);
  stats.corrupt_dropped = GetFixed64(p + 40);
  stats.io_errors = GetFixed64(p + 48);
  stats.compile_seconds_saved = BitsDouble(GetFixed64(p + 56));
  return stats;
}

std::string EncodeFixed32(uint32_t value) {
  std::string out;
  PutFixed32(&out, value);
  return out;
}

std::optional<uint32_t> DecodeFixed32(absl::string_view bytes) {
  if (bytes.size() != 4) return std::nullopt;
  return GetFixed32(bytes.data());
}

}  // namespace kiln::cache_format
