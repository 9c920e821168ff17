// Compile latency of the CPU pipeline (Compile(): import, key, lower, fuse,
// LLVM O3, object, lld link) and of the CUDA pipeline for sm_90 (NVPTX O3,
// libdevice, PTX, nvJitLink; no GPU needed) on the standard graphs. Goal:
// <= 50 ms. The first CUDA compile of a process also pays nvJitLink's
// start-up and builds the precompiled trig functions
// (CompileEnv::cuda_precompiled_trig); the benchmark's warm-up compile
// absorbs both. The *_trig_each_compile rows compile them in every compile
// (the way before); compare them interleaved:
//
//   build/bench/compiler/compile_bench --benchmark_repetitions=5
//   build/bench/compiler/compile_bench --benchmark_filter='chain.*sm90'
//       --benchmark_repetitions=9 --benchmark_enable_random_interleaving
//
// KILN_BENCH_GRAPHS=/a.json,/b.json adds a CPU and an sm_90 row for each of
// those graphs (kiln.v1.Graph as JSON: a real model's partition, say), and
// KILN_DUMP_DIR=dir writes each compile's stage times to
// dir/<key>/08-timings.txt.
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "benchmark/benchmark.h"
#include "compiler/compile.h"
#include "compiler/cpu_backend.h"
#include "google/protobuf/util/json_util.h"

namespace kiln {
namespace {

v1::CompileRequest Request(const std::string& file) {
  std::ifstream in(file.starts_with("/")
                       ? file
                       : std::string(KILN_EXAMPLES_DIR) + "/" + file);
  std::stringstream ss;
  ss << in.rdbuf();
  v1::CompileRequest req;
  if (!google::protobuf::util::JsonStringToMessage(ss.str(),
                                                   req.mutable_graph())
           .ok())
    std::abort();
  *req.mutable_target()->mutable_cpu() = HostCpuTarget();
  return req;
}

void Run(benchmark::State& state, const v1::CompileRequest& req,
         const CompileEnv& env = {});

void BM_Compile(benchmark::State& state, const std::string& file) {
  const v1::CompileRequest req = Request(file);
  Run(state, req);
}

// sm_90 with 16-byte aligned inputs (what PyTorch's allocator gives).
// `env`: the _trig_each_compile rows turn CompileEnv::cuda_precompiled_trig
// off, the "before" of that change, in the same binary.
void BM_CompileCuda(benchmark::State& state, const std::string& file,
                    const CompileEnv& env = {}) {
  v1::CompileRequest req = Request(file);
  req.mutable_target()->mutable_cuda()->set_arch("sm_90");
  for (v1::Input& in : *req.mutable_graph()->mutable_inputs())
    in.mutable_meta()->set_alignment(16);
  if (auto warm = Compile(req, env); !warm.ok()) {
    state.SkipWithError(std::string(warm.status().message()).c_str());
    return;
  }
  Run(state, req, env);
}

void BM_CompileCudaTrigEachCompile(benchmark::State& state,
                                   const std::string& file) {
  CompileEnv env;
  env.cuda_precompiled_trig = false;
  BM_CompileCuda(state, file, env);
}

void Run(benchmark::State& state, const v1::CompileRequest& req,
         const CompileEnv& env) {
  for (auto _ : state) {
    auto a = Compile(req, env);
    if (!a.ok()) {
      state.SkipWithError(std::string(a.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(a->binary_sha256().size());
  }
}

BENCHMARK_CAPTURE(BM_Compile, chain10, std::string("chain10.json"))
    ->Unit(benchmark::kMillisecond)
    ->MeasureProcessCPUTime()
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Compile, chain30, std::string("chain30.json"))
    ->Unit(benchmark::kMillisecond)
    ->MeasureProcessCPUTime()
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Compile, chain30_sum, std::string("chain30_sum.json"))
    ->Unit(benchmark::kMillisecond)
    ->MeasureProcessCPUTime()
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Compile, softmax, std::string("softmax.json"))
    ->Unit(benchmark::kMillisecond)
    ->MeasureProcessCPUTime()
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Compile, layer_norm, std::string("layer_norm.json"))
    ->Unit(benchmark::kMillisecond)
    ->MeasureProcessCPUTime()
    ->UseRealTime();

#ifdef KILN_HAVE_CUDA_BACKEND
#define KILN_CUDA_BENCH(name, file)                          \
  BENCHMARK_CAPTURE(BM_CompileCuda, name, std::string(file)) \
      ->Unit(benchmark::kMillisecond)                        \
      ->MeasureProcessCPUTime()                              \
      ->UseRealTime()
KILN_CUDA_BENCH(chain10_sm90, "chain10.json");
KILN_CUDA_BENCH(chain30_sm90, "chain30.json");
KILN_CUDA_BENCH(chain30_sum_sm90, "chain30_sum.json");
KILN_CUDA_BENCH(softmax_sm90, "softmax.json");
KILN_CUDA_BENCH(layer_norm_sm90, "layer_norm.json");
#define KILN_CUDA_TRIG_BENCH(name, file)                                    \
  BENCHMARK_CAPTURE(BM_CompileCudaTrigEachCompile, name, std::string(file)) \
      ->Unit(benchmark::kMillisecond)                                       \
      ->MeasureProcessCPUTime()                                             \
      ->UseRealTime()
KILN_CUDA_TRIG_BENCH(chain10_sm90_trig_each_compile, "chain10.json");
KILN_CUDA_TRIG_BENCH(chain30_sm90_trig_each_compile, "chain30.json");
KILN_CUDA_TRIG_BENCH(chain30_sum_sm90_trig_each_compile, "chain30_sum.json");
#endif

// Rows for $KILN_BENCH_GRAPHS (see the top).
void RegisterGraphFiles() {
  const char* files = std::getenv("KILN_BENCH_GRAPHS");
  if (files == nullptr) return;
  std::stringstream list(files);
  for (std::string file; std::getline(list, file, ',');) {
    if (file.empty()) continue;
    auto add = [&file](const std::string& name, auto bench) {
      benchmark::RegisterBenchmark(
          (name + "/" + file).c_str(),
          [file, bench](benchmark::State& state) { bench(state, file); })
          ->Unit(benchmark::kMillisecond)
          ->MeasureProcessCPUTime()
          ->UseRealTime();
    };
    add("BM_Compile", [](benchmark::State& state, const std::string& f) {
      BM_Compile(state, f);
    });
#ifdef KILN_HAVE_CUDA_BACKEND
    add("BM_CompileCuda", [](benchmark::State& state, const std::string& f) {
      BM_CompileCuda(state, f);
    });
#endif
  }
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  kiln::RegisterGraphFiles();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
