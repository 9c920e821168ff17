// The convolutions (graph/ops/conv.cc, compiler/ops/conv_*.cc):
// convolution and convolution_backward. Hand-worked values through the
// reference; then compiled CPU programs (GEMM extern calls with im2col,
// col2im, bias and layout kernels around them) against the reference on
// random inputs for every argument: 1-D/2-D/3-D, odd sizes, stride,
// padding, dilation, groups (depthwise included), transposed with
// output_padding, batch 1, an empty batch, non-contiguous inputs, float16
// and bfloat16, a dynamic batch; backward with each output_mask.
#include <algorithm>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/compile.h"
#include "compiler/cpu_backend.h"
#include "compiler/reference.h"
#include "graph/import.h"
#include "gtest/gtest.h"
#include "runtime/cpu_executable.h"
#include "runtime/program_plan.h"
#include "tests/unit/conv_cases.h"
#include "tests/unit/numerics.h"
#include "tests/unit/ops_test_util.h"

namespace kiln::testing {
namespace {

using namespace conv_cases;  // NOLINT: the suite's cases

[[maybe_unused]] ::testing::Environment* const kCoverage =
    RegisterCoverage("conv", ConvSuiteOps());

// ---- reference semantics, by hand ----

TEST(Conv, HandWorkedForward) {
  const HostTensor x = F32({1, 1, 5}, {1, 2, 3, 4, 5});
  const HostTensor w = F32({1, 1, 3}, {1, 0, -1});
  // y[p] = x[p] - x[p + 2].
  CheckOp(
      kConv, {x, w},
      Concat({In(0), In(1), NoneArg()}, Geometry({1}, {0}, {1}, false, {0}, 1)),
      kF32, {1, 1, 3}, {-2, -2, -2});
  // Padding 1: zeros at both ends.
  CheckOp(
      kConv, {x, w},
      Concat({In(0), In(1), NoneArg()}, Geometry({1}, {1}, {1}, false, {0}, 1)),
      kF32, {1, 1, 5}, {-2, -2, -2, -2, 4});
  // Stride 2 keeps positions 0, 2, 4 of that.
  CheckOp(
      kConv, {x, w},
      Concat({In(0), In(1), NoneArg()}, Geometry({2}, {1}, {1}, false, {0}, 1)),
      kF32, {1, 1, 3}, {-2, -2, 4});
  // Dilation 2: y[p] = x[p] - x[p + 4].
  CheckOp(
      kConv, {x, w},
      Concat({In(0), In(1), NoneArg()}, Geometry({1}, {0}, {2}, false, {0}, 1)),
      kF32, {1, 1, 1}, {-4});
  // Two groups of one channel, 1x1 kernels, a bias per output channel;
  // one int for all spatial dims.
  CheckOp(kConv,
          {F32({1, 2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8}),
           F32({2, 1, 1, 1}, {2, 3}), F32({2}, {10, 20})},
          Concat({In(0), In(1), In(2)}, Geometry({1}, {0}, {1}, false, {0}, 2)),
          kF32, {1, 2, 2, 2}, {12, 14, 16, 18, 35, 38, 41, 44});
  // Transposed, stride 2, output_padding 1: each input spreads over three
  // outputs, two apart; size (2 - 1) * 2 + 2 + 1 + 1 = 6.
  CheckOp(
      kConv, {F32({1, 1, 2}, {1, 2}), F32({1, 1, 3}, {1, 1, 1})},
      Concat({In(0), In(1), NoneArg()}, Geometry({2}, {0}, {1}, true, {1}, 1)),
      kF32, {1, 1, 6}, {1, 1, 3, 2, 2, 0});
  // bfloat16 rounds the result once: 1.5 * 1.5 * 3 = 6.75 is exact.
  CheckOp(
      kConv,
      {BF16({1, 1, 3}, {1.5, 1.5, 1.5}), BF16({1, 1, 3}, {1.5, 1.5, 1.5})},
      Concat({In(0), In(1), NoneArg()}, Geometry({1}, {0}, {1}, false, {0}, 1)),
      kBF16, {1, 1, 1}, {6.75}, 0);
}

TEST(Conv, HandWorkedBackward) {
  // y[p] = x[p] - x[p + 1] over x = [1, 2, 3], grad_output [1, 10]:
  // grad_input [1, -1 + 10, -10], grad_weight [1*1 + 10*2, 1*2 + 10*3],
  // grad_bias 11.
  const std::vector<HostTensor> in{F32({1, 1, 2}, {1, 10}),
                                   F32({1, 1, 3}, {1, 2, 3}),
                                   F32({1, 1, 2}, {1, -1})};
  auto args = [](std::vector<int64_t> mask) {
    return Concat(Concat({In(0), In(1), In(2), Ints({1})},
                         Geometry({1}, {0}, {1}, false, {0}, 1)),
                  {Ints(mask)});
  };
  auto r = RunTracked(kConvBackward, in, args({1, 1, 1}));
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kF32, {1, 1, 3}, {1, 9, -10});
  ExpectOutput(*r, 1, kF32, {1, 1, 2}, {21, 32});
  ExpectOutput(*r, 2, kF32, {1}, {11});
  // Outputs the mask turns off are zeros.
  r = RunTracked(kConvBackward, in, args({0, 1, 0}));
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kF32, {1, 1, 3}, {0, 0, 0});
  ExpectOutput(*r, 1, kF32, {1, 1, 2}, {21, 32});
  ExpectOutput(*r, 2, kF32, {1}, {0});
  // Without a bias PyTorch passes bias_sizes [0] and no grad_bias.
  r = RunTracked(kConvBackward, in,
                 Concat(Concat({In(0), In(1), In(2), Ints({0})},
                               Geometry({1}, {0}, {1}, false, {0}, 1)),
                        {Ints({1, 1, 0})}));
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 1, kF32, {1, 1, 2}, {21, 32});
  ExpectOutput(*r, 2, kF32, {0}, {});
  // Transposed: y = [1, 1, 3, 2, 2, 0] above from x = [1, 2]; with
  // grad_output [1, 2, 3, 4, 5, 6]: grad_input[i] = sum_k go[2i + k]
  // = [6, 12], grad_weight[k] = go[k] + 2 go[2 + k] = [7, 10, 13].
  r = RunTracked(kConvBackward,
                 {F32({1, 1, 6}, {1, 2, 3, 4, 5, 6}), F32({1, 1, 2}, {1, 2}),
                  F32({1, 1, 3}, {1, 1, 1})},
                 Concat(Concat({In(0), In(1), In(2), NoneArg()},
                               Geometry({2}, {0}, {1}, true, {1}, 1)),
                        {Ints({1, 1, 1})}));
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kF32, {1, 1, 2}, {6, 12});
  ExpectOutput(*r, 1, kF32, {1, 1, 3}, {7, 10, 13});
  ExpectOutput(*r, 2, kF32, {1}, {21});
}

TEST(Conv, InvalidArguments) {
  const std::vector<v1::Argument> plain =
      Concat({In(0), In(1), NoneArg()}, Geometry({1}, {0}, {1}, false, {0}, 1));
  ExpectInvalid(kConv, {F32({1, 3, 5}, {}), F32({2, 2, 3}, {})}, plain,
                {"node 0", kConv, "expect input[1] = 2"});
  ExpectInvalid(kConv, {F32({3, 5}, {}), F32({2, 3, 3}, {})}, plain,
                {"(batched) input"});
  ExpectInvalid(kConv, {F32({1, 1, 2}, {}), F32({1, 1, 3}, {})}, plain,
                {"smaller than the dilated kernel"});
  ExpectInvalid(kConv, {F32({1, 1, 5}, {}), F16({1, 1, 3}, {})}, plain,
                {"one dtype", "float32", "float16"});
  ExpectInvalid(kConv, {I64({1, 1, 5}, {}), I64({1, 1, 3}, {})}, plain,
                {"floating dtypes only"});
  ExpectInvalid(kConv, {F32({1, 1, 5}, {}), F32({1, 1, 3}, {})},
                Concat({In(0), In(1), NoneArg()},
                       Geometry({1, 1}, {0}, {1}, false, {0}, 1)),
                {"stride must have one entry or 1"});
  ExpectInvalid(
      kConv, {F32({1, 1, 5}, {}), F32({1, 1, 3}, {})},
      Concat({In(0), In(1), NoneArg()}, Geometry({2}, {0}, {1}, true, {2}, 1)),
      {"output_padding must be smaller"});
  ExpectInvalid(
      kConv, {F32({1, 4, 5}, {}), F32({3, 2, 3}, {})},
      Concat({In(0), In(1), NoneArg()}, Geometry({1}, {0}, {1}, false, {0}, 2)),
      {"divisible by 2"});
  ExpectInvalid(
      kConv, {F32({1, 1, 5}, {}), F32({2, 1, 3}, {}), F32({3}, {})},
      Concat({In(0), In(1), In(2)}, Geometry({1}, {0}, {1}, false, {0}, 1)),
      {"bias must have shape [2]"});
  ExpectInvalid(kConvBackward,
                {F32({1, 1, 4}, {}), F32({1, 1, 5}, {}), F32({1, 1, 3}, {})},
                Concat(Concat({In(0), In(1), In(2), NoneArg()},
                              Geometry({1}, {0}, {1}, false, {0}, 1)),
                       {Ints({1, 1, 1})}),
                {"grad_output must have the convolution's output shape"});
}

// ---- compiled against the reference ----

// Compiles the case for this CPU, its convolutions oneDNN calls when
// `library` (else im2col kernels and GEMMs), runs it (for each batch in
// `batches` when the batch is symbolic) and compares every output with the
// reference; returns the artifact.
v1::Artifact CheckCompiled(bool library, const TestCase& c,
                           std::vector<int64_t> batches = {}) {
  v1::CompileRequest req;
  *req.mutable_graph() = CaseGraph(c);
  *req.mutable_target()->mutable_cpu() = HostCpuTarget();
  req.mutable_options()->set_cpu_library_convolutions(library);
  auto graph = ImportGraph(req.graph());
  EXPECT_TRUE(graph.ok()) << graph.status();
  if (!graph.ok()) return {};
  auto artifact = Compile(req);
  EXPECT_TRUE(artifact.ok()) << artifact.status();
  if (!artifact.ok()) return {};
  auto exe = CpuExecutable::Load(*artifact);
  EXPECT_TRUE(exe.ok()) << exe.status();
  if (!exe.ok()) return {};
  if (batches.empty()) batches.push_back(-1);
  for (int64_t n : batches) {
    SCOPED_TRACE(absl::StrCat("batch ", n));
    std::mt19937_64 rng(7 + n);
    const std::vector<HostTensor> inputs =
        CaseInputs(n < 0 ? c : WithBatch(c, n), rng);
    auto want = EvaluateReference(*graph, inputs);
    EXPECT_TRUE(want.ok()) << want.status();
    auto got = (*exe)->Run(inputs);
    EXPECT_TRUE(got.ok()) << got.status();
    if (!want.ok() || !got.ok()) return *artifact;
    for (int o = 0; o < c.outputs; ++o) {
      const std::string diff = Compare((*got)[o], (*want)[o]);
      EXPECT_TRUE(diff.empty()) << "output " << o << ": " << diff;
    }
  }
  ExercisedOps().insert(c.op);
  return *artifact;
}

int CountCalls(const v1::Artifact& a) {
  int n = 0;
  for (const v1::Step& s : a.program().steps()) n += s.has_call();
  return n;
}

// Calls into oneDNN.
int CountOneDnnCalls(const v1::Artifact& a) {
  int n = 0;
  for (const v1::Step& s : a.program().steps())
    n += s.has_call() && s.call().library() == v1::ExternCall::ONEDNN;
  return n;
}

// Every ConvCompiled test runs twice: im2col kernels and GEMMs (false), and
// oneDNN calls (true; skipped where oneDNN does not load).
class ConvCompiled : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (GetParam() && !CpuConv::Available())
      GTEST_SKIP() << "no oneDNN: " << CpuConv::Describe();
  }
  bool library() const { return GetParam(); }
  v1::Artifact Check(const TestCase& c, std::vector<int64_t> batches = {}) {
    return CheckCompiled(library(), c, std::move(batches));
  }
  // Forward and backward (all outputs) of `c`.
  void CheckBoth(const Conv& c) {
    SCOPED_TRACE(c.ToString());
    Check(ForwardCase(c));
    Check(BackwardCase(c, {1, 1, 1}));
  }
};

INSTANTIATE_TEST_SUITE_P(KernelsAndOneDnn, ConvCompiled, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "OneDnn" : "Kernels";
                         });

TEST_P(ConvCompiled, Forward) {
  for (const Conv& c : Geometries()) {
    SCOPED_TRACE(c.ToString());
    const v1::Artifact a = Check(ForwardCase(c));
    EXPECT_EQ(CountCalls(a), 1);
    EXPECT_EQ(CountOneDnnCalls(a), library() ? 1 : 0);
  }
}

TEST_P(ConvCompiled, Backward) {
  for (const Conv& c : Geometries()) {
    SCOPED_TRACE(c.ToString());
    const v1::Artifact a = Check(BackwardCase(c, {1, 1, 1}));
    EXPECT_EQ(CountCalls(a), 2) << "grad_input and grad_weight";
    EXPECT_EQ(CountOneDnnCalls(a), library() ? 2 : 0);
  }
}

TEST_P(ConvCompiled, Transposed) {
  for (const Conv& c : TransposedGeometries()) CheckBoth(c);
}

TEST_P(ConvCompiled, OutputMask) {
  Conv c;
  c.padding = {1};
  c.stride = {2};
  c.bias = true;
  for (bool transposed : {false, true}) {
    c.transposed = transposed;
    c.output_padding = {transposed ? 1 : 0};
    for (const std::vector<int64_t>& mask : std::vector<std::vector<int64_t>>{
             {1, 0, 0}, {0, 1, 0}, {0, 1, 1}, {0, 0, 1}}) {
      SCOPED_TRACE(
          absl::StrCat(c.ToString(), " mask ", absl::StrJoin(mask, ",")));
      const v1::Artifact a = Check(BackwardCase(c, mask));
      EXPECT_EQ(CountCalls(a), mask[0] + mask[1]);
    }
  }
}

// Windows that end before the input does (PyTorch floors the output size:
// oneDNN is given the input up to the last element read, and the rest of
// grad_input is zeros), padding wider than the kernel, and a dim whose
// only window reads padding alone (every product zero).
TEST_P(ConvCompiled, WindowsShortOfTheInputAndPaddingOnly) {
  Conv c;
  c.in = {8, 9};
  c.stride = {2, 3};
  c.bias = true;
  CheckBoth(c);  // right padding -1 and -2
  c = Conv{};
  c.in = {4, 5};
  c.kernel = {1, 2};
  c.padding = {2, 3};
  c.stride = {3, 2};
  CheckBoth(c);
  c = Conv{};
  c.in = {1, 3};
  c.kernel = {1, 1};
  c.padding = {2, 0};
  c.stride = {5, 1};
  CheckBoth(c);  // dim 0: one window, at -2
}

// One executable run from several threads at once (each oneDNN call
// brings its own stream, scratchpad and reorder buffers; the primitives
// are shared): every run gives the bits a run alone gives.
TEST_P(ConvCompiled, ConcurrentRunsGiveTheSameBits) {
  Conv c;
  c.n = 4;
  c.c = 16;
  c.o = 32;
  c.in = {12, 12};
  c.padding = {1};
  c.bias = true;
  const TestCase t = BackwardCase(c, {1, 1, 1});
  const v1::Artifact artifact = Check(t);
  auto exe = CpuExecutable::Load(artifact);
  ASSERT_TRUE(exe.ok()) << exe.status();
  std::mt19937_64 rng(21);
  const std::vector<HostTensor> inputs = CaseInputs(t, rng);
  auto alone = (*exe)->Run(inputs);
  ASSERT_TRUE(alone.ok()) << alone.status();
  constexpr int kThreads = 4, kRuns = 8;
  std::vector<std::string> diffs(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      for (int r = 0; r < kRuns && diffs[i].empty(); ++r) {
        auto got = (*exe)->Run(inputs);
        if (!got.ok()) {
          diffs[i] = std::string(got.status().message());
          break;
        }
        for (size_t o = 0; o < got->size() && diffs[i].empty(); ++o) {
          const HostTensor& a = (*got)[o];
          const HostTensor& b = (*alone)[o];
          const size_t bytes = a.numel() * DTypeSize(a.dtype());
          if (a.numel() != b.numel() ||
              std::memcmp(a.data(), b.data(), bytes) != 0) {
            diffs[i] = absl::StrCat("run ", r, " output ", o, " differs");
          }
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int i = 0; i < kThreads; ++i)
    EXPECT_EQ(diffs[i], "") << "thread " << i;
}

TEST_P(ConvCompiled, NonContiguousInputs) {
  Conv c;
  c.channels_last = true;
  c.padding = {1};
  CheckBoth(c);
  c.kernel = {1, 1};
  c.padding = {0};
  CheckBoth(c);
  c.transposed = true;
  c.kernel = {2, 2};
  c.stride = {2};
  CheckBoth(c);
}

// bfloat16 convolutions are oneDNN calls on the CPU that read bfloat16 and
// write float32 (Convolution.result_dtype), rounded by the program; float16
// stays Kiln's kernels (no CPU library takes it). A transposed convolution
// with output_padding >= stride is Kiln's kernels either way.
// ops_conv_test_widened runs this with KILN_ONEDNN_BF16=0: the runtime
// widens the operands to float32 itself, as on a CPU whose oneDNN has no
// bfloat16 convolution.
TEST_P(ConvCompiled, ReducedPrecision) {
  for (DType d : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(d));
    // (oneDNN's bfloat16 convolutions need AVX-512: the x86-64-v4 level.)
    const bool calls = library() && d == DType::kBFloat16 &&
                       CpuTargetHasAvx512(HostCpuTarget());
    Conv c;
    c.dtype = d;
    c.padding = {1};
    c.bias = true;
    SCOPED_TRACE(c.ToString());
    const v1::Artifact fwd = Check(ForwardCase(c));
    const v1::Artifact bwd = Check(BackwardCase(c, {1, 1, 1}));
    EXPECT_EQ(CountOneDnnCalls(fwd), calls ? 1 : 0);
    EXPECT_EQ(CountOneDnnCalls(bwd), calls ? 2 : 0);
    for (const v1::Artifact* a : {&fwd, &bwd}) {
      for (const v1::Step& s : a->program().steps()) {
        if (!s.has_call() || !s.call().has_conv()) continue;
        EXPECT_EQ(s.call().conv().dtype(), v1::BFLOAT16);
        EXPECT_EQ(s.call().conv().result_dtype(), v1::FLOAT32);
      }
    }
    c.groups = 2;
    c.c = 4;
    c.stride = {2};
    CheckBoth(c);
    c.groups = 1;
    c.transposed = true;
    c.output_padding = {1};
    CheckBoth(c);
    c.output_padding = {0};
    CheckBoth(c);
  }
}

TEST_P(ConvCompiled, DynamicBatch) {
  Conv c;
  c.symbolic_batch = true;
  c.padding = {1};
  c.bias = true;
  for (bool transposed : {false, true}) {
    c.transposed = transposed;
    SCOPED_TRACE(c.ToString());
    Check(ForwardCase(c), {2, 5});
    Check(BackwardCase(c, {1, 1, 1}), {2, 3});
  }
}

// Random geometries against the reference (seeded, bounded).
TEST_P(ConvCompiled, RandomGeometries) {
  std::mt19937_64 rng(16);
  for (int i = 0; i < 12; ++i) CheckBoth(RandomConv(rng));
}

// ---- CUDA targets: cuDNN calls (issue 16) ----

// The case compiled for sm_90 (here, without a GPU: the GPU suite runs
// them, tests/gpu/cuda_gpu_test.cc).
v1::Artifact CompileForCuda(const TestCase& c, const CompileEnv& env = {},
                            const v1::CompileOptions& options = {}) {
  v1::CompileRequest req;
  *req.mutable_graph() = CaseGraph(c);
  req.mutable_target()->mutable_cuda()->set_arch("sm_90");
  *req.mutable_options() = options;
  auto artifact = Compile(req, env);
  EXPECT_TRUE(artifact.ok()) << artifact.status();
  return artifact.ok() ? *artifact : v1::Artifact{};
}

std::vector<const v1::Convolution*> ConvCalls(const v1::Artifact& a) {
  std::vector<const v1::Convolution*> out;
  for (const v1::Step& s : a.program().steps()) {
    if (!s.has_call() || !s.call().has_conv()) continue;
    EXPECT_EQ(s.call().library(), v1::ExternCall::CUDNN);
    out.push_back(&s.call().conv());
  }
  return out;
}

// What the CUDA runtime takes (cuda_executable.cc), for plans made here.
LaunchLimits CudaLimits() {
  LaunchLimits limits;
  limits.max_block_threads = 1024;
  limits.extern_library = v1::ExternCall::CUBLASLT;
  limits.conv_library = v1::ExternCall::CUDNN;
  limits.conv_dtypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  return limits;
}

// Every convolution is one cuDNN call per direction in the operands' dtype,
// over whole contiguous buffers: forward (transposed: backward data), and
// for the backward grad_input (backward data; transposed: forward) and
// grad_weight (backward filter), as the output mask asks. The runtime's
// checks accept each, and the sizes evaluate to the case's geometry. A
// transposed convolution whose output_padding reaches its stride stays
// Kiln's kernels (UsesLibrary in compiler/ops/conv_lowering.cc).
TEST(ConvCuda, ConvolutionsAreCudnnCalls) {
  std::vector<Conv> all = Geometries();
  for (const Conv& c : TransposedGeometries()) all.push_back(c);
  int kernel_path = 0;
  for (Conv c : all) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      c.dtype = dtype;
      SCOPED_TRACE(c.ToString());
      bool library = true;
      for (size_t d = 0; c.transposed && d < c.in.size(); ++d)
        library &= At(c.output_padding, d) < At(c.stride, d);
      const v1::Artifact fwd = CompileForCuda(ForwardCase(c));
      std::vector<const v1::Convolution*> calls = ConvCalls(fwd);
      if (!library) {
        EXPECT_TRUE(calls.empty());
        EXPECT_TRUE(ConvCalls(CompileForCuda(BackwardCase(c, {1, 1, 1})))
                        .empty());
        ++kernel_path;
        continue;
      }
      ASSERT_EQ(calls.size(), 1u);
      EXPECT_EQ(calls[0]->direction(), c.transposed
                                           ? v1::Convolution::BACKWARD_DATA
                                           : v1::Convolution::FORWARD);
      EXPECT_EQ(calls[0]->dtype(), static_cast<v1::DType>(dtype));
      EXPECT_EQ(calls[0]->groups(), c.groups);
      EXPECT_FALSE(calls[0]->tf32());
      const v1::Artifact bwd = CompileForCuda(BackwardCase(c, {1, 1, 1}));
      calls = ConvCalls(bwd);
      ASSERT_EQ(calls.size(), 2u);
      EXPECT_EQ(calls[0]->direction(), c.transposed
                                           ? v1::Convolution::FORWARD
                                           : v1::Convolution::BACKWARD_DATA);
      EXPECT_EQ(calls[1]->direction(), v1::Convolution::BACKWARD_FILTER);
      for (const v1::Artifact* a : {&fwd, &bwd}) {
        auto plan = PlanProgram(*a, CudaLimits());
        ASSERT_TRUE(plan.ok()) << plan.status();
        std::vector<int64_t> elements;
        for (const v1::BufferSpec& b : a->program().buffers())
          elements.push_back(EvaluateSymPoly(b.elements(), {}));
        for (const ProgramPlan::Extern& e : plan->externs) {
          ASSERT_NE(e.conv, nullptr);
          auto dims = EvaluateConv(*e.conv, {}, elements);
          ASSERT_TRUE(dims.ok()) << dims.status();
          EXPECT_EQ(dims->n, c.n);
          EXPECT_EQ(dims->groups, c.groups);
          EXPECT_EQ(dims->kernel[0], c.kernel[0]);
          // The library's x is the larger side.
          EXPECT_EQ(dims->x[0], c.transposed ? OutputSizes(c)[2] : c.in[0]);
        }
      }
    }
  }
  EXPECT_EQ(kernel_path, 2) << "the dilated 1-D transposed case, twice";
  // Masked outputs make no call.
  Conv c;
  c.bias = true;
  EXPECT_EQ(ConvCalls(CompileForCuda(BackwardCase(c, {0, 1, 1}))).size(), 1u);
  EXPECT_EQ(ConvCalls(CompileForCuda(BackwardCase(c, {0, 0, 1}))).size(), 0u);
}

// A channels-last input is copied to a contiguous temp the call reads; a
// contiguous one is read in place; the flags reach the call; the im2col
// path stays available (CompileEnv::gpu_kernel_convolutions).
TEST(ConvCuda, OperandsFlagsAndTheKernelPath) {
  Conv c;
  c.padding = {1};
  const v1::Artifact plain = CompileForCuda(ForwardCase(c));
  ASSERT_EQ(ConvCalls(plain).size(), 1u);
  EXPECT_EQ(ConvCalls(plain)[0]->input(), 0) << "the input, in place";
  EXPECT_EQ(ConvCalls(plain)[0]->weight(), 1);
  int launches = 0;
  for (const v1::Step& s : plain.program().steps()) launches += s.has_launch();
  EXPECT_EQ(launches, 0) << "nothing around the call";
  c.channels_last = true;
  const v1::Artifact nhwc = CompileForCuda(ForwardCase(c));
  ASSERT_EQ(ConvCalls(nhwc).size(), 1u);
  EXPECT_EQ(nhwc.program().buffers(ConvCalls(nhwc)[0]->input()).kind(),
            v1::BufferSpec::TEMP);

  v1::CompileOptions flags;
  flags.set_allow_tf32_convolution(true);
  flags.set_deterministic_convolutions(true);
  const v1::Artifact flagged = CompileForCuda(ForwardCase(c), {}, flags);
  ASSERT_EQ(ConvCalls(flagged).size(), 1u);
  EXPECT_TRUE(ConvCalls(flagged)[0]->tf32());
  EXPECT_TRUE(ConvCalls(flagged)[0]->deterministic());
  c.dtype = DType::kFloat16;  // TF32 is for float32 only
  EXPECT_FALSE(ConvCalls(CompileForCuda(ForwardCase(c), {}, flags))[0]->tf32());

  CompileEnv kernels;
  kernels.gpu_kernel_convolutions = true;
  const v1::Artifact im2col = CompileForCuda(ForwardCase(c), kernels);
  for (const v1::Step& s : im2col.program().steps()) {
    if (s.has_call()) EXPECT_TRUE(s.call().has_gemm());
  }
}

// Malformed convolution steps are refused before anything runs: at load
// (library, dtype, buffers, ranks) or by EvaluateConv (sizes that do not
// make a convolution, buffers too small); a CPU runtime makes no cuDNN
// call.
TEST(ConvCuda, MalformedConvStepsAreRefused) {
  Conv c;
  c.padding = {1};
  const v1::Artifact good = CompileForCuda(ForwardCase(c));
  auto conv_of = [](v1::Artifact& a) {
    for (v1::Step& s : *a.mutable_program()->mutable_steps()) {
      if (s.has_call()) return s.mutable_call()->mutable_conv();
    }
    return static_cast<v1::Convolution*>(nullptr);
  };
  auto refused = [](const v1::Artifact& a, const std::string& part) {
    auto plan = PlanProgram(a, CudaLimits());
    ASSERT_FALSE(plan.ok());
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(plan.status().message().find(part), std::string::npos)
        << plan.status();
  };
  auto evaluated = [](const v1::Artifact& a) {
    auto plan = PlanProgram(a, CudaLimits());
    EXPECT_TRUE(plan.ok()) << plan.status();
    std::vector<int64_t> elements;
    for (const v1::BufferSpec& b : a.program().buffers())
      elements.push_back(EvaluateSymPoly(b.elements(), {}));
    return EvaluateConv(*plan->externs[0].conv, {}, elements).status();
  };
  ASSERT_TRUE(evaluated(good).ok());
  {
    v1::Artifact a = good;
    a.mutable_program()->mutable_steps(0)->mutable_call()->set_library(
        v1::ExternCall::CUBLASLT);
    refused(a, "calls cuBLASLt for a convolution; this runtime calls cuDNN");
  }
  {
    v1::Artifact a = good;
    conv_of(a)->set_dtype(v1::INT64);
    refused(a, "convolves int64");
  }
  {
    v1::Artifact a = good;
    conv_of(a)->set_output(0);
    refused(a, "input or an operand");
  }
  {
    v1::Artifact a = good;
    conv_of(a)->set_weight(9);
    refused(a, "passes buffer 9");
  }
  {
    v1::Artifact a = good;
    conv_of(a)->add_stride(1);
    refused(a, "1 to 3 spatial dims");
  }
  {
    v1::Artifact a = good;
    conv_of(a)->set_stride(0, 2);  // y no longer matches x
    const absl::Status s = evaluated(a);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("do not give"), std::string::npos) << s;
  }
  {
    v1::Artifact a = good;
    conv_of(a)->set_groups(2);  // 3 channels in 2 groups
    EXPECT_NE(evaluated(a).message().find("inconsistent channels"),
              std::string::npos);
  }
  {
    v1::Artifact a = good;
    // A larger batch than the buffers hold.
    conv_of(a)->mutable_x_sizes(0)->mutable_terms(0)->set_coeff(5);
    conv_of(a)->mutable_y_sizes(0)->mutable_terms(0)->set_coeff(5);
    EXPECT_NE(evaluated(a).message().find("elements of buffer"),
              std::string::npos);
  }
  {
    v1::Artifact a = good;
    conv_of(a)->set_padding(0, -1);
    EXPECT_NE(evaluated(a).message().find("padding -1"), std::string::npos);
  }
  // A runtime without a convolution library (the CPU's) refuses the step.
  LaunchLimits cpu;
  cpu.extern_library = v1::ExternCall::BLAS;
  auto plan = PlanProgram(good, cpu);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find(
                "calls cuDNN for a convolution; this runtime calls no library"),
            std::string::npos)
      << plan.status();
}

}  // namespace
}  // namespace kiln::testing
