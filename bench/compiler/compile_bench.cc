// Compile latency of the CPU pipeline (Compile(): import, key, lower, fuse,
// LLVM O3, object, lld link) on the standard graphs. Goal: <= 50 ms.
//
//   build/bench/compiler/compile_bench --benchmark_repetitions=5
#include <fstream>
#include <sstream>

#include "benchmark/benchmark.h"
#include "compiler/compile.h"
#include "compiler/cpu_backend.h"
#include "google/protobuf/util/json_util.h"

namespace kiln {
namespace {

v1::CompileRequest Request(const std::string& file) {
  std::ifstream in(std::string(KILN_EXAMPLES_DIR) + "/" + file);
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

void BM_Compile(benchmark::State& state, const std::string& file) {
  const v1::CompileRequest req = Request(file);
  for (auto _ : state) {
    auto a = Compile(req);
    if (!a.ok()) {
      state.SkipWithError(std::string(a.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(a->cpu().shared_object().size());
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

}  // namespace
}  // namespace kiln

BENCHMARK_MAIN();
