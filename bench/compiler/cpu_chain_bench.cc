// Fused vs unfused CPU kernels on pointwise chains, next to memcpy of the
// same bytes, in one run (TARGETS.md, "Generated code", CPU rows).
//
//   cpu_chain_bench GRAPH.json...   (bench/cpu_chain.sh makes the graphs)
//
// For each graph: compile fused and unfused (one kernel per op), run each
// on the same random input with a 2-thread pool, median of 7 timed runs
// after 2 warm-ups. Also an add/mul-only chain of 10 (the "within 1.5x of a
// copy" row), built here. Prints one table row per graph.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "runtime/cpu_executable.h"
#include "bench/compiler/bench_timing.h"
#include "compiler/compile.h"
#include "compiler/cpu_backend.h"
#include "graph/import.h"
#include "google/protobuf/util/json_util.h"

namespace kiln {
namespace {

v1::Graph AddMulChain(int n, int64_t rows, int64_t cols) {
  v1::Graph g;
  auto* in = g.add_inputs();
  in->set_name("x0");
  in->mutable_meta()->set_dtype(v1::FLOAT32);
  in->mutable_meta()->add_sizes()->set_value(rows);
  in->mutable_meta()->add_sizes()->set_value(cols);
  for (int i = 0; i < n; ++i) {
    auto* node = g.add_nodes();
    node->set_op(i % 2 ? "aten.mul.Tensor" : "aten.add.Tensor");
    node->add_args()->set_ref("x" + std::to_string(i));
    node->add_args()->set_f(i % 2 ? 1.01 : 0.1);
    node->add_outputs("x" + std::to_string(i + 1));
  }
  g.add_outputs("x" + std::to_string(n));
  return g;
}

int Run(int argc, char** argv) {
  std::vector<std::pair<std::string, v1::Graph>> graphs;
  for (int i = 1; i < argc; ++i) {
    std::ifstream f(argv[i]);
    std::stringstream ss;
    ss << f.rdbuf();
    v1::Graph g;
    if (!google::protobuf::util::JsonStringToMessage(ss.str(), &g).ok()) {
      std::fprintf(stderr, "cannot parse %s\n", argv[i]);
      return 2;
    }
    std::string name = argv[i];
    name = name.substr(name.find_last_of('/') + 1);
    graphs.emplace_back(name, g);
  }
  graphs.emplace_back("addmul10_2^24", AddMulChain(10, 16384, 1024));
  ThreadPool pool(2);
  std::printf("%-24s %10s %12s %12s %12s %10s %10s\n", "graph", "elements",
              "fused_ms", "unfused_ms", "memcpy_ms", "speedup", "vs_copy");
  for (const auto& [name, graph] : graphs) {
    v1::CompileRequest req;
    *req.mutable_graph() = graph;
    *req.mutable_target()->mutable_cpu() = HostCpuTarget();
    auto fused = Compile(req);
    CompileEnv unfused_env;
    unfused_env.fuse = false;
    auto unfused = Compile(req, unfused_env);
    if (!fused.ok() || !unfused.ok()) {
      std::fprintf(stderr, "%s: %s %s\n", name.c_str(),
                   fused.status().ToString().c_str(),
                   unfused.status().ToString().c_str());
      return 1;
    }
    auto fe = CpuExecutable::Load(*fused);
    auto ue = CpuExecutable::Load(*unfused);
    if (!fe.ok() || !ue.ok()) return 1;
    auto imported = ImportGraph(graph);
    const TensorType& t = imported->type(imported->inputs[0].value);
    std::vector<int64_t> sizes;
    for (const SymExpr& s : t.sizes) sizes.push_back(*s.AsConstant());
    HostTensor x = HostTensor::Empty(DType::kFloat32, sizes);
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> dist(-2, 2);
    for (int64_t i = 0; i < x.numel(); ++i) x.SetDoubleAt(i, dist(rng));
    const std::vector<HostTensor> inputs = {x};
    // Both must compute the same thing before their times mean anything.
    auto fo = (*fe)->Run(inputs, &pool);
    auto uo = (*ue)->Run(inputs, &pool);
    if (!fo.ok() || !uo.ok()) return 1;
    double max_diff = 0;
    for (int64_t i = 0; i < (*fo)[0].numel(); ++i) {
      max_diff = std::max(max_diff, std::fabs((*fo)[0].GetDoubleAt(i) -
                                              (*uo)[0].GetDoubleAt(i)));
    }
    if (max_diff > 1e-3) {
      std::fprintf(stderr, "%s: fused and unfused disagree by %g\n",
                   name.c_str(), max_diff);
      return 1;
    }
    const double fused_ms = MedianMs([&] { (void)(*fe)->Run(inputs, &pool); });
    const double unfused_ms =
        MedianMs([&] { (void)(*ue)->Run(inputs, &pool); });
    // A plain copy of the input into a fresh output, on the same 2 threads.
    const size_t bytes = static_cast<size_t>(x.numel()) * 4;
    const double copy_ms = MedianMs([&] {
      // Into a fresh uninitialised buffer, as the kernels write their outputs.
      HostTensor out = HostTensor::Uninitialized(DType::kFloat32, sizes);
      pool.ParallelFor(2, [&](int64_t c) {
        const size_t half = bytes / 2, off = c * half,
                     len = c ? bytes - half : half;
        std::memcpy(out.data() + off, x.data() + off, len);
      });
    });
    std::printf("%-24s %10lld %12.3f %12.3f %12.3f %9.2fx %9.2fx\n",
                name.c_str(), static_cast<long long>(x.numel()), fused_ms,
                unfused_ms, copy_ms, unfused_ms / fused_ms, fused_ms / copy_ms);
  }
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) { return kiln::Run(argc, argv); }
