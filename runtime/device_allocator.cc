#include "runtime/device_allocator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kiln {

// --- DeviceAllocation ---

absl::StatusOr<DeviceAllocation> DeviceAllocation::Allocate(
    std::shared_ptr<DeviceAllocator> allocator, size_t bytes,
    cuda::Stream stream) {
  absl::StatusOr<cuda::DevicePtr> ptr = allocator->Allocate(bytes, stream);
  if (!ptr.ok()) return ptr.status();
  return DeviceAllocation(std::move(allocator), *ptr, bytes, stream);
}

DeviceAllocation::DeviceAllocation(DeviceAllocation&& other) noexcept
    : allocator_(std::move(other.allocator_)),
      ptr_(std::exchange(other.ptr_, 0)),
      bytes_(std::exchange(other.bytes_, 0)),
      stream_(other.stream_) {}

DeviceAllocation& DeviceAllocation::operator=(
    DeviceAllocation&& other) noexcept {
  if (this != &other) {
    Reset();
    allocator_ = std::move(other.allocator_);
    ptr_ = std::exchange(other.ptr_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
    stream_ = other.stream_;
  }
  return *this;
}

void DeviceAllocation::Reset() {
  if (ptr_ != 0) allocator_->Free(ptr_, bytes_, stream_);
  ptr_ = 0;
  bytes_ = 0;
  allocator_.reset();
}

// --- The driver-backed resource ---

namespace {

class DriverMemoryResource final : public DeviceMemoryResource {
 public:
  explicit DriverMemoryResource(cuda::PrimaryContext context)
      : context_(std::move(context)), driver_(context_.driver()) {}

  absl::StatusOr<cuda::DevicePtr> Allocate(size_t bytes) override {
    auto scope = cuda::ScopedContext::Enter(driver_, context_.get());
    if (!scope.ok()) return scope.status();
    cuda::DevicePtr ptr = 0;
    if (absl::Status s = driver_.Check(driver_.api().cuMemAlloc_v2(&ptr, bytes),
                                       absl::StrCat("cuMemAlloc(", bytes, ")"));
        !s.ok()) {
      return s;
    }
    return ptr;
  }

  absl::Status Free(cuda::DevicePtr ptr) override {
    auto scope = cuda::ScopedContext::Enter(driver_, context_.get());
    if (!scope.ok()) return scope.status();
    return driver_.Check(driver_.api().cuMemFree_v2(ptr), "cuMemFree");
  }

  absl::Status Synchronize() override {
    auto scope = cuda::ScopedContext::Enter(driver_, context_.get());
    if (!scope.ok()) return scope.status();
    return driver_.Check(driver_.api().cuCtxSynchronize(), "cuCtxSynchronize");
  }

  absl::StatusOr<cuda::Event> RecordEvent(cuda::Stream stream) override {
    auto scope = cuda::ScopedContext::Enter(driver_, context_.get());
    if (!scope.ok()) return scope.status();
    cuda::Event event = nullptr;
    if (absl::Status s = driver_.Check(
            driver_.api().cuEventCreate(&event, cuda::kEventDisableTiming),
            "cuEventCreate");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = driver_.Check(
            driver_.api().cuEventRecord(event, stream), "cuEventRecord");
        !s.ok()) {
      driver_.api().cuEventDestroy_v2(event);
      return s;
    }
    return event;
  }

  absl::StatusOr<bool> EventDone(cuda::Event event) override {
    auto scope = cuda::ScopedContext::Enter(driver_, context_.get());
    if (!scope.ok()) return scope.status();
    const cuda::Result result = driver_.api().cuEventQuery(event);
    if (result == cuda::kErrorNotReady) return false;
    if (absl::Status s = driver_.Check(result, "cuEventQuery"); !s.ok())
      return s;
    return true;
  }

  void DestroyEvent(cuda::Event event) override {
    auto scope = cuda::ScopedContext::Enter(driver_, context_.get());
    if (scope.ok()) driver_.api().cuEventDestroy_v2(event);
  }

 private:
  cuda::PrimaryContext context_;
  const cuda::Driver& driver_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<CachingDeviceAllocator>>
CachingDeviceAllocator::Create(int device_ordinal) {
  absl::StatusOr<const cuda::Driver*> driver = cuda::Driver::Get();
  if (!driver.ok()) return driver.status();
  absl::StatusOr<cuda::PrimaryContext> context =
      cuda::PrimaryContext::Retain(**driver, device_ordinal);
  if (!context.ok()) return context.status();
  return std::make_shared<CachingDeviceAllocator>(
      std::make_unique<DriverMemoryResource>(*std::move(context)));
}

// --- CachingDeviceAllocator ---

CachingDeviceAllocator::CachingDeviceAllocator(
    std::unique_ptr<DeviceMemoryResource> resource)
    : resource_(std::move(resource)) {}

CachingDeviceAllocator::~CachingDeviceAllocator() {
  absl::MutexLock lock(&mu_);
  ReleaseCachedLocked(/*synchronize=*/true).IgnoreError();
}

size_t CachingDeviceAllocator::SizeClass(size_t bytes) {
  constexpr size_t kSmallStep = 512;
  constexpr size_t kSmallLimit = size_t{1} << 20;
  if (bytes <= kSmallLimit) {
    return std::max<size_t>(kSmallStep,
                            (bytes + kSmallStep - 1) / kSmallStep * kSmallStep);
  }
  // The largest power of two below `bytes`, in quarters.
  size_t power = kSmallLimit;
  while (power * 2 < bytes) power *= 2;
  const size_t step = power / 4;
  return (bytes + step - 1) / step * step;
}

void CachingDeviceAllocator::ProcessPendingLocked() {
  for (size_t i = 0; i < pending_.size();) {
    Pending& p = pending_[i];
    absl::StatusOr<bool> done = resource_->EventDone(p.event);
    if (!done.ok()) ++stats_.errors;
    // An event that cannot be queried stays pending until a
    // synchronisation (EmptyCache, out of memory) settles it.
    if (!done.ok() || !*done) {
      ++i;
      continue;
    }
    resource_->DestroyEvent(p.event);
    cached_[PoolKey{p.block.stream, p.block.size}].push_back(p.ptr);
    stats_.pending_bytes -= p.block.size;
    stats_.cached_bytes += p.block.size;
    p = pending_.back();
    pending_.pop_back();
  }
}

absl::Status CachingDeviceAllocator::ReleaseCachedLocked(bool synchronize) {
  if (synchronize && (!cached_.empty() || !pending_.empty())) {
    if (absl::Status s = resource_->Synchronize(); !s.ok()) return s;
    // Everything enqueued so far has finished: pending blocks are free.
    for (Pending& p : pending_) {
      resource_->DestroyEvent(p.event);
      cached_[PoolKey{p.block.stream, p.block.size}].push_back(p.ptr);
      stats_.pending_bytes -= p.block.size;
      stats_.cached_bytes += p.block.size;
    }
    pending_.clear();
  }
  absl::Status first_error;
  for (auto& [key, ptrs] : cached_) {
    for (cuda::DevicePtr ptr : ptrs) {
      absl::Status s = resource_->Free(ptr);
      if (!s.ok() && first_error.ok()) first_error = s;
      ++stats_.device_frees;
      stats_.reserved_bytes -= key.size;
      stats_.cached_bytes -= key.size;
    }
  }
  cached_.clear();
  return first_error;
}

absl::StatusOr<cuda::DevicePtr> CachingDeviceAllocator::Allocate(
    size_t bytes, cuda::Stream stream) {
  if (bytes == 0) return cuda::DevicePtr{0};
  const size_t size = SizeClass(bytes);
  absl::MutexLock lock(&mu_);
  ++stats_.allocations;
  if (!pending_.empty()) ProcessPendingLocked();

  cuda::DevicePtr ptr = 0;
  auto pool = cached_.find(PoolKey{stream, size});
  if (pool != cached_.end() && !pool->second.empty()) {
    ptr = pool->second.back();
    pool->second.pop_back();
    stats_.cached_bytes -= size;
    ++stats_.cache_hits;
  } else {
    absl::StatusOr<cuda::DevicePtr> fresh = resource_->Allocate(size);
    if (!fresh.ok() && absl::IsResourceExhausted(fresh.status()) &&
        (!cached_.empty() || !pending_.empty())) {
      ++stats_.out_of_memory_retries;
      if (absl::Status s = ReleaseCachedLocked(/*synchronize=*/true); !s.ok())
        return s;
      fresh = resource_->Allocate(size);
    }
    if (!fresh.ok()) {
      if (!absl::IsResourceExhausted(fresh.status())) return fresh.status();
      return absl::ResourceExhaustedError(absl::StrCat(
          "out of device memory allocating ", bytes, " bytes (size class ",
          size, "; this allocator has ", stats_.allocated_bytes,
          " bytes in use, ", stats_.reserved_bytes,
          " reserved): ", fresh.status().message()));
    }
    ptr = *fresh;
    ++stats_.device_allocations;
    stats_.reserved_bytes += size;
  }
  in_use_[ptr] = Block{size, stream};
  stats_.allocated_bytes += size;
  stats_.peak_allocated_bytes =
      std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  return ptr;
}

void CachingDeviceAllocator::Free(cuda::DevicePtr ptr, size_t bytes,
                                  cuda::Stream last_use_stream) {
  if (ptr == 0) return;
  absl::MutexLock lock(&mu_);
  auto it = in_use_.find(ptr);
  if (it == in_use_.end()) {
    ++stats_.errors;
    return;
  }
  const Block block = it->second;
  in_use_.erase(it);
  stats_.allocated_bytes -= block.size;
  if (last_use_stream == block.stream) {
    // Stream order makes the block safe for the next allocation on this
    // stream: that work runs after the work enqueued so far.
    cached_[PoolKey{block.stream, block.size}].push_back(ptr);
    stats_.cached_bytes += block.size;
    return;
  }
  ++stats_.cross_stream_frees;
  absl::StatusOr<cuda::Event> event = resource_->RecordEvent(last_use_stream);
  if (!event.ok()) {
    // Without an event only a device synchronisation proves the block free.
    ++stats_.errors;
    if (resource_->Synchronize().ok()) {
      cached_[PoolKey{block.stream, block.size}].push_back(ptr);
      stats_.cached_bytes += block.size;
    }
    return;  // else the block is lost (the device is in trouble anyway)
  }
  pending_.push_back(Pending{ptr, block, *event});
  stats_.pending_bytes += block.size;
}

absl::Status CachingDeviceAllocator::EmptyCache() {
  absl::MutexLock lock(&mu_);
  ProcessPendingLocked();
  return ReleaseCachedLocked(/*synchronize=*/true);
}

DeviceAllocatorStats CachingDeviceAllocator::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace kiln
