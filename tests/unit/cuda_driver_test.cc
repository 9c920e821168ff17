// cuda::Driver: the precise status without a driver (every machine), the
// entry points' types against cuda.h (where the toolkit's headers are
// installed: a compile-time check), and the RAII wrappers on a real device
// (skipped without one).
#include "runtime/cuda_driver.h"

#include <string>
#include <type_traits>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/cuda_test_util.h"

#if defined(KILN_HAVE_CUDA_H)
#include <cuda.h>
#endif

namespace kiln {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

#if defined(KILN_HAVE_CUDA_H)
// cuda.h's enums are distinct types; the driver ABI passes them as 32-bit
// integers, as DriverApi declares them. Compare types with enums and
// integers reduced to signed integers of their size.
template <typename T, typename = void>
struct Abi {
  using type = T;
};
template <typename T>
struct Abi<T, std::enable_if_t<std::is_enum_v<T>>> {
  using type = std::make_signed_t<std::underlying_type_t<T>>;
};
template <typename T>
struct Abi<T*, std::enable_if_t<std::is_enum_v<T>>> {
  using type = std::make_signed_t<std::underlying_type_t<T>>*;
};
template <typename T>
struct Abi<
    T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>> {
  using type = std::make_signed_t<T>;
};
template <typename F>
struct AbiFn;
template <typename R, typename... A>
struct AbiFn<R (*)(A...)> {
  using type = typename Abi<R>::type (*)(typename Abi<A>::type...);
};

#define KILN_CHECK_ABI(fn)                                                  \
  static_assert(std::is_same_v<AbiFn<decltype(&::fn)>::type,                \
                               AbiFn<decltype(cuda::DriverApi::fn)>::type>, \
                "DriverApi::" #fn " does not match cuda.h")
KILN_CHECK_ABI(cuInit);
KILN_CHECK_ABI(cuDriverGetVersion);
KILN_CHECK_ABI(cuGetErrorName);
KILN_CHECK_ABI(cuGetErrorString);
KILN_CHECK_ABI(cuDeviceGet);
KILN_CHECK_ABI(cuDeviceGetCount);
KILN_CHECK_ABI(cuDeviceGetAttribute);
KILN_CHECK_ABI(cuDevicePrimaryCtxRetain);
KILN_CHECK_ABI(cuDevicePrimaryCtxRelease_v2);
KILN_CHECK_ABI(cuCtxGetCurrent);
KILN_CHECK_ABI(cuCtxSetCurrent);
KILN_CHECK_ABI(cuCtxSynchronize);
KILN_CHECK_ABI(cuModuleLoadData);
KILN_CHECK_ABI(cuModuleUnload);
KILN_CHECK_ABI(cuModuleGetFunction);
KILN_CHECK_ABI(cuFuncGetAttribute);
KILN_CHECK_ABI(cuLaunchKernel);
KILN_CHECK_ABI(cuMemAlloc_v2);
KILN_CHECK_ABI(cuMemFree_v2);
KILN_CHECK_ABI(cuMemGetInfo_v2);
KILN_CHECK_ABI(cuMemcpyHtoD_v2);
KILN_CHECK_ABI(cuMemcpyDtoH_v2);
KILN_CHECK_ABI(cuMemcpyHtoDAsync_v2);
KILN_CHECK_ABI(cuMemcpyDtoHAsync_v2);
KILN_CHECK_ABI(cuMemcpyDtoDAsync_v2);
KILN_CHECK_ABI(cuMemHostAlloc);
KILN_CHECK_ABI(cuMemFreeHost);
KILN_CHECK_ABI(cuMemsetD8_v2);
KILN_CHECK_ABI(cuMemsetD8Async);
KILN_CHECK_ABI(cuStreamCreate);
KILN_CHECK_ABI(cuStreamDestroy_v2);
KILN_CHECK_ABI(cuStreamSynchronize);
KILN_CHECK_ABI(cuEventCreate);
KILN_CHECK_ABI(cuEventDestroy_v2);
KILN_CHECK_ABI(cuEventRecord);
KILN_CHECK_ABI(cuEventQuery);
KILN_CHECK_ABI(cuEventSynchronize);
KILN_CHECK_ABI(cuEventElapsedTime_v2);
KILN_CHECK_ABI(cuStreamIsCapturing);
#undef KILN_CHECK_ABI

// Handles convert both ways without casts, and the constants agree.
static_assert(std::is_same_v<CUstream, cuda::Stream>);
static_assert(std::is_same_v<CUcontext, cuda::Context>);
static_assert(std::is_same_v<CUmodule, cuda::ModuleHandle>);
static_assert(std::is_same_v<CUfunction, cuda::Function>);
static_assert(std::is_same_v<CUevent, cuda::Event>);
static_assert(std::is_same_v<CUdeviceptr, cuda::DevicePtr>);
static_assert(CUDA_ERROR_OUT_OF_MEMORY == cuda::kErrorOutOfMemory);
static_assert(CUDA_ERROR_INVALID_VALUE == cuda::kErrorInvalidValue);
static_assert(CUDA_ERROR_NOT_INITIALIZED == cuda::kErrorNotInitialized);
static_assert(CUDA_ERROR_DEINITIALIZED == cuda::kErrorDeinitialized);
static_assert(CUDA_ERROR_NO_DEVICE == cuda::kErrorNoDevice);
static_assert(CUDA_ERROR_INVALID_DEVICE == cuda::kErrorInvalidDevice);
static_assert(CUDA_ERROR_NO_BINARY_FOR_GPU == cuda::kErrorNoBinaryForGpu);
static_assert(CUDA_ERROR_INVALID_PTX == cuda::kErrorInvalidPtx);
static_assert(CUDA_ERROR_INVALID_IMAGE == cuda::kErrorInvalidImage);
static_assert(CUDA_ERROR_NOT_FOUND == cuda::kErrorNotFound);
static_assert(CUDA_ERROR_NOT_READY == cuda::kErrorNotReady);
static_assert(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X ==
              cuda::kDeviceAttributeMaxGridDimX);
static_assert(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR ==
              cuda::kDeviceAttributeComputeCapabilityMajor);
static_assert(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR ==
              cuda::kDeviceAttributeComputeCapabilityMinor);
static_assert(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK ==
              cuda::kFuncAttributeMaxThreadsPerBlock);
static_assert(CU_FUNC_ATTRIBUTE_NUM_REGS == cuda::kFuncAttributeNumRegs);
static_assert(CU_STREAM_NON_BLOCKING == cuda::kStreamNonBlocking);
static_assert(CU_EVENT_DISABLE_TIMING == cuda::kEventDisableTiming);

TEST(CudaDriverAbiTest, CheckedAgainstCudaH) { SUCCEED(); }
#else
TEST(CudaDriverAbiTest, CheckedAgainstCudaH) {
  GTEST_SKIP() << "cuda.h not found at build time: entry point types not "
                  "checked";
}
#endif

TEST(CudaDriverTest, MissingLibraryIsFailedPrecondition) {
  absl::StatusOr<std::unique_ptr<cuda::Driver>> driver =
      cuda::Driver::Open("libkiln-no-such-cuda-driver.so.1");
  ASSERT_FALSE(driver.ok());
  EXPECT_EQ(driver.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(driver.status().message()),
              StartsWith("CUDA driver not available: "
                         "libkiln-no-such-cuda-driver.so.1: cannot open "
                         "shared object file"));
}

TEST(CudaDriverTest, LibraryWithoutTheEntryPointsIsFailedPrecondition) {
  // libm loads, but is no CUDA driver.
  absl::StatusOr<std::unique_ptr<cuda::Driver>> driver =
      cuda::Driver::Open("libm.so.6");
  ASSERT_FALSE(driver.ok());
  EXPECT_EQ(driver.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(driver.status().message()),
              StartsWith("CUDA driver libm.so.6 lacks cuInit"));
}

TEST(CudaDriverTest, GetIsOnceAndPrecise) {
  absl::StatusOr<const cuda::Driver*> first = cuda::Driver::Get();
  absl::StatusOr<const cuda::Driver*> second = cuda::Driver::Get();
  EXPECT_EQ(first.status(), second.status());
  if (first.ok()) {
    EXPECT_EQ(*first, *second);
    EXPECT_GE((*first)->version(), 11000);
    return;
  }
  // No driver here, or one that found no device: either way a
  // FAILED_PRECONDITION that says which.
  EXPECT_EQ(first.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(first.status().message());
  EXPECT_TRUE(absl::StartsWith(message,
                               "CUDA driver not available: "
                               "libcuda.so.1: ") ||
              absl::StartsWith(message, "cuInit: "))
      << message;
}

TEST(CudaDriverTest, CheckNamesTheError) {
  KILN_REQUIRE_CUDA_DEVICE(driver);
  absl::Status s = driver->Check(cuda::kErrorOutOfMemory, "cuMemAlloc(1)");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()),
              StartsWith("cuMemAlloc(1): CUDA_ERROR_OUT_OF_MEMORY (2): "));
  EXPECT_EQ(driver->Check(cuda::kErrorNotFound, "x").code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(driver->Check(cuda::kSuccess, "x").ok());
}

TEST(CudaDriverTest, WrappersOnADevice) {
  KILN_REQUIRE_CUDA_DEVICE(driver);
  auto context = cuda::PrimaryContext::Retain(*driver, 0);
  ASSERT_TRUE(context.ok()) << context.status();
  EXPECT_FALSE(cuda::PrimaryContext::Retain(*driver, 1 << 20).ok());

  // ScopedContext restores whatever was current (here: none or another).
  cuda::Context before = nullptr;
  ASSERT_EQ(driver->api().cuCtxGetCurrent(&before), cuda::kSuccess);
  {
    auto scope = cuda::ScopedContext::Enter(*driver, context->get());
    ASSERT_TRUE(scope.ok()) << scope.status();
    cuda::Context now = nullptr;
    ASSERT_EQ(driver->api().cuCtxGetCurrent(&now), cuda::kSuccess);
    EXPECT_EQ(now, context->get());
  }
  cuda::Context after = nullptr;
  ASSERT_EQ(driver->api().cuCtxGetCurrent(&after), cuda::kSuccess);
  EXPECT_EQ(after, before);

  // Memory round trip.
  auto memory = cuda::DeviceMemory::Allocate(*driver, context->get(), 1024);
  ASSERT_TRUE(memory.ok()) << memory.status();
  auto scope = cuda::ScopedContext::Enter(*driver, context->get());
  ASSERT_TRUE(scope.ok());
  ASSERT_EQ(driver->api().cuMemsetD8_v2(memory->get(), 7, 1024),
            cuda::kSuccess);
  unsigned char host[1024] = {};
  ASSERT_EQ(driver->api().cuMemcpyDtoH_v2(host, memory->get(), 1024),
            cuda::kSuccess);
  EXPECT_EQ(host[0], 7);
  EXPECT_EQ(host[1023], 7);

  // Modules from PTX text; a missing kernel is NOT_FOUND naming it.
  auto module =
      cuda::Module::Load(*driver, context->get(), testing_cuda::kPointwisePtx);
  ASSERT_TRUE(module.ok()) << module.status();
  EXPECT_TRUE(module->GetFunction("add_one").ok());
  absl::StatusOr<cuda::Function> missing = module->GetFunction("nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("'nope'"));
  EXPECT_FALSE(
      cuda::Module::Load(*driver, context->get(), "this is not PTX").ok());
}

}  // namespace
}  // namespace kiln
