// What the GPU tests and benchmarks share: the device (or why there is
// none), host <-> device copies of HostTensors (strided inputs keep their
// layout), and compiling a request for the device's architecture.
#ifndef KILN_TESTS_GPU_GPU_UTIL_H_
#define KILN_TESTS_GPU_GPU_UTIL_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "runtime/cuda_driver.h"
#include "runtime/cuda_executable.h"
#include "graph/host_tensor.h"

namespace kiln::gpu_testing {

struct Gpu {
  const cuda::Driver* driver = nullptr;
  std::optional<cuda::PrimaryContext> context;
  std::string arch;  // "sm_90"
};

// Device 0, or why it cannot be used (no driver, no device).
inline absl::StatusOr<Gpu*> OpenGpu() {
  static absl::StatusOr<Gpu*> gpu = []() -> absl::StatusOr<Gpu*> {
    auto driver = cuda::Driver::Get();
    if (!driver.ok()) return driver.status();
    auto ctx = cuda::PrimaryContext::Retain(**driver, 0);
    if (!ctx.ok()) return ctx.status();
    static Gpu g;
    g.driver = *driver;
    int major = 0, minor = 0;
    // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR
    (*driver)->api().cuDeviceGetAttribute(&major, 75, ctx->device());
    (*driver)->api().cuDeviceGetAttribute(&minor, 76, ctx->device());
    g.arch = absl::StrCat("sm_", major * 10 + minor);
    g.context.emplace(*std::move(ctx));
    return &g;
  }();
  return gpu;
}

// A HostTensor's storage on the device, same layout: data points at the
// element the host tensor's data() points at.
struct DeviceInput {
  cuda::DeviceMemory storage;
  cuda::DevicePtr data = 0;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> sizes, strides;
  DeviceTensorView view() const {
    return DeviceTensorView{data, dtype, sizes, strides};
  }
};

inline absl::StatusOr<DeviceInput> Upload(const Gpu& gpu, const HostTensor& t) {
  const int64_t es = DTypeSize(t.dtype());
  int64_t extent = 1;  // elements from data() to the last one, plus one
  for (int d = 0; d < t.rank(); ++d) {
    if (t.sizes()[d] == 0) extent = 0;
  }
  if (extent > 0) {
    for (int d = 0; d < t.rank(); ++d)
      extent += (t.sizes()[d] - 1) * t.strides()[d];
  }
  const size_t bytes = (t.offset() + extent) * es;
  auto ctx = cuda::ScopedContext::Enter(*gpu.driver, gpu.context->get());
  if (!ctx.ok()) return ctx.status();
  auto mem = cuda::DeviceMemory::Allocate(*gpu.driver, gpu.context->get(),
                                          std::max<size_t>(bytes, 16));
  if (!mem.ok()) return mem.status();
  DeviceInput in;
  in.dtype = t.dtype();
  in.sizes = t.sizes();
  in.strides = t.strides();
  in.data = mem->get() + t.offset() * es;
  if (bytes > 0) {
    const uint8_t* storage = t.data() - t.offset() * es;
    if (absl::Status s = gpu.driver->Check(
            gpu.driver->api().cuMemcpyHtoD_v2(mem->get(), storage, bytes),
            "cuMemcpyHtoD");
        !s.ok())
      return s;
  }
  in.storage = *std::move(mem);
  return in;
}

// Waits for `stream` and copies a contiguous device tensor back.
inline absl::StatusOr<HostTensor> Download(const Gpu& gpu,
                                           const DeviceTensor& t,
                                           cuda::Stream stream) {
  auto ctx = cuda::ScopedContext::Enter(*gpu.driver, gpu.context->get());
  if (!ctx.ok()) return ctx.status();
  if (absl::Status s = gpu.driver->Check(
          gpu.driver->api().cuStreamSynchronize(stream), "cuStreamSynchronize");
      !s.ok())
    return s;
  HostTensor h = HostTensor::Empty(
      t.dtype(), std::vector<int64_t>(t.sizes().begin(), t.sizes().end()));
  if (t.nbytes() > 0) {
    if (absl::Status s = gpu.driver->Check(
            gpu.driver->api().cuMemcpyDtoH_v2(h.data(), t.data(), t.nbytes()),
            "cuMemcpyDtoH");
        !s.ok())
      return s;
  }
  return h;
}

}  // namespace kiln::gpu_testing

#endif  // KILN_TESTS_GPU_GPU_UTIL_H_
