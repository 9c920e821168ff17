// CachingDeviceAllocator: size classes, stream-aware reuse, cross-stream
// frees, EmptyCache, out-of-memory retry, threads; over a fake device
// (every machine) and over a real one (skipped without a device).
#include "runtime/device_allocator.h"

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/cuda_test_util.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

// A device of `capacity` bytes whose events complete when the test says so
// (or on Synchronize).
struct FakeDevice {
  size_t capacity = SIZE_MAX;
  size_t used = 0;
  cuda::DevicePtr next = 0x100000;
  std::map<cuda::DevicePtr, size_t> live;
  std::map<uintptr_t, bool> events;  // id -> done
  uintptr_t next_event = 1;
  int synchronizes = 0;
  int allocs = 0;
  int frees = 0;

  void CompleteEvents() {
    for (auto& [id, done] : events) done = true;
  }
};

class FakeResource final : public DeviceMemoryResource {
 public:
  explicit FakeResource(std::shared_ptr<FakeDevice> device)
      : device_(std::move(device)) {}
  absl::StatusOr<cuda::DevicePtr> Allocate(size_t bytes) override {
    if (device_->used + bytes > device_->capacity)
      return absl::ResourceExhaustedError("fake device full");
    const cuda::DevicePtr ptr = device_->next;
    device_->next += (bytes + 255) / 256 * 256;
    device_->live[ptr] = bytes;
    device_->used += bytes;
    ++device_->allocs;
    return ptr;
  }
  absl::Status Free(cuda::DevicePtr ptr) override {
    auto it = device_->live.find(ptr);
    if (it == device_->live.end()) return absl::InternalError("double free");
    device_->used -= it->second;
    device_->live.erase(it);
    ++device_->frees;
    return absl::OkStatus();
  }
  absl::Status Synchronize() override {
    ++device_->synchronizes;
    device_->CompleteEvents();
    return absl::OkStatus();
  }
  absl::StatusOr<cuda::Event> RecordEvent(cuda::Stream) override {
    const uintptr_t id = device_->next_event++;
    device_->events[id] = false;
    return reinterpret_cast<cuda::Event>(id);
  }
  absl::StatusOr<bool> EventDone(cuda::Event event) override {
    return device_->events.at(reinterpret_cast<uintptr_t>(event));
  }
  void DestroyEvent(cuda::Event event) override {
    device_->events.erase(reinterpret_cast<uintptr_t>(event));
  }

 private:
  std::shared_ptr<FakeDevice> device_;
};

cuda::Stream FakeStream(uintptr_t n) {
  return reinterpret_cast<cuda::Stream>(n);
}

class CachingAllocatorTest : public ::testing::Test {
 protected:
  std::shared_ptr<FakeDevice> device_ = std::make_shared<FakeDevice>();
  std::shared_ptr<CachingDeviceAllocator> allocator_ =
      std::make_shared<CachingDeviceAllocator>(
          std::make_unique<FakeResource>(device_));
  const cuda::Stream s1_ = FakeStream(0x1000);
  const cuda::Stream s2_ = FakeStream(0x2000);
};

TEST(SizeClassTest, SmallRoundTo512LargeToQuarterPowers) {
  EXPECT_EQ(CachingDeviceAllocator::SizeClass(1), 512u);
  EXPECT_EQ(CachingDeviceAllocator::SizeClass(512), 512u);
  EXPECT_EQ(CachingDeviceAllocator::SizeClass(513), 1024u);
  EXPECT_EQ(CachingDeviceAllocator::SizeClass(1 << 20), 1u << 20);
  EXPECT_EQ(CachingDeviceAllocator::SizeClass((1 << 20) + 1),
            (1u << 20) + (1u << 18));  // 1.25 MiB
  EXPECT_EQ(CachingDeviceAllocator::SizeClass(3 << 20), 3u << 20);
  EXPECT_EQ(CachingDeviceAllocator::SizeClass((3 << 20) + 1),
            (3u << 20) + (1u << 19));  // 3.5 MiB
  for (size_t bytes = 1; bytes < (size_t{1} << 34); bytes = bytes * 3 + 7) {
    const size_t c = CachingDeviceAllocator::SizeClass(bytes);
    EXPECT_GE(c, bytes);
    EXPECT_LE(c, std::max<size_t>(512, bytes + bytes / 4 + 512)) << bytes;
    EXPECT_EQ(c % 512, 0u);
  }
}

TEST_F(CachingAllocatorTest, ZeroBytesIsNullAndFree) {
  auto p = allocator_->Allocate(0, s1_);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, 0u);
  allocator_->Free(0, 0, s1_);
  EXPECT_EQ(device_->allocs, 0);
  EXPECT_EQ(allocator_->stats().errors, 0);
}

TEST_F(CachingAllocatorTest, ReusesOnTheSameStreamOnly) {
  auto a = allocator_->Allocate(1000, s1_);
  ASSERT_TRUE(a.ok());
  allocator_->Free(*a, 1000, s1_);
  // Same class, same stream: the same block, no device call.
  auto b = allocator_->Allocate(900, s1_);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, *a);
  EXPECT_EQ(device_->allocs, 1);
  allocator_->Free(*b, 900, s1_);
  // Another stream never gets it without synchronisation.
  auto c = allocator_->Allocate(1000, s2_);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(*c, *a);
  EXPECT_EQ(device_->allocs, 2);
  // Another size class does not either.
  auto d = allocator_->Allocate(4096, s1_);
  ASSERT_TRUE(d.ok());
  EXPECT_NE(*d, *a);
  const DeviceAllocatorStats st = allocator_->stats();
  EXPECT_EQ(st.allocations, 4);
  EXPECT_EQ(st.cache_hits, 1);
  EXPECT_EQ(st.device_allocations, 3);
  EXPECT_EQ(st.allocated_bytes, 1024 + 4096);
  EXPECT_EQ(st.cached_bytes, 1024);
  EXPECT_EQ(st.reserved_bytes, 2 * 1024 + 4096);  // a, c, d
  EXPECT_EQ(st.peak_allocated_bytes, 1024 + 4096);
  EXPECT_EQ(device_->synchronizes, 0);
  allocator_->Free(*c, 1000, s2_);
  allocator_->Free(*d, 4096, s1_);
}

TEST_F(CachingAllocatorTest, CrossStreamFreeWaitsForTheEvent) {
  auto a = allocator_->Allocate(1000, s1_);
  ASSERT_TRUE(a.ok());
  allocator_->Free(*a, 1000, /*last_use_stream=*/s2_);
  EXPECT_EQ(allocator_->stats().pending_bytes, 1024);
  EXPECT_EQ(allocator_->stats().cross_stream_frees, 1);
  // s2's work may still be running: not reused, not even on s1.
  auto b = allocator_->Allocate(1000, s1_);
  ASSERT_TRUE(b.ok());
  EXPECT_NE(*b, *a);
  allocator_->Free(*b, 1000, s1_);
  device_->CompleteEvents();
  // Now the block is back in s1's cache (its allocation stream).
  auto c = allocator_->Allocate(1000, s1_);
  auto d = allocator_->Allocate(1000, s1_);
  ASSERT_TRUE(c.ok() && d.ok());
  EXPECT_EQ(std::set<cuda::DevicePtr>({*c, *d}),
            std::set<cuda::DevicePtr>({*a, *b}));
  EXPECT_EQ(allocator_->stats().pending_bytes, 0);
  EXPECT_TRUE(device_->events.empty());  // destroyed once done
  EXPECT_EQ(device_->synchronizes, 0);
  allocator_->Free(*c, 1000, s1_);
  allocator_->Free(*d, 1000, s1_);
}

TEST_F(CachingAllocatorTest, DeviceAllocationGivesBackOnItsStream) {
  cuda::DevicePtr first = 0;
  {
    auto a = DeviceAllocation::Allocate(allocator_, 100, s1_);
    ASSERT_TRUE(a.ok());
    first = a->get();
    EXPECT_EQ(a->size(), 100u);
    EXPECT_EQ(allocator_->stats().allocated_bytes, 512);
  }
  EXPECT_EQ(allocator_->stats().allocated_bytes, 0);
  EXPECT_EQ(allocator_->stats().cached_bytes, 512);
  {
    auto a = DeviceAllocation::Allocate(allocator_, 100, s1_);
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(a->get(), first);
    a->set_last_use_stream(s2_);
    DeviceAllocation moved = *std::move(a);
    EXPECT_EQ(a->get(), 0u);  // NOLINT: moved-from is empty by contract
    EXPECT_EQ(moved.get(), first);
  }
  EXPECT_EQ(allocator_->stats().pending_bytes, 512);
}

TEST_F(CachingAllocatorTest, EmptyCacheSynchronisesAndReleases) {
  auto a = allocator_->Allocate(1000, s1_);
  auto b = allocator_->Allocate(5000, s2_);
  auto c = allocator_->Allocate(70000, s1_);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  allocator_->Free(*a, 1000, s1_);
  allocator_->Free(*b, 5000, s1_);  // pending on an event
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  EXPECT_EQ(device_->synchronizes, 1);
  EXPECT_EQ(device_->frees, 2);
  EXPECT_EQ(device_->live.size(), 1u);  // c, still in use
  const DeviceAllocatorStats st = allocator_->stats();
  EXPECT_EQ(st.cached_bytes, 0);
  EXPECT_EQ(st.pending_bytes, 0);
  EXPECT_EQ(st.reserved_bytes, st.allocated_bytes);
  // Nothing cached: no synchronisation at all.
  ASSERT_TRUE(allocator_->EmptyCache().ok());
  EXPECT_EQ(device_->synchronizes, 1);
  allocator_->Free(*c, 70000, s1_);
}

TEST_F(CachingAllocatorTest, OutOfMemoryReleasesTheCacheAndRetries) {
  device_->capacity = 4096;
  auto a = allocator_->Allocate(3000, s2_);
  ASSERT_TRUE(a.ok());
  allocator_->Free(*a, 3000, s2_);
  // 3072 cached for s2; 2048 more does not fit unless the cache goes.
  auto b = allocator_->Allocate(2000, s1_);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(allocator_->stats().out_of_memory_retries, 1);
  EXPECT_EQ(device_->synchronizes, 1);
  auto c = allocator_->Allocate(3000, s1_);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("out of device memory allocating 3000 bytes"));
  allocator_->Free(*b, 2000, s1_);
}

TEST_F(CachingAllocatorTest, UnknownPointerIsCountedNotFreed) {
  allocator_->Free(0xdead00, 64, s1_);
  EXPECT_EQ(allocator_->stats().errors, 1);
  EXPECT_EQ(device_->frees, 0);
}

TEST_F(CachingAllocatorTest, DestructionReleasesEverything) {
  auto a = allocator_->Allocate(1000, s1_);
  auto b = allocator_->Allocate(1000, s1_);
  ASSERT_TRUE(a.ok() && b.ok());
  allocator_->Free(*a, 1000, s1_);
  allocator_->Free(*b, 1000, s2_);
  allocator_.reset();
  EXPECT_TRUE(device_->live.empty());
  EXPECT_TRUE(device_->events.empty());
}

TEST_F(CachingAllocatorTest, ManyThreadsKeepTheBooksStraight) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const cuda::Stream stream = FakeStream(0x1000 * (t + 1));
      std::vector<cuda::DevicePtr> held;
      for (int i = 0; i < kRounds; ++i) {
        const size_t bytes = 256 + (i % 7) * 1000;
        auto p = allocator_->Allocate(bytes, stream);
        ASSERT_TRUE(p.ok());
        held.push_back(*p);
        if (held.size() > 3) {
          // Every other free names another stream.
          allocator_->Free(held.front(), 0, i % 2 ? stream : FakeStream(0x99));
          held.erase(held.begin());
        }
      }
      for (cuda::DevicePtr p : held) allocator_->Free(p, 0, stream);
    });
  }
  for (std::thread& t : threads) t.join();
  const DeviceAllocatorStats st = allocator_->stats();
  EXPECT_EQ(st.allocated_bytes, 0);
  EXPECT_EQ(st.allocations, kThreads * kRounds);
  EXPECT_EQ(st.errors, 0);
  EXPECT_EQ(st.reserved_bytes, st.cached_bytes + st.pending_bytes);
  EXPECT_GT(st.cache_hits, 0);
}

// --- On a real device ---

TEST(CachingAllocatorGpuTest, StreamOrderedReuseOnADevice) {
  KILN_REQUIRE_CUDA_DEVICE(driver);
  auto allocator = CachingDeviceAllocator::Create(0);
  ASSERT_TRUE(allocator.ok()) << allocator.status();
  auto context = cuda::PrimaryContext::Retain(*driver, 0);
  ASSERT_TRUE(context.ok());
  auto scope = cuda::ScopedContext::Enter(*driver, context->get());
  ASSERT_TRUE(scope.ok());
  cuda::Stream s1 = nullptr, s2 = nullptr;
  ASSERT_EQ(driver->api().cuStreamCreate(&s1, cuda::kStreamNonBlocking),
            cuda::kSuccess);
  ASSERT_EQ(driver->api().cuStreamCreate(&s2, cuda::kStreamNonBlocking),
            cuda::kSuccess);

  auto a = (*allocator)->Allocate(1 << 20, s1);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a % 256, 0u);
  ASSERT_EQ(driver->api().cuMemsetD8Async(*a, 1, 1 << 20, s1), cuda::kSuccess);
  (*allocator)->Free(*a, 1 << 20, s1);
  auto b = (*allocator)->Allocate(1 << 20, s1);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, *a);  // same stream: reused at once
  auto c = (*allocator)->Allocate(1 << 20, s2);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(*c, *a);  // other stream: a fresh block

  // A block last used on s2 comes back to s1 once s2's work is done.
  (*allocator)->Free(*b, 1 << 20, s2);
  ASSERT_EQ(driver->api().cuStreamSynchronize(s2), cuda::kSuccess);
  auto d = (*allocator)->Allocate(1 << 20, s1);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, *a);

  (*allocator)->Free(*c, 1 << 20, s2);
  (*allocator)->Free(*d, 1 << 20, s1);
  EXPECT_TRUE((*allocator)->EmptyCache().ok());
  const DeviceAllocatorStats st = (*allocator)->stats();
  EXPECT_EQ(st.reserved_bytes, 0);
  EXPECT_EQ(st.errors, 0);
  EXPECT_EQ(driver->api().cuStreamDestroy_v2(s1), cuda::kSuccess);
  EXPECT_EQ(driver->api().cuStreamDestroy_v2(s2), cuda::kSuccess);
}

TEST(CachingAllocatorGpuTest, CreateWithoutDriverIsPrecise) {
  absl::StatusOr<const cuda::Driver*> driver = cuda::Driver::Get();
  if (driver.ok()) GTEST_SKIP() << "a CUDA driver is present";
  auto allocator = CachingDeviceAllocator::Create(0);
  ASSERT_FALSE(allocator.ok());
  EXPECT_EQ(allocator.status(), driver.status());
}

}  // namespace
}  // namespace kiln
