// ArtifactStore latency and throughput: Put and Get of 4 KB, 100 KB and 1 MB
// artifacts, Gets hot and cold. See bench/README.md ("Cache") for the command
// and the figures.
//
// Each benchmark reports, besides Google Benchmark's mean wall time per
// operation and bytes/items per second (over wall time), the median and 99th
// percentile of the individual operations (p50_us, p99_us), timed one by one.
//
//   put       distinct keys into a fresh store, default options (WAL, no
//             fsync); includes memtable flushes and compactions as they come.
//   put_sync  the same with sync_writes (an fsync of the WAL per put).
//   get_hot   random keys of a data set that fits the RocksDB block/blob cache,
//             after one warm-up read of every key: served from memory.
//   get_cold  random keys with no RocksDB block/blob cache (block_cache_bytes
//             = 0) and the OS page cache of every database file dropped
//             (posix_fadvise DONTNEED) before each get, untimed: every get
//             reads its SST block or blob from the device.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "cache/artifact_store.h"
#include "support/sha256.h"

namespace kiln {
namespace {

// A temporary data dir (under $KILN_BENCH_DIR, else /tmp), removed at the end.
class BenchDir {
 public:
  BenchDir() {
    const char* base = std::getenv("KILN_BENCH_DIR");
    std::string pattern = absl::StrCat(base != nullptr ? base : "/tmp",
                                       "/kiln_cache_bench.XXXXXX");
    if (mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~BenchDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  BenchDir(const BenchDir&) = delete;
  BenchDir& operator=(const BenchDir&) = delete;
  const std::string& path() const { return path_; }
  std::string db() const { return path_ + "/db"; }

 private:
  std::string path_;
};

Sha256Digest Key(int i) { return Sha256(absl::StrCat("bench/", i)); }

// Half random bytes, half a repeated pattern: compresses about 2x, like the
// ELF objects and cubins the cache holds.
std::string Payload(size_t size, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string payload(size, '\0');
  for (size_t i = 0; i < size; ++i) {
    payload[i] = i < size / 2 ? static_cast<char>(rng())
                              : static_cast<char>("kernel"[i % 6]);
  }
  return payload;
}

// Drops the OS page cache of every file of the database. Dirty pages cannot be
// dropped: the caller syncs once before (the files read by gets are immutable
// SST and blob files, clean after that).
void DropPageCache(const std::string& dir) {
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    const int fd = open(entry.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
}

class Latencies {
 public:
  explicit Latencies(size_t expected) { micros_.reserve(expected); }
  void Add(std::chrono::steady_clock::duration d) {
    micros_.push_back(std::chrono::duration<double, std::micro>(d).count());
  }
  void Report(benchmark::State& state, size_t bytes_per_op) {
    if (micros_.empty()) return;
    std::sort(micros_.begin(), micros_.end());
    state.counters["p50_us"] = micros_[micros_.size() / 2];
    state.counters["p99_us"] = micros_[(micros_.size() * 99) / 100];
    state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
    state.SetBytesProcessed(
        static_cast<int64_t>(state.iterations() * bytes_per_op));
  }

 private:
  std::vector<double> micros_;
};

ArtifactStoreOptions BenchOptions(const std::string& dir) {
  ArtifactStoreOptions options;
  options.data_dir = dir;
  options.capacity_bytes = uint64_t{64} << 30;  // no evictions
  return options;
}

std::unique_ptr<ArtifactStore> OpenStore(const ArtifactStoreOptions& options,
                                         benchmark::State& state) {
  absl::StatusOr<std::unique_ptr<ArtifactStore>> store =
      ArtifactStore::Open(options);
  if (!store.ok()) {
    state.SkipWithError(std::string(store.status().ToString()).c_str());
    return nullptr;
  }
  return std::move(*store);
}

void BM_Put(benchmark::State& state) {
  const size_t size = static_cast<size_t>(state.range(0));
  const bool sync = state.range(1) != 0;
  BenchDir dir;
  ArtifactStoreOptions options = BenchOptions(dir.db());
  options.sync_writes = sync;
  std::unique_ptr<ArtifactStore> store = OpenStore(options, state);
  if (store == nullptr) return;
  std::vector<std::string> payloads;
  for (int i = 0; i < 8; ++i) payloads.push_back(Payload(size, i));
  Latencies latencies(state.max_iterations);
  int i = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    const absl::Status status =
        store->Put(Key(i), payloads[i % payloads.size()], {});
    latencies.Add(std::chrono::steady_clock::now() - start);
    if (!status.ok()) {
      state.SkipWithError(std::string(status.ToString()).c_str());
      break;
    }
    ++i;
  }
  latencies.Report(state, size);
}

// Fills a store with `entries` artifacts of `size` bytes and closes it: the
// reopen flushes the recovered WAL, so the data is in SST and blob files.
bool Populate(const std::string& db, size_t size, int entries,
              benchmark::State& state) {
  std::unique_ptr<ArtifactStore> store = OpenStore(BenchOptions(db), state);
  if (store == nullptr) return false;
  std::vector<std::string> payloads;
  for (int i = 0; i < 8; ++i) payloads.push_back(Payload(size, i));
  for (int i = 0; i < entries; ++i) {
    const absl::Status status =
        store->Put(Key(i), payloads[i % payloads.size()], {});
    if (!status.ok()) {
      state.SkipWithError(std::string(status.ToString()).c_str());
      return false;
    }
  }
  return true;
}

void BM_Get(benchmark::State& state) {
  const size_t size = static_cast<size_t>(state.range(0));
  const int entries = static_cast<int>(state.range(1));
  const bool cold = state.range(2) != 0;
  BenchDir dir;
  if (!Populate(dir.db(), size, entries, state)) return;
  ArtifactStoreOptions options = BenchOptions(dir.db());
  options.block_cache_bytes = cold ? 0 : uint64_t{256} << 20;
  std::unique_ptr<ArtifactStore> store = OpenStore(options, state);
  if (store == nullptr) return;
  if (!cold) {
    for (int i = 0; i < entries; ++i) {
      if (!store->Get(Key(i)).ok()) state.SkipWithError("warm-up get failed");
    }
  }
  if (cold) sync();
  std::mt19937 rng(42);
  std::uniform_int_distribution<int> key_of(0, entries - 1);
  Latencies latencies(state.max_iterations);
  for (auto _ : state) {
    const Sha256Digest key = Key(key_of(rng));
    if (cold) {
      state.PauseTiming();
      DropPageCache(dir.db());
      state.ResumeTiming();
    }
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<std::optional<CachedArtifact>> got = store->Get(key);
    latencies.Add(std::chrono::steady_clock::now() - start);
    if (!got.ok() || !got->has_value() || (*got)->payload.size() != size) {
      state.SkipWithError("get missed or failed");
      break;
    }
    benchmark::DoNotOptimize((*got)->payload.data());
  }
  latencies.Report(state, size);
}

struct SizeCase {
  const char* name;
  int64_t bytes;
  int64_t put_iterations;
  int64_t put_sync_iterations;
  int64_t entries;  // data set of the get benchmarks: 40-64 MB
  int64_t hot_iterations;
  int64_t cold_iterations;
};

constexpr SizeCase kSizes[] = {
    {"4KB", 4 << 10, 20000, 2000, 10000, 50000, 2000},
    {"100KB", 100 << 10, 3000, 1000, 600, 10000, 1000},
    {"1MB", 1 << 20, 400, 200, 64, 2000, 300},
};

void RegisterAll() {
  for (const SizeCase& c : kSizes) {
    benchmark::RegisterBenchmark(absl::StrCat("put/", c.name).c_str(), BM_Put)
        ->Args({c.bytes, 0})
        ->Iterations(c.put_iterations)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(absl::StrCat("put_sync/", c.name).c_str(),
                                 BM_Put)
        ->Args({c.bytes, 1})
        ->Iterations(c.put_sync_iterations)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(absl::StrCat("get_hot/", c.name).c_str(),
                                 BM_Get)
        ->Args({c.bytes, c.entries, 0})
        ->Iterations(c.hot_iterations)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(absl::StrCat("get_cold/", c.name).c_str(),
                                 BM_Get)
        ->Args({c.bytes, c.entries, 1})
        ->Iterations(c.cold_iterations)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);  // no "opened" line per benchmark
  kiln::RegisterAll();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
