// CudaExecutable over hand-built artifacts whose "cubin" is hand-written PTX
// (tests/unit/cuda_test_util.h): no Kiln compiler involved. What needs no
// device runs everywhere (artifact checks, hash, guards, the no-driver
// status); the rest skips without a CUDA device and, with one, runs the
// kernels and checks the values.
#include "runtime/cuda_executable.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/guards.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/cuda_test_util.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using testing_cuda::AddOneArtifact;
using testing_cuda::Poly;
using testing_cuda::Seal;
using testing_cuda::TwoKernelArtifact;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// --- Checks that need no device ---

TEST(CudaExecutableLoadTest, TamperedBinaryIsDataLoss) {
  v1::Artifact a = AddOneArtifact();
  std::string cubin = a.cuda().cubin();
  cubin[cubin.size() / 2] ^= 1;
  a.mutable_cuda()->set_cubin(cubin);
  auto exe = CudaExecutable::Load(a);
  ASSERT_FALSE(exe.ok());
  EXPECT_EQ(exe.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(Message(exe.status()),
              StartsWith("CUDA binary SHA-256 mismatch: expected "));
  EXPECT_THAT(Message(exe.status()), HasSubstr("not loaded"));

  a = AddOneArtifact();
  a.set_binary_sha256("short");
  EXPECT_EQ(CudaExecutable::Load(a).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(CudaExecutableLoadTest, WrongFormatOrTargetIsFailedPrecondition) {
  v1::Artifact a = AddOneArtifact();
  a.set_format_version(2);
  EXPECT_EQ(CudaExecutable::Load(a).status().code(),
            absl::StatusCode::kFailedPrecondition);
  a = AddOneArtifact();
  a.mutable_target()->mutable_cpu()->set_cpu("x86-64-v3");
  EXPECT_THAT(Message(CudaExecutable::Load(a).status()),
              HasSubstr("target is not a CUDA target"));
  a = AddOneArtifact();
  a.mutable_cpu()->set_shared_object("ELF");
  EXPECT_THAT(Message(CudaExecutable::Load(a).status()),
              HasSubstr("holds no CUDA binary"));
}

TEST(CudaExecutableLoadTest, MalformedProgramIsInvalidArgument) {
  struct Case {
    const char* what;
    void (*mutate)(v1::Artifact*);
    const char* message;
  };
  const Case cases[] = {
      {"launch of a buffer out of range",
       [](v1::Artifact* a) {
         a->mutable_program()->mutable_steps(0)->mutable_launch()->set_buffers(
             1, 7);
       },
       "passes buffer 7 of 2"},
      {"range over an unknown symbol",
       [](v1::Artifact* a) {
         *a->mutable_program()
              ->mutable_steps(0)
              ->mutable_launch()
              ->mutable_range() = Poly(1, 3);
       },
       "uses symbol #3 of 1"},
      {"zero threads",
       [](v1::Artifact* a) {
         a->mutable_program()
             ->mutable_steps(0)
             ->mutable_launch()
             ->set_block_threads(0);
       },
       "has block_threads 0"},
      {"free of an input",
       [](v1::Artifact* a) { a->mutable_program()->add_steps()->set_free(0); },
       "which is not a temp"},
      {"output spec pointing at the input",
       [](v1::Artifact* a) { a->mutable_outputs(0)->set_buffer(0); },
       "claims to be output 0"},
      {"input buffer of a missing input",
       [](v1::Artifact* a) {
         a->mutable_program()->mutable_buffers(0)->set_index(4);
       },
       "is input 4 of 1"},
  };
  for (const Case& c : cases) {
    v1::Artifact a = AddOneArtifact();
    c.mutate(&a);
    Seal(&a);
    auto exe = CudaExecutable::Load(a);
    ASSERT_FALSE(exe.ok()) << c.what;
    EXPECT_EQ(exe.status().code(), absl::StatusCode::kInvalidArgument)
        << c.what << ": " << exe.status();
    EXPECT_THAT(Message(exe.status()), HasSubstr(c.message)) << c.what;
  }
  // A temp used after it was freed.
  v1::Artifact a = TwoKernelArtifact();
  auto* steps = a.mutable_program()->mutable_steps();
  steps->SwapElements(2, 3);  // free t before add_tensors reads it
  Seal(&a);
  EXPECT_THAT(Message(CudaExecutable::Load(a).status()),
              HasSubstr("uses temp buffer 1 while it is not allocated"));
}

// Temps of a static size up to LaunchLimits::arena_temp_bytes share one
// allocation per run (one call into the caller's allocator for all of
// them): they get 256-byte aligned offsets and no alloc/free steps. A
// symbolic or larger temp keeps its own.
TEST(CudaExecutableLoadTest, SmallStaticTempsShareAnArena) {
  LaunchLimits limits;
  limits.arena_temp_bytes = 1 << 20;
  auto kinds = [](const ProgramPlan& plan) {
    std::vector<ProgramPlan::Step::Kind> k;
    for (const ProgramPlan::Step& s : plan.steps) k.push_back(s.kind);
    return k;
  };
  using K = ProgramPlan::Step::Kind;
  auto symbolic = PlanProgram(TwoKernelArtifact(), limits);
  ASSERT_TRUE(symbolic.ok()) << symbolic.status();
  EXPECT_EQ(symbolic->arena_bytes, 0);
  EXPECT_EQ(kinds(*symbolic),
            (std::vector<K>{K::kAlloc, K::kLaunch, K::kLaunch, K::kFree}));

  v1::Artifact a = TwoKernelArtifact();
  *a.mutable_program()->mutable_buffers(1)->mutable_elements() = Poly(4000);
  auto small = PlanProgram(a, limits);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->arena_offset, (std::vector<int64_t>{-1, 0, -1}));
  EXPECT_EQ(small->arena_bytes, 16128);  // 16000 bytes, 256-byte multiple
  EXPECT_EQ(kinds(*small), (std::vector<K>{K::kLaunch, K::kLaunch}));
  // Without an arena (the CPU runtime's limits), the same temp has steps.
  auto off = PlanProgram(a, LaunchLimits{});
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->arena_bytes, 0);
  EXPECT_EQ(kinds(*off).size(), 4u);

  *a.mutable_program()->mutable_buffers(1)->mutable_elements() =
      Poly((1 << 18) + 1);  // one float more than 1 MiB
  auto large = PlanProgram(a, limits);
  ASSERT_TRUE(large.ok());
  EXPECT_EQ(large->arena_bytes, 0);
  EXPECT_EQ(kinds(*large).size(), 4u);
}

TEST(CudaExecutableLoadTest, WithoutADriverTheStatusIsTheDriversOwn) {
  absl::StatusOr<const cuda::Driver*> driver = cuda::Driver::Get();
  if (driver.ok()) GTEST_SKIP() << "a CUDA driver is present";
  auto exe = CudaExecutable::Load(AddOneArtifact());
  ASSERT_FALSE(exe.ok());
  EXPECT_EQ(exe.status(), driver.status());
  EXPECT_EQ(exe.status().code(), absl::StatusCode::kFailedPrecondition);
}

// The guards CudaExecutable::Run checks, on device addresses that need no
// device.
class DeviceGuardTest : public ::testing::Test {
 protected:
  absl::Status Check(DType dtype, std::vector<int64_t> sizes,
                     std::vector<int64_t> strides, uint64_t address) {
    GuardedTensor t{dtype, sizes, strides, address};
    std::vector<int64_t> symbols(artifact_.symbols_size());
    return CheckInputGuards(
        artifact_, 1, [&](int) { return t; }, absl::MakeSpan(symbols));
  }
  const v1::Artifact artifact_ = AddOneArtifact();
};

TEST_F(DeviceGuardTest, AcceptsWhatWasCompiled) {
  EXPECT_TRUE(Check(DType::kFloat32, {3, 4}, {4, 1}, 0x7f0000000000).ok());
  // Strides of dims of size 1 are not checked; s0 >= 2 though.
  EXPECT_TRUE(Check(DType::kFloat32, {2, 4}, {4, 1}, 0x10).ok());
}

TEST_F(DeviceGuardTest, NamesInputDimAndGuard) {
  absl::Status s = Check(DType::kFloat32, {3, 4}, {4, 1}, 0x7f0000000004);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "input 0: data is not 16-byte aligned");
  s = Check(DType::kFloat32, {3, 4}, {1, 3}, 0x1000);
  EXPECT_EQ(s.message(), "input 0: stride 1 of dim 0, compiled for 4");
  s = Check(DType::kFloat32, {3, 5}, {5, 1}, 0x1000);
  EXPECT_EQ(s.message(), "input 0: size 5 of dim 1, compiled for 4");
  s = Check(DType::kInt32, {3, 4}, {4, 1}, 0x1000);
  EXPECT_EQ(s.message(), "input 0: dtype int32, compiled for float32");
  s = Check(DType::kFloat32, {1, 4}, {4, 1}, 0x1000);
  EXPECT_THAT(Message(s),
              HasSubstr("size 1 violates the guard of symbol s0 (>= 2)"));
  s = Check(DType::kFloat32, {3, 4, 1}, {4, 1, 1}, 0x1000);
  EXPECT_EQ(s.message(), "input 0: rank 3, compiled for rank 2");
}

// --- On a device ---

// A device, a stream, an allocator, and helpers to move floats.
class CudaExecutableGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto driver = testing_cuda::DriverWithDevice();
    if (!driver.ok()) GTEST_SKIP() << "no CUDA device: " << driver.status();
    driver_ = *driver;
    auto context = cuda::PrimaryContext::Retain(*driver_, 0);
    ASSERT_TRUE(context.ok()) << context.status();
    context_.emplace(*std::move(context));
    auto allocator = CachingDeviceAllocator::Create(0);
    ASSERT_TRUE(allocator.ok()) << allocator.status();
    allocator_ = *allocator;
    ASSERT_EQ(api().cuCtxSetCurrent(context_->get()), cuda::kSuccess);
    ASSERT_EQ(api().cuStreamCreate(&stream_, cuda::kStreamNonBlocking),
              cuda::kSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) api().cuStreamDestroy_v2(stream_);
  }
  const cuda::DriverApi& api() const { return driver_->api(); }

  std::unique_ptr<CudaExecutable> Load(const v1::Artifact& artifact) {
    CudaLoadOptions options;
    options.allocator = allocator_;
    auto exe = CudaExecutable::Load(artifact, options);
    EXPECT_TRUE(exe.ok()) << exe.status();
    return exe.ok() ? *std::move(exe) : nullptr;
  }

  // Device memory holding `values` (plus `extra` spare bytes at the end).
  cuda::DeviceMemory Upload(const std::vector<float>& values,
                            size_t extra = 0) {
    auto memory = cuda::DeviceMemory::Allocate(
        *driver_, context_->get(), values.size() * sizeof(float) + extra);
    EXPECT_TRUE(memory.ok()) << memory.status();
    EXPECT_EQ(api().cuMemcpyHtoD_v2(memory->get(), values.data(),
                                    values.size() * sizeof(float)),
              cuda::kSuccess);
    return *std::move(memory);
  }

  std::vector<float> Download(cuda::DevicePtr ptr, size_t count) {
    EXPECT_EQ(api().cuStreamSynchronize(stream_), cuda::kSuccess);
    std::vector<float> host(count);
    EXPECT_EQ(api().cuMemcpyDtoH_v2(host.data(), ptr, count * sizeof(float)),
              cuda::kSuccess);
    return host;
  }

  static std::vector<float> Iota(size_t n) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = 0.5f * static_cast<float>(i) - 3;
    return v;
  }

  const cuda::Driver* driver_ = nullptr;
  std::optional<cuda::PrimaryContext> context_;
  std::shared_ptr<CachingDeviceAllocator> allocator_;
  cuda::Stream stream_ = nullptr;
};

TEST_F(CudaExecutableGpuTest, AddOne) {
  auto exe = Load(AddOneArtifact());
  ASSERT_NE(exe, nullptr);
  for (int64_t s0 : {2, 3, 1000, 100000}) {
    const std::vector<float> x = Iota(4 * s0);
    cuda::DeviceMemory input = Upload(x);
    const int64_t sizes[] = {s0, 4}, strides[] = {4, 1};
    auto out = exe->Run(
        {DeviceTensorView{input.get(), DType::kFloat32, sizes, strides}},
        stream_);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->size(), 1u);
    const DeviceTensor& y = (*out)[0];
    EXPECT_EQ(y.dtype(), DType::kFloat32);
    EXPECT_THAT(y.sizes(), ::testing::ElementsAre(s0, 4));
    EXPECT_THAT(y.strides(), ::testing::ElementsAre(4, 1));
    EXPECT_EQ(y.data() % 256, 0u);
    const std::vector<float> got = Download(y.data(), x.size());
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(got[i], x[i] + 1) << "s0=" << s0 << " i=" << i;
  }
}

// Through a temp of its own (a symbolic size) and through the run's arena
// (a static size, ProgramPlan::arena_offset): the same values, and the
// temp goes back to the cache after the run.
TEST_F(CudaExecutableGpuTest, TwoKernelsThroughATemp) {
  v1::Artifact in_arena = TwoKernelArtifact();
  *in_arena.mutable_program()->mutable_buffers(1)->mutable_elements() =
      Poly(4000);
  Seal(&in_arena);
  for (const v1::Artifact& artifact : {TwoKernelArtifact(), in_arena}) {
    auto exe = Load(artifact);
    ASSERT_NE(exe, nullptr);
    const int64_t s0 = 777;  // 3108 elements of the temp
    const std::vector<float> x = Iota(4 * s0);
    cuda::DeviceMemory input = Upload(x);
    const int64_t sizes[] = {s0, 4}, strides[] = {4, 1};
    const DeviceTensorView view{input.get(), DType::kFloat32, sizes, strides};
    auto out = exe->Run({view}, stream_);
    ASSERT_TRUE(out.ok()) << out.status();
    const std::vector<float> got = Download((*out)[0].data(), x.size());
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], 3 * x[i]) << i;
    // The temp went back to the cache; only the output is in use.
    const DeviceAllocatorStats st = allocator_->stats();
    EXPECT_EQ(st.allocated_bytes,
              static_cast<int64_t>(
                  CachingDeviceAllocator::SizeClass((*out)[0].nbytes())));
    EXPECT_GE(st.cached_bytes, 4 * s0 * 4);

    // The output chains into another run as an input.
    auto again = exe->Run({(*out)[0].view()}, stream_);
    ASSERT_TRUE(again.ok()) << again.status();
    const std::vector<float> got2 = Download((*again)[0].data(), x.size());
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got2[i], 9 * x[i]) << i;
  }
}

// RunInto writes the outputs into caller memory (as PyTorch's allocator
// gives it) and allocates nothing but temporaries; an output of the wrong
// count, dtype, sizes or strides is refused before anything is enqueued.
TEST_F(CudaExecutableGpuTest, RunIntoCallerMemory) {
  auto exe = Load(TwoKernelArtifact());
  ASSERT_NE(exe, nullptr);
  const int64_t s0 = 300;
  const std::vector<float> x = Iota(4 * s0);
  cuda::DeviceMemory input = Upload(x);
  cuda::DeviceMemory output = Upload(std::vector<float>(x.size(), -1));
  const int64_t sizes[] = {s0, 4}, strides[] = {4, 1};
  const DeviceTensorView in{input.get(), DType::kFloat32, sizes, strides};
  const DeviceTensorView out{output.get(), DType::kFloat32, sizes, strides};
  const int64_t before = allocator_->stats().allocations;
  ASSERT_TRUE(exe->RunInto({in}, {out}, stream_).ok());
  const std::vector<float> got = Download(output.get(), x.size());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], 3 * x[i]) << i;
  EXPECT_EQ(allocator_->stats().allocations, before + 1);  // the temp only

  const int64_t short_sizes[] = {s0 - 1, 4}, transposed[] = {1, s0};
  const std::vector<std::pair<DeviceTensorView, std::string>> bad = {
      {{output.get(), DType::kFloat16, sizes, strides}, "dtype float16"},
      {{output.get(), DType::kFloat32, short_sizes, strides}, "sizes [299, 4]"},
      {{output.get(), DType::kFloat32, sizes, transposed}, "stride 300 of dim"},
      {{0, DType::kFloat32, sizes, strides}, "no data pointer"},
  };
  for (const auto& [view, words] : bad) {
    const absl::Status s = exe->RunInto({in}, {view}, stream_);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(Message(s), HasSubstr(words));
  }
  EXPECT_THAT(Message(exe->RunInto({in}, {}, stream_)),
              HasSubstr("0 outputs given, the program writes 1"));
  EXPECT_EQ(Download(output.get(), x.size()), got);  // nothing more ran
}

TEST_F(CudaExecutableGpuTest, GuardsFailBeforeAnyWork) {
  auto exe = Load(AddOneArtifact());
  ASSERT_NE(exe, nullptr);
  cuda::DeviceMemory input = Upload(Iota(64), /*extra=*/64);
  const int64_t sizes[] = {3, 4}, strides[] = {4, 1};
  const int64_t bad_strides[] = {1, 3}, bad_sizes[] = {3, 5};
  const int64_t before = allocator_->stats().allocations;

  auto misaligned = exe->Run(
      {DeviceTensorView{input.get() + 4, DType::kFloat32, sizes, strides}},
      stream_);
  EXPECT_EQ(misaligned.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(misaligned.status().message(),
            "input 0: data is not 16-byte aligned");
  auto strided = exe->Run(
      {DeviceTensorView{input.get(), DType::kFloat32, sizes, bad_strides}},
      stream_);
  EXPECT_EQ(strided.status().message(),
            "input 0: stride 1 of dim 0, compiled for 4");
  auto sized = exe->Run(
      {DeviceTensorView{input.get(), DType::kFloat32, bad_sizes, strides}},
      stream_);
  EXPECT_EQ(sized.status().message(),
            "input 0: size 5 of dim 1, compiled for 4");
  auto typed = exe->Run(
      {DeviceTensorView{input.get(), DType::kBFloat16, sizes, strides}},
      stream_);
  EXPECT_EQ(typed.status().message(),
            "input 0: dtype bfloat16, compiled for float32");
  auto none = exe->Run({}, stream_);
  EXPECT_EQ(none.status().message(), "the graph takes 1 inputs, got 0");
  EXPECT_EQ(allocator_->stats().allocations, before);  // nothing allocated
}

TEST_F(CudaExecutableGpuTest, MissingKernelIsNotFound) {
  v1::Artifact a = AddOneArtifact();
  a.mutable_program()->mutable_steps(0)->mutable_launch()->set_kernel(
      "not_in_the_ptx");
  CudaLoadOptions options;
  options.allocator = allocator_;
  auto exe = CudaExecutable::Load(a, options);
  ASSERT_FALSE(exe.ok());
  EXPECT_EQ(exe.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(exe.status().message(),
            "kernel 'not_in_the_ptx' is not in the CUDA binary");
}

TEST_F(CudaExecutableGpuTest, CubinForAnotherArchIsRefused) {
  v1::Artifact a = AddOneArtifact();
  // An ELF header is enough: the arch is checked before the driver sees it.
  a.mutable_cuda()->set_cubin(std::string("\x7f"
                                          "ELF\2\1\1",
                                          7) +
                              std::string(64, '\0'));
  a.mutable_cuda()->set_arch("sm_10");
  Seal(&a);
  auto exe = CudaExecutable::Load(a);
  ASSERT_FALSE(exe.ok());
  EXPECT_EQ(exe.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(exe.status()),
              HasSubstr("the artifact is built for sm_10, device 0 is sm_"));
}

// The same kernels as a real ELF cubin for sm_90 (built with ptxas where the
// toolkit was found at build time; KILN_TEST_CUBIN=<path> names another
// copy, for a test binary carried to a GPU machine): runs on an sm_90
// device, is refused with the arch named on any other.
TEST_F(CudaExecutableGpuTest, RealCubin) {
#if defined(KILN_TEST_CUBIN_SM90)
  const char* path = KILN_TEST_CUBIN_SM90;
#else
  const char* path = nullptr;
#endif
  if (const char* env = std::getenv("KILN_TEST_CUBIN"); env && *env) path = env;
  if (path == nullptr)
    GTEST_SKIP() << "no test cubin: ptxas was not found at build time";
  std::FILE* file = std::fopen(path, "rb");
  if (file == nullptr)
    GTEST_SKIP() << "test cubin " << path
                 << " not readable (set KILN_TEST_CUBIN)";
  std::string cubin;
  char chunk[4096];
  for (size_t n; (n = std::fread(chunk, 1, sizeof(chunk), file)) > 0;)
    cubin.append(chunk, n);
  std::fclose(file);
  ASSERT_EQ(cubin.substr(0, 4),
            "\x7f"
            "ELF");
  v1::Artifact a = AddOneArtifact();
  a.mutable_cuda()->set_cubin(cubin);
  a.mutable_cuda()->set_arch("sm_90");
  a.mutable_target()->mutable_cuda()->set_arch("sm_90");
  Seal(&a);

  int major = 0, minor = 0;
  ASSERT_EQ(api().cuDeviceGetAttribute(
                &major, cuda::kDeviceAttributeComputeCapabilityMajor,
                context_->device()),
            cuda::kSuccess);
  ASSERT_EQ(api().cuDeviceGetAttribute(
                &minor, cuda::kDeviceAttributeComputeCapabilityMinor,
                context_->device()),
            cuda::kSuccess);
  CudaLoadOptions options;
  options.allocator = allocator_;
  auto exe = CudaExecutable::Load(a, options);
  if (major != 9) {
    ASSERT_FALSE(exe.ok());
    EXPECT_EQ(exe.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(Message(exe.status()),
                HasSubstr(absl::StrCat("built for sm_90, device 0 is sm_",
                                       major, minor)));
    return;
  }
  ASSERT_TRUE(exe.ok()) << exe.status();
  const std::vector<float> x = Iota(4 * 300);
  cuda::DeviceMemory input = Upload(x);
  const int64_t sizes[] = {300, 4}, strides[] = {4, 1};
  auto out = (*exe)->Run(
      {DeviceTensorView{input.get(), DType::kFloat32, sizes, strides}},
      stream_);
  ASSERT_TRUE(out.ok()) << out.status();
  const std::vector<float> got = Download((*out)[0].data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], x[i] + 1) << i;
}

TEST_F(CudaExecutableGpuTest, OutputsReuseMemoryOnTheSameStreamOnly) {
  auto exe = Load(AddOneArtifact());
  ASSERT_NE(exe, nullptr);
  cuda::DeviceMemory input = Upload(Iota(4 * 64));
  const int64_t sizes[] = {64, 4}, strides[] = {4, 1};
  const DeviceTensorView view{input.get(), DType::kFloat32, sizes, strides};
  cuda::DevicePtr first = 0;
  {
    auto out = exe->Run({view}, stream_);
    ASSERT_TRUE(out.ok());
    first = (*out)[0].data();
  }  // the output goes back to stream_'s cache, stream-ordered
  auto same = exe->Run({view}, stream_);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ((*same)[0].data(), first);

  cuda::Stream other = nullptr;
  ASSERT_EQ(api().cuStreamCreate(&other, cuda::kStreamNonBlocking),
            cuda::kSuccess);
  {
    auto out = exe->Run({view}, stream_);
    ASSERT_TRUE(out.ok());
    first = (*out)[0].data();
  }
  auto elsewhere = exe->Run({view}, other);
  ASSERT_TRUE(elsewhere.ok());
  EXPECT_NE((*elsewhere)[0].data(), first);
  ASSERT_EQ(api().cuStreamSynchronize(other), cuda::kSuccess);
  const std::vector<float> got = Download((*elsewhere)[0].data(), 4 * 64);
  EXPECT_EQ(got[5], Iota(6)[5] + 1);
  elsewhere->clear();
  api().cuStreamDestroy_v2(other);
}

// A caller-provided allocator is the only one used.
class CountingAllocator final : public DeviceAllocator {
 public:
  explicit CountingAllocator(std::shared_ptr<DeviceAllocator> inner)
      : inner_(std::move(inner)) {}
  absl::StatusOr<cuda::DevicePtr> Allocate(size_t bytes,
                                           cuda::Stream stream) override {
    ++allocations;
    return inner_->Allocate(bytes, stream);
  }
  void Free(cuda::DevicePtr ptr, size_t bytes, cuda::Stream stream) override {
    ++frees;
    inner_->Free(ptr, bytes, stream);
  }
  std::atomic<int> allocations{0};
  std::atomic<int> frees{0};

 private:
  std::shared_ptr<DeviceAllocator> inner_;
};

TEST_F(CudaExecutableGpuTest, CallerProvidedAllocator) {
  auto counting = std::make_shared<CountingAllocator>(allocator_);
  CudaLoadOptions options;
  options.allocator = counting;
  auto exe = CudaExecutable::Load(TwoKernelArtifact(), options);
  ASSERT_TRUE(exe.ok()) << exe.status();
  EXPECT_EQ((*exe)->allocator(), counting);
  cuda::DeviceMemory input = Upload(Iota(8));
  const int64_t sizes[] = {2, 4}, strides[] = {4, 1};
  {
    auto out = (*exe)->Run(
        {DeviceTensorView{input.get(), DType::kFloat32, sizes, strides}},
        stream_);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(counting->allocations.load(), 2);  // the output and the temp
    EXPECT_EQ(counting->frees.load(), 1);        // the temp
  }
  EXPECT_EQ(counting->frees.load(), 2);
}

TEST_F(CudaExecutableGpuTest, ConcurrentRunsOnTheirOwnStreams) {
  auto exe = Load(TwoKernelArtifact());
  ASSERT_NE(exe, nullptr);
  constexpr int kThreads = 4;
  constexpr int kRuns = 50;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Each thread has its own stream; the runtime makes the context
      // current itself.
      cuda::Stream stream = nullptr;
      if (api().cuCtxSetCurrent(context_->get()) != cuda::kSuccess ||
          api().cuStreamCreate(&stream, cuda::kStreamNonBlocking) !=
              cuda::kSuccess) {
        ++failures;
        return;
      }
      const int64_t s0 = 100 + t;
      std::vector<float> x = Iota(4 * s0);
      for (float& v : x) v += static_cast<float>(t);
      auto input =
          cuda::DeviceMemory::Allocate(*driver_, context_->get(), x.size() * 4);
      if (!input.ok() ||
          api().cuMemcpyHtoD_v2(input->get(), x.data(), x.size() * 4) !=
              cuda::kSuccess) {
        ++failures;
        return;
      }
      const int64_t sizes[] = {s0, 4}, strides[] = {4, 1};
      for (int r = 0; r < kRuns; ++r) {
        auto out = exe->Run(
            {DeviceTensorView{input->get(), DType::kFloat32, sizes, strides}},
            stream);
        if (!out.ok()) {
          ++failures;
          continue;
        }
        std::vector<float> got(x.size());
        if (api().cuMemcpyDtoHAsync_v2(got.data(), (*out)[0].data(),
                                       x.size() * 4,
                                       stream) != cuda::kSuccess ||
            api().cuStreamSynchronize(stream) != cuda::kSuccess) {
          ++failures;
          continue;
        }
        for (size_t i = 0; i < x.size(); ++i) {
          if (got[i] != 3 * x[i]) {
            ++failures;
            break;
          }
        }
      }
      api().cuStreamDestroy_v2(stream);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(allocator_->stats().errors, 0);
}

// Host time per Run of a one-kernel program: informational (TARGETS.md asks
// for <= 10 us per call; figures are recorded, never asserted).
TEST_F(CudaExecutableGpuTest, HostOverheadPerRun) {
  auto exe = Load(AddOneArtifact());
  ASSERT_NE(exe, nullptr);
  cuda::DeviceMemory input = Upload(Iota(8 * 16));
  const int64_t sizes[] = {32, 4}, strides[] = {4, 1};
  const DeviceTensorView view{input.get(), DType::kFloat32, sizes, strides};
  constexpr int kCalls = 100;
  std::vector<double> per_call_us;
  for (int batch = 0; batch < 30; ++batch) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) {
      auto out = exe->Run({view}, stream_);
      ASSERT_TRUE(out.ok());
    }
    const auto end = std::chrono::steady_clock::now();
    per_call_us.push_back(
        std::chrono::duration<double, std::micro>(end - start).count() /
        kCalls);
    ASSERT_EQ(api().cuStreamSynchronize(stream_), cuda::kSuccess);
  }
  std::sort(per_call_us.begin(), per_call_us.end());
  const double median = per_call_us[per_call_us.size() / 2];
  std::printf(
      "CudaExecutable::Run host time, 1-kernel program: median %.2f "
      "us per call (batches of %d, min %.2f)\n",
      median, kCalls, per_call_us.front());
  RecordProperty("run_host_us_median", std::to_string(median));
}

}  // namespace
}  // namespace kiln
