// The CUDA driver API, loaded at run time with dlopen so that the client
// library builds and runs on machines without a GPU or a CUDA toolkit. No
// cuda.h: the few types Kiln needs are declared here, ABI-compatible with
// cuda.h (tests/unit/cuda_driver_test.cc checks every entry point's type
// against cuda.h where the toolkit's headers are installed).
//
//   absl::StatusOr<const cuda::Driver*> driver = cuda::Driver::Get();
//   if (!driver.ok()) ...  // FAILED_PRECONDITION: no libcuda.so.1, no device
//   auto context = cuda::PrimaryContext::Retain(**driver, /*ordinal=*/0);
//
// Handle types are the driver's own opaque struct pointers (struct
// CUstream_st* and so on), so a CUstream from cuda.h or a cudaStream_t from
// the runtime API or PyTorch converts to cuda::Stream without a cast.
//
// Thread-safety: Driver::Get loads and initialises the driver once (the first
// caller does the work, the others wait) and the table is immutable
// afterwards; the driver's entry points are thread-safe. The RAII wrappers
// are movable, not copyable; one object must not be moved or destroyed while
// another thread uses it.
#ifndef KILN_RUNTIME_CUDA_DRIVER_H_
#define KILN_RUNTIME_CUDA_DRIVER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

// The driver's opaque handle types, declared as cuda.h declares them (at
// global scope) so that both headers can be included together.
struct CUctx_st;
struct CUmod_st;
struct CUfunc_st;
struct CUstream_st;
struct CUevent_st;

namespace kiln {
namespace cuda {

using Result = int;  // CUresult
using Device = int;  // CUdevice (an ordinal)
using Context = CUctx_st*;
using ModuleHandle = CUmod_st*;
using Function = CUfunc_st*;
using Stream = CUstream_st*;  // nullptr: the legacy default stream
using Event = CUevent_st*;
using DevicePtr = unsigned long long;  // CUdeviceptr (64-bit)

// The CUresult values Kiln acts on (cuda.h's numbering).
inline constexpr Result kSuccess = 0;
inline constexpr Result kErrorInvalidValue = 1;
inline constexpr Result kErrorOutOfMemory = 2;
inline constexpr Result kErrorNotInitialized = 3;
inline constexpr Result kErrorDeinitialized = 4;
inline constexpr Result kErrorNoDevice = 100;
inline constexpr Result kErrorInvalidDevice = 101;
inline constexpr Result kErrorNoBinaryForGpu = 209;
inline constexpr Result kErrorInvalidPtx = 218;
inline constexpr Result kErrorInvalidImage = 200;
inline constexpr Result kErrorNotFound = 500;
inline constexpr Result kErrorNotReady = 600;

// Attribute and flag values (cuda.h's numbering).
inline constexpr int kDeviceAttributeMaxGridDimX = 5;
inline constexpr int kDeviceAttributeComputeCapabilityMajor = 75;
inline constexpr int kDeviceAttributeComputeCapabilityMinor = 76;
inline constexpr int kFuncAttributeMaxThreadsPerBlock = 0;
inline constexpr int kFuncAttributeNumRegs = 4;
inline constexpr unsigned kStreamNonBlocking = 0x1;
inline constexpr unsigned kEventDisableTiming = 0x2;

// The driver entry points Kiln uses. Each member is named after the symbol
// it is resolved from: where cuda.h maps a name to a versioned one
// (`#define cuMemAlloc cuMemAlloc_v2`), the versioned symbol is the one with
// today's ABI (64-bit sizes and pointers), and the plain name still exported
// by libcuda is the legacy one. Enum parameters are declared as int (the
// driver's enums are 32-bit).
struct DriverApi {
  Result (*cuInit)(unsigned int flags);
  Result (*cuDriverGetVersion)(int* version);
  Result (*cuGetErrorName)(Result error, const char** name);
  Result (*cuGetErrorString)(Result error, const char** text);
  Result (*cuDeviceGet)(Device* device, int ordinal);
  Result (*cuDeviceGetCount)(int* count);
  Result (*cuDeviceGetAttribute)(int* value, int attribute, Device device);
  Result (*cuDevicePrimaryCtxRetain)(Context* context, Device device);
  Result (*cuDevicePrimaryCtxRelease_v2)(Device device);
  Result (*cuCtxGetCurrent)(Context* context);
  Result (*cuCtxSetCurrent)(Context context);
  Result (*cuCtxSynchronize)();
  Result (*cuModuleLoadData)(ModuleHandle* module, const void* image);
  Result (*cuModuleUnload)(ModuleHandle module);
  Result (*cuModuleGetFunction)(Function* function, ModuleHandle module,
                                const char* name);
  Result (*cuFuncGetAttribute)(int* value, int attribute, Function function);
  Result (*cuLaunchKernel)(Function function, unsigned int grid_x,
                           unsigned int grid_y, unsigned int grid_z,
                           unsigned int block_x, unsigned int block_y,
                           unsigned int block_z, unsigned int shared_bytes,
                           Stream stream, void** params, void** extra);
  Result (*cuMemAlloc_v2)(DevicePtr* ptr, size_t bytes);
  Result (*cuMemFree_v2)(DevicePtr ptr);
  Result (*cuMemGetInfo_v2)(size_t* free_bytes, size_t* total_bytes);
  Result (*cuMemcpyHtoD_v2)(DevicePtr dst, const void* src, size_t bytes);
  Result (*cuMemcpyDtoH_v2)(void* dst, DevicePtr src, size_t bytes);
  Result (*cuMemcpyHtoDAsync_v2)(DevicePtr dst, const void* src, size_t bytes,
                                 Stream stream);
  Result (*cuMemcpyDtoHAsync_v2)(void* dst, DevicePtr src, size_t bytes,
                                 Stream stream);
  Result (*cuMemcpyDtoDAsync_v2)(DevicePtr dst, DevicePtr src, size_t bytes,
                                 Stream stream);
  Result (*cuMemHostAlloc)(void** ptr, size_t bytes, unsigned int flags);
  Result (*cuMemFreeHost)(void* ptr);
  Result (*cuMemsetD8_v2)(DevicePtr dst, unsigned char value, size_t count);
  Result (*cuMemsetD8Async)(DevicePtr dst, unsigned char value, size_t count,
                            Stream stream);
  Result (*cuStreamCreate)(Stream* stream, unsigned int flags);
  Result (*cuStreamDestroy_v2)(Stream stream);
  Result (*cuStreamSynchronize)(Stream stream);
  Result (*cuEventCreate)(Event* event, unsigned int flags);
  Result (*cuEventDestroy_v2)(Event event);
  Result (*cuEventRecord)(Event event, Stream stream);
  Result (*cuEventQuery)(Event event);
  Result (*cuEventSynchronize)(Event event);
  // cuEventElapsedTime_v2 where the driver has it (CUDA 12.8+), else
  // cuEventElapsedTime: the same signature.
  Result (*cuEventElapsedTime_v2)(float* milliseconds, Event start, Event end);
  // *status: 0 (CU_STREAM_CAPTURE_STATUS_NONE), 1 (active), 2 (invalidated).
  Result (*cuStreamIsCapturing)(Stream stream, int* status);
};

// The loaded driver: the library handle and its resolved entry points.
class Driver {
 public:
  // The process's driver: on the first call loads libcuda.so.1 (dlopen,
  // RTLD_NOW | RTLD_LOCAL), resolves every DriverApi entry and calls
  // cuInit(0); later calls return the same result (also a failure: the
  // process does not retry). The library is never unloaded.
  //
  // Errors: FAILED_PRECONDITION "CUDA driver not available: <dlerror>" when
  // libcuda.so.1 cannot be loaded; FAILED_PRECONDITION naming the symbol when
  // the driver lacks an entry point (older than CUDA 11); the cuInit status
  // (e.g. FAILED_PRECONDITION "cuInit: CUDA_ERROR_NO_DEVICE ...") when the
  // driver finds no usable device.
  static absl::StatusOr<const Driver*> Get();

  // Loads the driver from `library` (a name dlopen searches for, or a path)
  // into a new table, with the errors of Get(). For tests and for
  // processes that must name the driver; most callers want Get().
  static absl::StatusOr<std::unique_ptr<Driver>> Open(const char* library);

  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  const DriverApi& api() const { return api_; }
  // The driver's CUDA version, e.g. 13000.
  int version() const { return version_; }

  // OK for kSuccess; otherwise a status whose message is
  // "<call>: <CUDA_ERROR_NAME> (<number>): <driver's description>".
  // Codes: RESOURCE_EXHAUSTED (out of memory), NOT_FOUND (a named symbol
  // missing), INVALID_ARGUMENT (invalid value), FAILED_PRECONDITION (no
  // device, driver not initialised or shut down, no binary for this GPU,
  // invalid PTX or image), INTERNAL otherwise.
  absl::Status Check(Result result, absl::string_view call) const;

 private:
  Driver() = default;

  DriverApi api_{};
  int version_ = 0;
};

// A retained primary context of one device: the context the CUDA runtime
// and PyTorch use for that device, so pointers and streams from them are
// valid in it. Released when destroyed.
class PrimaryContext {
 public:
  // cuDeviceGet + cuDevicePrimaryCtxRetain. Errors: the driver's status
  // (INVALID_ARGUMENT or FAILED_PRECONDITION for an ordinal that names no
  // device).
  static absl::StatusOr<PrimaryContext> Retain(const Driver& driver,
                                               int ordinal);

  PrimaryContext(PrimaryContext&& other) noexcept;
  PrimaryContext& operator=(PrimaryContext&& other) noexcept;
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;
  ~PrimaryContext();

  Context get() const { return context_; }
  Device device() const { return device_; }
  const Driver& driver() const { return *driver_; }

 private:
  PrimaryContext(const Driver* driver, Device device, Context context)
      : driver_(driver), device_(device), context_(context) {}
  void Reset();

  const Driver* driver_ = nullptr;
  Device device_ = 0;
  Context context_ = nullptr;
};

// Makes `context` current on the calling thread for the scope, and restores
// the previous one when destroyed (nothing is done where it already was
// current: two thread-local reads in the common case).
class ScopedContext {
 public:
  // Errors: the driver's status from cuCtxGetCurrent/cuCtxSetCurrent.
  static absl::StatusOr<ScopedContext> Enter(const Driver& driver,
                                             Context context);

  ScopedContext(ScopedContext&& other) noexcept;
  ScopedContext& operator=(ScopedContext&&) = delete;
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;
  ~ScopedContext();

 private:
  ScopedContext(const Driver* driver, Context previous, bool restore)
      : driver_(driver), previous_(previous), restore_(restore) {}

  const Driver* driver_;
  Context previous_;
  bool restore_;
};

// A module loaded into a context from an image in memory (cubin ELF, or
// NUL-terminated PTX that the driver compiles for the device). Unloaded,
// with its context made current for the call, when destroyed; the context
// must outlive it.
class Module {
 public:
  // cuModuleLoadData in `context`. `image` must stay valid during the call
  // only. Errors: the driver's status (FAILED_PRECONDITION for an image
  // built for another GPU or invalid PTX).
  static absl::StatusOr<Module> Load(const Driver& driver, Context context,
                                     const void* image);

  Module(Module&& other) noexcept;
  Module& operator=(Module&& other) noexcept;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  ~Module();

  // cuModuleGetFunction. Errors: NOT_FOUND "kernel '<name>' is not in the
  // CUDA binary"; other driver errors as Driver::Check.
  absl::StatusOr<Function> GetFunction(const std::string& name) const;

 private:
  Module(const Driver* driver, Context context, ModuleHandle module)
      : driver_(driver), context_(context), module_(module) {}
  void Reset();

  const Driver* driver_ = nullptr;
  Context context_ = nullptr;
  ModuleHandle module_ = nullptr;
};

// Device memory from cuMemAlloc, freed with cuMemFree (its context made
// current) when destroyed; for tests and callers that want plain memory.
// The runtime allocates through DeviceAllocator (device_allocator.h).
class DeviceMemory {
 public:
  // Errors: RESOURCE_EXHAUSTED when the device is out of memory, else the
  // driver's status. `bytes` == 0 gives an empty DeviceMemory (pointer 0).
  static absl::StatusOr<DeviceMemory> Allocate(const Driver& driver,
                                               Context context, size_t bytes);

  DeviceMemory() = default;
  DeviceMemory(DeviceMemory&& other) noexcept;
  DeviceMemory& operator=(DeviceMemory&& other) noexcept;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory();

  DevicePtr get() const { return ptr_; }
  size_t size() const { return bytes_; }

 private:
  DeviceMemory(const Driver* driver, Context context, DevicePtr ptr,
               size_t bytes)
      : driver_(driver), context_(context), ptr_(ptr), bytes_(bytes) {}
  void Reset();

  const Driver* driver_ = nullptr;
  Context context_ = nullptr;
  DevicePtr ptr_ = 0;
  size_t bytes_ = 0;
};

}  // namespace cuda
}  // namespace kiln

#endif  // KILN_RUNTIME_CUDA_DRIVER_H_
