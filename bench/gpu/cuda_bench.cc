// Kiln's side of the GPU benchmarks (bench/gpu/run.sh runs PyTorch's side
// in the same run and prints both):
//
//   cuda_bench launch GRAPH.json [--sizes=4,5,...]   per-call time
//   cuda_bench bandwidth GRAPH.json                  GB/s vs a device copy
//
// The graph is compiled in-process for device 0's architecture with 16-byte
// aligned inputs (what PyTorch's allocator gives) and run through
// CudaExecutable on one stream. A timing is `calls` back-to-back Run calls
// (each allocating its output from the caching allocator and enqueueing the
// kernels) followed by one stream synchronisation, divided by `calls`; the
// figure is the median over `batches` timings. With --sizes, the graph's
// first symbol takes those values in turn (one input set per value,
// uploaded beforehand), as a dynamic-shape workload does.
//
// Variants (bench/gpu/experiments.sh): --fast_math (CompileOptions),
// --groups_per_thread=N, --lane_loop=1, --pointwise_vector_width=4|2|1 and
// --pointwise_groups=G, --one_element_max=N (0: small kernels as large ones),
// --max_persistent_row=N (longer rows loop), --max_row_values=N
// (max_persistent_row_values), --looped_row_threads=N (GpuPlanOptions),
// --split_reductions=0 (CompileEnv).
//
// Output: one line per figure, `<name> <value> <unit>`, for run.sh.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "compiler/compile.h"
#include "compiler/numerics.h"
#include "compiler/reference.h"
#include "google/protobuf/util/json_util.h"
#include "graph/import.h"
#include "runtime/cuda_executable.h"
#include "tests/gpu/gpu_util.h"

namespace kiln {
namespace {

using gpu_testing::DeviceInput;
using gpu_testing::Gpu;

struct Args {
  std::string mode, graph, name;
  std::vector<int64_t> sizes;
  int calls = 100;
  int batches = 20;
  bool fast_math = false;
  int groups_per_thread = 0;
  int lane_loop = 0;
  int pointwise_vector_width = 0;
  int pointwise_groups = 0;
  int64_t one_element_max = -1;
  int split_reductions = 1;
  int64_t max_persistent_row = -1;
  int64_t max_row_values = -1;
  int looped_row_threads = 0;
};

int Fail(const absl::Status& s, const char* what) {
  std::fprintf(stderr, "cuda_bench: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Max |kiln - reference| over the first rows of output 0, for graphs whose
// rank >= 2 inputs and output 0 share their leading (row) dim: the
// reference runs on those rows only (it is slow).
absl::StatusOr<double> FirstRowsError(Gpu& gpu, const v1::CompileRequest& req,
                                      const std::vector<HostTensor>& inputs,
                                      const CudaExecutable& exe,
                                      cuda::Stream stream) {
  constexpr int64_t kRows = 16;
  v1::Graph sliced = req.graph();
  std::vector<HostTensor> sliced_inputs;
  for (int i = 0; i < sliced.inputs_size(); ++i) {
    const HostTensor& t = inputs[i];
    if (t.rank() < 2 || t.sizes()[0] <= kRows) {
      sliced_inputs.push_back(t);
      continue;
    }
    sliced.mutable_inputs(i)->mutable_meta()->mutable_sizes(0)->set_value(
        kRows);
    std::vector<int64_t> sizes = t.sizes();
    sizes[0] = kRows;
    sliced_inputs.push_back(
        HostTensor::View(t, sizes, t.strides(), t.offset()));
  }
  auto graph = ImportGraph(sliced);
  if (!graph.ok()) return graph.status();
  auto want = EvaluateReference(*graph, sliced_inputs);
  if (!want.ok()) return want.status();
  std::vector<DeviceInput> dev;
  std::vector<DeviceTensorView> views;
  for (const HostTensor& t : inputs) {
    auto d = gpu_testing::Upload(gpu, t);
    if (!d.ok()) return d.status();
    dev.push_back(*std::move(d));
  }
  for (const auto& d : dev) views.push_back(d.view());
  auto out = exe.Run(views, stream);
  if (!out.ok()) return out.status();
  auto got = gpu_testing::Download(gpu, (*out)[0], stream);
  if (!got.ok()) return got.status();
  const HostTensor& w = (*want)[0];
  double err = 0;
  for (int64_t e = 0; e < w.numel(); ++e)
    err = std::max(err, std::abs(got->GetDoubleAt(e) - w.GetDoubleAt(e)));
  return err;
}

int Main(int argc, char** argv) {
  Args a;
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: cuda_bench launch|bandwidth GRAPH.json [--name=N] "
                 "[--sizes=4,5] [--calls=100] [--batches=20]\n");
    return 2;
  }
  a.mode = argv[1];
  a.graph = argv[2];
  a.name = a.graph.substr(a.graph.rfind('/') + 1);
  for (int i = 3; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (absl::ConsumePrefix(&arg, "--name=")) {
      a.name = std::string(arg);
    } else if (absl::ConsumePrefix(&arg, "--sizes=")) {
      for (absl::string_view s : absl::StrSplit(arg, ',')) {
        int64_t v = 0;
        if (absl::SimpleAtoi(s, &v)) a.sizes.push_back(v);
      }
    } else if (absl::ConsumePrefix(&arg, "--calls=")) {
      (void)absl::SimpleAtoi(arg, &a.calls);
    } else if (absl::ConsumePrefix(&arg, "--batches=")) {
      (void)absl::SimpleAtoi(arg, &a.batches);
    } else if (arg == "--fast_math") {
      a.fast_math = true;
    } else if (absl::ConsumePrefix(&arg, "--groups_per_thread=")) {
      (void)absl::SimpleAtoi(arg, &a.groups_per_thread);
    } else if (absl::ConsumePrefix(&arg, "--lane_loop=")) {
      (void)absl::SimpleAtoi(arg, &a.lane_loop);
    } else if (absl::ConsumePrefix(&arg, "--pointwise_vector_width=")) {
      (void)absl::SimpleAtoi(arg, &a.pointwise_vector_width);
    } else if (absl::ConsumePrefix(&arg, "--one_element_max=")) {
      (void)absl::SimpleAtoi(arg, &a.one_element_max);
    } else if (absl::ConsumePrefix(&arg, "--pointwise_groups=")) {
      (void)absl::SimpleAtoi(arg, &a.pointwise_groups);
    } else if (absl::ConsumePrefix(&arg, "--looped_row_threads=")) {
      (void)absl::SimpleAtoi(arg, &a.looped_row_threads);
    } else if (absl::ConsumePrefix(&arg, "--max_row_values=")) {
      (void)absl::SimpleAtoi(arg, &a.max_row_values);
    } else if (absl::ConsumePrefix(&arg, "--max_persistent_row=")) {
      (void)absl::SimpleAtoi(arg, &a.max_persistent_row);
    } else if (absl::ConsumePrefix(&arg, "--split_reductions=")) {
      (void)absl::SimpleAtoi(arg, &a.split_reductions);
    }
  }
  auto gpu_or = gpu_testing::OpenGpu();
  if (!gpu_or.ok()) return Fail(gpu_or.status(), "GPU");
  Gpu& gpu = **gpu_or;

  std::ifstream in(a.graph);
  std::stringstream ss;
  ss << in.rdbuf();
  v1::CompileRequest req;
  if (auto s = google::protobuf::util::JsonStringToMessage(ss.str(),
                                                           req.mutable_graph());
      !s.ok())
    return Fail(absl::InvalidArgumentError(s.ToString()), a.graph.c_str());
  req.mutable_target()->mutable_cuda()->set_arch(gpu.arch);
  for (v1::Input& i : *req.mutable_graph()->mutable_inputs())
    i.mutable_meta()->set_alignment(16);
  req.mutable_options()->set_fast_math(a.fast_math);
  CompileEnv env;
  env.gpu_groups_per_thread = a.groups_per_thread;
  env.gpu_lane_loop = a.lane_loop != 0;
  env.gpu_pointwise_vector_width = a.pointwise_vector_width;
  env.gpu_pointwise_groups_per_thread = a.pointwise_groups;
  env.gpu_one_element_per_thread_max = a.one_element_max;
  env.gpu_max_persistent_row = a.max_persistent_row;
  env.gpu_max_persistent_row_values = a.max_row_values;
  env.gpu_looped_row_threads = a.looped_row_threads;
  env.gpu_split_reductions = a.split_reductions != 0;
  auto graph = ImportGraph(req.graph());
  if (!graph.ok()) return Fail(graph.status(), "import");
  const auto c0 = std::chrono::steady_clock::now();
  auto artifact = Compile(req, env);
  if (!artifact.ok()) return Fail(artifact.status(), "compile");
  const double compile_ms = std::chrono::duration<double, std::milli>(
                                std::chrono::steady_clock::now() - c0)
                                .count();
  auto exe = CudaExecutable::Load(*artifact);
  if (!exe.ok()) return Fail(exe.status(), "load");

  // One input set per symbol binding.
  std::vector<std::vector<int64_t>> bindings;
  if (graph->symbols.empty()) {
    bindings.push_back({});
  } else {
    for (int64_t v : a.sizes.empty() ? std::vector<int64_t>{8} : a.sizes)
      bindings.push_back(std::vector<int64_t>(graph->symbols.size(), v));
  }
  std::vector<std::vector<DeviceInput>> sets;
  std::vector<HostTensor> first_inputs;  // of bindings[0], for the check
  std::vector<std::vector<DeviceTensorView>> views;
  int64_t bytes_in = 0;
  for (const auto& b : bindings) {
    std::mt19937_64 rng(7);
    std::vector<DeviceInput> set;
    std::vector<HostTensor> host = numerics::RandomInputs(*graph, b, rng);
    if (first_inputs.empty()) first_inputs = host;
    for (const HostTensor& t : host) {
      bytes_in += t.numel() * DTypeSize(t.dtype());
      auto d = gpu_testing::Upload(gpu, t);
      if (!d.ok()) return Fail(d.status(), "upload");
      set.push_back(*std::move(d));
    }
    sets.push_back(std::move(set));
  }
  for (const auto& set : sets) {
    std::vector<DeviceTensorView> v;
    for (const auto& d : set) v.push_back(d.view());
    views.push_back(std::move(v));
  }
  const auto& api = gpu.driver->api();
  auto ctx = cuda::ScopedContext::Enter(*gpu.driver, gpu.context->get());
  if (!ctx.ok()) return Fail(ctx.status(), "context");
  cuda::Stream stream = nullptr;
  if (auto s = gpu.driver->Check(api.cuStreamCreate(&stream, 1), "stream");
      !s.ok())
    return Fail(s, "stream");

  int64_t bytes_out = 0;
  auto run_batch = [&](int calls) -> absl::StatusOr<double> {
    const auto t0 = std::chrono::steady_clock::now();
    for (int c = 0; c < calls; ++c) {
      auto out = (*exe)->Run(views[c % views.size()], stream);
      if (!out.ok()) return out.status();
      if (bytes_out == 0) {
        for (const DeviceTensor& t : *out) bytes_out += t.nbytes();
      }
    }
    if (auto s = gpu.driver->Check(api.cuStreamSynchronize(stream), "sync");
        !s.ok())
      return s;
    return std::chrono::duration<double, std::micro>(
               std::chrono::steady_clock::now() - t0)
               .count() /
           calls;
  };
  if (auto warm = run_batch(a.calls); !warm.ok())
    return Fail(warm.status(), "run");
  std::vector<double> times;
  for (int b = 0; b < a.batches; ++b) {
    auto t = run_batch(a.calls);
    if (!t.ok()) return Fail(t.status(), "run");
    times.push_back(*t);
  }
  const double per_call_us = Median(times);
  std::printf("%s compile_ms %.1f\n", a.name.c_str(), compile_ms);
  if (a.mode == "launch") {
    std::printf("%s kiln_us %.2f\n", a.name.c_str(), per_call_us);
    return 0;
  }
  // Accuracy: the first output's first rows against the reference
  // evaluator (float32 per op, computed in double) on the same rows.
  if (auto err = FirstRowsError(gpu, req, first_inputs, **exe, stream);
      err.ok()) {
    std::printf("%s kiln_err %.3g\n", a.name.c_str(), *err);
  } else {
    std::fprintf(stderr, "cuda_bench: accuracy check: %s\n",
                 err.status().ToString().c_str());
  }
  // Bandwidth: bytes read and written per call, and a device-to-device copy
  // of the input's size in the same process.
  const int64_t per_call_in = bytes_in / static_cast<int64_t>(sets.size());
  const double kiln_gbs = (per_call_in + bytes_out) / (per_call_us * 1e3);
  auto src = cuda::DeviceMemory::Allocate(*gpu.driver, gpu.context->get(),
                                          per_call_in);
  auto dst = cuda::DeviceMemory::Allocate(*gpu.driver, gpu.context->get(),
                                          per_call_in);
  if (!src.ok() || !dst.ok()) return Fail(src.status(), "copy buffers");
  std::vector<double> copy_times;
  for (int b = 0; b < a.batches; ++b) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int c = 0; c < a.calls; ++c) {
      api.cuMemcpyDtoDAsync_v2(dst->get(), src->get(), per_call_in, stream);
    }
    api.cuStreamSynchronize(stream);
    copy_times.push_back(std::chrono::duration<double, std::micro>(
                             std::chrono::steady_clock::now() - t0)
                             .count() /
                         a.calls);
  }
  const double copy_us = Median(copy_times);
  const double copy_gbs = 2.0 * per_call_in / (copy_us * 1e3);
  std::printf("%s kiln_us %.2f\n", a.name.c_str(), per_call_us);
  std::printf("%s bytes %lld\n", a.name.c_str(),
              static_cast<long long>(per_call_in + bytes_out));
  std::printf("%s copy_us %.2f\n", a.name.c_str(), copy_us);
  std::printf("%s kiln_gbs %.0f\n", a.name.c_str(), kiln_gbs);
  std::printf("%s copy_gbs %.0f\n", a.name.c_str(), copy_gbs);
  api.cuStreamDestroy_v2(stream);
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) { return kiln::Main(argc, argv); }
