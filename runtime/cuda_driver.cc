#include "runtime/cuda_driver.h"

#include <dlfcn.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/dl_error.h"

namespace kiln {
namespace cuda {
namespace {

// Resolves `name` into `*slot`; the symbol's type is the slot's.
template <typename Fn>
absl::Status Resolve(void* handle, const char* library, const char* name,
                     Fn* slot) {
  dlerror();  // clear a stale error so that a null symbol is told apart
  void* address = dlsym(handle, name);
  if (address == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA driver ", library, " lacks ", name,
                     " (a driver older than CUDA 11?): ", DlError()));
  }
  *slot = reinterpret_cast<Fn>(address);
  return absl::OkStatus();
}

absl::StatusCode CodeFor(Result result) {
  switch (result) {
    case kErrorOutOfMemory:
      return absl::StatusCode::kResourceExhausted;
    case kErrorNotFound:
      return absl::StatusCode::kNotFound;
    case kErrorInvalidValue:
      return absl::StatusCode::kInvalidArgument;
    case kErrorNotInitialized:
    case kErrorDeinitialized:
    case kErrorNoDevice:
    case kErrorInvalidDevice:
    case kErrorNoBinaryForGpu:
    case kErrorInvalidPtx:
    case kErrorInvalidImage:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Driver>> Driver::Open(const char* library) {
  // RTLD_LOCAL: the driver's symbols stay out of the global namespace, so a
  // libcuda the process loads otherwise (the CUDA runtime, PyTorch) is the
  // same library object, found by name, not a clash.
  void* handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA driver not available: ", DlError()));
  }
  // The handle is deliberately never closed: libcuda does not support being
  // unloaded, and contexts and modules may outlive any one owner.
  std::unique_ptr<Driver> driver(new Driver());
  DriverApi& api = driver->api_;
#define KILN_RESOLVE(fn)                                                \
  if (absl::Status s = Resolve(handle, library, #fn, &api.fn); !s.ok()) \
    return s;
  KILN_RESOLVE(cuInit)
  KILN_RESOLVE(cuDriverGetVersion)
  KILN_RESOLVE(cuGetErrorName)
  KILN_RESOLVE(cuGetErrorString)
  KILN_RESOLVE(cuDeviceGet)
  KILN_RESOLVE(cuDeviceGetCount)
  KILN_RESOLVE(cuDeviceGetAttribute)
  KILN_RESOLVE(cuDevicePrimaryCtxRetain)
  KILN_RESOLVE(cuDevicePrimaryCtxRelease_v2)
  KILN_RESOLVE(cuCtxGetCurrent)
  KILN_RESOLVE(cuCtxSetCurrent)
  KILN_RESOLVE(cuCtxSynchronize)
  KILN_RESOLVE(cuModuleLoadData)
  KILN_RESOLVE(cuModuleUnload)
  KILN_RESOLVE(cuModuleGetFunction)
  KILN_RESOLVE(cuFuncGetAttribute)
  KILN_RESOLVE(cuLaunchKernel)
  KILN_RESOLVE(cuMemAlloc_v2)
  KILN_RESOLVE(cuMemFree_v2)
  KILN_RESOLVE(cuMemGetInfo_v2)
  KILN_RESOLVE(cuMemcpyHtoD_v2)
  KILN_RESOLVE(cuMemcpyDtoH_v2)
  KILN_RESOLVE(cuMemcpyHtoDAsync_v2)
  KILN_RESOLVE(cuMemcpyDtoHAsync_v2)
  KILN_RESOLVE(cuMemcpyDtoDAsync_v2)
  KILN_RESOLVE(cuMemHostAlloc)
  KILN_RESOLVE(cuMemFreeHost)
  KILN_RESOLVE(cuMemsetD8_v2)
  KILN_RESOLVE(cuMemsetD8Async)
  KILN_RESOLVE(cuStreamCreate)
  KILN_RESOLVE(cuStreamDestroy_v2)
  KILN_RESOLVE(cuStreamSynchronize)
  KILN_RESOLVE(cuEventCreate)
  KILN_RESOLVE(cuEventDestroy_v2)
  KILN_RESOLVE(cuEventRecord)
  KILN_RESOLVE(cuEventQuery)
  KILN_RESOLVE(cuEventSynchronize)
  KILN_RESOLVE(cuStreamIsCapturing)
  // Drivers before CUDA 12.8 have only the first version (same signature).
  if (!Resolve(handle, library, "cuEventElapsedTime_v2",
               &api.cuEventElapsedTime_v2)
           .ok()) {
    if (absl::Status s = Resolve(handle, library, "cuEventElapsedTime",
                                 &api.cuEventElapsedTime_v2);
        !s.ok()) {
      return s;
    }
  }
#undef KILN_RESOLVE

  if (absl::Status s = driver->Check(api.cuInit(0), "cuInit"); !s.ok())
    return s;
  if (absl::Status s = driver->Check(api.cuDriverGetVersion(&driver->version_),
                                     "cuDriverGetVersion");
      !s.ok()) {
    return s;
  }
  return driver;
}

absl::StatusOr<const Driver*> Driver::Get() {
  // The one piece of process-wide state: initialised once, thread-safely
  // (a function-local static), immutable afterwards.
  static const absl::StatusOr<std::unique_ptr<Driver>> loaded =
      Open("libcuda.so.1");
  if (!loaded.ok()) return loaded.status();
  return loaded->get();
}

absl::Status Driver::Check(Result result, absl::string_view call) const {
  if (result == kSuccess) return absl::OkStatus();
  const char* name = nullptr;
  const char* text = nullptr;
  if (api_.cuGetErrorName == nullptr ||
      api_.cuGetErrorName(result, &name) != kSuccess || name == nullptr) {
    name = "CUDA_ERROR_UNKNOWN_CODE";
  }
  if (api_.cuGetErrorString == nullptr ||
      api_.cuGetErrorString(result, &text) != kSuccess || text == nullptr) {
    text = "no description";
  }
  return absl::Status(CodeFor(result), absl::StrCat(call, ": ", name, " (",
                                                    result, "): ", text));
}

// --- PrimaryContext ---

absl::StatusOr<PrimaryContext> PrimaryContext::Retain(const Driver& driver,
                                                      int ordinal) {
  Device device = 0;
  if (absl::Status s = driver.Check(driver.api().cuDeviceGet(&device, ordinal),
                                    absl::StrCat("cuDeviceGet(", ordinal, ")"));
      !s.ok()) {
    return s;
  }
  Context context = nullptr;
  if (absl::Status s =
          driver.Check(driver.api().cuDevicePrimaryCtxRetain(&context, device),
                       "cuDevicePrimaryCtxRetain");
      !s.ok()) {
    return s;
  }
  return PrimaryContext(&driver, device, context);
}

PrimaryContext::PrimaryContext(PrimaryContext&& other) noexcept
    : driver_(other.driver_),
      device_(other.device_),
      context_(std::exchange(other.context_, nullptr)) {}

PrimaryContext& PrimaryContext::operator=(PrimaryContext&& other) noexcept {
  if (this != &other) {
    Reset();
    driver_ = other.driver_;
    device_ = other.device_;
    context_ = std::exchange(other.context_, nullptr);
  }
  return *this;
}

PrimaryContext::~PrimaryContext() { Reset(); }

void PrimaryContext::Reset() {
  if (context_ == nullptr) return;
  // A failure here (the driver already shut down at process exit) leaves
  // nothing to release.
  driver_->api().cuDevicePrimaryCtxRelease_v2(device_);
  context_ = nullptr;
}

// --- ScopedContext ---

absl::StatusOr<ScopedContext> ScopedContext::Enter(const Driver& driver,
                                                   Context context) {
  Context previous = nullptr;
  if (absl::Status s = driver.Check(driver.api().cuCtxGetCurrent(&previous),
                                    "cuCtxGetCurrent");
      !s.ok()) {
    return s;
  }
  if (previous == context) return ScopedContext(&driver, previous, false);
  if (absl::Status s = driver.Check(driver.api().cuCtxSetCurrent(context),
                                    "cuCtxSetCurrent");
      !s.ok()) {
    return s;
  }
  return ScopedContext(&driver, previous, true);
}

ScopedContext::ScopedContext(ScopedContext&& other) noexcept
    : driver_(other.driver_),
      previous_(other.previous_),
      restore_(std::exchange(other.restore_, false)) {}

ScopedContext::~ScopedContext() {
  if (restore_) driver_->api().cuCtxSetCurrent(previous_);
}

// --- Module ---

absl::StatusOr<Module> Module::Load(const Driver& driver, Context context,
                                    const void* image) {
  auto scope = ScopedContext::Enter(driver, context);
  if (!scope.ok()) return scope.status();
  ModuleHandle module = nullptr;
  if (absl::Status s = driver.Check(
          driver.api().cuModuleLoadData(&module, image), "cuModuleLoadData");
      !s.ok()) {
    return s;
  }
  return Module(&driver, context, module);
}

Module::Module(Module&& other) noexcept
    : driver_(other.driver_),
      context_(other.context_),
      module_(std::exchange(other.module_, nullptr)) {}

Module& Module::operator=(Module&& other) noexcept {
  if (this != &other) {
    Reset();
    driver_ = other.driver_;
    context_ = other.context_;
    module_ = std::exchange(other.module_, nullptr);
  }
  return *this;
}

Module::~Module() { Reset(); }

void Module::Reset() {
  if (module_ == nullptr) return;
  // cuModuleUnload acts on the current context.
  auto scope = ScopedContext::Enter(*driver_, context_);
  if (scope.ok()) driver_->api().cuModuleUnload(module_);
  module_ = nullptr;
}

absl::StatusOr<Function> Module::GetFunction(const std::string& name) const {
  Function function = nullptr;
  const Result result =
      driver_->api().cuModuleGetFunction(&function, module_, name.c_str());
  if (result == kErrorNotFound) {
    return absl::NotFoundError(
        absl::StrCat("kernel '", name, "' is not in the CUDA binary"));
  }
  if (absl::Status s = driver_->Check(
          result, absl::StrCat("cuModuleGetFunction(", name, ")"));
      !s.ok()) {
    return s;
  }
  return function;
}

// --- DeviceMemory ---

absl::StatusOr<DeviceMemory> DeviceMemory::Allocate(const Driver& driver,
                                                    Context context,
                                                    size_t bytes) {
  if (bytes == 0) return DeviceMemory();
  auto scope = ScopedContext::Enter(driver, context);
  if (!scope.ok()) return scope.status();
  DevicePtr ptr = 0;
  if (absl::Status s = driver.Check(driver.api().cuMemAlloc_v2(&ptr, bytes),
                                    absl::StrCat("cuMemAlloc(", bytes, ")"));
      !s.ok()) {
    return s;
  }
  return DeviceMemory(&driver, context, ptr, bytes);
}

DeviceMemory::DeviceMemory(DeviceMemory&& other) noexcept
    : driver_(other.driver_),
      context_(other.context_),
      ptr_(std::exchange(other.ptr_, 0)),
      bytes_(std::exchange(other.bytes_, 0)) {}

DeviceMemory& DeviceMemory::operator=(DeviceMemory&& other) noexcept {
  if (this != &other) {
    Reset();
    driver_ = other.driver_;
    context_ = other.context_;
    ptr_ = std::exchange(other.ptr_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

DeviceMemory::~DeviceMemory() { Reset(); }

void DeviceMemory::Reset() {
  if (ptr_ == 0) return;
  auto scope = ScopedContext::Enter(*driver_, context_);
  if (scope.ok()) driver_->api().cuMemFree_v2(ptr_);
  ptr_ = 0;
  bytes_ = 0;
}

}  // namespace cuda
}  // namespace kiln
