#include "cache/artifact_store.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cache/artifact_format.h"
#include "cache/rocksdb_status.h"
#include "rocksdb/cache.h"
#include "rocksdb/convenience.h"
#include "rocksdb/db.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/options.h"
#include "rocksdb/table.h"
#include "rocksdb/write_batch.h"

namespace kiln {
namespace {

namespace format = cache_format;
using cache_internal::ErrnoError;
using cache_internal::FromRocksDb;
using format::IndexRecord;
using format::StatsRecord;

rocksdb::Slice KeySlice(const Sha256Digest& key) {
  return rocksdb::Slice(reinterpret_cast<const char*>(key.data()), key.size());
}

absl::string_view ToAbsl(const rocksdb::Slice& slice) {
  return absl::string_view(slice.data(), slice.size());
}

// LZ4 for values: artifacts (ELF objects, cubins, protos) compress by 2-4x,
// and LZ4 decompresses at GB/s, so a hit costs little CPU for the disk and
// cache space it saves. Falls back to Snappy, then none, if the RocksDB build
// lacks it.
rocksdb::CompressionType PickCompression() {
  const std::vector<rocksdb::CompressionType> supported =
      rocksdb::GetSupportedCompressions();
  for (rocksdb::CompressionType wanted :
       {rocksdb::kLZ4Compression, rocksdb::kSnappyCompression}) {
    if (std::find(supported.begin(), supported.end(), wanted) !=
        supported.end()) {
      return wanted;
    }
  }
  return rocksdb::kNoCompression;
}

// Creates `dir` and its missing parents with mode 0700, or narrows an
// existing dir to 0700.
absl::Status PrepareDataDir(const std::string& dir, bool read_only) {
  struct stat st;
  if (stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("data dir ", dir, " exists and is not a directory"));
    }
    if (!read_only && (st.st_mode & 077) != 0) {
      if (chmod(dir.c_str(), 0700) != 0) {
        return ErrnoError(errno, absl::StrCat("cannot make data dir ", dir,
                                              " owner-only (chmod 0700)"));
      }
      spdlog::warn("artifact store: data dir {} had mode {:o}, narrowed to 700",
                   dir, st.st_mode & 0777);
    }
    return absl::OkStatus();
  }
  if (errno != ENOENT) {
    return ErrnoError(errno, absl::StrCat("cannot stat data dir ", dir));
  }
  if (read_only) {
    return absl::NotFoundError(
        absl::StrCat("data dir ", dir,
                     " does not exist (opening read-only creates nothing)"));
  }
  // mkdir each missing component; EEXIST is a parent that exists already (or
  // one a concurrent opener just made).
  for (size_t pos = dir.find('/', 1);; pos = dir.find('/', pos + 1)) {
    const std::string prefix =
        pos == std::string::npos ? dir : dir.substr(0, pos);
    if (!prefix.empty() && mkdir(prefix.c_str(), 0700) != 0 &&
        errno != EEXIST) {
      return ErrnoError(errno, absl::StrCat("cannot create data dir ", dir,
                                            " (at ", prefix, ")"));
    }
    if (pos == std::string::npos) break;
  }
  // mkdir's mode is filtered by the umask, which can only narrow it; chmod
  // makes the result exactly 0700 whatever the umask.
  if (chmod(dir.c_str(), 0700) != 0) {
    return ErrnoError(errno, absl::StrCat("cannot chmod data dir ", dir));
  }
  return absl::OkStatus();
}

}  // namespace

class ArtifactStore::Impl {
 public:
  explicit Impl(const ArtifactStoreOptions& options) : options_(options) {}
  ~Impl();

  absl::Status Open();
  absl::Status Put(const Sha256Digest& key, absl::string_view payload,
                   const PutMetadata& metadata);
  absl::StatusOr<std::optional<CachedArtifact>> Get(const Sha256Digest& key);
  bool RecordHit(const Sha256Digest& key, absl::Time created);
  bool Contains(const Sha256Digest& key) const;
  absl::Status Delete(const Sha256Digest& key);
  absl::Status EvictAll();
  std::vector<EntryInfo> List() const;
  CacheStats Stats() const;
  absl::Status Flush();
  absl::Status ReclaimSpace();
  const ArtifactStoreOptions& options() const { return options_; }

 private:
  // RocksDB's options for the store's database and its column families.
  void DatabaseOptions(rocksdb::DBOptions* db_options,
                       std::vector<rocksdb::ColumnFamilyDescriptor>* families);
  // Opens db_ and the handles; read-only when `read_only`.
  absl::Status OpenDatabase(bool read_only);
  // OpenDatabase, CheckFormat, LoadStats and LoadIndex; closes the database
  // again if one of them fails.
  absl::Status OpenAndLoad();
  // After `damage` (DATA_LOSS) at open: RocksDB's RepairDB, then a sweep
  // that drops entries the repair left inconsistent; if that fails, moves the
  // data dir aside and opens an empty store. Records what it did in
  // recovery_.
  absl::Status Recover(const absl::Status& damage);
  // After a repair: drops index records whose artifact is missing or fails
  // verification, and artifacts without an index record. Returns how many
  // entries it dropped.
  absl::StatusOr<uint64_t> SweepAfterRepair();
  // Closes db_ (if open) and drops the handles.
  void CloseDatabase();
  absl::Status CheckFormat();
  absl::Status LoadStats();
  absl::Status LoadIndex();
  // Rebuilds the in-memory index from the "access" family. Where `previous`
  // (the index before a reopen) has a later access for a key, keeps it.
  absl::Status ScanIndex(
      const absl::flat_hash_map<Sha256Digest, IndexRecord>& previous,
      std::vector<std::string>* broken);
  // Closes and reopens the database after a write error RocksDB cannot
  // resume from; falls back to read-only if it cannot open for writing.
  absl::Status ReopenLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);

  // The write path. All of them hold write_mu_ while writing, so the
  // in-memory index always matches what the database holds.
  absl::Status WriteLocked(rocksdb::WriteBatch* batch, absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  absl::Status EnsureWritableLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  absl::Status EvictToCapacityLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  absl::Status FlushPending();
  void DropCorrupt(const Sha256Digest& key, absl::string_view reason);

  // In-memory index maintenance (callers hold mu_).
  void EraseFromIndexLocked(const Sha256Digest& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void InsertIntoIndexLocked(const Sha256Digest& key, const IndexRecord& record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes the indexed entry at `it` the most recently used and queues its
  // access record; true when the pending batch is full (flush now).
  bool TouchLocked(absl::flat_hash_map<Sha256Digest, IndexRecord>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  uint64_t DiskBytes() const;
  // Runs ReclaimSpace when the files outgrow the live data (flusher thread).
  void MaybeReclaimSpace();
  void FlusherLoop();
  bool FlusherShouldWake() const ABSL_SHARED_LOCKS_REQUIRED(flusher_mu_) {
    return stop_flusher_ || flush_requested_;
  }
  void RequestFlush();

  absl::Status ReadOnlyError(absl::string_view what) const {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": the artifact store on ", options_.data_dir,
                     " was opened read-only"));
  }

  const ArtifactStoreOptions options_;
  rocksdb::WriteOptions write_options_;
  rocksdb::ReadOptions read_options_;

  // db_ and the handles change only in ReopenLocked, which holds write_mu_
  // and db_mu_ exclusively. So holders of write_mu_ use them freely; other
  // users (Get, ReclaimSpace) hold db_mu_ shared. db_ is null only after a
  // reopen failed both for writing and read-only.
  mutable absl::Mutex db_mu_ ABSL_ACQUIRED_AFTER(write_mu_);
  // Declared before the handles: members are destroyed in reverse order, and
  // column family handles must go before their database (the destructor also
  // does this explicitly, to close the database with a status).
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<std::unique_ptr<rocksdb::ColumnFamilyHandle>> handles_;
  rocksdb::ColumnFamilyHandle* artifacts_ = nullptr;
  rocksdb::ColumnFamilyHandle* access_ = nullptr;
  rocksdb::ColumnFamilyHandle* meta_ = nullptr;
  // Memtable size (and blob file size) chosen from the capacity at open.
  uint64_t write_buffer_bytes_ = 0;

  // Serializes every database write. Acquired before mu_.
  absl::Mutex write_mu_;
  // Set when a write failed: the next write first asks RocksDB to resume,
  // or reopens the database.
  bool write_failed_ ABSL_GUARDED_BY(write_mu_) = false;
  // The database was reopened read-only after a write error.
  bool reopened_read_only_ ABSL_GUARDED_BY(write_mu_) = false;
  absl::Time last_reopen_ ABSL_GUARDED_BY(write_mu_) = absl::InfinitePast();
  absl::Status last_reopen_error_ ABSL_GUARDED_BY(write_mu_);

  // The in-memory index and counters; held only briefly, never across I/O.
  mutable absl::Mutex mu_ ABSL_ACQUIRED_AFTER(write_mu_);
  absl::flat_hash_map<Sha256Digest, IndexRecord> index_ ABSL_GUARDED_BY(mu_);
  // (access_seq, key), least recently used first.
  absl::btree_set<std::pair<uint64_t, Sha256Digest>> lru_ ABSL_GUARDED_BY(mu_);
  // Keys whose access record changed since it was last written.
  absl::flat_hash_set<Sha256Digest> pending_access_ ABSL_GUARDED_BY(mu_);
  // Hits since the last access flush (the batch trigger counts hits, not
  // distinct keys).
  uint64_t pending_hits_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  StatsRecord counters_ ABSL_GUARDED_BY(mu_);
  // Bytes put since the flusher last considered ReclaimSpace.
  uint64_t put_bytes_since_reclaim_ ABSL_GUARDED_BY(mu_) = 0;
  bool counters_dirty_ ABSL_GUARDED_BY(mu_) = false;

  // What the open found damaged and did about it (in memory only: a reset
  // loses the persisted counters with the rest).
  uint64_t recoveries_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t recovery_dropped_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_recovery_ ABSL_GUARDED_BY(mu_);

  absl::Mutex flusher_mu_;
  bool stop_flusher_ ABSL_GUARDED_BY(flusher_mu_) = false;
  bool flush_requested_ ABSL_GUARDED_BY(flusher_mu_) = false;
  std::thread flusher_;
};

absl::Status ArtifactStore::Impl::Open() {
  if (options_.data_dir.empty()) {
    return absl::InvalidArgumentError("artifact store: data_dir is empty");
  }
  if (options_.capacity_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "artifact store on ", options_.data_dir, ": capacity_bytes is 0"));
  }
  if (options_.flush_interval <= absl::ZeroDuration() ||
      options_.access_flush_batch == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact store on ", options_.data_dir,
                     ": flush_interval and access_flush_batch must be > 0"));
  }
  if (absl::Status s = PrepareDataDir(options_.data_dir, options_.read_only);
      !s.ok()) {
    return s;
  }
  write_options_.sync = options_.sync_writes;
  if (absl::Status s = OpenAndLoad(); !s.ok()) {
    // A cache can always start again: damaged files cost recompiles, not
    // the service. Read-only opens (tools inspecting a dir) change nothing.
    if (options_.read_only || !absl::IsDataLoss(s)) return s;
    if (absl::Status r = Recover(s); !r.ok()) return r;
  }
  if (!options_.read_only) {
    absl::MutexLock lock(&write_mu_);
    if (absl::Status s = EvictToCapacityLocked(); !s.ok()) return s;
    flusher_ = std::thread([this] { FlusherLoop(); });
  }
  absl::MutexLock lock(&mu_);
  spdlog::info(
      "artifact store: opened {}{}: {} entries, {} of {} bytes; lifetime {} "
      "hits, {} misses, {} corrupt dropped",
      options_.data_dir, options_.read_only ? " (read-only)" : "",
      index_.size(), bytes_, options_.capacity_bytes, counters_.hits,
      counters_.misses, counters_.corrupt_dropped);
  return absl::OkStatus();
}

void ArtifactStore::Impl::DatabaseOptions(
    rocksdb::DBOptions* db_options_out,
    std::vector<rocksdb::ColumnFamilyDescriptor>* families_out) {
  const rocksdb::CompressionType compression = PickCompression();
  std::shared_ptr<rocksdb::Cache> cache;
  if (options_.block_cache_bytes > 0) {
    cache = rocksdb::NewLRUCache(options_.block_cache_bytes);
  }
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = cache;
  table.no_block_cache = cache == nullptr;
  // Most lookups of a cache are misses for new keys: a Bloom filter answers
  // them without reading data blocks.
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  table.block_size = 16 << 10;
  table.format_version = 5;
  std::shared_ptr<rocksdb::TableFactory> table_factory(
      rocksdb::NewBlockBasedTableFactory(table));

  // Memtables and WAL files are disk (and memory) the budget does not see:
  // scale them with the capacity, 1/16 of it between 4 and 64 MiB, so that a
  // small cache is not dwarfed by its own write-ahead log.
  const uint64_t write_buffer = std::clamp<uint64_t>(
      options_.capacity_bytes / 16, uint64_t{4} << 20, uint64_t{64} << 20);
  write_buffer_bytes_ = write_buffer;

  rocksdb::DBOptions db_options;
  if (options_.rocksdb_env != nullptr) db_options.env = options_.rocksdb_env;
  db_options.create_if_missing = true;
  db_options.create_missing_column_families = true;
  db_options.paranoid_checks = true;
  // After a crash, recover the WAL up to the first torn record: the database
  // is a consistent prefix of the acknowledged writes.
  db_options.wal_recovery_mode = rocksdb::WALRecoveryMode::kPointInTimeRecovery;
  // Forces flushes of the small families' memtables too, so old WAL files go.
  db_options.max_total_wal_size = 4 * write_buffer;
  db_options.max_background_jobs = 2;
  db_options.bytes_per_sync = 1 << 20;
  // RocksDB's own LOG files count against the disk too: at most ~5 MiB.
  db_options.keep_log_file_num = 4;
  db_options.max_log_file_size = 1 << 20;

  rocksdb::ColumnFamilyOptions artifact_options;
  artifact_options.table_factory = table_factory;
  artifact_options.compression = compression;
  artifact_options.write_buffer_size = write_buffer;
  artifact_options.level_compaction_dynamic_level_bytes = true;
  // Values above blob_min_bytes are written once into blob files and only
  // referenced from the LSM tree, so compactions do not rewrite megabytes of
  // kernels. Garbage collection relocates live blobs out of the older half of
  // the blob files, and forces compactions once half of a file is garbage, so
  // space of evicted artifacts comes back.
  artifact_options.enable_blob_files = true;
  artifact_options.min_blob_size = options_.blob_min_bytes;
  artifact_options.blob_file_size = write_buffer;
  artifact_options.blob_compression_type = compression;
  artifact_options.enable_blob_garbage_collection = true;
  artifact_options.blob_garbage_collection_age_cutoff = 0.5;
  artifact_options.blob_garbage_collection_force_threshold = 0.5;
  artifact_options.blob_cache = cache;

  rocksdb::ColumnFamilyOptions small_options;
  small_options.table_factory = table_factory;
  small_options.compression = compression;
  small_options.write_buffer_size = std::min<uint64_t>(write_buffer, 8 << 20);
  small_options.level_compaction_dynamic_level_bytes = true;

  *db_options_out = db_options;
  *families_out = {
      {rocksdb::kDefaultColumnFamilyName, small_options},
      {format::kArtifactsFamily, artifact_options},
      {format::kAccessFamily, small_options},
      {format::kMetaFamily, small_options},
  };
}

absl::Status ArtifactStore::Impl::OpenDatabase(bool read_only) {
  rocksdb::DBOptions db_options;
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  DatabaseOptions(&db_options, &families);
  std::vector<rocksdb::ColumnFamilyHandle*> raw_handles;
  rocksdb::DB* raw_db = nullptr;
  rocksdb::Status status =
      read_only ? rocksdb::DB::OpenForReadOnly(db_options, options_.data_dir,
                                               families, &raw_handles, &raw_db)
                : rocksdb::DB::Open(db_options, options_.data_dir, families,
                                    &raw_handles, &raw_db);
  db_.reset(raw_db);
  for (rocksdb::ColumnFamilyHandle* handle : raw_handles) {
    handles_.emplace_back(handle);
  }
  if (cache_internal::IsLockHeld(status)) {
    CloseDatabase();
    return absl::FailedPreconditionError(absl::StrCat(
        "artifact store data dir ", options_.data_dir,
        " is in use by another ArtifactStore (in this or another process): "
        "its RocksDB lock ",
        options_.data_dir, "/LOCK is held (", status.ToString(), ")"));
  }
  if (!status.ok()) {
    CloseDatabase();
    return FromRocksDb(status, "cannot open the artifact store",
                       options_.data_dir);
  }
  artifacts_ = handles_[1].get();
  access_ = handles_[2].get();
  meta_ = handles_[3].get();
  return absl::OkStatus();
}

void ArtifactStore::Impl::CloseDatabase() {
  artifacts_ = access_ = meta_ = nullptr;
  handles_.clear();
  if (db_ == nullptr) return;
  if (rocksdb::Status s = db_->Close(); !s.ok()) {
    spdlog::error("artifact store {}: closing the database: {}",
                  options_.data_dir, s.ToString());
  }
  db_.reset();
}

absl::Status ArtifactStore::Impl::OpenAndLoad() {
  absl::Status status = OpenDatabase(options_.read_only);
  if (status.ok()) status = CheckFormat();
  if (status.ok()) status = LoadStats();
  if (status.ok()) status = LoadIndex();
  if (!status.ok()) {
    CloseDatabase();
    absl::MutexLock lock(&mu_);
    counters_ = StatsRecord();
    index_.clear();
    lru_.clear();
    pending_access_.clear();
    bytes_ = 0;
  }
  return status;
}

namespace {

// `dir`.damaged-<UTC time>, with -2, -3... if that exists already.
std::string DamagedName(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string base = absl::StrCat(
      dir, ".damaged-",
      absl::FormatTime("%Y%m%dT%H%M%SZ", absl::Now(), absl::UTCTimeZone()));
  std::string name = base;
  for (int i = 2; std::filesystem::exists(name); ++i) {
    name = absl::StrCat(base, "-", i);
  }
  return name;
}

}  // namespace

absl::Status ArtifactStore::Impl::Recover(const absl::Status& damage) {
  const std::string& dir = options_.data_dir;
  spdlog::error(
      "artifact store {}: DAMAGED at open ({}); repairing it with RocksDB's "
      "RepairDB (unreadable files go to {}/lost)",
      dir, damage.ToString(), dir);
  rocksdb::DBOptions db_options;
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  DatabaseOptions(&db_options, &families);
  absl::Status status = FromRocksDb(
      rocksdb::RepairDB(dir, db_options, families, families[0].options),
      "cannot repair the artifact store", dir);
  if (status.ok()) status = OpenAndLoad();
  uint64_t dropped = 0;
  if (status.ok()) {
    absl::StatusOr<uint64_t> swept = SweepAfterRepair();
    if (swept.ok()) {
      dropped = *swept;
    } else {
      status = swept.status();
      CloseDatabase();
    }
  }
  std::string what;
  if (status.ok()) {
    absl::MutexLock lock(&mu_);
    what = absl::StrCat("repaired after \"", damage.message(), "\": kept ",
                        index_.size(), " entries, dropped ", dropped,
                        " inconsistent ones");
  } else {
    // Start empty; the damaged files stay, renamed, for inspection (and to
    // be deleted by whoever looks at them).
    const std::string aside = DamagedName(dir);
    spdlog::error(
        "artifact store {}: repair failed ({}); moving the store aside to {} "
        "and starting EMPTY",
        dir, status.ToString(), aside);
    std::error_code error;
    std::filesystem::rename(dir, aside, error);
    if (error) {
      return absl::DataLossError(
          absl::StrCat(damage.message(), "; repair failed (", status.message(),
                       ") and moving the store aside to ", aside,
                       " failed: ", error.message()));
    }
    if (absl::Status s = PrepareDataDir(dir, /*read_only=*/false); !s.ok()) {
      return s;
    }
    if (absl::Status s = OpenAndLoad(); !s.ok()) return s;
    what = absl::StrCat("damaged (\"", damage.message(),
                        "\"), repair failed; moved aside to ", aside,
                        " and started empty");
  }
  spdlog::error("artifact store {}: RECOVERED: {}", dir, what);
  absl::MutexLock lock(&mu_);
  ++recoveries_;
  recovery_dropped_ += dropped;
  last_recovery_ = what;
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ArtifactStore::Impl::SweepAfterRepair() {
  std::vector<Sha256Digest> indexed;
  {
    absl::MutexLock lock(&mu_);
    indexed.reserve(index_.size());
    for (const auto& [key, record] : index_) indexed.push_back(key);
  }
  // Every indexed entry must read back and verify: one Get each, so that one
  // unreadable value costs that entry only.
  std::vector<Sha256Digest> bad;
  for (const Sha256Digest& key : indexed) {
    rocksdb::PinnableSlice value;
    const rocksdb::Status status =
        db_->Get(read_options_, artifacts_, KeySlice(key), &value);
    format::DecodedValue decoded;
    if (status.ok() && format::DecodeValue(key, ToAbsl(value), &decoded).ok())
      continue;
    if (!status.ok() && !status.IsNotFound() && !status.IsCorruption()) {
      return FromRocksDb(status, "cannot verify the repaired store",
                         options_.data_dir);
    }
    bad.push_back(key);
  }
  // Artifacts without an index record take disk the budget does not see.
  // An iterator stops at the first unreadable block: what it could not
  // reach stays (harmless but for the disk), logged.
  std::vector<std::string> orphans;
  {
    absl::flat_hash_set<Sha256Digest> known(indexed.begin(), indexed.end());
    std::unique_ptr<rocksdb::Iterator> it(
        db_->NewIterator(read_options_, artifacts_));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      const rocksdb::Slice key = it->key();
      Sha256Digest digest{};
      if (key.size() == digest.size()) {
        std::copy(key.data(), key.data() + key.size(), digest.begin());
        if (known.contains(digest)) continue;
      }
      orphans.push_back(key.ToString());
    }
    if (!it->status().ok()) {
      spdlog::warn(
          "artifact store {}: after the repair, the scan for artifacts "
          "without an index record stopped early: {}",
          options_.data_dir, it->status().ToString());
    }
  }
  if (bad.empty() && orphans.empty()) return 0;
  rocksdb::WriteBatch batch;
  for (const Sha256Digest& key : bad) {
    batch.Delete(artifacts_, KeySlice(key));
    batch.Delete(access_, KeySlice(key));
  }
  for (const std::string& key : orphans) batch.Delete(artifacts_, key);
  absl::MutexLock write_lock(&write_mu_);
  if (absl::Status s = WriteLocked(&batch,
                                   "cannot drop entries the repair "
                                   "left inconsistent");
      !s.ok()) {
    return s;
  }
  absl::MutexLock lock(&mu_);
  for (const Sha256Digest& key : bad) EraseFromIndexLocked(key);
  counters_.corrupt_dropped += bad.size() + orphans.size();
  counters_dirty_ = true;
  return bad.size() + orphans.size();
}

absl::Status ArtifactStore::Impl::CheckFormat() {
  std::string value;
  rocksdb::Status status =
      db_->Get(read_options_, meta_, format::kFormatKey, &value);
  if (status.IsNotFound()) {
    if (options_.read_only) return absl::OkStatus();
    rocksdb::WriteOptions sync_write;
    sync_write.sync = true;
    return FromRocksDb(
        db_->Put(sync_write, meta_, format::kFormatKey,
                 format::EncodeFixed32(format::kStoreFormatVersion)),
        "cannot write the store format version", options_.data_dir);
  }
  if (!status.ok()) {
    return FromRocksDb(status, "cannot read the store format version",
                       options_.data_dir);
  }
  const std::optional<uint32_t> version = format::DecodeFixed32(value);
  if (!version.has_value() || *version > format::kStoreFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "artifact store data dir ", options_.data_dir,
        " holds an unknown store format ",
        version.has_value() ? absl::StrCat(*version) : "(unreadable)",
        "; this build reads format ", format::kStoreFormatVersion));
  }
  return absl::OkStatus();
}

absl::Status ArtifactStore::Impl::LoadStats() {
  std::string value;
  rocksdb::Status status =
      db_->Get(read_options_, meta_, format::kStatsKey, &value);
  if (status.IsNotFound()) return absl::OkStatus();
  if (!status.ok()) {
    return FromRocksDb(status, "cannot read the persisted counters",
                       options_.data_dir);
  }
  std::optional<StatsRecord> stats = format::DecodeStatsRecord(value);
  absl::MutexLock lock(&mu_);
  if (stats.has_value()) {
    counters_ = *stats;
  } else {
    // Counters are diagnostics: start again rather than refuse to open.
    spdlog::warn("artifact store {}: unreadable persisted counters, reset",
                 options_.data_dir);
  }
  return absl::OkStatus();
}

absl::Status ArtifactStore::Impl::ScanIndex(
    const absl::flat_hash_map<Sha256Digest, IndexRecord>& previous,
    std::vector<std::string>* broken) {
  std::unique_ptr<rocksdb::Iterator> it(
      db_->NewIterator(read_options_, access_));
  absl::MutexLock lock(&mu_);
  index_.clear();
  lru_.clear();
  bytes_ = 0;
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    const rocksdb::Slice key = it->key();
    std::optional<IndexRecord> record =
        format::DecodeIndexRecord(ToAbsl(it->value()));
    if (key.size() != format::kKeySize || !record.has_value()) {
      broken->push_back(key.ToString());
      continue;
    }
    Sha256Digest digest;
    std::copy(key.data(), key.data() + key.size(), digest.begin());
    // Hits not yet written when the database was reopened.
    if (auto old = previous.find(digest);
        old != previous.end() && old->second.access_seq > record->access_seq) {
      record->access_seq = old->second.access_seq;
      record->access_unix_micros = old->second.access_unix_micros;
    }
    InsertIntoIndexLocked(digest, *record);
    next_seq_ = std::max(next_seq_, record->access_seq + 1);
  }
  absl::erase_if(pending_access_, [this](const Sha256Digest& key) {
    return !index_.contains(key);
  });
  if (!it->status().ok()) {
    return FromRocksDb(it->status(), "cannot read the access index",
                       options_.data_dir);
  }
  return absl::OkStatus();
}

absl::Status ArtifactStore::Impl::LoadIndex() {
  std::vector<std::string> broken;
  if (absl::Status s = ScanIndex({}, &broken); !s.ok()) return s;
  if (broken.empty() || options_.read_only) return absl::OkStatus();
  // An unreadable index record: its artifact cannot be accounted for, so
  // both go.
  rocksdb::WriteBatch batch;
  for (const std::string& key : broken) {
    batch.Delete(access_, key);
    batch.Delete(artifacts_, key);
  }
  absl::MutexLock write_lock(&write_mu_);
  if (absl::Status s = WriteLocked(&batch, "cannot drop broken index records");
      !s.ok()) {
    return s;
  }
  absl::MutexLock lock(&mu_);
  counters_.corrupt_dropped += broken.size();
  counters_dirty_ = true;
  spdlog::warn(
      "artifact store {}: dropped {} entries with unreadable index "
      "records",
      options_.data_dir, broken.size());
  return absl::OkStatus();
}

ArtifactStore::Impl::~Impl() {
  if (flusher_.joinable()) {
    {
      absl::MutexLock lock(&flusher_mu_);
      stop_flusher_ = true;
    }
    // Aborts a ReclaimSpace compaction the flusher may be running.
    {
      absl::ReaderMutexLock db_lock(&db_mu_);
      if (db_ != nullptr) db_->DisableManualCompaction();
    }
    flusher_.join();
  }
  if (db_ == nullptr) return;
  bool write_failed;
  {
    absl::MutexLock lock(&write_mu_);
    write_failed = write_failed_ || reopened_read_only_;
  }
  if (write_failed) {
    // RocksDB must not be asked to sync a WAL whose last append failed (its
    // writer asserts on that); what was acknowledged is already in the OS.
    spdlog::warn(
        "artifact store {}: closing after a write error: access "
        "times and counters since the last flush are not persisted",
        options_.data_dir);
  } else if (!options_.read_only && artifacts_ != nullptr) {
    if (absl::Status s = FlushPending(); !s.ok()) {
      spdlog::error("artifact store {}: at close: {}", options_.data_dir,
                    s.ToString());
    }
    // Unsynced WAL writes survive a process crash but not a power loss; a
    // clean shutdown makes them durable.
    if (rocksdb::Status s = db_->FlushWAL(/*sync=*/true); !s.ok()) {
      spdlog::error("artifact store {}: syncing the WAL at close: {}",
                    options_.data_dir, s.ToString());
    }
  }
  CloseDatabase();
}

void ArtifactStore::Impl::EraseFromIndexLocked(const Sha256Digest& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  lru_.erase({it->second.access_seq, key});
  bytes_ -= it->second.bytes;
  index_.erase(it);
  pending_access_.erase(key);
}

void ArtifactStore::Impl::InsertIntoIndexLocked(const Sha256Digest& key,
                                                const IndexRecord& record) {
  EraseFromIndexLocked(key);
  index_.emplace(key, record);
  lru_.insert({record.access_seq, key});
  bytes_ += record.bytes;
}

absl::Status ArtifactStore::Impl::EnsureWritableLocked() {
  if (!write_failed_) return absl::OkStatus();
  if (db_ != nullptr && !reopened_read_only_) {
    // After a failed write RocksDB may have stopped accepting writes (a
    // "background error"); Resume() clears recoverable ones, such as a disk
    // that had filled and has space again.
    rocksdb::Status status = db_->Resume();
    if (status.IsBusy()) {
      // RocksDB is already recovering by itself (it does for ENOSPC).
      return absl::UnavailableError(
          absl::StrCat("artifact store on ", options_.data_dir,
                       " is recovering from a write error; retry later"));
    }
    if (status.ok()) {
      write_failed_ = false;
      return absl::OkStatus();
    }
    spdlog::warn(
        "artifact store {}: cannot resume after a write error ({}); "
        "reopening the database",
        options_.data_dir, status.ToString());
  }
  // Reopen at most once a second, so that a failing disk is not hammered.
  const absl::Time now = absl::Now();
  if (now - last_reopen_ < absl::Seconds(1)) {
    return absl::UnavailableError(
        absl::StrCat("artifact store on ", options_.data_dir,
                     " stopped after a write error; the last reopen failed: ",
                     last_reopen_error_.message()));
  }
  last_reopen_ = now;
  last_reopen_error_ = ReopenLocked();
  if (!last_reopen_error_.ok()) {
    return absl::UnavailableError(
        absl::StrCat("artifact store on ", options_.data_dir,
                     " stopped after a write error and could not reopen: ",
                     last_reopen_error_.message()));
  }
  write_failed_ = false;
  return absl::OkStatus();
}

absl::Status ArtifactStore::Impl::ReopenLocked() {
  absl::WriterMutexLock db_lock(&db_mu_);
  absl::flat_hash_map<Sha256Digest, IndexRecord> previous;
  {
    absl::MutexLock lock(&mu_);
    previous = index_;
  }
  // The stopped instance is closed without a final flush: its WAL writer
  // failed, and RocksDB asserts on syncing it.
  CloseDatabase();
  absl::Status status = OpenDatabase(/*read_only=*/false);
  reopened_read_only_ = false;
  if (!status.ok()) {
    // Keep serving reads: a read-only open writes nothing.
    if (!OpenDatabase(/*read_only=*/true).ok()) return status;
    reopened_read_only_ = true;
  }
  // Rebuild the index from what the database holds: a write that reported
  // an error may still have reached the WAL.
  std::vector<std::string> broken;
  if (absl::Status s = ScanIndex(previous, &broken); !s.ok()) return s;
  if (!broken.empty()) {
    spdlog::warn(
        "artifact store {}: {} unreadable index records (dropped at "
        "the next open)",
        options_.data_dir, broken.size());
  }
  spdlog::warn(
      "artifact store {}: reopened the database{} after a write "
      "error",
      options_.data_dir, reopened_read_only_ ? " read-only" : "");
  return reopened_read_only_ ? status : absl::OkStatus();
}

absl::Status ArtifactStore::Impl::WriteLocked(rocksdb::WriteBatch* batch,
                                              absl::string_view what) {
  if (absl::Status s = EnsureWritableLocked(); !s.ok()) return s;
  rocksdb::Status status = db_->Write(write_options_, batch);
  if (status.ok()) return absl::OkStatus();
  write_failed_ = true;
  {
    absl::MutexLock lock(&mu_);
    ++counters_.io_errors;
    counters_dirty_ = true;
  }
  absl::Status error = FromRocksDb(status, what, options_.data_dir);
  spdlog::error("artifact store: {}", error.ToString());
  return error;
}

absl::Status ArtifactStore::Impl::EvictToCapacityLocked() {
  rocksdb::WriteBatch batch;
  std::vector<Sha256Digest> victims;
  uint64_t freed = 0;
  {
    absl::MutexLock lock(&mu_);
    uint64_t bytes = bytes_;
    for (auto it = lru_.begin();
         bytes > options_.capacity_bytes && it != lru_.end(); ++it) {
      const uint64_t entry_bytes = index_.at(it->second).bytes;
      bytes -= entry_bytes;
      freed += entry_bytes;
      victims.push_back(it->second);
      batch.Delete(artifacts_, KeySlice(it->second));
      batch.Delete(access_, KeySlice(it->second));
    }
  }
  if (victims.empty()) return absl::OkStatus();
  if (absl::Status s = WriteLocked(&batch, "cannot evict to the capacity");
      !s.ok()) {
    return s;
  }
  absl::MutexLock lock(&mu_);
  for (const Sha256Digest& key : victims) EraseFromIndexLocked(key);
  counters_.evictions += victims.size();
  counters_dirty_ = true;
  spdlog::info(
      "artifact store {}: evicted {} entries ({} bytes) to fit the "
      "capacity of {} bytes",
      options_.data_dir, victims.size(), freed, options_.capacity_bytes);
  return absl::OkStatus();
}

absl::Status ArtifactStore::Impl::Put(const Sha256Digest& key,
                                      absl::string_view payload,
                                      const PutMetadata& metadata) {
  if (options_.read_only) return ReadOnlyError("cannot put");
  const uint64_t entry_bytes = format::EntryBytes(payload.size());
  if (entry_bytes > options_.capacity_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "artifact ", DigestToHex(key), " of ", entry_bytes,
        " bytes does not fit the cache capacity of ", options_.capacity_bytes,
        " bytes (data dir ", options_.data_dir, ")"));
  }
  const absl::Time now = absl::Now();
  // Hashing and copying happen before taking the write lock.
  const std::string value =
      format::EncodeValue(key, payload, metadata.compile_seconds, now);

  absl::MutexLock write_lock(&write_mu_);
  IndexRecord record;
  record.bytes = entry_bytes;
  record.compile_seconds = metadata.compile_seconds;
  record.label = metadata.label;
  record.access_unix_micros = absl::ToUnixMicros(now);
  record.created_unix_micros = record.access_unix_micros;
  rocksdb::WriteBatch batch;
  std::vector<Sha256Digest> victims;
  {
    absl::MutexLock lock(&mu_);
    uint64_t bytes = bytes_ + entry_bytes;
    if (auto it = index_.find(key); it != index_.end()) {
      bytes -= it->second.bytes;
    }
    for (auto it = lru_.begin();
         bytes > options_.capacity_bytes && it != lru_.end(); ++it) {
      if (it->second == key) continue;
      bytes -= index_.at(it->second).bytes;
      victims.push_back(it->second);
      batch.Delete(artifacts_, KeySlice(it->second));
      batch.Delete(access_, KeySlice(it->second));
    }
    record.access_seq = next_seq_++;
  }
  batch.Put(artifacts_, KeySlice(key), value);
  batch.Put(access_, KeySlice(key), format::EncodeIndexRecord(record));
  if (absl::Status s = WriteLocked(
          &batch, absl::StrCat("cannot put artifact ", DigestToHex(key)));
      !s.ok()) {
    return s;
  }
  absl::MutexLock lock(&mu_);
  for (const Sha256Digest& victim : victims) EraseFromIndexLocked(victim);
  InsertIntoIndexLocked(key, record);
  ++counters_.puts;
  put_bytes_since_reclaim_ += entry_bytes;
  counters_.evictions += victims.size();
  counters_dirty_ = true;
  if (!victims.empty()) {
    spdlog::debug("artifact store {}: put {} evicted {} entries",
                  options_.data_dir, DigestToHex(key), victims.size());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<CachedArtifact>> ArtifactStore::Impl::Get(
    const Sha256Digest& key) {
  // Reads under db_mu_ (a reopen must not close the database under a pinned
  // value); the slow paths below take write_mu_, so it is released first.
  rocksdb::Status status;
  std::string bad_value_reason;
  CachedArtifact artifact;
  {
    absl::ReaderMutexLock db_lock(&db_mu_);
    if (db_ == nullptr) {
      return absl::UnavailableError(absl::StrCat(
          "artifact store on ", options_.data_dir,
          " is closed after a write error; the next write reopens it"));
    }
    rocksdb::PinnableSlice value;
    status = db_->Get(read_options_, artifacts_, KeySlice(key), &value);
    if (status.ok()) {
      format::DecodedValue decoded;
      if (absl::Status s = format::DecodeValue(key, ToAbsl(value), &decoded);
          !s.ok()) {
        bad_value_reason = std::string(s.message());
      } else {
        artifact.payload.assign(decoded.payload.data(), decoded.payload.size());
        artifact.compile_seconds = decoded.compile_seconds;
        artifact.created = decoded.created;
      }
    }
  }
  if (status.IsNotFound()) {
    bool indexed;
    {
      absl::MutexLock lock(&mu_);
      ++counters_.misses;
      counters_dirty_ = true;
      indexed = index_.contains(key);
    }
    // Indexed but absent: either a Put landed between the read and now, or
    // the artifact vanished underneath the store. DropCorrupt tells them
    // apart under the write lock.
    if (indexed) DropCorrupt(key, "artifact missing for its index record");
    return std::nullopt;
  }
  if (status.IsCorruption()) {
    {
      absl::MutexLock lock(&mu_);
      ++counters_.misses;
      counters_dirty_ = true;
    }
    DropCorrupt(key, status.ToString());
    return std::nullopt;
  }
  if (!status.ok()) {
    {
      absl::MutexLock lock(&mu_);
      ++counters_.io_errors;
      counters_dirty_ = true;
    }
    return FromRocksDb(status,
                       absl::StrCat("cannot read artifact ", DigestToHex(key)),
                       options_.data_dir);
  }
  if (!bad_value_reason.empty()) {
    {
      absl::MutexLock lock(&mu_);
      ++counters_.misses;
      counters_dirty_ = true;
    }
    DropCorrupt(key, bad_value_reason);
    return std::nullopt;
  }
  bool flush_now = false;
  {
    absl::MutexLock lock(&mu_);
    ++counters_.hits;
    counters_.compile_seconds_saved += artifact.compile_seconds;
    counters_dirty_ = true;
    // A key missing from the index was deleted or evicted after the read:
    // the bytes were valid, but there is no recency left to update.
    if (auto it = index_.find(key); it != index_.end()) {
      flush_now = TouchLocked(it);
    }
  }
  if (flush_now && !options_.read_only) RequestFlush();
  return artifact;
}

void ArtifactStore::Impl::DropCorrupt(const Sha256Digest& key,
                                      absl::string_view reason) {
  const std::string hex = DigestToHex(key);
  if (options_.read_only) {
    absl::MutexLock lock(&mu_);
    ++counters_.corrupt_dropped;
    spdlog::warn(
        "artifact store {}: entry {} is corrupt ({}); not removed: "
        "the store is read-only",
        options_.data_dir, hex, std::string(reason));
    return;
  }
  absl::MutexLock write_lock(&write_mu_);
  if (db_ == nullptr || reopened_read_only_) return;  // dropped once writable
  // Look again under the write lock: a concurrent Put may have replaced the
  // entry with a good one, which must not be dropped.
  rocksdb::PinnableSlice value;
  rocksdb::Status status =
      db_->Get(read_options_, artifacts_, KeySlice(key), &value);
  bool indexed;
  {
    absl::MutexLock lock(&mu_);
    indexed = index_.contains(key);
  }
  if (status.IsNotFound() && !indexed) return;  // deleted meanwhile
  if (status.ok()) {
    format::DecodedValue decoded;
    if (format::DecodeValue(key, ToAbsl(value), &decoded).ok()) return;
  } else if (!status.IsCorruption() && !status.IsNotFound()) {
    spdlog::error("artifact store {}: cannot re-read suspect entry {}: {}",
                  options_.data_dir, hex, status.ToString());
    return;
  }
  rocksdb::WriteBatch batch;
  batch.Delete(artifacts_, KeySlice(key));
  batch.Delete(access_, KeySlice(key));
  if (absl::Status s = WriteLocked(
          &batch, absl::StrCat("cannot remove corrupt entry ", hex));
      !s.ok()) {
    return;  // logged by WriteLocked; the entry stays unreadable, never served
  }
  absl::MutexLock lock(&mu_);
  EraseFromIndexLocked(key);
  ++counters_.corrupt_dropped;
  counters_dirty_ = true;
  spdlog::warn("artifact store {}: dropped corrupt entry {}: {}",
               options_.data_dir, hex, std::string(reason));
}

bool ArtifactStore::Impl::TouchLocked(
    absl::flat_hash_map<Sha256Digest, IndexRecord>::iterator it) {
  const Sha256Digest& key = it->first;
  lru_.erase({it->second.access_seq, key});
  it->second.access_seq = next_seq_++;
  it->second.access_unix_micros = absl::ToUnixMicros(absl::Now());
  lru_.insert({it->second.access_seq, key});
  pending_access_.insert(key);
  return ++pending_hits_ == options_.access_flush_batch;
}

bool ArtifactStore::Impl::RecordHit(const Sha256Digest& key,
                                    absl::Time created) {
  bool flush_now = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = index_.find(key);
    if (it == index_.end() ||
        it->second.created_unix_micros != absl::ToUnixMicros(created)) {
      return false;
    }
    ++counters_.hits;
    counters_.compile_seconds_saved += it->second.compile_seconds;
    counters_dirty_ = true;
    flush_now = TouchLocked(it);
  }
  if (flush_now && !options_.read_only) RequestFlush();
  return true;
}

bool ArtifactStore::Impl::Contains(const Sha256Digest& key) const {
  absl::MutexLock lock(&mu_);
  return index_.contains(key);
}

absl::Status ArtifactStore::Impl::Delete(const Sha256Digest& key) {
  if (options_.read_only) return ReadOnlyError("cannot delete");
  absl::MutexLock write_lock(&write_mu_);
  // Deleting unconditionally (not only indexed keys) also clears an artifact
  // that lost its index record.
  rocksdb::WriteBatch batch;
  batch.Delete(artifacts_, KeySlice(key));
  batch.Delete(access_, KeySlice(key));
  if (absl::Status s = WriteLocked(
          &batch, absl::StrCat("cannot delete artifact ", DigestToHex(key)));
      !s.ok()) {
    return s;
  }
  absl::MutexLock lock(&mu_);
  if (index_.contains(key)) {
    EraseFromIndexLocked(key);
    ++counters_.deletes;
    counters_dirty_ = true;
  }
  return absl::OkStatus();
}

absl::Status ArtifactStore::Impl::EvictAll() {
  if (options_.read_only) return ReadOnlyError("cannot evict");
  absl::MutexLock write_lock(&write_mu_);
  std::vector<Sha256Digest> keys;
  {
    absl::MutexLock lock(&mu_);
    keys.reserve(index_.size());
    for (const auto& [seq, key] : lru_) keys.push_back(key);
  }
  // Batches of bounded size keep each write (and its WAL record) small.
  constexpr size_t kBatchKeys = 1024;
  for (size_t begin = 0; begin < keys.size(); begin += kBatchKeys) {
    const size_t end = std::min(keys.size(), begin + kBatchKeys);
    rocksdb::WriteBatch batch;
    for (size_t i = begin; i < end; ++i) {
      batch.Delete(artifacts_, KeySlice(keys[i]));
      batch.Delete(access_, KeySlice(keys[i]));
    }
    if (absl::Status s = WriteLocked(&batch, "cannot evict all entries");
        !s.ok()) {
      return s;
    }
    absl::MutexLock lock(&mu_);
    for (size_t i = begin; i < end; ++i) EraseFromIndexLocked(keys[i]);
    counters_.evictions += end - begin;
    counters_dirty_ = true;
  }
  spdlog::info("artifact store {}: evicted all {} entries", options_.data_dir,
               keys.size());
  return absl::OkStatus();
}

std::vector<EntryInfo> ArtifactStore::Impl::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<EntryInfo> entries;
  entries.reserve(lru_.size());
  for (const auto& [seq, key] : lru_) {
    const IndexRecord& record = index_.at(key);
    EntryInfo info;
    info.key = key;
    info.bytes = record.bytes;
    info.access_seq = record.access_seq;
    info.last_access = absl::FromUnixMicros(record.access_unix_micros);
    info.compile_seconds = record.compile_seconds;
    info.label = record.label;
    entries.push_back(info);
  }
  return entries;
}

uint64_t ArtifactStore::Impl::DiskBytes() const {
  uint64_t bytes = 0;
  // RocksDB creates and deletes files concurrently: skip what vanishes.
  std::error_code error;
  for (std::filesystem::directory_iterator it(options_.data_dir, error), end;
       !error && it != end; it.increment(error)) {
    std::error_code size_error;
    const uintmax_t size = it->file_size(size_error);
    if (!size_error) bytes += size;
  }
  return bytes;
}

CacheStats ArtifactStore::Impl::Stats() const {
  CacheStats stats;
  stats.disk_bytes = DiskBytes();
  absl::MutexLock lock(&mu_);
  stats.entries = index_.size();
  stats.bytes = bytes_;
  stats.capacity_bytes = options_.capacity_bytes;
  stats.hits = counters_.hits;
  stats.misses = counters_.misses;
  stats.puts = counters_.puts;
  stats.deletes = counters_.deletes;
  stats.evictions = counters_.evictions;
  stats.corrupt_dropped = counters_.corrupt_dropped;
  stats.io_errors = counters_.io_errors;
  stats.compile_seconds_saved = counters_.compile_seconds_saved;
  stats.recoveries = recoveries_;
  stats.recovery_dropped = recovery_dropped_;
  stats.last_recovery = last_recovery_;
  return stats;
}

absl::Status ArtifactStore::Impl::Flush() {
  if (options_.read_only) return absl::OkStatus();
  return FlushPending();
}

absl::Status ArtifactStore::Impl::FlushPending() {
  absl::MutexLock write_lock(&write_mu_);
  rocksdb::WriteBatch batch;
  std::vector<Sha256Digest> written;
  bool wrote_counters = false;
  {
    absl::MutexLock lock(&mu_);
    written.reserve(pending_access_.size());
    for (const Sha256Digest& key : pending_access_) {
      // Pending keys are erased with their index entry, so all are indexed.
      batch.Put(access_, KeySlice(key),
                format::EncodeIndexRecord(index_.at(key)));
      written.push_back(key);
    }
    pending_access_.clear();
    pending_hits_ = 0;
    if (counters_dirty_) {
      batch.Put(meta_, format::kStatsKey, format::EncodeStatsRecord(counters_));
      counters_dirty_ = false;
      wrote_counters = true;
    }
  }
  if (batch.Count() == 0) return absl::OkStatus();
  absl::Status status =
      WriteLocked(&batch, "cannot persist access times and counters");
  if (!status.ok()) {
    // Keep them pending for the next attempt.
    absl::MutexLock lock(&mu_);
    for (const Sha256Digest& key : written) {
      if (index_.contains(key)) pending_access_.insert(key);
    }
    counters_dirty_ = counters_dirty_ || wrote_counters;
  }
  return status;
}

absl::Status ArtifactStore::Impl::ReclaimSpace() {
  if (options_.read_only) return ReadOnlyError("cannot reclaim space");
  {
    absl::MutexLock write_lock(&write_mu_);
    if (absl::Status s = EnsureWritableLocked(); !s.ok()) return s;
  }
  const uint64_t before = DiskBytes();
  absl::ReaderMutexLock db_lock(&db_mu_);
  if (db_ == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "artifact store on ", options_.data_dir, " is closed after an error"));
  }
  rocksdb::Status status =
      db_->Flush(rocksdb::FlushOptions(), {artifacts_, access_, meta_});
  if (status.ok()) {
    rocksdb::CompactRangeOptions compact;
    compact.exclusive_manual_compaction = false;  // writes go on meanwhile
    compact.bottommost_level_compaction =
        rocksdb::BottommostLevelCompaction::kForceOptimized;
    // Relocate every live blob, so that no blob file is kept alive by a few
    // live entries among evicted ones.
    compact.blob_garbage_collection_policy =
        rocksdb::BlobGarbageCollectionPolicy::kForce;
    compact.blob_garbage_collection_age_cutoff = 1.0;
    status = db_->CompactRange(compact, artifacts_, nullptr, nullptr);
  }
  if (status.ok()) {
    status = db_->CompactRange(rocksdb::CompactRangeOptions(), access_, nullptr,
                               nullptr);
  }
  if (!status.ok()) {
    return FromRocksDb(status, "cannot reclaim disk space", options_.data_dir);
  }
  spdlog::info("artifact store {}: reclaimed disk space: {} -> {} bytes",
               options_.data_dir, before, DiskBytes());
  return absl::OkStatus();
}

void ArtifactStore::Impl::MaybeReclaimSpace() {
  uint64_t live;
  uint64_t put_bytes;
  {
    absl::MutexLock lock(&mu_);
    live = bytes_;
    put_bytes = put_bytes_since_reclaim_;
  }
  // A reclaim rewrites the live data; waiting for half of that to be put
  // since the last one bounds the extra writes to 2x the bytes put.
  if (put_bytes < std::max(live / 2, 4 * write_buffer_bytes_)) return;
  // Live data with room for compaction's temporary copies, plus the WAL that
  // max_total_wal_size allows and a margin for manifests and logs.
  const uint64_t allowance =
      live + live / 2 + 4 * write_buffer_bytes_ + (uint64_t{16} << 20);
  if (DiskBytes() <= allowance) return;
  {
    absl::MutexLock lock(&mu_);
    put_bytes_since_reclaim_ = 0;
  }
  if (absl::Status s = ReclaimSpace(); !s.ok()) {
    spdlog::warn("artifact store {}: {}", options_.data_dir, s.ToString());
  }
}

void ArtifactStore::Impl::RequestFlush() {
  absl::MutexLock lock(&flusher_mu_);
  flush_requested_ = true;
}

void ArtifactStore::Impl::FlusherLoop() {
  absl::MutexLock lock(&flusher_mu_);
  // Runs until the destructor sets stop_flusher_; each round waits at most
  // flush_interval.
  while (!stop_flusher_) {
    flusher_mu_.AwaitWithTimeout(
        absl::Condition(this, &Impl::FlusherShouldWake),
        options_.flush_interval);
    if (stop_flusher_) break;
    flush_requested_ = false;
    flusher_mu_.Unlock();
    absl::Status status = FlushPending();
    if (!status.ok()) {
      spdlog::warn("artifact store {}: background flush: {}", options_.data_dir,
                   status.ToString());
    }
    MaybeReclaimSpace();
    flusher_mu_.Lock();
  }
}

// ArtifactStore: forwards to Impl, which keeps RocksDB out of the header.

absl::StatusOr<std::unique_ptr<ArtifactStore>> ArtifactStore::Open(
    const ArtifactStoreOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  if (absl::Status s = impl->Open(); !s.ok()) return s;
  return std::make_unique<ArtifactStore>(OpenKey(), std::move(impl));
}

ArtifactStore::ArtifactStore(OpenKey, std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

ArtifactStore::~ArtifactStore() = default;

absl::Status ArtifactStore::Put(const Sha256Digest& key,
                                absl::string_view payload,
                                const PutMetadata& metadata) {
  return impl_->Put(key, payload, metadata);
}

absl::StatusOr<std::optional<CachedArtifact>> ArtifactStore::Get(
    const Sha256Digest& key) {
  return impl_->Get(key);
}

bool ArtifactStore::Contains(const Sha256Digest& key) const {
  return impl_->Contains(key);
}

bool ArtifactStore::RecordHit(const Sha256Digest& key, absl::Time created) {
  return impl_->RecordHit(key, created);
}

absl::Status ArtifactStore::Delete(const Sha256Digest& key) {
  return impl_->Delete(key);
}

absl::Status ArtifactStore::EvictAll() { return impl_->EvictAll(); }

std::vector<EntryInfo> ArtifactStore::List() const { return impl_->List(); }

CacheStats ArtifactStore::Stats() const { return impl_->Stats(); }

absl::Status ArtifactStore::Flush() { return impl_->Flush(); }

absl::Status ArtifactStore::ReclaimSpace() { return impl_->ReclaimSpace(); }

const ArtifactStoreOptions& ArtifactStore::options() const {
  return impl_->options();
}

}  // namespace kiln
