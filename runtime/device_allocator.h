// Device memory for the CUDA runtime's outputs and intermediates.
//
// DeviceAllocator is the interface the runtime allocates through, so that a
// caller can hand it its own (e.g. one that forwards to PyTorch's
// c10::cuda::CUDACachingAllocator::raw_alloc_with_stream / raw_delete).
// CachingDeviceAllocator is Kiln's own, modelled on PyTorch's: blocks are
// rounded to size classes and kept when freed; a freed block is handed out
// again without any synchronisation only for the stream it was allocated on
// (work on one stream runs in order, so the next user cannot overtake the
// last one). A block whose last use was on another stream waits for an event
// recorded on that stream first.
//
//   auto allocator = CachingDeviceAllocator::Create(/*device_ordinal=*/0);
//   DeviceAllocation temp = ...;  // see DeviceAllocation::Allocate
//
// Thread-safety: DeviceAllocator implementations must be safe to call from
// many threads at once; CachingDeviceAllocator is (one mutex). A
// DeviceAllocation is owned by one thread at a time.
#ifndef KILN_RUNTIME_DEVICE_ALLOCATOR_H_
#define KILN_RUNTIME_DEVICE_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "runtime/cuda_driver.h"

namespace kiln {

class DeviceAllocator {
 public:
  virtual ~DeviceAllocator() = default;

  // Device memory of at least `bytes` bytes, aligned to at least 256 bytes,
  // that work enqueued on `stream` after this call may use. `bytes` == 0
  // returns 0 and allocates nothing.
  //
  // Errors: RESOURCE_EXHAUSTED when the device has no memory left (after
  // the allocator released what it could); the driver's status otherwise.
  virtual absl::StatusOr<cuda::DevicePtr> Allocate(size_t bytes,
                                                   cuda::Stream stream) = 0;

  // Gives back `ptr` (returned by Allocate(bytes, ...) of this allocator; 0
  // is ignored). Work already enqueued on `last_use_stream` may still use
  // the memory: the allocator must not let work on any other stream use it
  // before that work has finished. Never blocks on the device.
  virtual void Free(cuda::DevicePtr ptr, size_t bytes,
                    cuda::Stream last_use_stream) = 0;
};

// Memory from a DeviceAllocator, given back to it (stream-ordered, on the
// stream it was allocated for, or the one set with set_last_use_stream)
// when destroyed. Keeps the allocator alive. Movable, not copyable.
class DeviceAllocation {
 public:
  // Errors: those of DeviceAllocator::Allocate.
  static absl::StatusOr<DeviceAllocation> Allocate(
      std::shared_ptr<DeviceAllocator> allocator, size_t bytes,
      cuda::Stream stream);

  DeviceAllocation() = default;
  DeviceAllocation(DeviceAllocation&& other) noexcept;
  DeviceAllocation& operator=(DeviceAllocation&& other) noexcept;
  DeviceAllocation(const DeviceAllocation&) = delete;
  DeviceAllocation& operator=(const DeviceAllocation&) = delete;
  ~DeviceAllocation() { Reset(); }

  cuda::DevicePtr get() const { return ptr_; }
  size_t size() const { return bytes_; }
  cuda::Stream stream() const { return stream_; }

  // Names the stream whose work uses the memory last (PyTorch's
  // record_stream for one other stream): the memory is freed after the work
  // enqueued there so far. Work on any stream other than the last-use stream
  // must be finished (or ordered before it with events) by the time the
  // allocation is destroyed.
  void set_last_use_stream(cuda::Stream stream) { stream_ = stream; }

  // Gives the memory back now (stream-ordered); the allocation is empty.
  void Reset();

 private:
  DeviceAllocation(std::shared_ptr<DeviceAllocator> allocator,
                   cuda::DevicePtr ptr, size_t bytes, cuda::Stream stream)
      : allocator_(std::move(allocator)),
        ptr_(ptr),
        bytes_(bytes),
        stream_(stream) {}

  std::shared_ptr<DeviceAllocator> allocator_;
  cuda::DevicePtr ptr_ = 0;
  size_t bytes_ = 0;
  cuda::Stream stream_ = nullptr;
};

// What CachingDeviceAllocator needs from a device: raw memory, a device-wide
// synchronisation and events. The driver-backed one is made by
// CachingDeviceAllocator::Create; tests provide a fake. Called with the
// allocator's mutex held, never concurrently.
class DeviceMemoryResource {
 public:
  virtual ~DeviceMemoryResource() = default;
  // cuMemAlloc. Errors: RESOURCE_EXHAUSTED when out of memory.
  virtual absl::StatusOr<cuda::DevicePtr> Allocate(size_t bytes) = 0;
  // cuMemFree; the memory must not be in use by pending work.
  virtual absl::Status Free(cuda::DevicePtr ptr) = 0;
  // Waits until all work of the device (every stream) has finished.
  virtual absl::Status Synchronize() = 0;
  // Records a new event on `stream` (after the work enqueued so far).
  virtual absl::StatusOr<cuda::Event> RecordEvent(cuda::Stream stream) = 0;
  // Whether the work before `event` has finished (does not block).
  virtual absl::StatusOr<bool> EventDone(cuda::Event event) = 0;
  virtual void DestroyEvent(cuda::Event event) = 0;
};

// Counters of a CachingDeviceAllocator (bytes are size-class bytes).
struct DeviceAllocatorStats {
  int64_t allocated_bytes = 0;        // handed out and not yet freed
  int64_t peak_allocated_bytes = 0;   // highest allocated_bytes seen
  int64_t reserved_bytes = 0;         // obtained from the device, not released
  int64_t cached_bytes = 0;           // reserved, free, ready for reuse
  int64_t pending_bytes = 0;          // freed across streams, awaiting an event
  int64_t allocations = 0;            // Allocate calls with bytes > 0
  int64_t cache_hits = 0;             // ... served from the cache
  int64_t device_allocations = 0;     // cuMemAlloc calls that succeeded
  int64_t device_frees = 0;           // cuMemFree calls
  int64_t cross_stream_frees = 0;     // frees with another last-use stream
  int64_t out_of_memory_retries = 0;  // cache released to retry an allocation
  int64_t errors = 0;  // driver errors in Free (they cannot be returned)
};

class CachingDeviceAllocator final : public DeviceAllocator {
 public:
  // An allocator over device `device_ordinal`'s primary context (the one
  // PyTorch and the CUDA runtime use). Errors: FAILED_PRECONDITION when the
  // driver or the device is not available (see cuda::Driver::Get).
  static absl::StatusOr<std::shared_ptr<CachingDeviceAllocator>> Create(
      int device_ordinal);

  // An allocator over `resource` (tests, other memory sources).
  explicit CachingDeviceAllocator(
      std::unique_ptr<DeviceMemoryResource> resource);
  // Releases the cached and pending blocks (after synchronising the device
  // when there are any). Every allocation must have been freed
  // (DeviceAllocation keeps its allocator alive, so this holds for them).
  ~CachingDeviceAllocator() override;

  // The size class a request of `bytes` is served from: multiples of 512
  // bytes up to 1 MiB, then steps of a quarter of the power of two below
  // (at most 25% waste: 1.25, 1.5, 1.75, 2, 2.5 ... MiB).
  static size_t SizeClass(size_t bytes);

  // Reuses a cached block of the size class allocated for `stream` (no
  // synchronisation), else allocates from the device; when the device is
  // out of memory, synchronises, releases every cached block and tries once
  // more. Errors: RESOURCE_EXHAUSTED with the allocator's figures; the
  // driver's status otherwise.
  absl::StatusOr<cuda::DevicePtr> Allocate(size_t bytes,
                                           cuda::Stream stream) override;

  // Returns the block to the cache of the stream it was allocated for. When
  // `last_use_stream` is another stream, the block is kept aside until an
  // event recorded on `last_use_stream` now has completed. A pointer this
  // allocator did not hand out is ignored (and counted in stats().errors).
  void Free(cuda::DevicePtr ptr, size_t bytes,
            cuda::Stream last_use_stream) override;

  // Synchronises the device when any block is cached or pending, then gives
  // every cached and pending block back to the device. Blocks in use are
  // untouched. Errors: the driver's status.
  absl::Status EmptyCache();

  DeviceAllocatorStats stats() const;

 private:
  struct Block {
    size_t size = 0;                // the size class
    cuda::Stream stream = nullptr;  // the stream it was allocated for
  };
  struct Pending {
    cuda::DevicePtr ptr;
    Block block;
    cuda::Event event;
  };
  struct PoolKey {
    cuda::Stream stream;
    size_t size;
    template <typename H>
    friend H AbslHashValue(H h, const PoolKey& k) {
      return H::combine(std::move(h), k.stream, k.size);
    }
    friend bool operator==(const PoolKey& a, const PoolKey& b) {
      return a.stream == b.stream && a.size == b.size;
    }
  };

  // Moves pending blocks whose events completed into the cache.
  void ProcessPendingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Synchronises (when `synchronize`), then frees every cached block.
  absl::Status ReleaseCachedLocked(bool synchronize)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<DeviceMemoryResource> resource_;
  mutable absl::Mutex mu_;
  // Blocks handed out, by pointer.
  absl::flat_hash_map<cuda::DevicePtr, Block> in_use_ ABSL_GUARDED_BY(mu_);
  // Free blocks by (allocation stream, size class).
  absl::flat_hash_map<PoolKey, std::vector<cuda::DevicePtr>> cached_
      ABSL_GUARDED_BY(mu_);
  std::vector<Pending> pending_ ABSL_GUARDED_BY(mu_);
  DeviceAllocatorStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kiln

#endif  // KILN_RUNTIME_DEVICE_ALLOCATOR_H_
