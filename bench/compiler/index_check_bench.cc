// What the out-of-range index checks (issue 17.2, loop_ir.h IndexCheck)
// cost on the CPU: gathers compiled with and without them
// (CompileEnv::index_checks), run on the same in-range indices with a
// 2-thread pool: the best of 5 interleaved rounds of each, a round being
// the median of 7 timed runs after 2 warm-ups.
//
//   index_check_bench
//
// Rows: an embedding at a GPT-2 vocabulary (50257 x 768 float32, 8 x 1024
// ids: one check per row of 768 reads), gather along the last dim of a
// 4096 x 1024 float32 tensor (one check per element read), and
// index_select of 16384 rows of a 4096 x 256 tensor.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench/compiler/bench_timing.h"
#include "compiler/compile.h"
#include "compiler/cpu_backend.h"
#include "runtime/cpu_executable.h"
#include "runtime/thread_pool.h"

namespace kiln {
namespace {

void AddInput(v1::Graph& g, const std::string& name, v1::DType dtype,
              const std::vector<int64_t>& sizes) {
  v1::Input* in = g.add_inputs();
  in->set_name(name);
  in->mutable_meta()->set_dtype(dtype);
  for (int64_t s : sizes) in->mutable_meta()->add_sizes()->set_value(s);
}

struct Case {
  const char* name;
  v1::Graph graph;
  std::vector<HostTensor> inputs;
};

HostTensor Random(DType dtype, std::vector<int64_t> sizes, int64_t bound,
                  std::mt19937_64& rng) {
  HostTensor t = HostTensor::Empty(dtype, std::move(sizes));
  std::uniform_int_distribution<int64_t> d(0, bound - 1);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (IsFloating(dtype))
      t.SetDoubleAt(i, static_cast<double>(d(rng) % 1000) / 1000.0);
    else
      t.SetIntAt(i, d(rng));
  }
  return t;
}

// out = op(x, idx) with the op's args in `args` (refs "x", "idx", ints).
Case OneOp(const char* name, const char* op, std::vector<int64_t> x_sizes,
           std::vector<int64_t> idx_sizes, int64_t bound,
           const std::vector<std::string>& args, std::mt19937_64& rng) {
  Case c{name, {}, {}};
  AddInput(c.graph, "x", v1::FLOAT32, x_sizes);
  AddInput(c.graph, "idx", v1::INT64, idx_sizes);
  v1::Node* n = c.graph.add_nodes();
  n->set_op(op);
  for (const std::string& a : args) {
    if (a == "x" || a == "idx")
      n->add_args()->set_ref(a);
    else
      n->add_args()->set_i(std::stoll(a));
  }
  n->add_outputs("y");
  c.graph.add_outputs("y");
  c.inputs = {Random(DType::kFloat32, x_sizes, 1000, rng),
              Random(DType::kInt64, idx_sizes, bound, rng)};
  return c;
}

int Run() {
  std::mt19937_64 rng(1);
  std::vector<Case> cases;
  cases.push_back(OneOp("embedding 50257x768, 8x1024 ids",
                        "aten.embedding.default", {50257, 768}, {8, 1024},
                        50257, {"x", "idx"}, rng));
  cases.push_back(OneOp("gather 4096x1024 dim -1", "aten.gather.default",
                        {4096, 1024}, {4096, 1024}, 1024, {"x", "-1", "idx"},
                        rng));
  cases.push_back(OneOp("index_select 16384 of 4096x256",
                        "aten.index_select.default", {4096, 256}, {16384}, 4096,
                        {"x", "0", "idx"}, rng));
  ThreadPool pool(2);
  std::printf("| gather | checked ms | unchecked ms | ratio |\n");
  std::printf("| --- | ---: | ---: | ---: |\n");
  for (const Case& c : cases) {
    v1::CompileRequest req;
    *req.mutable_graph() = c.graph;
    *req.mutable_target()->mutable_cpu() = HostCpuTarget();
    CompileEnv off;
    off.index_checks = false;
    auto checked = Compile(req);
    auto unchecked = Compile(req, off);
    if (!checked.ok() || !unchecked.ok()) {
      std::fprintf(stderr, "%s: %s %s\n", c.name,
                   checked.status().ToString().c_str(),
                   unchecked.status().ToString().c_str());
      return 1;
    }
    auto ce = CpuExecutable::Load(*checked);
    auto ue = CpuExecutable::Load(*unchecked);
    if (!ce.ok() || !ue.ok()) return 1;
    auto co = (*ce)->Run(c.inputs, &pool);
    auto uo = (*ue)->Run(c.inputs, &pool);
    if (!co.ok() || !uo.ok()) {
      std::fprintf(stderr, "%s: %s %s\n", c.name,
                   co.status().ToString().c_str(),
                   uo.status().ToString().c_str());
      return 1;
    }
    // Interleaved rounds, so both see the same machine load; the best
    // round's median of each (the machine may be shared).
    double c_ms = 1e30, u_ms = 1e30;
    for (int round = 0; round < 5; ++round) {
      c_ms =
          std::min(c_ms, MedianMs([&] { (void)(*ce)->Run(c.inputs, &pool); }));
      u_ms =
          std::min(u_ms, MedianMs([&] { (void)(*ue)->Run(c.inputs, &pool); }));
    }
    std::printf("| %s | %.3f | %.3f | %.2f |\n", c.name, c_ms, u_ms,
                c_ms / u_ms);
  }
  return 0;
}

}  // namespace
}  // namespace kiln

int main() { return kiln::Run(); }
