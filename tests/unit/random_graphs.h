// The random-graph suite's settings, shared by the CPU suite
// (random_graph_test) and the GPU suite (tests/gpu/cuda_gpu_test): the
// generator's options for all of op set v1 and the symbol bindings each
// graph runs with.
#ifndef KILN_TESTS_UNIT_RANDOM_GRAPHS_H_
#define KILN_TESTS_UNIT_RANDOM_GRAPHS_H_

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "graph/graph.h"
#include "tests/unit/graph_gen.h"

namespace kiln::testing::random_graphs {

using graph_gen::GraphGenOptions;

inline GraphGenOptions Options() {
  GraphGenOptions o;
  o.full_op_set = true;
  o.max_inputs = 3;
  o.max_nodes = 10;
  o.max_rank = 4;
  o.max_symbols = 2;
  o.max_symbol_value = 8;
  o.dtypes = {v1::FLOAT32, v1::FLOAT16, v1::BFLOAT16,
              v1::INT32,   v1::INT64,   v1::BOOL};
  return o;
}

// Programs of many kernels: up to 160 nodes over up to 6 inputs (the
// split-compile tests, RandomGraphs.LargeGraphsMatchReference).
inline GraphGenOptions Large(GraphGenOptions o) {
  o.max_nodes = 160;
  o.max_inputs = 6;
  return o;
}

// Options() for CUDA targets: the same ops (matrix products are cuBLASLt
// calls there); kept apart so that GPU suites can differ when an op does.
inline GraphGenOptions GpuOptions() { return Options(); }

inline int64_t EnvInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoll(v, nullptr, 10) : fallback;
}

// Two bindings of the symbols (none for a static graph): small and large,
// honouring multiple_of and max_value; never above max_symbol_value.
inline std::vector<std::vector<int64_t>> Bindings(const Graph& g) {
  if (g.symbols.empty()) return {{}};
  std::vector<std::vector<int64_t>> out(2);
  for (size_t s = 0; s < g.symbols.size(); ++s) {
    const int64_t m = std::max<int64_t>(g.symbols[s].multiple_of, 1);
    for (int b = 0; b < 2; ++b) {
      int64_t want = b == 0 ? 2 : 7;
      // Mix: odd symbols take the other value, so that dynamic dims differ.
      if (s % 2 == 1) want = b == 0 ? 7 : 2;
      int64_t v = (want + m - 1) / m * m;
      if (v > Options().max_symbol_value) v = m;
      if (g.symbols[s].max_value > 0) v = std::min(v, g.symbols[s].max_value);
      out[b].push_back(std::max<int64_t>(v, kMinSymbolValue));
    }
  }
  return out;
}

}  // namespace kiln::testing::random_graphs

#endif  // KILN_TESTS_UNIT_RANDOM_GRAPHS_H_
