// Shared helpers for the artifact store tests: temporary data dirs,
// deterministic keys and payloads, and raw RocksDB access to the store's
// column families (to corrupt entries underneath it).
#ifndef KILN_TESTS_CACHE_CACHE_TEST_UTIL_H_
#define KILN_TESTS_CACHE_CACHE_TEST_UTIL_H_

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "cache/artifact_format.h"
#include "cache/artifact_store.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "support/sha256.h"

namespace kiln::cache_test {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents.
class TempDir {
 public:
  TempDir() {
    const char* tmp = getenv("TMPDIR");
    std::string pattern =
        absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                     "/kiln_cache_test.XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) {
      ADD_FAILURE() << "mkdtemp " << pattern << " failed";
    }
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string Sub(absl::string_view name) const {
    return absl::StrCat(path_, "/", name);
  }

 private:
  std::string path_;
};

inline Sha256Digest KeyFor(absl::string_view name) { return Sha256(name); }

// `size` bytes determined by `key` (a xorshift stream seeded by it), so a
// reader can recompute what any writer stored.
inline std::string PayloadFor(const Sha256Digest& key, size_t size) {
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < 8; ++i) state = (state << 8) ^ key[i] ^ (state >> 56);
  if (state == 0) state = 1;
  std::string payload(size, '\0');
  for (size_t i = 0; i < size; i += 8) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    for (size_t j = 0; j < 8 && i + j < size; ++j) {
      payload[i + j] = static_cast<char>(state >> (8 * j));
    }
  }
  return payload;
}

inline ArtifactStoreOptions TestOptions(const std::string& dir,
                                        uint64_t capacity_bytes) {
  ArtifactStoreOptions options;
  options.data_dir = dir;
  options.capacity_bytes = capacity_bytes;
  options.block_cache_bytes = 8 << 20;
  return options;
}

inline std::unique_ptr<ArtifactStore> OpenOrDie(
    const ArtifactStoreOptions& options) {
  absl::StatusOr<std::unique_ptr<ArtifactStore>> store =
      ArtifactStore::Open(options);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(*store) : nullptr;
}

// The store's database opened directly (the store must be closed).
class RawDb {
 public:
  explicit RawDb(const std::string& dir) {
    rocksdb::DBOptions options;
    std::vector<rocksdb::ColumnFamilyDescriptor> families = {
        {rocksdb::kDefaultColumnFamilyName, {}},
        {cache_format::kArtifactsFamily, {}},
        {cache_format::kAccessFamily, {}},
        {cache_format::kMetaFamily, {}}};
    // The blob settings matter for writes: without them a rewritten large
    // value would move inline, which is fine for reading but not what the
    // store does.
    families[1].options.enable_blob_files = true;
    families[1].options.min_blob_size = 16 << 10;
    std::vector<rocksdb::ColumnFamilyHandle*> raw_handles;
    rocksdb::DB* raw_db = nullptr;
    rocksdb::Status status =
        rocksdb::DB::Open(options, dir, families, &raw_handles, &raw_db);
    EXPECT_TRUE(status.ok()) << status.ToString();
    db_.reset(raw_db);
    for (rocksdb::ColumnFamilyHandle* handle : raw_handles) {
      handles_.emplace_back(handle);
    }
  }
  ~RawDb() {
    handles_.clear();
    if (db_ != nullptr) {
      EXPECT_TRUE(db_->Close().ok());
    }
  }

  bool ok() const { return db_ != nullptr && handles_.size() == 4; }
  rocksdb::ColumnFamilyHandle* artifacts() { return handles_[1].get(); }
  rocksdb::ColumnFamilyHandle* access() { return handles_[2].get(); }
  rocksdb::ColumnFamilyHandle* meta() { return handles_[3].get(); }

  static rocksdb::Slice Key(const Sha256Digest& key) {
    return rocksdb::Slice(reinterpret_cast<const char*>(key.data()),
                          key.size());
  }
  // Returns false when absent.
  bool Read(rocksdb::ColumnFamilyHandle* family, const rocksdb::Slice& key,
            std::string* value) {
    rocksdb::Status status = db_->Get({}, family, key, value);
    EXPECT_TRUE(status.ok() || status.IsNotFound()) << status.ToString();
    return status.ok();
  }
  void Write(rocksdb::ColumnFamilyHandle* family, const rocksdb::Slice& key,
             const std::string& value) {
    rocksdb::Status status = db_->Put({}, family, key, value);
    EXPECT_TRUE(status.ok()) << status.ToString();
  }
  void Delete(rocksdb::ColumnFamilyHandle* family, const rocksdb::Slice& key) {
    rocksdb::Status status = db_->Delete({}, family, key);
    EXPECT_TRUE(status.ok()) << status.ToString();
  }
  // Writes the memtables out to SST (and blob) files.
  void FlushAll() {
    for (auto& handle : handles_) {
      rocksdb::Status status = db_->Flush({}, handle.get());
      EXPECT_TRUE(status.ok()) << status.ToString();
    }
  }

 private:
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<std::unique_ptr<rocksdb::ColumnFamilyHandle>> handles_;
};

}  // namespace kiln::cache_test

#endif  // KILN_TESTS_CACHE_CACHE_TEST_UTIL_H_
