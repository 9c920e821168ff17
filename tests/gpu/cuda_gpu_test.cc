// The CUDA back end on a real GPU: the example graphs and the random-graph
// suite (all of op set v1, six dtypes, dynamic sizes, strided inputs; see
// tests/unit/random_graphs.h) are compiled in-process for the device's
// architecture, run through CudaExecutable on seeded random inputs and
// compared with the reference evaluator under compiler/numerics.h's
// per-dtype tolerances. Half of the graphs promise 16-byte aligned inputs
// (vector loads), half do not; half take 4 elements per group where their
// small static ranges would take one.
//
// Without a GPU every test is skipped with the reason (no driver, no
// device), which ctest shows.
//
// Environment:
//   KILN_GPU_RANDOM_GRAPHS=<count>   seeds 0..count-1 (default 1000)
//   KILN_GPU_RANDOM_GRAPH_SEED=<s>   just this seed, printing its graph
//   KILN_GPU_FAST_MATH_GRAPHS, KILN_GPU_LANE_LOOP_GRAPHS  (default 300 each)
//   KILN_GPU_DIAGNOSE_SEEDS=<s1,s2,...>  what each seed's failure depends on
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/kiln_client.h"
#include "compiler/compile.h"
#include "compiler/reference.h"
#include "google/protobuf/util/json_util.h"
#include "graph/import.h"
#include "gtest/gtest.h"
#include "runtime/cuda_executable.h"
#include "tests/gpu/gpu_util.h"
#include "tests/server/daemon.h"
#include "tests/unit/conv_cases.h"
#include "tests/unit/epilogue_graphs.h"
#include "tests/unit/example_graphs.h"
#include "tests/unit/numerics.h"
#include "tests/unit/op_harness.h"
#include "tests/unit/random_graphs.h"

namespace kiln::testing {
namespace {

using gpu_testing::Gpu;

Gpu* GpuOrSkip() {
  auto gpu = gpu_testing::OpenGpu();
  if (!gpu.ok()) return nullptr;
  return *gpu;
}

#define REQUIRE_GPU(gpu)                                                   \
  Gpu* gpu = GpuOrSkip();                                                  \
  if (!gpu) {                                                              \
    GTEST_SKIP() << "no CUDA device: " << gpu_testing::OpenGpu().status(); \
  }

// Compiles (or fetches) and loads a request for the GPU.
using Loader =
    std::function<absl::StatusOr<std::shared_ptr<const CudaExecutable>>(
        const v1::CompileRequest&)>;

// Empty when the graph matches the reference on the GPU, with the
// executable `load` gives for the request (its arch set to the GPU's, its
// inputs' alignment to what the random inputs keep).
std::string CheckOnGpuWith(Gpu& gpu, uint64_t seed, v1::CompileRequest req,
                           bool aligned, const Loader& load) {
  req.mutable_target()->mutable_cuda()->set_arch(gpu.arch);
  auto graph = ImportGraph(req.graph());
  if (!graph.ok()) return absl::StrCat("import: ", graph.status().ToString());
  const std::vector<std::vector<int64_t>> bindings =
      random_graphs::Bindings(*graph);
  // Inputs are generated first so that the alignment promise can be kept:
  // a storage offset that breaks 16-byte alignment is declared unaligned.
  std::vector<std::vector<HostTensor>> inputs;
  for (size_t b = 0; b < bindings.size(); ++b) {
    std::mt19937_64 rng(seed * 7919 + b);
    inputs.push_back(RandomInputs(*graph, bindings[b], rng));
  }
  for (int i = 0; i < req.graph().inputs_size(); ++i) {
    bool ok = aligned;
    for (const auto& set : inputs)
      ok &= (set[i].offset() * DTypeSize(set[i].dtype())) % 16 == 0;
    req.mutable_graph()->mutable_inputs(i)->mutable_meta()->set_alignment(
        ok ? 16 : 0);
  }
  auto exe = load(req);
  if (!exe.ok()) return exe.status().ToString();
  for (size_t b = 0; b < bindings.size(); ++b) {
    auto want = EvaluateReference(*graph, inputs[b]);
    if (!want.ok())
      return absl::StrCat("reference: ", want.status().ToString());
    std::vector<gpu_testing::DeviceInput> dev;
    std::vector<DeviceTensorView> views;
    for (const HostTensor& t : inputs[b]) {
      auto d = gpu_testing::Upload(gpu, t);
      if (!d.ok()) return absl::StrCat("upload: ", d.status().ToString());
      dev.push_back(*std::move(d));
    }
    for (const auto& d : dev) views.push_back(d.view());
    auto got = (*exe)->Run(views, nullptr);
    if (!got.ok()) return absl::StrCat("Run: ", got.status().ToString());
    if (got->size() != want->size())
      return absl::StrCat("Run returned ", got->size(), " outputs");
    for (size_t o = 0; o < want->size(); ++o) {
      auto host = gpu_testing::Download(gpu, (*got)[o], nullptr);
      if (!host.ok())
        return absl::StrCat("download: ", host.status().ToString());
      const std::string diff = Compare(*host, (*want)[o]);
      if (!diff.empty()) {
        return absl::StrCat("output ", o, " with symbols [",
                            absl::StrJoin(bindings[b], ", "), "]: ", diff,
                            "\n  got:  ", host->ToString(24),
                            "\n  want: ", (*want)[o].ToString(24));
      }
    }
  }
  return "";
}

// Compiled in-process, then CudaExecutable::Load.
std::string CheckOnGpu(Gpu& gpu, uint64_t seed, v1::CompileRequest req,
                       bool aligned, const CompileEnv& env = {}) {
  return CheckOnGpuWith(
      gpu, seed, std::move(req), aligned,
      [&](const v1::CompileRequest& r)
          -> absl::StatusOr<std::shared_ptr<const CudaExecutable>> {
        auto artifact = Compile(r, env);
        if (!artifact.ok()) {
          return absl::Status(
              artifact.status().code(),
              absl::StrCat("Compile: ", artifact.status().message()));
        }
        auto exe = CudaExecutable::Load(*artifact);
        if (!exe.ok()) {
          return absl::Status(exe.status().code(),
                              absl::StrCat("Load: ", exe.status().message()));
        }
        return std::shared_ptr<const CudaExecutable>(*std::move(exe));
      });
}

std::string GraphJson(const v1::Graph& g) {
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(g, &json);
  return json;
}

TEST(CudaGpu, ExampleGraphsMatchReference) {
  REQUIRE_GPU(gpu);
  for (const char* file :
       {"chain10.json", "chain30.json", "chain30_sum.json", "softmax.json",
        "layer_norm.json", "reduce_two_dims.json", "dynamic_batch.json",
        "topk_sort.json", "conv1d_broadcast.json"}) {
    for (bool aligned : {true, false}) {
      EXPECT_EQ(CheckOnGpu(*gpu, 1, Request(file), aligned), "")
          << file << (aligned ? " (aligned)" : "");
    }
  }
}

// Linear layers whose bias and activation run as cuBLASLt epilogues
// (compiler/gemm_epilogue.h), and the same graphs unfused, against the
// reference, in the three dtypes, with strict reductions too (TF32's
// rounding is outside the reference's float32 tolerance: bench/python/
// gpu_gemm.py's TF32 rows show it in effect).
//
// Each case twice: with the algorithm timed among cuBLASLt's candidates
// (the default) and with the heuristic's first (KILN_GEMM_AUTOTUNE=0).
TEST(CudaGpu, GemmEpiloguesMatchReference) {
  REQUIRE_GPU(gpu);
  int checked = 0;
  for (const char* autotune : {"8", "0"}) {
    setenv("KILN_GEMM_AUTOTUNE", autotune, 1);
    for (const char* dtype : {"FLOAT32", "FLOAT16", "BFLOAT16"}) {
      for (const char* act : {"", "relu", "gelu_tanh", "gelu"}) {
        for (int variant = 0; variant < 4; ++variant) {
          LinearCase c;
          c.dtype = dtype;
          c.activation = act;
          c.bias = variant != 1;
          c.bias_row = variant == 2;
          c.symbolic_m = variant == 3;
          if (variant == 3) c.m = 300, c.k = 256, c.n = 384;
          if (!c.bias && c.activation.empty()) continue;
          for (bool unfused : {false, true}) {
            v1::CompileRequest req;
            *req.mutable_graph() = LinearGraph(c);
            req.mutable_options()->set_unfused_gemm_epilogues(unfused);
            req.mutable_options()->set_strict_fp16_reduction(variant == 3);
            req.mutable_options()->set_strict_bf16_reduction(variant == 3);
            // The heuristic's algorithm, untimed (Gemm.deterministic).
            req.mutable_options()->set_deterministic_algorithms(variant == 2);
            const uint64_t seed = 100 + checked;
            EXPECT_EQ(CheckOnGpu(*gpu, seed, req, /*aligned=*/true), "")
                << dtype << " act '" << act << "' variant " << variant
                << (unfused ? " unfused" : " fused") << " autotune " << autotune
                << "\n"
                << GraphJson(req.graph());
            ++checked;
          }
        }
      }
    }
  }
  unsetenv("KILN_GEMM_AUTOTUNE");
  EXPECT_GT(checked, 160);
}

// A linear layer's backward whose bias gradient is the weight gradient's
// cuBLASLt epilogue (BGRAD_B, and BGRAD_A for AOTAutograd's mm(t(gy), x);
// compiler/gemm_epilogue.h), and the same graphs unfused, against the
// reference: 2-D and 3-D activations, symbolic token counts (from 2), in
// the three dtypes, timed and with the heuristic's algorithm.
TEST(CudaGpu, BiasGradientsMatchReference) {
  REQUIRE_GPU(gpu);
  int checked = 0;
  for (const char* autotune : {"8", "0"}) {
    setenv("KILN_GEMM_AUTOTUNE", autotune, 1);
    for (const char* dtype : {"FLOAT32", "FLOAT16", "BFLOAT16"}) {
      for (int variant = 0; variant < 6; ++variant) {
        LinearBackwardCase c;
        c.dtype = dtype;
        if (variant == 1) c.batch = 3;
        if (variant == 2 || variant == 5) c.symbolic_tokens = true;
        if (variant == 3 || variant == 5) {
          c.batch = 4, c.tokens = 128, c.k = 256, c.n = 768;
          c.symbolic_tokens = true;
        }
        c.gy_transposed_product = variant >= 4;
        c.sum_first = variant == 4 || variant == 1;  // AOTAutograd's order
        for (bool unfused : {false, true}) {
          v1::CompileRequest req;
          *req.mutable_graph() = LinearBackwardGraph(c);
          req.mutable_options()->set_unfused_gemm_epilogues(unfused);
          const uint64_t seed = 300 + checked;
          EXPECT_EQ(CheckOnGpu(*gpu, seed, req, /*aligned=*/true), "")
              << dtype << " variant " << variant
              << (unfused ? " unfused" : " fused") << " autotune " << autotune
              << "\n"
              << GraphJson(req.graph());
          ++checked;
        }
      }
    }
  }
  unsetenv("KILN_GEMM_AUTOTUNE");
  EXPECT_EQ(checked, 72);
}

// Convolutions (issue 16) as cuDNN calls and, for comparison, as Kiln's
// im2col kernels and cuBLASLt GEMMs (CompileEnv::gpu_kernel_convolutions),
// forward and backward, against the reference: the CPU suite's geometries
// (tests/unit/conv_cases.h) in float32 (FMA, no TF32), float16 and
// bfloat16, channels-last inputs, a dynamic batch, deterministic
// algorithms, and random geometries.
TEST(CudaGpu, ConvolutionsMatchReference) {
  REQUIRE_GPU(gpu);
  using namespace conv_cases;  // NOLINT: the shared cases
  std::vector<Conv> all = Geometries();
  for (const Conv& c : TransposedGeometries()) all.push_back(c);
  std::mt19937_64 rng(16);
  for (int i = 0; i < 12; ++i) all.push_back(RandomConv(rng));
  for (size_t i = 0; i < 4; ++i) {
    Conv c = all[i];
    c.channels_last = true;
    all.push_back(c);
    c.channels_last = false;
    c.symbolic_batch = true;
    all.push_back(c);
  }
  int checked = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    Conv c = all[i];
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      c.dtype = dtype;
      for (bool kernels : {false, true}) {
        CompileEnv env;
        env.gpu_kernel_convolutions = kernels;
        for (const TestCase& t : {ForwardCase(c), BackwardCase(c, {1, 1, 1})}) {
          v1::CompileRequest req;
          *req.mutable_graph() = CaseGraph(t);
          req.mutable_options()->set_deterministic_convolutions(i % 3 == 1);
          // cudnn.benchmark: the algorithm timed on the first call.
          req.mutable_options()->set_cudnn_benchmark(i % 2 == 0);
          EXPECT_EQ(
              CheckOnGpu(*gpu, 500 + checked, req, /*aligned=*/false, env), "")
              << c.ToString() << (kernels ? " im2col" : " cuDNN") << " " << t.op
              << "\n"
              << GraphJson(req.graph());
          ++checked;
        }
      }
    }
  }
  std::printf("%d convolution graphs on %s\n", checked, gpu->arch.c_str());
}

// Accumulating scatters add atomically on the GPU (LoopNode::kScatter):
// embedding backward, scatter_add and index_put with accumulate at sizes
// far above the old quadratic bound, every index drawn from [-8, 8] (many
// sources per element: contended atomics), in float32 and bfloat16 (summed
// in float32, cast once), against the reference.
// Executables on one device share its cuBLASLt object (handle, plans,
// timed choices) and its cuDNN handle (runtime/per_context.h): three
// executables (two of one artifact with a convolution's backward, one of
// a linear layer) loaded together, run from three threads at once, each
// on its own stream, then one dropped and the others run again; every
// result against the reference.
TEST(CudaGpu, ExecutablesShareTheDeviceLibraries) {
  REQUIRE_GPU(gpu);
  conv_cases::Conv c;
  c.padding = {1};
  v1::CompileRequest conv_req;
  *conv_req.mutable_graph() = CaseGraph(conv_cases::BackwardCase(c, {1, 1, 1}));
  LinearCase l;
  l.dtype = "BFLOAT16";
  l.activation = "relu";
  v1::CompileRequest gemm_req;
  *gemm_req.mutable_graph() = LinearGraph(l);
  std::vector<std::shared_ptr<const CudaExecutable>> exes;
  std::vector<std::vector<HostTensor>> inputs, wants;
  for (v1::CompileRequest* req : {&conv_req, &conv_req, &gemm_req}) {
    req->mutable_target()->mutable_cuda()->set_arch(gpu->arch);
    auto artifact = Compile(*req);
    ASSERT_TRUE(artifact.ok()) << artifact.status();
    auto exe = CudaExecutable::Load(*artifact);
    ASSERT_TRUE(exe.ok()) << exe.status();
    exes.push_back(*std::move(exe));
    auto graph = ImportGraph(req->graph());
    ASSERT_TRUE(graph.ok()) << graph.status();
    std::mt19937_64 rng(exes.size());
    inputs.push_back(
        RandomInputs(*graph, random_graphs::Bindings(*graph)[0], rng));
    auto want = EvaluateReference(*graph, inputs.back());
    ASSERT_TRUE(want.ok()) << want.status();
    wants.push_back(*std::move(want));
  }
  // Runs executable i `times` times on a stream of its own; "" when every
  // result matches.
  auto run = [&](size_t i, int times) -> std::string {
    auto scope = cuda::ScopedContext::Enter(*gpu->driver, gpu->context->get());
    if (!scope.ok()) return scope.status().ToString();
    const auto& api = gpu->driver->api();
    cuda::Stream stream = nullptr;
    if (api.cuStreamCreate(&stream, 1) != cuda::kSuccess) return "stream";
    std::string error;
    std::vector<gpu_testing::DeviceInput> dev;
    std::vector<DeviceTensorView> views;
    for (const HostTensor& t : inputs[i]) {
      auto d = gpu_testing::Upload(*gpu, t);
      if (!d.ok()) return d.status().ToString();
      dev.push_back(*std::move(d));
    }
    for (const auto& d : dev) views.push_back(d.view());
    for (int r = 0; r < times && error.empty(); ++r) {
      auto got = exes[i]->Run(views, stream);
      if (!got.ok()) {
        error = got.status().ToString();
        break;
      }
      for (size_t o = 0; o < wants[i].size() && error.empty(); ++o) {
        auto host = gpu_testing::Download(*gpu, (*got)[o], stream);
        if (!host.ok()) {
          error = host.status().ToString();
        } else if (std::string d = Compare(*host, wants[i][o]); !d.empty()) {
          error = absl::StrCat("executable ", i, " run ", r, " output ", o,
                               ": ", d);
        }
      }
    }
    api.cuStreamSynchronize(stream);
    api.cuStreamDestroy_v2(stream);
    return error;
  };
  std::vector<std::string> errors(exes.size());
  {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < exes.size(); ++i)
      threads.emplace_back([&, i] { errors[i] = run(i, 8); });
    for (std::thread& t : threads) t.join();
  }
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  exes[0].reset();  // the shared handles stay with the others
  EXPECT_EQ(run(1, 2), "");
  EXPECT_EQ(run(2, 2), "");
}

TEST(CudaGpu, AccumulatingScattersMatchReference) {
  REQUIRE_GPU(gpu);
  auto t = [](DType dt, std::vector<int64_t> sizes) {
    return HostTensor::Empty(dt, std::move(sizes));
  };
  const DType kF = DType::kFloat32, kB = DType::kBFloat16, kL = DType::kInt64;
  struct Case {
    std::string op;
    std::vector<HostTensor> in;
    std::vector<v1::Argument> args;
  };
  std::vector<Case> cases;
  for (DType dt : {kF, kB}) {
    cases.push_back({"aten.embedding_dense_backward.default",
                     {t(dt, {8, 1024, 96}), t(kL, {8, 1024})},
                     {In(0), In(1), I(50), I(-1), B(false)}});
    cases.push_back({"aten.scatter_add.default",
                     {t(dt, {30, 200}), t(kL, {4000, 150}), t(dt, {4000, 200})},
                     {In(0), I(0), In(1), In(2)}});
    cases.push_back({"aten.index_put.default",
                     {t(dt, {20, 64}), t(kL, {5000}), t(dt, {5000, 64})},
                     {In(0), Refs({1}), In(2), B(true)}});
  }
  cases.push_back({"aten.embedding_dense_backward.default",
                   {t(kF, {4096, 32}), t(kL, {4096})},
                   {In(0), In(1), I(12), I(3), B(true)}});
  cases.push_back({"aten.scatter_add.default",
                   {t(kL, {16, 40}), t(kL, {16, 3000}), t(kL, {16, 3000})},
                   {In(0), I(1), In(1), In(2)}});
  int checked = 0;
  for (const Case& c : cases) {
    v1::CompileRequest req;
    *req.mutable_graph() = OneOpGraph(c.op, c.in, c.args);
    EXPECT_EQ(CheckOnGpu(*gpu, 900 + checked, req, /*aligned=*/true), "")
        << c.op << "\n"
        << GraphJson(req.graph());
    ++checked;
  }
  std::printf("%d scatter graphs on %s\n", checked, gpu->arch.c_str());
}

// KILN_GPU_HOST_COST=1: the host time of CudaExecutable::Run (enqueueing
// only, and synchronized) for a ResNet 3x3 convolution's forward and
// backward (64 channels, 56x56, batch 8, bfloat16) through cuDNN and through
// the im2col kernels, and for a one-kernel pointwise graph: where a
// convolution's per-call cost goes. A benchmark printed, never asserted;
// skipped unless asked.
TEST(CudaGpu, ConvolutionHostCost) {
  REQUIRE_GPU(gpu);
  if (random_graphs::EnvInt("KILN_GPU_HOST_COST", 0) == 0)
    GTEST_SKIP() << "KILN_GPU_HOST_COST=1 runs it";
  using namespace conv_cases;  // NOLINT: the shared cases
  Conv c;
  c.n = 8, c.c = 64, c.o = 64, c.in = {56, 56}, c.padding = {1};
  c.dtype = DType::kBFloat16;
  struct Case {
    std::string name;
    TestCase t;
    bool kernels;
  };
  std::vector<Case> cases = {
      {"forward cuDNN", ForwardCase(c), false},
      {"backward cuDNN", BackwardCase(c, {1, 1, 0}), false},
      {"forward im2col", ForwardCase(c), true},
      {"backward im2col", BackwardCase(c, {1, 1, 0}), true}};
  for (Case& k : cases) {
    v1::CompileRequest req;
    *req.mutable_graph() = CaseGraph(k.t);
    req.mutable_target()->mutable_cuda()->set_arch(gpu->arch);
    CompileEnv env;
    env.gpu_kernel_convolutions = k.kernels;
    auto artifact = Compile(req, env);
    ASSERT_TRUE(artifact.ok()) << artifact.status();
    auto exe = CudaExecutable::Load(*artifact);
    ASSERT_TRUE(exe.ok()) << exe.status();
    std::mt19937_64 rng(1);
    std::vector<gpu_testing::DeviceInput> dev;
    std::vector<DeviceTensorView> views;
    for (const HostTensor& t : CaseInputs(k.t, rng)) {
      auto d = gpu_testing::Upload(*gpu, t);
      ASSERT_TRUE(d.ok()) << d.status();
      dev.push_back(*std::move(d));
    }
    for (const auto& d : dev) views.push_back(d.view());
    auto sync = [&] { (void)gpu->driver->api().cuCtxSynchronize(); };
    for (int i = 0; i < 10; ++i) ASSERT_TRUE((*exe)->Run(views, nullptr).ok());
    sync();
    constexpr int kCalls = 200;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) (void)(*exe)->Run(views, nullptr);
    auto t1 = std::chrono::steady_clock::now();
    sync();
    auto t2 = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) {
      (void)(*exe)->Run(views, nullptr);
      sync();
    }
    auto t3 = std::chrono::steady_clock::now();
    auto us = [](auto a, auto b) {
      return std::chrono::duration<double, std::micro>(b - a).count() / kCalls;
    };
    int calls = 0, launches = 0;
    for (const v1::Step& s : artifact->program().steps()) {
      calls += s.has_call();
      launches += s.has_launch();
    }
    std::printf(
        "%-16s %d library calls, %d launches: enqueue %7.1f us/run, "
        "run+sync %7.1f us/run (all enqueued: %7.1f us/run)\n",
        k.name.c_str(), calls, launches, us(t0, t1), us(t2, t3), us(t0, t2));
  }
}

// How RandomGraphsMatchReference runs `seed`: the suite's tensors are
// small, so static ones take one element per thread
// (kMaxOneElementPerThread); half the seeds force groups of 4, and half
// promise aligned inputs.
CompileEnv SuiteEnv(int64_t seed) {
  CompileEnv env;
  if (seed / 2 % 2 == 1) env.gpu_pointwise_vector_width = 4;
  return env;
}
bool SuiteAligned(int64_t seed) { return seed % 2 == 0; }

TEST(CudaGpu, RandomGraphsMatchReference) {
  REQUIRE_GPU(gpu);
  int64_t first = 0;
  int64_t count = random_graphs::EnvInt("KILN_GPU_RANDOM_GRAPHS", 1000);
  const int64_t only = random_graphs::EnvInt("KILN_GPU_RANDOM_GRAPH_SEED", -1);
  if (only >= 0) {
    first = only;
    count = 1;
  }
  int failures = 0;
  for (int64_t seed = first; seed < first + count; ++seed) {
    v1::CompileRequest req;
    *req.mutable_graph() =
        graph_gen::RandomGraph(seed, random_graphs::GpuOptions());
    if (only >= 0) std::printf("%s\n", GraphJson(req.graph()).c_str());
    const std::string error =
        CheckOnGpu(*gpu, seed, req, SuiteAligned(seed), SuiteEnv(seed));
    if (!error.empty()) {
      if (++failures <= 20) {
        ADD_FAILURE() << "seed " << seed << ": " << error
                      << "\n  graph: " << GraphJson(req.graph());
      }
    }
  }
  std::printf("%lld graphs on %s: %d failures\n", static_cast<long long>(count),
              gpu->arch.c_str(), failures);
  EXPECT_EQ(failures, 0);
}

// KILN_GPU_DIAGNOSE_SEEDS=<s1,s2,...>: for each random-graph seed, which
// code-generation choices its failure depends on. The seed runs as the
// suite runs it, then with one choice changed at a time (no fusion, no
// split reductions, one element per group, no one-element-per-thread
// plans, unaligned inputs, one group per thread); then unfused with every
// node's outputs made graph outputs, which names the first node whose
// kernel is wrong. A tool for GPU bugs the CPU does not reproduce; skipped
// when the variable is unset.
TEST(CudaGpu, DiagnoseRandomGraphSeeds) {
  const char* seeds = std::getenv("KILN_GPU_DIAGNOSE_SEEDS");
  if (seeds == nullptr || *seeds == 0)
    GTEST_SKIP() << "KILN_GPU_DIAGNOSE_SEEDS not set";
  REQUIRE_GPU(gpu);
  for (absl::string_view item : absl::StrSplit(seeds, ',')) {
    int64_t seed = 0;
    if (!absl::SimpleAtoi(item, &seed)) continue;
    v1::CompileRequest req;
    *req.mutable_graph() =
        graph_gen::RandomGraph(seed, random_graphs::GpuOptions());
    const CompileEnv suite = SuiteEnv(seed);
    const bool aligned = SuiteAligned(seed);
    std::printf("=== seed %lld\n%s\n", static_cast<long long>(seed),
                GraphJson(req.graph()).c_str());
    struct Variant {
      const char* name;
      CompileEnv env;
      bool aligned;
    };
    std::vector<Variant> variants = {{"as the suite", suite, aligned}};
    auto add = [&](const char* name, const std::function<void(CompileEnv&)>& f,
                   bool a) {
      Variant v{name, suite, a};
      f(v.env);
      variants.push_back(v);
    };
    add(
        "no fusion", [](CompileEnv& e) { e.fuse = false; }, aligned);
    add(
        "no split", [](CompileEnv& e) { e.gpu_split_reductions = false; },
        aligned);
    add(
        "vector 1", [](CompileEnv& e) { e.gpu_pointwise_vector_width = 1; },
        aligned);
    add(
        "vector 4", [](CompileEnv& e) { e.gpu_pointwise_vector_width = 4; },
        aligned);
    add(
        "no one-per-thread",
        [](CompileEnv& e) { e.gpu_one_element_per_thread_max = 0; }, aligned);
    add(
        "unaligned", [](CompileEnv&) {}, false);
    add(
        "aligned", [](CompileEnv&) {}, true);
    add(
        "1 group/thread", [](CompileEnv& e) { e.gpu_groups_per_thread = 1; },
        aligned);
    add(
        "lane loop", [](CompileEnv& e) { e.gpu_lane_loop = true; }, aligned);
    for (const Variant& v : variants) {
      const std::string error = CheckOnGpu(*gpu, seed, req, v.aligned, v.env);
      std::printf("seed %lld %-18s %s\n", static_cast<long long>(seed), v.name,
                  error.empty() ? "ok" : error.c_str());
    }
    // Every node's outputs as graph outputs, unfused: the first wrong one.
    v1::CompileRequest all = req;
    all.mutable_graph()->clear_outputs();
    for (int n = 0; n < req.graph().nodes_size(); ++n) {
      for (const std::string& o : req.graph().nodes(n).outputs()) {
        std::printf("  output %d = node %d %s\n", all.graph().outputs_size(), n,
                    req.graph().nodes(n).op().c_str());
        all.mutable_graph()->add_outputs(o);
      }
    }
    for (bool fuse : {false, true}) {
      CompileEnv env = suite;
      env.fuse = fuse;
      const std::string error = CheckOnGpu(*gpu, seed, all, aligned, env);
      std::printf("seed %lld every node an output, %s: %s\n",
                  static_cast<long long>(seed), fuse ? "fused" : "unfused",
                  error.empty() ? "ok" : error.c_str());
    }
  }
}

// Runs `count` random graphs (seeds 0..count-1) drawn with `options` through
// CheckOnGpu with `fast_math` and `env`; reports up to 10 failures and the
// total, and returns the number of failures.
int CheckRandomGraphs(Gpu& gpu, const char* what, int64_t count,
                      const graph_gen::GraphGenOptions& options, bool fast_math,
                      const CompileEnv& env) {
  int failures = 0;
  for (int64_t seed = 0; seed < count; ++seed) {
    v1::CompileRequest req;
    *req.mutable_graph() = graph_gen::RandomGraph(seed, options);
    req.mutable_options()->set_fast_math(fast_math);
    const std::string error = CheckOnGpu(gpu, seed, req, seed % 2 == 0, env);
    if (!error.empty() && ++failures <= 10) {
      ADD_FAILURE() << what << " seed " << seed << ": " << error
                    << "\n  graph: " << GraphJson(req.graph());
    }
  }
  std::printf("%lld %s graphs on %s: %d failures\n",
              static_cast<long long>(count), what, gpu.arch.c_str(), failures);
  return failures;
}

// KILN_GPU_GRAPH_JSON=<file>: checks the graph in that file (a kiln.v1.Graph
// as JSON, e.g. a failing seed's, cut down by hand) on the GPU against the
// reference, with inputs drawn from KILN_GPU_GRAPH_SEED (default 0),
// aligned. Skipped when the variable is unset.
TEST(CudaGpu, GraphFromFile) {
  const char* file = std::getenv("KILN_GPU_GRAPH_JSON");
  if (file == nullptr || *file == 0)
    GTEST_SKIP() << "KILN_GPU_GRAPH_JSON not set";
  REQUIRE_GPU(gpu);
  const v1::CompileRequest req = RequestFromJson(file);
  EXPECT_EQ(CheckOnGpu(*gpu, random_graphs::EnvInt("KILN_GPU_GRAPH_SEED", 0),
                       req, /*aligned=*/true),
            "");
}

// Programs of many kernels compiled as several modules (CompileEnv::
// cuda_compile_threads: the kernels dealt into parts, each part's PTX
// linked into one cubin by nvJitLink) load and match the reference; with
// and without fast math. (CudaCodegen.SplitProgramsGiveEachKernelTheSamePtx
// checks the PTX without a GPU.)
TEST(CudaGpu, SplitProgramsMatchReference) {
  REQUIRE_GPU(gpu);
  const graph_gen::GraphGenOptions large =
      random_graphs::Large(random_graphs::GpuOptions());
  CompileEnv split, one;
  split.cuda_compile_threads = 3;
  split.cuda_min_kernels_per_part = 2;
  one.cuda_compile_threads = 1;
  const int64_t count = random_graphs::EnvInt("KILN_GPU_SPLIT_GRAPHS", 40);
  for (bool fast_math : {false, true}) {
    int failures = 0;
    for (int64_t seed = 0; seed < count; ++seed) {
      v1::CompileRequest req;
      *req.mutable_graph() = graph_gen::RandomGraph(seed, large);
      req.mutable_options()->set_fast_math(fast_math);
      const bool aligned = seed % 2 == 0;
      const std::string error = CheckOnGpu(*gpu, seed, req, aligned, split);
      if (error.empty()) continue;
      // Whether the split is to blame: the same graph as one module.
      const std::string whole = CheckOnGpu(*gpu, seed, req, aligned, one);
      if (++failures <= 10) {
        ADD_FAILURE() << "fast_math " << fast_math << " seed " << seed << ": "
                      << error << "\n  as one module: "
                      << (whole.empty() ? "passes" : whole)
                      << "\n  graph: " << GraphJson(req.graph());
      }
    }
    std::printf("%lld split graphs (fast_math %d) on %s: %d failures\n",
                static_cast<long long>(count), fast_math, gpu->arch.c_str(),
                failures);
  }
}

// fast_math (approximate exp/log/division, accurate sin/cos) stays within
// the same tolerances on the float32 graphs of the suite.
TEST(CudaGpu, RandomGraphsFastMathMatchReference) {
  REQUIRE_GPU(gpu);
  graph_gen::GraphGenOptions options = random_graphs::GpuOptions();
  options.dtypes = {v1::FLOAT32};
  EXPECT_EQ(
      CheckRandomGraphs(*gpu, "fast-math",
                        random_graphs::EnvInt("KILN_GPU_FAST_MATH_GRAPHS", 300),
                        options, /*fast_math=*/true, {}),
      0);
}

// Pointwise kernels with their lanes in a loop (GpuPlanOptions::lane_loop,
// for every graph): the same tolerances.
TEST(CudaGpu, RandomGraphsLaneLoopMatchReference) {
  REQUIRE_GPU(gpu);
  CompileEnv env;
  env.gpu_lane_loop = true;
  env.gpu_pointwise_vector_width = 4;  // lanes even where the range is small
  EXPECT_EQ(
      CheckRandomGraphs(*gpu, "lane-loop",
                        random_graphs::EnvInt("KILN_GPU_LANE_LOOP_GRAPHS", 300),
                        random_graphs::GpuOptions(), /*fast_math=*/false, env),
      0);
}

// Pointwise kernels with several groups per thread, forced for every body
// (GpuPlanOptions::pointwise_groups_per_thread; by default only light
// bodies over a static last dim take two, which the other suites cover):
// whole tiles (every group's vectors loaded first), the tile at the end of
// the range, rows whose last dim does not split into groups; then the
// random-graph suite, whose small tensors mostly take the end-of-range
// path.
TEST(CudaGpu, PointwiseGroupsMatchReference) {
  REQUIRE_GPU(gpu);
  const std::vector<std::vector<int64_t>> shapes = {
      {3, 8192}, {3, 5000}, {7, 1001}, {1, 2052}, {2, 3}, {72, 1024}};
  for (int groups : {2, 3}) {
    CompileEnv env;
    env.gpu_pointwise_groups_per_thread = groups;
    env.gpu_pointwise_vector_width = 4;
    for (const char* file : {"chain10.json", "chain30.json"}) {
      for (const std::vector<int64_t>& shape : shapes) {
        v1::CompileRequest req = Request(file);
        v1::TensorMeta* meta =
            req.mutable_graph()->mutable_inputs(0)->mutable_meta();
        meta->clear_sizes();
        for (int64_t size : shape) meta->add_sizes()->set_value(size);
        for (bool aligned : {true, false}) {
          EXPECT_EQ(CheckOnGpu(*gpu, 5, req, aligned, env), "")
              << file << " on " << absl::StrJoin(shape, "x") << ", " << groups
              << " groups" << (aligned ? " (aligned)" : "");
        }
      }
    }
    EXPECT_EQ(CheckRandomGraphs(
                  *gpu, "pointwise-groups",
                  random_graphs::EnvInt("KILN_GPU_LANE_LOOP_GRAPHS", 300),
                  random_graphs::GpuOptions(),
                  /*fast_math=*/false, env),
              0);
  }
}

// A graph of one reduction node over input x.
struct ReductionCase {
  const char* op;
  std::vector<int64_t> sizes;
  std::vector<int64_t> dims;  // one int-list argument; none if empty
  v1::DType dtype;
};

v1::CompileRequest ReductionRequest(const ReductionCase& c) {
  v1::CompileRequest req;
  v1::Input* in = req.mutable_graph()->add_inputs();
  in->set_name("x");
  in->mutable_meta()->set_dtype(c.dtype);
  for (int64_t size : c.sizes) in->mutable_meta()->add_sizes()->set_value(size);
  v1::Node* n = req.mutable_graph()->add_nodes();
  n->set_op(c.op);
  n->add_args()->set_ref("x");
  if (!c.dims.empty()) {
    auto* dims = n->add_args();
    for (int64_t d : c.dims) dims->mutable_ints()->add_values(d);
  }
  n->add_outputs("y");
  req.mutable_graph()->add_outputs("y");
  return req;
}

// Wide and long rows: the looped and persistent forms at their edges,
// reductions to a scalar over many elements, argmax ties.
TEST(CudaGpu, RowFormsAtTheirEdges) {
  REQUIRE_GPU(gpu);
  const ReductionCase cases[] = {
      {"aten.sum.dim_IntList", {3, 40000}, {1}, v1::FLOAT32},  // persistent
      {"aten.sum.dim_IntList",
       {5, 32768},
       {1},
       v1::FLOAT32},  // widest persistent of any kernel
      {"aten.amax.default", {5, 50257}, {1}, v1::FLOAT32},     // one load
      {"aten.sum.dim_IntList", {3, 65536}, {1}, v1::FLOAT32},  // widest
      {"aten.sum.dim_IntList", {3, 65541}, {1}, v1::FLOAT16},  // looped
      {"aten.amax.default", {7, 1000}, {1}, v1::FLOAT32},
      {"aten.sum.default", {1 << 20}, {}, v1::FLOAT32},  // one long row
      {"aten.argmax.default", {9, 3000}, {}, v1::INT32},
      {"aten.sum.dim_IntList", {64, 33}, {0}, v1::FLOAT32},  // leading dim
      {"aten.sum.dim_IntList", {1000, 3}, {1}, v1::INT64},   // warp rows
  };
  for (const ReductionCase& c : cases) {
    v1::CompileRequest req = ReductionRequest(c);
    if (std::string(c.op) == "aten.argmax.default") {
      auto* n = req.mutable_graph()->mutable_nodes(0);
      n->add_args()->set_i(1);
    }
    EXPECT_EQ(CheckOnGpu(*gpu, 3, req, true), "") << c.op;
  }
  // Multi-stage rows past kMaxPersistentRow (softmax: max, sum of exps,
  // the quotient; one row load): persistent up to kMaxPersistentRowOneLoad
  // (GPT-2's vocabulary, 50257; 65536), looped with kLoopedLongRowThreads
  // past it.
  for (const int64_t row : {50257, 65536, 70001}) {
    v1::CompileRequest req = Request("softmax.json");
    v1::TensorMeta* meta =
        req.mutable_graph()->mutable_inputs(0)->mutable_meta();
    meta->mutable_sizes(0)->set_value(6);
    meta->mutable_sizes(meta->sizes_size() - 1)->set_value(row);
    EXPECT_EQ(CheckOnGpu(*gpu, 4, req, true), "") << "softmax row " << row;
  }
}

// Few long rows are split in a partial and a combining kernel
// (compiler/split_reductions.h): sums, means and maxima over one or several
// trailing or leading dims, float16 accumulated in float32; argmax/argmin
// of whole tensors and of rows, with ties (int32 and float16 values repeat
// across chunks: the first extreme of the row must win).
TEST(CudaGpu, SplitReductionsMatchReference) {
  REQUIRE_GPU(gpu);
  const ReductionCase cases[] = {
      {"aten.sum.default", {1 << 24}, {}, v1::FLOAT32},
      {"aten.sum.default", {1 << 18}, {}, v1::FLOAT16},
      {"aten.mean.dim", {16, 1 << 20}, {1}, v1::FLOAT32},
      {"aten.amax.default", {4, 3, 65536}, {1, 2}, v1::FLOAT32},
      {"aten.amin.default", {65536, 4}, {0}, v1::FLOAT32},
      {"aten.sum.dim_IntList", {3, 40000}, {1}, v1::INT64},
      {"aten.sum.dim_IntList",
       {2, 99991},
       {1},
       v1::FLOAT32},  // prime: no split
  };
  for (const ReductionCase& c : cases) {
    v1::CompileRequest req = ReductionRequest(c);
    EXPECT_EQ(CheckOnGpu(*gpu, 5, req, true), "")
        << c.op << " over " << absl::StrJoin(c.sizes, "x");
  }
  const ReductionCase args[] = {
      {"aten.argmax.default", {1 << 22}, {}, v1::FLOAT32},
      {"aten.argmin.default", {1 << 20}, {}, v1::FLOAT16},
      {"aten.argmax.default", {1 << 20}, {}, v1::INT32},
      {"aten.argmax.default", {8, 1 << 20}, {}, v1::FLOAT32},
      {"aten.argmin.default", {4, 1 << 18}, {}, v1::INT32},
  };
  for (const ReductionCase& c : args) {
    v1::CompileRequest req = ReductionRequest(c);
    if (c.sizes.size() > 1)  // per row: dim=1
      req.mutable_graph()->mutable_nodes(0)->add_args()->set_i(1);
    EXPECT_EQ(CheckOnGpu(*gpu, 17, req, true), "")
        << c.op << " over " << absl::StrJoin(c.sizes, "x");
  }
  // Column reductions (gpu_launch.h, kColumn): over the first dims of a
  // [tokens, features] tensor, split where the columns are few
  // (ChooseColumnSplits) or not (many columns, symbolic sizes elsewhere).
  const ReductionCase columns[] = {
      {"aten.sum.dim_IntList", {8192, 768}, {0}, v1::BFLOAT16},
      {"aten.sum.dim_IntList", {8192, 3072}, {0}, v1::FLOAT16},
      {"aten.sum.dim_IntList", {4, 2048, 96}, {0, 1}, v1::FLOAT32},
      {"aten.sum.dim_IntList", {1000, 40000}, {0}, v1::FLOAT32},
      {"aten.amax.default", {777, 333}, {0}, v1::FLOAT32},
  };
  for (const ReductionCase& c : columns) {
    v1::CompileRequest req = ReductionRequest(c);
    EXPECT_EQ(CheckOnGpu(*gpu, 29, req, true), "")
        << c.op << " over " << absl::StrJoin(c.sizes, "x") << " (columns)";
  }
  {
    v1::CompileRequest req =
        ReductionRequest({"aten.argmax.default", {8192, 40}, {}, v1::FLOAT32});
    req.mutable_graph()->mutable_nodes(0)->add_args()->set_i(0);
    EXPECT_EQ(CheckOnGpu(*gpu, 31, req, true), "") << "argmax over columns";
  }
  // Two reductions of the same rows, two outputs: fusion interleaves their
  // row stores, and the split must still cut the kernel (ReductionsFirst).
  const ReductionCase pairs[] = {
      {"aten.sum.dim_IntList", {4, 1 << 20}, {1}, v1::FLOAT32},
      {"aten.argmax.default", {2, 1 << 20}, {}, v1::INT32},
  };
  for (const ReductionCase& c : pairs) {
    v1::CompileRequest req = ReductionRequest(c);
    if (c.dims.empty())
      req.mutable_graph()->mutable_nodes(0)->add_args()->set_i(1);
    v1::Node* amax = req.mutable_graph()->add_nodes();
    amax->set_op("aten.amax.default");
    amax->add_args()->set_ref("x");
    amax->add_args()->mutable_ints()->add_values(1);
    amax->add_outputs("m");
    req.mutable_graph()->add_outputs("m");
    EXPECT_EQ(CheckOnGpu(*gpu, 23, req, true), "")
        << c.op << " and amax over " << absl::StrJoin(c.sizes, "x");
  }
}

// `req` with its input x shifted first: x + ramp * arange(n) / n + offset,
// n the size of x's last dim (aten.arange, aten.mul.Scalar, aten.add nodes
// that fuse into the kernels reading x). A large offset with a small spread
// is what E[x^2] - E[x]^2 gets wrong in float32; the ramp makes the chunks
// of a long row differ in mean, which the one-pass split's merge must
// account for (with i.i.d. inputs they agree to within 1/C of the
// variance).
v1::CompileRequest Shifted(v1::CompileRequest req, double offset, double ramp) {
  v1::Graph* g = req.mutable_graph();
  const v1::TensorMeta& meta = g->inputs(0).meta();
  const int64_t n = meta.sizes(meta.sizes_size() - 1).value();
  for (v1::Node& node : *g->mutable_nodes()) {
    for (v1::Argument& a : *node.mutable_args())
      if (a.has_ref() && a.ref() == "x") a.set_ref("x_shifted");
  }
  const int before = g->nodes_size();
  auto add_node = [&](const char* op, const char* out) {
    v1::Node* node = g->add_nodes();
    node->set_op(op);
    node->add_outputs(out);
    return node;
  };
  add_node("aten.arange.default", "steps")
      ->add_args()
      ->set_f(static_cast<double>(n));
  v1::Node* scale = add_node("aten.mul.Scalar", "ramp");
  scale->add_args()->set_ref("steps");
  scale->add_args()->set_f(ramp / static_cast<double>(n));
  v1::Node* add_ramp = add_node("aten.add.Tensor", "x_ramp");
  add_ramp->add_args()->set_ref("x");
  add_ramp->add_args()->set_ref("ramp");
  v1::Node* add_offset = add_node("aten.add.Scalar", "x_shifted");
  add_offset->add_args()->set_ref("x_ramp");
  add_offset->add_args()->set_f(offset);
  // The new nodes first.
  for (int moved = 0; moved < g->nodes_size() - before; ++moved) {
    for (int i = before + moved; i > moved; --i)
      g->mutable_nodes()->SwapElements(i, i - 1);
  }
  return req;
}

// Multi-pass row kernels over few long rows (compiler/split_reductions.h):
// variance (of the whole tensor and per row) and layer norm with its mean
// and rstd outputs take the one-pass split (chunk means and second moments
// merged per row), also for inputs around 1000 with a spread of about 1,
// with and without a ramp along the row (Shifted);
// softmax and log-softmax in float32 and float16 are fissioned into a split
// kernel per pass and a pointwise kernel.
TEST(CudaGpu, FissionedMultiPassRowsMatchReference) {
  REQUIRE_GPU(gpu);
  // (offset, ramp) pairs for Shifted; (0, 0): x as it is.
  const std::pair<double, double> kShifts[] = {{0, 0}, {1000, 0}, {1000, 8}};
  const ReductionCase vars[] = {
      {"aten.var.correction", {1 << 22}, {}, v1::FLOAT32},
      {"aten.var.correction", {8, 1 << 20}, {1}, v1::FLOAT32},
      {"aten.var.correction", {4, 1 << 20}, {1}, v1::FLOAT16},
      {"aten.var.correction", {1 << 16, 4}, {0}, v1::FLOAT32},
      // 2048 chunks of 32768: the largest persistent chunk, S the combine's
      // row.
      {"aten.var.correction", {1, 1 << 26}, {1}, v1::FLOAT32},
  };
  for (const ReductionCase& c : vars) {
    for (const auto& [offset, ramp] : kShifts) {
      v1::CompileRequest req = ReductionRequest(c);
      if (offset != 0 || ramp != 0) req = Shifted(std::move(req), offset, ramp);
      EXPECT_EQ(CheckOnGpu(*gpu, 7, req, true), "")
          << c.op << " over " << absl::StrJoin(c.sizes, "x") << " + " << offset
          << " + ramp " << ramp;
    }
  }
  const struct {
    const char* op;
    int64_t rows, row;
    v1::DType dtype;
  } softmaxes[] = {
      {"aten._softmax.default", 4, 1 << 18, v1::FLOAT32},
      {"aten._log_softmax.default", 2, 1 << 20, v1::FLOAT32},
      {"aten._softmax.default", 4, 1 << 18, v1::FLOAT16},
  };
  for (const auto& c : softmaxes) {
    v1::CompileRequest req = Request("softmax.json");
    v1::TensorMeta* meta =
        req.mutable_graph()->mutable_inputs(0)->mutable_meta();
    meta->set_dtype(c.dtype);
    meta->mutable_sizes(0)->set_value(c.rows);
    meta->mutable_sizes(1)->set_value(c.row);
    req.mutable_graph()->mutable_nodes(0)->set_op(c.op);
    EXPECT_EQ(CheckOnGpu(*gpu, 11, req, true), "") << c.op << " " << c.row;
  }
  for (const auto& [rows, row] : {std::pair<int64_t, int64_t>{4, 1 << 18},
                                  std::pair<int64_t, int64_t>{16, 1 << 22}}) {
    for (const auto& [offset, ramp] : kShifts) {
      v1::CompileRequest ln = LayerNormRequest(rows, row);
      if (offset != 0 || ramp != 0) ln = Shifted(std::move(ln), offset, ramp);
      EXPECT_EQ(CheckOnGpu(*gpu, 13, ln, true), "")
          << "layer norm " << rows << "x" << row << " + " << offset
          << " + ramp " << ramp;
    }
  }
}

// Out-of-range indices on the GPU (issue 17.2): a run of an embedding with
// an id past the table is enqueued and clamped (nothing outside a buffer
// is read); the violation is reported, as PyTorch's device-side assert is,
// by CheckIndexErrors after a sync, or by the next Run, which then
// enqueues nothing; the run after that works and gives PyTorch's values.
TEST(CudaGpu, OutOfRangeIndexIsReportedAndReset) {
  REQUIRE_GPU(gpu);
  const char* json = R"({"graph": {
    "inputs": [
      {"name": "w", "meta": {"dtype": "FLOAT32", "sizes": [{"value": 5},
                                                         {"value": 3}]}},
      {"name": "i", "meta": {"dtype": "INT64", "sizes": [{"value": 4}]}}],
    "nodes": [{"op": "aten.embedding.default",
               "args": [{"ref": "w"}, {"ref": "i"}], "outputs": ["y"]}],
    "outputs": ["y"]}})";
  v1::CompileRequest req;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &req).ok());
  req.mutable_target()->mutable_cuda()->set_arch(gpu->arch);
  auto artifact = Compile(req);
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  auto exe = CudaExecutable::Load(*artifact);
  ASSERT_TRUE(exe.ok()) << exe.status();
  HostTensor w = HostTensor::Empty(DType::kFloat32, {5, 3});
  for (int64_t k = 0; k < 15; ++k) w.SetDoubleAt(k, static_cast<double>(k));
  auto ids = [](std::vector<int64_t> v) {
    HostTensor t = HostTensor::Empty(DType::kInt64, {4});
    for (int64_t k = 0; k < 4; ++k) t.SetIntAt(k, v[k]);
    return t;
  };
  auto run = [&](const HostTensor& i) -> absl::StatusOr<HostTensor> {
    auto dw = gpu_testing::Upload(*gpu, w);
    auto di = gpu_testing::Upload(*gpu, i);
    if (!dw.ok()) return dw.status();
    if (!di.ok()) return di.status();
    auto got = (*exe)->Run({dw->view(), di->view()}, nullptr);
    if (!got.ok()) return got.status();
    return gpu_testing::Download(*gpu, (*got)[0], nullptr);
  };
  const std::string message =
      "node 0 (aten.embedding.default): index 9 is out of range for "
      "dimension 0 of size 5";
  // Reported by CheckIndexErrors after a sync.
  ASSERT_TRUE(run(ids({0, 9, 1, 2})).ok());
  EXPECT_EQ((*exe)->CheckIndexErrors(nullptr, /*synchronize=*/true),
            absl::OutOfRangeError(message));
  EXPECT_TRUE((*exe)->CheckIndexErrors(nullptr, true).ok());
  // Reported by the next Run (the bad run's copy has reached the host: the
  // download synchronised), which enqueues nothing.
  ASSERT_TRUE(run(ids({0, 9, 1, 2})).ok());
  EXPECT_EQ(run(ids({0, 1, 2, 3})).status(), absl::OutOfRangeError(message));
  // Too negative, and a good run after it with a wrapping negative index.
  ASSERT_TRUE(run(ids({-6, 0, 0, 0})).ok());
  EXPECT_EQ((*exe)->CheckIndexErrors(nullptr, true).code(),
            absl::StatusCode::kOutOfRange);
  auto good = run(ids({4, -1, 0, 2}));
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_TRUE((*exe)->CheckIndexErrors(nullptr, true).ok());
  const std::vector<double> want = {12, 13, 14, 12, 13, 14, 0, 1, 2, 6, 7, 8};
  for (int64_t k = 0; k < 12; ++k)
    EXPECT_EQ(good->GetDoubleAt(k), want[k]) << k;
}

// kiln::Client::GetCudaExecutable end to end: kilnd cross-compiles the
// example graphs for this GPU, the client loads them and they match the
// reference; repeats come from the in-process cache, a second client gets
// them by Lookup, and the in-process cache keys on the allocator. The daemon
// is $KILN_SERVER when set, else one started here from $KILN_KILND (the
// bundle's kiln/bin/kilnd; deploy/run-on-gpu.sh sets it) or the build's.
// tanh on CUDA (libdevice's __nv_tanhf in both modes: compiler/
// cuda_backend.cc) is within 2 ulp of tanh in double over a dense grid of
// [-12, 12], random bit patterns of every magnitude, subnormals, +-0,
// +-inf and NaN, signs kept; with and without fast_math (which flushes
// subnormals to zero of the same sign). On an H200: 1.75 ulp at most in
// both modes.
TEST(CudaGpu, TanhIsWithinTwoUlpsEverywhere) {
  REQUIRE_GPU(gpu);
  std::vector<float> xs = {0.0f,
                           -0.0f,
                           1e-45f,
                           -1e-45f,
                           1e-38f,
                           -1e-38f,
                           0.6f,
                           -0.6f,
                           std::nextafter(0.6f, 0.0f),
                           9.0109f,
                           -9.0109f,
                           88.0f,
                           -88.0f,
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN()};
  for (int i = 0; i <= 1 << 20; ++i)
    xs.push_back(-12.0f + 24.0f * static_cast<float>(i) / (1 << 20));
  std::mt19937 rng(7);
  for (int i = 0; i < 1 << 18; ++i) {
    const uint32_t bits = static_cast<uint32_t>(rng());
    float x;
    std::memcpy(&x, &bits, sizeof(x));
    if (!std::isnan(x)) xs.push_back(x);
  }
  const int64_t n = static_cast<int64_t>(xs.size());
  for (bool fast_math : {false, true}) {
    SCOPED_TRACE(fast_math ? "fast_math" : "accurate");
    v1::CompileRequest req;
    v1::Graph& g = *req.mutable_graph();
    v1::Input& in = *g.add_inputs();
    in.set_name("x");
    in.mutable_meta()->set_dtype(v1::FLOAT32);
    in.mutable_meta()->add_sizes()->set_value(n);
    in.mutable_meta()->set_alignment(16);
    v1::Node& node = *g.add_nodes();
    node.set_op("aten.tanh.default");
    node.add_args()->set_ref("x");
    node.add_outputs("y");
    g.add_outputs("y");
    req.mutable_target()->mutable_cuda()->set_arch(gpu->arch);
    req.mutable_options()->set_fast_math(fast_math);
    auto artifact = Compile(req);
    ASSERT_TRUE(artifact.ok()) << artifact.status();
    auto exe = CudaExecutable::Load(*artifact);
    ASSERT_TRUE(exe.ok()) << exe.status();
    HostTensor x = HostTensor::Empty(DType::kFloat32, {n});
    std::memcpy(x.data(), xs.data(), xs.size() * sizeof(float));
    auto dev = gpu_testing::Upload(*gpu, x);
    ASSERT_TRUE(dev.ok()) << dev.status();
    const DeviceTensorView views[] = {dev->view()};
    auto got = (*exe)->Run(views, nullptr);
    ASSERT_TRUE(got.ok()) << got.status();
    auto host = gpu_testing::Download(*gpu, (*got)[0], nullptr);
    ASSERT_TRUE(host.ok()) << host.status();
    const float* y = reinterpret_cast<const float*>(host->data());
    double worst = 0;
    int bad = 0;
    for (int64_t i = 0; i < n && bad < 10; ++i) {
      const float want = static_cast<float>(std::tanh(double{xs[i]}));
      if (std::isnan(want)) {
        if (!std::isnan(y[i])) ++bad, ADD_FAILURE() << xs[i] << " -> " << y[i];
        continue;
      }
      // fast_math flushes subnormals to zero (of the same sign).
      if (fast_math && std::abs(want) < std::numeric_limits<float>::min() &&
          y[i] == 0 && std::signbit(y[i]) == std::signbit(want)) {
        continue;
      }
      // ulps of the float result, counted on the float grid.
      const double ulp = std::abs(std::nextafter(want, 2.0f) - want);
      const double err = std::abs(double{y[i]} - std::tanh(double{xs[i]}));
      worst = std::max(worst, err / ulp);
      if (err > 2 * ulp || std::signbit(y[i]) != std::signbit(want)) {
        ++bad;
        ADD_FAILURE() << "tanh(" << xs[i] << ") = " << y[i] << ", want "
                      << want;
      }
    }
    std::printf("tanh over %lld values: at most %.2f ulp\n",
                static_cast<long long>(n), worst);
  }
}

TEST(CudaGpu, ClientGetCudaExecutableMatchesReference) {
  REQUIRE_GPU(gpu);
  const char* server_env = std::getenv("KILN_SERVER");
  std::string server = server_env && *server_env ? server_env : "";
  std::unique_ptr<Daemon> daemon;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      absl::StrCat("kiln_cuda_gpu_client_", getpid());
  if (server.empty()) {
    std::filesystem::create_directories(dir);
    daemon = std::make_unique<Daemon>((dir / "data").string(),
                                      (dir / "port").string());
    ASSERT_GT(daemon->port(), 0) << "kilnd did not start";
    server = daemon->address();
  }
  auto connect = [&]() {
    ClientOptions o;
    o.server = server;
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return *std::move(c);
  };
  std::unique_ptr<Client> client = connect();
  const Loader via_client = [&](const v1::CompileRequest& r) {
    return client->GetCudaExecutable(r);
  };
  const char* files[] = {"chain10.json",         "chain30_sum.json",
                         "softmax.json",         "layer_norm.json",
                         "reduce_two_dims.json", "dynamic_batch.json"};
  int requests = 0;
  for (int round = 0; round < 2; ++round) {
    for (const char* file : files) {
      for (bool aligned : {true, false}) {
        EXPECT_EQ(CheckOnGpuWith(*gpu, 1, Request(file), aligned, via_client),
                  "")
            << file << (aligned ? " (aligned)" : "") << " round " << round;
        if (round == 0) ++requests;
      }
    }
    const Client::Counters c = client->counters();
    if (round == 0) {
      EXPECT_EQ(c.compiles + c.lookup_hits, requests);
      EXPECT_EQ(c.local_hits, 0u);
      if (daemon) {
        EXPECT_EQ(c.compiles, requests);  // a fresh daemon
      }
    } else {
      EXPECT_EQ(c.local_hits, requests);  // the second round: all local
    }
  }

  // Another client (another process would look the same): Lookup only.
  std::unique_ptr<Client> second = connect();
  EXPECT_EQ(CheckOnGpuWith(*gpu, 2, Request("softmax.json"), true,
                           [&](const v1::CompileRequest& r) {
                             return second->GetCudaExecutable(r);
                           }),
            "");
  EXPECT_EQ(second->counters().lookup_hits, 1u);
  EXPECT_EQ(second->counters().compiles, 0u);

  // The in-process cache keys on the allocator: the same request with an
  // allocator of its own loads another executable, which allocates its
  // outputs from that allocator, and is itself served locally next time.
  auto allocator = CachingDeviceAllocator::Create(0);
  ASSERT_TRUE(allocator.ok()) << allocator.status();
  CudaLoadOptions with_allocator;
  with_allocator.allocator = *allocator;
  v1::CompileRequest req = Request("chain10.json");
  req.mutable_target()->mutable_cuda()->set_arch(gpu->arch);
  auto own = second->GetCudaExecutable(req);
  auto shared = second->GetCudaExecutable(req, with_allocator);
  auto shared_again = second->GetCudaExecutable(req, with_allocator);
  ASSERT_TRUE(own.ok() && shared.ok() && shared_again.ok())
      << own.status() << shared.status() << shared_again.status();
  EXPECT_NE(own->get(), shared->get());
  EXPECT_EQ(shared->get(), shared_again->get());
  EXPECT_EQ((*shared)->allocator().get(), allocator->get());
  EXPECT_EQ(CheckOnGpuWith(*gpu, 3, Request("chain10.json"), false,
                           [&](const v1::CompileRequest& r) {
                             return second->GetCudaExecutable(r,
                                                              with_allocator);
                           }),
            "");
  EXPECT_GT((*allocator)->stats().allocations, 0);
  if (daemon) {
    client.reset();
    second.reset();
    daemon.reset();
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace kiln::testing
